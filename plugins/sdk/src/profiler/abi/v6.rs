//! `ncclProfiler_v6_t` (NCCL 2.29 onwards; 2.28 does not know it). Frozen: a
//! change makes a new version file.
//!
//! Compared with v5: events of collectives run by the copy engines
//! (collective, synchronisation, batch). Every v5 event keeps its v5 layout
//! (NCCL repeats the same members), and state args are v5's: copy-engine
//! events get no `recordEventState`, the plugin times them itself.

use std::os::raw::{c_char, c_int, c_void};

use super::v5::{
    CollApiDescrV5, CollDescrV5, EventStateArgsV5, GroupApiDescrV5, KernelChDescrV5,
    KernelLaunchDescrV5, NetPluginDescrV5, P2pApiDescrV5, P2pDescrV5, ProxyOpDescrV5,
    ProxyStepDescrV5,
};
use super::{vtable, InitV5Fn};

/// Symbol of the vtable ([`ProfilerV6`]).
pub const SYMBOL: &[u8] = b"ncclProfiler_v6\0";

/// `ncclProfilerEventStateArgs_v6_t`, a typedef of v5's.
pub type EventStateArgsV6 = EventStateArgsV5;

/// `ncclProfilerEventDescr_v6_t`: what `startEvent` is told about an event.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EventDescrV6 {
    /// One `NCCL_PROFILE_*` bit: which member of `detail` is valid.
    pub ty: u64,
    /// Handle of the parent event, as returned by `startEvent`; NULL for
    /// none.
    pub parent_obj: *mut c_void,
    /// Rank that produced the event.
    pub rank: c_int,
    /// The per-type part (an anonymous union in C).
    pub detail: EventDetailV6,
}

/// The union of `ncclProfilerEventDescr_v6_t`: v5's members plus the
/// copy-engine ones.
#[repr(C)]
#[derive(Clone, Copy)]
pub union EventDetailV6 {
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
    pub ce_coll: CeCollDescrV6,
    pub ce_coll_sync: CeCollSyncDescrV6,
    pub ce_coll_batch: CeCollBatchDescrV6,
}

/// `NCCL_PROFILE_CE_COLL`: a collective run by the copy engines.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CeCollDescrV6 {
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
}

/// `NCCL_PROFILE_CE_SYNC`: a synchronisation between ranks.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CeCollSyncDescrV6 {
    /// Whether this is the completion synchronisation (else the start).
    pub is_complete: bool,
    /// Ranks taking part.
    pub n_ranks: c_int,
}

/// `NCCL_PROFILE_CE_BATCH`: a batch of copies.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CeCollBatchDescrV6 {
    /// Copies in the batch.
    pub num_ops: c_int,
    /// Bytes the batch moves.
    pub total_bytes: usize,
    /// Whether the batch synchronises within itself.
    pub use_intra_sync: bool,
}

vtable!(
    /// `ncclProfiler_v6_t`; the calls are those of v5.
    ProfilerV6,
    InitV5Fn,
    EventDescrV6,
    EventStateArgsV6
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

    /// `ncclProfilerEventDescr_v6_t`.
    #[test]
    fn event_descr_v6_layout() {
        assert_layout!(EventDescrV6, 112, 8, ty @ 0, parent_obj @ 8, rank @ 16,
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
            detail.net_plugin @ 24, detail.net_plugin.id @ 24, detail.net_plugin.data @ 32,
            detail.ce_coll @ 24, detail.ce_coll.seq_number @ 24, detail.ce_coll.func @ 32,
            detail.ce_coll.send_buff @ 40, detail.ce_coll.recv_buff @ 48,
            detail.ce_coll.count @ 56, detail.ce_coll.root @ 64, detail.ce_coll.datatype @ 72,
            detail.ce_coll.sync_strategy @ 80, detail.ce_coll.intra_batch_sync @ 88,
            detail.ce_coll.batch_size @ 92, detail.ce_coll.num_batches @ 96,
            detail.ce_coll.ce_seq_num @ 100, detail.ce_coll.stream @ 104, detail.ce_coll_sync @ 24,
            detail.ce_coll_sync.is_complete @ 24, detail.ce_coll_sync.n_ranks @ 28,
            detail.ce_coll_batch @ 24, detail.ce_coll_batch.num_ops @ 24,
            detail.ce_coll_batch.total_bytes @ 32, detail.ce_coll_batch.use_intra_sync @ 40);
    }

    /// `ncclProfiler_v6_t`.
    #[test]
    fn profiler_v6_layout() {
        assert_layout!(ProfilerV6, 48, 8, name @ 0, init @ 8, start_event @ 16, stop_event @ 24,
            record_event_state @ 32, finalize @ 40);
    }
}
