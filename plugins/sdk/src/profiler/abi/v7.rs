//! `ncclProfiler_v7_t` (NCCL 2.31 onwards; 2.30 does not know it). Frozen: a
//! change makes a new version file.
//!
//! Compared with v6:
//! - a per-call `userTag` (`u64`, 0 for untagged) at the end of the
//!   collective, p2p, collective-API, p2p-API and copy-engine collective
//!   descriptors: what the application gave the call (2.31's
//!   `ncclCollConfig_t.userProfilerTag`), passed through unchanged;
//! - the collective descriptor also names the kernel variant and whether
//!   it runs the symmetric-memory kernels;
//! - a kernel-phase event (`NCCL_PROFILE_KERNEL_PHASE`), child of a
//!   kernel-channel event: one stretch of a kernel's run on a channel
//!   (initial synchronisation, compute, final synchronisation) with its GPU
//!   start time; its end comes with `NCCL_PROFILER_KERNEL_PHASE_STOP`, in
//!   the kernel-channel member of the state arguments. NCCL turns the
//!   phase events on with the kernel-channel ones: a plugin that asks for
//!   phases gets kernel channels too.
//!
//! The state arguments have v5's layout (NCCL 2.31 declares the union
//! again; the members are the same).

use std::os::raw::{c_char, c_int, c_void};

use super::v5::{
    EventStateArgsV5, GroupApiDescrV5, KernelChDescrV5, KernelLaunchDescrV5, NetPluginDescrV5,
    ProxyOpDescrV5, ProxyStepDescrV5,
};
use super::v6::{CeCollBatchDescrV6, CeCollSyncDescrV6};
use super::{vtable, InitV5Fn};

/// Symbol of the vtable ([`ProfilerV7`]).
pub const SYMBOL: &[u8] = b"ncclProfiler_v7\0";

/// `ncclProfilerEventStateArgs_v7_t`, v5's members.
pub type EventStateArgsV7 = EventStateArgsV5;

/// `ncclProfilerEventDescr_v7_t`: what `startEvent` is told about an event.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventDescrV7 {
    /// One `NCCL_PROFILE_*` bit: which member of `detail` is valid.
    pub ty: u64,
    /// Handle of the parent event, as returned by `startEvent`; NULL for
    /// none.
    pub parent_obj: *mut c_void,
    /// Rank that produced the event.
    pub rank: c_int,
    /// The per-type part (an anonymous union in C).
    pub detail: EventDetailV7,
}

/// The union of `ncclProfilerEventDescr_v7_t`: v6's members, those that
/// carry a user tag widened by it, and the kernel phase.
#[repr(C)]
#[derive(Clone, Copy)]
pub union EventDetailV7 {
    pub group_api: GroupApiDescrV5,
    pub coll_api: CollApiDescrV7,
    pub p2p_api: P2pApiDescrV7,
    pub kernel_launch: KernelLaunchDescrV5,
    pub coll: CollDescrV7,
    pub p2p: P2pDescrV7,
    pub proxy_op: ProxyOpDescrV5,
    pub proxy_step: ProxyStepDescrV5,
    pub kernel_ch: KernelChDescrV5,
    pub net_plugin: NetPluginDescrV5,
    pub ce_coll: CeCollDescrV7,
    pub ce_coll_sync: CeCollSyncDescrV6,
    pub ce_coll_batch: CeCollBatchDescrV6,
    pub kernel_phase: KernelPhaseDescrV7,
}

/// `NCCL_PROFILE_COLL_API`: a collective call as the user made it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollApiDescrV7 {
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
    /// The caller's tag for this call (0: none), passed through unchanged.
    pub user_tag: u64,
}

/// `NCCL_PROFILE_P2P_API`: a send or receive call as the user made it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct P2pApiDescrV7 {
    /// Operation name, a static string.
    pub func: *const c_char,
    pub count: usize,
    /// Data type name, a static string.
    pub datatype: *const c_char,
    /// The `cudaStream_t` the call was made on.
    pub stream: *mut c_void,
    /// Called while a CUDA graph is being captured.
    pub graph_captured: bool,
    /// The caller's tag for this call (0: none).
    pub user_tag: u64,
}

/// `NCCL_PROFILE_COLL`: a collective.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollDescrV7 {
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
    /// The group event this collective belongs to (`parent_obj` is the API
    /// event).
    pub parent_group: *mut c_void,
    /// Name of the symmetric-memory kernel variant that runs it, a static
    /// string; NULL for a collective that is not symmetric.
    pub kernel_variant: *const c_char,
    /// Runs the symmetric-memory kernels.
    pub is_sym_coll: bool,
    /// The caller's tag for the call (0: none).
    pub user_tag: u64,
}

/// `NCCL_PROFILE_P2P`: a send or a receive.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct P2pDescrV7 {
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
    /// The group event this operation belongs to.
    pub parent_group: *mut c_void,
    /// The caller's tag for the call (0: none).
    pub user_tag: u64,
}

/// `NCCL_PROFILE_CE_COLL`: a collective run by the copy engines.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CeCollDescrV7 {
    /// Sequence number of the collective in its communicator.
    pub seq_number: u64,
    /// Operation name, a static string.
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    /// Data type name, a static string.
    pub datatype: *const c_char,
    /// Name of the synchronisation strategy, a static string.
    pub sync_strategy: *const c_char,
    /// Whether ranks synchronise inside each batch.
    pub intra_batch_sync: bool,
    /// Operations per batch.
    pub batch_size: u32,
    /// Number of batches.
    pub num_batches: u32,
    /// Sequence number among copy-engine collectives.
    pub ce_seq_num: u32,
    /// The `cudaStream_t` it runs on.
    pub stream: *mut c_void,
    /// The caller's tag for the call (0: none).
    pub user_tag: u64,
}

/// `NCCL_PROFILE_KERNEL_PHASE`: one phase of a kernel on a channel, child
/// of the channel's kernel-channel event.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelPhaseDescrV7 {
    pub channel_id: u8,
    /// 0 initial synchronisation, 1 compute, 2 final synchronisation
    /// ([`KERNEL_PHASE_NAMES`]).
    pub phase_id: u8,
    /// The phase's name, a static string.
    pub phase_name: *const c_char,
    /// Start time from the GPU's global timer (ns).
    pub p_timer: u64,
}

/// The names NCCL gives the phases, by `phase_id`.
pub const KERNEL_PHASE_NAMES: [&str; 3] = ["initial_sync", "compute", "final_sync"];

vtable!(
    /// `ncclProfiler_v7_t`; the calls are those of v5 and v6.
    ProfilerV7,
    InitV5Fn,
    EventDescrV7,
    EventStateArgsV7
);

#[cfg(test)]
mod tests {
    use crate::ffi::assert_layout;

    use super::*;

    // Every size, alignment and offset below was measured from NCCL 2.31.2's
    // headers (src/include/plugin/profiler/profiler_v7.h and the example
    // plugin's copy, plugins/profiler/example/nccl/profiler_v7.h, in
    // torchcomms' comms/ncclx/v2_31) by a C++ program printing
    // sizeof/alignof/offsetof, built with g++ 12.2 on x86_64 Linux. A
    // nested path is the offset from the start of the outer struct, as
    // offsetof gives it for an anonymous union.

    /// `ncclProfilerEventDescr_v7_t`.
    #[test]
    fn event_descr_v7_layout() {
        assert_layout!(EventDescrV7, 136, 8, ty @ 0, parent_obj @ 8, rank @ 16,
            detail.group_api @ 24, detail.group_api.graph_captured @ 24,
            detail.group_api.group_depth @ 28, detail.coll_api.func @ 24,
            detail.coll_api.count @ 32, detail.coll_api.datatype @ 40, detail.coll_api.root @ 48,
            detail.coll_api.stream @ 56, detail.coll_api.graph_captured @ 64,
            detail.coll_api.user_tag @ 72, detail.p2p_api.func @ 24, detail.p2p_api.count @ 32,
            detail.p2p_api.datatype @ 40, detail.p2p_api.stream @ 48,
            detail.p2p_api.graph_captured @ 56, detail.p2p_api.user_tag @ 64,
            detail.kernel_launch.stream @ 24, detail.coll.seq_number @ 24, detail.coll.func @ 32,
            detail.coll.send_buff @ 40, detail.coll.recv_buff @ 48, detail.coll.count @ 56,
            detail.coll.root @ 64, detail.coll.datatype @ 72, detail.coll.n_channels @ 80,
            detail.coll.n_warps @ 81, detail.coll.algo @ 88, detail.coll.proto @ 96,
            detail.coll.parent_group @ 104, detail.coll.kernel_variant @ 112,
            detail.coll.is_sym_coll @ 120, detail.coll.user_tag @ 128, detail.p2p.func @ 24,
            detail.p2p.buff @ 32, detail.p2p.datatype @ 40, detail.p2p.count @ 48,
            detail.p2p.peer @ 56, detail.p2p.n_channels @ 60, detail.p2p.parent_group @ 64,
            detail.p2p.user_tag @ 72, detail.proxy_op.pid @ 24, detail.proxy_op.channel_id @ 28,
            detail.proxy_op.peer @ 32, detail.proxy_op.n_steps @ 36,
            detail.proxy_op.chunk_size @ 40, detail.proxy_op.is_send @ 44,
            detail.proxy_step.step @ 24, detail.kernel_ch.channel_id @ 24,
            detail.kernel_ch.p_timer @ 32, detail.net_plugin.id @ 24, detail.net_plugin.data @ 32,
            detail.ce_coll.seq_number @ 24, detail.ce_coll.func @ 32,
            detail.ce_coll.send_buff @ 40, detail.ce_coll.recv_buff @ 48,
            detail.ce_coll.count @ 56, detail.ce_coll.root @ 64, detail.ce_coll.datatype @ 72,
            detail.ce_coll.sync_strategy @ 80, detail.ce_coll.intra_batch_sync @ 88,
            detail.ce_coll.batch_size @ 92, detail.ce_coll.num_batches @ 96,
            detail.ce_coll.ce_seq_num @ 100, detail.ce_coll.stream @ 104,
            detail.ce_coll.user_tag @ 112, detail.ce_coll_sync.is_complete @ 24,
            detail.ce_coll_sync.n_ranks @ 28, detail.ce_coll_batch.num_ops @ 24,
            detail.ce_coll_batch.total_bytes @ 32, detail.ce_coll_batch.use_intra_sync @ 40,
            detail.kernel_phase.channel_id @ 24, detail.kernel_phase.phase_id @ 25,
            detail.kernel_phase.phase_name @ 32, detail.kernel_phase.p_timer @ 40);
    }

    /// `ncclProfilerEventStateArgs_v7_t`.
    #[test]
    fn event_state_args_v7_layout() {
        assert_layout!(EventStateArgsV7, 8, 8, proxy_step.trans_size @ 0,
            proxy_ctrl.appended_proxy_ops @ 0, net_plugin.data @ 0, kernel_ch.p_timer @ 0);
    }

    /// `ncclProfiler_v7_t`.
    #[test]
    fn profiler_v7_layout() {
        assert_layout!(ProfilerV7, 48, 8, name @ 0, init @ 8, start_event @ 16, stop_event @ 24,
            record_event_state @ 32, finalize @ 40);
    }
}
