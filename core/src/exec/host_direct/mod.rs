//! Runs a pull plan ([`crate::algo::pull`]) on this rank's host buffers,
//! reading peers' buffers through [`PeerMem`]: the rank posts its call,
//! meets the others, and runs each phase on its threads; after each it
//! meets the others again or announces that it has finished it, and a
//! read of a peer's result waits for that peer's announcement alone. It
//! writes only its own memory.
//!
//! The threads are the caller's and a pool that lives as long as the
//! communicator, each with its own scratch: starting threads and mapping
//! fresh scratch at every call cost more than a megabyte's copy, and
//! changing this process's mappings stalls the peers reading it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Barrier, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::algo::pull::{awaited, stage_bytes, End, Own, Plan, Src, Task};
use crate::algo::{Buf, Coll, Region};
use crate::error::{Error, Result};
use crate::reduce::Reducer;
use crate::transport::cma::{PeerMem, Poll, Post, INLINE};

use super::header::{OpHeader, HEADER_BYTES};
use super::mailbox::{exchange, Counts, Msg};
use super::{timeout_error, ExecCtx};
use crate::mem::{self, OpBuffers, Span};

mod terms;

pub use terms::{settings, Slice, Stream, Terms, Threads, SLICE, TERMS_BYTES};

/// Bytes of each input a reduction reads before combining: n of them per
/// thread stay in its cache while they are combined.
const CHUNK: usize = 64 << 10;

/// What every thread of one call works from.
struct Job {
    pm: Arc<PeerMem>,
    plan: Plan,
    bufs: OpBuffers,
    /// This rank's staging area as an output buffer (a reduce's non-root
    /// part, which the root reads from it).
    stage: OpBuffers,
    reducer: Reducer,
    elem: usize,
    /// Reads of a chunk or more go through the thread's scratch and
    /// [`mem::copy_streaming`] (see [`Direct::stream`]).
    stream: bool,
    /// The call's threads meet here after each phase's tasks, and again
    /// once the caller's thread has met the other ranks.
    local: Barrier,
    /// The number of this rank's last announcement, which its peers'
    /// announcements of the same phase carry: the current phase's waits
    /// wait for it. Set by the caller's thread between the two local
    /// meetings that end a phase.
    announced: AtomicU64,
    failed: AtomicBool,
    first: Mutex<Option<Error>>,
}

impl Job {
    fn fail(&self, e: Error) {
        self.failed.store(true, Ordering::SeqCst);
        let mut f = self.first.lock().unwrap_or_else(PoisonError::into_inner);
        f.get_or_insert(e);
    }

    fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Thread `t`'s part of phase `k`, its waits polling `poll`; a panic
    /// is an error like another.
    fn phase(&self, k: usize, t: usize, scratch: &mut Vec<u8>, poll: &mut Poll<'_>) {
        if self.failed() {
            return;
        }
        let tasks = self.plan[k].tasks.get(t).map_or(&[][..], Vec::as_slice);
        let run = catch_unwind(AssertUnwindSafe(|| {
            tasks
                .iter()
                .try_for_each(|task| self.task(task, scratch, &mut *poll))
        }));
        match run {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.fail(e),
            Err(_) => self.fail(Error::Internal("a direct-path thread panicked".into())),
        }
    }

    /// A pool thread's whole share of the call. Its waits end when their
    /// peer announces or the call fails: the caller's thread watches the
    /// same peers for what ends a wait early (a stop, a peer's failure or
    /// exit, NCCL_TIMEOUT), which needs the call's context.
    fn work(&self, t: usize, scratch: &mut Vec<u8>) {
        let mut poll = |_: &[usize], _| self.failed().then(abandoned);
        for k in 0..self.plan.len() {
            self.phase(k, t, scratch, &mut poll);
            self.local.wait();
            self.local.wait();
            if self.failed() {
                return;
            }
        }
    }

    fn task(&self, task: &Task, scratch: &mut Vec<u8>, poll: &mut Poll<'_>) -> Result<()> {
        let b = &self.bufs;
        match *task {
            Task::Wait { peer } => {
                self.pm
                    .wait_for(&[peer], self.announced.load(Ordering::SeqCst), poll)
            }
            Task::Copy { src, dst, len } => {
                mem::copy(
                    span(b, Buf::Output, dst, len)?,
                    span(b, Buf::Input, src, len)?,
                );
                Ok(())
            }
            Task::Read {
                peer,
                from,
                src,
                dst,
                len,
            } => {
                let p = self.pm.posted(peer);
                let base = match from {
                    Src::Send => p.send,
                    Src::Recv => p.recv,
                    Src::Stage => p.stage,
                };
                let out = span(b, Buf::Output, dst, len)?;
                let at = base + src as u64;
                if !self.stream || len < CHUNK {
                    return mem::fill(out, |d| self.pm.read(peer, at, d));
                }
                if scratch.len() < CHUNK {
                    scratch.resize(CHUNK, 0);
                }
                mem::fill(out, |d| {
                    d.chunks_mut(CHUNK).enumerate().try_for_each(|(k, piece)| {
                        let s = &mut scratch[..piece.len()];
                        self.pm.read(peer, at + (k * CHUNK) as u64, s)?;
                        mem::copy_streaming(piece, s);
                        Ok(())
                    })
                })
            }
            Task::Reduce {
                src,
                dst,
                len,
                into,
            } => self.reduce(src, dst, len, into, scratch),
        }
    }

    /// Every rank's input `[src, src+len)` combined into `[dst, dst+len)`
    /// of this rank's `into` buffer, a chunk at a time: peers' chunks are
    /// read into scratch, then combined with this rank's own into the
    /// output, this rank's first and the peers' in rank order. In place
    /// (the output is this rank's own chunk) the output is the first
    /// operand as it stands, so nothing is copied aside.
    fn reduce(
        &self,
        src: usize,
        dst: usize,
        len: usize,
        into: Own,
        scratch: &mut Vec<u8>,
    ) -> Result<()> {
        let (n, me) = (self.pm.nranks(), self.pm.rank());
        let chunk = CHUNK - CHUNK % self.elem.max(1);
        if scratch.len() < n * chunk {
            scratch.resize(n * chunk, 0);
        }
        let mut off = 0;
        while off < len {
            let l = chunk.min(len - off);
            let out = match into {
                Own::Recv => span(&self.bufs, Buf::Output, dst + off, l)?,
                Own::Stage => span(&self.stage, Buf::Output, dst + off, l)?,
            };
            let own = span(&self.bufs, Buf::Input, src + off, l)?;
            let in_place = own.ptr == out.ptr;
            let mut inputs = Vec::with_capacity(n);
            if !in_place {
                inputs.push(own);
            }
            for (p, slot) in scratch.chunks_mut(chunk).take(n).enumerate() {
                if p == me {
                    continue;
                }
                let slot = &mut slot[..l];
                let at = self.pm.posted(p).send + (src + off) as u64;
                self.pm.read(p, at, slot)?;
                inputs.push(mem::staging(slot));
            }
            if in_place {
                mem::reduce_into_own(&self.reducer, out, &inputs);
            } else {
                mem::reduce_all(&self.reducer, out, &inputs);
            }
            off += l;
        }
        Ok(())
    }
}

/// What a wait of a call that has already failed ends with (the first
/// error is the one reported).
fn abandoned() -> Error {
    Error::Internal("another thread of this call failed".into())
}

/// An operation header as the words a [`Post`] carries.
pub fn call_words(h: &OpHeader) -> [u64; 4] {
    let b = h.encode();
    std::array::from_fn(|i| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap_or_default()))
}

/// The header whose words [`call_words`] made.
fn header_bytes(w: &[u64; 4]) -> [u8; HEADER_BYTES] {
    let mut b = [0u8; HEADER_BYTES];
    for (i, x) in w.iter().enumerate() {
        b[8 * i..8 * i + 8].copy_from_slice(&x.to_le_bytes());
    }
    b
}

/// The error for the first rank whose posted call differs from this
/// rank's, in the ring's words (naming both calls).
fn mismatch(
    mine: &[u64; 4],
    theirs: impl Iterator<Item = (usize, [u64; 4])>,
    rank: usize,
) -> Result<()> {
    let bytes = header_bytes;
    let Some(me) = OpHeader::decode(&bytes(mine)) else {
        return Err(Error::Internal(
            "an undecodable own operation header".into(),
        ));
    };
    for (peer, w) in theirs.filter(|(_, w)| w != mine) {
        me.check(&bytes(&w), peer, rank)?;
    }
    Ok(())
}

fn span(bufs: &OpBuffers, buf: Buf, off: usize, len: usize) -> Result<Span> {
    bufs.span(Region { buf, offset: 0 }, off, len, 1)
}

/// How the direct path runs one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Through the segment, in one meeting.
    Inline,
    /// Reading peers' buffers, on this many threads.
    Threads(usize),
}

/// The direct path of one communicator: its peer memory and its threads.
pub struct Direct {
    pm: Arc<PeerMem>,
    /// Rank 0's: which calls take this path and how they are sliced.
    pub terms: Terms,
    pub threads: Threads,
    /// Whether a call's large reads land through scratch and streaming
    /// stores, see [`Stream::for_call`].
    stream: Stream,
    /// Started by the first call that runs on threads: a communicator
    /// that never moves a large buffer (most of a job's splits) starts none.
    pool: OnceLock<Pool>,
    /// The caller's thread's scratch (calls of a communicator run one at a time).
    scratch: Mutex<Vec<u8>>,
    /// Where a reduce's non-root rank leaves its part for the root to
    /// read: its receive buffer is not its to write (NCCL ignores it, and
    /// it may be null). Kept, grown to the largest part so far: mapping
    /// fresh memory at every call costs page faults in this process while
    /// the root reads it.
    stage: Mutex<Vec<u8>>,
    /// Point-to-point messages numbered so far, per peer.
    p2p: Mutex<Counts>,
}

/// Where a wait on the segment happens, for the errors that end one.
const BARRIER: &str = "the operation's peer-memory barrier";
const MAILBOX: &str = "its peer-memory mailbox";
const PART: &str = "the peer-memory announcement that its part of the operation is ready";

/// Threads that each run their share of a call's phases, with their own
/// scratch kept from call to call.
struct Pool {
    /// One per thread; a call hands its job to the first few.
    workers: Vec<Sender<Arc<Job>>>,
    handles: Vec<JoinHandle<()>>,
}

impl Pool {
    fn start(threads: usize) -> Result<Pool> {
        let mut pool = Pool {
            workers: Vec::new(),
            handles: Vec::new(),
        };
        for t in 1..threads {
            let (tx, rx) = channel::<Arc<Job>>();
            let h = std::thread::Builder::new()
                .name(format!("oxccl-direct-{t}"))
                .spawn(move || {
                    let mut scratch = Vec::new();
                    while let Ok(job) = rx.recv() {
                        job.work(t, &mut scratch);
                    }
                })
                .map_err(|e| Error::System(format!("cannot start a direct-path thread: {e}")))?;
            pool.workers.push(tx);
            pool.handles.push(h);
        }
        Ok(pool)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Closing the channels ends the threads' loops.
        self.workers.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

impl Direct {
    /// The direct path on `pm` for `n` ranks, each call's route and slices
    /// by `terms` (rank 0's), on up to `threads` threads.
    pub fn new(pm: PeerMem, n: usize, terms: Terms, threads: Threads) -> Result<Direct> {
        Ok(Direct {
            pm: Arc::new(pm),
            terms,
            threads,
            stream: Stream::from_env()?,
            pool: OnceLock::new(),
            scratch: Mutex::default(),
            stage: Mutex::default(),
            p2p: Mutex::new(vec![(0, 0); n]),
        })
    }

    /// This rank has given up a call: see [`PeerMem::give_up`].
    pub fn give_up(&self) {
        self.pm.give_up();
    }

    /// Says which collective this rank is in, before it takes a path:
    /// see [`Direct::crossed`].
    pub fn enter(&self, call: &OpHeader) {
        self.pm.enter(&call_words(call));
    }

    /// Fails, naming both calls, where a peer is in this rank's collective
    /// (the same number) with another call. Each rank takes the inline
    /// path, the threads or the rings from its own count, so ranks whose
    /// counts differ across a threshold never meet to compare headers:
    /// each looks here while it waits instead. Cheap (a few words of the
    /// segment per peer), so every long wait may look.
    pub fn crossed(&self) -> Result<()> {
        let pm = &self.pm;
        let me = pm.rank();
        let Some(mine) = pm.current(me) else {
            return Ok(());
        };
        let seq = |w: &[u64; 4]| OpHeader::decode(&header_bytes(w)).map(|h| h.seq);
        let at = seq(&mine);
        let same = (0..pm.nranks())
            .filter(|&p| p != me)
            .filter_map(|p| Some((p, pm.current(p)?)))
            .filter(|(_, w)| seq(w) == at);
        mismatch(&mine, same, me)
    }

    /// Whether point-to-point messages take this path.
    pub fn has_p2p(&self) -> bool {
        self.pm.has_mailboxes()
    }

    /// Runs one group's sends and receives (none to this rank itself) but
    /// for those on the rings, whose places in `msgs` it returns.
    pub fn run_p2p(&self, msgs: &[Msg], ctx: &ExecCtx<'_>) -> Result<Vec<usize>> {
        let mut counts = self.p2p.lock().unwrap_or_else(PoisonError::into_inner);
        let threads = |len| self.threads.for_bytes(len);
        exchange(
            &self.pm,
            &mut counts,
            msgs,
            &threads,
            &mut |owing, waited| self.stalled(ctx, owing, waited, MAILBOX),
        )
    }

    fn pool(&self) -> Result<&Pool> {
        if let Some(p) = self.pool.get() {
            return Ok(p);
        }
        let p = Pool::start(self.threads.most())?;
        Ok(self.pool.get_or_init(|| p))
    }

    /// Meets the other ranks; ends early, with the error the ring path
    /// would give, when the communicator is stopped, another rank reported
    /// a failure, a peer's process is gone, or NCCL_TIMEOUT passes.
    fn barrier(&self, ctx: &ExecCtx<'_>) -> Result<()> {
        self.pm
            .barrier(&mut |missing, waited| self.stalled(ctx, missing, waited, BARRIER))
    }

    /// What a wait for `missing` ranks at `place` ends with, if it must end now.
    fn stalled(
        &self,
        ctx: &ExecCtx<'_>,
        missing: &[usize],
        waited: Duration,
        place: &str,
    ) -> Option<Error> {
        let pm = &self.pm;
        if let Some(e) = ctx.stop.error(&(ctx.what)()) {
            return Some(e);
        }
        if let Some((who, msg)) = ctx.bootstrap.remote_failure() {
            return Some(Error::Remote(format!("rank {who} failed: {msg}")));
        }
        if let Err(e) = self.crossed() {
            return Some(e);
        }
        if let Some(&p) = missing.iter().find(|&&p| !pm.alive(p)) {
            return Some(Error::Remote(format!(
                "{} on rank {}: rank {p} (pid {}) exited before reaching {place}; ranks missing there: {missing:?}",
                (ctx.what)(),
                ctx.rank,
                pm.pid(p)
            )));
        }
        (waited > ctx.timeout)
            .then(|| timeout_error(ctx, &[format!("for ranks {missing:?} at {place}")]))
    }

    /// How `coll` moving `bytes` per rank ([`crate::algo::pull::bytes`])
    /// runs here: on threads from the threshold on, else inline when its
    /// largest input fits a slot, else (between the two) on the rings.
    pub fn route(&self, coll: Coll, bytes: usize) -> Option<Route> {
        let min = match coll {
            Coll::Broadcast { .. } | Coll::Reduce { .. } => self.terms.rooted_min,
            _ => self.terms.min,
        };
        if bytes >= min {
            Some(Route::Threads(self.threads.for_bytes(bytes)))
        } else if bytes <= INLINE {
            Some(Route::Inline)
        } else {
            None
        }
    }

    /// Runs a small call inline: each rank copies its input into the
    /// segment, all meet once, and each computes its own output from the
    /// segment alone (LL's idea: the data travels with the flag).
    #[allow(clippy::too_many_arguments)]
    pub fn run_inline(
        &self,
        coll: Coll,
        count: usize,
        elem: usize,
        post: Post,
        bufs: OpBuffers,
        reducer: Reducer,
        ctx: &ExecCtx<'_>,
    ) -> Result<()> {
        let pm = &self.pm;
        let (n, me) = (pm.nranks(), pm.rank());
        let bytes = count * elem;
        // The part of its input a rank contributes.
        let sent = match coll {
            Coll::Broadcast { root } if root != me => 0,
            Coll::ReduceScatter => n * bytes,
            _ => bytes,
        };
        let len = match coll {
            Coll::ReduceScatter => n * bytes,
            _ => bytes,
        };
        let input = span(&bufs, Buf::Input, 0, sent)?;
        let got = mem::view(input, |d| {
            pm.meet_inline(&post.call, d, &mut |missing, waited| {
                self.stalled(ctx, missing, waited, BARRIER)
            })
        })?;
        mismatch(&post.call, got.iter().map(|g| g.0).enumerate(), me)?;
        let slots: Vec<Span> = got
            .iter()
            .map(|&(_, at)| Span {
                ptr: at as *mut u8,
                len,
            })
            .collect();
        // Peers write these slots again only after this rank's next
        // meeting, which it enters after it has read them.
        let part = |s: &Span, off: usize| Span {
            ptr: s.ptr.wrapping_add(off),
            len: bytes,
        };
        match coll {
            // Only a reduce's root has an output.
            Coll::Reduce { root } if root != me => {}
            Coll::AllReduce | Coll::Reduce { .. } => {
                mem::reduce_all(&reducer, span(&bufs, Buf::Output, 0, bytes)?, &slots)
            }
            Coll::Broadcast { root } => mem::copy(span(&bufs, Buf::Output, 0, bytes)?, slots[root]),
            Coll::AllGather => {
                for (p, s) in slots.iter().enumerate() {
                    mem::copy(span(&bufs, Buf::Output, p * bytes, bytes)?, part(s, 0));
                }
            }
            Coll::ReduceScatter => {
                let mine: Vec<Span> = slots.iter().map(|s| part(s, me * bytes)).collect();
                mem::reduce_all(&reducer, span(&bufs, Buf::Output, 0, bytes)?, &mine);
            }
        }
        Ok(())
    }

    /// Runs one call of `plan` on `threads` threads; every rank of the
    /// communicator must run the same call.
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        plan: Plan,
        threads: usize,
        mut post: Post,
        bufs: OpBuffers,
        reducer: Reducer,
        elem: usize,
        ctx: &ExecCtx<'_>,
    ) -> Result<()> {
        let pm = &self.pm;
        // Held to the end: peers read it until the last barrier.
        let mut staged = self.stage.lock().unwrap_or_else(PoisonError::into_inner);
        let need = stage_bytes(&plan);
        if staged.len() < need {
            staged.resize(need, 0);
        }
        post.stage = staged.as_mut_ptr() as u64;
        let stage = OpBuffers {
            input: std::ptr::null(),
            in_bytes: 0,
            output: staged.as_mut_ptr(),
            out_bytes: need,
            scratch: std::ptr::null_mut(),
            scratch_bytes: 0,
        };
        pm.post(&post);
        self.barrier(ctx)?;
        // A peer on the inline path arrives at the same barrier (its
        // meetings count as barriers) without posting: its call is in
        // what it entered.
        self.crossed()?;
        let posted = (0..pm.nranks()).map(|p| (p, pm.posted(p).call));
        mismatch(&post.call, posted, pm.rank())?;
        let workers = &self.pool()?.workers;
        let threads = threads.clamp(1, workers.len() + 1);
        let job = Arc::new(Job {
            pm: pm.clone(),
            plan,
            bufs,
            stage,
            reducer,
            elem,
            stream: self
                .stream
                .for_call(pm.nranks(), span_bytes(&bufs), threads),
            local: Barrier::new(threads),
            announced: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            first: Mutex::new(None),
        });
        for w in &workers[..threads - 1] {
            w.send(job.clone())
                .map_err(|_| Error::Internal("a direct-path thread is gone".into()))?;
        }
        let mut scratch = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        let mut poll = |missing: &[usize], waited| {
            if job.failed() {
                return Some(abandoned());
            }
            self.stalled(ctx, missing, waited, PART)
        };
        for k in 0..job.plan.len() {
            job.phase(k, 0, &mut scratch, &mut poll);
            // The peers the pool threads wait for, watched here for what
            // ends their waits early; done at once where they have come.
            if !job.failed() {
                let e = job.announced.load(Ordering::SeqCst);
                if let Err(err) = pm.wait_for(&awaited(&job.plan[k]), e, &mut poll) {
                    job.fail(err);
                }
            }
            job.local.wait();
            if !job.failed() {
                match job.plan[k].end {
                    End::Barrier => {
                        if let Err(e) = self.barrier(ctx) {
                            job.fail(e);
                        }
                    }
                    // Every thread has finished the phase: what it wrote
                    // is this rank's to offer.
                    End::Announce => job.announced.store(pm.arrive(), Ordering::SeqCst),
                }
            }
            job.local.wait();
            if job.failed() {
                break;
            }
        }
        // Every pool thread has passed the last wait: none touches the
        // caller's buffers after this returns.
        let first = job
            .first
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The bytes a call's buffers cover: input and output, or the larger of
/// the two where they overlap (in place).
fn span_bytes(b: &OpBuffers) -> usize {
    let (i, o) = (b.input as usize, b.output as usize);
    if i < o + b.out_bytes && o < i + b.in_bytes {
        b.in_bytes.max(b.out_bytes)
    } else {
        b.in_bytes + b.out_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_spans_both_buffers_unless_they_overlap() {
        let v = vec![0u8; 100];
        let w = vec![0u8; 40];
        let bufs = |i: usize, il: usize, o: &Vec<u8>, ol: usize| OpBuffers {
            input: v[i..].as_ptr(),
            in_bytes: il,
            output: o.as_ptr().cast_mut(),
            out_bytes: ol,
            scratch: std::ptr::null_mut(),
            scratch_bytes: 0,
        };
        assert_eq!(span_bytes(&bufs(0, 40, &w, 40)), 80);
        // In place, and an all_gather's input inside its output.
        assert_eq!(span_bytes(&bufs(0, 100, &v, 100)), 100);
        assert_eq!(span_bytes(&bufs(50, 25, &v, 100)), 100);
    }
}
