//! `ncclProfiler_v4_t` (NCCL 2.27 onwards; still loaded by 2.28 and 2.30).
//! Frozen: a change makes a new version file.
//!
//! Compared with v3: `init` learns the communicator (name, hash, size, rank)
//! and gets NCCL's logger, so descriptors drop the communicator fields;
//! kernel channels carry GPU timestamps; proxy-op states give way to
//! proxy-step states, and state args are reorganised.

use std::os::raw::{c_char, c_int, c_void};

use super::{vtable, InitV4Fn};
use crate::ffi::types::Pid;

/// Symbol of the vtable ([`ProfilerV4`]).
pub const SYMBOL: &[u8] = b"ncclProfiler_v4\0";

/// `ncclProfilerEventDescr_v4_t`: what `startEvent` is told about an event.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventDescrV4 {
    /// One `NCCL_PROFILE_*` bit: which member of `detail` is valid.
    pub ty: u8,
    /// Handle of the parent event (a collective's group, a proxy step's
    /// proxy op), as returned by `startEvent`; NULL for none.
    pub parent_obj: *mut c_void,
    /// Rank that produced the event.
    pub rank: c_int,
    /// The per-type part (an anonymous union in C).
    pub detail: EventDetailV4,
}

/// The union of `ncclProfilerEventDescr_v4_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union EventDetailV4 {
    pub coll: CollDescrV4,
    pub p2p: P2pDescrV4,
    pub proxy_op: ProxyOpDescrV4,
    pub proxy_step: ProxyStepDescrV4,
    pub kernel_ch: KernelChDescrV4,
    pub net_plugin: NetPluginDescrV4,
}

/// `NCCL_PROFILE_COLL`: a collective.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollDescrV4 {
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
}

/// `NCCL_PROFILE_P2P`: a send or a receive.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct P2pDescrV4 {
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
}

/// `NCCL_PROFILE_PROXY_OP`: the proxy's share of an operation on a channel.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProxyOpDescrV4 {
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
pub struct ProxyStepDescrV4 {
    pub step: c_int,
}

/// `NCCL_PROFILE_KERNEL_CH`: a channel of a kernel.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelChDescrV4 {
    pub channel_id: u8,
    /// Start time from the GPU's global timer (ns).
    pub p_timer: u64,
}

/// `NCCL_PROFILE_NET_PLUGIN`: an event the net plugin defined and reported
/// through the profiler callback.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetPluginDescrV4 {
    /// Net-plugin id: network type and event-layout version
    /// (`NCCL_PROFILER_NET_TYPE_*` | version).
    pub id: i64,
    /// The plugin's event, laid out as `id` says.
    pub data: *mut c_void,
}

/// `ncclProfilerEventStateArgs_v4_t`: attributes updated with a state change.
#[repr(C)]
#[derive(Clone, Copy)]
pub union EventStateArgsV4 {
    pub proxy_step: ProxyStepStateV4,
    pub proxy_ctrl: ProxyCtrlStateV4,
    pub net_plugin: NetPluginStateV4,
    pub kernel_ch: KernelChStateV4,
}

/// Proxy-step progress.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProxyStepStateV4 {
    /// Bytes of the step moved so far.
    pub trans_size: usize,
}

/// Proxy-control update.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProxyCtrlStateV4 {
    /// Proxy ops appended during an append phase.
    pub appended_proxy_ops: c_int,
}

/// Net-plugin event update.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetPluginStateV4 {
    /// The plugin's updated event.
    pub data: *mut c_void,
}

/// Kernel-channel stop.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelChStateV4 {
    /// Stop time from the GPU's global timer (ns).
    pub p_timer: u64,
}

vtable!(
    /// `ncclProfiler_v4_t`.
    ProfilerV4,
    InitV4Fn,
    EventDescrV4,
    EventStateArgsV4
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

    /// `ncclProfilerEventDescr_v4_t`.
    #[test]
    fn event_descr_v4_layout() {
        assert_layout!(EventDescrV4, 104, 8, ty @ 0, parent_obj @ 8, rank @ 16, detail.coll @ 24,
            detail.coll.seq_number @ 24, detail.coll.func @ 32, detail.coll.send_buff @ 40,
            detail.coll.recv_buff @ 48, detail.coll.count @ 56, detail.coll.root @ 64,
            detail.coll.datatype @ 72, detail.coll.n_channels @ 80, detail.coll.n_warps @ 81,
            detail.coll.algo @ 88, detail.coll.proto @ 96, detail.p2p @ 24, detail.p2p.func @ 24,
            detail.p2p.buff @ 32, detail.p2p.datatype @ 40, detail.p2p.count @ 48,
            detail.p2p.peer @ 56, detail.p2p.n_channels @ 60, detail.proxy_op @ 24,
            detail.proxy_op.pid @ 24, detail.proxy_op.channel_id @ 28, detail.proxy_op.peer @ 32,
            detail.proxy_op.n_steps @ 36, detail.proxy_op.chunk_size @ 40,
            detail.proxy_op.is_send @ 44, detail.proxy_step @ 24, detail.proxy_step.step @ 24,
            detail.kernel_ch @ 24, detail.kernel_ch.channel_id @ 24, detail.kernel_ch.p_timer @ 32,
            detail.net_plugin @ 24, detail.net_plugin.id @ 24, detail.net_plugin.data @ 32);
    }

    /// `ncclProfilerEventStateArgs_v4_t`.
    #[test]
    fn event_state_args_v4_layout() {
        assert_layout!(EventStateArgsV4, 8, 8, proxy_step @ 0, proxy_step.trans_size @ 0,
            proxy_ctrl @ 0, proxy_ctrl.appended_proxy_ops @ 0, net_plugin @ 0, net_plugin.data @ 0,
            kernel_ch @ 0, kernel_ch.p_timer @ 0);
    }

    /// `ncclProfiler_v4_t`.
    #[test]
    fn profiler_v4_layout() {
        assert_layout!(ProfilerV4, 48, 8, name @ 0, init @ 8, start_event @ 16, stop_event @ 24,
            record_event_state @ 32, finalize @ 40);
    }
}
