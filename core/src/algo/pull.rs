//! Pull plans, the direct host path's collectives, for ranks whose buffers
//! can read each other (host memory of processes of one host, through
//! [`crate::transport::cma`]):
//! each rank reads what it needs from its peers' buffers in one copy,
//! instead of passing every byte around a ring of staging slots.
//!
//! No rank ever writes another process's memory: every task writes only
//! this rank's own output or staging area, and reads (pulls) the rest.
//! A rank that was stopped in the middle of a call and resumed after the
//! others gave up on it (a shrink) then finishes its part without touching
//! buffers the survivors have taken back. An all-reduce is therefore two
//! phases: rank r reduces part r of every rank's input into its own
//! output and announces it; then it copies each other part from its
//! owner's output as soon as that owner has announced its own. A reduce's
//! non-root ranks reduce their part into a staging area of their own
//! (their receive buffer is not theirs to write: NCCL ignores it, and it
//! may be null), announce it, and the root pulls each part once its
//! owner has.
//!
//! The price is memory traffic. The one-phase design this replaced had
//! the reducer write each reduced chunk into every rank's output while it
//! was still in cache: per rank, the whole input read once and the whole
//! output written once (2 bytes of traffic per byte). Pulling reads the
//! n-1 other parts back from their owners' outputs, (n-1)/n more: 2.5
//! bytes per byte at 2 ranks (a quarter more), 2.75 at 4, 2.875 at 8, on
//! machines where memory bandwidth bounds the call (eight ranks on sixteen
//! cores). Correctness under stop-and-resume comes first; docs/performance.md
//! ("Tried and not kept") has the measured cost. The
//! ring moves each byte 2·(n-1) times through shared slots, each with a
//! copy in and a copy out.
//!
//! A plan is phases of tasks per thread. A rank's threads all finish a
//! phase before any starts the next; then the rank either meets every
//! other rank (a barrier) or only announces that it has finished the
//! phase and goes on, and a later [`Task::Wait`] waits for the one peer
//! whose result it is about to read: a barrier of every rank between the
//! two phases would make each rank wait for the last one to be scheduled,
//! though it needs only one owner at a time (on the loaded 2-core VM the
//! two measured alike, 2026-11-26, 60e39d7). The last phase ends with a barrier,
//! which keeps each rank's buffers in place until no peer reads them.
//! Plans are pure data, so the simulation below checks them without
//! processes, in many orders of the ranks' steps.

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
    /// Until `peer` has announced the end of the previous phase (which
    /// must end with [`End::Announce`]): what it wrote there may be read
    /// from here on.
    Wait { peer: usize },
}

/// How a rank ends a phase, once all its threads have finished it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// It meets every other rank: none goes on before all have finished
    /// the phase. The last phase ends so: each rank's buffers stay in
    /// place until no peer reads them.
    Barrier,
    /// It announces that it has finished the phase and goes on at once;
    /// a peer that reads what the phase wrote waits for this rank alone.
    Announce,
}

/// A phase: tasks per thread, and how the rank ends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phase {
    pub tasks: Vec<Vec<Task>>,
    pub end: End,
}

pub type Plan = Vec<Phase>;

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
    tasks(plan)
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

/// Every task of a plan, of every phase and thread.
pub fn tasks(plan: &Plan) -> impl Iterator<Item = &Task> {
    plan.iter().flat_map(|ph| ph.tasks.iter().flatten())
}

/// The peers some thread of phase `ph` waits for, each once.
pub fn awaited(ph: &Phase) -> Vec<usize> {
    let mut peers: Vec<usize> = ph
        .tasks
        .iter()
        .flatten()
        .filter_map(|t| match *t {
            Task::Wait { peer } => Some(peer),
            _ => None,
        })
        .collect();
    peers.sort_unstable();
    peers.dedup();
    peers
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

/// How many slices an all-reduce takes its parts through, `part` bytes
/// (the largest part, the same on every rank) at most `slice` bytes each
/// (0: no limit). A peer then pulls each slice of a part right after its
/// owner wrote it, while it is still in the shared cache, where pulling
/// whole parts read them back from memory once the buffers outgrow the
/// cache (8 ranks on 16 cores are bound by memory bandwidth); each slice
/// costs an announcement and the waits for it.
pub fn slices(part: usize, slice: usize) -> usize {
    if slice == 0 {
        1
    } else {
        part.div_ceil(slice).max(1)
    }
}

/// Rank `rank`'s plan for `coll` of `count` elements (NCCL's count) of
/// `elem` bytes on `n` ranks, spread over `threads` threads. An
/// all-reduce whose parts exceed `slice` bytes goes through them a slice
/// at a time (see [`slices`]). Empty tasks are left out, and so are waits
/// for a peer a thread then reads nothing from.
pub fn plan(
    coll: Coll,
    rank: usize,
    n: usize,
    count: usize,
    elem: usize,
    threads: usize,
    slice: usize,
) -> Plan {
    let threads = threads.max(1);
    let mut phases: Plan = Vec::new();
    let phase = |end| Phase {
        tasks: vec![Vec::new(); threads],
        end,
    };
    // Part p of the elements, the one rank p reduces.
    let part = |p: usize| split(0, count, n, p);
    // Each thread's share of part p, read from owner p's `from` buffer
    // once p has announced it: at the same offset in its output, at the
    // start of its staging area.
    let pull = |ph: &mut Phase, (lo, hi): (usize, usize), p: usize, from: Src| {
        for (t, (off, len)) in pieces(lo, hi, threads, elem).into_iter().enumerate() {
            if len == 0 {
                continue;
            }
            let src = match from {
                Src::Stage => off - lo * elem,
                Src::Send | Src::Recv => off,
            };
            ph.tasks[t].push(Task::Wait { peer: p });
            ph.tasks[t].push(Task::Read {
                peer: p,
                from,
                src,
                dst: off,
                len,
            });
        }
    };
    match coll {
        Coll::AllReduce => {
            // Slice j of every part: its owner reduces it in phase j and
            // announces it, the others pull it in phase j + 1 while its
            // owner reduces the next. With one slice: reduce, then pull.
            let k = slices(count.div_ceil(n.max(1)) * elem, slice);
            let piece = |p: usize, j: usize| {
                let (lo, hi) = part(p);
                split(lo, hi, k, j)
            };
            for j in 0..=k {
                let mut ph = phase(if j == k { End::Barrier } else { End::Announce });
                if j < k {
                    let (lo, hi) = piece(rank, j);
                    for (t, (off, len)) in pieces(lo, hi, threads, elem).into_iter().enumerate() {
                        ph.tasks[t].push(Task::Reduce {
                            src: off,
                            dst: off,
                            len,
                            into: Own::Recv,
                        });
                    }
                }
                // The next rank's part first, so that the ranks spread
                // their reads over the owners (and the first owners they
                // wait for are different ranks).
                if j > 0 {
                    for p in (1..n).map(|d| (rank + d) % n) {
                        pull(&mut ph, piece(p, j - 1), p, Src::Recv);
                    }
                }
                phases.push(ph);
            }
        }
        Coll::ReduceScatter => {
            let mut rs = phase(End::Barrier);
            for (t, (off, len)) in pieces(0, count, threads, elem).into_iter().enumerate() {
                rs.tasks[t].push(Task::Reduce {
                    src: rank * count * elem + off,
                    dst: off,
                    len,
                    into: Own::Recv,
                });
            }
            phases.push(rs);
        }
        Coll::AllGather => {
            let mut ag = phase(End::Barrier);
            for p in (0..n).map(|k| (rank + k) % n) {
                for (t, (off, len)) in pieces(0, count, threads, elem).into_iter().enumerate() {
                    let dst = p * count * elem + off;
                    ag.tasks[t].push(if p == rank {
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
            let mut bc = phase(End::Barrier);
            for (t, (off, len)) in pieces(0, count, threads, elem).into_iter().enumerate() {
                bc.tasks[t].push(if rank == root {
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
            // reads, each as soon as its owner has announced it. Non-roots
            // have nothing to do in the second phase but keep their
            // staging area in place until the last barrier.
            let mut mine = phase(End::Announce);
            let (lo, hi) = part(rank);
            for (t, (off, len)) in pieces(lo, hi, threads, elem).into_iter().enumerate() {
                mine.tasks[t].push(if rank == root {
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
            let mut gather = phase(End::Barrier);
            if rank == root {
                for p in (1..n).map(|k| (rank + k) % n) {
                    pull(&mut gather, part(p), p, Src::Stage);
                }
            }
            phases.push(mine);
            phases.push(gather);
        }
    }
    for ph in &mut phases {
        for tasks in ph.tasks.iter_mut() {
            tasks.retain(|t| match *t {
                Task::Copy { len, .. } | Task::Read { len, .. } | Task::Reduce { len, .. } => {
                    len > 0
                }
                Task::Wait { .. } => true,
            });
        }
    }
    phases
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator for the schedules.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    /// Which rank's step runs next among those that can: the first, the
    /// last, or a random one.
    #[derive(Debug, Clone, Copy)]
    enum Order {
        First,
        Last,
        Random(u64),
    }

    /// A byte range one task writes in one of its rank's buffers.
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Write {
        buf: Own,
        lo: usize,
        hi: usize,
    }

    fn writes(t: &Task) -> Option<Write> {
        match *t {
            Task::Copy { dst, len, .. } | Task::Read { dst, len, .. } => Some(Write {
                buf: Own::Recv,
                lo: dst,
                hi: dst + len,
            }),
            Task::Reduce { dst, len, into, .. } => Some(Write {
                buf: into,
                lo: dst,
                hi: dst + len,
            }),
            Task::Wait { .. } => None,
        }
    }

    /// Every rank's buffers (u64 elements, offsets in bytes as in plans).
    struct Bufs {
        send: Vec<Vec<u64>>,
        recv: Vec<Vec<u64>>,
        stage: Vec<Vec<u64>>,
    }

    /// Runs `plans` (one per rank) on `bufs` with u64 sums, one task at a
    /// time in `order`, as processes would: a rank's threads each go
    /// through their phase's tasks; a rank ends a phase once all its
    /// threads have, and then waits for every rank (a barrier) or goes on
    /// (an announcement); a [`Task::Wait`] holds its thread until its peer
    /// has announced. Reads see peers' buffers as they are at that moment.
    /// Returns the first hazard: a read of a peer's output or stage before
    /// every task of that peer writing the bytes has run (or a write to
    /// them could still follow), or no step possible before the end.
    fn run(plans: &[Plan], bufs: &mut Bufs, order: Order) -> Result<(), String> {
        let n = plans.len();
        // The ranks meet after the same phases, alike: they count meetings.
        for p in plans {
            let ends: Vec<End> = p.iter().map(|ph| ph.end).collect();
            let first: Vec<End> = plans[0].iter().map(|ph| ph.end).collect();
            if ends != first {
                return Err(format!(
                    "ranks end their phases differently: {ends:?}, {first:?}"
                ));
            }
            if p.last().is_some_and(|ph| ph.end != End::Barrier) {
                return Err("the last phase does not end with a barrier".into());
            }
        }
        let phases = plans[0].len();
        // Per rank: its current phase, how many it has finished (and so
        // announced or arrived at), each thread's place in the phase,
        // and which of its tasks have run, by (phase, thread, place).
        let mut phase = vec![0usize; n];
        let mut finished = vec![0usize; n];
        let mut at: Vec<Vec<usize>> = plans
            .iter()
            .map(|p| vec![0; p.first().map_or(0, |ph| ph.tasks.len())])
            .collect();
        let mut ran: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); n];
        let mut rng = Rng(match order {
            Order::Random(s) => s.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            _ => 1,
        });
        loop {
            // The steps that can run now: (rank, Some(thread)) runs that
            // thread's next task, (rank, None) ends the rank's phase.
            let mut steps: Vec<(usize, Option<usize>)> = Vec::new();
            for r in 0..n {
                let k = phase[r];
                if k == phases {
                    continue;
                }
                let ph = &plans[r][k];
                let mut busy = false;
                for (t, list) in ph.tasks.iter().enumerate() {
                    let Some(task) = list.get(at[r][t]) else {
                        continue;
                    };
                    busy = true;
                    let ready = match *task {
                        Task::Wait { peer } => finished[peer] >= k,
                        _ => true,
                    };
                    if ready {
                        steps.push((r, Some(t)));
                    }
                }
                let met = match ph.end {
                    // Arrived, and everyone else too.
                    End::Barrier if finished[r] > k => finished.iter().all(|&f| f > k),
                    _ => true,
                };
                if !busy && met {
                    steps.push((r, None));
                }
            }
            if steps.is_empty() {
                return if phase.iter().all(|&k| k == phases) {
                    Ok(())
                } else {
                    Err(format!(
                        "no step can run: phases {phase:?}, finished {finished:?}"
                    ))
                };
            }
            let (r, t) = steps[match order {
                Order::First => 0,
                Order::Last => steps.len() - 1,
                Order::Random(_) => rng.below(steps.len()),
            }];
            let k = phase[r];
            let Some(t) = t else {
                match plans[r][k].end {
                    End::Announce => {
                        finished[r] = k + 1;
                        phase[r] = k + 1;
                    }
                    // First the arrival, then (a later step) the leaving.
                    End::Barrier if finished[r] == k => finished[r] = k + 1,
                    End::Barrier => phase[r] = k + 1,
                }
                if phase[r] > k {
                    at[r] = vec![0; plans[r].get(k + 1).map_or(0, |ph| ph.tasks.len())];
                }
                continue;
            };
            let task = plans[r][k].tasks[t][at[r][t]];
            at[r][t] += 1;
            ran[r].push((k, t, at[r][t] - 1));
            match task {
                Task::Wait { peer } => {
                    if k == 0 || plans[peer][k - 1].end != End::Announce {
                        return Err(format!("rank {r} waits for {peer} after no announcement"));
                    }
                }
                Task::Copy { src, dst, len } => {
                    for i in 0..len / 8 {
                        bufs.recv[r][dst / 8 + i] = bufs.send[r][src / 8 + i];
                    }
                }
                Task::Read {
                    peer,
                    from,
                    src,
                    dst,
                    len,
                } => {
                    if peer == r {
                        return Err(format!("rank {r} reads itself"));
                    }
                    let own = match from {
                        Src::Send => None,
                        Src::Recv => Some(Own::Recv),
                        Src::Stage => Some(Own::Stage),
                    };
                    if let Some(buf) = own {
                        // Every task of the owner that writes these bytes
                        // must have run, in every phase.
                        let (lo, hi) = (src, src + len);
                        for (pk, ph) in plans[peer].iter().enumerate() {
                            for (pt, list) in ph.tasks.iter().enumerate() {
                                for (i, w) in list.iter().enumerate() {
                                    let Some(w) = writes(w) else { continue };
                                    if w.buf == buf
                                        && w.lo < hi
                                        && lo < w.hi
                                        && !ran[peer].contains(&(pk, pt, i))
                                    {
                                        return Err(format!(
                                            "rank {r} reads rank {peer}'s {buf:?} [{lo}, {hi}) before its phase {pk} task {:?} wrote it",
                                            ph.tasks[pt][i]
                                        ));
                                    }
                                }
                            }
                        }
                    }
                    for i in 0..len / 8 {
                        bufs.recv[r][dst / 8 + i] = match from {
                            Src::Send => bufs.send[peer][src / 8 + i],
                            Src::Recv => bufs.recv[peer][src / 8 + i],
                            Src::Stage => bufs.stage[peer][src / 8 + i],
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
                        let v = (0..n).map(|q| bufs.send[q][src / 8 + i]).sum();
                        match into {
                            Own::Recv => bufs.recv[r][dst / 8 + i] = v,
                            Own::Stage => bufs.stage[r][dst / 8 + i] = v,
                        }
                    }
                }
            }
        }
    }

    /// Every rank's buffers for `coll` on `n` ranks of `count` elements,
    /// the inputs numbered by rank and place.
    fn bufs(coll: Coll, n: usize, count: usize, plans: &[Plan]) -> Bufs {
        let (ins, outs) = match coll {
            Coll::AllGather => (count, count * n),
            Coll::ReduceScatter => (count * n, count),
            _ => (count, count),
        };
        Bufs {
            send: (0..n)
                .map(|r| (0..ins).map(|i| (r * 1000 + i) as u64 * 7 + 1).collect())
                .collect(),
            recv: vec![vec![0u64; outs]; n],
            stage: plans.iter().map(|p| vec![0; stage_bytes(p) / 8]).collect(),
        }
    }

    /// Runs every rank's plan in `order` and checks each rank's output.
    fn simulate(coll: Coll, n: usize, count: usize, threads: usize, slice: usize, order: Order) {
        let plans: Vec<Plan> = (0..n)
            .map(|r| plan(coll, r, n, count, 8, threads, slice))
            .collect();
        let mut b = bufs(coll, n, count, &plans);
        let case =
            format!("{coll:?} n={n} count={count} threads={threads} slice={slice} {order:?}");
        if let Err(e) = run(&plans, &mut b, order) {
            panic!("{case}: {e}");
        }
        let send = &b.send;
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
        assert_eq!(b.recv, want, "{case}");
    }

    fn orders() -> impl Iterator<Item = Order> {
        [Order::First, Order::Last]
            .into_iter()
            .chain((1..=3).map(Order::Random))
    }

    #[test]
    fn every_plan_gives_the_collective_result_in_any_order() {
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
                        // Slices of 1 and 3 elements, and none.
                        for slice in [0, 8, 24] {
                            for order in orders() {
                                simulate(coll, n, count, threads, slice, order);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Every read of a peer's result comes after a wait for that peer in
    /// the same thread and phase (the previous phase ending with an
    /// announcement), or after a barrier: checked on the plans' text, for
    /// every order of steps at once.
    #[test]
    fn every_read_of_a_peers_result_follows_a_wait_for_it() {
        for n in [2, 3, 4, 8] {
            for threads in [1, 2, 3] {
                for coll in [
                    Coll::AllReduce,
                    Coll::Reduce { root: 0 },
                    Coll::Reduce { root: n - 1 },
                ] {
                    for rank in 0..n {
                        let p = plan(coll, rank, n, 1000, 4, threads, 400);
                        for (k, ph) in p.iter().enumerate() {
                            let after_barrier = k > 0 && p[k - 1].end == End::Barrier;
                            for list in &ph.tasks {
                                let mut waited = Vec::new();
                                for t in list {
                                    match *t {
                                        Task::Wait { peer } => waited.push(peer),
                                        Task::Read { peer, from, .. } if from != Src::Send => {
                                            assert!(
                                                after_barrier || waited.contains(&peer),
                                                "{coll:?} n={n} rank {rank}: {t:?} unawaited"
                                            );
                                        }
                                        _ => {}
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The simulation catches a plan whose reads do not wait: without its
    /// waits (and with its announcement taken for a barrier's arrival
    /// only) an all-reduce reads some owner's part before it is there
    /// when the reader's steps go first.
    #[test]
    fn a_plan_without_its_waits_is_caught() {
        let (n, count) = (4, 64);
        for coll in [Coll::AllReduce, Coll::Reduce { root: 1 }] {
            let plans: Vec<Plan> = (0..n)
                .map(|r| {
                    let mut p = plan(coll, r, n, count, 8, 2, 0);
                    for ph in &mut p {
                        for list in &mut ph.tasks {
                            list.retain(|t| !matches!(t, Task::Wait { .. }));
                        }
                    }
                    p
                })
                .collect();
            let caught = orders().any(|order| {
                let mut b = bufs(coll, n, count, &plans);
                run(&plans, &mut b, order).is_err_and(|e| e.contains("before its phase 0"))
            });
            assert!(caught, "{coll:?}: no order caught the missing waits");
        }
    }

    /// Bytes of each kind of task in each phase of a plan: (reduced into
    /// the receive buffer, reduced into the stage, read from peers).
    fn volumes(p: &Plan) -> Vec<(usize, usize, usize)> {
        p.iter()
            .map(|ph| {
                ph.tasks
                    .iter()
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
                        Task::Copy { .. } | Task::Wait { .. } => (a, b, c),
                    })
            })
            .collect()
    }

    fn ends(p: &Plan) -> Vec<End> {
        p.iter().map(|ph| ph.end).collect()
    }

    #[test]
    fn an_all_reduce_reduces_its_own_part_then_pulls_the_others() {
        let (n, count, elem) = (4, 1000, 4);
        let p = plan(Coll::AllReduce, 1, n, count, elem, 3, 0);
        let (lo, hi) = split(0, count, n, 1);
        let own = (hi - lo) * elem;
        assert_eq!(volumes(&p), [(own, 0, 0), (0, 0, count * elem - own)]);
        assert_eq!(ends(&p), [End::Announce, End::Barrier]);
        // The reads take the owners' results, never their inputs, each
        // thread's first from the next rank, after waiting for it.
        assert!(p[1].tasks.iter().flatten().all(|t| matches!(
            t,
            Task::Read {
                from: Src::Recv,
                ..
            } | Task::Wait { .. }
        )));
        for list in &p[1].tasks {
            assert_eq!(list[0], Task::Wait { peer: 2 });
        }
        assert_eq!(awaited(&p[1]), [0, 2, 3]);
    }

    /// In slices, phase j reduces slice j of the rank's part and pulls
    /// slice j - 1 of every other part; the whole moves the same bytes.
    #[test]
    fn a_sliced_all_reduce_pulls_each_slice_one_phase_after_its_reduction() {
        let (n, count, elem) = (4, 1000, 4);
        // Parts of 250 elements (1000 bytes) in slices of 300 bytes: 4.
        let p = plan(Coll::AllReduce, 1, n, count, elem, 2, 300);
        assert_eq!(slices(1000, 300), 4);
        assert_eq!(p.len(), 5);
        let mut ends_want = vec![End::Announce; 4];
        ends_want.push(End::Barrier);
        assert_eq!(ends(&p), ends_want);
        let v = volumes(&p);
        let (lo, hi) = split(0, count, n, 1);
        let own: usize = v.iter().map(|x| x.0).sum();
        let read: usize = v.iter().map(|x| x.2).sum();
        assert_eq!((own, read), ((hi - lo) * elem, (count - (hi - lo)) * elem));
        assert_eq!(v[0].2, 0, "nothing to pull before the first slice");
        assert_eq!(v[4].0, 0, "nothing left to reduce in the last phase");
        for ph in &p[1..] {
            assert_eq!(awaited(ph), [0, 2, 3]);
        }
        // With no limit, or a slice as large as a part: one slice.
        assert_eq!(plan(Coll::AllReduce, 1, n, count, elem, 2, 0).len(), 2);
        assert_eq!(plan(Coll::AllReduce, 1, n, count, elem, 2, 1000).len(), 2);
    }

    #[test]
    fn a_reduce_stages_its_part_and_the_root_pulls_them() {
        let (n, count, elem, root) = (4, 1000, 8, 2);
        for rank in 0..n {
            let p = plan(Coll::Reduce { root }, rank, n, count, elem, 2, 0);
            let (lo, hi) = split(0, count, n, rank);
            let own = (hi - lo) * elem;
            assert_eq!(ends(&p), [End::Announce, End::Barrier]);
            if rank == root {
                assert_eq!(volumes(&p), [(own, 0, 0), (0, 0, count * elem - own)]);
                assert_eq!(stage_bytes(&p), 0);
                assert_eq!(awaited(&p[1]), [0, 1, 3]);
            } else {
                // A non-root's receive buffer is never touched (NCCL
                // ignores it; it may be null), and it waits for nobody.
                assert_eq!(volumes(&p), [(0, own, 0), (0, 0, 0)]);
                assert_eq!(stage_bytes(&p), own);
                assert!(awaited(&p[1]).is_empty());
            }
        }
    }

    /// A thread with nothing to read from a peer does not wait for it.
    #[test]
    fn no_wait_without_a_read() {
        // 2 elements on 4 ranks: two of them own one each, two none.
        let owners: Vec<usize> = (0..4)
            .filter(|&q| {
                let (lo, hi) = split(0, 2, 4, q);
                hi > lo
            })
            .collect();
        assert_eq!(owners.len(), 2);
        for rank in 0..4 {
            let p = plan(Coll::AllReduce, rank, 4, 2, 4, 3, 0);
            let read: Vec<usize> = owners.iter().copied().filter(|&q| q != rank).collect();
            assert_eq!(awaited(&p[1]), read, "rank {rank}");
        }
    }
}
