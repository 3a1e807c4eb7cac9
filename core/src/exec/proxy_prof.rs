//! The profiler's proxy events on the host path, at the points where NCCL's
//! proxy thread reports them (src/transport/net.cc, src/plugin/profiler.cc):
//! a proxy op per (operation, peer, direction) of a lane, started when the
//! lane starts, "in progress" (v4's state) before its first step, stopped
//! when its last step completes; a proxy step per slice sent or received,
//! with NCCL's state sequence (net.cc's sendProxyProgress and
//! recvProxyProgress): a send step starts when its slice is opened and is
//! at once "GPU wait" (its data not yet produced), "peer wait" when the
//! data is ready and the send is tried, "send wait" once the network took
//! it, stopped when the send completes; a receive step starts when the
//! receive is posted and is at once "recv wait", "flush wait" (with the
//! bytes received) and then "GPU wait" when the network completed it (host
//! memory needs no flush, so the two follow each other as in NCCL without
//! one), stopped when the received slice has been used.
//!
//! Only built when the group's activation mask asks for proxy events, so
//! that the executor otherwise pays a `None` check per slice.

use std::os::raw::c_int;

use oxccl_plugin::ffi::profiler::{
    EventState, NCCL_PROFILER_PROXY_OP_IN_PROGRESS_V4, NCCL_PROFILER_PROXY_OP_RECV_DONE,
    NCCL_PROFILER_PROXY_OP_RECV_POSTED, NCCL_PROFILER_PROXY_OP_RECV_RECEIVED,
    NCCL_PROFILER_PROXY_OP_SEND_DONE, NCCL_PROFILER_PROXY_OP_SEND_POSTED,
    NCCL_PROFILER_PROXY_OP_SEND_TRANSMITTED, NCCL_PROFILER_PROXY_STEP_RECV_FLUSH_WAIT,
    NCCL_PROFILER_PROXY_STEP_RECV_GPU_WAIT, NCCL_PROFILER_PROXY_STEP_RECV_WAIT,
    NCCL_PROFILER_PROXY_STEP_SEND_GPU_WAIT, NCCL_PROFILER_PROXY_STEP_SEND_PEER_WAIT_V4,
    NCCL_PROFILER_PROXY_STEP_SEND_WAIT,
};

use std::sync::Arc;

use oxccl_plugin::ffi::profiler::NCCL_PROFILE_NET_PLUGIN;

use super::Lane;
use crate::plugin::profiler::{Event, Handle, NetParent, ProfilerComm, StateArgs, PROXY_STEP_BITS};

/// The op index of a task side that has no proxy op.
pub const NO_OP: usize = usize::MAX;

/// The communicator's profiler and the activation mask of the group being
/// run (read once for the group, as NCCL copies it into each task).
#[derive(Clone, Copy)]
pub struct ProxyProfiler<'a> {
    pub comm: &'a Arc<ProfilerComm>,
    pub mask: i32,
}

/// One proxy op: its key, its event and its step counters.
struct Op {
    /// (index into the lane's parents, peer, is_send).
    key: (usize, usize, bool),
    ev: Handle,
    n_steps: c_int,
    posted: c_int,
    transmitted: c_int,
    done: c_int,
    in_progress: bool,
}

/// The proxy ops of one lane.
pub struct Proxies<'a> {
    p: ProxyProfiler<'a>,
    steps: bool,
    /// Sorted by key.
    ops: Vec<Op>,
    /// A lane with one parent shares it between all its steps.
    per_step: bool,
}

impl<'a> Proxies<'a> {
    /// Counts the slices of each (parent, peer, direction) of the lane and
    /// starts their proxy-op events.
    pub fn start(p: ProxyProfiler<'a>, lane: &Lane) -> Proxies<'a> {
        let esize = lane.reducer.dtype().size();
        let slice = (lane.slice_bytes / esize).max(1);
        let per_step = lane.parents.len() > 1;
        let mut ops: Vec<Op> = Vec::new();
        for (i, st) in lane.steps.iter().enumerate() {
            let n = st.count.div_ceil(slice) as c_int;
            let parent = if per_step { i } else { 0 };
            for (peer, send) in [(st.send, true), (st.recv, false)] {
                let Some(peer) = peer.filter(|_| n > 0) else {
                    continue;
                };
                let key = (parent, peer, send);
                match ops.iter_mut().find(|o| o.key == key) {
                    Some(o) => o.n_steps += n,
                    None => ops.push(Op {
                        key,
                        ev: Handle::NONE,
                        n_steps: n,
                        posted: 0,
                        transmitted: 0,
                        done: 0,
                        in_progress: false,
                    }),
                }
            }
        }
        ops.sort_by_key(|o| o.key);
        // Connections of point-to-point lanes live on a channel of their
        // own, above the 8 bits of the descriptor: NCCL's p2p channel 0.
        let channel = u8::try_from(lane.chan).unwrap_or(0);
        let chunk_size = (slice * esize).min(c_int::MAX as usize) as c_int;
        for o in &mut ops {
            o.ev = p.comm.start(
                p.mask,
                Event::ProxyOp {
                    parent: lane.parents.get(o.key.0).copied().unwrap_or(Handle::NONE),
                    channel,
                    peer: o.key.1 as c_int,
                    n_steps: o.n_steps,
                    chunk_size,
                    is_send: o.key.2,
                },
            );
        }
        Proxies {
            steps: p.mask & PROXY_STEP_BITS != 0,
            p,
            ops,
            per_step,
        }
    }

    fn index(&self, step: usize, peer: usize, send: bool) -> usize {
        let key = (if self.per_step { step } else { 0 }, peer, send);
        self.ops
            .binary_search_by_key(&key, |o| o.key)
            .unwrap_or(NO_OP)
    }

    fn op_state(&self, op: usize, state: EventState, steps: c_int, bytes: usize) {
        self.p.comm.record(
            self.ops[op].ev,
            state,
            StateArgs::Op {
                steps,
                trans_size: bytes,
            },
        );
    }

    fn step_state(&self, ev: Handle, state: EventState, bytes: usize) {
        self.p
            .comm
            .record(ev, state, StateArgs::Step { trans_size: bytes });
    }

    /// Starts the next step of proxy op `op` (the op is in progress from
    /// its first step on, as NCCL marks it before posting any).
    fn begin_step(&mut self, op: usize, state: EventState, bytes: usize) -> Handle {
        if !self.ops[op].in_progress {
            self.ops[op].in_progress = true;
            self.op_state(op, NCCL_PROFILER_PROXY_OP_IN_PROGRESS_V4, 0, 0);
        }
        let o = &mut self.ops[op];
        let step = o.posted;
        o.posted += 1;
        let ev = if self.steps {
            self.p
                .comm
                .start(self.p.mask, Event::ProxyStep { parent: o.ev, step })
        } else {
            Handle::NONE
        };
        self.step_state(ev, state, bytes);
        ev
    }

    /// A slice to send was opened; its data is not produced yet.
    pub fn send_created(&mut self, step: usize, peer: usize, bytes: usize) -> (usize, Handle) {
        let op = self.index(step, peer, true);
        if op == NO_OP {
            return (NO_OP, Handle::NONE);
        }
        let ev = self.begin_step(op, NCCL_PROFILER_PROXY_STEP_SEND_GPU_WAIT, bytes);
        let posted = self.ops[op].posted;
        self.op_state(op, NCCL_PROFILER_PROXY_OP_SEND_POSTED, posted, bytes);
        (op, ev)
    }

    /// The slice's data is ready and its send is being tried (again, if
    /// the network refused the last try, as NCCL records it per try).
    pub fn send_ready(&self, op: usize, ev: Handle, bytes: usize) {
        if op != NO_OP {
            self.step_state(ev, NCCL_PROFILER_PROXY_STEP_SEND_PEER_WAIT_V4, bytes);
        }
    }

    /// The slice's send was handed to the network.
    pub fn sent(&mut self, op: usize, ev: Handle, bytes: usize) {
        if op == NO_OP {
            return;
        }
        self.step_state(ev, NCCL_PROFILER_PROXY_STEP_SEND_WAIT, bytes);
        self.ops[op].transmitted += 1;
        let t = self.ops[op].transmitted;
        self.op_state(op, NCCL_PROFILER_PROXY_OP_SEND_TRANSMITTED, t, bytes);
    }

    /// The network completed the slice's send.
    pub fn send_done(&mut self, op: usize, ev: Handle) {
        if op == NO_OP {
            return;
        }
        self.p.comm.stop(ev);
        self.ops[op].done += 1;
        let d = self.ops[op].done;
        self.op_state(op, NCCL_PROFILER_PROXY_OP_SEND_DONE, d, 0);
        self.maybe_stop(op);
    }

    /// A receive is about to be posted to the network: its step starts
    /// first (as NCCL's recvProxyProgress does), so that the network may
    /// report events under it from the moment it has the receive.
    pub fn recv_step(&mut self, step: usize, peer: usize, bytes: usize) -> (usize, Handle) {
        let op = self.index(step, peer, false);
        if op == NO_OP {
            return (NO_OP, Handle::NONE);
        }
        (
            op,
            self.begin_step(op, NCCL_PROFILER_PROXY_STEP_RECV_WAIT, bytes),
        )
    }

    /// The receive of `recv_step` was posted.
    pub fn recv_posted(&mut self, op: usize, bytes: usize) {
        if op == NO_OP {
            return;
        }
        let posted = self.ops[op].posted;
        self.op_state(op, NCCL_PROFILER_PROXY_OP_RECV_POSTED, posted, bytes);
    }

    /// The profiler handle of a network operation under step `ev`, when the
    /// mask asks for network events (NCCL_PROFILE_NET_PLUGIN); else none,
    /// and the network reports nothing.
    pub fn net_parent(&self, ev: Handle) -> Option<Box<NetParent>> {
        (self.p.mask & NCCL_PROFILE_NET_PLUGIN != 0)
            .then(|| NetParent::new(self.p.comm.clone(), ev, self.p.mask))
    }

    /// The network completed the receive; the data waits to be used.
    pub fn received(&mut self, op: usize, ev: Handle, bytes: usize) {
        if op == NO_OP {
            return;
        }
        self.step_state(ev, NCCL_PROFILER_PROXY_STEP_RECV_FLUSH_WAIT, bytes);
        self.step_state(ev, NCCL_PROFILER_PROXY_STEP_RECV_GPU_WAIT, bytes);
        self.ops[op].transmitted += 1;
        let t = self.ops[op].transmitted;
        self.op_state(op, NCCL_PROFILER_PROXY_OP_RECV_RECEIVED, t, bytes);
    }

    /// The received slice was combined or copied where it goes.
    pub fn consumed(&mut self, op: usize, ev: Handle) {
        if op == NO_OP {
            return;
        }
        self.p.comm.stop(ev);
        self.ops[op].done += 1;
        let d = self.ops[op].done;
        self.op_state(op, NCCL_PROFILER_PROXY_OP_RECV_DONE, d, 0);
        self.maybe_stop(op);
    }

    fn maybe_stop(&mut self, op: usize) {
        let o = &mut self.ops[op];
        if o.done >= o.n_steps {
            self.p.comm.stop(std::mem::replace(&mut o.ev, Handle::NONE));
        }
    }

    /// Ends the steps `open` still holds and every proxy op not ended yet
    /// (all of them end by themselves on success).
    pub fn finish(mut self, open: impl Iterator<Item = Handle>) {
        for ev in open {
            self.p.comm.stop(ev);
        }
        for o in &mut self.ops {
            self.p.comm.stop(std::mem::replace(&mut o.ev, Handle::NONE));
        }
    }
}
