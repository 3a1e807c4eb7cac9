//! Log-depth all-gather and reduce-scatter for one rank per node,
//! oxccl's stand-in for NCCL's PAT ("Parallel Aggregated Trees").
//!
//! All-gather: Bruck's. In round k (distance d = 2^k, while d < n) rank r
//! sends the blocks it holds, r .. r+m-1 (mod n, m = min(d, n-d)), to rank
//! r-d, and receives blocks r+d .. r+d+m-1 from rank r+d. After
//! ceil(log2 n) rounds every rank holds all n blocks, for any n (powers of
//! two or not), and every block crossed the network once per rank that
//! received it: n-1 blocks in, n-1 out, as the ring.
//!
//! Reduce-scatter: the same graph run backwards (every edge reversed,
//! rounds in the opposite order), so that each block's tree gathers
//! partial sums towards its owner instead of spreading it. Rank r works
//! with blocks by their distance j from it (block (r+j) mod n). Before the
//! round of distance d it still answers for j in 0 .. d+m; it sends the
//! partial sums of j in d .. d+m to rank r+d, receives those of its own
//! j in 0 .. m from rank r-d and adds its own to them. The partials it
//! receives wait for a later round, so they need room: the output holds
//! j = 0 (the rank's own block) and a scratch buffer of
//! [`scratch_blocks`] blocks holds j = 1 .. 2^(K-1) (K the number of
//! rounds), about half the input. A partial no round has touched yet is
//! still the rank's input and is read from there (scaled once on entry,
//! as every reduction's input is).
//!
//! How this differs from NCCL's PAT (src/include/collectives.h,
//! PatAGAlgorithm and PatRSAlgorithm): NCCL walks a binomial tree per block
//! with a bounded number of steps in flight through fixed-size connection
//! buffers (aggregating several tree levels into one step, so depth and
//! buffering trade off), and it runs on the GPU; these schedules move
//! whole runs of blocks per round through the host executor's pipelined
//! steps, so a round's messages grow to n/2 blocks. Same shape (log2 n
//! dependent rounds instead of the ring's n-1 hops), not the same schedule.
//! Each all-gathered block lands at its own place in the output, so no
//! rotation is needed at the end.

use super::{Region, Step};

/// The blocks `first .. first+m` (mod n), as runs of consecutive block
/// numbers (at most two: the range may wrap past n-1). Whole blocks of one
/// run are contiguous in the output when the lane covers whole blocks.
fn runs(first: usize, m: usize, n: usize) -> Vec<(usize, usize)> {
    let first = first % n;
    if first + m <= n {
        vec![(first, m)]
    } else {
        vec![(first, n - first), (0, first + m - n)]
    }
}

/// The steps that move blocks `[b, b+len)`, part `[lo, hi)` of each
/// block of `count`, by one step per block or one per run when the part
/// is the whole block.
fn per_block(
    b: usize,
    len: usize,
    count: usize,
    lo: usize,
    hi: usize,
    mut f: impl FnMut(usize, usize) -> Step,
    out: &mut Vec<Step>,
) {
    if hi - lo == count {
        out.push(f(b * count, len * count));
    } else {
        for x in b..b + len {
            out.push(f(x * count + lo, hi - lo));
        }
    }
}

/// Rank `rank`'s steps of an all-gather over `n` ranks of `count` elements
/// each, part `[lo, hi)` of every block.
pub fn all_gather(rank: usize, n: usize, count: usize, lo: usize, hi: usize) -> Vec<Step> {
    let mut steps = vec![Step::new(hi - lo)
        .src(Region::input(lo))
        .dst(Region::output(rank * count + lo))];
    let mut d = 1;
    while d < n {
        let m = d.min(n - d);
        let to = (rank + n - d) % n;
        let from = (rank + d) % n;
        let sends = runs(rank, m, n);
        let recvs = runs(rank + d, m, n);
        // Sends and receives alternate, the k-th send before the k-th
        // receive: each receive waits only for a send its peer issued
        // first (no cycle, even run step by step), and the executor's
        // window never holds sends alone.
        let mut rs = Vec::new();
        for (b, len) in recvs {
            per_block(
                b,
                len,
                count,
                lo,
                hi,
                |off, c| Step::new(c).recv(from).dst(Region::output(off)),
                &mut rs,
            );
        }
        let mut ss = Vec::new();
        for (b, len) in sends {
            per_block(
                b,
                len,
                count,
                lo,
                hi,
                |off, c| Step::new(c).src(Region::output(off)).send(to),
                &mut ss,
            );
        }
        let (mut rs, mut ss) = (rs.into_iter(), ss.into_iter());
        loop {
            match (rs.next(), ss.next()) {
                (None, None) => break,
                (r, s) => steps.extend(s.into_iter().chain(r)),
            }
        }
        d *= 2;
    }
    steps
}

/// Dependent rounds of the all-gather on `n` ranks: ceil(log2 n).
pub fn rounds(n: usize) -> usize {
    n.max(1).next_power_of_two().trailing_zeros() as usize
}

/// Elements of scratch the reduce-scatter needs per element of a block:
/// blocks 1 .. 2^(K-1) by distance, K = [`rounds`] (none on 2 ranks).
pub fn scratch_blocks(n: usize) -> usize {
    match rounds(n) {
        0 => 0,
        k => (1 << (k - 1)) - 1,
    }
}

/// The distances of the rounds, largest first (the reduce-scatter's order).
fn distances_down(n: usize) -> impl Iterator<Item = usize> {
    (0..rounds(n)).rev().map(|k| 1 << k)
}

/// Distances up to which an earlier (larger) round of the reduce-scatter
/// has received a partial before the round of distance `d`: the
/// partials of j below it are in the output or the scratch, the others
/// still in the input.
fn touched_below(n: usize, d: usize) -> usize {
    distances_down(n)
        .take_while(|&e| e > d)
        .map(|e| e.min(n - e))
        .max()
        .unwrap_or(0)
}

/// The messages of one round of the reduce-scatter to rank `r` from rank
/// r-d, as runs (first distance from `r`, length) of its j in `0 .. m`.
/// Both ends compute them from the receiver's rank, so each message is
/// one step on both: a run never spans a change of region on either side
/// (output or scratch, scratch or input, the input's wrap past block
/// n-1), and holds at most `per` blocks.
fn messages(r: usize, n: usize, d: usize, per: usize) -> Vec<(usize, usize)> {
    let m = d.min(n - d);
    let t = touched_below(n, d);
    let wrap = (n - r) % n;
    let mut cuts = vec![0, 1, m, t.min(m), t.saturating_sub(d).min(m), wrap.min(m)];
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = Vec::new();
    for w in cuts.windows(2) {
        let mut a = w[0];
        while a < w[1] {
            let len = per.min(w[1] - a);
            out.push((a, len));
            a += len;
        }
    }
    out
}

/// Rank `rank`'s steps of a reduce-scatter over `n` ranks of `count`
/// elements each (its output), part `[lo, hi)` of every block. `join`:
/// the most elements one step may carry when whole blocks are joined
/// into one step (0 or less than a block: one step per block). Joined
/// steps address the scratch at other starts than the steps that wrote
/// it, so they are safe only where the executor opens every step whole
/// before the next ([`crate::exec::joinable`] says how much that is).
pub fn reduce_scatter(
    rank: usize,
    n: usize,
    count: usize,
    lo: usize,
    hi: usize,
    join: usize,
) -> Vec<Step> {
    let part = hi - lo;
    let per = if part == count && count > 0 {
        (join / count).max(1)
    } else {
        1
    };
    // Where the partial of distance j lives once a round touched it.
    let kept = |j: usize| {
        if j == 0 {
            Region::output(lo)
        } else {
            Region::scratch((j - 1) * count + lo)
        }
    };
    let input = |j: usize| Region::input(((rank + j) % n) * count + lo);
    let mut steps = Vec::new();
    for d in distances_down(n) {
        let t = touched_below(n, d);
        let to = (rank + d) % n;
        let from = (rank + n - d) % n;
        let mut rs = Vec::new();
        for (a, len) in messages(rank, n, d, per) {
            let src = if a < t { kept(a) } else { input(a) };
            let mut st = Step::new(len * part).recv(from).src(src).dst(kept(a));
            if d == 1 && a == 0 {
                st = st.finalize();
            }
            rs.push(st);
        }
        let mut ss = Vec::new();
        for (a, len) in messages(to, n, d, per) {
            let j = a + d;
            let src = if j < t { kept(j) } else { input(j) };
            ss.push(Step::new(len * part).src(src).send(to));
        }
        // As the all-gather: the k-th send before the k-th receive.
        let (mut rs, mut ss) = (rs.into_iter(), ss.into_iter());
        loop {
            match (rs.next(), ss.next()) {
                (None, None) => break,
                (r, s) => steps.extend(s.into_iter().chain(r)),
            }
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_wrap_once() {
        assert_eq!(runs(3, 2, 5), vec![(3, 2)]);
        assert_eq!(runs(4, 3, 5), vec![(4, 1), (0, 2)]);
        assert_eq!(runs(7, 1, 5), vec![(2, 1)]);
    }

    /// Every rank receives n-1 blocks and sends n-1, in ceil(log2 n) rounds.
    #[test]
    fn moves_each_block_once_per_rank() {
        for n in 2..=64 {
            assert_eq!(rounds(n), (n as f64).log2().ceil() as usize);
            for rank in [0, n / 2, n - 1] {
                let s = all_gather(rank, n, 3, 0, 3);
                let got: usize = s.iter().filter(|x| x.recv.is_some()).map(|x| x.count).sum();
                let sent: usize = s.iter().filter(|x| x.send.is_some()).map(|x| x.count).sum();
                assert_eq!((got, sent), (3 * (n - 1), 3 * (n - 1)), "n={n}");
                let peers: std::collections::HashSet<_> = s.iter().filter_map(|x| x.recv).collect();
                assert_eq!(peers.len(), rounds(n), "n={n}");
            }
        }
    }
    /// The reduce-scatter moves as the all-gather: n-1 blocks each way in
    /// ceil(log2 n) rounds; joined or block by block, and every message's
    /// size agrees between its two ends.
    #[test]
    fn reduce_scatter_moves_each_block_once_per_rank() {
        for n in 2..=64 {
            for join in [0, 3, 1 << 20] {
                let all: Vec<Vec<Step>> = (0..n)
                    .map(|r| reduce_scatter(r, n, 3, 0, 3, join))
                    .collect();
                for s in &all {
                    let got: usize = s.iter().filter(|x| x.recv.is_some()).map(|x| x.count).sum();
                    let sent: usize = s.iter().filter(|x| x.send.is_some()).map(|x| x.count).sum();
                    assert_eq!((got, sent), (3 * (n - 1), 3 * (n - 1)), "n={n}");
                    assert!(s.iter().all(|x| join < 3 || x.count <= join.max(3)));
                }
                for (r, s) in all.iter().enumerate() {
                    for to in s
                        .iter()
                        .filter_map(|x| x.send)
                        .collect::<std::collections::BTreeSet<_>>()
                    {
                        let out: Vec<usize> = s
                            .iter()
                            .filter(|x| x.send == Some(to))
                            .map(|x| x.count)
                            .collect();
                        let inn: Vec<usize> = all[to]
                            .iter()
                            .filter(|x| x.recv == Some(r))
                            .map(|x| x.count)
                            .collect();
                        assert_eq!(out, inn, "n={n} {r}->{to}");
                    }
                }
            }
            assert!(scratch_blocks(n) <= n - 2, "n={n}");
        }
    }
}
