//! Joining through several roots (NCCL's `ncclCommInitRankScalable`),
//! without sockets: which ranks each root serves, and how the blocks'
//! address tables travel until every rank holds the whole one.
//!
//! The ranks are spread over the `k` roots in contiguous blocks as NCCL
//! spreads them (its bootstrap.cc, `firstRankFromRoot`): `n / k` each, the
//! first `n % k` roots one more. A root's set is its block and, except for
//! the last root, the first rank of the next block, which so links the
//! blocks: that rank (its block's "leader") learns both tables. The
//! leaders then pass the tables forward (leader 1 to 2, ..., k-2 to k-1),
//! the last one, now holding every address, passes the whole table back
//! (k-1 to k-2, ..., 1 to 0), and each leader hands it to its block.

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

/// What `rank` does once its roots answered (`table`: the addresses it
/// learned from them): `io(peer, step, Some(t))` sends `t` to `peer`,
/// `io(peer, step, None)` receives the table `peer` sends at `step`.
/// Returns the whole table.
pub(super) fn pass_tables(
    rank: usize,
    n: usize,
    k: usize,
    mut table: Vec<Option<SocketAddr>>,
    mut io: impl FnMut(usize, usize, Option<&[SocketAddr]>) -> Result<Option<Vec<SocketAddr>>>,
) -> Result<Vec<SocketAddr>> {
    let unknown = SocketAddr::from(([0, 0, 0, 0], 0));
    let flat = |t: &[Option<SocketAddr>]| -> Vec<SocketAddr> {
        t.iter().map(|a| a.unwrap_or(unknown)).collect()
    };
    let merge = |t: &mut Vec<Option<SocketAddr>>, got: Option<Vec<SocketAddr>>| {
        for (slot, a) in t.iter_mut().zip(got.unwrap_or_default()) {
            if a != unknown {
                *slot = Some(a);
            }
        }
    };
    let b = root_of(rank, n, k);
    let leader = |r: usize| first_of(r, n, k);
    if leader(b) != rank {
        let got = io(leader(b), HAND_OUT, None)?;
        merge(&mut table, got);
    } else {
        if b >= 2 {
            let got = io(leader(b - 1), FORWARD, None)?;
            merge(&mut table, got);
        }
        if b >= 1 && b + 1 < k {
            io(leader(b + 1), FORWARD, Some(&flat(&table)))?;
        }
        if b + 1 < k {
            let got = io(leader(b + 1), BACKWARD, None)?;
            merge(&mut table, got);
        }
        if b >= 1 {
            io(leader(b - 1), BACKWARD, Some(&flat(&table)))?;
        }
        let whole = flat(&table);
        for x in leader(b) + 1..leader(b) + count_of(b, n, k) {
            io(x, HAND_OUT, Some(&whole))?;
        }
    }
    let missing: Vec<usize> = (0..n).filter(|&i| table[i].is_none()).collect();
    if !missing.is_empty() {
        return Err(Error::Internal(format!(
            "bootstrap: rank {rank} ended the join through {k} roots without the addresses of ranks {missing:?}"
        )));
    }
    Ok(flat(&table))
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

    /// Every rank ends with the whole table, each sending only to ranks
    /// whose address it holds, in a simulation of the exchange.
    #[test]
    fn every_rank_ends_with_the_whole_table() {
        for (n, k) in [(4, 2), (5, 3), (3, 3), (10, 4), (2, 2)] {
            let addr = |x: usize| SocketAddr::from(([10, 0, 0, 1], 1000 + x as u16));
            // What each rank's roots told it.
            let start: Vec<Vec<Option<SocketAddr>>> = (0..n)
                .map(|me| {
                    let mut t = vec![None; n];
                    for r in 0..k {
                        let set = set_of(r, n, k);
                        if set.contains(&me) {
                            set.iter().for_each(|&x| t[x] = Some(addr(x)));
                        }
                    }
                    t
                })
                .collect();
            // Run ranks in turns, each until it waits for a message not yet sent.
            let mut mail: HashMap<(usize, usize, usize), Vec<SocketAddr>> = HashMap::new();
            let mut done: Vec<Option<Vec<SocketAddr>>> = vec![None; n];
            for _round in 0..4 * n {
                for me in 0..n {
                    if done[me].is_some() {
                        continue;
                    }
                    let mut sent = Vec::new();
                    let r = pass_tables(me, n, k, start[me].clone(), |peer, step, t| match t {
                        Some(t) => {
                            assert!(
                                start[me][peer].is_some() || peer == me,
                                "{me} sends to {peer}, whose address it lacks"
                            );
                            sent.push(((me, peer, step), t.to_vec()));
                            Ok(None)
                        }
                        None => mail
                            .get(&(peer, me, step))
                            .cloned()
                            .map(Some)
                            .ok_or_else(|| Error::Internal("not yet".into())),
                    });
                    if let Ok(t) = r {
                        done[me] = Some(t);
                        for (key, t) in sent {
                            mail.insert(key, t);
                        }
                    } else {
                        // Replayed from the start next round; what it sent
                        // before waiting stays sent.
                        for (key, t) in sent {
                            mail.insert(key, t);
                        }
                    }
                }
            }
            for (me, t) in done.iter().enumerate() {
                let t = t
                    .as_ref()
                    .unwrap_or_else(|| panic!("{n} ranks, {k} roots: rank {me} never finished"));
                assert_eq!(t, &(0..n).map(addr).collect::<Vec<_>>());
            }
        }
    }
}
