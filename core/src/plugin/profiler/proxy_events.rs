//! The events of one proxy op (one operation's network transfers with one
//! peer, in one direction, on one channel) and of its steps, at the points
//! where NCCL's proxy reports them (src/transport/net.cc's
//! sendProxyProgress and recvProxyProgress, src/plugin/profiler.cc), for
//! both executors that move data through the net plugin: the host path's
//! lanes and the device path's proxy thread.
//!
//! The op is started with its parent (the operation's collective or p2p
//! event), is "in progress" (v4's state) before its first step, and stops
//! after its last. A send step starts when its slot is opened and is at
//! once "GPU wait" (its data not yet produced), "peer wait" each time its
//! send is tried, "send wait" once the network took it, and stops when the
//! send completes. A receive step starts just before its receive is posted
//! and is at once "recv wait", then "flush wait" (with the bytes received)
//! and "GPU wait" when the network completed it (neither host memory nor
//! Hopper's GPUDirect needs a flush, so the two follow each other as in
//! NCCL without one), and stops when the received slice was consumed. The
//! v1-v3 proxy-op states (posted, transmitted, done counts) go along.

use std::os::raw::c_int;
use std::sync::Arc;

use oxccl_plugin::ffi::profiler::{
    EventState, NCCL_PROFILER_PROXY_OP_IN_PROGRESS_V4, NCCL_PROFILER_PROXY_OP_RECV_DONE,
    NCCL_PROFILER_PROXY_OP_RECV_POSTED, NCCL_PROFILER_PROXY_OP_RECV_RECEIVED,
    NCCL_PROFILER_PROXY_OP_SEND_DONE, NCCL_PROFILER_PROXY_OP_SEND_POSTED,
    NCCL_PROFILER_PROXY_OP_SEND_TRANSMITTED, NCCL_PROFILER_PROXY_STEP_RECV_FLUSH_WAIT,
    NCCL_PROFILER_PROXY_STEP_RECV_GPU_WAIT, NCCL_PROFILER_PROXY_STEP_RECV_WAIT,
    NCCL_PROFILER_PROXY_STEP_SEND_GPU_WAIT, NCCL_PROFILER_PROXY_STEP_SEND_PEER_WAIT_V4,
    NCCL_PROFILER_PROXY_STEP_SEND_WAIT, NCCL_PROFILE_NET_PLUGIN,
};

use super::{Event, Handle, NetParent, ProfilerComm, StateArgs, PROXY_OP_BITS};

/// The communicator's profiler and the activation mask of the group the
/// transfers belong to (read once for the group, as NCCL copies it into
/// each task).
#[derive(Clone, Copy)]
pub struct ProxyProfiler<'a> {
    pub comm: &'a Arc<ProfilerComm>,
    pub mask: i32,
}

impl ProxyProfiler<'_> {
    /// Whether the mask asks for any proxy event (NCCL's rule: an event
    /// starts when its bit or the bit of an event below it is set).
    pub fn wants_ops(mask: i32) -> bool {
        mask & PROXY_OP_BITS != 0
    }

    /// The profiler handle of a network operation under step `ev`, when the
    /// mask asks for network events (NCCL_PROFILE_NET_PLUGIN); else none,
    /// and the network reports nothing.
    pub fn net_parent(&self, ev: Handle) -> Option<Box<NetParent>> {
        (self.mask & NCCL_PROFILE_NET_PLUGIN != 0)
            .then(|| NetParent::new(self.comm.clone(), ev, self.mask))
    }

    fn step_state(&self, ev: Handle, state: EventState, bytes: usize) {
        self.comm
            .record(ev, state, StateArgs::Step { trans_size: bytes });
    }
}

/// What a proxy op's event describes (`ncclProfilerEventDescr_t.proxyOp`).
#[derive(Clone, Copy)]
pub struct OpDescr {
    /// The operation's collective or p2p event.
    pub parent: Handle,
    pub channel: u8,
    pub peer: c_int,
    pub n_steps: c_int,
    /// Bytes per step at most.
    pub chunk_size: c_int,
    pub is_send: bool,
}

/// One proxy op's event and its step counters.
pub struct OpEvents {
    ev: Handle,
    n_steps: c_int,
    posted: c_int,
    transmitted: c_int,
    done: c_int,
    in_progress: bool,
}

impl OpEvents {
    pub fn start(p: ProxyProfiler<'_>, d: OpDescr) -> OpEvents {
        let ev = p.comm.start(
            p.mask,
            Event::ProxyOp {
                parent: d.parent,
                channel: d.channel,
                peer: d.peer,
                n_steps: d.n_steps,
                chunk_size: d.chunk_size,
                is_send: d.is_send,
            },
        );
        OpEvents {
            ev,
            n_steps: d.n_steps,
            posted: 0,
            transmitted: 0,
            done: 0,
            in_progress: false,
        }
    }

    /// Whether every step ended (the op's event is then stopped).
    pub fn finished(&self) -> bool {
        self.done >= self.n_steps
    }

    fn op_state(&self, p: ProxyProfiler<'_>, state: EventState, steps: c_int, bytes: usize) {
        p.comm.record(
            self.ev,
            state,
            StateArgs::Op {
                steps,
                trans_size: bytes,
            },
        );
    }

    /// Starts the next step (the op is in progress from its first step
    /// on, as NCCL marks it before posting any).
    fn begin_step(&mut self, p: ProxyProfiler<'_>, state: EventState, bytes: usize) -> Handle {
        if !self.in_progress {
            self.in_progress = true;
            self.op_state(p, NCCL_PROFILER_PROXY_OP_IN_PROGRESS_V4, 0, 0);
        }
        let step = self.posted;
        self.posted += 1;
        let ev = p.comm.start(
            p.mask,
            Event::ProxyStep {
                parent: self.ev,
                step,
            },
        );
        p.step_state(ev, state, bytes);
        ev
    }

    /// A slot to send from was opened; its data is not produced yet.
    pub fn send_created(&mut self, p: ProxyProfiler<'_>, bytes: usize) -> Handle {
        let ev = self.begin_step(p, NCCL_PROFILER_PROXY_STEP_SEND_GPU_WAIT, bytes);
        self.op_state(p, NCCL_PROFILER_PROXY_OP_SEND_POSTED, self.posted, bytes);
        ev
    }

    /// The step's data is ready and its send is being tried (again, if
    /// the network refused the last try, as NCCL records it per try).
    pub fn send_ready(&self, p: ProxyProfiler<'_>, ev: Handle, bytes: usize) {
        p.step_state(ev, NCCL_PROFILER_PROXY_STEP_SEND_PEER_WAIT_V4, bytes);
    }

    /// The step's send was handed to the network.
    pub fn sent(&mut self, p: ProxyProfiler<'_>, ev: Handle, bytes: usize) {
        p.step_state(ev, NCCL_PROFILER_PROXY_STEP_SEND_WAIT, bytes);
        self.transmitted += 1;
        self.op_state(
            p,
            NCCL_PROFILER_PROXY_OP_SEND_TRANSMITTED,
            self.transmitted,
            bytes,
        );
    }

    /// The network completed the step's send.
    pub fn send_done(&mut self, p: ProxyProfiler<'_>, ev: Handle) {
        self.step_done(p, ev, NCCL_PROFILER_PROXY_OP_SEND_DONE);
    }

    /// A receive is about to be posted: its step starts first (as NCCL's
    /// recvProxyProgress does), so that the network may report events
    /// under it from the moment it has the receive.
    pub fn recv_step(&mut self, p: ProxyProfiler<'_>, bytes: usize) -> Handle {
        self.begin_step(p, NCCL_PROFILER_PROXY_STEP_RECV_WAIT, bytes)
    }

    /// The receive of `recv_step` was posted.
    pub fn recv_posted(&self, p: ProxyProfiler<'_>, bytes: usize) {
        self.op_state(p, NCCL_PROFILER_PROXY_OP_RECV_POSTED, self.posted, bytes);
    }

    /// The network completed the receive; the data waits to be used.
    pub fn received(&mut self, p: ProxyProfiler<'_>, ev: Handle, bytes: usize) {
        p.step_state(ev, NCCL_PROFILER_PROXY_STEP_RECV_FLUSH_WAIT, bytes);
        p.step_state(ev, NCCL_PROFILER_PROXY_STEP_RECV_GPU_WAIT, bytes);
        self.transmitted += 1;
        self.op_state(
            p,
            NCCL_PROFILER_PROXY_OP_RECV_RECEIVED,
            self.transmitted,
            bytes,
        );
    }

    /// The received step was consumed.
    pub fn consumed(&mut self, p: ProxyProfiler<'_>, ev: Handle) {
        self.step_done(p, ev, NCCL_PROFILER_PROXY_OP_RECV_DONE);
    }

    /// A step is over: its event stops, the op counts it in `state`, and
    /// the op stops with its last step.
    fn step_done(&mut self, p: ProxyProfiler<'_>, ev: Handle, state: EventState) {
        p.comm.stop(ev);
        self.done += 1;
        self.op_state(p, state, self.done, 0);
        self.maybe_stop(p);
    }

    fn maybe_stop(&mut self, p: ProxyProfiler<'_>) {
        if self.finished() {
            p.comm.stop(std::mem::replace(&mut self.ev, Handle::NONE));
        }
    }

    /// Stops the op's event if its steps did not (a failed operation).
    pub fn finish(&mut self, p: ProxyProfiler<'_>) {
        p.comm.stop(std::mem::replace(&mut self.ev, Handle::NONE));
    }
}
