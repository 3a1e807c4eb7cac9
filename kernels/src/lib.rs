//! The device side of oxccl as CUDA C source, compiled at run time with
//! NVRTC for the GPU found (see `oxccl::cuda`), so that this crate builds
//! anywhere: no CUDA toolkit is needed to build it or anything above it.
//!
//! The files in `cuda/` are one translation unit, joined in this order:
//! element types and conversions, reduction ops, the data-path primitives,
//! the collective kernel, and the single-GPU kernels. Kernels that depend on
//! a datatype or an op are templates, instantiated by name (NVRTC name
//! expressions) from [`coll_kernel`], [`reduce_kernel`] and [`fill_kernel`].

/// The whole device source.
pub const SOURCE: &str = concat!(
    include_str!("../cuda/dtype.cu"),
    "\n",
    include_str!("../cuda/reduce.cu"),
    "\n",
    include_str!("../cuda/prims.cu"),
    "\n",
    include_str!("../cuda/coll.cu"),
    "\n",
    include_str!("../cuda/local.cu"),
);

/// FNV-1a of [`SOURCE`]: part of the key of compiled kernels cached on
/// disk, so that a changed source is never served an old binary.
pub const SOURCE_HASH: u64 = fnv1a64(SOURCE.as_bytes());

/// Ranks a window can address (`OXCCL_MAX_RANKS` in the source).
pub const MAX_RANKS: usize = 64;
/// Steps a collective's schedule may have (`OXCCL_MAX_STEPS`).
pub const MAX_STEPS: usize = 64;
/// Bytes between two flag words in a window (`OXCCL_FLAG_BYTES`).
pub const FLAG_BYTES: usize = 64;

/// The byte copy (not a template: its name is its symbol).
pub const COPY_KERNEL: &str = "oxccl_copy";

/// A reduction op as the kernels know it (the `Op*` structs in reduce.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelOp {
    Sum,
    Prod,
    Max,
    Min,
    /// Scales each rank's input on entry: premulsum, and the float average.
    PreMulSum,
    /// Sums, then divides the final result: the integer average.
    SumPostDiv,
}

impl KernelOp {
    pub const ALL: [KernelOp; 6] = [
        KernelOp::Sum,
        KernelOp::Prod,
        KernelOp::Max,
        KernelOp::Min,
        KernelOp::PreMulSum,
        KernelOp::SumPostDiv,
    ];

    /// The struct's name in the source.
    pub fn type_name(self) -> &'static str {
        match self {
            KernelOp::Sum => "OpSum",
            KernelOp::Prod => "OpProd",
            KernelOp::Max => "OpMax",
            KernelOp::Min => "OpMin",
            KernelOp::PreMulSum => "OpPreMulSum",
            KernelOp::SumPostDiv => "OpSumPostDiv",
        }
    }
}

/// The element types of the source by their C names, each with its size.
pub const ELEM_TYPES: [(&str, usize); 12] = [
    ("signed char", 1),
    ("unsigned char", 1),
    ("int", 4),
    ("unsigned int", 4),
    ("long long", 8),
    ("unsigned long long", 8),
    ("half_t", 2),
    ("float", 4),
    ("double", 8),
    ("bf16_t", 2),
    ("e4m3_t", 1),
    ("e5m2_t", 1),
];

/// Name expression of the collective kernel for an element type (a C name
/// from [`ELEM_TYPES`]) and an op.
pub fn coll_kernel(elem: &str, op: KernelOp) -> String {
    format!("&oxccl_coll<{elem}, {}>", op.type_name())
}

/// Name expression of the two-buffer reduction kernel.
pub fn reduce_kernel(elem: &str, op: KernelOp) -> String {
    format!("&oxccl_reduce<{elem}, {}>", op.type_name())
}

/// Name expression of the pattern fill kernel.
pub fn fill_kernel(elem: &str) -> String {
    format!("&oxccl_fill<{elem}>")
}

/// FNV-1a, 64 bits: a stable hash for cache keys (std's hasher may change between releases).
pub const fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_match_the_source() {
        for (name, v) in [
            ("OXCCL_MAX_RANKS", MAX_RANKS),
            ("OXCCL_MAX_STEPS", MAX_STEPS),
            ("OXCCL_FLAG_BYTES", FLAG_BYTES),
        ] {
            let line = format!("#define {name} {v}\n");
            assert!(SOURCE.contains(&line), "{line:?} missing from the source");
        }
    }

    #[test]
    fn every_named_kernel_exists() {
        for name in ["oxccl_coll", "oxccl_reduce", "oxccl_fill", COPY_KERNEL] {
            assert!(SOURCE.contains(&format!(" {name}(")), "{name}");
        }
        for op in KernelOp::ALL {
            assert!(SOURCE.contains(&format!("OXCCL_OP({},", op.type_name())));
        }
        for (c, _) in ELEM_TYPES {
            assert!(coll_kernel(c, KernelOp::Sum).contains(c));
        }
    }

    #[test]
    fn hash_is_stable() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(SOURCE_HASH, 0);
    }
}
