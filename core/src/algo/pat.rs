//! Log-depth all-gather for one rank per node, oxccl's stand-in for NCCL's
//! PAT ("Parallel Aggregated Trees").
//!
//! What this is: Bruck's all-gather. In round k (distance d = 2^k, while
//! d < n) rank r sends the blocks it holds, r .. r+m-1 (mod n, m = min(d,
//! n-d)), to rank r-d, and receives blocks r+d .. r+d+m-1 from rank r+d.
//! After ceil(log2 n) rounds every rank holds all n blocks, for any n
//! (powers of two or not), and every block crossed the network once per
//! rank that received it: n-1 blocks in, n-1 out, as the ring.
//!
//! How it differs from NCCL's PAT (src/include/collectives.h,
//! PatAGAlgorithm): NCCL walks a binomial tree per block with a bounded
//! number of steps in flight through fixed-size connection buffers
//! (aggregating several tree levels into one step, so depth and buffering
//! trade off), and it runs on the GPU; this schedule moves whole runs of
//! blocks per round through the host executor's pipelined steps, so a
//! round's messages grow to n/2 blocks. Same shape (log2 n dependent
//! rounds instead of the ring's n-1 hops), not the same schedule.
//! Each block lands at its own place in the output, so no rotation is
//! needed at the end.

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
}
