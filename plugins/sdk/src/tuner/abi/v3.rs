//! `ncclTuner_v3_t` (NCCL 2.22 onwards; still loaded by 2.28 and 2.30).
//! Frozen: a change makes a new version file.
//!
//! Compared with v2: the tuner edits NCCL's cost table instead of naming an
//! algorithm and a protocol.

use std::os::raw::{c_char, c_int, c_void};

use crate::ffi::types::{Func, Logger, NcclResult};

/// Symbol of the vtable ([`TunerV3`]).
pub const SYMBOL: &[u8] = b"ncclTunerPlugin_v3\0";

/// `ncclTuner_v3_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TunerV3 {
    /// Tuner name, for logs.
    pub name: *const c_char,
    /// Called for every communicator with its rank and node counts and
    /// NCCL's logger; writes the tuner's per-communicator state into
    /// `*context`. An error fails the communicator's creation.
    pub init: Option<
        unsafe extern "C" fn(
            n_ranks: usize,
            n_nodes: usize,
            log_function: Logger,
            context: *mut *mut c_void,
        ) -> NcclResult,
    >,
    /// Asked for each collective of `n_bytes` (`coll_type` a `ncclFunc_t`,
    /// `num_pipe_ops` operations in the group). `coll_cost_table` points to
    /// `num_algo` rows of `num_proto` costs (despite the C type, one
    /// contiguous `float[num_algo][num_proto]`), unusable entries set to
    /// `NCCL_ALGO_PROTO_IGNORE`. NCCL takes the cheapest non-negative entry:
    /// the tuner may lower costs to steer it (never revive an ignored entry)
    /// and may write `*n_channels`. NCCL's header promises a fall-back on
    /// error, but NCCL 2.28 to 2.30 fail the collective call instead: return
    /// success to defer.
    pub get_coll_info: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            coll_type: Func,
            n_bytes: usize,
            num_pipe_ops: c_int,
            coll_cost_table: *mut *mut f32,
            num_algo: c_int,
            num_proto: c_int,
            n_channels: *mut c_int,
        ) -> NcclResult,
    >,
    /// Frees the state made by `init`, when its communicator is destroyed.
    pub destroy: Option<unsafe extern "C" fn(context: *mut c_void) -> NcclResult>,
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

    /// `ncclTuner_v3_t`.
    #[test]
    fn tuner_v3_layout() {
        assert_layout!(TunerV3, 32, 8, name @ 0, init @ 8, get_coll_info @ 16, destroy @ 24);
    }
}
