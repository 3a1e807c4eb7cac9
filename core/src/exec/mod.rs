//! The host executor: runs schedules ([`crate::algo::Step`]) over network
//! connections on memory the CPU can touch.
//!
//! A lane is one sequence of steps with its own connections (a channel of a
//! collective, or the messages to one peer of a group). Each step is cut
//! into slices that flow through a window of staging slots: receives are
//! posted ahead, slices are combined in order as they arrive and forwarded at
//! once, so the network and the reduction overlap. Every call into the
//! network returns at once; one thread polls all its lanes, which is what
//! lets sends and receives in any order complete without deadlock.
//!
//! Every buffer handed to the network is registered with that connection
//! first, as the ncclNet ABI requires (see [`crate::mem::reg`]): staging slots once per
//! connection for as long as both live, the caller's buffers for the
//! operation.

mod cursor;
pub mod device;
pub mod extent;
pub mod header;
pub mod host_direct;
pub mod mailbox;
mod proxy_prof;
mod stall;
mod stop;

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use oxccl_plugin::Request;

use crate::algo::{Buf, Step};
use crate::bootstrap::{Bootstrap, PeerCall, PeerProgress};
use crate::error::{Error, Result};
use crate::mem::reg::{RecvConn, Scope, SendConn};
use crate::mem::{self, OpBuffers, Span};
pub use crate::plugin::profiler::ProxyProfiler;
use crate::plugin::profiler::{Handle, NetParent, ProfilerComm, ProxyCtrl};
use crate::reduce::Reducer;
use cursor::Cursor;
use header::{OpHeader, HEADER_BYTES};
use proxy_prof::{Proxies, NO_OP};
use stall::{ask_peers, prefer_peer_report, timeout_error, ASK_AFTER, ASK_EVERY};
pub use stop::{Stop, StopReason};

/// Staging slots in flight per lane.
const WINDOW: usize = 4;

/// Slices of each step opened before the next step's: fewer than the
/// window, so that a window always holds a receive when it holds sends.
/// Opening every slice of a step before the next (as this executor once
/// did) needs the network to buffer a whole send-only step (all-gather's
/// first, a tree leaf's way up) while the peer's window is full of its own
/// sends: loopback TCP's socket buffers hid that; shared memory's ring and
/// rendezvous networks (IB, where a send waits for the receive) do not.
const GROUP: usize = WINDOW / 2;

/// The most elements of `esize` bytes a step may carry for every slice
/// of it to open before the next step's first (it has at most [`GROUP`]
/// slices of `slice_bytes`): steps no larger than this run in step order,
/// whatever regions they read and write. Schedules that join blocks whose
/// reads start elsewhere than their writes (PAT's reduce-scatter) keep
/// their steps within it.
pub fn joinable(slice_bytes: usize, esize: usize) -> usize {
    GROUP * (slice_bytes.max(64) / esize.max(1)).max(1)
}

/// One sequence of steps and the connections it uses.
pub struct Lane {
    pub label: LaneLabel,
    /// The channel whose connections the lane holds.
    pub chan: usize,
    pub steps: Vec<Step>,
    pub send: BTreeMap<usize, SendConn>,
    pub recv: BTreeMap<usize, RecvConn>,
    /// The buffers of each step, or one entry shared by all steps.
    pub bufs: Vec<OpBuffers>,
    pub reducer: Reducer,
    /// Leads the first message to every send peer and is expected in front
    /// of the first from every receive peer.
    pub header: OpHeader,
    pub slice_bytes: usize,
    /// Staging buffers and bookkeeping, kept by the communicator between
    /// operations so that a small operation allocates nothing.
    pub staging: Staging,
    /// The profiler event (collective or p2p) of each step, or one shared
    /// by all steps, that the lane's proxy-op events are children of;
    /// empty when those events are off.
    pub parents: Vec<Handle>,
}

/// What the executor needs from the communicator to report failures.
pub struct ExecCtx<'a> {
    pub rank: usize,
    /// Names the operation in errors; built only when one is reported, so
    /// that a small operation does not pay for formatting it.
    pub what: &'a (dyn Fn() -> String + Sync),
    /// Collective sequence number, compared with other ranks' progress on a timeout.
    pub seq: Option<u64>,
    pub timeout: Duration,
    /// Set when the communicator's operations must end now.
    pub stop: &'a Stop,
    pub bootstrap: &'a Bootstrap,
    /// Present only when the group's activation mask asks for proxy events.
    pub prof: Option<ProxyProfiler<'a>>,
    /// The communicator's profiler, for the proxy-control events of the
    /// thread running the call (this one: on the host path the caller's
    /// thread is the proxy), which follow the plugin's live mask.
    pub ctrl: Option<&'a ProfilerComm>,
    /// The direct path, where the ranks share a host: a long wait on the
    /// rings asks it whether a peer took another path for this collective
    /// ([`host_direct::Direct::crossed`]).
    pub direct: Option<&'a host_direct::Direct>,
}

/// How long a wait on the rings goes before it looks whether a peer is in
/// this collective on another path: longer than a small message's trip,
/// short beside anything a person would notice.
const CROSSED_AFTER: Duration = Duration::from_millis(1);

/// Names a lane in errors. Written out only when an error needs it: a
/// collective formatted its channel's name at every operation otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneLabel {
    /// A collective's channel.
    Channel(usize),
    /// Point-to-point messages to (`true`) or from a peer.
    P2p { peer: usize, send: bool },
}

impl std::fmt::Display for LaneLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            LaneLabel::Channel(c) => write!(f, "channel {c}"),
            LaneLabel::P2p { peer, send: true } => write!(f, "p2p send to rank {peer}"),
            LaneLabel::P2p { peer, send: false } => write!(f, "p2p recv from rank {peer}"),
        }
    }
}

/// What a lane keeps between operations: its staging slots, and the
/// emptied containers of its state, whose capacity a small operation
/// would otherwise allocate again every time (a few of the allocations
/// that were a visible share of an 8-byte operation's latency).
#[derive(Default)]
pub struct Staging {
    /// Each slot is allocated once at its full size and never moves, since
    /// connections keep it registered: it must outlive the lane's
    /// connections.
    slots: Vec<(Vec<u8>, Vec<u8>)>,
    tasks: SpareTasks,
    free_slots: Vec<usize>,
    hdr_sent: Vec<usize>,
    hdr_recv_posted: Vec<usize>,
    busy: Vec<usize>,
}

/// An emptied task queue, kept for its capacity; made only by
/// [`SpareTasks::emptied`], so it never holds a task.
#[derive(Default)]
struct SpareTasks(VecDeque<Task>);

impl SpareTasks {
    fn emptied(mut q: VecDeque<Task>) -> SpareTasks {
        q.clear();
        SpareTasks(q)
    }
}

// SAFETY: a SpareTasks is only ever empty (its one constructor clears the
// queue), so no task, and none of the addresses a task holds, crosses
// threads with it: only its allocation does.
#[allow(unsafe_code)]
unsafe impl Send for SpareTasks {}

impl Lane {
    fn bufs_of(&self, step: usize) -> &OpBuffers {
        self.bufs.get(step).unwrap_or(&self.bufs[0])
    }
}

struct Task {
    step: usize,
    off: usize,
    n: usize,
    slot: usize,
    recv_req: Option<Box<dyn Request>>,
    /// Where the slice's data lands (after the header, if prefixed).
    recv_span: Option<Span>,
    /// This receive also carries the peer's operation header.
    prefixed: bool,
    recv_done: bool,
    computed: bool,
    /// What to send once computed (or, for an exchange, before).
    send_span: Option<Span>,
    /// `send_span` is the first message to its peer, already built with
    /// the header in front in the task's send slot.
    framed: bool,
    send_req: Option<Box<dyn Request>>,
    send_done: bool,
    /// Profiler proxy ops and steps of the send and the receive ([`NO_OP`]
    /// and NONE when not profiled).
    send_op: usize,
    send_ev: Handle,
    recv_op: usize,
    recv_ev: Handle,
    /// The profiler handles passed with the send and the receive (only
    /// when the mask asks for network events): kept until the task is
    /// done, past its requests' completion and its steps' end.
    send_ph: Option<Box<NetParent>>,
    recv_ph: Option<Box<NetParent>>,
}

/// A receive's proxy step, started before its `irecv`: kept here while the
/// network has not taken the receive (declined, or the call is under way).
struct PendingRecv {
    op: usize,
    ev: Handle,
    ph: Option<Box<NetParent>>,
}

struct LaneState<'a> {
    /// Where the next slice to open is.
    cursor: Cursor,
    tasks: VecDeque<Task>,
    free_slots: Vec<usize>,
    slots: Vec<(Vec<u8>, Vec<u8>)>,
    hdr: [u8; HEADER_BYTES],
    /// Peers whose first message (the one carrying the header) is posted.
    hdr_sent: Vec<usize>,
    hdr_recv_posted: Vec<usize>,
    /// Peers with a send in flight, within one pass of `test_sends`.
    busy: Vec<usize>,
    /// Bytes of every staging slot: a first message (header and a whole
    /// slice) fits.
    slot_bytes: usize,
    done: bool,
    prof: Option<Proxies<'a>>,
    /// The step of the next receive, when the network declined it: the
    /// same slice is offered again (the cursor stays).
    pending_recv: Option<PendingRecv>,
}

type Progress = Result<bool>;

impl<'a> LaneState<'a> {
    fn new(lane: &mut Lane, prof: Option<ProxyProfiler<'a>>) -> LaneState<'a> {
        let prof = prof.map(|p| Proxies::start(p, lane));
        let Staging {
            mut slots,
            tasks: SpareTasks(tasks),
            mut free_slots,
            mut hdr_sent,
            mut hdr_recv_posted,
            mut busy,
        } = std::mem::take(&mut lane.staging);
        slots.resize_with(WINDOW, Default::default);
        free_slots.clear();
        free_slots.extend((0..WINDOW).rev());
        hdr_sent.clear();
        hdr_recv_posted.clear();
        busy.clear();
        LaneState {
            cursor: Cursor::new(&lane.steps, lane.slice_bytes / lane.reducer.dtype().size()),
            tasks,
            free_slots,
            slots,
            hdr: lane.header.encode(),
            hdr_sent,
            hdr_recv_posted,
            busy,
            slot_bytes: HEADER_BYTES + lane.slice_bytes,
            done: false,
            prof,
            pending_recv: None,
        }
    }

    fn slot(&mut self, i: usize, send: bool, bytes: usize) -> Result<Span> {
        slot(&mut self.slots, self.slot_bytes, i, send, bytes)
    }

    /// Whether none of the lane's requests can still be posted in the
    /// network: its buffers may then be released.
    fn settled(&self) -> bool {
        self.tasks
            .iter()
            .all(|t| (t.recv_req.is_none() || t.recv_done) && (t.send_req.is_none() || t.send_done))
    }

    /// Advances the lane as far as it can without waiting; returns whether
    /// anything moved.
    fn poll(&mut self, lane: &mut Lane, rank: usize) -> Progress {
        let mut moved = false;
        moved |= self.create_tasks(lane)?;
        moved |= self.compute(lane, rank)?;
        // A send the plugin declined (isend answered no request: "not now",
        // as aws-ofi-nccl does until the peer's receive is known) is offered
        // again on every turn, not only when another slice is computed.
        moved |= self.post_sends(lane)?;
        moved |= self.test_sends(lane)?;
        while self
            .tasks
            .front()
            .is_some_and(|t| t.computed && (t.send_span.is_none() || t.send_done))
        {
            let t = self.tasks.pop_front().expect("front exists");
            self.free_slots.push(t.slot);
            moved = true;
        }
        if self.tasks.is_empty() && self.cursor.peek(&lane.steps).is_none() {
            self.done = true;
        }
        Ok(moved)
    }

    /// Opens slices in order while slots are free, posting their receives.
    /// The first message from each peer carries the operation header in
    /// front of its data, so checking costs no extra message.
    fn create_tasks(&mut self, lane: &mut Lane) -> Progress {
        let mut moved = false;
        let esize = lane.reducer.dtype().size();
        while let Some(&slot) = self.free_slots.last() {
            let Some((step_no, off, n)) = self.cursor.peek(&lane.steps) else {
                break;
            };
            let step = lane.steps[step_no];
            let mut task = Task {
                step: step_no,
                off,
                n,
                slot,
                recv_req: None,
                recv_span: None,
                prefixed: false,
                recv_done: step.recv.is_none(),
                computed: false,
                send_span: None,
                framed: false,
                send_req: None,
                send_done: false,
                send_op: NO_OP,
                send_ev: Handle::NONE,
                recv_op: NO_OP,
                recv_ev: Handle::NONE,
                send_ph: None,
                recv_ph: None,
            };
            if let Some(peer) = step.recv {
                task.prefixed = !self.hdr_recv_posted.contains(&peer);
                // Straight into the output when nothing is combined with it on the way.
                let direct = step.src.is_none()
                    && !(step.finalize && lane.reducer.has_post())
                    && !task.prefixed;
                let (post, data) = match step.dst {
                    Some(d) if direct => {
                        let s = lane.bufs_of(task.step).span(d, task.off, n, esize)?;
                        (s, s)
                    }
                    _ => {
                        // A first message has room for a whole slice, so that a peer
                        // that disagrees on the count is caught by its header, not
                        // by a truncation inside the network.
                        let (extra, room) = if task.prefixed {
                            (HEADER_BYTES, (n * esize).max(lane.slice_bytes))
                        } else {
                            (0, n * esize)
                        };
                        let whole = self.slot(slot, false, extra + room)?;
                        (
                            whole,
                            Span {
                                ptr: whole.ptr.wrapping_add(extra),
                                len: n * esize,
                            },
                        )
                    }
                };
                let (whole, scope) = buffer_of(&self.slots, lane.bufs_of(task.step), post)
                    .ok_or_else(|| unknown_buffer(post, lane))?;
                let c = lane
                    .recv
                    .get_mut(&peer)
                    .expect("recv peer has a connection");
                let mr = c
                    .mr(post, whole, scope)
                    .map_err(|e| reg_err(e, "receive from", peer, whole, &lane.label))?;
                if self.pending_recv.is_none() {
                    let (op, ev, ph) = match &mut self.prof {
                        Some(p) => {
                            let (op, ev) = p.recv_step(step_no, peer, post.len);
                            (op, ev, p.net_parent(ev))
                        }
                        None => (NO_OP, Handle::NONE, None),
                    };
                    self.pending_recv = Some(PendingRecv { op, ev, ph });
                }
                let prof = self
                    .pending_recv
                    .as_ref()
                    .and_then(|r| r.ph.as_ref())
                    .and_then(|ph| ph.prof());
                // SAFETY: the span is a bounds-checked user or staging buffer
                // that nothing else touches until this task completes; `mr`
                // is this connection's registration covering it. The
                // profiler handle lives in the task until it is done.
                #[allow(unsafe_code)]
                let req = unsafe {
                    c.comm()
                        .irecv_profiled(post.ptr, post.len, 0, Some(mr), prof)
                }
                .map_err(|e| net_err(e, "receive from", peer, lane))?;
                let Some(req) = req else { break };
                if task.prefixed {
                    self.hdr_recv_posted.push(peer);
                }
                task.recv_req = Some(req);
                task.recv_span = Some(data);
                let r = self.pending_recv.take().expect("set above");
                (task.recv_op, task.recv_ev, task.recv_ph) = (r.op, r.ev, r.ph);
                if let Some(p) = &mut self.prof {
                    p.recv_posted(r.op, post.len);
                }
            }
            if let (Some(p), Some(peer)) = (&mut self.prof, step.send) {
                (task.send_op, task.send_ev) = p.send_created(step_no, peer, n * esize);
            }
            self.free_slots.pop();
            self.cursor.advance(&lane.steps);
            self.tasks.push_back(task);
            moved = true;
        }
        Ok(moved)
    }

    /// Combines arrived slices in order and queues what they send.
    fn compute(&mut self, lane: &mut Lane, rank: usize) -> Progress {
        let mut moved = false;
        let esize = lane.reducer.dtype().size();
        for i in 0..self.tasks.len() {
            if self.tasks[i].computed {
                continue;
            }
            let step = lane.steps[self.tasks[i].step];
            let (off, n, slot) = (self.tasks[i].off, self.tasks[i].n, self.tasks[i].slot);
            let local = match step.src {
                Some(s) => Some((
                    lane.bufs_of(self.tasks[i].step).span(s, off, n, esize)?,
                    s.buf == Buf::Input,
                )),
                None => None,
            };
            if step.send_local && self.tasks[i].send_span.is_none() {
                // An exchange: what goes out is the value before combining, so
                // it is copied aside first (the combine may overwrite it).
                let (l, pre) = local.expect("an exchange has a local operand");
                let out = self.slot(slot, true, n * esize)?;
                mem::produce(&lane.reducer, out, Some((l, pre)), None, false);
                self.tasks[i].send_span = Some(out);
                moved |= self.post_sends(lane)?;
            }
            let t = &mut self.tasks[i];
            if !t.recv_done {
                let peer = step.recv.expect("pending receive has a peer");
                let req = t.recv_req.as_mut().expect("posted");
                match req
                    .test_first()
                    .map_err(|e| net_err(e, "receive from", peer, lane))?
                {
                    Some(size) => {
                        let want = n * esize + if t.prefixed { HEADER_BYTES } else { 0 };
                        // A plugin that reports no size (see `Request::test`)
                        // leaves the header check alone to catch ranks out of step.
                        let got = size.unwrap_or(want);
                        let data = t.recv_span.expect("posted").ptr;
                        if t.prefixed {
                            let hdr = data.wrapping_sub(HEADER_BYTES);
                            let mut seen = [0u8; HEADER_BYTES];
                            let seen = &mut seen[..got.min(HEADER_BYTES)];
                            mem::read_into(hdr, seen);
                            lane.header.check(seen, peer, rank)?;
                        }
                        if got != want {
                            return Err(Error::Remote(format!(
                                "{}: rank {peer} sent {got} bytes where {want} were expected: the ranks disagree on the operation",
                                lane.label
                            )));
                        }
                        t.recv_done = true;
                        if let Some(p) = &mut self.prof {
                            p.received(t.recv_op, t.recv_ev, got);
                        }
                    }
                    None => break,
                }
            }
            let received = t.recv_span;
            let post = step.finalize;
            let result = match (step.dst, received, local) {
                (Some(d), _, _) => {
                    let dst = lane.bufs_of(self.tasks[i].step).span(d, off, n, esize)?;
                    if received != Some(dst) {
                        mem::produce(&lane.reducer, dst, local, received, post);
                    }
                    dst
                }
                (None, Some(m), Some(_)) => {
                    mem::produce(&lane.reducer, m, local, Some(m), post);
                    m
                }
                (None, Some(m), None) => m,
                (None, None, Some((l, pre))) => {
                    if lane.reducer.changes(pre, post) {
                        let out = self.slot(slot, true, n * esize)?;
                        mem::produce(&lane.reducer, out, Some((l, pre)), None, post);
                        out
                    } else {
                        l
                    }
                }
                (None, None, None) => {
                    return Err(Error::Internal(format!(
                        "{}: a step with no data",
                        lane.label
                    )))
                }
            };
            let t = &mut self.tasks[i];
            t.computed = true;
            if let (Some(p), Some(_)) = (&mut self.prof, step.recv) {
                p.consumed(t.recv_op, std::mem::replace(&mut t.recv_ev, Handle::NONE));
            }
            if step.send.is_some() && !step.send_local {
                t.send_span = Some(result);
            }
            moved = true;
            moved |= self.post_sends(lane)?;
        }
        Ok(moved)
    }

    /// Posts queued sends strictly in task order (the order on the wire).
    fn post_sends(&mut self, lane: &mut Lane) -> Progress {
        let mut moved = false;
        for t in self.tasks.iter_mut() {
            let step = lane.steps[t.step];
            if step.send.is_none() || t.send_req.is_some() || t.send_done {
                continue;
            }
            let Some(span) = t.send_span else { break };
            let peer = step.send.expect("checked");
            if !t.framed && !self.hdr_sent.contains(&peer) {
                // The first message to a peer leads with the header, built
                // in the task's own send slot: a buffer that is already
                // registered and free until this send completes (an
                // exchange's copy there is moved up to make room).
                let room = slot(
                    &mut self.slots,
                    self.slot_bytes,
                    t.slot,
                    true,
                    HEADER_BYTES + span.len,
                )?;
                t.send_span = Some(mem::prefix_into(room, &self.hdr, span)?);
                t.framed = true;
            }
            let out = t.send_span.expect("set above");
            let (whole, scope) = buffer_of(&self.slots, lane.bufs_of(t.step), out)
                .ok_or_else(|| unknown_buffer(out, lane))?;
            let c = lane
                .send
                .get_mut(&peer)
                .expect("send peer has a connection");
            let mr = c
                .mr(out, whole, scope)
                .map_err(|e| reg_err(e, "send to", peer, whole, &lane.label))?;
            if let Some(p) = &self.prof {
                p.send_ready(t.send_op, t.send_ev, out.len);
                if t.send_ph.is_none() {
                    t.send_ph = p.net_parent(t.send_ev);
                }
            }
            let prof = t.send_ph.as_ref().and_then(|ph| ph.prof());
            // SAFETY: the span stays valid and unchanged until the send
            // completes: the task holds its slots (first messages are built
            // in its send slot) and user regions being sent are not written
            // by later tasks; `mr` is this connection's registration
            // covering it. The profiler handle lives in the task until it
            // is done.
            #[allow(unsafe_code)]
            let req = unsafe { c.comm().isend_profiled(out.ptr, out.len, 0, Some(mr), prof) }
                .map_err(|e| net_err(e, "send to", peer, lane))?;
            match req {
                Some(r) => {
                    if t.framed {
                        self.hdr_sent.push(peer);
                    }
                    t.send_req = Some(r);
                    if let Some(p) = &mut self.prof {
                        p.sent(t.send_op, t.send_ev, out.len);
                    }
                    moved = true;
                }
                None => break,
            }
        }
        Ok(moved)
    }

    /// Tests each connection's sends oldest first, and none behind one
    /// still in flight: NCCL's proxy tests a connection's requests in the
    /// order it posted them, and plugins rely on it (Google's Fast Socket
    /// fails a test of any other request of the connection).
    fn test_sends(&mut self, lane: &Lane) -> Progress {
        let mut moved = false;
        let busy = &mut self.busy;
        busy.clear();
        for t in self.tasks.iter_mut() {
            if let (Some(r), false) = (t.send_req.as_mut(), t.send_done) {
                let peer = lane.steps[t.step].send.expect("a send has a peer");
                if busy.contains(&peer) {
                    continue;
                }
                if r.test_first()
                    .map_err(|e| Error::from(e).context("send"))?
                    .is_some()
                {
                    t.send_done = true;
                    if let Some(p) = &mut self.prof {
                        p.send_done(t.send_op, std::mem::replace(&mut t.send_ev, Handle::NONE));
                    }
                    moved = true;
                } else {
                    busy.push(peer);
                }
            }
        }
        Ok(moved)
    }

    /// Hands the profiler handles of requests a failed operation left
    /// posted to their connections, which free them once closed: the
    /// network may still report under them until then.
    fn park_handles(&mut self, lane: &mut Lane) {
        for t in &mut self.tasks {
            let step = lane.steps[t.step];
            if t.recv_req.is_some() && !t.recv_done {
                if let (Some(ph), Some(c)) = (
                    t.recv_ph.take(),
                    step.recv.and_then(|p| lane.recv.get_mut(&p)),
                ) {
                    c.park(ph);
                }
            }
            if t.send_req.is_some() && !t.send_done {
                if let (Some(ph), Some(c)) = (
                    t.send_ph.take(),
                    step.send.and_then(|p| lane.send.get_mut(&p)),
                ) {
                    c.park(ph);
                }
            }
        }
    }

    /// Peers this lane is waiting on, for the timeout message.
    fn waiting_on(&self, lane: &Lane) -> Vec<String> {
        let mut w = Vec::new();
        if let Some(t) = self.tasks.iter().find(|t| !t.recv_done) {
            if let Some(p) = lane.steps[t.step].recv {
                w.push(format!(
                    "to receive from rank {p} ({}, step {})",
                    lane.label, t.step
                ));
            }
        }
        if let Some(t) = self
            .tasks
            .iter()
            .find(|t| t.send_req.is_some() && !t.send_done)
        {
            if let Some(p) = lane.steps[t.step].send {
                w.push(format!(
                    "for rank {p} to take data ({}, step {})",
                    lane.label, t.step
                ));
            }
        }
        w
    }
}

fn net_err(e: oxccl_plugin::NetError, dir: &str, peer: usize, lane: &Lane) -> Error {
    Error::from(e).context(format!("{dir} rank {peer} ({})", lane.label))
}

fn reg_err(
    e: oxccl_plugin::NetError,
    dir: &str,
    peer: usize,
    whole: Span,
    label: &LaneLabel,
) -> Error {
    Error::from(e).context(format!(
        "regMr of {} bytes of host memory at {:p} on the connection to {dir} rank {peer} ({label})",
        whole.len, whole.ptr
    ))
}

fn unknown_buffer(span: Span, lane: &Lane) -> Error {
    Error::Internal(format!(
        "{}: {} bytes at {:p} lie in no staging slot or buffer of the operation",
        lane.label, span.len, span.ptr
    ))
}

/// `bytes` at the start of staging slot `i` (its send or receive half),
/// allocated at its full size `slot_bytes` on first use. It never grows
/// after that: connections keep it registered.
fn slot(
    slots: &mut [(Vec<u8>, Vec<u8>)],
    slot_bytes: usize,
    i: usize,
    send: bool,
    bytes: usize,
) -> Result<Span> {
    let (r, s) = &mut slots[i];
    let v = if send { s } else { r };
    if v.is_empty() {
        *v = vec![0; slot_bytes];
    }
    if bytes > v.len() {
        return Err(Error::Internal(format!(
            "{bytes} bytes asked of a {}-byte staging slot",
            v.len()
        )));
    }
    Ok(mem::staging(&mut v[..bytes]))
}

/// The buffer `span` lies in and how long its registration lives: a
/// staging slot (kept), else the step's output or input (the operation's).
/// Output first: an in-place all-gather names an input inside the output,
/// which one registration then covers.
fn buffer_of(slots: &[(Vec<u8>, Vec<u8>)], bufs: &OpBuffers, span: Span) -> Option<(Span, Scope)> {
    let by_addr = |v: &Vec<u8>| Span {
        ptr: v.as_ptr() as *mut u8,
        len: v.len(),
    };
    let staged = slots
        .iter()
        .flat_map(|(r, s)| [by_addr(r), by_addr(s)])
        .find(|w| w.len > 0 && w.holds(span))
        .map(|w| (w, Scope::Kept));
    let user = || {
        [
            Span {
                ptr: bufs.output,
                len: bufs.out_bytes,
            },
            Span {
                ptr: bufs.input as *mut u8,
                len: bufs.in_bytes,
            },
            Span {
                ptr: bufs.scratch,
                len: bufs.scratch_bytes,
            },
        ]
        .into_iter()
        .find(|w| w.len > 0 && w.holds(span))
        .map(|w| (w, Scope::Op))
    };
    staged.or_else(user)
}

/// Runs lanes to completion on this thread.
pub fn run(lanes: &mut [Lane], ctx: &ExecCtx<'_>) -> Result<()> {
    let mut ctrl = ProxyCtrl::new(ctx.ctrl);
    // A lane is a channel: each peer it sends to or receives from is one
    // of NCCL's proxy ops.
    ctrl.append(lanes.iter().map(|l| l.send.len() + l.recv.len()).sum());
    if let [lane] = lanes {
        // One lane (every small collective): its state needs no vector.
        let mut states = [LaneState::new(lane, ctx.prof)];
        let result = drive(std::slice::from_mut(lane), &mut states, ctx, &mut ctrl);
        let [st] = states;
        return finish(lane, st, result);
    }
    let mut states: Vec<LaneState> = lanes
        .iter_mut()
        .map(|l| LaneState::new(l, ctx.prof))
        .collect();
    let mut result = drive(lanes, &mut states, ctx, &mut ctrl);
    for (lane, st) in lanes.iter_mut().zip(states) {
        result = finish(lane, st, result);
    }
    result
}

/// Ends a lane's operation: registrations, profiler events, and what the
/// lane keeps for the next one. Returns `result`, or the first error of
/// ending when `result` is a success.
fn finish(lane: &mut Lane, mut st: LaneState<'_>, mut result: Result<()>) -> Result<()> {
    let settled = st.settled();
    let ended = end_registrations(lane, settled);
    if result.is_ok() {
        result = ended;
    }
    if !settled {
        st.park_handles(lane);
    }
    if let Some(p) = st.prof {
        // A failed lane leaves events open: they end here, inside
        // their parents, as on success.
        let pending = st.pending_recv.as_ref().map(|r| r.ev);
        let open = st.tasks.iter().flat_map(|t| [t.send_ev, t.recv_ev]);
        p.finish(open.chain(pending));
    }
    lane.staging = Staging {
        slots: st.slots,
        // Requests a failed operation left posted go with their tasks
        // here, as they did when the state was dropped whole.
        tasks: SpareTasks::emptied(st.tasks),
        free_slots: st.free_slots,
        hdr_sent: st.hdr_sent,
        hdr_recv_posted: st.hdr_recv_posted,
        busy: st.busy,
    };
    result
}

/// Releases the registrations of the operation's buffers on every
/// connection of the lane, or (`settled` false: a request may still be
/// posted) leaves them until the connection closes.
fn end_registrations(lane: &mut Lane, settled: bool) -> Result<()> {
    let mut first = Ok(());
    let label = &lane.label;
    let sends = lane
        .send
        .iter_mut()
        .map(|(p, c)| (*p, "send to", c.end_op(settled)));
    let recvs = lane
        .recv
        .iter_mut()
        .map(|(p, c)| (*p, "receive from", c.end_op(settled)));
    for (peer, dir, r) in sends.chain(recvs) {
        if let (Err(e), true) = (r, first.is_ok()) {
            first = Err(Error::from(e).context(format!(
                "deregMr at the end of {label} on the connection to {dir} rank {peer}"
            )));
        }
    }
    first
}

fn drive(
    lanes: &mut [Lane],
    states: &mut [LaneState<'_>],
    ctx: &ExecCtx<'_>,
    ctrl: &mut ProxyCtrl<'_>,
) -> Result<()> {
    let mut last_move = Instant::now();
    let mut idle: u32 = 0;
    let mut turns: u32 = 0;
    // When this wait next asks its peers what they called (see `ask_peers`).
    let mut ask_at = ASK_AFTER;
    loop {
        // A revoke or abort ends a busy operation too, not only a stuck one.
        turns = turns.wrapping_add(1);
        if turns.is_multiple_of(1024) {
            if let Some(e) = ctx.stop.error(&(ctx.what)()) {
                return Err(e);
            }
        }
        let mut moved = false;
        let mut all_done = true;
        let mut failed = None;
        for (lane, st) in lanes.iter_mut().zip(states.iter_mut()) {
            if st.done {
                continue;
            }
            match st.poll(lane, ctx.rank) {
                Ok(m) => moved |= m,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
            all_done &= st.done;
        }
        if let Some(e) = failed {
            // Headers that differ, a message longer or shorter than its
            // receive, a peer that closed its connection on such an error:
            // a peer's report (a message left from a collective it failed
            // in may be what broke this one), else what the peers called as
            // this collective (or as the last one a peer is still in), says
            // more, where they called another.
            if let Some((who, msg)) = ctx.bootstrap.remote_failure() {
                return Err(Error::Remote(format!(
                    "rank {who} failed: {msg} (seen here as: {e})"
                )));
            }
            ask_peers(ctx, lanes, states)?;
            return Err(prefer_peer_report(ctx, e));
        }
        if all_done {
            return Ok(());
        }
        ctrl.pass(moved);
        if moved {
            last_move = Instant::now();
            idle = 0;
            ask_at = ASK_AFTER;
            continue;
        }
        idle = idle.saturating_add(1);
        // Spin briefly (a small message is a few microseconds away), then
        // give the cores to the network's helper threads: on a busy machine
        // a polling thread would otherwise steal the time the copies need.
        let waited = last_move.elapsed();
        if waited < Duration::from_micros(50) {
            std::hint::spin_loop();
        } else if waited < Duration::from_millis(5) {
            std::thread::yield_now();
        } else {
            ctrl.sleep(|| std::thread::sleep(Duration::from_micros(200)));
        }
        if idle.is_multiple_of(64) {
            if let Some(e) = ctx.stop.error(&(ctx.what)()) {
                return Err(e);
            }
            if let Some((who, msg)) = ctx.bootstrap.remote_failure() {
                return Err(Error::Remote(format!("rank {who} failed: {msg}")));
            }
            if let (Some(d), true) = (ctx.direct, waited > CROSSED_AFTER) {
                d.crossed()?;
            }
            if waited > ask_at {
                ask_peers(ctx, lanes, states)?;
                // Again and again while the wait lasts (a peer may come to
                // this collective late), ever less often, at least once a
                // second.
                ask_at = waited + waited.min(ASK_EVERY);
            }
            if waited > ctx.timeout {
                let waits: Vec<String> = lanes
                    .iter()
                    .zip(states.iter())
                    .filter(|(_, s)| !s.done)
                    .flat_map(|(l, s)| s.waiting_on(l))
                    .collect();
                return Err(timeout_error(ctx, &waits));
            }
        }
    }
}
