//! `ncclProfiler_v1_t` (NCCL 2.23 onwards; still loaded by 2.28 and 2.30).
//! Frozen: a change makes a new version file.
//!
//! Operation, data type, algorithm and protocol are small integers here
//! (`ncclFunc_t`, `ncclDataType_t`, `NCCL_ALGO_*`, `NCCL_PROTO_*`).

use std::os::raw::{c_char, c_int, c_void};

use super::{vtable, InitV1Fn};
use crate::ffi::types::Pid;

/// Symbol of the vtable ([`ProfilerV1`]).
pub const SYMBOL: &[u8] = b"ncclProfiler_v1\0";

/// `ncclProfilerEventDescr_v1_t`: what `startEvent` is told about an event.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventDescrV1 {
    /// One `NCCL_PROFILE_*` bit: which member of `detail` is valid.
    pub ty: u8,
    /// Handle of the parent event (a collective's group, a proxy step's
    /// proxy op), as returned by `startEvent`; NULL for none.
    pub parent_obj: *mut c_void,
    /// Rank that produced the event.
    pub rank: c_int,
    /// The per-type part (an anonymous union in C).
    pub detail: EventDetailV1,
}

/// The union of `ncclProfilerEventDescr_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union EventDetailV1 {
    pub coll: CollDescrV1,
    pub p2p: P2pDescrV1,
    pub proxy_op: ProxyOpDescrV1,
    pub proxy_step: ProxyStepDescrV1,
}

/// `NCCL_PROFILE_COLL`: a collective.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollDescrV1 {
    /// Communicator name.
    pub name: *const c_char,
    /// Communicator hash.
    pub comm_hash: u64,
    /// Sequence number of the collective in its communicator.
    pub seq_number: u64,
    /// `ncclFunc_t`.
    pub func: u8,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    /// Element count.
    pub count: usize,
    pub root: c_int,
    /// `ncclDataType_t`.
    pub datatype: u8,
    /// `ncclRedOp_t`.
    pub op: u32,
    /// Bytes the collective moves.
    pub traffic_bytes: usize,
    pub n_max_channels: u8,
    pub n_warps: u8,
    /// `NCCL_ALGO_*`.
    pub algo: u8,
    /// `NCCL_PROTO_*`.
    pub proto: u8,
    pub is_collnet: c_int,
    pub is_nvls: c_int,
}

/// `NCCL_PROFILE_P2P`: a send or a receive.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct P2pDescrV1 {
    /// Communicator name.
    pub name: *const c_char,
    pub comm_hash: u64,
    /// `ncclFunc_t` (send or receive).
    pub func: u8,
    pub buff: *mut c_void,
    /// `ncclDataType_t`.
    pub datatype: u8,
    pub count: usize,
    /// The other rank.
    pub peer: c_int,
}

/// `NCCL_PROFILE_PROXY_OP`: the proxy's share of an operation on a channel.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProxyOpDescrV1 {
    /// Process that posted the operation.
    pub pid: Pid,
    pub channel_id: u8,
    /// Remote rank of the send or receive.
    pub peer: c_int,
    /// Network transfers the operation takes.
    pub n_steps: c_int,
    /// Bytes per transfer.
    pub chunk_size: c_int,
    /// Non-zero for a send.
    pub is_send: c_int,
}

/// `NCCL_PROFILE_PROXY_STEP`: one network transfer.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProxyStepDescrV1 {
    pub step: c_int,
}

/// `ncclProfilerEventStateArgs_v1_t`: attributes updated with a state change.
#[repr(C)]
#[derive(Clone, Copy)]
pub union EventStateArgsV1 {
    pub proxy_op: ProxyOpStateV1,
    pub proxy_ctrl: ProxyCtrlStateV1,
}

/// Proxy-op progress.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProxyOpStateV1 {
    /// Bytes moved so far.
    pub trans_size: usize,
    /// Steps done so far.
    pub steps: c_int,
}

/// Proxy-control update.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProxyCtrlStateV1 {
    /// Proxy ops appended during an append phase.
    pub appended_proxy_ops: c_int,
}

vtable!(
    /// `ncclProfiler_v1_t`.
    ProfilerV1,
    InitV1Fn,
    EventDescrV1,
    EventStateArgsV1
);

#[cfg(test)]
mod tests {
    use crate::ffi::assert_layout;

    use super::*;

    // Every size, alignment and offset below was measured from NCCL's headers
    // (2.30.7; 2.28.9 gives the same for the versions it has) by a C++
    // program printing sizeof/alignof/offsetof, built with g++ 12 on x86_64
    // Linux. A nested path (`detail.coll.func`) is the offset from the start
    // of the outer struct, as offsetof gives it for an anonymous union.

    /// `ncclProfilerEventDescr_v1_t`.
    #[test]
    fn event_descr_v1_layout() {
        assert_layout!(EventDescrV1, 120, 8, ty @ 0, parent_obj @ 8, rank @ 16, detail.coll @ 24,
            detail.coll.name @ 24, detail.coll.comm_hash @ 32, detail.coll.seq_number @ 40,
            detail.coll.func @ 48, detail.coll.send_buff @ 56, detail.coll.recv_buff @ 64,
            detail.coll.count @ 72, detail.coll.root @ 80, detail.coll.datatype @ 84,
            detail.coll.op @ 88, detail.coll.traffic_bytes @ 96, detail.coll.n_max_channels @ 104,
            detail.coll.n_warps @ 105, detail.coll.algo @ 106, detail.coll.proto @ 107,
            detail.coll.is_collnet @ 108, detail.coll.is_nvls @ 112, detail.p2p @ 24,
            detail.p2p.name @ 24, detail.p2p.comm_hash @ 32, detail.p2p.func @ 40,
            detail.p2p.buff @ 48, detail.p2p.datatype @ 56, detail.p2p.count @ 64,
            detail.p2p.peer @ 72, detail.proxy_op @ 24, detail.proxy_op.pid @ 24,
            detail.proxy_op.channel_id @ 28, detail.proxy_op.peer @ 32,
            detail.proxy_op.n_steps @ 36, detail.proxy_op.chunk_size @ 40,
            detail.proxy_op.is_send @ 44, detail.proxy_step @ 24, detail.proxy_step.step @ 24);
    }

    /// `ncclProfilerEventStateArgs_v1_t`.
    #[test]
    fn event_state_args_v1_layout() {
        assert_layout!(EventStateArgsV1, 16, 8, proxy_op @ 0, proxy_op.trans_size @ 0,
            proxy_op.steps @ 8, proxy_ctrl @ 0, proxy_ctrl.appended_proxy_ops @ 0);
    }

    /// `ncclProfiler_v1_t`.
    #[test]
    fn profiler_v1_layout() {
        assert_layout!(ProfilerV1, 48, 8, name @ 0, init @ 8, start_event @ 16, stop_event @ 24,
            record_event_state @ 32, finalize @ 40);
    }
}
