//! Direct collectives for ranks whose buffers can read each other (host
//! memory of processes of one host, through [`crate::transport::cma`]):
//! each rank reads what it needs from its peers' buffers in one copy,
//! instead of passing every byte around a ring of staging slots.
//!
//! In an all-reduce, rank r reduces part r of every rank's input and writes
//! the result into every rank's output, a cache-sized chunk at a time: each
//! input byte is read once and each output byte written once, in one
//! phase. (A reduce-scatter followed by an all-gather, where every rank
//! copies the other parts from their owners' outputs, reads the reduced
//! parts back from memory: a quarter more traffic, and memory bandwidth is
//! what bounds eight ranks on sixteen cores.) The ring moves each byte
//! 2·(n-1) times through shared slots, each with a copy in and a copy out.
//!
//! A plan is phases of tasks per thread; every rank finishes a phase before
//! any starts the next (a barrier between processes), and one more barrier
//! after the last phase keeps each rank's buffers in place until no peer
//! reads them. Plans are pure data, so the simulation below checks them
//! without processes.

use super::{split, Coll};

/// Which of a peer's buffers a read takes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Src {
    Send,
    Recv,
}

/// One piece of work; offsets and lengths in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// Own send buffer `[src, src+len)` into own receive buffer at `dst`
    /// (nothing to do when both are the same memory).
    Copy { src: usize, dst: usize, len: usize },
    /// `peer`'s `from` buffer `[src, src+len)` into own receive buffer at `dst`.
    Read {
        peer: usize,
        from: Src,
        src: usize,
        dst: usize,
        len: usize,
    },
    /// Every rank's send buffer `[src, src+len)` combined in rank order,
    /// into `[dst, dst+len)` of the receive buffers `to` names.
    Reduce {
        src: usize,
        dst: usize,
        len: usize,
        to: Dest,
    },
}

/// Whose receive buffers a reduction's result goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    Mine,
    /// Every rank's (an all-reduce's part).
    All,
    /// One other rank's (a reduce's root).
    Rank(usize),
}

/// Phases, each a list of tasks per thread.
pub type Plan = Vec<Vec<Vec<Task>>>;

/// The bytes one call moves per rank, which decides whether the direct
/// path is worth its barriers.
pub fn bytes(coll: Coll, count: usize, elem: usize, n: usize) -> usize {
    match coll {
        Coll::AllGather | Coll::ReduceScatter => count * elem * n,
        _ => count * elem,
    }
}

/// Element range `[lo, hi)` cut into `threads` pieces, as byte ranges.
fn pieces(lo: usize, hi: usize, threads: usize, elem: usize) -> Vec<(usize, usize)> {
    (0..threads)
        .map(|t| {
            let (a, b) = split(lo, hi, threads, t);
            (a * elem, (b - a) * elem)
        })
        .collect()
}

/// Rank `rank`'s plan for `coll` of `count` elements (NCCL's count) of
/// `elem` bytes on `n` ranks, spread over `threads` threads. Empty tasks
/// are left out.
pub fn plan(coll: Coll, rank: usize, n: usize, count: usize, elem: usize, threads: usize) -> Plan {
    let threads = threads.max(1);
    let mut phases: Plan = Vec::new();
    let phase = || vec![Vec::new(); threads];
    match coll {
        Coll::AllReduce => {
            let mut ar = phase();
            let (lo, hi) = split(0, count, n, rank);
            for (t, (off, len)) in pieces(lo, hi, threads, elem).into_iter().enumerate() {
                ar[t].push(Task::Reduce {
                    src: off,
                    dst: off,
                    len,
                    to: Dest::All,
                });
            }
            phases.push(ar);
        }
        Coll::ReduceScatter => {
            let mut rs = phase();
            for (t, (off, len)) in pieces(0, count, threads, elem).into_iter().enumerate() {
                rs[t].push(Task::Reduce {
                    src: rank * count * elem + off,
                    dst: off,
                    len,
                    to: Dest::Mine,
                });
            }
            phases.push(rs);
        }
        Coll::AllGather => {
            let mut ag = phase();
            for p in (0..n).map(|k| (rank + k) % n) {
                for (t, (off, len)) in pieces(0, count, threads, elem).into_iter().enumerate() {
                    let dst = p * count * elem + off;
                    ag[t].push(if p == rank {
                        Task::Copy { src: off, dst, len }
                    } else {
                        Task::Read {
                            peer: p,
                            from: Src::Send,
                            src: off,
                            dst,
                            len,
                        }
                    });
                }
            }
            phases.push(ag);
        }
        Coll::Broadcast { root } => {
            let mut bc = phase();
            for (t, (off, len)) in pieces(0, count, threads, elem).into_iter().enumerate() {
                bc[t].push(if rank == root {
                    Task::Copy {
                        src: off,
                        dst: off,
                        len,
                    }
                } else {
                    Task::Read {
                        peer: root,
                        from: Src::Send,
                        src: off,
                        dst: off,
                        len,
                    }
                });
            }
            phases.push(bc);
        }
        Coll::Reduce { root } => {
            // Rank r reduces part r and writes it into the root's output.
            let mut rd = phase();
            let (lo, hi) = split(0, count, n, rank);
            let to = if rank == root {
                Dest::Mine
            } else {
                Dest::Rank(root)
            };
            for (t, (off, len)) in pieces(lo, hi, threads, elem).into_iter().enumerate() {
                rd[t].push(Task::Reduce {
                    src: off,
                    dst: off,
                    len,
                    to,
                });
            }
            phases.push(rd);
        }
    }
    for ph in &mut phases {
        for tasks in ph.iter_mut() {
            tasks.retain(|t| match *t {
                Task::Copy { len, .. } | Task::Read { len, .. } | Task::Reduce { len, .. } => {
                    len > 0
                }
            });
        }
    }
    phases
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs every rank's plan on in-memory buffers, phase by phase (the
    /// barriers), with u64 sums, and returns each rank's output.
    fn simulate(coll: Coll, n: usize, count: usize, threads: usize) -> Vec<Vec<u64>> {
        let (ins, outs) = match coll {
            Coll::AllGather => (count, count * n),
            Coll::ReduceScatter => (count * n, count),
            _ => (count, count),
        };
        let send: Vec<Vec<u64>> = (0..n)
            .map(|r| (0..ins).map(|i| (r * 1000 + i) as u64 * 7 + 1).collect())
            .collect();
        let mut recv = vec![vec![0u64; outs]; n];
        let plans: Vec<Plan> = (0..n)
            .map(|r| plan(coll, r, n, count, 8, threads))
            .collect();
        let phases = plans.iter().map(Vec::len).max().unwrap_or(0);
        for k in 0..phases {
            // Reads in a phase see the peers' buffers as the phase began.
            let before = recv.clone();
            for r in 0..n {
                for t in plans[r].get(k).into_iter().flatten().flatten() {
                    match *t {
                        Task::Copy { src, dst, len } => {
                            for i in 0..len / 8 {
                                recv[r][dst / 8 + i] = send[r][src / 8 + i];
                            }
                        }
                        Task::Read {
                            peer,
                            from,
                            src,
                            dst,
                            len,
                        } => {
                            for i in 0..len / 8 {
                                recv[r][dst / 8 + i] = match from {
                                    Src::Send => send[peer][src / 8 + i],
                                    Src::Recv => before[peer][src / 8 + i],
                                };
                            }
                        }
                        Task::Reduce { src, dst, len, to } => {
                            for i in 0..len / 8 {
                                let v = (0..n).map(|q| send[q][src / 8 + i]).sum();
                                for (q, out) in recv.iter_mut().enumerate() {
                                    let hit = match to {
                                        Dest::Mine => q == r,
                                        Dest::All => true,
                                        Dest::Rank(d) => q == d,
                                    };
                                    if hit {
                                        out[dst / 8 + i] = v;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        // The expected results, by definition of each collective.
        let want: Vec<Vec<u64>> = (0..n)
            .map(|r| match coll {
                Coll::AllReduce => (0..count)
                    .map(|i| (0..n).map(|q| send[q][i]).sum())
                    .collect(),
                Coll::ReduceScatter => (0..count)
                    .map(|i| (0..n).map(|q| send[q][r * count + i]).sum())
                    .collect(),
                Coll::AllGather => (0..n * count).map(|j| send[j / count][j % count]).collect(),
                Coll::Broadcast { root } => send[root].clone(),
                // Only the root's output is written.
                Coll::Reduce { root } if r == root => (0..count)
                    .map(|i| (0..n).map(|q| send[q][i]).sum())
                    .collect(),
                Coll::Reduce { .. } => vec![0; count],
            })
            .collect();
        assert_eq!(recv, want, "{coll:?} n={n} count={count} threads={threads}");
        recv
    }

    #[test]
    fn every_plan_gives_the_collective_result() {
        for n in [2, 3, 4, 5, 8] {
            for count in [0, 1, 3, 7, 64, 1000] {
                for threads in [1, 2, 3, 4] {
                    for coll in [
                        Coll::AllReduce,
                        Coll::ReduceScatter,
                        Coll::AllGather,
                        Coll::Broadcast { root: 0 },
                        Coll::Broadcast { root: n - 1 },
                        Coll::Reduce { root: 0 },
                        Coll::Reduce { root: n - 1 },
                    ] {
                        simulate(coll, n, count, threads);
                    }
                }
            }
        }
    }

    #[test]
    fn an_all_reduce_is_one_phase_of_one_part_per_rank() {
        let (n, count) = (4, 1000);
        let p = plan(Coll::AllReduce, 1, n, count, 4, 3);
        assert_eq!(p.len(), 1);
        let reduced: usize = p[0]
            .iter()
            .flatten()
            .map(|t| match *t {
                Task::Reduce {
                    len, to: Dest::All, ..
                } => len,
                _ => 0,
            })
            .sum();
        let (lo, hi) = split(0, count, n, 1);
        assert_eq!(reduced, (hi - lo) * 4);
    }
}
