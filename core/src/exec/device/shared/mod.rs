//! Collectives between processes whose ranks all share one GPU, without MPS.
//! The GPU then runs one process's kernels at a time, so a kernel that
//! waits for another process's kernel waits for the next time slice
//! (milliseconds), and even a copy-engine copy in one process next to a
//! kernel in another costs a context switch each time (a cross-process
//! round trip measured 283 us on an H100). Stream memory operations (store
//! or wait on a word) cost none: 9.4 us per round trip, 20 us with a kernel
//! and a copy in one of the two processes.
//!
//! So one rank, the leader, runs the whole collective: it maps every rank's
//! buffers (CUDA IPC, handles posted through a host mailbox) and moves and
//! reduces the data with its own kernels (one launch per output block,
//! each reading up to 8 inputs and writing up to 8 outputs); every other
//! rank only stores "ready" on its stream and waits for the leader's
//! "done". Each signal is stored into the flag words of the rank that
//! waits for it, so every stream waits on its own memory only: a revoke
//! releases its own stream's waits by storing what they wait for, which no
//! other rank reads (see `super::stop`). Calls the leader cannot run this
//! way (graph capture, a rank whose kernels the profiler times, memory CUDA
//! IPC cannot share) go to every rank's kernels, which all ranks learn from
//! the leader's answer.
//!
//! Send/recv: the leader copies its own messages on its own stream (it
//! pulls what it receives and pushes what it sends), the others pull with
//! their own kernels; where asked (`OXCCL_SHARED_P2P=server`) a thread of
//! the leader's process copies the messages between other ranks too, so
//! that every rank but the leader only stores and waits on words (see
//! `P2pPath` and `server`).
//!
//! Ranks that are all threads of one process take the same fused launches
//! without IPC and without any host wait (see `local`): the last rank to
//! call a collective runs it.

mod local;
mod mailbox;
mod records;
mod server;
mod steps;
mod words;

use std::sync::Arc;
use std::time::Duration;

use crate::algo::Coll;
use crate::cuda::ipc::Exported;
use crate::cuda::{
    ipc, Context, DeviceBuffer, IpcMapping, IpcMemHandle, KernelSet, MemOp, RawStream, Registered,
};
use crate::dtype::{DataType, RedOp};
use crate::error::{Error, Result};
use crate::transport::shm::area::Area;

use super::oob::Oob;
use super::stop::Awaited;
use mailbox::Mailbox;
use records::{Answer, Buf, Post, Request, Served};
use server::{Forwards, Server, ServerWords};
use steps::Bufs;
use words::{Move, Op, Words};

/// Offsets of the words in each rank's flag buffer, each written by the
/// peer that signals and waited on by the buffer's rank: DONE, the
/// leader's end of the collective; per peer p, the messages p has made
/// ready for this rank (`P2P_READY + 8 p`), the messages p has taken from
/// this rank (`P2P_DONE + 8 p`), and in the leader's buffer p's READY for
/// the collective (`READY + 8 p`) and the leader's messages p's buffer is
/// free for (`P2P_FREE + 8 p`); in another rank's, the leader's messages
/// it has written into this rank's buffer (`PUSHED`).
const DONE: u64 = 64;
const P2P_READY: u64 = 256;
/// Ranks the shared-GPU path has words for.
const MAX_P2P: usize = 224;
const P2P_DONE: u64 = P2P_READY + 8 * MAX_P2P as u64;
const READY: u64 = P2P_DONE + 8 * MAX_P2P as u64;
const P2P_FREE: u64 = READY + 8 * MAX_P2P as u64;
const PUSHED: u64 = P2P_FREE + 8 * MAX_P2P as u64;
pub(super) const FLAG_BYTES: usize = PUSHED as usize + 8;

/// Whether this path should run for ranks that all share one GPU from
/// several processes: not under MPS (where the kernels run together),
/// unless `OXCCL_SHARED_GPU` says `leader` (this path) or `kernels`.
/// For ranks of one process (`local`) MPS changes nothing: their kernels
/// run together anyway, and one launch over every rank's buffers moves
/// each byte once where the ring moves it through FIFO slots.
pub(crate) fn wanted(local: bool) -> Result<bool> {
    Ok(
        match crate::config::ox::shared_gpu()?.as_deref().map(str::trim) {
            Some("leader") => true,
            Some("kernels") => false,
            _ if local => true,
            _ => {
                std::env::var_os("CUDA_MPS_PIPE_DIRECTORY").is_none()
                    && !std::path::Path::new("/tmp/nvidia-mps").exists()
            }
        },
    )
}

/// How send/recv between the processes runs, the leader's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum P2pPath {
    /// Each receiver pulls with its own kernel (`OXCCL_SHARED_P2P=pull`),
    /// which makes the GPU switch processes at each message.
    Pull,
    /// The default: the leader's stream writes its own messages and pulls
    /// what it receives, so 2 ranks exchange without a context switch;
    /// the others pull. A thread of the leader only hands it its
    /// receivers' buffers and queues nothing on the GPU.
    Leader,
    /// As `Leader`, and the thread also copies the messages between other
    /// ranks in the leader's context (`OXCCL_SHARED_P2P=server`). Its
    /// copies share the leader's context with the leader's streams, whose
    /// waits may hold them up: a context's streams share
    /// CUDA_DEVICE_MAX_CONNECTIONS hardware queues whatever their
    /// priorities (`core/examples/hw_queues.rs`), so it is opt-in, and
    /// refused under CUDA_DEVICE_MAX_CONNECTIONS=1, where every run hung.
    Server,
}

/// How long the leader's send waits on its host for the receiver to ask
/// for the message before letting it pull (`OXCCL_SHARED_PUSH_WAIT_US`,
/// 200 us): ranks that call a send/recv together are within it, and a
/// pull costs about a process switch (~300 us) anyway.
fn push_wait() -> Result<Duration> {
    static WAIT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    if let Some(w) = WAIT.get() {
        return Ok(*w);
    }
    let w = Duration::from_micros(crate::config::ox::shared_push_wait_us()?);
    Ok(*WAIT.get_or_init(|| w))
}

impl P2pPath {
    fn wanted(nranks: usize) -> Result<P2pPath> {
        let asked = crate::config::ox::shared_p2p()?.unwrap_or_default();
        let queues = || {
            std::env::var("CUDA_DEVICE_MAX_CONNECTIONS")
                .ok()
                .and_then(|v| v.trim().parse::<u32>().ok())
        };
        Ok(match asked.trim() {
            _ if nranks > words::MAX_SERVED => P2pPath::Pull,
            "pull" => P2pPath::Pull,
            "server" => match queues() {
                Some(q) if q < 2 => {
                    tracing::warn!(target: "oxccl::init", "OXCCL_SHARED_P2P=server is ignored under CUDA_DEVICE_MAX_CONNECTIONS={q}: the copy thread's stream would share rank 0's waiting stream's hardware queue and hang; rank 0 copies its own messages, the other ranks pull theirs");
                    P2pPath::Leader
                }
                _ => P2pPath::Server,
            },
            _ => P2pPath::Leader,
        })
    }

    fn code(self) -> u8 {
        match self {
            P2pPath::Pull => 0,
            P2pPath::Leader => 1,
            P2pPath::Server => 2,
        }
    }

    fn from_code(c: Option<&u8>) -> P2pPath {
        match c {
            Some(1) => P2pPath::Leader,
            Some(2) => P2pPath::Server,
            _ => P2pPath::Pull,
        }
    }
}

/// The path of ranks that all share one GPU: in one process, or each in a
/// process of its own.
pub(crate) enum SharedGpu {
    Local(local::LocalGpu),
    Processes(Box<Processes>),
}

impl SharedGpu {
    /// Every rank calls it; all of them in this process (`local`) or each
    /// in its own.
    pub fn setup(
        ctx: &Arc<Context>,
        oob: &dyn Oob,
        local: bool,
        timeout: Duration,
        stop: Arc<std::sync::atomic::AtomicBool>,
        max_blocks: usize,
    ) -> Result<SharedGpu> {
        Ok(if local {
            SharedGpu::Local(local::LocalGpu::setup(ctx, oob, max_blocks)?)
        } else {
            let p = Processes::setup(ctx, oob, timeout, stop, max_blocks)?;
            SharedGpu::Processes(Box::new(p))
        })
    }

    /// Device memory the path allocates on each rank (its flag words),
    /// all ranks in this process (`local`) or each in its own.
    pub fn flag_bytes(local: bool) -> usize {
        if local {
            local::FLAG_BYTES
        } else {
            FLAG_BYTES
        }
    }

    /// Closes this rank's mappings of other ranks' memory before a
    /// suspend (see [`Processes::unmap_peers`]); ranks of one process map
    /// nothing of each other.
    pub fn unmap_peers(&mut self) {
        if let SharedGpu::Processes(p) = self {
            p.unmap_peers();
        }
    }

    /// Releases every stream wait this rank enqueued (see
    /// [`Processes::release`]).
    pub fn release(&self) -> Result<()> {
        match self {
            SharedGpu::Local(l) => l.release(),
            SharedGpu::Processes(p) => p.release(),
        }
    }

    /// Runs `coll` the shared-GPU way, or returns `false` when every rank
    /// runs it on its own kernels instead (all ranks return the same).
    /// `timed`: the profiler wants this rank's kernel-channel times.
    #[allow(clippy::too_many_arguments)] // one collective's whole description
    pub fn run(
        &mut self,
        timed: bool,
        kernels: &KernelSet,
        coll: Coll,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: RedOp,
        stream: RawStream,
    ) -> Result<bool> {
        match self {
            SharedGpu::Local(l) => {
                l.run(timed, kernels, coll, send, recv, count, dtype, op, stream)
            }
            SharedGpu::Processes(p) => {
                p.run(timed, kernels, coll, send, recv, count, dtype, op, stream)
            }
        }
    }

    /// Whether this rank's messages to itself go through [`SharedGpu::p2p`]
    /// too: a copy by its own kernel would put a second process's work on
    /// the GPU beside the leader's, and each exchange would then wait for
    /// a context switch. The leader's own copies are in its context anyway.
    pub fn routes_self(&self) -> bool {
        match self {
            SharedGpu::Local(_) => false,
            SharedGpu::Processes(p) => p.me != p.leader && p.words.served(p.me, p.me),
        }
    }

    /// A group's sends and receives; returns those left to every rank's
    /// kernels. Ranks of one process leave them all there: their kernels
    /// run together, and the pairwise path below waits on the host for the
    /// sender, which one thread driving both ranks would never reach.
    /// `timed`: the profiler wants this rank's kernel-channel times.
    #[allow(clippy::type_complexity, clippy::too_many_arguments)] // the two lists left over
    pub fn p2p(
        &mut self,
        timed: bool,
        kernels: &KernelSet,
        sends: &[(usize, u64)],
        recvs: &[(usize, u64)],
        count: usize,
        dtype: DataType,
        stream: RawStream,
    ) -> Result<(Vec<(usize, u64)>, Vec<(usize, u64)>)> {
        match self {
            SharedGpu::Local(_) => Ok((sends.to_vec(), recvs.to_vec())),
            SharedGpu::Processes(p) => p.p2p(timed, kernels, sends, recvs, count, dtype, stream),
        }
    }
}

/// Every rank in a process of its own.
pub(crate) struct Processes {
    ctx: Arc<Context>,
    me: usize,
    leader: usize,
    nranks: usize,
    /// Calls made so far, the same count on every rank.
    seq: u64,
    /// Each rank's flag buffer and the server's words as this process
    /// addresses them (shared with the leader's server thread).
    words: Arc<Words>,
    mailbox: Arc<Mailbox>,
    /// Messages sent to and received from each rank so far.
    sent: Vec<u64>,
    received: Vec<u64>,
    /// What this rank's streams wait for in its own flag words.
    awaited: Awaited,
    _own: DeviceBuffer,
    flag_maps: Vec<IpcMapping>,
    /// Copy requests this rank has posted to the server.
    requests: u64,
    /// The leader's: its p2p server (stopped before anything it uses
    /// goes, see the drop).
    server: Option<Server>,
    /// The leader's: receivers' answers for its messages, from its server.
    forwards: Option<Arc<Forwards>>,
    /// This process's registration of the server's words (host memory of
    /// the mailbox segment) with CUDA, where there is a server.
    _srv_words: Option<Registered<ServerWords>>,
    /// Blocks a fused launch or a copy takes at most: the communicator's
    /// CTA budget.
    max_blocks: usize,
}

impl Drop for Processes {
    fn drop(&mut self) {
        if let Some(s) = &mut self.server {
            s.stop();
        }
    }
}

impl Processes {
    /// Every rank calls it; rank 0 leads. `timeout` bounds each wait for
    /// another rank on the host, and raising `stop` ends it at once.
    pub fn setup(
        ctx: &Arc<Context>,
        oob: &dyn Oob,
        timeout: Duration,
        stop: Arc<std::sync::atomic::AtomicBool>,
        max_blocks: usize,
    ) -> Result<Processes> {
        let (me, nranks, leader) = (oob.rank(), oob.nranks(), 0);
        let own = DeviceBuffer::alloc(ctx, FLAG_BYTES)?;
        own.fill_bytes(0)?;
        let name = format!(
            "/oxccl-gpu-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        );
        let bytes = Mailbox::bytes(nranks);
        let area = if me == leader {
            Some(Area::create_shared(&name, bytes)?)
        } else {
            None
        };
        let mut mine = own.ipc_handle()?.0.to_vec();
        if me == leader {
            // The leader's choice of send/recv path is everyone's.
            mine.push(P2pPath::wanted(nranks)?.code());
            mine.extend_from_slice(name.as_bytes());
        }
        let all = oob.allgather(&mine)?;
        let path = P2pPath::from_code(all[leader].get(64));
        let served = path != P2pPath::Pull;
        let area = match area {
            Some(a) => a,
            None => {
                let leader_name = all[leader]
                    .get(65..)
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .ok_or_else(|| Error::Remote(format!("rank {leader} sent no mailbox name")))?;
                Area::open_shared(leader_name, bytes)?
            }
        };
        let mut flags = vec![0u64; nranks];
        let mut flag_maps = Vec::new();
        for (p, h) in all.iter().enumerate() {
            if p == me {
                flags[p] = own.ptr();
                continue;
            }
            let h: [u8; 64] = h
                .get(..64)
                .and_then(|h| h.try_into().ok())
                .ok_or_else(|| Error::Remote(format!("rank {p} sent no flag handle")))?;
            let m = IpcMapping::open(ctx, &IpcMemHandle(h))
                .map_err(|e| e.context(format!("mapping rank {p}'s flags")))?;
            flags[p] = m.ptr();
            flag_maps.push(m);
        }
        // Everyone has mapped everything: the segment's name can go.
        oob.allgather(&[])?;
        area.unlink();
        let mailbox = Arc::new(Mailbox::new(area, me, nranks, timeout).with_stop(stop.clone()));
        // The server's words, which its thread polls on the host, are
        // stored by this process's streams: its own registration of them
        // (pinned, DEVICEMAP), whose device address stream memory writes
        // take (the driver's documented way for registered host memory).
        let srv_words = if served {
            let reg = Registered::new(ctx, ServerWords(mailbox.clone()))
                .map_err(|e| e.context("registering the shared-GPU p2p server's words"))?;
            Some(reg)
        } else {
            None
        };
        let words = Arc::new(Words {
            flags,
            srv: srv_words.as_ref().map_or(0, Registered::device_ptr),
            leader,
            full: path == P2pPath::Server,
        });
        let (server, forwards) = match &srv_words {
            Some(_) if me == leader => {
                let (s, f) = Server::start(ctx, mailbox.clone(), words.clone(), stop, max_blocks)?;
                (Some(s), Some(f))
            }
            _ => (None, None),
        };
        Ok(Processes {
            ctx: ctx.clone(),
            me,
            leader,
            nranks,
            seq: 0,
            words,
            mailbox,
            sent: vec![0; nranks],
            received: vec![0; nranks],
            awaited: Awaited::default(),
            _own: own,
            flag_maps,
            requests: 0,
            server,
            forwards,
            _srv_words: srv_words,
            max_blocks,
        })
    }

    /// How send/recv run, for the INFO line.
    pub(crate) fn p2p_path(&self) -> &'static str {
        match (self.words.srv != 0, self.words.full) {
            (false, _) => "each receiver pulls with its own kernel, so the GPU switches processes at each message (OXCCL_SHARED_P2P=pull)",
            (true, false) => "rank 0 copies its own messages on its stream, the other ranks pull theirs with their own kernels, each message between two of them waiting for the GPU to switch processes (hundreds of microseconds; under MPS every rank's kernels run together; OXCCL_SHARED_P2P=server: a thread of rank 0 copies those too; see README)",
            (true, true) => "a thread of rank 0 copies each message in rank 0's context (rank 0 copies its own on its stream), the others only signal (OXCCL_SHARED_P2P=server)",
        }
    }

    /// Closes this rank's mappings of other ranks' flag words before a
    /// suspend frees what each rank owns; nothing may be queued that uses
    /// them. The buffers other ranks posted stay mapped (the process's
    /// table of kept buffers, [`ipc::map_kept`]): they are the callers',
    /// which a suspend does not free.
    pub fn unmap_peers(&mut self) {
        // The server addresses them too.
        if let Some(s) = &mut self.server {
            s.stop();
        }
        self.flag_maps.clear();
    }

    /// Releases every stream wait this rank enqueued (a stop: the peers
    /// that would have signalled may be dead) by storing, on a stream of
    /// its own, the values they wait for into its own flag words. The
    /// collectives and messages they guarded did not complete: the
    /// communicator is stopped, and its callers are told so.
    pub fn release(&self) -> Result<()> {
        let stream = crate::cuda::Stream::new(&self.ctx)?;
        for (off, v) in self.awaited.releases() {
            #[allow(unsafe_code)]
            // SAFETY: the word is in this rank's own flag buffer, which
            // lives until the communicator goes (that synchronizes the
            // context first).
            unsafe {
                stream
                    .handle()
                    .write_u32(self.words.flags[self.me] + off, v)?;
            }
        }
        // The p2p server's stream never waits: nothing of it to release.
        tracing::debug!(target: "oxccl::coll", "rank {}: released {} stream wait word(s) of the shared-GPU path", self.me, self.awaited.releases().len());
        // The stream goes at once; the driver runs its stores first.
        Ok(())
    }

    /// The leader: a message its p2p server answered but could not copy
    /// (its receiver's stream went on without the data), once.
    fn server_failure(&self) -> Result<()> {
        match self.server.as_ref().and_then(Server::take_failure) {
            Some(msg) => Err(Error::System(msg)),
            None => Ok(()),
        }
    }

    fn export(&self, used: bool, ptr: u64) -> Result<Buf> {
        if !used {
            return Ok(Buf::Unused);
        }
        Ok(match ipc::export(&self.ctx, ptr)? {
            Some(e) => Buf::Shared(e),
            None => Buf::Private,
        })
    }

    /// This process's addresses of buffers other ranks posted for one
    /// call, valid together (0 for an unused one); `None` when one cannot
    /// have one.
    fn map(&self, bufs: &[Buf]) -> Option<Vec<u64>> {
        let mut shared = Vec::with_capacity(bufs.len());
        for b in bufs {
            match b {
                Buf::Unused => {}
                Buf::Private => return None,
                Buf::Shared(e) => shared.push(*e),
            }
        }
        let mut addrs = match ipc::map_kept(&self.ctx, &shared) {
            Ok(a) => a.into_iter(),
            Err(e) => {
                tracing::debug!(target: "oxccl::coll", "a shared-GPU peer's buffer cannot be mapped ({e}): this call runs on every rank's kernels");
                return None;
            }
        };
        Some(
            bufs.iter()
                .map(|b| match b {
                    Buf::Shared(_) => addrs.next().unwrap_or(0),
                    _ => 0,
                })
                .collect(),
        )
    }

    /// The leader's side of the handshake: every rank's buffers as the
    /// leader addresses them, or `None` when every rank runs its kernels.
    fn lead(
        &mut self,
        seq: u64,
        what: &str,
        capturing: bool,
        send: u64,
        recv: u64,
    ) -> Result<Option<Vec<Bufs>>> {
        let mut posts = Vec::with_capacity(self.nranks - 1);
        for r in (0..self.nranks).filter(|&r| r != self.me) {
            posts.push((r, self.mailbox.wait_post(r, seq, what)?));
        }
        let answer =
            |mb: &Mailbox, a: Answer| posts.iter().for_each(|(r, _)| mb.answer(*r, seq, a));
        let odd: Vec<String> = posts
            .iter()
            .filter(|(_, p)| p.what != what)
            .map(|(r, p)| format!("rank {r} called {}", p.what))
            .collect();
        if !odd.is_empty() {
            answer(&self.mailbox, Answer::Mismatch);
            return Err(Error::InvalidUsage(format!(
                "collective #{seq} on a GPU shared by {} ranks: rank {} called {what}, {}",
                self.nranks,
                self.me,
                odd.join(", ")
            )));
        }
        let mut bufs = vec![Bufs { send: 0, recv: 0 }; self.nranks];
        bufs[self.me] = Bufs { send, recv };
        let mut direct = !capturing && posts.iter().all(|(_, p)| !p.capturing);
        // Not covered: another communicator of this process, on another
        // thread, letting go of kept mappings between here and this call's
        // launch (its synchronize waits only for work already queued).
        if direct {
            let wanted: Vec<Buf> = posts.iter().flat_map(|(_, p)| [p.send, p.recv]).collect();
            match self.map(&wanted) {
                Some(addrs) => {
                    for ((r, _), a) in posts.iter().zip(addrs.chunks(2)) {
                        bufs[*r] = Bufs {
                            send: a[0],
                            recv: a[1],
                        };
                    }
                }
                None => direct = false,
            }
        }
        let a = if direct {
            Answer::Direct
        } else {
            Answer::Kernels
        };
        answer(&self.mailbox, a);
        Ok(direct.then_some(bufs))
    }

    /// Runs `coll` the shared-GPU way, or returns `false` when every rank
    /// runs it on its own kernels instead (all ranks return the same).
    #[allow(clippy::too_many_arguments)] // one collective's whole description
    pub fn run(
        &mut self,
        timed: bool,
        kernels: &KernelSet,
        coll: Coll,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: RedOp,
        stream: RawStream,
    ) -> Result<bool> {
        if self.nranks > MAX_P2P {
            return Ok(false);
        }
        self.server_failure()?;
        self.seq += 1;
        let seq = self.seq;
        // Flags compare as wrapping 32-bit words.
        let flag = seq as u32;
        let what = format!("{} of {count} x {dtype:?} ({op:?})", describe(coll));
        // A rank whose launches the profiler times (kernel-channel events)
        // needs its own kernels to run, as a graph capture does: only they
        // write the channels' clocks, so every rank then runs its kernels
        // for the call (time-sliced, slower, with every rank's events).
        let capturing = stream.is_capturing()? || timed;
        let (use_send, use_recv) = steps::used(coll, self.me);
        if self.me != self.leader {
            let send_buf = self.export(use_send, send)?;
            // In place: one lookup serves both (two driver calls each).
            let recv_buf = match send_buf {
                Buf::Shared(e) if use_recv && recv == send => Buf::Shared(e),
                _ => self.export(use_recv, recv)?,
            };
            let post = Post {
                what: what.clone(),
                capturing,
                send: send_buf,
                recv: recv_buf,
            };
            self.mailbox.post(seq, &post);
            return match self.mailbox.wait_answer(seq, self.leader, &what)? {
                Answer::Kernels => Ok(false),
                Answer::Mismatch => Err(Error::InvalidUsage(format!(
                    "collective #{seq} on a GPU shared by {} ranks: this rank (rank {}) called {what}, and not every rank called the same (rank {}'s error names them)",
                    self.nranks, self.me, self.leader
                ))),
                Answer::Direct => {
                    #[allow(unsafe_code)]
                    // SAFETY: both words are in flag buffers mapped in this
                    // context until the communicator goes, which
                    // synchronizes the context first.
                    unsafe {
                        let me = self.me as u64;
                        stream.mem_ops(&[
                            MemOp::Write {
                                addr: self.words.flags[self.leader] + READY + 8 * me,
                                value: flag,
                            },
                            MemOp::Wait {
                                addr: self.words.flags[self.me] + DONE,
                                value: flag,
                            },
                        ])?;
                    }
                    self.awaited.wait(DONE, flag);
                    Ok(true)
                }
            };
        }
        let Some(bufs) = self.lead(seq, &what, capturing, send, recv)? else {
            return Ok(false);
        };
        #[allow(unsafe_code)]
        // SAFETY: the flag words as above; the buffers are the callers'
        // (valid for the collective's sizes by its contract) or mappings
        // of theirs kept mapped by the process (`ipc::map_kept`), which
        // lets one go only after the context is synchronized. Every other rank's stream waits for
        // DONE before it touches its buffers again.
        unsafe {
            let others = (0..self.nranks).filter(|&r| r != self.me);
            let mine = self.words.flags[self.me];
            stream.wait_all(others.clone().map(|r| mine + READY + 8 * r as u64), flag)?;
            for r in others.clone() {
                self.awaited.wait(READY + 8 * r as u64, flag);
            }
            for s in steps::steps(coll, &bufs, count, dtype.size(), self.leader) {
                let (o, i) = (&s.outputs, &s.inputs);
                let nb = self.max_blocks;
                kernels.reduce(o, i, count, dtype, op, self.nranks, s.flags, nb, stream)?;
            }
            stream.write_all(others.map(|r| self.words.flags[r] + DONE), flag)?;
        }
        Ok(true)
    }

    /// A group's sends and receives of `count` elements each (none to this
    /// rank), every copy in the leader's context: the leader's server
    /// copies each message whose receiver is another process, the leader
    /// pulls its own with its kernel, and the other ranks' streams only
    /// store and wait on words (see `server`). On this rank's stream the
    /// sends' READY stores come first, then the receives, then the waits
    /// for the messages sent to be copied: two ranks sending to each other
    /// in one group never wait on each other. (Sends to each other in
    /// separate, ungrouped calls before the receives wait forever, where
    /// NCCL hangs from a FIFO's worth: NCCL asks for a group there.)
    /// Returns the sends and receives that run on every rank's kernels
    /// instead: those whose sender is capturing a graph or has memory CUDA
    /// IPC cannot share, as the sender's post tells the receiver, and
    /// those of a sender whose launches the profiler times: as for
    /// collectives, only its kernels write the channels' clocks, so the
    /// message then takes both ranks' kernels (time-sliced, slower, with
    /// the kernel events of separate GPUs). A timed receiver follows its
    /// sender's choice.
    #[allow(clippy::type_complexity, clippy::too_many_arguments)] // the two lists left over
    pub fn p2p(
        &mut self,
        timed: bool,
        kernels: &KernelSet,
        sends: &[(usize, u64)],
        recvs: &[(usize, u64)],
        count: usize,
        dtype: DataType,
        stream: RawStream,
    ) -> Result<(Vec<(usize, u64)>, Vec<(usize, u64)>)> {
        if self.nranks > MAX_P2P {
            return Ok((sends.to_vec(), recvs.to_vec()));
        }
        self.server_failure()?;
        let what = format!("send/recv of {count} x {dtype:?}");
        let bytes = count * dtype.size();
        let capturing = stream.is_capturing()?;
        let (me, leader) = (self.me, self.leader);
        let words = self.words.clone();
        let (mut left_sends, mut left_recvs, mut direct) = (Vec::new(), Vec::new(), Vec::new());
        let mut pushes = Vec::new();
        for &(p, buf) in sends {
            self.sent[p] += 1;
            let k = self.sent[p];
            let send = if capturing || timed {
                Buf::Private
            } else {
                self.export(true, buf)?
            };
            let post = Post {
                what: what.clone(),
                capturing,
                send,
                recv: Buf::Unused,
            };
            self.mailbox.post_send(p, k, &post, buf)?;
            if !matches!(send, Buf::Shared(..)) {
                left_sends.push((p, buf));
            } else if me == leader && p != me && words.served(me, p) {
                // Its receiver's answer (through the server) says whether
                // this stream writes it or the receiver pulls.
                pushes.push((p, k, buf));
            } else {
                direct.push((p, k));
            }
        }
        let ops: Vec<Op<Move>> = direct.iter().map(|&(p, k)| words.send(me, p, k)).collect();
        self.enqueue(&ops, kernels, stream)?;
        // Every receive is asked of the server before any answer is
        // awaited: the server serves them while this rank asks.
        enum How {
            Asked(u64),
            Pull,
        }
        let mut taken = Vec::with_capacity(recvs.len());
        for &(q, buf) in recvs {
            self.received[q] += 1;
            let k = self.received[q];
            let (post, addr) = self.mailbox.wait_send(q, k, &what)?;
            if post.what != what {
                return Err(Error::InvalidUsage(format!(
                    "rank {me} receives {what} from rank {q}, whose message {k} is a {}: the counts and types of a send and its receive must agree",
                    post.what
                )));
            }
            // The sender chose: its buffer to share, or its kernels.
            let Buf::Shared(src) = post.send else {
                left_recvs.push((q, buf));
                continue;
            };
            if post.capturing {
                left_recvs.push((q, buf));
                continue;
            }
            let how = if words.served(q, me) {
                // Where the server cannot write this rank's buffer, or this
                // stream is being captured, the server only relays READY.
                let dst = if capturing {
                    None
                } else {
                    match self.export(true, buf)? {
                        Buf::Shared(e) => Some(e),
                        _ => None,
                    }
                };
                let req = Request {
                    from: q,
                    k,
                    bytes: bytes as u64,
                    src,
                    dst,
                };
                self.requests += 1;
                self.mailbox.post_request(self.requests, &req, leader)?;
                How::Asked(self.requests)
            } else {
                How::Pull
            };
            taken.push((q, k, buf, src, addr, how));
        }
        // Every served receive says its buffer is free before any waits for
        // its data: one after another, each copy would wait for the
        // previous one's landing, a trip between contexts each.
        let mut frees = Vec::with_capacity(taken.len());
        let mut ops = Vec::with_capacity(3 * taken.len() + direct.len());
        for (q, k, buf, src, addr, how) in taken {
            let served = match how {
                How::Pull => Served::Pull,
                How::Asked(n) => self.mailbox.wait_served(n, leader, &what)?,
            };
            let written = match served {
                Served::Copied => Some(words.recv_copied(q, me, k)),
                Served::Pushed => Some(words.recv_pushed(me, k)),
                Served::Pull => None,
                Served::Failed(msg) => {
                    return Err(Error::System(format!(
                        "rank {me} receives message {k} from rank {q}: {msg}"
                    )))
                }
            };
            // Written into this rank's buffer by the server or the leader:
            // the buffer's FREE goes with the others, then the wait.
            if let Some([free, landed]) = written {
                frees.push(free);
                ops.push(landed);
                continue;
            }
            // A message to itself is pulled from its own address: CUDA IPC
            // cannot open a handle in the process that made it.
            let src = if q == me {
                Some(addr)
            } else {
                self.map(&[Buf::Shared(src)]).map(|a| a[0])
            };
            let Some(src) = src else {
                return Err(Error::System(format!(
                    "rank {me} cannot map the send buffer of rank {q} (message {k}) on their shared GPU"
                )));
            };
            let m = Move {
                dst: buf,
                src,
                bytes,
            };
            ops.extend(words.recv_pull(q, me, k, m));
        }
        // The leader's messages to served ranks: each receiver has asked
        // for it by now, will soon, or pulls it.
        let mut pushed = Vec::with_capacity(3 * pushes.len());
        for (p, k, buf) in pushes {
            let dst = self.forwarded(p, k)?;
            let Some(dst) = dst else {
                // The receiver pulls (its buffer cannot be shared, its
                // stream is being captured, or it came late): as any other
                // sender.
                pushed.push(words.send(me, p, k));
                direct.push((p, k));
                continue;
            };
            let Some(dst) = self.map(&[Buf::Shared(dst)]).map(|a| a[0]) else {
                return Err(Error::System(format!(
                    "rank {me} cannot map the receive buffer of rank {p} (message {k}) on their shared GPU"
                )));
            };
            let m = Move {
                dst,
                src: buf,
                bytes,
            };
            pushed.extend(words.push(p, k, m));
        }
        ops.extend(direct.iter().map(|&(p, k)| words.send_end(me, p, k)));
        frees.extend(pushed);
        frees.extend(ops);
        self.enqueue(&frees, kernels, stream)?;
        Ok((left_sends, left_recvs))
    }

    /// The leader: receiver `p`'s answer for the leader's message `k`, as
    /// the server passed it on: its buffer, or `None` where it pulls. A
    /// receiver that has not asked within `push_wait` pulls instead: the
    /// leader's host, unlike NCCL's, would otherwise stay in this send until
    /// the receiver's host reaches the receive (the program might first
    /// need this host to do something else).
    fn forwarded(&self, p: usize, k: u64) -> Result<Option<Exported>> {
        let Some(forwards) = &self.forwards else {
            return Err(Error::Internal("a push without a p2p server".into()));
        };
        let mut got = None;
        if !self.mailbox.wait_briefly(push_wait()?, || {
            got = forwards.take(p, k);
            got.is_some()
        }) {
            return Ok(forwards.give_up(p, k));
        }
        self.server_failure()?;
        Ok(got.flatten())
    }

    /// Enqueues send/recv's operations on this rank's stream.
    fn enqueue(&mut self, ops: &[Op<Move>], kernels: &KernelSet, stream: RawStream) -> Result<()> {
        #[allow(unsafe_code)]
        // SAFETY: the words are in flag buffers (and the server's words,
        // host memory registered here) mapped in this context until the communicator goes, which
        // synchronizes the context first; every wait is on this rank's own
        // flags (`Words`); a pull's destination is the caller's buffer,
        // valid for the message, its source a mapping kept by the process
        // (let go only after a synchronize), which the sender touches again
        // only after this rank's DONE.
        unsafe {
            let mine = Some((self.words.flags[self.me], &mut self.awaited));
            words::enqueue(ops, stream, kernels, self.max_blocks, mine)
        }
    }
}

fn describe(coll: Coll) -> String {
    match coll {
        Coll::Broadcast { root } | Coll::Reduce { root } => {
            format!("{} (root {root})", coll.name())
        }
        _ => coll.name().to_string(),
    }
}
