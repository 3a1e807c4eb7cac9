//! The leader's p2p server: send/recv between processes that share one GPU
//! without MPS, with every copy in the leader's context.
//!
//! A receiver that pulled a message with its own kernel made the GPU switch
//! contexts for each message once two processes had kernels queued (a
//! sendrecv ring of 4 ranks took ~600 us per 8-byte step). So the leader's
//! own messages stay on the leader's stream: it pulls what it receives, as
//! before, and pushes what it sends into the receiver's buffer once the
//! receiver's stream says the buffer is free. A receiver posts a request
//! for each of the leader's messages into its ring of the host mailbox
//! (`Mailbox::post_request`); this thread answers it at once (`Pushed`,
//! or `Pull` where the receiver's buffer cannot be shared or the leader
//! stopped waiting for it) and hands the buffer to the leader's thread
//! ([`Forwards`]). It queues nothing on the GPU for them, so with 2 ranks
//! every copy is on the leader's own stream and nothing can wait behind
//! anything.
//!
//! Where asked (`OXCCL_SHARED_P2P=server`, [`Words::full`]) the thread
//! also copies the messages between other ranks, on a stream of its own in
//! the leader's context, so that those ranks only store and wait on words.
//! That stream shares the context's hardware queues with the leader's
//! streams, and a stream memory wait blocks its queue: a copy queued here
//! may sit behind a wait of the leader's stream that the copy itself would
//! release. Under CUDA_DEVICE_MAX_CONNECTIONS=1 every 2-rank sendrecv and
//! 4-rank all_to_all hung that way on an H100 (2026-11-27, f6c02c3); stream
//! priorities do not give a stream a queue of its own, and with 8 queues
//! 16 waiting streams take them all (`core/examples/hw_queues.rs`). A
//! context of its own would have its own queues, but CUDA IPC maps an
//! allocation once per process (a second context's open of a handle the
//! primary has open fails with CUDA_ERROR_INVALID_HANDLE, 2026-11-27, f2cc9e8), the
//! leader's primary context maps every rank's buffers for the collectives,
//! and a second context's copy of the primary's memory by address is
//! ordered after the primary's queues. Hence opt-in.
//!
//! The words the copying server waits for live in host memory, in pages
//! of the mailbox segment that every process registers with CUDA (mapped,
//! pinned): the sender's stream stores its message k's SREADY there once
//! the message is written, the receiver's stream its RECV READY once its
//! buffer may be overwritten, and the server's thread loads them on the
//! host. A request stays pending until both words have reached k (32-bit,
//! compared wrapping), and a pair's requests go in their order; the server
//! then queues, on its one stream, only the copy and the two stores that
//! end the message: the receiver's READY (the data is in its buffer) and
//! the sender's DONE (its buffer is free), both in the flag words of the
//! rank whose stream waits for them. Nothing on the server's stream waits,
//! so it always drains; every stream that waits (the ranks' own) waits on
//! its own process's flag words, which a release (see
//! `super::super::stop`) stores.
//!
//! Order. The server adds no wait that the program did not have: message k
//! of a pair is queued once the sender's stream has reached its k-th send
//! and the receiver's stream its k-th receive of that pair, exactly what a
//! receiver pulling with its own kernel waited for. Pending requests of
//! other pairs are served meanwhile, in whatever order their words come:
//! a receiver's request may arrive before the request that its sender's
//! stream must see done before it reaches that send (see the tests).
//!
//! Where the server cannot copy (the receiver's memory is not shareable
//! through CUDA IPC, the receiver's stream is being captured, or a buffer
//! cannot be mapped without waiting for the GPU: see `ipc::map_kept_now`)
//! it only passes the sender's READY on to the receiver once the sender's
//! SREADY is seen, and the receiver pulls with its own kernel as before;
//! the sender's stream does the same in both cases, so it never needs to
//! know which. The leader, which must know (it pushes, or stores the
//! READY of the receiver's pull itself), waits on its host for each
//! receiver's request for a moment (`push_wait`, 200 us); a receiver that
//! asks later is told to pull ([`Forwards::give_up`]).
//!
//! Wake-up and latency. The thread polls the rings and, while requests are
//! pending, the words: it spins for `SPIN` after its last progress (a
//! request or a word is then seen within a microsecond), then, with
//! requests pending, yields for `YIELD` and then naps `STEP` at a time
//! (a word a stream stores after a long kernel is seen within ~100 us);
//! with none pending it sleeps on a doorbell word of the segment (a futex
//! shared between the processes) that a receiver rings after posting a
//! request (`Mailbox::doze`): a request after a pause costs one wake-up,
//! tens of microseconds, and an idle communicator costs a wake-up every
//! `NAP` (to notice a stop). Each message costs one trip through the host
//! (the stream's store seen by this thread, then its copy queued), where
//! the GPU waits it replaces took none.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cuda::ipc::Exported;
use crate::cuda::{ipc, Context, HostMapping, KernelSet, MemOp, RawStream, Stream};
use crate::error::{Error, Result};

use super::super::stop::Awaited;
use super::mailbox::{Mailbox, Request, Served};
use super::{P2P_DONE, P2P_FREE, P2P_READY, PUSHED};

/// The most ranks the server serves: its words take 16 bytes per ordered
/// pair in the mailbox segment. Larger groups pull with their own kernels.
pub(super) const MAX_SERVED: usize = 64;

const SPIN: Duration = Duration::from_micros(100);
const YIELD: Duration = Duration::from_millis(2);
const STEP: Duration = Duration::from_micros(20);
const NAP: Duration = Duration::from_millis(50);

/// Index of `q`'s SREADY for `r` among the server's words of `n` ranks.
fn sready_word(n: usize, q: usize, r: usize) -> usize {
    q * n + r
}

/// Index of `r`'s RECV READY for `q`'s messages.
fn rready_word(n: usize, q: usize, r: usize) -> usize {
    n * n + q * n + r
}

/// Whether a word that holds `word` has reached message `k`: 32-bit
/// values compared wrapping, as stream waits compare them.
pub(super) fn reached(word: u32, k: u32) -> bool {
    (word.wrapping_sub(k) as i32) >= 0
}

/// One stream operation of the protocol: a store or wait on a word (as
/// [`MemOp`] enqueues them), or a copy `C` describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op<C> {
    Mem(MemOp),
    Copy(C),
}

impl<C> Op<C> {
    /// Stores `value` at `at`.
    fn store(at: u64, value: u32) -> Op<C> {
        Op::Mem(MemOp::Write { addr: at, value })
    }

    /// Later work waits until the word at `at` reaches `value`.
    fn wait(at: u64, value: u32) -> Op<C> {
        Op::Mem(MemOp::Wait { addr: at, value })
    }
}

/// A copy of `bytes` from `src` to `dst`, addresses of the stream's context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Move {
    pub dst: u64,
    pub src: u64,
    pub bytes: usize,
}

/// The words of send/recv as one process addresses them, and which
/// stream operations each step takes. Values are message numbers, per
/// ordered pair, compared as wrapping 32-bit words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Words {
    /// Each rank's flag buffer.
    pub flags: Vec<u64>,
    /// The server's words (host memory of the mailbox segment, registered
    /// with CUDA) as this process's streams address them; 0 where there is
    /// no server (`OXCCL_SHARED_P2P=pull`, or too many ranks): every
    /// receiver then pulls.
    pub srv: u64,
    pub leader: usize,
    /// The server copies the messages between other ranks too
    /// (`OXCCL_SHARED_P2P=server`); else it only hands the leader's
    /// receivers' buffers to the leader, and the others pull.
    pub full: bool,
}

impl Words {
    fn nranks(&self) -> usize {
        self.flags.len()
    }

    /// Whether `r` posts requests to the server (the leader receives with
    /// its own kernel: it is the leader's context already).
    pub fn asks(&self, r: usize) -> bool {
        self.srv != 0 && r != self.leader
    }

    /// Whether `q`'s messages to `r` go through the server: the leader's
    /// (which the leader's stream then writes, or the receiver pulls), and
    /// where it copies, everyone's.
    pub fn served(&self, q: usize, r: usize) -> bool {
        self.asks(r) && (self.full || q == self.leader)
    }

    /// In `r`'s flags: `q`'s message k is in `r`'s buffer (served), or
    /// ready to pull.
    pub fn ready(&self, q: usize, r: usize) -> u64 {
        self.flags[r] + P2P_READY + 8 * q as u64
    }

    /// In `q`'s flags: its message k to `r` has been copied.
    pub fn done(&self, q: usize, r: usize) -> u64 {
        self.flags[q] + P2P_DONE + 8 * r as u64
    }

    /// In the server's words: `q`'s stream has made its message k to `r`
    /// ready.
    pub fn sready(&self, q: usize, r: usize) -> u64 {
        self.srv + 8 * sready_word(self.nranks(), q, r) as u64
    }

    /// In the server's words: `r`'s stream has reached its receive k from
    /// `q` (its buffer may be overwritten).
    pub fn rready(&self, q: usize, r: usize) -> u64 {
        self.srv + 8 * rready_word(self.nranks(), q, r) as u64
    }

    /// Sender `q`'s stream, where its `k`-th message to `r` is ready: the
    /// server's word where the server copies or relays it, else the
    /// receiver's (the leader's messages: the leader knows by then that
    /// the receiver pulls).
    pub fn send<C>(&self, q: usize, r: usize, k: u64) -> Op<C> {
        let at = if self.served(q, r) && q != self.leader {
            self.sready(q, r)
        } else {
            self.ready(q, r)
        };
        Op::store(at, k as u32)
    }

    /// Sender `q`'s stream, after the group: its buffer is free again.
    pub fn send_end<C>(&self, q: usize, r: usize, k: u64) -> Op<C> {
        Op::wait(self.done(q, r), k as u32)
    }

    /// Receiver `r`'s stream, for `q`'s `k`-th message, which the server
    /// copies.
    pub fn recv_copied<C>(&self, q: usize, r: usize, k: u64) -> [Op<C>; 2] {
        let value = k as u32;
        [
            Op::store(self.rready(q, r), value),
            Op::wait(self.ready(q, r), value),
        ]
    }

    /// In the leader's flags: `r`'s buffer is free for the leader's
    /// message k (which the leader's stream pushes).
    pub fn free(&self, r: usize) -> u64 {
        self.flags[self.leader] + P2P_FREE + 8 * r as u64
    }

    /// In `r`'s flags: the leader's message k is in `r`'s buffer.
    pub fn pushed(&self, r: usize) -> u64 {
        self.flags[r] + PUSHED
    }

    /// The leader's stream, for its `k`-th message to `r`, which it writes
    /// into `r`'s buffer itself: a copy the server queued in the leader's
    /// context could sit behind the leader's own waits (see the module).
    pub fn push<C>(&self, r: usize, k: u64, copy: C) -> [Op<C>; 3] {
        let value = k as u32;
        [
            Op::wait(self.free(r), value),
            Op::Copy(copy),
            Op::store(self.pushed(r), value),
        ]
    }

    /// Receiver `r`'s stream, for the leader's `k`-th message, which the
    /// leader pushes.
    pub fn recv_pushed<C>(&self, r: usize, k: u64) -> [Op<C>; 2] {
        let value = k as u32;
        [
            Op::store(self.free(r), value),
            Op::wait(self.pushed(r), value),
        ]
    }

    /// Receiver `r`'s stream, for `q`'s `k`-th message, which it pulls.
    pub fn recv_pull<C>(&self, q: usize, r: usize, k: u64, copy: C) -> [Op<C>; 3] {
        let value = k as u32;
        [
            Op::wait(self.ready(q, r), value),
            Op::Copy(copy),
            Op::store(self.done(q, r), value),
        ]
    }

    /// The server's stream, for `q`'s `k`-th message to `r`, once its
    /// thread has seen the words reach it (see [`Backlog`]): the copy, or
    /// (`None`) only the receiver's READY for it to pull. No wait.
    pub fn serve<C>(&self, q: usize, r: usize, k: u64, copy: Option<C>) -> Vec<Op<C>> {
        let value = k as u32;
        let ready = Op::store(self.ready(q, r), value);
        match copy {
            None => vec![ready],
            Some(c) => vec![Op::Copy(c), ready, Op::store(self.done(q, r), value)],
        }
    }
}

/// A request the server has answered and not yet queued: `q`'s `k`-th
/// message to `r`; `copy`: the server copies it (it then waits for the
/// receiver's RECV READY too), else the receiver pulls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pending<T> {
    pub q: usize,
    pub r: usize,
    pub k: u64,
    pub copy: bool,
    pub work: T,
}

/// The server's pending requests, in the order they were posted.
#[derive(Debug)]
pub(super) struct Backlog<T> {
    nranks: usize,
    items: Vec<Pending<T>>,
}

impl<T> Backlog<T> {
    pub fn new(nranks: usize) -> Backlog<T> {
        Backlog {
            nranks,
            items: Vec::new(),
        }
    }

    pub fn push(&mut self, p: Pending<T>) {
        self.items.push(p);
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Takes, in posted order, every request whose words (`word(i)`, the
    /// server's word `i`) have reached it: the sender's SREADY, and for a
    /// copy the receiver's RECV READY. A request waits behind an earlier
    /// one of its pair still pending, so that a pair's READY stores keep
    /// their order (a pulled message needs no RECV READY and could
    /// otherwise pass a copied one before it).
    pub fn take_ready(&mut self, word: impl Fn(usize) -> u32) -> Vec<Pending<T>> {
        let n = self.nranks;
        let mut blocked: Vec<(usize, usize)> = Vec::new();
        let mut ready = Vec::new();
        let mut left = Vec::with_capacity(self.items.len());
        for p in self.items.drain(..) {
            let k = p.k as u32;
            let go = !blocked.contains(&(p.q, p.r))
                && reached(word(sready_word(n, p.q, p.r)), k)
                && (!p.copy || reached(word(rready_word(n, p.q, p.r)), k));
            if go {
                ready.push(p);
            } else {
                blocked.push((p.q, p.r));
                left.push(p);
            }
        }
        self.items = left;
        ready
    }
}

/// Enqueues `ops` on `stream`; each wait is recorded in `awaited` by its
/// offset from the buffer at `base` (the stream's own flag words); `None`
/// for a stream that must never wait (the server's), which refuses one.
///
/// # Safety
/// Every word is 4-byte aligned memory mapped for the stream's context
/// (device memory, or host memory registered with DEVICEMAP as the device
/// addresses it) and alive until the stream has run the operations; every
/// copy's buffers are valid for its bytes until then.
#[allow(unsafe_code)] // stream memory operations on raw device addresses
pub(super) unsafe fn enqueue(
    ops: &[Op<Move>],
    stream: RawStream,
    kernels: &KernelSet,
    max_blocks: usize,
    mut awaited: Option<(u64, &mut Awaited)>,
) -> Result<()> {
    // Stores and waits between two copies go in one driver call.
    let mut batch: Vec<MemOp> = Vec::new();
    let flush = |batch: &mut Vec<MemOp>| -> Result<()> {
        if !batch.is_empty() {
            #[allow(unsafe_code)]
            // SAFETY: the caller's contract.
            unsafe {
                stream.mem_ops(batch)?
            };
            batch.clear();
        }
        Ok(())
    };
    for op in ops {
        match *op {
            Op::Mem(m @ MemOp::Wait { addr, value }) => {
                let Some((base, awaited)) = awaited.as_mut() else {
                    return Err(Error::Internal(
                        "a stream wait on the shared-GPU p2p server's stream".into(),
                    ));
                };
                debug_assert!(addr >= *base, "a wait on another process's word");
                batch.push(m);
                awaited.wait(addr - *base, value);
            }
            Op::Mem(m @ MemOp::Write { .. }) => batch.push(m),
            Op::Copy(m) => {
                flush(&mut batch)?;
                kernels.copy(m.dst, m.src, m.bytes, max_blocks, stream)?;
            }
        }
    }
    flush(&mut batch)
}

/// The server's words of the mailbox segment, as one process registers
/// them with CUDA (`crate::cuda::Registered`): the mailbox lives as long as
/// the registration, which holds it.
pub(super) struct ServerWords(pub Arc<Mailbox>);

// SAFETY: the range is inside the mailbox's segment mapping, which the
// `Arc` keeps mapped for as long as this value lives.
#[allow(unsafe_code)]
unsafe impl HostMapping for ServerWords {
    fn host_range(&self) -> (*mut u8, usize) {
        (self.0.server_words_ptr(), self.0.server_words().1)
    }
}

/// The server thread of one leader's `Processes`; stopped and joined on
/// drop.
pub(super) struct Server {
    quit: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// To ring the doorbell when stopping.
    bell: Arc<Mailbox>,
    /// A request the server had answered but could not queue; the
    /// leader's next call reports it.
    failed: Arc<Mutex<Option<String>>>,
}

impl Server {
    /// Starts serving the rings of every rank but the leader. `stop` (the
    /// communicator's) ends it as the drop does.
    pub fn start(
        ctx: &Arc<Context>,
        mailbox: Arc<Mailbox>,
        words: Arc<Words>,
        stop: Arc<AtomicBool>,
        max_blocks: usize,
    ) -> Result<(Server, Arc<Forwards>)> {
        // Only a server that copies needs a stream and the copy kernel.
        let copier = if words.full {
            let kernels = KernelSet::shared(ctx)?;
            // Loading a module waits for the context's work, which may soon
            // include streams waiting for this server: load the copy now.
            kernels.prepare_copy()?;
            Some((kernels, Stream::new(ctx)?))
        } else {
            None
        };
        let quit = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(Mutex::new(None));
        let forwards = Arc::new(Forwards::default());
        let n = words.nranks();
        let bell = mailbox.clone();
        let mut serving = Serving {
            ctx: ctx.clone(),
            mailbox,
            next: vec![1; n],
            words,
            copier,
            max_blocks,
            backlog: Backlog::new(n),
            failed: failed.clone(),
            forwards: forwards.clone(),
        };
        let q = quit.clone();
        let thread = std::thread::Builder::new()
            .name("oxccl-p2p-server".into())
            .spawn(move || serving.run(&q, &stop))
            .map_err(|e| Error::System(format!("starting the shared-GPU p2p server: {e}")))?;
        let server = Server {
            quit,
            thread: Some(thread),
            bell,
            failed,
        };
        Ok((server, forwards))
    }

    /// The first request the server answered but could not queue, once.
    pub fn take_failure(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Ends the thread and waits for it; what it queued stays queued, the
    /// requests still pending are dropped (the communicator is stopping,
    /// and its ranks' releases store what their own streams wait for).
    pub fn stop(&mut self) {
        self.quit.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            self.bell.wake_server();
            if t.join().is_err() {
                tracing::error!(target: "oxccl::coll", "the shared-GPU p2p server thread panicked");
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the server copies for a pending request: the receiver's and the
/// sender's buffers (both other processes', mapped in the server's
/// context), and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Work {
    bufs: [Exported; 2],
    bytes: usize,
}

/// The leader's messages that receivers have asked for, handed from the
/// server thread to the leader's own thread, which writes each into its
/// receiver's buffer; or that the leader stopped waiting for, which their
/// receivers then pull.
#[derive(Debug, Default)]
pub(super) struct Forwards(Mutex<HashMap<(usize, u64), Forward>>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Forward {
    /// The receiver asked: its buffer, or `None` where it pulls.
    Asked(Option<Exported>),
    /// The leader went on without the receiver's answer: it pulls.
    GaveUp,
}

impl Forwards {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(usize, u64), Forward>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Receiver `r` asks for the leader's `k`-th message into `dst`;
    /// whether the leader will push it (else the receiver pulls).
    fn ask(&self, r: usize, k: u64, dst: Option<Exported>) -> bool {
        let mut m = self.lock();
        if m.remove(&(r, k)) == Some(Forward::GaveUp) {
            return false;
        }
        m.insert((r, k), Forward::Asked(dst));
        dst.is_some()
    }

    /// Receiver `r`'s answer for the leader's `k`-th message to it, once it
    /// has come: its buffer, or `None` where it pulls.
    pub fn take(&self, r: usize, k: u64) -> Option<Option<Exported>> {
        let mut m = self.lock();
        match m.get(&(r, k)) {
            Some(&Forward::Asked(dst)) => {
                m.remove(&(r, k));
                Some(dst)
            }
            _ => None,
        }
    }

    /// The leader waits no longer: the answer if it came meanwhile, else
    /// `None`, and the receiver will be told to pull.
    pub fn give_up(&self, r: usize, k: u64) -> Option<Exported> {
        let mut m = self.lock();
        match m.remove(&(r, k)) {
            Some(Forward::Asked(dst)) => dst,
            _ => {
                m.insert((r, k), Forward::GaveUp);
                None
            }
        }
    }
}

/// The server thread's state.
struct Serving {
    ctx: Arc<Context>,
    mailbox: Arc<Mailbox>,
    words: Arc<Words>,
    /// Each rank's next request.
    next: Vec<u64>,
    /// The copy kernel and its one stream, which never waits; only where
    /// the server copies ([`Words::full`]), the only case that queues.
    copier: Option<(Arc<KernelSet>, Stream)>,
    /// Blocks a copy takes at most: the communicator's CTA budget.
    max_blocks: usize,
    backlog: Backlog<Option<Work>>,
    failed: Arc<Mutex<Option<String>>>,
    forwards: Arc<Forwards>,
}

impl Serving {
    fn run(&mut self, quit: &AtomicBool, stop: &AtomicBool) {
        if let Err(e) = self.ctx.bind() {
            // Every receiver's wait for an answer then ends at its timeout.
            tracing::error!(target: "oxccl::coll", "the shared-GPU p2p server cannot bind the leader's context: {e}");
            return;
        }
        let mut last = Instant::now();
        while !quit.load(Ordering::Acquire) && !stop.load(Ordering::Acquire) {
            if self.poll() {
                last = Instant::now();
                continue;
            }
            let idle = last.elapsed();
            if idle < SPIN {
                std::hint::spin_loop();
                continue;
            }
            if !self.backlog.is_empty() {
                // Streams store the words: no doorbell rings for them.
                if idle < YIELD {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(STEP);
                }
                continue;
            }
            let mailbox = self.mailbox.clone();
            if mailbox.doze(NAP, || self.poll()) {
                last = Instant::now();
            }
        }
    }

    /// Answers every request posted so far and queues every pending one
    /// whose words have reached it; whether there was any.
    fn poll(&mut self) -> bool {
        let mut any = false;
        for r in 0..self.words.nranks() {
            if !self.words.asks(r) {
                continue;
            }
            while let Some(req) = self.mailbox.poll_request(r, self.next[r]) {
                let n = self.next[r];
                let answer = match req {
                    Ok(req) => self.take(r, &req),
                    Err(e) => Served::Failed(e.message().to_string()),
                };
                self.mailbox.answer_request(r, n, &answer);
                self.next[r] += 1;
                any = true;
            }
        }
        if self.backlog.is_empty() {
            return any;
        }
        // A stream's store (default flags) orders after the stream's
        // earlier work and comes with a memory barrier: once this thread
        // sees SREADY reach k, the sender's message k is written, and once
        // it sees RECV READY, the receiver is done with its buffer.
        let mailbox = &self.mailbox;
        let ready = self.backlog.take_ready(|i| mailbox.server_word(i));
        for p in ready {
            self.queue(p);
            any = true;
        }
        any
    }

    /// Answers receiver `r`'s request at once and keeps it pending.
    fn take(&mut self, r: usize, req: &Request) -> Served {
        let (q, k, leader) = (req.from, req.k, self.words.leader);
        // q == r: a rank's message to itself (all_to_all's own block),
        // copied here for the same reason as the others.
        if q >= self.words.nranks() {
            return Served::Failed(format!(
                "rank {r} asked the p2p server (rank {leader}) for message {k} from rank {q}, which is not a rank of its {}",
                self.words.nranks()
            ));
        }
        // The leader's own messages: its stream writes them, or stores the
        // READY of the receiver's pull. Nothing of them is queued here.
        if q == leader {
            return if self.forwards.ask(r, k, req.dst) {
                Served::Pushed
            } else {
                Served::Pull
            };
        }
        if !self.words.full {
            return Served::Failed(format!(
                "rank {r} asked the p2p server (rank {leader}) for rank {q}'s message {k}, which it only serves for the leader's messages"
            ));
        }
        let work = match req.dst {
            Some(dst) => {
                let bufs = [dst, req.src];
                // Letting go of kept mappings synchronizes the context, whose
                // streams may wait for requests this thread has yet to serve:
                // where that is needed, the receiver pulls instead. Mapped now
                // to answer; looked up again when queued (see `queue`).
                match ipc::map_kept_now(&self.ctx, &bufs) {
                    Ok(Some(_)) => Some(Work {
                        bufs,
                        bytes: req.bytes as usize,
                    }),
                    Ok(None) => {
                        tracing::debug!(target: "oxccl::coll", "the p2p server would have to wait for the GPU to map rank {q}'s message {k} to rank {r} (kept mappings full, or a freed allocation still mapped): rank {r} pulls it");
                        None
                    }
                    Err(e) => {
                        tracing::debug!(target: "oxccl::coll", "the p2p server cannot map rank {q}'s message {k} to rank {r} ({e}): rank {r} pulls it");
                        None
                    }
                }
            }
            None => None,
        };
        let copied = work.is_some();
        self.backlog.push(Pending {
            q,
            r,
            k,
            copy: copied,
            work,
        });
        if copied {
            Served::Copied
        } else {
            Served::Pull
        }
    }

    /// Queues a request whose words have reached it.
    fn queue(&mut self, p: Pending<Option<Work>>) {
        let (q, r, k, leader) = (p.q, p.r, p.k, self.words.leader);
        debug_assert!(
            q != leader || p.work.is_none(),
            "the server copies a leader's message"
        );
        // Another thread of this process may have let go of the kept
        // mappings since the request came (after a synchronize, which did
        // not cover this copy, not yet queued): the addresses are looked up
        // again, mapped anew where needed.
        let copy = match &p.work {
            None => Ok(None),
            Some(w) => match ipc::map_kept_now(&self.ctx, &w.bufs) {
                Ok(Some(a)) => Ok(Some(Move {
                    dst: a[0],
                    src: a[1],
                    bytes: w.bytes,
                })),
                Ok(None) => Err(Error::System(
                    "its buffers can no longer be mapped without waiting for the GPU".into(),
                )),
                Err(e) => Err(e),
            },
        };
        // Where the copy cannot be queued the message still ends (its
        // READY and DONE stored, the data not copied) so that no rank's
        // stream waits forever, and the leader's next call reports it.
        let (ops, failure) = match copy {
            Ok(c) => (self.words.serve(q, r, k, c), None),
            Err(e) => {
                let mut ops = self.words.serve::<Move>(q, r, k, None);
                ops.push(Op::store(self.words.done(q, r), k as u32));
                (ops, Some(e))
            }
        };
        let queued = match &self.copier {
            #[allow(unsafe_code)]
            // SAFETY: the stores go to every rank's flags, device memory
            // mapped here until the leader's `Processes` goes, which stops
            // this thread first and synchronizes the context before freeing
            // them (the window's drop); the copy's buffers are the ranks'
            // (valid for the message by the send/recv contract), mapped
            // through the process's kept table, which lets a mapping go only
            // after a synchronize; the sender and receiver touch them again
            // only after this stream's stores. No op waits.
            Some((kernels, stream)) => unsafe {
                enqueue(&ops, stream.handle(), kernels, self.max_blocks, None)
            },
            None => Err(Error::Internal(
                "a message pending at a p2p server that copies nothing".into(),
            )),
        };
        if let Some(e) = failure.or(queued.err()) {
            let msg = format!(
                "the p2p server (rank {leader}) could not copy rank {q}'s message {k} to rank {r}: {e}"
            );
            tracing::error!(target: "oxccl::coll", "{msg}");
            self.failed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert(msg);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, VecDeque};

    use super::*;

    /// A message: (sender, receiver, number).
    type Msg = (usize, usize, u64);

    /// Streams of stream operations over one memory of words, run until
    /// none can go on; the log keeps (stream, op) in the order they ran.
    struct Sim {
        mem: HashMap<u64, u32>,
        streams: Vec<(String, VecDeque<Op<Msg>>)>,
        log: Vec<(String, Op<Msg>)>,
    }

    impl Sim {
        fn new() -> Sim {
            Sim {
                mem: HashMap::new(),
                streams: Vec::new(),
                log: Vec::new(),
            }
        }

        fn stream(&mut self, name: &str) -> usize {
            match self.streams.iter().position(|(n, _)| n == name) {
                Some(i) => i,
                None => {
                    self.streams.push((name.to_string(), VecDeque::new()));
                    self.streams.len() - 1
                }
            }
        }

        fn push(&mut self, name: &str, ops: impl IntoIterator<Item = Op<Msg>>) {
            let i = self.stream(name);
            self.streams[i].1.extend(ops);
        }

        /// Runs what can run; the names of the streams left waiting.
        fn run(&mut self) -> Vec<String> {
            loop {
                let mut moved = false;
                for (name, ops) in &mut self.streams {
                    while let Some(&op) = ops.front() {
                        match op {
                            Op::Mem(MemOp::Wait { addr: at, value }) => {
                                let v = self.mem.get(&at).copied().unwrap_or(0);
                                if (v.wrapping_sub(value) as i32) < 0 {
                                    break;
                                }
                            }
                            Op::Mem(MemOp::Write { addr: at, value }) => {
                                self.mem.insert(at, value);
                            }
                            Op::Copy(_) => {}
                        }
                        self.log.push((name.clone(), op));
                        ops.pop_front();
                        moved = true;
                    }
                }
                if !moved {
                    return self
                        .streams
                        .iter()
                        .filter(|(_, ops)| !ops.is_empty())
                        .map(|(n, _)| n.clone())
                        .collect();
                }
            }
        }

        fn stuck(&self) -> Vec<String> {
            self.streams
                .iter()
                .filter(|(_, ops)| !ops.is_empty())
                .map(|(n, _)| n.clone())
                .collect()
        }

        fn at(&self, name: &str, op: Op<Msg>) -> usize {
            self.log
                .iter()
                .position(|(n, o)| n == name && *o == op)
                .unwrap_or_else(|| panic!("{name} never ran {op:?}"))
        }
    }

    fn words(n: usize) -> Words {
        Words {
            flags: (0..n as u64).map(|r| (r + 1) << 20).collect(),
            srv: 1 << 40,
            leader: 0,
            full: true,
        }
    }

    /// One group of one rank: (sends to, receives from).
    type Group = (Vec<usize>, Vec<usize>);

    /// Queues every rank's groups as `Processes::p2p` does, and runs
    /// them with the server as its thread serves: requests posted in the
    /// order `order` (receiver, sender) gives, each queued on the server's
    /// one stream once the words it needs have reached it, seen on the
    /// host between runs of the streams. `pull` says which receivers pull
    /// (their memory cannot be shared). Returns the simulation, run until
    /// nothing can go on, and each message.
    fn queue(
        w: &Words,
        program: &[Vec<Group>],
        pull: &[usize],
        order: Option<&[(usize, usize)]>,
    ) -> (Sim, Vec<Msg>) {
        let n = w.nranks();
        let mut sim = Sim::new();
        let (mut sent, mut received) = (vec![vec![0u64; n]; n], vec![vec![0u64; n]; n]);
        let mut requests = Vec::new();
        let mut msgs = Vec::new();
        for (me, groups) in program.iter().enumerate() {
            let name = format!("rank {me}");
            for (sends, recvs) in groups {
                let (mut frees, mut waits, mut ends) = (Vec::new(), Vec::new(), Vec::new());
                let mut pushes = Vec::new();
                for &p in sends {
                    sent[me][p] += 1;
                    let k = sent[me][p];
                    if !pushed(w, me, p, pull) {
                        let store = w.send(me, p, k);
                        if me == w.leader && p != me && w.served(me, p) {
                            // Stored once the receiver's answer came.
                            pushes.push(store);
                        } else {
                            sim.push(&name, [store]);
                        }
                        ends.push(w.send_end(me, p, k));
                    } else {
                        pushes.extend(w.push(p, k, (me, p, k)));
                    }
                }
                for &q in recvs {
                    received[q][me] += 1;
                    let k = received[q][me];
                    msgs.push((q, me, k));
                    if pushed(w, q, me, pull) {
                        let [free, landed] = w.recv_pushed(me, k);
                        frees.push(free);
                        waits.push(landed);
                    } else if w.served(q, me) {
                        let pulls = pull.contains(&me);
                        // The leader's messages pulled: the leader's
                        // stream stores their READY, the server nothing.
                        if q != w.leader {
                            requests.push((me, q, k, pulls));
                        }
                        if pulls {
                            waits.extend(w.recv_pull(q, me, k, (q, me, k)));
                        } else {
                            // As `Processes::p2p`: every free first.
                            let [free, landed] = w.recv_copied(q, me, k);
                            frees.push(free);
                            waits.push(landed);
                        }
                    } else {
                        waits.extend(w.recv_pull(q, me, k, (q, me, k)));
                    }
                }
                sim.push(&name, frees);
                sim.push(&name, pushes);
                sim.push(&name, waits);
                sim.push(&name, ends);
            }
        }
        if let Some(order) = order {
            let key = |r: &(usize, usize, u64, bool)| {
                order.iter().position(|&(rr, q)| rr == r.0 && q == r.1)
            };
            requests.sort_by_key(|r| (key(r), r.2));
        }
        let mut backlog = Backlog::new(n);
        for (r, q, k, pulls) in requests {
            backlog.push(Pending {
                q,
                r,
                k,
                copy: !pulls,
                work: (!pulls).then_some((q, r, k)),
            });
        }
        loop {
            sim.run();
            let mem = &sim.mem;
            let ready =
                backlog.take_ready(|i| mem.get(&(w.srv + 8 * i as u64)).copied().unwrap_or(0));
            if ready.is_empty() {
                break;
            }
            for p in ready {
                sim.push("server", w.serve(p.q, p.r, p.k, p.work));
            }
        }
        assert!(backlog.is_empty() || !sim.stuck().is_empty());
        (sim, msgs)
    }

    /// Whether `q`'s messages to `r` are written by `q`'s own stream: the
    /// leader's, to a served rank whose buffer can be shared (not in
    /// `pull`), as `Processes::p2p` decides from the receiver's answer.
    fn pushed(w: &Words, q: usize, r: usize, pull: &[usize]) -> bool {
        q == w.leader && r != q && w.served(q, r) && !pull.contains(&r)
    }

    /// Each message was copied once both ranks' streams had reached it,
    /// and before either went past it.
    fn check_order(w: &Words, sim: &Sim, msgs: &[Msg], pull: &[usize]) {
        for &(q, r, k) in msgs {
            let (sender, receiver) = (format!("rank {q}"), format!("rank {r}"));
            if pushed(w, q, r, pull) {
                let copy = sim.at(&sender, Op::Copy((q, r, k)));
                let [free, landed] = w.recv_pushed::<Msg>(r, k);
                assert!(sim.at(&receiver, free) < copy, "{q}->{r} #{k}");
                assert!(copy < sim.at(&receiver, landed), "{q}->{r} #{k}");
                continue;
            }
            let pulls = !w.served(q, r) || pull.contains(&r);
            let copier = if pulls {
                receiver.clone()
            } else {
                "server".to_string()
            };
            let copy = sim.at(&copier, Op::Copy((q, r, k)));
            assert!(sim.at(&sender, w.send(q, r, k)) < copy, "{q}->{r} #{k}");
            assert!(copy < sim.at(&sender, w.send_end(q, r, k)), "{q}->{r} #{k}");
            if !pulls {
                let [rready, landed] = w.recv_copied::<Msg>(q, r, k);
                assert!(sim.at(&receiver, rready) < copy, "{q}->{r} #{k}");
                assert!(copy < sim.at(&receiver, landed), "{q}->{r} #{k}");
            }
        }
    }

    #[test]
    fn a_sendrecv_ring_and_an_all_to_all_complete_in_order() {
        for (n, full) in [2, 3, 4].into_iter().flat_map(|n| [(n, true), (n, false)]) {
            // Without `full` the server copies nothing: the leader's
            // messages are the leader's stream's, the rest pulled.
            let w = Words { full, ..words(n) };
            let mut program = vec![Vec::new(); n];
            for (me, groups) in program.iter_mut().enumerate() {
                for _ in 0..3 {
                    groups.push((vec![(me + 1) % n], vec![(me + n - 1) % n]));
                }
                // A rank other than the leader sends its own block too
                // (`SharedGpu::routes_self`); the leader copies its own.
                let peers: Vec<usize> = (0..n).filter(|&p| p != me || me != w.leader).collect();
                groups.push((peers.clone(), peers));
            }
            for pull in [vec![], vec![1]] {
                let (sim, msgs) = queue(&w, &program, &pull, None);
                assert_eq!(sim.stuck(), Vec::<String>::new(), "{n} ranks stuck");
                check_order(&w, &sim, &msgs, &pull);
                assert!(full || sim.log.iter().all(|(s, _)| s != "server"));
            }
        }
    }

    #[test]
    fn two_ranks_that_send_each_other_in_one_group_do_not_wait_on_each_other() {
        let w = words(3);
        let program = vec![
            vec![(vec![], vec![1])],
            vec![(vec![2], vec![2]), (vec![2, 0], vec![2])],
            vec![(vec![1], vec![1]), (vec![1], vec![1])],
        ];
        let (sim, msgs) = queue(&w, &program, &[], None);
        assert_eq!(sim.stuck(), Vec::<String>::new());
        check_order(&w, &sim, &msgs, &[]);
    }

    #[test]
    fn requests_posted_before_the_ones_they_depend_on_do_not_block_them() {
        // Rank 2 first receives from rank 3, then sends to rank 1. Rank
        // 1's request for rank 2's message comes to the server before rank
        // 2's for rank 3's: a stream that waited on the GPU for requests in
        // arrival order would wait for rank 2's send before the copy rank 2
        // waits for. The host keeps the first pending and serves the
        // second.
        let w = words(4);
        let program = vec![
            vec![],
            vec![(vec![], vec![2])],
            vec![(vec![], vec![3]), (vec![1], vec![])],
            vec![(vec![2], vec![])],
        ];
        let (sim, msgs) = queue(&w, &program, &[], Some(&[(1, 2), (2, 3)]));
        assert_eq!(sim.stuck(), Vec::<String>::new());
        check_order(&w, &sim, &msgs, &[]);
        assert!(
            sim.at("server", Op::Copy((3, 2, 1))) < sim.at("server", Op::Copy((2, 1, 1))),
            "served in the order the words came, not posted"
        );
    }

    #[test]
    fn the_backlog_serves_what_is_ready_in_any_order_and_keeps_each_pair_in_order() {
        let n = 3;
        let mut words = vec![0u32; 2 * n * n];
        let post = |b: &mut Backlog<&str>, q, r, k, copy, work| {
            b.push(Pending {
                q,
                r,
                k,
                copy,
                work,
            })
        };
        let mut b = Backlog::new(n);
        post(&mut b, 1, 2, 1, true, "1->2 #1");
        post(&mut b, 0, 1, 1, true, "0->1 #1");
        post(&mut b, 2, 1, 1, false, "2->1 #1 pulled");
        let works =
            |ps: Vec<Pending<&'static str>>| ps.into_iter().map(|p| p.work).collect::<Vec<_>>();
        // Nothing stored yet: nothing goes.
        assert!(b.take_ready(|i| words[i]).is_empty());
        // A copy needs both words; a pull the sender's only.
        words[sready_word(n, 1, 2)] = 1;
        words[sready_word(n, 2, 1)] = 1;
        assert_eq!(works(b.take_ready(|i| words[i])), vec!["2->1 #1 pulled"]);
        // The last posted is ready first, then the first.
        words[sready_word(n, 0, 1)] = 1;
        words[rready_word(n, 0, 1)] = 1;
        assert_eq!(works(b.take_ready(|i| words[i])), vec!["0->1 #1"]);
        words[rready_word(n, 1, 2)] = 1;
        assert_eq!(works(b.take_ready(|i| words[i])), vec!["1->2 #1"]);
        assert!(b.is_empty());
        // A pair's later request waits behind its earlier one even where
        // its own words are there (a pull needs no RECV READY).
        post(&mut b, 1, 2, 2, true, "1->2 #2");
        post(&mut b, 1, 2, 3, false, "1->2 #3 pulled");
        words[sready_word(n, 1, 2)] = 3;
        assert!(b.take_ready(|i| words[i]).is_empty());
        words[rready_word(n, 1, 2)] = 2;
        assert_eq!(
            works(b.take_ready(|i| words[i])),
            vec!["1->2 #2", "1->2 #3 pulled"]
        );
        // Wrapping: message 2^32 + 1 is word value 1, past u32::MAX.
        let k = (1u64 << 32) + 1;
        post(&mut b, 2, 0, k, false, "2->0 wrapped");
        words[sready_word(n, 2, 0)] = u32::MAX;
        assert!(b.take_ready(|i| words[i]).is_empty(), "MAX is before 1");
        words[sready_word(n, 2, 0)] = 1;
        assert_eq!(works(b.take_ready(|i| words[i])), vec!["2->0 wrapped"]);
        assert!(reached(5, u32::MAX - 3), "past the wrap");
        assert!(!reached(u32::MAX - 3, 5));
        assert!(reached(7, 7));
    }

    #[test]
    fn a_receiver_that_asks_after_the_leader_gave_up_pulls() {
        let f = Forwards::default();
        let e = Exported {
            handle: crate::cuda::IpcMemHandle([7; 64]),
            offset: 0,
            id: 1,
        };
        // Asked first: the leader pushes, whether it waits or gives up.
        assert!(f.ask(1, 1, Some(e)));
        assert_eq!(f.take(1, 1), Some(Some(e)));
        assert!(f.ask(1, 2, Some(e)));
        assert_eq!(f.give_up(1, 2), Some(e));
        // A receiver whose buffer cannot be shared pulls.
        assert!(!f.ask(1, 3, None));
        assert_eq!(f.take(1, 3), Some(None));
        // Given up first: nothing to take, and the late receiver pulls.
        assert_eq!(f.give_up(2, 1), None);
        assert_eq!(f.take(2, 1), None);
        assert!(!f.ask(2, 1, Some(e)));
        assert_eq!(f.take(2, 1), None, "the answer is not left behind");
        assert!(f.lock().is_empty());
    }

    #[test]
    fn every_stream_waits_on_its_own_words() {
        let n = MAX_SERVED;
        let w = words(n);
        let mut seen = std::collections::HashSet::new();
        for q in 0..n {
            for r in (0..n).filter(|&r| r != q) {
                for at in [w.sready(q, r), w.rready(q, r)] {
                    assert!(at >= w.srv && at + 8 <= w.srv + 16 * (n * n) as u64);
                    assert!(seen.insert(at), "word {at:#x} used twice");
                }
                let mine = |rank: usize, op: Op<()>| {
                    if let Op::Mem(MemOp::Wait { addr: at, .. }) = op {
                        assert!(at >= w.flags[rank] && at < w.flags[rank] + (1 << 20));
                    }
                };
                mine(q, w.send_end(q, r, 1));
                for op in w.recv_copied(q, r, 1) {
                    mine(r, op);
                }
                for op in w.recv_pull(q, r, 1, ()) {
                    mine(r, op);
                }
                if q == w.leader {
                    for op in w.push(r, 1, ()) {
                        mine(q, op);
                    }
                    for op in w.recv_pushed::<()>(r, 1) {
                        mine(r, op);
                    }
                }
                for op in [w.serve(q, r, 1, Some(())), w.serve(q, r, 1, None)].concat() {
                    assert!(
                        !matches!(op, Op::Mem(MemOp::Wait { .. })),
                        "the server never waits"
                    );
                }
            }
        }
        // Without a server every receiver pulls, and senders signal it.
        let w = Words { srv: 0, ..words(3) };
        assert!(!w.served(2, 1) && !w.served(0, 1));
        assert_eq!(w.send::<()>(2, 1, 5), Op::store(w.ready(2, 1), 5));
    }
}
