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
            match op.kind {
                OpKind::Broadcast { root } => self.broadcast_in_steps(&hier, op, root)?,
                OpKind::AllGather => self.all_gather_in_steps(&hier, op)?,
                _ => self.all_reduce_in_steps(&hier, op)?,
            }
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

    /// Runs `kind` on `c` with `op`'s output, count and type and `input`;
    /// an error names this rank's part of `op`.
    fn step(
        &self,
        h: &Hier,
        op: &Op,
        c: &Comm,
        kind: OpKind,
        input: *const u8,
        what: &str,
    ) -> Result<()> {
        let o = Op { kind, input, ..*op };
        run_on(c, o).map_err(|e| {
            e.context(format!(
                "rank {}: {what} of a {} of {} x {} in steps (this rank's GPU: ranks {:?})",
                self.user_rank(),
                op.kind.name(),
                op.count,
                op.dtype.name(),
                h.local_ranks
            ))
        })
    }

    /// A broadcast from `root`: on the root's GPU from the root, then
    /// among one rank per GPU from that GPU's first rank, then on each
    /// other GPU from its first rank.
    fn broadcast_in_steps(&self, h: &Hier, op: &Op, root: usize) -> Result<()> {
        let out = op.output as *const u8;
        let root_gpu = h.gpus[root];
        let mine = h.gpus[self.user_rank()];
        if mine == root_gpu {
            let at = h
                .local_ranks
                .iter()
                .position(|&r| r == root)
                .ok_or_else(|| {
                    Error::Internal(format!("rank {root} is not on its own GPU's communicator"))
                })?;
            let kind = OpKind::Broadcast { root: at };
            self.step(
                h,
                op,
                &h.local,
                kind,
                op.input,
                "the broadcast on the root's GPU",
            )?;
        }
        if let Some(l) = &h.leaders {
            let kind = OpKind::Broadcast { root: root_gpu };
            self.step(h, op, l, kind, out, "the broadcast among one rank per GPU")?;
        }
        if mine != root_gpu {
            let kind = OpKind::Broadcast { root: 0 };
            self.step(h, op, &h.local, kind, out, "the broadcast on its GPU")?;
        }
        Ok(())
    }

    /// An all-gather as one broadcast in steps per rank, each into its
    /// block of the output (in place where the input is that block).
    fn all_gather_in_steps(&self, h: &Hier, op: &Op) -> Result<()> {
        let block = op.count * op.dtype.size();
        for root in 0..h.gpus.len() {
            let b = Op {
                kind: OpKind::Broadcast { root },
                output: op.output.wrapping_add(root * block),
                ..*op
            };
            self.broadcast_in_steps(h, &b, root)?;
        }
        Ok(())
    }

    fn all_reduce_in_steps(&self, h: &Hier, op: &Op) -> Result<()> {
        let step = |c: &Comm, kind: OpKind, input: *const u8, what: &str| {
            self.step(h, op, c, kind, input, what)
        };
        let out = op.output as *const u8;
        step(
            &h.local,
            OpKind::Reduce { root: 0 },
            op.input,
            "the reduce on its GPU",
        )?;
        if let Some(l) = &h.leaders {
            step(
                l,
                OpKind::AllReduce,
                out,
                "the all_reduce among one rank per GPU",
            )?;
        }
        step(
            &h.local,
            OpKind::Broadcast { root: 0 },
            out,
            "the broadcast on its GPU",
        )
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
