//! All-reduce and broadcast on device buffers where ranks of several processes share a
//! GPU and the communicator spans other GPUs (or hosts) too. Without MPS
//! such a GPU runs one process at a time, so every rank's ring kernel
//! waits for the GPU to switch processes at each step (4.6 ms per 8-byte
//! all-reduce on 2 H200 with 4 processes). The shared-GPU path avoids the
//! switches among ranks that all share one GPU, so an all-reduce runs in
//! three steps, each on a communicator split from this one:
//!
//! 1. a reduce to the first rank of each GPU, on the communicator of that
//!    GPU's ranks (the shared-GPU path: that rank's kernels do all of it);
//! 2. an all-reduce among those first ranks, one per GPU, through the
//!    usual transports;
//! 3. a broadcast from the first rank of each GPU, again on its GPU's
//!    communicator.
//!
//! The three run on the caller's stream one after the other. The two
//! communicators are split from this one at its first such all-reduce
//! (every rank reaches it, as it reaches every collective) and live as
//! long as it does; a suspend or revoke lets them go. A broadcast takes
//! the same communicators: on the root's GPU from the root, among one rank
//! per GPU, then on each other GPU; an all-gather is one such broadcast per
//! rank, into that rank's block. Only sum, product, min and max split
//! this way (an average or a pre-multiplied sum of
//! partial results would differ from NCCL's); other operations, and groups
//! holding other collectives, run as before; so do layouts where a
//! process holds several ranks (see `mixed_groups` in the device window).
//! OXCCL_HIER=0 turns it off.
//! Profiler events of the three steps are the split communicators' own.

use std::sync::{Arc, Mutex};

use tracing::info;

use crate::dtype::RedOp;
use crate::error::{Error, Result};
use crate::exec::mem::OpBuffers;
use crate::op::{Op, OpKind};
use crate::plugin::profiler::{ApiEvents, Handle};

use super::core::{Core, GpuPath};
use super::{Comm, CommConfig, SPLIT_NOCOLOR};

/// A communicator's split communicators, once asked for.
#[derive(Default)]
pub(super) enum State {
    /// Not decided yet: decided at the first all-reduce that could use it.
    #[default]
    Unknown,
    /// The layout does not call for it (or it was let go).
    No,
    Yes(Arc<Hier>),
}

pub(super) struct Hier {
    /// This rank's GPU's ranks (first: the GPU's leader).
    local: Comm,
    /// One rank per GPU, on the leaders only.
    leaders: Option<Comm>,
    /// The parent's ranks of `local`, for errors.
    local_ranks: Vec<usize>,
    /// Each parent rank's GPU, numbered in the order of the GPUs' first
    /// ranks: GPU g's first rank is rank g of `leaders`.
    gpus: Vec<usize>,
}

impl Hier {
    /// Ends both (a destroy or an abort of the parent).
    fn end(&self, abort: bool) {
        for c in std::iter::once(&self.local).chain(&self.leaders) {
            if abort {
                c.abort();
            } else {
                let _ = c.destroy();
            }
        }
    }
}

/// Whether `op` may run in steps.
fn splits(op: &Op) -> bool {
    op.count > 0
        && match op.kind {
            OpKind::AllReduce => {
                matches!(op.redop, RedOp::Sum | RedOp::Prod | RedOp::Max | RedOp::Min)
            }
            OpKind::Broadcast { .. } | OpKind::AllGather => true,
            _ => false,
        }
}

fn wanted() -> bool {
    std::env::var("OXCCL_HIER").map_or(true, |v| v.trim() != "0")
}

impl Comm {
    /// Runs one group's operations of this communicator: its all-reduces,
    /// broadcasts and all-gathers in steps where the layout calls for it
    /// (see the module) and every collective of the group allows it, then
    /// the point-to-point messages as one group.
    pub(crate) fn execute_group(
        &self,
        core: &Core,
        ops: &[(Op, OpBuffers)],
        api: &ApiEvents,
    ) -> Result<()> {
        let colls = || ops.iter().filter(|(op, _)| op.kind.coll().is_some());
        // Each rank's collectives are the same, so every rank decides alike;
        // point-to-point messages may differ between ranks and decide nothing.
        if colls().next().is_none() || !colls().all(|(op, _)| splits(op)) {
            return core.execute(ops, api);
        }
        let Some(hier) = self.hier(core)? else {
            return core.execute(ops, api);
        };
        for (op, _) in colls() {
            self.in_steps(&hier, op)?;
        }
        let rest: Vec<(Op, OpBuffers)> = ops
            .iter()
            .filter(|(op, _)| op.kind.coll().is_none())
            .copied()
            .collect();
        if rest.is_empty() {
            return Ok(());
        }
        core.execute(&rest, api)
    }

    /// The split communicators, made at the first call that asks on a
    /// layout that calls for them; `None` where it does not.
    fn hier(&self, core: &Core) -> Result<Option<Arc<Hier>>> {
        let mut st = self
            .shared
            .hier
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*st {
            State::No => return Ok(None),
            State::Yes(h) => return Ok(Some(h.clone())),
            State::Unknown => {}
        }
        let gpus = match &core.device {
            Some(GpuPath(dc, _)) if wanted() => dc
                .lock()
                .map_err(|_| Error::Internal("device communicator poisoned".into()))?
                .mixed_gpus()
                .map(<[usize]>::to_vec),
            _ => None,
        };
        let Some(gpus) = gpus else {
            *st = State::No;
            return Ok(None);
        };
        let me = self.user_rank();
        let mine = gpus[me];
        let local_ranks: Vec<usize> = (0..gpus.len()).filter(|&r| gpus[r] == mine).collect();
        let leader = local_ranks[0] == me;
        let cfg = CommConfig::default();
        let key = me as i32;
        let local = self
            .split(mine as i32, key, &cfg)?
            .ok_or_else(|| Error::Internal("no communicator for this rank's GPU".into()))?;
        let leaders = self.split(if leader { 0 } else { SPLIT_NOCOLOR }, key, &cfg)?;
        let ngpus = gpus.iter().max().map_or(0, |g| g + 1);
        info!(target: "oxccl::init", "rank {me}: ranks of several processes share GPUs of this {}-rank communicator over {ngpus} GPUs: all_reduce runs as a reduce on each GPU's ranks (this rank's: {local_ranks:?}, shared-GPU path), an all_reduce among one rank per GPU, and a broadcast on each GPU; broadcast as one on the root's GPU, one among one rank per GPU and one on each other GPU, all_gather as a broadcast per rank (OXCCL_HIER=0: every rank's ring kernels, each step waiting for the GPU to switch processes)", gpus.len());
        let h = Arc::new(Hier {
            local,
            leaders,
            local_ranks,
            gpus,
        });
        *st = State::Yes(h.clone());
        Ok(Some(h))
    }

    /// Runs `op` in the steps [`plan`] gives this rank.
    fn in_steps(&self, h: &Hier, op: &Op) -> Result<()> {
        let me = self.user_rank();
        let block = match op.kind {
            OpKind::AllGather => op.count * op.dtype.size(),
            _ => 0,
        };
        for s in plan(op.kind, me, &h.gpus) {
            let c = match s.on {
                On::Local => &h.local,
                On::Leaders => h.leaders.as_ref().ok_or_else(|| {
                    Error::Internal(format!(
                        "rank {me} has a step among one rank per GPU but is not one"
                    ))
                })?,
            };
            let output = op.output.wrapping_add(s.block * block);
            let input = match s.from {
                Reads::Input => op.input,
                Reads::Output => output as *const u8,
            };
            let o = Op {
                kind: s.kind,
                input,
                output,
                ..*op
            };
            run_on(c, o).map_err(|e| {
                e.context(format!(
                    "rank {me}: {} of a {} of {} x {} in steps (this rank's GPU: ranks {:?})",
                    s.what,
                    op.kind.name(),
                    op.count,
                    op.dtype.name(),
                    h.local_ranks
                ))
            })?;
        }
        Ok(())
    }

    /// Lets the split communicators go (a destroy or an abort of this one,
    /// whose kind `abort` says; a suspend, which frees their memory and
    /// asks for them `again` at the next all-reduce after the resume).
    pub(super) fn let_hier_go(&self, abort: bool, again: bool) {
        let old = {
            let mut st = self
                .shared
                .hier
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let next = if again { State::Unknown } else { State::No };
            std::mem::replace(&mut *st, next)
        };
        if let State::Yes(h) = old {
            h.end(abort);
        }
    }

    /// Ends the split communicators' work (a revoke of this one); they are
    /// destroyed with it.
    pub(super) fn revoke_hier(&self) {
        let st = self
            .shared
            .hier
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let State::Yes(h) = &*st {
            for c in std::iter::once(&h.local).chain(&h.leaders) {
                let _ = c.revoke();
            }
        }
    }
}

/// Which split communicator a step runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum On {
    /// The ranks of this rank's GPU.
    Local,
    /// One rank per GPU.
    Leaders,
}

/// What a step reads: the operation's input, or the output it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reads {
    Input,
    Output,
}

/// One step of a rank's part of an operation in steps: `kind` (its root
/// numbered in that communicator) on `on`, reading `from`, writing the
/// output's block `block` (an all-gather's rank blocks; 0 otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Step {
    on: On,
    kind: OpKind,
    from: Reads,
    block: usize,
    what: &'static str,
}

/// Rank `me`'s steps for `kind` (all-reduce, broadcast or all-gather),
/// where rank r is on GPU `gpus[r]`, GPUs numbered in the order of their
/// first ranks (GPU g's first rank is rank g among one rank per GPU).
/// Every member of a split communicator gets the same steps on it, in the
/// same order.
fn plan(kind: OpKind, me: usize, gpus: &[usize]) -> Vec<Step> {
    let mine = gpus[me];
    let local: Vec<usize> = (0..gpus.len()).filter(|&r| gpus[r] == mine).collect();
    let leader = local[0] == me;
    let step = |on, kind, from, block, what| Step {
        on,
        kind,
        from,
        block,
        what,
    };
    let broadcast = |root: usize, block: usize, out: &mut Vec<Step>| {
        let root_gpu = gpus[root];
        if mine == root_gpu {
            let at = local.iter().position(|&r| r == root).unwrap_or(0);
            let k = OpKind::Broadcast { root: at };
            out.push(step(
                On::Local,
                k,
                Reads::Input,
                block,
                "the broadcast on the root's GPU",
            ));
        }
        if leader {
            let k = OpKind::Broadcast { root: root_gpu };
            out.push(step(
                On::Leaders,
                k,
                Reads::Output,
                block,
                "the broadcast among one rank per GPU",
            ));
        }
        if mine != root_gpu {
            let k = OpKind::Broadcast { root: 0 };
            out.push(step(
                On::Local,
                k,
                Reads::Output,
                block,
                "the broadcast on its GPU",
            ));
        }
    };
    let mut out = Vec::new();
    match kind {
        OpKind::AllReduce => {
            let k = OpKind::Reduce { root: 0 };
            out.push(step(On::Local, k, Reads::Input, 0, "the reduce on its GPU"));
            if leader {
                let k = OpKind::AllReduce;
                out.push(step(
                    On::Leaders,
                    k,
                    Reads::Output,
                    0,
                    "the all_reduce among one rank per GPU",
                ));
            }
            let k = OpKind::Broadcast { root: 0 };
            out.push(step(
                On::Local,
                k,
                Reads::Output,
                0,
                "the broadcast on its GPU",
            ));
        }
        OpKind::Broadcast { root } => broadcast(root, 0, &mut out),
        OpKind::AllGather => (0..gpus.len()).for_each(|r| broadcast(r, r, &mut out)),
        _ => {}
    }
    out
}

/// One operation on a split communicator, as its own group.
fn run_on(c: &Comm, op: Op) -> Result<()> {
    let core = c.core()?;
    let bufs = op.validate(c.user_rank(), c.count())?;
    core.execute(&[(op, bufs)], &ApiEvents::new(None, Handle::NONE))
        .inspect_err(|e| c.record_failure(e))
}

/// The state a communicator starts with.
pub(super) fn new_state() -> Mutex<State> {
    Mutex::new(State::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs every rank's plan the way the split communicators would: a
    /// step runs once every member of its communicator has it next (a
    /// mismatch or a deadlock fails), reading each rank's input (one
    /// value) or output blocks. Returns each rank's output blocks.
    fn simulate(kind: OpKind, gpus: &[usize]) -> Vec<Vec<Option<i64>>> {
        let n = gpus.len();
        let blocks = if matches!(kind, OpKind::AllGather) {
            n
        } else {
            1
        };
        let input: Vec<i64> = (0..n).map(|r| 10 * r as i64 + 7).collect();
        let mut out = vec![vec![None; blocks]; n];
        let mut todo: Vec<std::collections::VecDeque<Step>> =
            (0..n).map(|r| plan(kind, r, gpus).into()).collect();
        let ngpus = gpus.iter().max().unwrap() + 1;
        // Every split communicator: its members in their order.
        let mut comms: Vec<(On, Vec<usize>)> = (0..ngpus)
            .map(|g| (On::Local, (0..n).filter(|&r| gpus[r] == g).collect()))
            .collect();
        let firsts: Vec<usize> = (0..ngpus)
            .map(|g| (0..n).find(|&r| gpus[r] == g).unwrap())
            .collect();
        comms.push((On::Leaders, firsts));
        loop {
            if todo.iter().all(|q| q.is_empty()) {
                return out;
            }
            let ready = comms.iter().find(|(on, m)| {
                m.iter()
                    .all(|&r| todo[r].front().is_some_and(|s| s.on == *on))
            });
            let Some((_, members)) = ready else {
                panic!("{kind:?} on {gpus:?}: no communicator can run: {todo:?}");
            };
            let steps: Vec<Step> = members
                .iter()
                .map(|&r| todo[r].pop_front().unwrap())
                .collect();
            let s = steps[0];
            for t in &steps {
                assert_eq!(
                    (t.kind, t.block),
                    (s.kind, s.block),
                    "{kind:?} on {gpus:?}: members disagree: {steps:?}"
                );
            }
            let src = |i: usize| match steps[i].from {
                Reads::Input => Some(input[members[i]]),
                Reads::Output => out[members[i]][s.block],
            };
            let vals: Vec<Option<i64>> = (0..members.len()).map(src).collect();
            let sum = || {
                vals.iter()
                    .map(|v| v.expect("a step read a value never written"))
                    .sum::<i64>()
            };
            match s.kind {
                OpKind::Reduce { root } => out[members[root]][s.block] = Some(sum()),
                OpKind::AllReduce => {
                    let total = sum();
                    members.iter().for_each(|&r| out[r][s.block] = Some(total));
                }
                OpKind::Broadcast { root } => {
                    let v = vals[root].expect("a broadcast of a value never written");
                    members.iter().for_each(|&r| out[r][s.block] = Some(v));
                }
                other => panic!("unexpected step {other:?}"),
            }
        }
    }

    const LAYOUTS: [&[usize]; 6] = [
        &[0, 1, 0, 1],
        &[0, 0, 1],
        &[0, 1, 1, 1, 0],
        &[0, 1],
        &[0, 1, 2, 0, 1, 2, 2],
        &[0, 0, 0, 1],
    ];

    #[test]
    fn steps_of_every_layout_give_the_collectives_results() {
        for gpus in LAYOUTS {
            let n = gpus.len();
            let input = |r: usize| 10 * r as i64 + 7;
            let total: i64 = (0..n).map(input).sum();
            let ar = simulate(OpKind::AllReduce, gpus);
            assert!(
                ar.iter().all(|o| o[0] == Some(total)),
                "all_reduce on {gpus:?}: {ar:?}"
            );
            for root in 0..n {
                let b = simulate(OpKind::Broadcast { root }, gpus);
                assert!(
                    b.iter().all(|o| o[0] == Some(input(root))),
                    "broadcast from {root} on {gpus:?}: {b:?}"
                );
            }
            let ag = simulate(OpKind::AllGather, gpus);
            let want: Vec<Option<i64>> = (0..n).map(|r| Some(input(r))).collect();
            assert!(
                ag.iter().all(|o| *o == want),
                "all_gather on {gpus:?}: {ag:?}"
            );
        }
    }

    #[test]
    fn only_leaders_have_steps_among_one_rank_per_gpu() {
        let gpus = [0, 1, 0, 1, 1];
        for me in 0..gpus.len() {
            let leader = me < 2;
            for kind in [
                OpKind::AllReduce,
                OpKind::Broadcast { root: 4 },
                OpKind::AllGather,
            ] {
                let among = plan(kind, me, &gpus).iter().any(|s| s.on == On::Leaders);
                assert_eq!(among, leader, "rank {me}, {kind:?}");
            }
        }
    }
}
