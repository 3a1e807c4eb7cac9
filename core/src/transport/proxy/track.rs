//! The profiler's proxy events on the device path. The proxy thread
//! follows the kernels' slot counters and knows nothing of operations, so
//! the host announces each launch before it launches it: how many steps
//! the kernel will move on each of the proxy's connections, each direction
//! (counted from the launch's shape as the kernel loops), and, where the
//! group's mask asks for proxy events, the operation's event to hang them
//! under. Steps are numbered on a connection from its first launch on, so
//! the announcements cut each connection's step stream into proxy ops
//! (NCCL's `sub->base` and `nsteps`); every launch is announced, profiled
//! or not, as long as a profiler is attached.
//!
//! While it follows the announcements, the proxy posts receives only for
//! steps a launch announced, as NCCL's proxy posts them only for ops
//! appended to it: each receive then carries its step's net-plugin
//! handle from the start. Sends wait for their announcement too, which
//! comes before the kernel exists. A launch the host cannot count (one
//! captured into a CUDA graph, which replays it unannounced; one that
//! failed) ends this for good: the proxy goes back to posting freely, with
//! no proxy events.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use oxccl_plugin::NetProf;

use crate::plugin::profiler::{Handle, NetParent, OpDescr, OpEvents, ProfilerComm, ProxyProfiler};
use crate::transport::layout::Proto;

/// The steps one launch moves on one connection, one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnSteps {
    pub peer: usize,
    pub chan: usize,
    pub send: bool,
    pub steps: u64,
    /// The operation's event, when the mask asks for proxy events (NONE
    /// where the plugin does not track the operation: NCCL then starts the
    /// proxy op without a parent).
    pub parent: Option<Handle>,
    /// Bytes per step at most.
    pub chunk_bytes: usize,
    /// The FIFO the steps go through (the LL one has links of its own).
    pub proto: Proto,
}

/// One launch's announcement.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// The group's activation mask.
    pub mask: i32,
    /// In the order the kernel moves them on each connection.
    pub conns: Vec<ConnSteps>,
}

pub(super) enum Notice {
    Launch(Launch),
    /// A launch went unannounced: step numbers are no longer known.
    Lost,
}

/// Announcements waiting for the proxy thread.
#[derive(Default)]
pub(super) struct Notices {
    q: Mutex<Vec<Notice>>,
    pending: AtomicBool,
}

impl Notices {
    pub fn push(&self, n: Notice) {
        if let Ok(mut q) = self.q.lock() {
            q.push(n);
        }
        self.pending.store(true, Ordering::Release);
    }

    /// What came since the last call; no lock while nothing did.
    pub fn take(&self) -> Vec<Notice> {
        if !self.pending.swap(false, Ordering::Acquire) {
            return Vec::new();
        }
        self.q
            .lock()
            .map(|mut q| std::mem::take(&mut *q))
            .unwrap_or_default()
    }
}

/// A profiled proxy op: steps `first..first + n` of its connection.
struct Span {
    first: u64,
    n: u64,
    mask: i32,
    ev: OpEvents,
}

/// A step whose event is open.
struct Open {
    step: u64,
    ev: Handle,
    /// Passed with the step's network operation: kept until it completed
    /// and the step ended.
    ph: Option<Box<NetParent>>,
}

/// One direction of one connection.
#[derive(Default)]
pub(super) struct Track {
    /// Steps announced so far.
    end: u64,
    spans: VecDeque<Span>,
    /// Steps in order.
    open: VecDeque<Open>,
    /// The next step to open.
    opened: u64,
}

fn pp(comm: &Arc<ProfilerComm>, mask: i32) -> ProxyProfiler<'_> {
    ProxyProfiler { comm, mask }
}

impl Track {
    /// Whether step `k` was announced.
    pub fn covers(&self, k: u64) -> bool {
        k < self.end
    }

    /// Appends a launch's steps; whether they are a profiled proxy op.
    pub fn add(&mut self, comm: &Arc<ProfilerComm>, mask: i32, c: &ConnSteps) -> bool {
        let first = self.end;
        self.end += c.steps;
        let Some(parent) = c.parent.filter(|_| c.steps > 0) else {
            return false;
        };
        let d = OpDescr {
            parent,
            channel: (c.chan % crate::plugin::profiler::REPORTED_CHANNELS) as u8,
            peer: c.peer as i32,
            n_steps: i32::try_from(c.steps).unwrap_or(i32::MAX),
            chunk_size: i32::try_from(c.chunk_bytes).unwrap_or(i32::MAX),
            is_send: c.send,
        };
        let ev = OpEvents::start(pp(comm, mask), d);
        self.spans.push_back(Span {
            first,
            n: c.steps,
            mask,
            ev,
        });
        true
    }

    fn span(spans: &mut VecDeque<Span>, k: u64) -> Option<&mut Span> {
        spans.iter_mut().find(|s| s.first <= k && k < s.first + s.n)
    }

    fn at(&mut self, k: u64) -> Option<(&mut Span, &mut Open)> {
        let o = self.open.iter_mut().find(|o| o.step == k)?;
        let s = Self::span(&mut self.spans, k)?;
        Some((s, o))
    }

    fn retire(&mut self) {
        while self.spans.front().is_some_and(|s| s.ev.finished()) {
            self.spans.pop_front();
        }
    }

    /// Opens the send steps before `upto` (slots the kernel may fill now):
    /// "GPU wait".
    pub fn open_sends(&mut self, comm: &Arc<ProfilerComm>, upto: u64) {
        let upto = upto.min(self.end);
        while self.opened < upto {
            let k = self.opened;
            self.opened += 1;
            if let Some(s) = Self::span(&mut self.spans, k) {
                let ev = s.ev.send_created(pp(comm, s.mask), 0);
                self.open.push_back(Open {
                    step: k,
                    ev,
                    ph: None,
                });
            }
        }
    }

    /// Step `k`'s data is ready and its send is tried: "peer wait"; the
    /// handle to pass with it.
    pub fn send_try(&mut self, comm: &Arc<ProfilerComm>, k: u64, bytes: usize) -> Option<NetProf> {
        self.open_sends(comm, k + 1);
        let (s, o) = self.at(k)?;
        let p = pp(comm, s.mask);
        s.ev.send_ready(p, o.ev, bytes);
        if o.ph.is_none() {
            o.ph = p.net_parent(o.ev);
        }
        o.ph.as_ref().and_then(|ph| ph.prof())
    }

    /// The network took step `k`'s send: "send wait".
    pub fn sent(&mut self, comm: &Arc<ProfilerComm>, k: u64, bytes: usize) {
        if let Some((s, o)) = self.at(k) {
            s.ev.sent(pp(comm, s.mask), o.ev, bytes);
        }
    }

    /// Step `k`'s send completed (they complete in order).
    pub fn send_done(&mut self, comm: &Arc<ProfilerComm>, k: u64) {
        if self.open.front().is_some_and(|o| o.step == k) {
            let o = self.open.pop_front().expect("front exists");
            if let Some(s) = Self::span(&mut self.spans, k) {
                s.ev.send_done(pp(comm, s.mask), o.ev);
            }
            self.retire();
        }
    }

    /// A receive for step `k` is about to be posted: its step starts with
    /// "recv wait" (once, however often the network declines it); the
    /// handle to pass with it.
    pub fn recv_try(&mut self, comm: &Arc<ProfilerComm>, k: u64, bytes: usize) -> Option<NetProf> {
        while self.opened <= k {
            let j = self.opened;
            self.opened += 1;
            if let Some(s) = Self::span(&mut self.spans, j) {
                let p = pp(comm, s.mask);
                let ev = s.ev.recv_step(p, bytes);
                let ph = p.net_parent(ev);
                self.open.push_back(Open { step: j, ev, ph });
            }
        }
        let (_, o) = self.at(k)?;
        o.ph.as_ref().and_then(|ph| ph.prof())
    }

    /// Step `k`'s receive was posted.
    pub fn recv_posted(&mut self, comm: &Arc<ProfilerComm>, k: u64, bytes: usize) {
        if let Some((s, _)) = self.at(k) {
            s.ev.recv_posted(pp(comm, s.mask), bytes);
        }
    }

    /// Step `k` arrived (`bytes`) and is published to the kernel.
    pub fn received(&mut self, comm: &Arc<ProfilerComm>, k: u64, bytes: usize) {
        if let Some((s, o)) = self.at(k) {
            s.ev.received(pp(comm, s.mask), o.ev, bytes);
        }
    }

    /// The kernel consumed the steps before `upto`: they end.
    pub fn consumed(&mut self, comm: &Arc<ProfilerComm>, upto: u64) {
        while self.open.front().is_some_and(|o| o.step < upto) {
            let o = self.open.pop_front().expect("front exists");
            if let Some(s) = Self::span(&mut self.spans, o.step) {
                s.ev.consumed(pp(comm, s.mask), o.ev);
            }
        }
        self.retire();
    }

    /// Ends every open event; the handles of operations that may still be
    /// posted go to `park`, which keeps them until their connection closes.
    pub fn finish(&mut self, comm: &Arc<ProfilerComm>, park: &mut dyn FnMut(Box<NetParent>)) {
        for o in self.open.drain(..) {
            comm.stop(o.ev);
            if let Some(ph) = o.ph {
                park(ph);
            }
        }
        for mut s in self.spans.drain(..) {
            s.ev.finish(pp(comm, s.mask));
        }
    }
}
