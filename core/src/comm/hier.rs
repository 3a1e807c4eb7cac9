//! Collectives on device buffers where ranks of several processes share a
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
//! The steps run on the caller's stream one after the other. The two
//! communicators are split from this one while it is made (and again at a
//! resume), before any operation, and live as long as it does; a suspend
//! lets them go, a revoke ends their work. Send/recv between ranks of one
//! GPU go through that GPU's communicator too, so both ends of every
//! message must know the split is there: splitting at the first
//! collective instead let a send grouped with that collective and its
//! receive issued after it take different ways, and hang. The other
//! collectives take the same communicators (see [`plan`]): a broadcast on
//! the root's GPU, among one rank per GPU, then on each other GPU; an
//! all-gather one such broadcast per rank; a reduce (to a GPU's first
//! rank) and a reduce-scatter reduce on each GPU and among one rank per
//! GPU, the latter into the first rank's scratch, which sends each rank its
//! block (the first rank's stream pushes it, see the shared-GPU path's
//! `server`). Reductions split only for sum, product,
//! min and max (an average or a pre-multiplied sum of partial results
//! would differ from NCCL's); send/recv between ranks of different GPUs,
//! a reduce to another rank, and groups holding a collective that does not
//! split, run as before; so do layouts where a process holds several ranks
//! (see `mixed_groups` in the device window).
//! OXCCL_HIER=0 turns it off. Profiler events of the steps are the split
//! communicators' own.

use std::sync::{Arc, Mutex};

use tracing::info;

use crate::cuda::DeviceBuffer;
use crate::dtype::RedOp;
use crate::error::{Error, Result};
use crate::mem::OpBuffers;
use crate::op::{Op, OpKind};
use crate::plugin::profiler::{ApiEvents, Handle};

use super::core::Core;
use super::on_device::GpuPath;
use super::on_device::{lock, stream};
use super::{Comm, CommConfig, SPLIT_NOCOLOR};

/// A communicator's split communicators, once asked for.
#[derive(Default)]
pub(super) enum State {
    /// Not decided yet: the communicator is being made or resumed.
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
    /// Each parent rank's GPU, numbered in the order of the GPUs' first
    /// ranks: GPU g's first rank is rank g of `leaders`.
    gpus: Vec<usize>,
    /// A GPU's first rank's partial results of reduce and reduce_scatter
    /// (grown to the largest so far).
    scratch: Mutex<Option<DeviceBuffer>>,
}

impl Hier {
    /// The parent's ranks on `me`'s GPU.
    fn on_my_gpu(&self, me: usize) -> Vec<usize> {
        (0..self.gpus.len())
            .filter(|&r| self.gpus[r] == self.gpus[me])
            .collect()
    }

    /// The address of this rank's scratch of at least `bytes`, grown (the
    /// context synchronized first: queued steps may still use the old one).
    fn scratch(&self, gpu: &GpuPath, bytes: usize) -> Result<u64> {
        let mut sc = self
            .scratch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(b) = sc.as_ref().filter(|b| b.len() >= bytes) {
            return Ok(b.ptr());
        }
        let ctx = lock(gpu)?.context().clone();
        if sc.is_some() {
            ctx.synchronize()?;
            *sc = None;
        }
        let b = DeviceBuffer::alloc(&ctx, bytes)?;
        let p = b.ptr();
        *sc = Some(b);
        Ok(p)
    }

    /// Ends both (a destroy or an abort of the parent).
    fn end(&self, abort: bool) {
        for c in std::iter::once(&self.local).chain(&self.leaders) {
            if abort {
                c.abort();
            } else {
                let _ = c.destroy();
            }
        }
        if abort {
            // As an aborted communicator keeps its device memory: freeing
            // it would wait for a kernel that may never end.
            let mut sc = self
                .scratch
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            std::mem::forget(sc.take());
        }
    }
}

/// Whether `op` may run in steps.
fn splits(op: &Op) -> bool {
    op.count > 0
        && match op.kind {
            OpKind::AllReduce | OpKind::Reduce { .. } | OpKind::ReduceScatter => {
                matches!(op.redop, RedOp::Sum | RedOp::Prod | RedOp::Max | RedOp::Min)
            }
            OpKind::Broadcast { .. } | OpKind::AllGather => true,
            _ => false,
        }
}

fn wanted() -> Result<bool> {
    crate::config::ox::hier()
}

impl Comm {
    /// Runs one group's operations of this communicator: its collectives
    /// in steps where the layout calls for it (see the module) and every
    /// collective of the group allows it, then the point-to-point messages
    /// as one group.
    pub(crate) fn execute_group(
        &self,
        core: &Core,
        ops: &[(Op, OpBuffers)],
        api: &ApiEvents,
    ) -> Result<()> {
        if let Some(r) = self.through_collnet(core, ops) {
            return r;
        }
        let colls = || ops.iter().filter(|(op, _)| op.kind.coll().is_some());
        let (Some(gpu), Some(hier)) = (&core.device, self.hier()) else {
            return core.execute(ops, api);
        };
        if colls().next().is_none() {
            return self.p2p_in_parts(core, &hier, ops, (0..ops.len()).collect(), api);
        }
        // Each rank's collectives are the same, so every rank decides alike;
        // point-to-point messages may differ between ranks and decide nothing.
        if !colls().all(|(op, _)| splits(op)) {
            return core.execute(ops, api);
        }
        let me = self.user_rank();
        let plans: Option<Vec<(&Op, Vec<Step>)>> = colls()
            .map(|(op, _)| Some((op, plan(op.kind, me, &hier.gpus)?)))
            .collect();
        let Some(plans) = plans else {
            return core.execute(ops, api);
        };
        for (op, steps) in plans {
            self.in_steps(gpu, &hier, op, steps)?;
        }
        // The point-to-point messages keep their own API events (`api`
        // numbers the group's operations, collectives included).
        let p2p: Vec<usize> = (0..ops.len())
            .filter(|&i| ops[i].0.kind.coll().is_none())
            .collect();
        if p2p.is_empty() {
            return Ok(());
        }
        self.p2p_in_parts(core, &hier, ops, p2p, api)
    }

    /// Runs the point-to-point messages `idx` of a group: those between
    /// ranks of one GPU go through that GPU's communicator (the shared-GPU
    /// path: no process switch where the GPU's first rank sends or
    /// receives), before the rest, which run on every rank's kernels. Every
    /// rank of the group runs its GPU's part first, whose messages need no
    /// other part, so the order adds no wait. Both ends of a message decide
    /// alike: the split communicators exist from the communicator's
    /// creation (and its resume) on, on every rank or on none.
    fn p2p_in_parts(
        &self,
        core: &Core,
        h: &Hier,
        ops: &[(Op, OpBuffers)],
        idx: Vec<usize>,
        api: &ApiEvents,
    ) -> Result<()> {
        let me = self.user_rank();
        let (mut on_gpu, mut flat) = (Vec::new(), Vec::new());
        for i in idx {
            match local_op(&h.gpus, me, &ops[i].0) {
                Some(op) => on_gpu.push(op),
                None => flat.push(i),
            }
        }
        if !on_gpu.is_empty() {
            let c = &h.local;
            let with_bufs = on_gpu
                .into_iter()
                .map(|op| Ok((op, op.validate(c.user_rank(), c.count())?)))
                .collect::<Result<Vec<_>>>()?;
            c.core()?
                .execute(&with_bufs, &ApiEvents::new(None, Handle::NONE))
                .inspect_err(|e| c.record_failure(e))
                .map_err(|e| {
                    e.context(format!(
                        "rank {me}: send/recv between ranks of its GPU ({:?})",
                        h.on_my_gpu(me)
                    ))
                })?;
        }
        if flat.is_empty() {
            return Ok(());
        }
        let rest: Vec<(Op, OpBuffers)> = flat.iter().map(|&i| ops[i]).collect();
        core.execute(&rest, &api.of(flat))
    }

    /// The split communicators, where the layout called for them when this
    /// communicator was made (or last resumed).
    fn hier(&self) -> Option<Arc<Hier>> {
        match &*self
            .shared
            .hier
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            State::Yes(h) => Some(h.clone()),
            _ => None,
        }
    }

    /// Runs `op` in `steps` (this rank's [`plan`] for it).
    fn in_steps(&self, gpu: &GpuPath, h: &Hier, op: &Op, steps: Vec<Step>) -> Result<()> {
        let me = self.user_rank();
        let n = h.gpus.len();
        let block = op.count * op.dtype.size();
        let need = steps
            .iter()
            .flat_map(|s| [s.from, s.to].map(|at| (at, s.whole)))
            .filter(|((buf, _), _)| *buf == Buf::Scratch)
            .map(|((_, b), whole)| (b + if whole { n } else { 1 }) * block)
            .max();
        let scratch = match need {
            Some(bytes) => h.scratch(gpu, bytes)?,
            None => 0,
        };
        let at = |(buf, b): (Buf, usize)| -> u64 {
            let base = match buf {
                Buf::Input => op.input as u64,
                Buf::Output => op.output as u64,
                Buf::Scratch => scratch,
            };
            base.wrapping_add((b * block) as u64)
        };
        for s in steps {
            let count = if s.whole { n * op.count } else { op.count };
            let (from, to) = (at(s.from), at(s.to));
            let (c, kind) = match s.act {
                Act::Copy => {
                    let bytes = count * op.dtype.size();
                    lock(gpu)?.copy(to, from, bytes, stream(op))?;
                    continue;
                }
                Act::On(On::Local, kind) => (&h.local, kind),
                Act::On(On::Leaders, kind) => {
                    let l = h.leaders.as_ref().ok_or_else(|| {
                        Error::Internal(format!(
                            "rank {me} has a step among one rank per GPU but is not one"
                        ))
                    })?;
                    (l, kind)
                }
            };
            let o = Op {
                kind,
                input: from as *const u8,
                output: to as *mut u8,
                count,
                ..*op
            };
            run_on(c, o).map_err(|e| {
                e.context(format!(
                    "rank {me}: {} of a {} of {} x {} in steps (this rank's GPU: ranks {:?})",
                    s.what,
                    op.kind.name(),
                    op.count,
                    op.dtype.name(),
                    h.on_my_gpu(me)
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

/// What a step does: an operation on a split communicator (roots and
/// peers numbered there), or a copy on this rank's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    On(On, OpKind),
    Copy,
}

/// A buffer of the rank's: the operation's input and output, and the
/// scratch a GPU's first rank keeps partial results in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Buf {
    Input,
    Output,
    Scratch,
}

/// One step of a rank's part of an operation in steps: what, reading and
/// writing which buffer at which block (of the operation's count), on
/// `whole` blocks (one per rank: reduce_scatter's input) or one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Step {
    act: Act,
    from: (Buf, usize),
    to: (Buf, usize),
    whole: bool,
    what: &'static str,
}

/// Rank `me`'s steps for `kind` (all_reduce, broadcast, reduce,
/// all_gather or reduce_scatter), where rank r is on GPU `gpus[r]`, GPUs
/// numbered in the order of their first ranks (GPU g's first rank is rank
/// g among one rank per GPU); `None` where `kind` does not run in steps.
/// Every member of a split communicator gets the same collectives on it in
/// the same order, and each send a matching receive. Only first ranks of
/// GPUs copy on their own streams (any other rank's kernel would wait for
/// the GPU to switch processes); reduce_scatter ends in sends from the
/// first rank, which each other rank's receive pulls.
///
/// A reduce runs in steps only where its root is first on its GPU: else
/// the result would reach the root the same way, and the root's pull, a
/// kernel of its process, waits for the GPU to switch processes (tried:
/// 187-935 us against every rank's kernels' 46-76 us at 8 B-32 KiB, 11
/// against 44-51 GB/s at 2 MiB, 4 processes on 2 H200).
fn plan(kind: OpKind, me: usize, gpus: &[usize]) -> Option<Vec<Step>> {
    let mine = gpus[me];
    let on_gpu = |g: usize| (0..gpus.len()).filter(move |&r| gpus[r] == g);
    let local: Vec<usize> = on_gpu(mine).collect();
    let leader = local[0] == me;
    let index = |r: usize| local.iter().position(|&x| x == r).unwrap_or(0);
    let step = |act, from, to, whole, what| Step {
        act,
        from,
        to,
        whole,
        what,
    };
    let (input, output, scratch) = ((Buf::Input, 0), (Buf::Output, 0), (Buf::Scratch, 0));
    let local_op = |k| Act::On(On::Local, k);
    let among = |k| Act::On(On::Leaders, k);
    // Steps more than one collective takes.
    let reduce_on_gpu = |to, whole| {
        let k = local_op(OpKind::Reduce { root: 0 });
        step(k, input, to, whole, "the reduce on its GPU")
    };
    let all_reduce_among = |at, whole| {
        let k = among(OpKind::AllReduce);
        step(k, at, at, whole, "the all_reduce among one rank per GPU")
    };
    let broadcast_on_gpu = |at| {
        let k = local_op(OpKind::Broadcast { root: 0 });
        step(k, at, at, false, "the broadcast on its GPU")
    };
    let broadcast = |root: usize, b: usize, out: &mut Vec<Step>| {
        let root_gpu = gpus[root];
        let ob = (Buf::Output, b);
        if mine == root_gpu {
            let k = local_op(OpKind::Broadcast { root: index(root) });
            out.push(step(k, input, ob, false, "the broadcast on the root's GPU"));
        }
        if leader {
            let k = among(OpKind::Broadcast { root: root_gpu });
            out.push(step(
                k,
                ob,
                ob,
                false,
                "the broadcast among one rank per GPU",
            ));
        }
        if mine != root_gpu {
            out.push(broadcast_on_gpu(ob));
        }
    };
    let mut out = Vec::new();
    match kind {
        OpKind::AllReduce => {
            out.push(reduce_on_gpu(output, false));
            if leader {
                out.push(all_reduce_among(output, false));
            }
            out.push(broadcast_on_gpu(output));
        }
        OpKind::Broadcast { root } => broadcast(root, 0, &mut out),
        OpKind::AllGather => (0..gpus.len()).for_each(|r| broadcast(r, r, &mut out)),
        OpKind::Reduce { root } => {
            let root_gpu = gpus[root];
            if on_gpu(root_gpu).next() != Some(root) {
                return None;
            }
            // The root gets the result; other first ranks keep their GPU's
            // part in scratch; the rest only contribute.
            let partial = if me == root || !leader {
                output
            } else {
                scratch
            };
            out.push(reduce_on_gpu(partial, false));
            if leader {
                let k = among(OpKind::Reduce { root: root_gpu });
                let what = "the reduce among one rank per GPU";
                out.push(step(k, partial, partial, false, what));
            }
        }
        OpKind::ReduceScatter => {
            let partial = if leader { scratch } else { output };
            out.push(reduce_on_gpu(partial, true));
            if leader {
                out.push(all_reduce_among(scratch, true));
                out.push(step(
                    Act::Copy,
                    (Buf::Scratch, me),
                    output,
                    false,
                    "the copy of its block",
                ));
                for (j, &r) in local.iter().enumerate().skip(1) {
                    let k = local_op(OpKind::Send { peer: j });
                    let b = (Buf::Scratch, r);
                    out.push(step(
                        k,
                        b,
                        b,
                        false,
                        "the send of a block to a rank of its GPU",
                    ));
                }
            } else {
                let k = local_op(OpKind::Recv { peer: 0 });
                out.push(step(
                    k,
                    output,
                    output,
                    false,
                    "the receive of its block from its GPU's first rank",
                ));
            }
        }
        OpKind::Send { .. } | OpKind::Recv { .. } => return None,
    }
    Some(out)
}

/// One operation on a split communicator, as its own group.
fn run_on(c: &Comm, op: Op) -> Result<()> {
    let core = c.core()?;
    let bufs = op.validate(c.user_rank(), c.count())?;
    core.execute(&[(op, bufs)], &ApiEvents::new(None, Handle::NONE))
        .inspect_err(|e| c.record_failure(e))
}

/// The split communicators of a communicator made (or resumed) on `core`,
/// whose rank `me` is, where ranks of several processes share its GPUs:
/// every rank calls this at the same point of its creation or resume, so
/// that all of them agree from the first operation on (a send and its
/// receive take the same way, see `p2p_in_parts`).
pub(super) fn made(core: &Arc<Core>, me: usize) -> Result<State> {
    let gpus = match &core.device {
        Some(gpu) if wanted()? => lock(gpu)?.mixed_gpus().map(<[usize]>::to_vec),
        _ => None,
    };
    let Some(gpus) = gpus else {
        return Ok(State::No);
    };
    let mine = gpus[me];
    let leader = gpus.iter().position(|&g| g == mine) == Some(me);
    let cfg = CommConfig::default();
    let key = me as i32;
    let local = Comm::split_core(core, me, false, mine as i32, key, &cfg)?
        .ok_or_else(|| Error::Internal("no communicator for this rank's GPU".into()))?;
    let leaders = Comm::split_core(
        core,
        me,
        false,
        if leader { 0 } else { SPLIT_NOCOLOR },
        key,
        &cfg,
    )?;
    let h = Arc::new(Hier {
        local,
        leaders,
        gpus,
        scratch: Mutex::new(None),
    });
    let ngpus = h.gpus.iter().max().map_or(0, |g| g + 1);
    info!(target: "oxccl::init", "rank {me}: ranks of several processes share GPUs of this {}-rank communicator over {ngpus} GPUs: all_reduce runs as a reduce on each GPU's ranks (this rank's: {:?}, shared-GPU path), an all_reduce among one rank per GPU, and a broadcast on each GPU; broadcast as one on the root's GPU, one among one rank per GPU and one on each other GPU, all_gather as a broadcast per rank, reduce (to a GPU's first rank) and reduce_scatter as reduces on each GPU and among one rank per GPU, reduce_scatter's blocks sent on by each GPU's first rank; send/recv between ranks of one GPU through its GPU's communicator, the others on every rank's kernels (OXCCL_HIER=0: every rank's ring kernels, each step waiting for the GPU to switch processes)", h.gpus.len(), h.on_my_gpu(me));
    Ok(State::Yes(h))
}

/// `op`, a send or receive of `me` whose peer shares `me`'s GPU, as that
/// GPU's communicator numbers the peer (its ranks in this one's order);
/// `None` for anything else.
fn local_op(gpus: &[usize], me: usize, op: &Op) -> Option<Op> {
    let (peer, send) = match op.kind {
        OpKind::Send { peer } => (peer, true),
        OpKind::Recv { peer } => (peer, false),
        _ => return None,
    };
    let mine = *gpus.get(me)?;
    if *gpus.get(peer)? != mine {
        return None;
    }
    let peer = gpus[..peer].iter().filter(|&&g| g == mine).count();
    let kind = if send {
        OpKind::Send { peer }
    } else {
        OpKind::Recv { peer }
    };
    Some(Op { kind, ..*op })
}

/// The state a communicator starts with.
pub(super) fn new_state() -> Mutex<State> {
    Mutex::new(State::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, VecDeque};

    /// A rank's buffers in the simulation: element blocks by (buffer, block).
    type Mem = HashMap<(Buf, usize), i64>;

    /// Runs every rank's plan as the split communicators would: a
    /// collective once every member of its communicator has it next, a
    /// send with the receive its peer has next, a copy at once (a mismatch
    /// or a deadlock fails). Rank r's input block b holds 100 r + b + 7.
    /// Returns each rank's buffers.
    fn simulate(kind: OpKind, gpus: &[usize]) -> Vec<Mem> {
        let n = gpus.len();
        let mut mem: Vec<Mem> = (0..n)
            .map(|r| {
                (0..n)
                    .map(|b| ((Buf::Input, b), 100 * r as i64 + b as i64 + 7))
                    .collect()
            })
            .collect();
        let mut todo: Vec<VecDeque<Step>> = (0..n)
            .map(|r| {
                plan(kind, r, gpus)
                    .expect("a kind that runs in steps")
                    .into()
            })
            .collect();
        let ngpus = gpus.iter().max().unwrap() + 1;
        let mut comms: Vec<(On, Vec<usize>)> = (0..ngpus)
            .map(|g| (On::Local, (0..n).filter(|&r| gpus[r] == g).collect()))
            .collect();
        let firsts = (0..ngpus).map(|g| (0..n).find(|&r| gpus[r] == g).unwrap());
        comms.push((On::Leaders, firsts.collect()));
        let width = |s: &Step| if s.whole { n } else { 1 };
        let read = |m: &Mem, s: &Step| -> Vec<i64> {
            let (buf, b) = s.from;
            (0..width(s))
                .map(|k| {
                    *m.get(&(buf, b + k))
                        .unwrap_or_else(|| panic!("{s:?} read {buf:?} {} unwritten", b + k))
                })
                .collect()
        };
        let write = |m: &mut Mem, s: &Step, v: &[i64]| {
            let (buf, b) = s.to;
            v.iter().enumerate().for_each(|(k, x)| {
                m.insert((buf, b + k), *x);
            });
        };
        'next: loop {
            if todo.iter().all(VecDeque::is_empty) {
                return mem;
            }
            // Copies, then sends with their receives.
            for r in 0..n {
                if let Some(s) = todo[r].front().copied().filter(|s| s.act == Act::Copy) {
                    let v = read(&mem[r], &s);
                    write(&mut mem[r], &s, &v);
                    todo[r].pop_front();
                    continue 'next;
                }
                let Some(s) = todo[r].front().copied() else {
                    continue;
                };
                let Act::On(On::Local, OpKind::Send { peer }) = s.act else {
                    continue;
                };
                let members: Vec<usize> = (0..n).filter(|&x| gpus[x] == gpus[r]).collect();
                let to = members[peer];
                let me_there = members.iter().position(|&x| x == r).unwrap();
                if let Some(t) = todo[to].front().copied() {
                    if t.act == Act::On(On::Local, OpKind::Recv { peer: me_there }) {
                        assert_eq!(width(&s), width(&t), "{kind:?} on {gpus:?}: {s:?} to {t:?}");
                        let v = read(&mem[r], &s);
                        write(&mut mem[to], &t, &v);
                        todo[r].pop_front();
                        todo[to].pop_front();
                        continue 'next;
                    }
                }
            }
            let ready = comms.iter().find(|(on, m)| {
                m.iter().all(|&r| {
                    todo[r].front().is_some_and(
                        |s| matches!(s.act, Act::On(o, k) if o == *on && k.coll().is_some()),
                    )
                })
            });
            let Some((_, members)) = ready else {
                panic!("{kind:?} on {gpus:?}: nothing can run: {todo:?}");
            };
            let steps: Vec<Step> = members
                .iter()
                .map(|&r| todo[r].pop_front().unwrap())
                .collect();
            let s = steps[0];
            for t in &steps {
                assert_eq!(
                    (t.act, t.whole),
                    (s.act, s.whole),
                    "{kind:?} on {gpus:?}: members disagree: {steps:?}"
                );
            }
            let Act::On(_, k) = s.act else { unreachable!() };
            let vals: Vec<Option<Vec<i64>>> = steps
                .iter()
                .zip(members)
                .map(|(t, &r)| {
                    let used = !matches!(k, OpKind::Broadcast { root } if members[root] != r);
                    used.then(|| read(&mem[r], t))
                })
                .collect();
            let sum = || -> Vec<i64> {
                let all: Vec<&Vec<i64>> = vals.iter().map(|v| v.as_ref().unwrap()).collect();
                (0..all[0].len())
                    .map(|e| all.iter().map(|v| v[e]).sum())
                    .collect()
            };
            match k {
                OpKind::Reduce { root } => write(&mut mem[members[root]], &steps[root], &sum()),
                OpKind::AllReduce => {
                    let v = sum();
                    members
                        .iter()
                        .zip(&steps)
                        .for_each(|(&r, t)| write(&mut mem[r], t, &v));
                }
                OpKind::Broadcast { root } => {
                    let v = vals[root].clone().unwrap();
                    members
                        .iter()
                        .zip(&steps)
                        .for_each(|(&r, t)| write(&mut mem[r], t, &v));
                }
                other => panic!("unexpected collective {other:?}"),
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
    fn sends_between_ranks_of_one_gpu_name_the_peer_as_that_gpus_communicator_does() {
        let gpus = [0, 1, 0, 1, 0];
        let op = |kind| Op {
            kind,
            input: std::ptr::null(),
            output: std::ptr::null_mut(),
            count: 4,
            dtype: crate::dtype::DataType::Float32,
            redop: RedOp::Sum,
            stream: 7,
            user_tag: 0,
            call: Default::default(),
        };
        let local = |me, kind| local_op(&gpus, me, &op(kind)).map(|o| (o.kind, o.count, o.stream));
        // Rank 4 is the third rank of GPU 0; rank 2 the second.
        assert_eq!(
            local(4, OpKind::Send { peer: 2 }),
            Some((OpKind::Send { peer: 1 }, 4, 7))
        );
        assert_eq!(
            local(2, OpKind::Recv { peer: 4 }),
            Some((OpKind::Recv { peer: 2 }, 4, 7))
        );
        assert_eq!(
            local(3, OpKind::Send { peer: 1 }),
            Some((OpKind::Send { peer: 0 }, 4, 7))
        );
        // Itself, on its GPU too.
        assert_eq!(
            local(0, OpKind::Send { peer: 0 }),
            Some((OpKind::Send { peer: 0 }, 4, 7))
        );
        // Another GPU, a peer out of range, or a collective: not local.
        assert_eq!(local(0, OpKind::Send { peer: 1 }), None);
        assert_eq!(local(0, OpKind::Recv { peer: 9 }), None);
        assert_eq!(local(0, OpKind::AllReduce), None);
    }

    #[test]
    fn steps_of_every_layout_give_the_collectives_results() {
        for gpus in LAYOUTS {
            let n = gpus.len();
            let input = |r: usize, b: usize| 100 * r as i64 + b as i64 + 7;
            let total = |b: usize| (0..n).map(|r| input(r, b)).sum::<i64>();
            let out = |m: &Mem, b: usize| m.get(&(Buf::Output, b)).copied();
            let ar = simulate(OpKind::AllReduce, gpus);
            assert!(
                ar.iter().all(|m| out(m, 0) == Some(total(0))),
                "all_reduce on {gpus:?}"
            );
            let rs = simulate(OpKind::ReduceScatter, gpus);
            for (r, m) in rs.iter().enumerate() {
                assert_eq!(
                    out(m, 0),
                    Some(total(r)),
                    "reduce_scatter on {gpus:?}, rank {r}"
                );
            }
            let ag = simulate(OpKind::AllGather, gpus);
            for m in &ag {
                assert!(
                    (0..n).all(|b| out(m, b) == Some(input(b, 0))),
                    "all_gather on {gpus:?}"
                );
            }
            for root in 0..n {
                let b = simulate(OpKind::Broadcast { root }, gpus);
                assert!(
                    b.iter().all(|m| out(m, 0) == Some(input(root, 0))),
                    "broadcast from {root} on {gpus:?}"
                );
                if plan(OpKind::Reduce { root }, 0, gpus).is_none() {
                    continue;
                }
                let red = simulate(OpKind::Reduce { root }, gpus);
                assert_eq!(
                    out(&red[root], 0),
                    Some(total(0)),
                    "reduce to {root} on {gpus:?}"
                );
                // No other rank's output is written: a reduce's non-root
                // receive buffer is not the library's to write (NCCL).
                for (r, m) in red.iter().enumerate().filter(|&(r, _)| r != root) {
                    assert_eq!(
                        out(m, 0),
                        None,
                        "reduce to {root} on {gpus:?} wrote rank {r}'s output"
                    );
                }
            }
        }
    }

    #[test]
    fn only_first_ranks_of_gpus_copy_or_meet_one_rank_per_gpu() {
        let gpus = [0, 1, 0, 1, 1];
        let kinds = [
            OpKind::AllReduce,
            OpKind::Broadcast { root: 4 },
            OpKind::AllGather,
            OpKind::Reduce { root: 1 },
            OpKind::ReduceScatter,
        ];
        for me in 0..gpus.len() {
            let leader = me < 2;
            for kind in kinds {
                let steps = plan(kind, me, &gpus).unwrap();
                let among = steps
                    .iter()
                    .any(|s| s.act == Act::On(On::Leaders, kind_of(s)));
                assert_eq!(among, leader, "rank {me}, {kind:?}");
                let copies = steps.iter().any(|s| s.act == Act::Copy);
                assert!(leader || !copies, "rank {me} copies in {kind:?}");
                let scratch = steps
                    .iter()
                    .any(|s| s.from.0 == Buf::Scratch || s.to.0 == Buf::Scratch);
                assert!(leader || !scratch, "rank {me} needs scratch in {kind:?}");
            }
        }
    }

    #[test]
    fn a_reduce_runs_in_steps_where_its_root_is_first_on_its_gpu() {
        let gpus = [0, 1, 0, 1];
        for me in 0..4 {
            let planned: Vec<bool> = (0..4)
                .map(|root| plan(OpKind::Reduce { root }, me, &gpus).is_some())
                .collect();
            assert_eq!(planned, [true, true, false, false], "rank {me}");
            assert!(plan(OpKind::ReduceScatter, me, &gpus).is_some());
            assert!(plan(OpKind::Send { peer: 1 }, me, &gpus).is_none());
        }
    }

    fn kind_of(s: &Step) -> OpKind {
        match s.act {
            Act::On(_, k) => k,
            Act::Copy => OpKind::AllReduce,
        }
    }
}
