//! `ncclTuner_v2_t` (NCCL 2.21 onwards; still loaded by 2.28 and 2.30).
//! Frozen: a change makes a new version file.
//!
//! The tuner names an algorithm and a protocol directly instead of editing a
//! cost table.

use std::os::raw::{c_char, c_int, c_void};

use crate::ffi::types::{Func, Logger, NcclResult};

/// Symbol of the vtable ([`TunerV2`]).
pub const SYMBOL: &[u8] = b"ncclTunerPlugin_v2\0";

/// `ncclTuner_v2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TunerV2 {
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
    /// Asked for each collective of `n_bytes` (`coll_type` a `ncclFunc_t`;
    /// `num_pipe_ops` operations in the group; whether collnet and NVLS can
    /// run it). May write `*algorithm` and `*protocol` (both or neither) and
    /// `*n_channels`; whatever it leaves alone keeps NCCL's choice. NCCL's
    /// header promises a fall-back on error too, but NCCL 2.28 to 2.30 fail
    /// the collective call instead: return success to defer.
    pub get_coll_info: Option<
        unsafe extern "C" fn(
            context: *mut c_void,
            coll_type: Func,
            n_bytes: usize,
            coll_net_support: c_int,
            nvls_support: c_int,
            num_pipe_ops: c_int,
            algorithm: *mut c_int,
            protocol: *mut c_int,
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

    /// `ncclTuner_v2_t`.
    #[test]
    fn tuner_v2_layout() {
        assert_layout!(TunerV2, 32, 8, name @ 0, init @ 8, get_coll_info @ 16, destroy @ 24);
    }
}
