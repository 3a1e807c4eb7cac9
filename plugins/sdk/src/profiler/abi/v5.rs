//! `ncclProfiler_v5_t` (NCCL 2.28 onwards, the newest 2.28 loads; still
//! loaded by 2.30). Frozen: a change makes a new version file.
//!
//! Compared with v4: events for the API calls as the user made them (group,
//! collective, point-to-point) and for kernel launches, which become the
//! parents of the v4 events; the event type widens to 64 bits; `init` takes
//! the communicator id first.

use std::os::raw::{c_char, c_int, c_void};

use super::{vtable, InitV5Fn};
use crate::ffi::types::Pid;

/// Symbol of the vtable ([`ProfilerV5`]).
pub const SYMBOL: &[u8] = b"ncclProfiler_v5\0";

/// `ncclProfilerEventDescr_v5_t`: what `startEvent` is told about an event.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventDescrV5 {
    /// One `NCCL_PROFILE_*` bit: which member of `detail` is valid.
    pub ty: u64,
    /// Handle of the parent event (a collective's API call, a proxy step's
    /// proxy op), as returned by `startEvent`; NULL for none.
    pub parent_obj: *mut c_void,
    /// Rank that produced the event.
    pub rank: c_int,
    /// The per-type part (an anonymous union in C).
    pub detail: EventDetailV5,
}

/// The union of `ncclProfilerEventDescr_v5_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union EventDetailV5 {
    pub group_api: GroupApiDescrV5,
    pub coll_api: CollApiDescrV5,
    pub p2p_api: P2pApiDescrV5,
    pub kernel_launch: KernelLaunchDescrV5,
    pub coll: CollDescrV5,
    pub p2p: P2pDescrV5,
    pub proxy_op: ProxyOpDescrV5,
    pub proxy_step: ProxyStepDescrV5,
    pub kernel_ch: KernelChDescrV5,
    pub net_plugin: NetPluginDescrV5,
}

/// `NCCL_PROFILE_GROUP_API`: a group as the user called it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GroupApiDescrV5 {
    /// Called while a CUDA graph is being captured.
    pub graph_captured: bool,
    /// Nesting depth: 1 for the group NCCL opens around a lone call, more
    /// for groups the user opened.
    pub group_depth: c_int,
}

/// `NCCL_PROFILE_COLL_API`: a collective call as the user made it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollApiDescrV5 {
    /// Operation name, a static string.
    pub func: *const c_char,
    pub count: usize,
    /// Data type name, a static string.
    pub datatype: *const c_char,
    pub root: c_int,
    /// The `cudaStream_t` the call was made on.
    pub stream: *mut c_void,
    /// Called while a CUDA graph is being captured.
    pub graph_captured: bool,
}

/// `NCCL_PROFILE_P2P_API`: a send or receive call as the user made it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct P2pApiDescrV5 {
    /// Operation name, a static string.
    pub func: *const c_char,
    pub count: usize,
    /// Data type name, a static string.
    pub datatype: *const c_char,
    /// The `cudaStream_t` the call was made on.
    pub stream: *mut c_void,
    /// Called while a CUDA graph is being captured.
    pub graph_captured: bool,
}

/// `NCCL_PROFILE_KERNEL_LAUNCH`: a kernel launch (or its recording into a
/// captured graph).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelLaunchDescrV5 {
    /// The `cudaStream_t` launched on.
    pub stream: *mut c_void,
}

/// `NCCL_PROFILE_COLL`: a collective.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollDescrV5 {
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
    /// Channels the collective runs on.
    pub n_channels: u8,
    pub n_warps: u8,
    /// Algorithm name, a static string.
    pub algo: *const c_char,
    /// Protocol name, a static string.
    pub proto: *const c_char,
    /// The v4-style group event this collective belongs to (`parent_obj`
    /// is now the API event).
    pub parent_group: *mut c_void,
}

/// `NCCL_PROFILE_P2P`: a send or a receive.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct P2pDescrV5 {
    /// Operation name ("Send" or "Recv"), a static string.
    pub func: *const c_char,
    pub buff: *mut c_void,
    /// Data type name, a static string.
    pub datatype: *const c_char,
    pub count: usize,
    /// The other rank.
    pub peer: c_int,
    /// Channels the operation runs on.
    pub n_channels: u8,
    /// The v4-style group event this operation belongs to.
    pub parent_group: *mut c_void,
}

/// `NCCL_PROFILE_PROXY_OP`: the proxy's share of an operation on a channel.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProxyOpDescrV5 {
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
pub struct ProxyStepDescrV5 {
    pub step: c_int,
}

/// `NCCL_PROFILE_KERNEL_CH`: a channel of a kernel.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelChDescrV5 {
    pub channel_id: u8,
    /// Start time from the GPU's global timer (ns).
    pub p_timer: u64,
}

/// `NCCL_PROFILE_NET_PLUGIN`: an event the net plugin defined and reported
/// through the profiler callback.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetPluginDescrV5 {
    /// Net-plugin id: network type and event-layout version
    /// (`NCCL_PROFILER_NET_TYPE_*` | version).
    pub id: i64,
    /// The plugin's event, laid out as `id` says.
    pub data: *mut c_void,
}

/// `ncclProfilerEventStateArgs_v5_t`: attributes updated with a state change.
#[repr(C)]
#[derive(Clone, Copy)]
pub union EventStateArgsV5 {
    pub proxy_step: ProxyStepStateV5,
    pub proxy_ctrl: ProxyCtrlStateV5,
    pub net_plugin: NetPluginStateV5,
    pub kernel_ch: KernelChStateV5,
}

/// Proxy-step progress.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProxyStepStateV5 {
    /// Bytes of the step moved so far.
    pub trans_size: usize,
}

/// Proxy-control update.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProxyCtrlStateV5 {
    /// Proxy ops appended during an append phase.
    pub appended_proxy_ops: c_int,
}

/// Net-plugin event update.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetPluginStateV5 {
    /// The plugin's updated event.
    pub data: *mut c_void,
}

/// Kernel-channel stop.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelChStateV5 {
    /// Stop time from the GPU's global timer (ns).
    pub p_timer: u64,
}

vtable!(
    /// `ncclProfiler_v5_t`.
    ProfilerV5,
    InitV5Fn,
    EventDescrV5,
    EventStateArgsV5
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

    /// `ncclProfilerEventDescr_v5_t`.
    #[test]
    fn event_descr_v5_layout() {
        assert_layout!(EventDescrV5, 112, 8, ty @ 0, parent_obj @ 8, rank @ 16,
            detail.group_api @ 24, detail.group_api.graph_captured @ 24,
            detail.group_api.group_depth @ 28, detail.coll_api @ 24, detail.coll_api.func @ 24,
            detail.coll_api.count @ 32, detail.coll_api.datatype @ 40, detail.coll_api.root @ 48,
            detail.coll_api.stream @ 56, detail.coll_api.graph_captured @ 64, detail.p2p_api @ 24,
            detail.p2p_api.func @ 24, detail.p2p_api.count @ 32, detail.p2p_api.datatype @ 40,
            detail.p2p_api.stream @ 48, detail.p2p_api.graph_captured @ 56,
            detail.kernel_launch @ 24, detail.kernel_launch.stream @ 24, detail.coll @ 24,
            detail.coll.seq_number @ 24, detail.coll.func @ 32, detail.coll.send_buff @ 40,
            detail.coll.recv_buff @ 48, detail.coll.count @ 56, detail.coll.root @ 64,
            detail.coll.datatype @ 72, detail.coll.n_channels @ 80, detail.coll.n_warps @ 81,
            detail.coll.algo @ 88, detail.coll.proto @ 96, detail.coll.parent_group @ 104,
            detail.p2p @ 24, detail.p2p.func @ 24, detail.p2p.buff @ 32, detail.p2p.datatype @ 40,
            detail.p2p.count @ 48, detail.p2p.peer @ 56, detail.p2p.n_channels @ 60,
            detail.p2p.parent_group @ 64, detail.proxy_op @ 24, detail.proxy_op.pid @ 24,
            detail.proxy_op.channel_id @ 28, detail.proxy_op.peer @ 32,
            detail.proxy_op.n_steps @ 36, detail.proxy_op.chunk_size @ 40,
            detail.proxy_op.is_send @ 44, detail.proxy_step @ 24, detail.proxy_step.step @ 24,
            detail.kernel_ch @ 24, detail.kernel_ch.channel_id @ 24, detail.kernel_ch.p_timer @ 32,
            detail.net_plugin @ 24, detail.net_plugin.id @ 24, detail.net_plugin.data @ 32);
    }

    /// `ncclProfilerEventStateArgs_v5_t`.
    #[test]
    fn event_state_args_v5_layout() {
        assert_layout!(EventStateArgsV5, 8, 8, proxy_step @ 0, proxy_step.trans_size @ 0,
            proxy_ctrl @ 0, proxy_ctrl.appended_proxy_ops @ 0, net_plugin @ 0, net_plugin.data @ 0,
            kernel_ch @ 0, kernel_ch.p_timer @ 0);
    }

    /// `ncclProfiler_v5_t`.
    #[test]
    fn profiler_v5_layout() {
        assert_layout!(ProfilerV5, 48, 8, name @ 0, init @ 8, start_event @ 16, stop_event @ 24,
            record_event_state @ 32, finalize @ 40);
    }
}
