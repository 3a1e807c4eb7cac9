//! NCCL's tuner plugin ABI, `ncclTuner_vN_t`, one frozen file per version as
//! NCCL keeps `tuner_v2.h` … `tuner_v6.h`.
//!
//! A library exports a vtable under [`v5::SYMBOL`] (`ncclTunerPlugin_v5`) and
//! so on; the loader takes the newest it knows. NCCL 2.28 loads v2 to v5,
//! NCCL 2.30 adds v6.
//!
//! From v3 on, NCCL hands the tuner its cost table: `numAlgo` rows of
//! `numProto` floats (estimated microseconds), entries NCCL will not use set
//! to [`NCCL_ALGO_PROTO_IGNORE`]. NCCL then takes the cheapest usable entry,
//! so a tuner steers it by lowering costs (0 selects an entry) and may set
//! the channel count. A tuner error, or a table left alone, keeps NCCL's own
//! choice.

use std::os::raw::c_int;

pub mod v2;
pub mod v3;
pub mod v4;
pub mod v5;
pub mod v6;

/// `NCCL_ALGO_*`: rows of the cost table.
pub const NCCL_ALGO_UNDEF: c_int = -1;
pub const NCCL_ALGO_TREE: c_int = 0;
pub const NCCL_ALGO_RING: c_int = 1;
pub const NCCL_ALGO_COLLNET_DIRECT: c_int = 2;
pub const NCCL_ALGO_COLLNET_CHAIN: c_int = 3;
pub const NCCL_ALGO_NVLS: c_int = 4;
pub const NCCL_ALGO_NVLS_TREE: c_int = 5;
pub const NCCL_ALGO_PAT: c_int = 6;
/// `NCCL_NUM_ALGORITHMS` (7 since NCCL 2.24; 6 before PAT): rows of the
/// cost table. Tuners should use the `numAlgo` they are given.
pub const NCCL_NUM_ALGORITHMS: usize = 7;

/// `NCCL_PROTO_*`: columns of the cost table.
pub const NCCL_PROTO_UNDEF: c_int = -1;
pub const NCCL_PROTO_LL: c_int = 0;
pub const NCCL_PROTO_LL128: c_int = 1;
pub const NCCL_PROTO_SIMPLE: c_int = 2;
/// `NCCL_NUM_PROTOCOLS`: columns of the cost table.
pub const NCCL_NUM_PROTOCOLS: usize = 3;

/// `NCCL_ALGO_PROTO_IGNORE`: the cost of a combination NCCL will not use.
pub const NCCL_ALGO_PROTO_IGNORE: f32 = -1.0;

/// `NCCL_HW_*`: link kinds, rows of `hwLatencies` (tuner v5 constants).
pub const NCCL_HW_NVLINK: usize = 0;
pub const NCCL_HW_PCI: usize = 1;
pub const NCCL_HW_NET: usize = 2;
/// `NCCL_NUM_HW_LINKS`.
pub const NCCL_NUM_HW_LINKS: usize = 3;

/// `NCCL_*_COMPCAP_IDX`: GPU generations, rows of the bandwidth tables.
pub const NCCL_VOLTA_COMPCAP_IDX: usize = 0;
pub const NCCL_AMPERE_COMPCAP_IDX: usize = 1;
pub const NCCL_HOPPER_COMPCAP_IDX: usize = 2;
pub const NCCL_BLACKWELL_COMPCAP_IDX: usize = 3;
/// `NCCL_NUM_COMPCAPS`.
pub const NCCL_NUM_COMPCAPS: usize = 4;

/// `NCCL_TUNING_SCALE_*`: node counts, columns of the bandwidth tables.
pub const NCCL_TUNING_SCALE_1NODE: usize = 0;
pub const NCCL_TUNING_SCALE_2NODES: usize = 1;
pub const NCCL_TUNING_SCALE_4NODES: usize = 2;
/// `NCCL_NUM_TUNING_SCALES`.
pub const NCCL_NUM_TUNING_SCALES: usize = 3;

#[cfg(test)]
mod symbol_tests {
    use std::ffi::CStr;

    /// The names NCCL's loader looks up with dlsym (src/plugin/tuner/tuner_vN.cc).
    #[test]
    fn symbols_are_the_names_nccl_looks_up() {
        let all: [(&[u8], &str); 5] = [
            (super::v2::SYMBOL, "ncclTunerPlugin_v2"),
            (super::v3::SYMBOL, "ncclTunerPlugin_v3"),
            (super::v4::SYMBOL, "ncclTunerPlugin_v4"),
            (super::v5::SYMBOL, "ncclTunerPlugin_v5"),
            (super::v6::SYMBOL, "ncclTunerPlugin_v6"),
        ];
        for (sym, name) in all {
            assert_eq!(CStr::from_bytes_with_nul(sym).unwrap().to_str(), Ok(name));
        }
    }

    /// The cost table NCCL passes is `float[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS]`
    /// and matches the v5 constants' dimensions.
    #[test]
    fn table_dimensions_agree() {
        assert_eq!(super::NCCL_NUM_ALGORITHMS, super::v5::NUM_ALGORITHMS_V5);
        assert_eq!(super::NCCL_NUM_PROTOCOLS, super::v5::NUM_PROTOCOLS_V5);
        assert_eq!(super::NCCL_NUM_HW_LINKS, super::v5::NUM_HW_LINKS_V5);
        assert_eq!(super::NCCL_NUM_COMPCAPS, super::v5::NUM_COMPCAPS_V5);
        assert_eq!(
            super::NCCL_NUM_TUNING_SCALES,
            super::v5::NUM_TUNING_SCALES_V5
        );
    }
}
