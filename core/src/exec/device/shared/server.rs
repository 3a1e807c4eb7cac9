//! The leader's p2p server: send/recv between processes that share one GPU
//! without MPS, with every copy in the leader's context.
//!
//! A receiver that pulled a message with its own kernel made the GPU switch
//! contexts for each message once two processes had kernels queued (a
//! sendrecv ring of 4 ranks took ~600 us per 8-byte step). Instead a thread
//! of the leader's process serves every message whose receiver is another
//! process: the receiver posts a copy request into its ring of the host
//! mailbox (`Mailbox::post_request`), the server maps both buffers and
//! queues, in the leader's context, a wait for the sender's READY, a wait
//! for the receiver's RECV READY (its buffer may be overwritten), the copy,
//! and the two stores that end the message: the receiver's READY (the data
//! is in its buffer) and the sender's DONE (its buffer is free). The
//! leader receives with its own kernel on its own stream, as before: that
//! is the leader's context already. Other ranks' streams only store and
//! wait on words, and every stream waits on its own process's words only:
//! the server's on the leader's server words (`Words::srv`), which other
//! ranks' streams store into through CUDA IPC, so that a release (see
//! `super::super::stop`) still ends each wait by storing into the waiter's
//! own memory.
//!
//! Where the server cannot copy (the receiver's memory is not shareable
//! through CUDA IPC, the receiver's stream is being captured, or a buffer
//! cannot be mapped in the leader's process without waiting for the GPU:
//! the context's streams may wait for requests this thread has yet to
//! answer, see `ipc::map_kept_now`) it only passes the sender's
//! READY on to the receiver, which then pulls with its own kernel as
//! before; the sender's stream does the same in both cases, so it never
//! needs to know which.
//!
//! Order. The server queues each ordered pair's messages (sender, receiver)
//! on a stream of the pair's own, created at its first message. Message k
//! of a pair waits only for the sender's stream to reach its k-th send and
//! the receiver's stream its k-th receive of that pair, exactly what a
//! receiver pulling with its own kernel waited for, and the messages before
//! it on its stream are the pair's earlier ones, which both ranks' streams
//! order before it anyway: the server adds no wait that the program did not
//! have. One stream for all requests in arrival order would: a receiver's
//! request may arrive before the request that its sender's stream must see
//! done before it reaches that send (a sender that first receives from a
//! third rank whose host is slower), and the earlier request would then
//! block the later forever (see the tests). The server's host never waits
//! for the device: it takes each request as it comes, from each receiver's
//! ring in that receiver's order.
//!
//! Wake-up. The thread polls the rings: it spins for `SPIN` after its last
//! request (a request is then seen within a microsecond), then sleeps on a
//! doorbell word of the segment (a futex shared between the processes) that
//! a receiver rings after posting a request (`Mailbox::doze`): a request
//! after a pause costs one wake-up, tens of microseconds, and an idle
//! communicator costs a wake-up every `NAP` (to notice a stop).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cuda::{ipc, Context, KernelSet, MemOp, RawStream, Stream};
use crate::error::{Error, Result};

use super::super::stop::Awaited;
use super::mailbox::{Mailbox, Request, Served, Src};
use super::{P2P_DONE, P2P_READY};

/// The most ranks the server serves: its words take 8 bytes per ordered
/// pair (32 KiB at 64 ranks). Larger groups pull with their own kernels.
pub(super) const MAX_SERVED: usize = 64;

const SPIN: Duration = Duration::from_micros(100);
const NAP: Duration = Duration::from_millis(50);

/// Bytes of the leader's server words for `nranks` ranks.
pub(super) fn words_bytes(nranks: usize) -> usize {
    8 * nranks * nranks
}

/// One stream operation of the protocol; `C` describes a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op<C> {
    /// Later work waits until the word at `at` reaches `value`.
    Wait {
        at: u64,
        value: u32,
    },
    Store {
        at: u64,
        value: u32,
    },
    Copy(C),
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
    /// The leader's server words, 0 where there is no server (too many
    /// ranks): every receiver then pulls.
    pub srv: u64,
    pub leader: usize,
}

impl Words {
    fn nranks(&self) -> usize {
        self.flags.len()
    }

    /// Whether the server serves `r`'s receives (the leader receives with
    /// its own kernel: it is the leader's context already).
    pub fn served(&self, r: usize) -> bool {
        self.srv != 0 && r != self.leader
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
        self.srv + 4 * (q * self.nranks() + r) as u64
    }

    /// In the server's words: `r`'s stream has reached its receive k from
    /// `q` (its buffer may be overwritten).
    pub fn rready(&self, q: usize, r: usize) -> u64 {
        let n = self.nranks();
        self.srv + 4 * (n * n + q * n + r) as u64
    }

    /// Sender `q`'s stream, where its `k`-th message to `r` is ready.
    pub fn send<C>(&self, q: usize, r: usize, k: u64) -> Op<C> {
        let at = if self.served(r) {
            self.sready(q, r)
        } else {
            self.ready(q, r)
        };
        Op::Store {
            at,
            value: k as u32,
        }
    }

    /// Sender `q`'s stream, after the group: its buffer is free again.
    pub fn send_end<C>(&self, q: usize, r: usize, k: u64) -> Op<C> {
        Op::Wait {
            at: self.done(q, r),
            value: k as u32,
        }
    }

    /// Receiver `r`'s stream, for `q`'s `k`-th message, which the server
    /// copies.
    pub fn recv_copied<C>(&self, q: usize, r: usize, k: u64) -> [Op<C>; 2] {
        let value = k as u32;
        [
            Op::Store {
                at: self.rready(q, r),
                value,
            },
            Op::Wait {
                at: self.ready(q, r),
                value,
            },
        ]
    }

    /// Receiver `r`'s stream, for `q`'s `k`-th message, which it pulls.
    pub fn recv_pull<C>(&self, q: usize, r: usize, k: u64, copy: C) -> [Op<C>; 3] {
        let value = k as u32;
        [
            Op::Wait {
                at: self.ready(q, r),
                value,
            },
            Op::Copy(copy),
            Op::Store {
                at: self.done(q, r),
                value,
            },
        ]
    }

    /// The server's stream of the pair, for `q`'s `k`-th message to `r`:
    /// the copy, or (`None`) only the receiver's READY for it to pull.
    pub fn serve<C>(&self, q: usize, r: usize, k: u64, copy: Option<C>) -> Vec<Op<C>> {
        let value = k as u32;
        let sready = Op::Wait {
            at: self.sready(q, r),
            value,
        };
        let ready = Op::Store {
            at: self.ready(q, r),
            value,
        };
        match copy {
            None => vec![sready, ready],
            Some(c) => vec![
                sready,
                Op::Wait {
                    at: self.rready(q, r),
                    value,
                },
                Op::Copy(c),
                ready,
                Op::Store {
                    at: self.done(q, r),
                    value,
                },
            ],
        }
    }
}

/// Enqueues `ops` on `stream`; each wait, on a word of the buffer at
/// `base`, is recorded in `awaited` by its offset there.
///
/// # Safety
/// Every word is 4-byte aligned device memory mapped in the stream's
/// context and alive until the stream has run the operations; every copy's
/// buffers are valid for its bytes until then.
#[allow(unsafe_code)] // stream memory operations on raw device addresses
pub(super) unsafe fn enqueue(
    ops: &[Op<Move>],
    stream: RawStream,
    kernels: &KernelSet,
    base: u64,
    awaited: &mut Awaited,
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
            Op::Wait { at, value } => {
                debug_assert!(at >= base, "a wait on another process's word");
                batch.push(MemOp::Wait { addr: at, value });
                awaited.wait(at - base, value);
            }
            Op::Store { at, value } => batch.push(MemOp::Write { addr: at, value }),
            Op::Copy(m) => {
                flush(&mut batch)?;
                kernels.copy(m.dst, m.src, m.bytes, stream)?;
            }
        }
    }
    flush(&mut batch)
}

/// The server thread of one leader's `Processes`; stopped and joined on
/// drop.
pub(super) struct Server {
    quit: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// To ring the doorbell when stopping.
    bell: Arc<Mailbox>,
    /// What the server's streams wait for in its words.
    awaited: Arc<Mutex<Awaited>>,
}

impl Server {
    /// Starts serving the rings of every rank but the leader. `stop` (the
    /// communicator's) ends it as the drop does.
    pub fn start(
        ctx: &Arc<Context>,
        mailbox: Arc<Mailbox>,
        words: Words,
        stop: Arc<AtomicBool>,
    ) -> Result<Server> {
        let kernels = KernelSet::shared(ctx)?;
        // Loading a module waits for the context's work, which may soon
        // include streams waiting for this server: load the copy now.
        kernels.prepare_copy()?;
        let quit = Arc::new(AtomicBool::new(false));
        let awaited = Arc::new(Mutex::new(Awaited::default()));
        let n = words.nranks();
        let bell = mailbox.clone();
        let mut serving = Serving {
            ctx: ctx.clone(),
            kernels,
            mailbox,
            next: vec![1; n],
            words,
            streams: HashMap::new(),
            awaited: awaited.clone(),
        };
        let q = quit.clone();
        let thread = std::thread::Builder::new()
            .name("oxccl-p2p-server".into())
            .spawn(move || serving.run(&q, &stop))
            .map_err(|e| Error::System(format!("starting the shared-GPU p2p server: {e}")))?;
        Ok(Server {
            quit,
            thread: Some(thread),
            bell,
            awaited,
        })
    }

    /// (offset in the server's words, value) pairs whose stores release
    /// every wait the server queued.
    pub fn releases(&self) -> Vec<(u64, u32)> {
        self.awaited
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .releases()
    }

    /// Ends the thread and waits for it; what it queued stays queued.
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

/// The server thread's state.
struct Serving {
    ctx: Arc<Context>,
    kernels: Arc<KernelSet>,
    mailbox: Arc<Mailbox>,
    words: Words,
    /// Each rank's next request.
    next: Vec<u64>,
    /// One per ordered pair (sender, receiver) served so far.
    streams: HashMap<(usize, usize), Stream>,
    awaited: Arc<Mutex<Awaited>>,
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
            if last.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let mailbox = self.mailbox.clone();
            if mailbox.doze(NAP, || self.poll()) {
                last = Instant::now();
            }
        }
    }

    /// Serves every request posted so far; whether there was one.
    fn poll(&mut self) -> bool {
        let mut any = false;
        for r in 0..self.words.nranks() {
            if !self.words.served(r) {
                continue;
            }
            while let Some(req) = self.mailbox.poll_request(r, self.next[r]) {
                let n = self.next[r];
                let answer = match req {
                    Ok(req) => self.serve(r, &req),
                    Err(e) => Served::Failed(e.message().to_string()),
                };
                self.mailbox.answer_request(r, n, &answer);
                self.next[r] += 1;
                any = true;
            }
        }
        any
    }

    /// Queues receiver `r`'s request.
    fn serve(&mut self, r: usize, req: &Request) -> Served {
        let (q, k, leader) = (req.from, req.k, self.words.leader);
        // q == r: a rank's message to itself (all_to_all's own block),
        // copied here for the same reason as the others.
        if q >= self.words.nranks() {
            return Served::Failed(format!(
                "rank {r} asked the p2p server (rank {leader}) for message {k} from rank {q}, which is not a rank of its {}",
                self.words.nranks()
            ));
        }
        let copy = req.dst.and_then(|dst| {
            let mut bufs = vec![dst];
            if let Src::Ipc(e) = req.src {
                bufs.push(e);
            }
            // Letting go of kept mappings synchronizes the context, whose
            // streams may wait for requests this thread has yet to answer:
            // where that is needed, the receiver pulls instead.
            match ipc::map_kept_now(&self.ctx, &bufs) {
                Ok(Some(a)) => Some(Move {
                    dst: a[0],
                    src: match req.src {
                        Src::Leader(addr) => addr,
                        Src::Ipc(_) => a[1],
                    },
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
        });
        let copied = copy.is_some();
        let ops = self.words.serve(q, r, k, copy);
        let queued = (|| {
            let stream = match self.streams.get(&(q, r)) {
                Some(s) => s.handle(),
                None => {
                    let s = Stream::new(&self.ctx)?;
                    let h = s.handle();
                    self.streams.insert((q, r), s);
                    h
                }
            };
            let mut awaited = self.awaited.lock().unwrap_or_else(PoisonError::into_inner);
            #[allow(unsafe_code)]
            // SAFETY: the words are the leader's server words and every
            // rank's flags, mapped here until the leader's `Processes`
            // goes, which stops this thread first and synchronizes the
            // context before freeing them (the window's drop); the copy's
            // buffers are the ranks' (valid for the message by the
            // send/recv contract), mapped through the process's kept table,
            // which lets a mapping go only after a synchronize; the sender
            // and receiver touch them again only after this stream's
            // stores.
            unsafe {
                enqueue(&ops, stream, &self.kernels, self.words.srv, &mut awaited)
            }
        })();
        match queued {
            Ok(()) if copied => Served::Copied,
            Ok(()) => Served::Pull,
            Err(e) => Served::Failed(format!(
                "the p2p server (rank {leader}) could not queue rank {q}'s message {k} to rank {r}: {e}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

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
                            Op::Wait { at, value } => {
                                let v = self.mem.get(&at).copied().unwrap_or(0);
                                if (v.wrapping_sub(value) as i32) < 0 {
                                    break;
                                }
                            }
                            Op::Store { at, value } => {
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
        }
    }

    /// One group of one rank: (sends to, receives from).
    type Group = (Vec<usize>, Vec<usize>);

    /// Queues every rank's groups as `Processes::p2p` does, and the
    /// server's work as it would come; `pull` says which receivers pull
    /// (their memory cannot be shared), `one_stream` puts every request
    /// on a single server stream in the order `order` (receiver, sender)
    /// gives, else on per-pair streams. Returns the simulation and each
    /// message.
    fn queue(
        w: &Words,
        program: &[Vec<Group>],
        pull: &[usize],
        one_stream: bool,
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
                for &p in sends {
                    sent[me][p] += 1;
                    let k = sent[me][p];
                    sim.push(&name, [w.send(me, p, k)]);
                    ends.push(w.send_end(me, p, k));
                }
                for &q in recvs {
                    received[q][me] += 1;
                    let k = received[q][me];
                    msgs.push((q, me, k));
                    if w.served(me) {
                        let pulls = pull.contains(&me);
                        requests.push((me, q, k, pulls));
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
        for (r, q, k, pulls) in requests {
            let stream = if one_stream {
                "server".to_string()
            } else {
                format!("server {q}->{r}")
            };
            let copy = (!pulls).then_some((q, r, k));
            sim.push(&stream, w.serve(q, r, k, copy));
        }
        (sim, msgs)
    }

    /// Each message was copied once both ranks' streams had reached it,
    /// and before either went past it.
    fn check_order(w: &Words, sim: &Sim, msgs: &[Msg], pull: &[usize]) {
        for &(q, r, k) in msgs {
            let (sender, receiver) = (format!("rank {q}"), format!("rank {r}"));
            let pulls = !w.served(r) || pull.contains(&r);
            let copier = if pulls {
                receiver.clone()
            } else {
                format!("server {q}->{r}")
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
        for n in [2, 3, 4] {
            let w = words(n);
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
                let (mut sim, msgs) = queue(&w, &program, &pull, false, None);
                assert_eq!(sim.run(), Vec::<String>::new(), "{n} ranks stuck");
                check_order(&w, &sim, &msgs, &pull);
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
        let (mut sim, msgs) = queue(&w, &program, &[], false, None);
        assert_eq!(sim.run(), Vec::<String>::new());
        check_order(&w, &sim, &msgs, &[]);
    }

    #[test]
    fn a_stream_per_pair_avoids_the_deadlock_of_one_stream_in_arrival_order() {
        // Rank 2 first receives from the leader, then sends to rank 1.
        // Rank 1's request for rank 2's message comes to the server before
        // rank 2's host asks for the leader's: one stream would wait for
        // rank 2's send before the copy rank 2 waits for.
        let w = words(3);
        let program = vec![
            vec![(vec![2], vec![])],
            vec![(vec![], vec![2])],
            vec![(vec![], vec![0]), (vec![1], vec![])],
        ];
        let order = [(1, 2), (2, 0)];
        let (mut sim, _) = queue(&w, &program, &[], true, Some(&order));
        let stuck = sim.run();
        assert!(stuck.contains(&"server".to_string()), "{stuck:?}");
        let (mut sim, msgs) = queue(&w, &program, &[], false, Some(&order));
        assert_eq!(sim.run(), Vec::<String>::new());
        check_order(&w, &sim, &msgs, &[]);
    }

    #[test]
    fn every_stream_waits_on_its_own_words() {
        let n = MAX_SERVED;
        let w = words(n);
        let mut seen = std::collections::HashSet::new();
        for q in 0..n {
            for r in (0..n).filter(|&r| r != q) {
                for at in [w.sready(q, r), w.rready(q, r)] {
                    assert!(at >= w.srv && at + 4 <= w.srv + words_bytes(n) as u64);
                    assert!(seen.insert(at), "word {at:#x} used twice");
                }
                let mine = |rank: usize, op: Op<()>| {
                    if let Op::Wait { at, .. } = op {
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
                for op in w.serve(q, r, 1, Some(())) {
                    if let Op::Wait { at, .. } = op {
                        assert!(at >= w.srv && at < w.srv + words_bytes(n) as u64);
                    }
                }
            }
        }
        // Without a server every receiver pulls, and senders signal it.
        let w = Words { srv: 0, ..words(3) };
        assert!(!w.served(1));
        assert_eq!(
            w.send::<()>(2, 1, 5),
            Op::Store {
                at: w.ready(2, 1),
                value: 5
            }
        );
    }
}
