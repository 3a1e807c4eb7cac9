//! Version 1 of the events NCCL's InfiniBand net plugin reports through the
//! profiler callback (`net_ib_v1.h`): the `data` of a `netPlugin` event whose
//! id is `NCCL_PROFILER_NET_TYPE_IB | NET_IB_VER`. Frozen.

use std::os::raw::c_int;

/// `NCCL_PROFILER_NET_IB_VER`: the version part of the plugin id.
pub const NET_IB_VER: u32 = 1;

/// `ncclProfileQp`: `ty` of a work request posted on a queue pair.
pub const NCCL_PROFILE_QP: u8 = 1 << 0;

/// `ncclProfilerNetIbDescr_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NetIbDescrV1 {
    /// Which member of `detail` is valid ([`NCCL_PROFILE_QP`]).
    pub ty: u8,
    /// The per-type part (an anonymous union in C).
    pub detail: NetIbDetailV1,
}

/// The union of `ncclProfilerNetIbDescr_v1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union NetIbDetailV1 {
    pub qp: NetIbQpDescrV1,
}

/// A work request on a queue pair.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetIbQpDescrV1 {
    /// Network device index.
    pub device: c_int,
    /// Work request id.
    pub wr_id: u64,
    /// `ibv_wr_opcode`.
    pub opcode: c_int,
    /// Queue pair number.
    pub qp_num: c_int,
    /// Bytes of the work request.
    pub length: usize,
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

    /// `ncclProfilerNetIbDescr_v1_t`.
    #[test]
    fn net_ib_descr_v1_layout() {
        assert_layout!(NetIbDescrV1, 40, 8, ty @ 0, detail.qp @ 8, detail.qp.device @ 8,
            detail.qp.wr_id @ 16, detail.qp.opcode @ 24, detail.qp.qp_num @ 28,
            detail.qp.length @ 32);
    }
}
