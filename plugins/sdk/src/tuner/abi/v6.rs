//! `ncclTuner_v6_t` (NCCL 2.30 onwards; 2.28 does not know it). Frozen: a
//! change makes a new version file.
//!
//! Compared with v5: `getChunkSize` may override the chunk size NCCL
//! computed. Constants and NVLink-domain info are v5's (NCCL typedefs them).

use std::os::raw::{c_char, c_int, c_void};

use super::v5::{ConstantsV5, NvlDomainInfoV5};
use crate::ffi::types::{Func, Logger, NcclResult};

/// Symbol of the vtable ([`TunerV6`]).
pub const SYMBOL: &[u8] = b"ncclTunerPlugin_v6\0";

/// `ncclNvlDomainInfo_v6_t`, a typedef of v5's.
pub type NvlDomainInfoV6 = NvlDomainInfoV5;
/// `ncclTunerConstants_v6_t`, a typedef of v5's.
pub type ConstantsV6 = ConstantsV5;

/// `ncclTuner_v6_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TunerV6 {
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
            nvl_domain_info: *mut NvlDomainInfoV6,
            constants: *mut ConstantsV6,
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
    /// header promises a fall-back on error, but NCCL 2.30 fails the
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
    /// Optional (may be NULL): after the algorithm (`NCCL_ALGO_*`), protocol
    /// (`NCCL_PROTO_*`) and `n_channels` are chosen, may change
    /// `*chunk_size`, which holds NCCL's value; NCCL clamps the result to
    /// what its buffers allow.
    pub get_chunk_size: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            coll_type: Func,
            n_bytes: usize,
            algo: c_int,
            proto: c_int,
            n_channels: c_int,
            chunk_size: *mut usize,
        ) -> NcclResult,
    >,
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

    /// `ncclTuner_v6_t`.
    #[test]
    fn tuner_v6_layout() {
        assert_layout!(TunerV6, 40, 8, name @ 0, init @ 8, get_coll_info @ 16, finalize @ 24,
            get_chunk_size @ 32);
    }
}
