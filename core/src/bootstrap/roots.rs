//! Joining through several roots (NCCL's `ncclCommInitRankScalable`),
//! without sockets: which ranks each root serves, and how the blocks'
//! leaders make themselves known to every rank.
//!
//! The ranks are spread over the `k` roots in contiguous blocks as NCCL
//! spreads them (its bootstrap.cc, `firstRankFromRoot`): `n / k` each, the
//! first `n % k` roots one more. A root's set is its block and, except for
//! the last root, the first rank of the next block, which so links the
//! blocks: that rank is its block's "leader". Each root answers its set
//! as one root answers a job, with each rank's neighbours (`me +- 2^j` in
//! the set's numbering) only. The leaders then pass their addresses along
//! (leader 0 to 1, ..., k-2 to k-1; the last one, now holding all k, back
//! from k-1 to 0), each leader being a neighbour of the next in the set
//! they share, and each leader hands the list down its block by a
//! binomial tree whose every edge joins neighbours. A rank then knows its
//! neighbours in its sets and the `k` leaders: a lookup of any other rank
//! asks that rank's leader first, whose neighbours halve the distance from
//! there, so it takes at most `1 + ceil(log2(n / k + 1))` questions.
//! Per rank: at most 3 messages received and `2 + ceil(log2(n / k))` sent,
//! each of at most `k` entries.

use std::net::SocketAddr;

use crate::error::{Error, Result};

/// The first rank of root `r`'s block.
pub(super) fn first_of(r: usize, n: usize, k: usize) -> usize {
    r * (n / k) + r.min(n % k)
}

/// How many ranks root `r`'s block holds.
pub(super) fn count_of(r: usize, n: usize, k: usize) -> usize {
    n / k + usize::from(r < n % k)
}

/// The root of `rank`'s block.
pub(super) fn root_of(rank: usize, n: usize, k: usize) -> usize {
    let (per, more) = (n / k, n % k);
    let bigger = more * (per + 1);
    if rank < bigger {
        rank / (per + 1)
    } else {
        (rank - bigger) / per + more
    }
}

/// The ranks that say hello to root `r`, in the order of their local
/// numbers there: its block, then the next block's first rank.
pub(super) fn set_of(r: usize, n: usize, k: usize) -> Vec<usize> {
    let first = first_of(r, n, k);
    let mut set: Vec<usize> = (first..first + count_of(r, n, k)).collect();
    if r + 1 < k {
        set.push(first_of(r + 1, n, k));
    }
    set
}

/// The steps of the exchange (the `step` of the messages' tags).
const FORWARD: usize = 0;
const BACKWARD: usize = 1;
const HAND_OUT: usize = 2;

/// Where in the block's binomial tree local rank `x` of `count` sends:
/// `x + d` for each power of two `d` below the lowest set bit of `x`
/// (below `count` for the leader, `x` = 0), largest first.
pub(super) fn children(x: usize, count: usize) -> Vec<usize> {
    let top = if x == 0 {
        count.next_power_of_two()
    } else {
        1 << x.trailing_zeros()
    };
    std::iter::successors(Some(top / 2), |d| (*d > 1).then_some(d / 2))
        .filter(|&d| d >= 1 && x + d < count)
        .map(|d| x + d)
        .collect()
}

/// Every rank's part in passing the leaders' addresses (see the module):
/// `me` is this rank's own address (a leader adds it); `io(peer, step,
/// Some(entries))` sends to `peer`, `io(peer, step, None)` waits for what
/// `peer` sent. The `k` leaders, in block order.
pub(super) fn pass_leaders(
    rank: usize,
    n: usize,
    k: usize,
    me: SocketAddr,
    mut io: impl FnMut(
        usize,
        usize,
        Option<&[(usize, SocketAddr)]>,
    ) -> Result<Option<Vec<(usize, SocketAddr)>>>,
) -> Result<Vec<(usize, SocketAddr)>> {
    let b = root_of(rank, n, k);
    let leader = |r: usize| first_of(r, n, k);
    let local = rank - leader(b);
    let mut leaders = if local > 0 {
        let parent = local - (1 << local.trailing_zeros());
        io(leader(b) + parent, HAND_OUT, None)?.unwrap_or_default()
    } else {
        let mut l = if b >= 1 {
            io(leader(b - 1), FORWARD, None)?.unwrap_or_default()
        } else {
            Vec::new()
        };
        l.push((rank, me));
        if b + 1 < k {
            io(leader(b + 1), FORWARD, Some(&l))?;
            l = io(leader(b + 1), BACKWARD, None)?.unwrap_or_default();
        }
        if b >= 1 {
            io(leader(b - 1), BACKWARD, Some(&l))?;
        }
        l
    };
    for x in children(local, count_of(b, n, k)) {
        io(leader(b) + x, HAND_OUT, Some(&leaders))?;
    }
    leaders.sort_unstable_by_key(|&(r, _)| r);
    if !leaders.iter().map(|&(r, _)| r).eq((0..k).map(leader)) {
        return Err(Error::Internal(format!(
            "bootstrap: rank {rank} ended the join through {k} roots with leaders {:?}, not the first rank of each block",
            leaders.iter().map(|&(r, _)| r).collect::<Vec<_>>()
        )));
    }
    Ok(leaders)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn blocks_as_nccl_spreads_them() {
        // 5 ranks over 3 roots: 2, 2, 1.
        assert_eq!(
            (0..3).map(|r| first_of(r, 5, 3)).collect::<Vec<_>>(),
            [0, 2, 4]
        );
        assert_eq!(
            (0..3).map(|r| count_of(r, 5, 3)).collect::<Vec<_>>(),
            [2, 2, 1]
        );
        assert_eq!(
            (0..5).map(|x| root_of(x, 5, 3)).collect::<Vec<_>>(),
            [0, 0, 1, 1, 2]
        );
        assert_eq!(set_of(0, 5, 3), [0, 1, 2]);
        assert_eq!(set_of(1, 5, 3), [2, 3, 4]);
        assert_eq!(set_of(2, 5, 3), [4]);
        for (n, k) in [(1, 1), (4, 2), (5, 3), (7, 7), (100, 9), (9, 4)] {
            let mut seen = vec![0; n];
            for r in 0..k {
                let first = first_of(r, n, k);
                for (x, s) in seen
                    .iter_mut()
                    .enumerate()
                    .skip(first)
                    .take(count_of(r, n, k))
                {
                    assert_eq!(root_of(x, n, k), r, "{n} ranks, {k} roots, rank {x}");
                    *s += 1;
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "{n} ranks, {k} roots");
        }
    }

    /// Every rank ends with the leaders, each sending only to ranks whose
    /// address its roots gave it (its neighbours in its sets), receiving at
    /// most 3 messages and sending at most `2 + ceil(log2(n / k))`, in a
    /// simulation of the exchange.
    #[test]
    fn every_rank_ends_with_the_leaders_sending_to_neighbours_only() {
        for (n, k) in [
            (4, 2),
            (5, 3),
            (3, 3),
            (10, 4),
            (2, 2),
            (64, 4),
            (100, 9),
            (37, 2),
        ] {
            let addr = |x: usize| SocketAddr::from(([10, 0, 0, 1], 1000 + x as u16));
            // Who each rank may send to: its neighbours in each set it joined.
            let known: Vec<Vec<usize>> = (0..n)
                .map(|me| {
                    let mut v = Vec::new();
                    for r in 0..k {
                        let set = set_of(r, n, k);
                        if let Some(l) = set.iter().position(|&x| x == me) {
                            v.extend(
                                crate::bootstrap::proto::neighbours(l, set.len())
                                    .into_iter()
                                    .map(|j| set[j]),
                            );
                        }
                    }
                    v
                })
                .collect();
            type Mail = HashMap<(usize, usize, usize), Vec<(usize, SocketAddr)>>;
            let mut mail: Mail = HashMap::new();
            let mut done: Vec<Option<Vec<(usize, SocketAddr)>>> = vec![None; n];
            let mut counts = vec![(0usize, 0usize); n];
            for _round in 0..4 * n {
                for me in 0..n {
                    if done[me].is_some() {
                        continue;
                    }
                    let mut sent = Vec::new();
                    let mut received = 0;
                    let r = pass_leaders(me, n, k, addr(me), |peer, step, t| match t {
                        Some(t) => {
                            assert!(
                                known[me].contains(&peer),
                                "{n} ranks, {k} roots: {me} sends to {peer}, whose address it lacks"
                            );
                            sent.push(((me, peer, step), t.to_vec()));
                            Ok(None)
                        }
                        None => {
                            received += 1;
                            mail.get(&(peer, me, step))
                                .cloned()
                                .map(Some)
                                .ok_or_else(|| Error::Internal("not yet".into()))
                        }
                    });
                    let nsent = sent.len();
                    for (key, t) in sent {
                        mail.insert(key, t);
                    }
                    // Replayed from the start next round until it ends.
                    if let Ok(l) = r {
                        done[me] = Some(l);
                        counts[me] = (nsent, received);
                    }
                }
            }
            let leaders: Vec<(usize, SocketAddr)> = (0..k)
                .map(|r| (first_of(r, n, k), addr(first_of(r, n, k))))
                .collect();
            let log = (n.div_ceil(k) as f64).log2().ceil() as usize;
            for (me, l) in done.iter().enumerate() {
                let l = l
                    .as_ref()
                    .unwrap_or_else(|| panic!("{n} ranks, {k} roots: rank {me} never finished"));
                assert_eq!(l, &leaders, "{n} ranks, {k} roots: rank {me}");
                let (s, r) = counts[me];
                assert!(
                    r <= 3 && s <= 2 + log,
                    "{n} ranks, {k} roots: rank {me} sent {s}, received {r}"
                );
            }
        }
    }

    #[test]
    fn the_block_tree_reaches_every_rank_once() {
        for count in 1..40 {
            let mut parent = vec![None; count];
            for x in 0..count {
                for c in children(x, count) {
                    assert!(parent[c].is_none(), "{count}: {c} twice");
                    parent[c] = Some(x);
                    assert_eq!(c - x, 1 << c.trailing_zeros(), "{count}: {x} -> {c}");
                }
            }
            assert!(
                parent.iter().skip(1).all(Option::is_some),
                "{count}: {parent:?}"
            );
        }
    }
}
