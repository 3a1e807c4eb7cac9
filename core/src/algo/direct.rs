//! Direct collectives for ranks whose buffers can read each other (host
//! memory of processes of one host, through [`crate::transport::cma`]):
//! each rank reads what it needs from its peers' buffers in one copy,
//! instead of passing every byte around a ring of staging slots.
//!
//! No rank ever writes another process's memory: every task writes only
//! this rank's own output or staging area, and reads (pulls) the rest.
//! A rank that was stopped in the middle of a call and resumed after the
//! others gave up on it (a shrink) then finishes its part without touching
//! buffers the survivors have taken back. An all-reduce is therefore two
//! phases: rank r reduces part r of every rank's input into its own
//! output; then, after a barrier, it copies the other parts from their
//! owners' outputs. A reduce's non-root ranks reduce their part into a
//! staging area of their own (their receive buffer is not theirs to
//! write: NCCL ignores it, and it may be null), and the root pulls the
//! parts after a barrier.
//!
//! The price is memory traffic. The one-phase design this replaced had
//! the reducer write each reduced chunk into every rank's output while it
//! was still in cache: per rank, the whole input read once and the whole
//! output written once (2 bytes of traffic per byte). Pulling reads the
//! n-1 other parts back from their owners' outputs, (n-1)/n more: 2.5
//! bytes per byte at 2 ranks (a quarter more), 2.75 at 4, 2.875 at 8, on
//! machines where memory bandwidth bounds the call (eight ranks on sixteen
//! cores). Correctness under stop-and-resume comes first; docs/PERF.md
//! ("Direct host path without remote writes") has the measured cost. The
//! ring moves each byte 2·(n-1) times through shared slots, each with a
//! copy in and a copy out.
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
    /// Its staging area (a reduce's non-root part).
    Stage,
}

/// Which of this rank's own buffers a reduction's result goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Own {
    Recv,
    /// The rank's staging area, which lives as long as its communicator.
    Stage,
}

/// One piece of work; offsets and lengths in bytes. Every task writes
/// only this rank's memory.
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
    /// into `[dst, dst+len)` of this rank's `into` buffer.
    Reduce {
        src: usize,
        dst: usize,
        len: usize,
        into: Own,
    },
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

/// Bytes of its staging area a plan needs.
pub fn stage_bytes(plan: &Plan) -> usize {
    plan.iter()
        .flatten()
        .flatten()
        .map(|t| match *t {
            Task::Reduce {
                dst,
                len,
                into: Own::Stage,
                ..
            } => dst + len,
            _ => 0,
        })
        .max()
        .unwrap_or(0)
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
    // Part p of the elements, the one rank p reduces.
    let part = |p: usize| split(0, count, n, p);
    match coll {
        Coll::AllReduce => {
            let mut mine = phase();
            let (lo, hi) = part(rank);
            for (t, (off, len)) in pieces(lo, hi, threads, elem).into_iter().enumerate() {
                mine[t].push(Task::Reduce {
                    src: off,
                    dst: off,
                    len,
                    into: Own::Recv,
                });
            }
            // The next rank's part first, so that the ranks spread their
            // reads over the owners.
            let mut others = phase();
            for p in (1..n).map(|k| (rank + k) % n) {
                let (lo, hi) = part(p);
                for (t, (off, len)) in pieces(lo, hi, threads, elem).into_iter().enumerate() {
                    others[t].push(Task::Read {
                        peer: p,
                        from: Src::Recv,
                        src: off,
                        dst: off,
                        len,
                    });
                }
            }
            phases.push(mine);
            phases.push(others);
        }
        Coll::ReduceScatter => {
            let mut rs = phase();
            for (t, (off, len)) in pieces(0, count, threads, elem).into_iter().enumerate() {
                rs[t].push(Task::Reduce {
                    src: rank * count * elem + off,
                    dst: off,
                    len,
                    into: Own::Recv,
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
            // Rank r reduces part r: the root into its output, the others
            // into their staging areas (at offset 0), which the root then
            // reads. Non-roots have nothing to do in the second phase but
            // keep their staging area in place, so every rank has both.
            let mut mine = phase();
            let (lo, hi) = part(rank);
            for (t, (off, len)) in pieces(lo, hi, threads, elem).into_iter().enumerate() {
                mine[t].push(if rank == root {
                    Task::Reduce {
                        src: off,
                        dst: off,
                        len,
                        into: Own::Recv,
                    }
                } else {
                    Task::Reduce {
                        src: off,
                        dst: off - lo * elem,
                        len,
                        into: Own::Stage,
                    }
                });
            }
            let mut gather = phase();
            if rank == root {
                for p in (1..n).map(|k| (rank + k) % n) {
                    let (lo, hi) = part(p);
                    for (t, (off, len)) in pieces(lo, hi, threads, elem).into_iter().enumerate() {
                        gather[t].push(Task::Read {
                            peer: p,
                            from: Src::Stage,
                            src: off - lo * elem,
                            dst: off,
                            len,
                        });
                    }
                }
            }
            phases.push(mine);
            phases.push(gather);
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
    /// barriers), with u64 sums, and returns each rank's output. A rank
    /// writes only its own buffers: the simulation has no way to do
    /// otherwise, since no task names a peer's buffer to write.
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
        // Every rank meets the others after each of its phases: all must
        // have as many.
        assert!(
            plans.iter().all(|p| p.len() == plans[0].len()),
            "{coll:?} n={n} count={count}: ranks with different numbers of phases"
        );
        let mut stage: Vec<Vec<u64>> = plans.iter().map(|p| vec![0; stage_bytes(p) / 8]).collect();
        for k in 0..plans[0].len() {
            // Reads in a phase see the peers' buffers as the phase began.
            let (before, staged) = (recv.clone(), stage.clone());
            for (r, p) in plans.iter().enumerate() {
                for t in p.get(k).into_iter().flatten().flatten() {
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
                            assert_ne!(peer, r, "{coll:?}: rank {r} reads itself");
                            for i in 0..len / 8 {
                                recv[r][dst / 8 + i] = match from {
                                    Src::Send => send[peer][src / 8 + i],
                                    Src::Recv => before[peer][src / 8 + i],
                                    Src::Stage => staged[peer][src / 8 + i],
                                };
                            }
                        }
                        Task::Reduce {
                            src,
                            dst,
                            len,
                            into,
                        } => {
                            for i in 0..len / 8 {
                                let v = (0..n).map(|q| send[q][src / 8 + i]).sum();
                                match into {
                                    Own::Recv => recv[r][dst / 8 + i] = v,
                                    Own::Stage => stage[r][dst / 8 + i] = v,
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

    /// Bytes of each kind of task in each phase of a plan: (reduced into
    /// the receive buffer, reduced into the stage, read from peers).
    fn volumes(p: &Plan) -> Vec<(usize, usize, usize)> {
        p.iter()
            .map(|ph| {
                ph.iter()
                    .flatten()
                    .fold((0, 0, 0), |(a, b, c), t| match *t {
                        Task::Reduce {
                            len,
                            into: Own::Recv,
                            ..
                        } => (a + len, b, c),
                        Task::Reduce {
                            len,
                            into: Own::Stage,
                            ..
                        } => (a, b + len, c),
                        Task::Read { len, .. } => (a, b, c + len),
                        Task::Copy { .. } => (a, b, c),
                    })
            })
            .collect()
    }

    #[test]
    fn an_all_reduce_reduces_its_own_part_then_pulls_the_others() {
        let (n, count, elem) = (4, 1000, 4);
        let p = plan(Coll::AllReduce, 1, n, count, elem, 3);
        let (lo, hi) = split(0, count, n, 1);
        let own = (hi - lo) * elem;
        assert_eq!(volumes(&p), [(own, 0, 0), (0, 0, count * elem - own)]);
        // The reads take the owners' results, never their inputs.
        assert!(p[1].iter().flatten().all(|t| matches!(
            t,
            Task::Read {
                from: Src::Recv,
                ..
            }
        )));
    }

    #[test]
    fn a_reduce_stages_its_part_and_the_root_pulls_them() {
        let (n, count, elem, root) = (4, 1000, 8, 2);
        for rank in 0..n {
            let p = plan(Coll::Reduce { root }, rank, n, count, elem, 2);
            let (lo, hi) = split(0, count, n, rank);
            let own = (hi - lo) * elem;
            if rank == root {
                assert_eq!(volumes(&p), [(own, 0, 0), (0, 0, count * elem - own)]);
                assert_eq!(stage_bytes(&p), 0);
            } else {
                // A non-root's receive buffer is never touched (NCCL
                // ignores it; it may be null).
                assert_eq!(volumes(&p), [(0, own, 0), (0, 0, 0)]);
                assert_eq!(stage_bytes(&p), own);
            }
        }
    }
}
