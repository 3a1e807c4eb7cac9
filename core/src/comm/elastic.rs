//! Communicators that survive failures and change size (NCCL 2.27+):
//! revoke ends the operations in flight and leaves a communicator that only
//! destroy, split and shrink accept; shrink makes a communicator of the
//! survivors alone; grow makes a larger one that new ranks join.
//!
//! A shrink never waits on an excluded rank, which may be dead: the new
//! root runs in the process of the first survivor (new rank 0), which
//! sends its id to each other survivor over the parent's bootstrap, whose
//! messages go straight from rank to rank (no root, no ring through the
//! dead); the new communicator's own bootstrap then joins the survivors
//! only. The failure notices the excluded ranks caused stand in the
//! parent's bootstrap, and the id is received despite them.
//!
//! A grow is an init: one existing rank makes an id (its own root, in its
//! process) and sends it to the other existing ranks over the bootstrap;
//! the application hands it to the new ranks, and all join with their
//! ranks (the existing ones keep theirs).

use std::sync::Arc;

use tracing::info;

use super::{
    split::{bytes_to_id, child_config, Child},
    Comm, CommConfig, Core, InitState, RevokedBy, Status,
};
use crate::bootstrap::UniqueId;
use crate::error::{Error, Result};
use crate::exec::StopReason;

/// NCCL's `shrinkFlags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShrinkMode {
    /// `NCCL_SHRINK_DEFAULT`: the parent's operations are left alone (none
    /// should be running); with `shrink_share`, the new communicator takes
    /// the parent's network context.
    Default,
    /// `NCCL_SHRINK_ABORT`: the parent's operations in flight (hung on a
    /// dead rank, say) are ended first; nothing is shared.
    Abort,
}

/// The color a shrink's hash is derived with: no split can have it.
const SHRINK_COLOR: i32 = -2;

/// Bootstrap tags of grow ids, by the parent's split count (split's ids
/// travel under `TAG_CONN * 2 + n`).
const TAG_GROW: u64 = crate::transport::TAG_CONN * 3;

impl Comm {
    /// Ends this rank's operations in flight on the communicator (NCCL's
    /// `ncclCommRevoke`): each returns an error saying it was revoked, and
    /// later ones are refused. Blocking communicators wait here until none
    /// runs (at most NCCL_TIMEOUT); non-blocking ones return
    /// [`InitState::InProgress`] until then, as [`Comm::async_error`] does.
    /// Then destroy, split and shrink work; finalize is refused. Only this
    /// rank is affected: other ranks learn of it by their own timeouts or
    /// revokes. On a GPU, "running" covers the work enqueued on streams:
    /// its kernels return at their next poll of the stop word (without
    /// trapping: the context stays usable), the net proxy stops, and the
    /// shared-GPU path's stream waits are released (see
    /// [`crate::exec::device::stop`]); the streams then run on.
    pub fn revoke(&self) -> Result<InitState> {
        let core = {
            let mut st = self.shared.status.lock().unwrap_or_else(|p| p.into_inner());
            let core = match &*st {
                Status::Ready(c) | Status::Failed(_, Some(c)) => c.clone(),
                Status::Revoked(..) => {
                    return Err(Error::InvalidUsage(
                        "the communicator is already revoked".into(),
                    ))
                }
                Status::Initializing => {
                    return Err(Error::InvalidUsage(
                        "the communicator is still initializing (non-blocking init): wait until async_error() reports it ready, or abort it".into(),
                    ))
                }
                Status::Failed(e, None) => return Err(e.clone()),
                Status::Destroyed(how) => {
                    return Err(Error::InvalidUsage(format!(
                        "the communicator was {how}"
                    )))
                }
            };
            *st = Status::Revoked(core.clone(), RevokedBy::Call);
            core
        };
        info!(target: "oxccl::init", "comm {:#018x} rank {} nranks {} - Revoke START", core.ident.comm_hash, core.rank, core.nranks);
        core.stop_operations(StopReason::Revoked);
        // What runs in steps runs on split communicators: their work ends
        // with this one's (they go when it is destroyed).
        self.revoke_hier();
        self.revoke_collnet();
        if self.shared.blocking && !core.wait_quiescent(core.cfg.timeout()) {
            return Err(core.still_running());
        }
        let state = self.async_error()?;
        if state == InitState::Ready {
            info!(target: "oxccl::init", "comm {:#018x} rank {} - Revoke COMPLETE", core.ident.comm_hash, core.rank);
        }
        Ok(state)
    }

    /// Waits (up to NCCL_TIMEOUT) until the operations a revoke ended have
    /// ended: what a blocking communicator's revoke does itself.
    pub fn wait_revoked(&self) -> Result<InitState> {
        let st = self.shared.status.lock().unwrap_or_else(|p| p.into_inner());
        let Status::Revoked(core, _) = &*st else {
            return Err(Error::InvalidUsage(
                "wait_revoked on a communicator that was not revoked".into(),
            ));
        };
        let core = core.clone();
        drop(st);
        core.wait_revoked()?;
        Ok(InitState::Ready)
    }

    /// Makes a communicator of every rank but `exclude` (NCCL's
    /// `ncclCommShrink`), numbered in the order of their ranks here. Every
    /// rank outside `exclude` must call it with the same list; the excluded
    /// ones take no part and may be dead. Works on a ready, failed or
    /// revoked communicator; with [`ShrinkMode::Abort`] the operations
    /// still running here are ended first (the parent is then marked failed
    /// if any was). `config` as for [`Comm::split`].
    pub fn shrink(&self, exclude: &[usize], config: &CommConfig, mode: ShrinkMode) -> Result<Comm> {
        let (me, n) = (self.user_rank(), self.count());
        if exclude.is_empty() {
            return Err(Error::InvalidArgument(
                "excludeRanksList is empty: a shrink excludes at least one rank".into(),
            ));
        }
        if let Some(bad) = exclude.iter().find(|&&r| r >= n) {
            return Err(Error::InvalidArgument(format!(
                "excludeRanksList names rank {bad}, but the communicator has {n} ranks"
            )));
        }
        if exclude.contains(&me) {
            return Err(Error::InvalidArgument(format!(
                "excludeRanksList names rank {me}, the caller: excluded ranks do not call shrink"
            )));
        }
        let (core, revoked, failed) = {
            let st = self.shared.status.lock().unwrap_or_else(|p| p.into_inner());
            match &*st {
                Status::Ready(c) => (c.clone(), false, false),
                Status::Failed(_, Some(c)) => (c.clone(), false, true),
                Status::Revoked(c, _) => (c.clone(), true, false),
                _ => {
                    drop(st);
                    return Err(self.core().err().unwrap_or_else(|| {
                        Error::Internal("shrink: no communicator to shrink".into())
                    }));
                }
            }
        };
        if revoked {
            core.wait_revoked()?;
        } else if mode == ShrinkMode::Abort {
            self.end_parent_operations(&core)?;
        }
        let members: Vec<usize> = (0..n).filter(|r| !exclude.contains(r)).collect();
        let split_no = core.next_split();
        info!(target: "oxccl::init",
            "comm {:#018x} rank {me} nranks {n} - Shrink START ({mode:?}): excluding ranks {exclude:?}, {} remain",
            core.ident.comm_hash, members.len());
        let child = Child {
            members: &members,
            split_no,
            hash: super::ident::split_hash(core.ident.comm_hash, split_no, SHRINK_COLOR),
            share: core.shrink_share && mode == ShrinkMode::Default && !revoked && !failed,
            despite_failures: true,
        };
        let made = Comm::make_child(&core, self.user_rank(), child, config)?;
        if failed {
            self.settle_failed_parent(core);
        }
        Ok(made)
    }

    /// After a shrink has left a failed communicator behind, it counts as
    /// revoked: its failure is handled (the survivors agreed on the ranks
    /// to drop), its operations stay refused, and its asynchronous error
    /// reads success again, which is what NCCL's parent reads after losing
    /// a peer that only hung its kernels (NCCL does not mark it) and what
    /// PyTorch's shrink_group checks on the parent after the shrink.
    fn settle_failed_parent(&self, core: Arc<Core>) {
        let mut st = self.shared.status.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(&*st, Status::Failed(_, Some(_))) {
            info!(target: "oxccl::init",
                "comm {:#018x} rank {} - the failed communicator is shrunk: it now counts as revoked (operations refused, async error ncclSuccess, finalize a no-op); destroy it",
                core.ident.comm_hash, core.rank);
            *st = Status::Revoked(core, RevokedBy::Shrink);
        }
    }

    /// Makes the id of a grow of this communicator (NCCL's
    /// `ncclCommGetUniqueId`): starts its root in this process and sends
    /// it to every other rank of the communicator, whose [`Comm::grow`]
    /// (given `None`) receives it; this rank passes it to its own grow,
    /// and the application hands it to the new ranks, which join with
    /// [`Comm::init_rank`]. As NCCL's: no other id may be made here before
    /// a grow used this one, and a grow uses an id once.
    pub fn grow_id(&self) -> Result<UniqueId> {
        let core = self.core()?;
        let mut ids = core
            .grow_ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if ids.pending.is_some() {
            return Err(Error::InvalidUsage(
                "the id this rank made for a grow is not used yet: grow with it first (each id serves one grow, and one is made at a time)".into(),
            ));
        }
        let id = crate::bootstrap::start_root(&core.cfg)?;
        // The number the grow itself takes from the count, on every rank.
        let tag = TAG_GROW + core.peek_split();
        for r in (0..self.count()).filter(|&r| r != self.user_rank()) {
            core.bootstrap.send(r, tag, &id.0)?;
        }
        ids.pending = Some(id);
        Ok(id)
    }

    /// This rank's place in a grown communicator of `nranks` ranks (NCCL's
    /// `ncclCommGrow` on an existing rank): every rank of this
    /// communicator calls it, keeping its rank; the one that called
    /// [`Comm::grow_id`] passes that id, the others `None` (they receive
    /// it). New ranks join with [`Comm::init_rank`]`(nranks, id, rank)`,
    /// taking the ranks from `count()` up. `config` as for [`Comm::split`].
    pub fn grow(&self, nranks: usize, id: Option<UniqueId>, config: &CommConfig) -> Result<Comm> {
        if nranks <= self.count() {
            return Err(Error::InvalidArgument(format!(
                "nRanks {nranks} does not grow a communicator of {} ranks",
                self.count()
            )));
        }
        let core = self.core()?;
        let mut ids = core
            .grow_ids
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let id = match id {
            Some(id) if ids.pending == Some(id) => {
                ids.pending = None;
                ids.used.push(id);
                id
            }
            Some(id) if ids.used.contains(&id) => {
                return Err(Error::InvalidArgument(
                    "this grow id was used by an earlier grow: each id serves one (make another with grow_id)".into(),
                ))
            }
            Some(_) => {
                return Err(Error::InvalidArgument(
                    "this rank did not make this id with grow_id: the rank that did passes it, the other existing ranks pass none".into(),
                ))
            }
            None if ids.pending.is_some() => {
                return Err(Error::InvalidArgument(
                    "this rank made the grow id (grow_id): pass it to grow".into(),
                ))
            }
            None => {
                drop(ids);
                let (from, bytes) = core.bootstrap.recv_any(TAG_GROW + core.peek_split())?;
                info!(target: "oxccl::init", "rank {}: grow id from rank {from}", self.user_rank());
                bytes_to_id(&bytes)?
            }
        };
        // Counted only by grows that go ahead, alike on every rank (a
        // refused call above leaves the count as it was).
        core.next_split();
        info!(target: "oxccl::init",
            "comm {:#018x} rank {} nranks {} - Grow START: to {nranks} ranks",
            core.ident.comm_hash, self.user_rank(), self.count());
        Comm::init_rank(nranks, id, self.user_rank(), &child_config(&core, config))
    }

    /// Suspends the communicator (NCCL's `ncclCommSuspend` with
    /// `NCCL_SUSPEND_MEM`): every rank calls it (a barrier, as in NCCL);
    /// operations are then refused until [`Comm::resume`]. On a GPU, once
    /// this rank's streams have passed its work (within NCCL_TIMEOUT), the
    /// device memory a resume can rebuild is released: the P2P peers' FIFO
    /// slots (the bulk of the device window), the shared-GPU path's flag
    /// words, and the mappings of peers' memory (see
    /// [`MemStats`](super::MemStats); what is kept, as NCCL keeps its
    /// persistent memory, is said at `Window::suspend`). On host memory
    /// there is none. A suspend or resume that fails half way leaves the
    /// communicator failed: destroy it (or shrink it).
    pub fn suspend(&self) -> Result<()> {
        self.set_suspended(true)
    }

    /// Ends a suspend (NCCL's `ncclCommResume`); every rank calls it. On a
    /// GPU the released memory is allocated and exchanged again as at
    /// creation, and the next operation runs as if there had been no
    /// suspend.
    pub fn resume(&self) -> Result<()> {
        self.set_suspended(false)
    }

    /// Suspends or resumes, refusing a call that changes nothing before
    /// any barrier (so that every rank's barriers match).
    fn set_suspended(&self, on: bool) -> Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        let core = self.core()?;
        if core.suspended.load(SeqCst) == on {
            return Err(Error::InvalidUsage(format!(
                "the communicator is {} suspended",
                if on { "already" } else { "not" }
            )));
        }
        let call = if on {
            "ncclCommSuspend"
        } else {
            "ncclCommResume"
        };
        if on {
            // Their memory goes too; split again after the resume.
            self.let_hier_go(false, true);
        }
        let what = match &core.device {
            None => {
                core.bootstrap.barrier()?;
                core.suspended.store(on, SeqCst);
                if on {
                    "suspended (no GPU memory to release on host memory)".to_string()
                } else {
                    "resumed".to_string()
                }
            }
            Some(gpu) if on => {
                // Refused from here: no operation may start while the
                // window goes.
                core.suspended.store(true, SeqCst);
                let bytes = super::on_device::suspend(gpu, &core.bootstrap, core.cfg.timeout())
                    .map_err(|e| self.failed_midway(call, e))?;
                format!(
                    "suspended: {bytes} bytes ({} MiB) of GPU memory released",
                    bytes >> 20
                )
            }
            Some(gpu) => {
                super::on_device::resume(gpu, &core.bootstrap)
                    .map_err(|e| self.failed_midway(call, e))?;
                // Split again before the first operation, as at creation.
                let split = super::hier::made(&core, self.user_rank())
                    .map_err(|e| self.failed_midway(call, e))?;
                *self.shared.hier.lock().unwrap_or_else(|p| p.into_inner()) = split;
                core.suspended.store(false, SeqCst);
                "resumed: device window allocated and exchanged again".to_string()
            }
        };
        info!(target: "oxccl::init", "{call}: rank {} {what}", core.rank);
        Ok(())
    }

    /// A GPU suspend or resume that failed: its peers' barriers fail too
    /// (within NCCL_TIMEOUT), and the window may be half released, so the
    /// communicator is failed, saying so; destroy and shrink still work.
    fn failed_midway(&self, call: &str, e: Error) -> Error {
        let e = e.context(format!(
            "{call} did not complete on rank {}: the communicator is failed (its device memory may be half released or rebuilt); destroy it",
            self.user_rank()
        ));
        let mut st = self.shared.status.lock().unwrap_or_else(|p| p.into_inner());
        if let Status::Ready(c) = &*st {
            *st = Status::Failed(e.clone(), Some(c.clone()));
        }
        e
    }

    /// `NCCL_SHRINK_ABORT`'s first step: ends what runs on the parent,
    /// then lets its bootstrap serve the shrink. A parent that had an
    /// operation cut short is marked failed: its connections may hold the
    /// rest of that operation's messages.
    /// On a GPU the device's work is ended only where some runs: a parent
    /// whose streams are idle keeps its kernels' state (and stays usable).
    fn end_parent_operations(&self, core: &Arc<Core>) -> Result<()> {
        // Counted before the stop: an operation it ends may be gone by the
        // time a later look would see it (this raced and lost on CI).
        let mut cut = !core.quiescent();
        core.stop_host(StopReason::ShrinkAbort);
        // And after it, for a call that began before the stop and is still
        // enqueueing, or enqueued work that has not run yet.
        cut |= !core.quiescent() || !core.device_idle();
        if cut {
            core.stop_device();
        }
        let ended = core.wait_quiescent(core.cfg.timeout());
        core.bootstrap.resume();
        core.stop.clear();
        if !ended {
            return Err(core.still_running());
        }
        if cut {
            let mut st = self.shared.status.lock().unwrap_or_else(|p| p.into_inner());
            if let Status::Ready(c) = &*st {
                *st = Status::Failed(
                    Error::InvalidUsage(
                        "operations of this communicator were ended by a shrink with NCCL_SHRINK_ABORT: destroy it and use the shrunk one".into(),
                    ),
                    Some(c.clone()),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::dtype::{DataType, RedOp};

    /// How long a test waits for something it expects soon.
    const SOON: Duration = Duration::from_secs(10);

    fn cfg() -> CommConfig {
        CommConfig::default()
            .with("SOCKET_IFNAME", "lo")
            .with("TIMEOUT", "30")
    }

    fn floats(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn to_floats(b: &[u8]) -> Vec<f32> {
        b.chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// An in-place float sum over `comms` (one thread each), each rank's
    /// input from `input`; every rank's result.
    fn sum_each(comms: &[Comm], input: impl Fn(&Comm) -> Vec<f32> + Sync) -> Vec<Vec<f32>> {
        std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|k| {
                    let input = &input;
                    s.spawn(move || {
                        let mut b = floats(&input(k));
                        k.all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
                            .unwrap();
                        to_floats(&b)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// An all-reduce that rank 1 never joins: rank 0's revoke ends it at
    /// once with an error naming the revoke, the communicator reads ready
    /// again, operations and finalize are refused, and once rank 1 revokes
    /// too, a split of the two works and its all-reduce is right.
    #[test]
    fn revoke_ends_a_hung_operation_then_split_works() {
        let comms = Comm::init_all(2, &cfg()).unwrap();
        let c0 = comms[0].clone();
        let hung = std::thread::spawn(move || {
            let mut b = floats(&[1.0; 1024]);
            c0.all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
        });
        std::thread::sleep(Duration::from_millis(200));
        let t = std::time::Instant::now();
        assert_eq!(comms[0].revoke().unwrap(), InitState::Ready);
        let e = hung.join().unwrap().unwrap_err().to_string();
        assert!(t.elapsed() < SOON, "revoke took {:?}", t.elapsed());
        assert!(e.contains("revoked"), "{e}");
        assert_eq!(comms[0].async_error().unwrap(), InitState::Ready);
        let mut b = floats(&[1.0; 4]);
        let e = comms[0]
            .all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
            .unwrap_err()
            .to_string();
        assert!(e.contains("revoked"), "{e}");
        let e = comms[0].finalize().unwrap_err().to_string();
        assert!(e.contains("finalize after revoke"), "{e}");
        assert!(comms[0]
            .revoke()
            .unwrap_err()
            .to_string()
            .contains("already revoked"));
        assert_eq!(comms[1].revoke().unwrap(), InitState::Ready);
        let kids: Vec<Comm> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| s.spawn(move || c.split(0, 0, &cfg()).unwrap().unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let sums = sum_each(&kids, |k| vec![k.user_rank() as f32 + 1.0, 2.0]);
        assert!(sums.iter().all(|v| v == &[3.0, 4.0]), "{sums:?}");
        for c in kids.iter().chain(&comms) {
            c.destroy().unwrap();
        }
    }

    /// A non-blocking communicator's revoke reports in-progress while an
    /// operation it ended is still on its way out, then ready.
    #[test]
    fn non_blocking_revoke_polls_to_ready() {
        let nb = CommConfig {
            blocking: false,
            ..cfg()
        };
        let id = crate::bootstrap::get_unique_id(&nb.resolve().unwrap()).unwrap();
        let comms: Vec<Comm> = (0..2)
            .map(|r| Comm::init_rank(2, id, r, &nb).unwrap())
            .collect();
        for c in &comms {
            c.wait_ready(SOON).unwrap();
        }
        let state = comms[0].revoke().unwrap();
        assert!(
            matches!(state, InitState::Ready | InitState::InProgress),
            "{state:?}"
        );
        let t = std::time::Instant::now();
        while comms[0].async_error().unwrap() != InitState::Ready {
            assert!(t.elapsed() < SOON);
            std::thread::sleep(Duration::from_millis(1));
        }
        for c in &comms {
            c.destroy().unwrap();
        }
    }

    /// Arguments are checked before anything is sent.
    #[test]
    fn shrink_refuses_bad_exclude_lists() {
        let comms = Comm::init_all(1, &cfg()).unwrap();
        let c = &comms[0];
        let d = ShrinkMode::Default;
        let e = |x: &[usize]| c.shrink(x, &cfg(), d).unwrap_err().to_string();
        assert!(e(&[]).contains("empty"));
        assert!(e(&[3]).contains("rank 3"));
        assert!(e(&[0]).contains("the caller"));
        c.destroy().unwrap();
    }

    /// Three ranks drop the middle one, which is alive but takes no part:
    /// the survivors become ranks 0 and 1 in the order of their old ranks,
    /// with a hash of their own, and all-reduce among themselves; both
    /// modes, the second from a shrunk communicator.
    #[test]
    fn shrink_renumbers_the_survivors() {
        let comms = Comm::init_all(3, &cfg()).unwrap();
        let survivors = [&comms[0], &comms[2]];
        for mode in [ShrinkMode::Default, ShrinkMode::Abort] {
            let kids: Vec<Comm> = std::thread::scope(|s| {
                let hs: Vec<_> = survivors
                    .iter()
                    .map(|c| s.spawn(move || c.shrink(&[1], &cfg(), mode).unwrap()))
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(kids[0].user_rank(), 0);
            assert_eq!(kids[1].user_rank(), 1);
            assert!(kids.iter().all(|k| k.count() == 2));
            let h = |c: &Comm| c.core().unwrap().ident.comm_hash;
            assert_eq!(h(&kids[0]), h(&kids[1]));
            assert_ne!(h(&kids[0]), h(&comms[0]));
            let sums = sum_each(&kids, |k| vec![k.user_rank() as f32 * 10.0 + 1.0]);
            assert!(sums.iter().all(|v| v == &[12.0]), "{mode:?}: {sums:?}");
            for k in kids {
                k.destroy().unwrap();
            }
        }
        for c in &comms {
            c.destroy().unwrap();
        }
    }

    /// Two ranks grow to three: the id goes from the rank that made it to
    /// the other existing rank by itself, the new rank joins with it as
    /// rank 2, and an all-reduce over the three is right; the id is then
    /// spent. The rules: one outstanding id at a time, the maker passes
    /// it, nobody reuses it, a grow must grow.
    #[test]
    fn grow_two_ranks_to_three() {
        let comms = Comm::init_all(2, &cfg()).unwrap();
        let id = comms[1].grow_id().unwrap();
        let e = comms[1].grow_id().unwrap_err().to_string();
        assert!(e.contains("not used yet"), "{e}");
        let e = comms[0].grow(3, Some(id), &cfg()).unwrap_err().to_string();
        assert!(e.contains("did not make this id"), "{e}");
        let e = comms[1].grow(2, Some(id), &cfg()).unwrap_err().to_string();
        assert!(e.contains("does not grow"), "{e}");
        let grown: Vec<Comm> = std::thread::scope(|s| {
            let old: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(move || {
                        let mine = (c.user_rank() == 1).then_some(id);
                        c.grow(3, mine, &cfg()).unwrap()
                    })
                })
                .collect();
            let new = s.spawn(move || Comm::init_rank(3, id, 2, &cfg()).unwrap());
            let mut v: Vec<Comm> = old.into_iter().map(|h| h.join().unwrap()).collect();
            v.push(new.join().unwrap());
            v
        });
        assert!(grown
            .iter()
            .enumerate()
            .all(|(r, c)| c.user_rank() == r && c.count() == 3));
        let sums = sum_each(&grown, |k| vec![k.user_rank() as f32 + 1.0, 1.0]);
        assert!(sums.iter().all(|v| v == &[6.0, 3.0]), "{sums:?}");
        let e = comms[1].grow(3, Some(id), &cfg()).unwrap_err().to_string();
        assert!(e.contains("used by an earlier grow"), "{e}");
        for c in grown.iter().chain(&comms) {
            c.destroy().unwrap();
        }
    }

    /// Suspend and resume on two ranks: operations refused while
    /// suspended, the state in mem_stats, double calls refused, and the
    /// next all-reduce after resume right.
    #[test]
    fn suspend_refuses_operations_until_resume() {
        let comms = Comm::init_all(2, &cfg()).unwrap();
        let both = |f: &(dyn Fn(&Comm) -> Result<()> + Sync)| {
            std::thread::scope(|s| {
                let hs: Vec<_> = comms.iter().map(|c| s.spawn(move || f(c))).collect();
                hs.into_iter().for_each(|h| h.join().unwrap().unwrap());
            })
        };
        both(&|c| c.suspend());
        let st = comms[0].mem_stats().unwrap();
        assert!(st.suspended && st.suspendable_bytes == 0 && st.device_bytes == 0);
        assert_eq!(st.held_bytes, 0);
        let mut b = floats(&[1.0]);
        let e = comms[0]
            .all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
            .unwrap_err()
            .to_string();
        assert!(e.contains("suspended"), "{e}");
        assert!(comms[0]
            .suspend()
            .unwrap_err()
            .to_string()
            .contains("already suspended"));
        both(&|c| c.resume());
        assert!(!comms[1].mem_stats().unwrap().suspended);
        assert!(comms[1]
            .resume()
            .unwrap_err()
            .to_string()
            .contains("not suspended"));
        let sums = sum_each(&comms, |k| vec![k.user_rank() as f32 + 0.5]);
        assert!(sums.iter().all(|v| v == &[2.0]), "{sums:?}");
        for c in &comms {
            c.destroy().unwrap();
        }
    }

    /// NCCL_SHRINK_ABORT ends an all-reduce hung on the excluded rank, and
    /// the parent is then failed, saying why.
    #[test]
    fn shrink_abort_ends_the_parents_hung_operation() {
        let comms = Comm::init_all(3, &cfg()).unwrap();
        let hung: Vec<_> = [0, 2]
            .iter()
            .map(|&r| {
                let c = comms[r].clone();
                std::thread::spawn(move || {
                    let mut b = floats(&[1.0; 256]);
                    c.all_reduce(None, &mut b, DataType::Float32, RedOp::Sum)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let survivors = [&comms[0], &comms[2]];
        let kids: Vec<Comm> = std::thread::scope(|s| {
            let hs: Vec<_> = survivors
                .iter()
                .map(|c| s.spawn(move || c.shrink(&[1], &cfg(), ShrinkMode::Abort).unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for h in hung {
            let e = h.join().unwrap().unwrap_err().to_string();
            assert!(e.contains("with NCCL_SHRINK_ABORT"), "{e}");
        }
        let e = comms[0].async_error().unwrap_err().to_string();
        assert!(e.contains("with NCCL_SHRINK_ABORT"), "{e}");
        for c in kids.iter().chain(&comms) {
            c.destroy().unwrap();
        }
    }
}
