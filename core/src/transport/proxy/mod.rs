//! The proxy of the device path's network connections (NCCL's proxy
//! thread): the GPU cannot call the net plugin, so a host thread moves its
//! step slots. For each net peer and channel the kernel stores slices into
//! a send mirror in host memory and posts them (`tail`, with each slot's
//! size); the proxy `isend`s each posted slot and, once the plugin is done
//! with it, tells the kernel the slot is free again (`head` in the kernel's
//! receive area). The other way, the proxy keeps an `irecv` posted into
//! every free slot of the receive area and publishes each completed one to
//! the kernel (`tail`); the kernel's acknowledgements (`head` in the
//! mirror) free slots for the next `irecv`s. Steps go out and come in while
//! the kernel works on others, so the network, the PCIe traffic of the
//! kernel and its reductions overlap, on every channel at once.
//!
//! When a communicator is destroyed its proxy says goodbye on each link (a
//! message of 0 bytes, which no slice is) and waits for the peer's goodbye
//! before the connections close: a running peer answers at once, and one
//! being destroyed at the same moment sends its own. So receives posted
//! ahead end in an orderly way rather than on a broken connection, neither
//! side ever sends to a closed one, and only a launch that would need the
//! departed rank fails (`Proxy::gone`); nothing is reported
//! asynchronously, since ranks of a finished job destroy their
//! communicators at different times. A plugin that leaves a receive's size
//! unreported (as NCCL allows in practice: Google's Fast Socket) cannot
//! carry goodbyes; once one of its receives completes that way, the proxy
//! closes without them, as NCCL does.
//!
//! Each connection's LL FIFO (see [`super::layout`]) has its own pair of
//! net connections, driven alike, except that a kernel posts an LL slot by
//! its size word alone, without a fence: the proxy sends it once every
//! line of it carries the step's flag, and clears the word.
//!
//! [`SendSteps`] and [`RecvSteps`] are the per-connection state machines,
//! without sockets or GPUs; [`Proxy`] is the thread that feeds them the
//! counters it reads and performs what they answer. With a profiler, the
//! thread also reports NCCL's proxy ops and steps, from what the host
//! announces of each launch (see [`track`]).

mod steps;
mod track;

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use oxccl_plugin::{DmaBuf, MrHandle, PtrType, Request};

use super::layout::{ll_flag, Fifo, Layout, Proto, LL_LINE};
use super::shm::area::Area;
use crate::cuda::{Context, Registered};
use crate::error::{Error, Result};
use crate::mem::reg::{Conn, RecvConn, Registrar, Scope, SendConn};
use crate::mem::Span;
use crate::plugin::profiler::{ProfilerComm, ProxyCtrl};
pub use steps::{RecvSteps, SendSteps};
pub use track::{ConnSteps, Launch};
use track::{Notice, Notices, Track};

/// Host memory the proxy reads and writes: an area mapped into the GPU
/// (a plain one in tests, where the test plays the kernel).
pub trait HostArea: Send + Sync {
    fn area(&self) -> &Area;
}

impl HostArea for Registered<Area> {
    fn area(&self) -> &Area {
        self.mem()
    }
}

impl HostArea for Area {
    fn area(&self) -> &Area {
        self
    }
}

/// Where one side's step slots are, as the plugin is given them: in its
/// host area, or in device memory (GPUDirect), which the proxy hands on
/// but never touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slots {
    /// Slot 0 of cell 0.
    pub base: usize,
    pub ty: PtrType,
}

impl Slots {
    /// The slots of FIFO `f` inside a host area.
    pub fn host(a: &Area, f: &Fifo) -> Slots {
        Slots {
            base: a.at(f.off_fifo, 0) as usize,
            ty: PtrType::Host,
        }
    }

    fn at(&self, f: &Fifo, cell: usize, step: u64) -> *mut u8 {
        (self.base + f.slot(cell, step) - f.off_fifo) as *mut u8
    }

    fn span(&self, f: &Fifo, cell: usize) -> Span {
        let (off, len) = f.slots(cell);
        Span {
            ptr: (self.base + off - f.off_fifo) as *mut u8,
            len,
        }
    }
}

/// Registers one connection's `cell` of `slots` with it: through the
/// slots' dma-buf `fd` where there is one (the cell's offset in it), else
/// as memory of the slots' type.
fn register_cell<C: ?Sized + Registrar>(
    conn: &mut Conn<C>,
    slots: Slots,
    fd: Option<&OwnedFd>,
    cell: Span,
) -> oxccl_plugin::NetResult<MrHandle> {
    match fd {
        Some(fd) => {
            let d = DmaBuf {
                fd: fd.as_raw_fd(),
                offset: (cell.ptr as usize - slots.base) as u64,
            };
            conn.mr_dmabuf(cell, cell, Scope::Kept, d)
        }
        None => conn.mr_as(cell, cell, Scope::Kept, slots.ty),
    }
}

/// The memory the proxy works in: this rank's receive area and its send
/// mirror (their counters always; their slots unless `slots` say
/// otherwise).
pub struct Areas {
    pub mine: Arc<dyn HostArea>,
    pub mirror: Arc<dyn HostArea>,
    /// The slots of `mine` and of `mirror`.
    pub slots: [Slots; 2],
    /// Dma-bufs of those slots (GPU memory), through which they are
    /// registered (`regMrDmaBuf`); closed once every connection has
    /// registered, as NCCL closes them. None for slots in host memory (the
    /// send slots under NCCL_NET_GDR_READ=0).
    pub dmabufs: [Option<OwnedFd>; 2],
    /// Bound on the proxy thread, as NCCL's proxy sets its device: a
    /// plugin may call CUDA.
    pub ctx: Option<Arc<Context>>,
    pub layout: Layout,
    pub rank: usize,
    /// A profiler may be attached ([`Proxy::set_profiler`]): until the
    /// thread is told whether one is, it posts nothing, so that with one
    /// every step is reported from its start.
    pub profiled: bool,
    /// The CPUs the thread binds to before anything else
    /// (NCCL_IGNORE_CPU_AFFINITY); `None`: those it inherits.
    pub cpus: Option<Vec<usize>>,
    /// The thread's name (NCCL's under NCCL_SET_THREAD_NAME=1).
    pub name: String,
}

impl Areas {
    /// Both FIFOs in host areas, and no CUDA context to bind: a host
    /// kernel's, as tests drive the proxy.
    pub fn on_host(
        mine: Arc<Area>,
        mirror: Arc<Area>,
        layout: Layout,
        rank: usize,
        profiled: bool,
    ) -> Areas {
        Areas {
            slots: [
                Slots::host(&mine, &layout.fifo(Proto::Simple)),
                Slots::host(&mirror, &layout.fifo(Proto::Simple)),
            ],
            dmabufs: [None, None],
            mine,
            mirror,
            ctx: None,
            layout,
            rank,
            profiled,
            cpus: None,
            name: format!("oxccl-proxy-{rank}"),
        }
    }
}

/// How the thread posts receives: not yet (a profiler may come), freely,
/// or for announced steps only, reporting proxy events to the profiler.
#[derive(Clone, Copy)]
enum Gate<'a> {
    Hold,
    Free,
    Track(&'a Arc<ProfilerComm>),
}

/// One net peer on one channel: both directions.
pub struct Link {
    pub peer: usize,
    pub chan: usize,
    pub send: SendConn,
    pub recv: RecvConn,
}

/// Whether every line of an LL slot of `bytes` at `off` in `a` carries
/// the flag of `step`: the kernel stored it all.
fn ll_stored(a: &Area, off: usize, bytes: usize, step: u64) -> bool {
    let flag = u64::from(ll_flag(step));
    (0..bytes / LL_LINE).all(|i| {
        let line = off + i * LL_LINE;
        a.load(line) >> 32 == flag && a.load(line + 8) >> 32 == flag
    })
}

struct Driven {
    link: Link,
    /// The FIFO of the connection this link carries.
    fifo: Fifo,
    /// Its slots in the receive area and the mirror.
    slots: [Slots; 2],
    /// Cell of this rank's data for the peer, in the mirror.
    out: usize,
    /// Cell of the peer's data for this rank, in the receive area.
    inc: usize,
    send_mr: MrHandle,
    recv_mr: MrHandle,
    sends: SendSteps,
    recvs: RecvSteps,
    send_q: VecDeque<Box<dyn Request>>,
    recv_q: VecDeque<Box<dyn Request>>,
    /// The peer said goodbye: nothing more comes from it.
    heard_bye: bool,
    /// The peer's farewell messages received (its goodbye the first).
    heard: u64,
    /// Our farewell messages posted, and those in flight; `said_bye` once
    /// all [`Driven::nslots`] went (see [`Driven::goodbye`]).
    bye_posted: u64,
    bye_q: VecDeque<Box<dyn Request>>,
    said_bye: bool,
    /// Slots of the FIFO: receives posted ahead, and farewell messages.
    nslots: u64,
    /// A receive completed without its size (`Request::test`): the plugin
    /// cannot tell a goodbye from a slice.
    sizeless: bool,
    /// The profiler's view of the sends and of the receives.
    tracks: [Track; 2],
    /// When a pass of the thread last moved something here.
    moved: Instant,
}

impl Driven {
    /// A link of `proto`'s FIFO: the simple one's slots are where `a` says,
    /// the LL one's always in the host areas.
    fn new(mut link: Link, a: &Areas, proto: Proto) -> Result<Driven> {
        let l = &a.layout;
        let fifo = l.fifo(proto);
        let out = l.cell(a.rank, link.peer, link.chan);
        let inc = l.cell(link.peer, a.rank, link.chan);
        let what = |dir: &str, e| {
            Error::from(e).context(format!(
                "registering the {dir} slots of channel {} to rank {} with the network",
                link.chan, link.peer
            ))
        };
        let (slots, [mine_fd, mirror_fd]) = match (proto, &a.dmabufs) {
            (Proto::Ll, _) => (
                [
                    Slots::host(a.mine.area(), &fifo),
                    Slots::host(a.mirror.area(), &fifo),
                ],
                [None, None],
            ),
            (Proto::Simple, [m, r]) => (a.slots, [m.as_ref(), r.as_ref()]),
        };
        let [mine, mirror] = slots;
        let s = mirror.span(&fifo, out);
        let send_mr =
            register_cell(&mut link.send, mirror, mirror_fd, s).map_err(|e| what("send", e))?;
        let r = mine.span(&fifo, inc);
        let recv_mr =
            register_cell(&mut link.recv, mine, mine_fd, r).map_err(|e| what("receive", e))?;
        Ok(Driven {
            link,
            fifo,
            slots,
            out,
            inc,
            send_mr,
            recv_mr,
            sends: SendSteps::new(),
            recvs: RecvSteps::new(l.nslots),
            send_q: VecDeque::new(),
            recv_q: VecDeque::new(),
            heard_bye: false,
            heard: 0,
            bye_posted: 0,
            bye_q: VecDeque::new(),
            said_bye: false,
            nslots: l.nslots as u64,
            sizeless: false,
            tracks: Default::default(),
            moved: Instant::now(),
        })
    }

    /// The kernel's `tail` for the sends: for the LL FIFO, one past the
    /// next step once its slot is wholly stored.
    fn posted_tail(&self, mirror: &Area) -> u64 {
        let f = &self.fifo;
        if f.proto == Proto::Simple {
            return mirror.load(f.tail(self.out));
        }
        let step = self.sends.completed() + self.sends.in_flight();
        let bytes = mirror.load(f.size(self.out, step)) as usize;
        // An oversized word goes on to the size check, which fails it.
        let ready = bytes > 0
            && (bytes > f.slot_bytes || ll_stored(mirror, f.slot(self.out, step), bytes, step));
        step + u64::from(ready)
    }

    /// Posts and completes what it can, testing the receives posted only
    /// where `test_recvs`; whether anything moved.
    fn progress(&mut self, a: &Areas, gate: Gate<'_>, test_recvs: bool) -> Result<bool> {
        let (l, mine, mirror) = (self.fifo, a.mine.area(), a.mirror.area());
        let (peer, chan) = (self.link.peer, self.link.chan);
        let fail = |what: &str, e| {
            Error::from(e).context(format!("{what} on channel {chan} with rank {peer}"))
        };
        let mut moved = self.goodbye(false).map_err(|e| fail("goodbye", e))?;
        if let Gate::Track(c) = gate {
            // Slots the kernel may store into now: their steps wait for it.
            let free = self.sends.completed() + l.nslots as u64;
            self.tracks[0].open_sends(c, free);
        }
        while let Some(step) = self.sends.next(self.posted_tail(mirror)) {
            let bytes = mirror.load(l.size(self.out, step)) as usize;
            if bytes > l.slot_bytes {
                return Err(Error::Internal(format!(
                    "the kernel stored {bytes} bytes into a {}-byte slot for rank {peer}",
                    l.slot_bytes
                )));
            }
            let prof = match gate {
                // Whether the step is to be reported is not known yet.
                Gate::Hold => break,
                // The announcement comes before the kernel: the next pass
                // has it.
                Gate::Track(_) if !self.tracks[0].covers(step) => break,
                Gate::Track(c) => self.tracks[0].send_try(c, step, bytes),
                _ => None,
            };
            let data = self.slots[1].at(&l, self.out, step);
            // SAFETY: the slot lies in the mirror's slots (the layout's
            // bounds), which outlive every request (the proxy joins before
            // the areas go); the kernel does not store into it again until
            // `head` passes it, which happens only after this request
            // completes. The profiler handle lives in the track until the
            // request completed.
            #[allow(unsafe_code)]
            let req = unsafe {
                self.link
                    .send
                    .comm()
                    .isend_profiled(data, bytes, 0, Some(self.send_mr), prof)
            }
            .map_err(|e| fail("isend", e))?;
            let Some(req) = req else { break };
            if l.proto == Proto::Ll {
                // The step is taken: the kernel stores its slot's word again
                // only after `head` freed the slot, which this send's
                // completion does.
                mirror.store(l.size(self.out, step), 0);
            }
            self.send_q.push_back(req);
            self.sends.posted();
            if let Gate::Track(c) = gate {
                self.tracks[0].sent(c, step, bytes);
            }
            moved = true;
        }
        while let Some(r) = self.send_q.front_mut() {
            if r.test_first().map_err(|e| fail("send", e))?.is_none() {
                break;
            }
            self.send_q.pop_front();
            let step = self.sends.completed();
            mine.store(l.head(self.inc), self.sends.done());
            if let Gate::Track(c) = gate {
                self.tracks[0].send_done(c, step);
            }
            moved = true;
        }
        let consumed = mirror.load(l.head(self.out));
        if let Gate::Track(c) = gate {
            self.tracks[1].consumed(c, consumed);
        }
        while let Some(step) = self.recvs.next(consumed) {
            // After the peer's goodbye, receives are posted for its
            // farewell messages only: no kernel step, nothing to profile.
            let prof = match gate {
                _ if self.heard_bye => None,
                Gate::Hold => break,
                Gate::Free => None,
                // Not announced yet: posted once its launch is.
                Gate::Track(_) if !self.tracks[1].covers(step) => break,
                Gate::Track(c) => self.tracks[1].recv_try(c, step, l.slot_bytes),
            };
            let data = self.slots[0].at(&l, self.inc, step);
            // SAFETY: the slot lies in the receive slots, which outlive the
            // request; the kernel has consumed the step that used it last
            // and reads it again only after `tail` says this one arrived.
            // The profiler handle lives in the track until the step was
            // consumed, after the request completed.
            #[allow(unsafe_code)]
            let req = unsafe {
                self.link.recv.comm().irecv_profiled(
                    data,
                    l.slot_bytes,
                    0,
                    Some(self.recv_mr),
                    prof,
                )
            }
            .map_err(|e| fail("irecv", e))?;
            let Some(req) = req else { break };
            self.recv_q.push_back(req);
            self.recvs.posted();
            if let (Gate::Track(c), false) = (gate, self.heard_bye) {
                self.tracks[1].recv_posted(c, step, l.slot_bytes);
            }
            moved = true;
        }
        while let Some(r) = self
            .recv_q
            .front_mut()
            .filter(|_| test_recvs || self.heard_bye)
        {
            let Some(size) = r.test_first().map_err(|e| fail("receive", e))? else {
                break;
            };
            self.recv_q.pop_front();
            moved = true;
            self.sizeless |= size.is_none();
            if self.heard_bye {
                // One of the peer's farewell messages: it completes a
                // receive posted ahead, and carries nothing for the kernel.
                self.heard += 1;
                continue;
            }
            if size == Some(0) {
                // The peer's goodbye. Its farewell messages that follow
                // complete the receives posted behind it, so that no
                // receive is left in flight when the connection closes;
                // the peer waits for our answer before it closes.
                self.heard_bye = true;
                self.heard = 1;
                self.goodbye(false).map_err(|e| fail("goodbye", e))?;
                continue;
            }
            if let Gate::Track(c) = gate {
                let bytes = size.unwrap_or(l.slot_bytes);
                self.tracks[1].received(c, self.recvs.completed(), bytes);
            }
            mine.store(l.tail(self.inc), self.recvs.done());
        }
        Ok(moved)
    }

    /// Ends the open proxy events of both directions; handles of requests
    /// still posted stay with their connections until those close.
    fn finish_tracks(&mut self, c: &Arc<ProfilerComm>) {
        let [sends, recvs] = &mut self.tracks;
        let link = &mut self.link;
        sends.finish(c, &mut |ph| link.send.park(ph));
        recvs.finish(c, &mut |ph| link.recv.park(ph));
    }

    /// Says goodbye where it is due (leaving, or answering the peer's) and
    /// not said yet, and completes it; whether anything moved.
    ///
    /// A goodbye is [`Driven::nslots`] messages of 0 bytes: the first says
    /// it, the others complete the receives the peer has posted ahead into
    /// its free slots (as many as there are slots once its kernel consumed
    /// every step), so that neither side closes a connection with a
    /// request in flight. NCCL posts receives only for the steps of the
    /// operations under way, so it has none left at its end; this proxy
    /// follows the kernels' counters and posts ahead, so it must complete
    /// them (a network plugin may leak or fail on a receive closed in
    /// flight: aws-ofi-nccl warns "Closing recv_comm ... with inflight
    /// requests").
    fn goodbye(&mut self, leaving: bool) -> oxccl_plugin::NetResult<bool> {
        let mut moved = false;
        if leaving || self.heard_bye {
            while self.bye_posted < self.nslots {
                let at = self.slots[1].at(&self.fifo, self.out, 0);
                // SAFETY: a 0-byte send reads nothing; the pointer lies in
                // the registered slots, which outlive the request.
                #[allow(unsafe_code)]
                let req = unsafe { self.link.send.comm().isend(at, 0, 0, Some(self.send_mr)) }?;
                let Some(r) = req else { break };
                self.bye_q.push_back(r);
                self.bye_posted += 1;
                moved = true;
            }
        }
        while let Some(r) = self.bye_q.front_mut() {
            if r.test_first()?.is_none() {
                break;
            }
            self.bye_q.pop_front();
            moved = true;
        }
        if !self.said_bye && self.bye_posted == self.nslots && self.bye_q.is_empty() {
            self.said_bye = true;
            moved = true;
        }
        Ok(moved)
    }

    /// Requests of this connection still in flight: data, farewell and
    /// posted receives.
    fn in_flight(&self) -> usize {
        self.send_q.len() + self.bye_q.len() + self.recv_q.len()
    }

    /// One round of leaving: our goodbye, and the peer's (or its answer).
    /// Whether both are done. Errors end it quietly: the peer may be gone.
    fn farewell(&mut self, a: &Areas) -> bool {
        let mut step = || -> Result<()> {
            self.goodbye(true)?;
            self.progress(a, Gate::Free, true)?;
            Ok(())
        };
        match step() {
            Ok(()) => self.said_bye && self.heard >= self.nslots && self.in_flight() == 0,
            Err(e) => {
                tracing::debug!(target: "oxccl::net", "rank {}: goodbye to rank {} on channel {}: {e}", a.rank, self.link.peer, self.link.chan);
                true
            }
        }
    }
}

/// After this long without progress or a launch, the proxy stops spinning
/// and naps between polls (a kernel it has not heard of costs at most one
/// nap of latency).
const SPIN: Duration = Duration::from_millis(20);
const NAP: Duration = Duration::from_micros(200);

/// A simple FIFO's connection that moved nothing for this long has its
/// posted receives tested on every `QUIET_EVERY`-th pass only: each test is
/// a system call with the socket net (0.4 us on a 2-core VM), and the LL
/// connections, tested on every pass, carry the small operations whose
/// latency it would add to.
const QUIET_AFTER: Duration = Duration::from_millis(1);
const QUIET_EVERY: u32 = 4;

/// Whether a connection of `proto`'s FIFO that moved nothing for `quiet`
/// has its receives tested on pass `pass` (`woke`: the first after a nap).
fn recvs_due(proto: Proto, woke: bool, pass: u32, quiet: Duration) -> bool {
    woke || proto == Proto::Ll || pass.is_multiple_of(QUIET_EVERY) || quiet < QUIET_AFTER
}

/// How long a departing proxy waits for its peers' goodbyes: a peer's
/// proxy answers at once, whether its communicator is being destroyed too
/// or still runs; one that is dead or stuck costs this much.
const BYE_WAIT: Duration = Duration::from_millis(500);

/// The proxy thread of one rank's net connections.
pub struct Proxy {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    failed: Arc<Mutex<Option<Error>>>,
    gone: Arc<Mutex<Option<Error>>>,
    /// The communicator's profiler or none, told once it is known (after
    /// the window, and so this thread, is set up).
    prof: Arc<OnceLock<Option<Arc<ProfilerComm>>>>,
    /// Launches announced, for the profiler's proxy events.
    notices: Arc<Notices>,
    /// Whether the thread waits to be told about a profiler.
    profiled: bool,
}

impl Proxy {
    /// Drives `links` (the simple FIFOs) and `ll_links` (the LL ones; none
    /// where the layout has no LL FIFO).
    pub fn start(links: Vec<Link>, ll_links: Vec<Link>, mut areas: Areas) -> Result<Proxy> {
        let driven = links
            .into_iter()
            .map(|l| Driven::new(l, &areas, Proto::Simple))
            .chain(
                ll_links
                    .into_iter()
                    .map(|l| Driven::new(l, &areas, Proto::Ll)),
            )
            .collect::<Result<Vec<_>>>()?;
        areas.dmabufs = [None, None];
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(Mutex::new(None));
        let gone = Arc::new(Mutex::new(None));
        let prof = Arc::new(OnceLock::new());
        let notices = Arc::new(Notices::default());
        let profiled = areas.profiled;
        let shared = Shared {
            stop: stop.clone(),
            failed: failed.clone(),
            gone: gone.clone(),
            prof: prof.clone(),
            notices: notices.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(areas.name.clone())
            .spawn(move || run(driven, areas, &shared))
            .map_err(|e| Error::System(format!("cannot start the proxy thread: {e}")))?;
        Ok(Proxy {
            stop,
            thread: Some(thread),
            failed,
            gone,
            prof,
            notices,
            profiled,
        })
    }

    /// Tells the thread the communicator's profiler (or that there is
    /// none): it reports its proxy-control events to it from now on, and,
    /// if it was started `profiled`, the proxy ops and steps of the
    /// launches announced. Whether every launch must be announced from now
    /// on ([`Proxy::announce`]).
    pub fn set_profiler(&self, p: Option<Arc<ProfilerComm>>) -> bool {
        let tracked = self.profiled && p.is_some();
        let _ = self.prof.set(p);
        tracked
    }

    /// The steps a launch about to be made moves on this proxy's
    /// connections (see [`track`]).
    pub fn announce(&self, l: Launch) {
        self.notices.push(Notice::Launch(l));
    }

    /// A launch went (or may have gone) unannounced: the thread stops
    /// following announcements for good.
    pub fn lost(&self) {
        self.notices.push(Notice::Lost);
        self.kick();
    }

    /// A kernel was launched: poll without napping.
    pub fn kick(&self) {
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }

    /// Ends the thread's transfers now (a revoke): it says goodbye to its
    /// peers and returns. Launches after it would wait on nothing: the
    /// communicator refuses them.
    pub fn halt(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }

    /// What ended the proxy, if something did (a peer gone, a plugin error).
    pub fn failure(&self) -> Option<Error> {
        self.failed.lock().ok()?.clone()
    }

    /// A peer that destroyed its communicator: no launch can reach it.
    pub fn gone(&self) -> Option<Error> {
        self.gone.lock().ok()?.clone()
    }
}

/// What the thread shares with its [`Proxy`].
struct Shared {
    stop: Arc<AtomicBool>,
    failed: Arc<Mutex<Option<Error>>>,
    gone: Arc<Mutex<Option<Error>>>,
    prof: Arc<OnceLock<Option<Arc<ProfilerComm>>>>,
    notices: Arc<Notices>,
}

/// Hands each announced launch's steps to its connections; the proxy ops
/// taken on.
fn take_on(driven: &mut [Driven], c: &Arc<ProfilerComm>, l: &Launch) -> usize {
    let mut ops = 0;
    for cs in &l.conns {
        if let Some(d) = driven
            .iter_mut()
            .find(|d| d.fifo.proto == cs.proto && d.link.peer == cs.peer && d.link.chan == cs.chan)
        {
            ops += usize::from(d.tracks[usize::from(!cs.send)].add(c, l.mask, cs));
        }
    }
    ops
}

fn run(mut driven: Vec<Driven>, areas: Areas, sh: &Shared) {
    // No queue of operations is appended here (the thread follows the
    // kernels' slot counters), so of NCCL's proxy-control states this
    // thread reports idle/active and sleep/wakeup, and "append" for the
    // proxy ops of each announced launch it profiles.
    if let Some(cpus) = &areas.cpus {
        match crate::topo::affinity::bind_current(cpus) {
            Ok(()) => {
                tracing::info!(target: "oxccl::init", "proxy of rank {}: bound to CPUs {}", areas.rank, crate::topo::affinity::format_cpulist(cpus))
            }
            Err(e) => {
                tracing::warn!(target: "oxccl::init", "proxy of rank {}: cannot bind to CPUs {} ({e}); it runs where it was started", areas.rank, crate::topo::affinity::format_cpulist(cpus))
            }
        }
    }
    let mut ctrl = ProxyCtrl::new(None);
    let mut gate = if areas.profiled {
        Gate::Hold
    } else {
        Gate::Free
    };
    if let Some(ctx) = &areas.ctx {
        if let Err(e) = ctx.bind() {
            tracing::warn!(target: "oxccl::net", "proxy of rank {}: {e}", areas.rank);
        }
    }
    let mut last = Instant::now();
    let mut pass = 0u32;
    // After a nap every receive is tested at once: a pass is a nap apart.
    let mut woke = true;
    while !sh.stop.load(Ordering::Acquire) {
        if !ctrl.has_profiler() {
            if let Some(p) = sh.prof.get() {
                ctrl = ProxyCtrl::new(p.as_deref());
                if let Gate::Hold = gate {
                    gate = p.as_ref().map_or(Gate::Free, Gate::Track);
                }
            }
        }
        if let Gate::Track(c) = gate {
            for n in sh.notices.take() {
                match n {
                    Notice::Launch(l) => {
                        let ops = take_on(&mut driven, c, &l);
                        if ops > 0 {
                            ctrl.append(ops);
                        }
                    }
                    Notice::Lost => {
                        tracing::debug!(target: "oxccl::net", "proxy of rank {}: a launch went unannounced (graph capture or a failed launch): no proxy events from now on", areas.rank);
                        for d in &mut driven {
                            d.finish_tracks(c);
                        }
                        gate = Gate::Free;
                        break;
                    }
                }
            }
        }
        let mut moved = false;
        pass = pass.wrapping_add(1);
        let now = Instant::now();
        for d in &mut driven {
            let heard = d.heard_bye;
            let due = recvs_due(d.fifo.proto, woke, pass, now.duration_since(d.moved));
            match d.progress(&areas, gate, due) {
                Ok(m) => {
                    moved |= m;
                    if m {
                        d.moved = now;
                    }
                    if d.heard_bye && !heard {
                        tracing::debug!(target: "oxccl::net", "rank {}: rank {} said goodbye on channel {}", areas.rank, d.link.peer, d.link.chan);
                        if let Ok(mut g) = sh.gone.lock() {
                            g.get_or_insert(Error::Remote(format!(
                                "rank {} destroyed its communicator (its proxy said goodbye on channel {})",
                                d.link.peer, d.link.chan
                            )));
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(target: "oxccl::net", "proxy of rank {}: {e}", areas.rank);
                    if let Ok(mut f) = sh.failed.lock() {
                        f.get_or_insert(e);
                    }
                    if let Gate::Track(c) = gate {
                        for d in &mut driven {
                            d.finish_tracks(c);
                        }
                    }
                    return;
                }
            }
        }
        ctrl.pass(moved);
        woke = false;
        if moved {
            last = Instant::now();
        } else if last.elapsed() > SPIN {
            ctrl.sleep(|| std::thread::park_timeout(NAP));
            woke = true;
            // A launch unparks: spin again from here.
            last = Instant::now() - SPIN + NAP;
        } else {
            std::hint::spin_loop();
        }
    }
    if let Gate::Track(c) = gate {
        for d in &mut driven {
            d.finish_tracks(c);
        }
    }
    if driven.iter().any(|d| d.sizeless) {
        // The plugin reports no receive sizes, so a peer would take our
        // goodbye for a slice: close without one, as NCCL does.
        tracing::debug!(target: "oxccl::net", "proxy of rank {}: the net plugin reports no receive sizes; closing without goodbyes", areas.rank);
        return;
    }
    let until = Instant::now() + BYE_WAIT;
    let mut done = vec![false; driven.len()];
    while Instant::now() < until && done.iter().any(|d| !d) {
        for (d, ok) in driven.iter_mut().zip(done.iter_mut()) {
            if !*ok {
                *ok = d.farewell(&areas);
            }
        }
        std::hint::spin_loop();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_simple_connections_are_tested_every_few_passes() {
        let quiet = QUIET_AFTER * 2;
        let due: Vec<bool> = (1..=8)
            .map(|p| recvs_due(Proto::Simple, false, p, quiet))
            .collect();
        assert_eq!(due.iter().filter(|d| **d).count(), 8 / QUIET_EVERY as usize);
        assert!(
            (1..=8).all(|p| recvs_due(Proto::Ll, false, p, quiet)),
            "LL: every pass"
        );
        assert!(
            (1..=8).all(|p| recvs_due(Proto::Simple, false, p, Duration::ZERO)),
            "busy"
        );
        assert!(recvs_due(Proto::Simple, true, 1, quiet), "after a nap");
    }
}

/// The proxy thread itself, over the socket network on loopback: the test
/// plays both ranks' kernels on plain host areas.
#[cfg(test)]
mod over_sockets;
