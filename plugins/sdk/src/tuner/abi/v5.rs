//! `ncclTuner_v5_t` (NCCL 2.28 onwards, the newest 2.28 loads; still loaded
//! by 2.30). Frozen: a change makes a new version file.
//!
//! Compared with v4: `init` takes the communicator id, its NVLink domains
//! and NCCL's tuning constants (which the tuner may edit before NCCL builds
//! its cost model), and `destroy` is renamed `finalize`.

use std::os::raw::{c_char, c_int, c_void};

use crate::ffi::types::{Func, Logger, NcclResult};

/// Symbol of the vtable ([`TunerV5`]).
pub const SYMBOL: &[u8] = b"ncclTunerPlugin_v5\0";

/// `NCCL_NUM_ALGORITHMS_V5`: algorithm rows of [`ConstantsV5`].
pub const NUM_ALGORITHMS_V5: usize = 7;
/// `NCCL_NUM_PROTOCOLS_V5`: protocol columns of [`ConstantsV5`].
pub const NUM_PROTOCOLS_V5: usize = 3;
/// `NCCL_NUM_HW_LINKS_V5`: NVLink, PCI, network.
pub const NUM_HW_LINKS_V5: usize = 3;
/// `NCCL_NUM_COMPCAPS_V5`: Volta, Ampere, Hopper, Blackwell.
pub const NUM_COMPCAPS_V5: usize = 4;
/// `NCCL_NUM_TUNING_SCALES_V5`: 1, 2, 4 or more nodes.
pub const NUM_TUNING_SCALES_V5: usize = 3;

/// `ncclNvlDomainInfo_v5_t`: how the communicator's ranks split into NVLink
/// domains.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvlDomainInfoV5 {
    /// Number of NVLink domains.
    pub n_nvl_domains: c_int,
    /// Fewest ranks in one domain.
    pub min_ranks_per_nvl_domain: c_int,
    /// Most ranks in one domain.
    pub max_ranks_per_nvl_domain: c_int,
}

/// `ncclTunerConstants_v5_t`: the inputs of NCCL's cost model. NCCL fills
/// them with its defaults before `init`; the tuner may change them there.
/// Latencies in microseconds, bandwidths in GB/s.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ConstantsV5 {
    /// Base latency of each algorithm and protocol.
    pub base_latencies: [[f64; NUM_PROTOCOLS_V5]; NUM_ALGORITHMS_V5],
    /// Latency of one step over each link kind (`NCCL_HW_*`), by algorithm and
    /// protocol.
    pub hw_latencies: [[[f64; NUM_PROTOCOLS_V5]; NUM_ALGORITHMS_V5]; NUM_HW_LINKS_V5],
    /// Bandwidth cap of the LL protocol, by GPU generation and node scale.
    pub ll_max_bws: [[f64; NUM_TUNING_SCALES_V5]; NUM_COMPCAPS_V5],
    /// Per-channel cap of ring with LL128.
    pub per_ch_max_ring_ll128_bws: [[f64; NUM_TUNING_SCALES_V5]; NUM_COMPCAPS_V5],
    /// Per-channel cap of tree with LL128.
    pub per_ch_max_tree_ll128_bws: [[f64; NUM_TUNING_SCALES_V5]; NUM_COMPCAPS_V5],
    /// Per-channel cap of tree.
    pub per_ch_max_tree_bws: [[f64; NUM_TUNING_SCALES_V5]; NUM_COMPCAPS_V5],
    /// Per-channel cap of NVLS tree.
    pub per_ch_max_nvls_tree_bws: [[f64; NUM_TUNING_SCALES_V5]; NUM_COMPCAPS_V5],
}

/// `ncclTuner_v5_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TunerV5 {
    /// Tuner name, for logs.
    pub name: *const c_char,
    /// Called for every communicator (`comm_id`, its rank and node counts,
    /// its NVLink domains) with NCCL's logger; writes the tuner's state into
    /// `*ctx`. `constants` holds NCCL's default model inputs, which the tuner
    /// may overwrite. An error fails the communicator's creation.
    pub init: Option<
        unsafe extern "C" fn(
            ctx: *mut *mut c_void,
            comm_id: u64,
            n_ranks: usize,
            n_nodes: usize,
            log_function: Logger,
            nvl_domain_info: *mut NvlDomainInfoV5,
            constants: *mut ConstantsV5,
        ) -> NcclResult,
    >,
    /// Asked for each collective of `n_bytes` (`coll_type` a `ncclFunc_t`,
    /// `num_pipe_ops` operations in the group). `coll_cost_table` points to
    /// `num_algo` rows of `num_proto` costs (despite the C type, one
    /// contiguous `float[num_algo][num_proto]`), unusable entries set to
    /// `NCCL_ALGO_PROTO_IGNORE`. NCCL takes the cheapest non-negative entry:
    /// the tuner may lower costs to steer it (never revive an ignored entry)
    /// and may write `*n_channels`. `reg_buff` is non-zero when the user
    /// buffers are registered (or will be, in a captured CUDA graph). NCCL's
    /// header promises a fall-back on error, but NCCL 2.28 to 2.30 fail the
    /// collective call instead: return success to defer.
    pub get_coll_info: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            coll_type: Func,
            n_bytes: usize,
            num_pipe_ops: c_int,
            coll_cost_table: *mut *mut f32,
            num_algo: c_int,
            num_proto: c_int,
            reg_buff: c_int,
            n_channels: *mut c_int,
        ) -> NcclResult,
    >,
    /// Frees the state made by `init`, when its communicator is destroyed.
    pub finalize: Option<unsafe extern "C" fn(context: *mut c_void) -> NcclResult>,
}

#[cfg(test)]
mod tests {
    use crate::ffi::assert_layout;

    use super::*;

    // Every size, alignment and offset below was measured from NCCL's headers
    // (2.30.7; 2.28.9 gives the same for the versions it has) by a C++
    // program printing sizeof/alignof/offsetof, built with g++ 12 on x86_64
    // Linux. A nested path (`detail.coll.func`) is the offset from the start
    // of the outer struct, as offsetof gives it for an anonymous union.

    /// `ncclNvlDomainInfo_v5_t`.
    #[test]
    fn nvl_domain_info_v5_layout() {
        assert_layout!(NvlDomainInfoV5, 12, 4, n_nvl_domains @ 0, min_ranks_per_nvl_domain @ 4,
            max_ranks_per_nvl_domain @ 8);
    }

    /// `ncclTunerConstants_v5_t`.
    #[test]
    fn constants_v5_layout() {
        assert_layout!(ConstantsV5, 1152, 8, base_latencies @ 0, hw_latencies @ 168,
            ll_max_bws @ 672, per_ch_max_ring_ll128_bws @ 768, per_ch_max_tree_ll128_bws @ 864,
            per_ch_max_tree_bws @ 960, per_ch_max_nvls_tree_bws @ 1056);
    }

    /// `ncclTuner_v5_t`.
    #[test]
    fn tuner_v5_layout() {
        assert_layout!(TunerV5, 32, 8, name @ 0, init @ 8, get_coll_info @ 16, finalize @ 24);
    }
}
