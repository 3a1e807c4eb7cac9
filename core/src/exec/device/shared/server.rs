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
use crate::cuda::{ipc, Context, HostMapping, KernelSet, Stream};
use crate::error::{Error, Result};

use super::mailbox::Mailbox;
use super::records::{Request, Served};
use super::words::{enqueue, Backlog, Move, Op, Pending, Words};

const SPIN: Duration = Duration::from_micros(100);
const YIELD: Duration = Duration::from_millis(2);
const STEP: Duration = Duration::from_micros(20);
const NAP: Duration = Duration::from_millis(50);

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
    use super::*;

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
}
