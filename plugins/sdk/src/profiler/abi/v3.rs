//! `ncclProfiler_v3_t` (NCCL 2.26 onwards; still loaded by 2.28 and 2.30).
//! Frozen: a change makes a new version file.
//!
//! Compared with v2: kernel-channel events and events defined by the net
//! plugin; collectives no longer report their traffic.

use std::os::raw::{c_char, c_int, c_void};

use super::{vtable, InitV1Fn};
use crate::ffi::types::Pid;

/// Symbol of the vtable ([`ProfilerV3`]).
pub const SYMBOL: &[u8] = b"ncclProfiler_v3\0";

/// `ncclProfilerEventDescr_v3_t`: what `startEvent` is told about an event.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventDescrV3 {
    /// One `NCCL_PROFILE_*` bit: which member of `detail` is valid.
    pub ty: u8,
    /// Handle of the parent event (a collective's group, a proxy step's
    /// proxy op), as returned by `startEvent`; NULL for none.
    pub parent_obj: *mut c_void,
    /// Rank that produced the event.
    pub rank: c_int,
    /// The per-type part (an anonymous union in C).
    pub detail: EventDetailV3,
}

/// The union of `ncclProfilerEventDescr_v3_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union EventDetailV3 {
    pub coll: CollDescrV3,
    pub p2p: P2pDescrV3,
    pub proxy_op: ProxyOpDescrV3,
    pub proxy_step: ProxyStepDescrV3,
    pub kernel_ch: KernelChDescrV3,
    pub net_plugin: NetPluginDescrV3,
}

/// `NCCL_PROFILE_COLL`: a collective.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollDescrV3 {
    /// Communicator name.
    pub name: *const c_char,
    /// Communicator hash.
    pub comm_hash: u64,
    /// Sequence number of the collective in its communicator.
    pub seq_number: u64,
    /// Operation name ("AllReduce" …), a static string.
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    /// Element count.
    pub count: usize,
    pub root: c_int,
    /// Data type name, a static string.
    pub datatype: *const c_char,
    pub n_max_channels: u8,
    pub n_warps: u8,
    /// Algorithm name, a static string.
    pub algo: *const c_char,
    /// Protocol name, a static string.
    pub proto: *const c_char,
}

/// `NCCL_PROFILE_P2P`: a send or a receive.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct P2pDescrV3 {
    /// Communicator name.
    pub name: *const c_char,
    pub comm_hash: u64,
    /// Operation name ("Send" or "Recv"), a static string.
    pub func: *const c_char,
    pub buff: *mut c_void,
    /// Data type name, a static string.
    pub datatype: *const c_char,
    pub count: usize,
    /// The other rank.
    pub peer: c_int,
}

/// `NCCL_PROFILE_PROXY_OP`: the proxy's share of an operation on a channel.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProxyOpDescrV3 {
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
pub struct ProxyStepDescrV3 {
    pub step: c_int,
}

/// `NCCL_PROFILE_KERNEL_CH`: a channel of a kernel.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelChDescrV3 {
    pub channel_id: u8,
}

/// `NCCL_PROFILE_NET_PLUGIN`: an event the net plugin defined and reported
/// through the profiler callback.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetPluginDescrV3 {
    /// Net-plugin id: network type and event-layout version
    /// (`NCCL_PROFILER_NET_TYPE_*` | version).
    pub id: i64,
    /// The plugin's event, laid out as `id` says.
    pub data: *mut c_void,
}

/// `ncclProfilerEventStateArgs_v3_t`: attributes updated with a state change.
#[repr(C)]
#[derive(Clone, Copy)]
pub union EventStateArgsV3 {
    pub proxy_op: ProxyOpStateV3,
    pub proxy_ctrl: ProxyCtrlStateV3,
}

/// Proxy-op progress.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProxyOpStateV3 {
    /// Bytes moved so far.
    pub trans_size: usize,
    /// Steps done so far.
    pub steps: c_int,
}

/// Proxy-control update.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProxyCtrlStateV3 {
    /// Proxy ops appended during an append phase.
    pub appended_proxy_ops: c_int,
}

vtable!(
    /// `ncclProfiler_v3_t`.
    ProfilerV3,
    InitV1Fn,
    EventDescrV3,
    EventStateArgsV3
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

    /// `ncclProfilerEventDescr_v3_t`.
    #[test]
    fn event_descr_v3_layout() {
        assert_layout!(EventDescrV3, 120, 8, ty @ 0, parent_obj @ 8, rank @ 16, detail.coll @ 24,
            detail.coll.name @ 24, detail.coll.comm_hash @ 32, detail.coll.seq_number @ 40,
            detail.coll.func @ 48, detail.coll.send_buff @ 56, detail.coll.recv_buff @ 64,
            detail.coll.count @ 72, detail.coll.root @ 80, detail.coll.datatype @ 88,
            detail.coll.n_max_channels @ 96, detail.coll.n_warps @ 97, detail.coll.algo @ 104,
            detail.coll.proto @ 112, detail.p2p @ 24, detail.p2p.name @ 24,
            detail.p2p.comm_hash @ 32, detail.p2p.func @ 40, detail.p2p.buff @ 48,
            detail.p2p.datatype @ 56, detail.p2p.count @ 64, detail.p2p.peer @ 72,
            detail.proxy_op @ 24, detail.proxy_op.pid @ 24, detail.proxy_op.channel_id @ 28,
            detail.proxy_op.peer @ 32, detail.proxy_op.n_steps @ 36,
            detail.proxy_op.chunk_size @ 40, detail.proxy_op.is_send @ 44, detail.proxy_step @ 24,
            detail.proxy_step.step @ 24, detail.kernel_ch @ 24, detail.kernel_ch.channel_id @ 24,
            detail.net_plugin @ 24, detail.net_plugin.id @ 24, detail.net_plugin.data @ 32);
    }

    /// `ncclProfilerEventStateArgs_v3_t`.
    #[test]
    fn event_state_args_v3_layout() {
        assert_layout!(EventStateArgsV3, 16, 8, proxy_op @ 0, proxy_op.trans_size @ 0,
            proxy_op.steps @ 8, proxy_ctrl @ 0, proxy_ctrl.appended_proxy_ops @ 0);
    }

    /// `ncclProfiler_v3_t`.
    #[test]
    fn profiler_v3_layout() {
        assert_layout!(ProfilerV3, 48, 8, name @ 0, init @ 8, start_event @ 16, stop_event @ 24,
            record_event_state @ 32, finalize @ 40);
    }
}
