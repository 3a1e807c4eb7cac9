//! NCCL 2.31.2's C types, value for value and byte for byte: result codes,
//! datatypes, reduction operators, the unique id, the configuration, the
//! per-call configuration of the `nccl*Config` collectives, the
//! simulation record, the types of the newer calls (memory statistics,
//! signals, parameter handles) and the communicator properties of
//! `nccl_device`'s `ncclCommQueryProperties`. Datatypes and operators are plain `int`s here,
//! not Rust enums, because callers may pass any value (a redop made by
//! `ncclRedOpCreatePreMulSum` is one past the built-in ones) and an
//! out-of-range enum would be undefined behaviour in Rust.
#![allow(non_camel_case_types, non_upper_case_globals)]

use std::os::raw::{c_char, c_float, c_int, c_uint, c_void};

// The NCCL release whose nccl.h this library mirrors. `ncclGetVersion`
// reports it: programs built against an older NCCL (PyTorch 2.11 against
// 2.28) accept a newer runtime, and nothing older than 2.31 has the calls
// this library exports (the per-call `nccl*Config` collectives).
pub const NCCL_MAJOR: c_int = 2;
pub const NCCL_MINOR: c_int = 31;
pub const NCCL_PATCH: c_int = 2;
/// `NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)`.
pub const NCCL_VERSION_CODE: c_int = 23102;

/// `ncclConfig_t.magic` and `NCCL_CONFIG_INITIALIZER`'s.
pub const NCCL_API_MAGIC: c_uint = 0xcafe_beef;

/// `ncclCommWindowRegister` flags.
pub const NCCL_WIN_DEFAULT: c_int = 0x00;
pub const NCCL_WIN_COLL_SYMMETRIC: c_int = 0x01;
pub const NCCL_WIN_STRICT_ORDERING: c_int = 0x02;
pub const NCCL_WIN_REQUIRED_ALIGNMENT: c_int = 4096;

/// `ncclConfig_t.CTAPolicy` values.
pub const NCCL_CTA_POLICY_DEFAULT: c_int = 0x00;
pub const NCCL_CTA_POLICY_EFFICIENCY: c_int = 0x01;
pub const NCCL_CTA_POLICY_ZERO: c_int = 0x02;

/// `ncclCommShrink` flags.
pub const NCCL_SHRINK_DEFAULT: c_int = 0x00;
pub const NCCL_SHRINK_ABORT: c_int = 0x01;

/// `ncclCommRevoke` flags (only 0 is defined).
pub const NCCL_REVOKE_DEFAULT: c_int = 0x00;

/// `ncclCommSuspend` flag: release the communicator's GPU memory.
pub const NCCL_SUSPEND_MEM: c_int = 0x01;

/// NCCL's result codes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ncclResult_t {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclTimeout = 8,
    ncclNumResults = 9,
}

pub type ncclDataType_t = c_int;
pub const ncclInt8: ncclDataType_t = 0;
pub const ncclChar: ncclDataType_t = 0;
pub const ncclUint8: ncclDataType_t = 1;
pub const ncclInt32: ncclDataType_t = 2;
pub const ncclInt: ncclDataType_t = 2;
pub const ncclUint32: ncclDataType_t = 3;
pub const ncclInt64: ncclDataType_t = 4;
pub const ncclUint64: ncclDataType_t = 5;
pub const ncclFloat16: ncclDataType_t = 6;
pub const ncclHalf: ncclDataType_t = 6;
pub const ncclFloat32: ncclDataType_t = 7;
pub const ncclFloat: ncclDataType_t = 7;
pub const ncclFloat64: ncclDataType_t = 8;
pub const ncclDouble: ncclDataType_t = 8;
pub const ncclBfloat16: ncclDataType_t = 9;
pub const ncclFloat8e4m3: ncclDataType_t = 10;
pub const ncclFloat8e5m2: ncclDataType_t = 11;
pub const ncclNumTypes: ncclDataType_t = 12;

pub type ncclRedOp_t = c_int;
pub const ncclSum: ncclRedOp_t = 0;
pub const ncclProd: ncclRedOp_t = 1;
pub const ncclMax: ncclRedOp_t = 2;
pub const ncclMin: ncclRedOp_t = 3;
pub const ncclAvg: ncclRedOp_t = 4;
/// Built-in operators; also the first value a created operator gets.
pub const ncclNumOps: ncclRedOp_t = 5;
pub const ncclMaxRedOp: ncclRedOp_t = 0x7fff_ffff;

pub type ncclScalarResidence_t = c_int;
/// The scalar is in device memory.
pub const ncclScalarDevice: ncclScalarResidence_t = 0;
/// The scalar is in host memory, read before the call returns.
pub const ncclScalarHostImmediate: ncclScalarResidence_t = 1;

pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// Opaque bytes naming a communicator's rendezvous.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [c_char; NCCL_UNIQUE_ID_BYTES],
}

/// `ncclConfig_t.hostCftMode` values (NCCL's `ncclHostCftMode_t`; the
/// default is `NCCL_CONFIG_UNDEF_INT`, which the header defines itself:
/// cbindgen cannot write INT_MIN).
pub type ncclHostCftMode_t = c_int;
pub const ncclHostCftDefault: ncclHostCftMode_t = c_int::MIN;
pub const ncclHostCftEnable: ncclHostCftMode_t = 1;
pub const ncclHostCftDisable: ncclHostCftMode_t = 2;
pub const ncclHostCftFallback: ncclHostCftMode_t = 3;

/// `ncclConfig_t` of NCCL 2.31 (`ncclConfig_v23100`). Callers built
/// against an older NCCL (2.28's ends at `nvlinkCentricSched`, 2.30's at
/// `graphStreamOrdering`) pass a shorter struct: `size` says how much of it
/// is there, and fields past it are never read.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub blocking: c_int,
    pub cgaClusterSize: c_int,
    pub minCTAs: c_int,
    pub maxCTAs: c_int,
    pub netName: *const c_char,
    pub splitShare: c_int,
    pub trafficClass: c_int,
    pub commName: *const c_char,
    pub collnetEnable: c_int,
    pub CTAPolicy: c_int,
    pub shrinkShare: c_int,
    pub nvlsCTAs: c_int,
    pub nChannelsPerNetPeer: c_int,
    pub nvlinkCentricSched: c_int,
    pub graphUsageMode: c_int,
    pub numRmaCtx: c_int,
    pub maxP2pPeers: c_int,
    pub graphStreamOrdering: c_int,
    pub launchOrderImplicit: c_int,
    pub numRmaSig: c_int,
    pub rmaEagerInit: c_int,
    pub hostCftMode: c_int,
}

/// `ncclConfigExt_t.key`: a vendor's id and its option's (an anonymous
/// struct in NCCL's header; the same layout).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclConfigExtKey {
    pub vendorId: c_int,
    pub optionId: c_int,
}

/// `ncclConfigExt_t.val` (an anonymous union in NCCL's header).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ncclConfigExtVal {
    pub i: c_int,
    pub s: *const c_char,
    pub raw: *mut c_void,
}

/// One vendor option of a per-call configuration, chained through `next`.
/// NCCL ignores every extension, and so does oxccl.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclConfigExt_t {
    pub next: *mut ncclConfigExt_t,
    pub key: ncclConfigExtKey,
    pub val: ncclConfigExtVal,
}

/// The configuration of one collective call (`ncclCollConfig_v23100`),
/// initialised with `NCCL_COLLCONFIG_INITIALIZER` and given to the
/// `nccl*Config` calls; append-only, as `ncclConfig_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclCollConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    /// Vendor options; ignored.
    pub ext: *mut ncclConfigExt_t,
    /// Fewest CTAs (channels) the call runs on.
    pub minCTAs: c_int,
    /// Most CTAs the call runs on; at most the communicator's maxCTAs.
    pub maxCTAs: c_int,
    /// The NVLS channels' cap (oxccl runs no NVLS).
    pub nvlsCTAs: c_int,
    /// Thread-block cluster size.
    pub cgaClusterSize: c_int,
    /// Which algorithms the call may use (NCCL's selection grammar);
    /// NULL or "" leaves the choice to the library.
    pub algSelection: *const c_char,
    /// 1 (the default): a selection that cannot be honoured is an error;
    /// 0: the call falls back to the library's choice.
    pub forceAlgSelection: c_int,
    /// `NCCL_CTA_POLICY_*` bits; UNDEF takes the communicator's.
    pub CTAPolicy: c_int,
    /// Given to profiler plugins with the call's events.
    pub userProfilerTag: u64,
}

/// `ncclGinType_t` of `nccl_device` (oxccl has no GPU-initiated networking: NONE).
pub type ncclGinType_t = c_int;
pub const NCCL_GIN_TYPE_NONE: ncclGinType_t = 0;
pub const NCCL_GIN_TYPE_PROXY: ncclGinType_t = 2;
pub const NCCL_GIN_TYPE_GDAKI: ncclGinType_t = 3;
pub const NCCL_GIN_TYPE_GPI: ncclGinType_t = 4;
pub const NCCL_GIN_TYPE_EFA_GDA: ncclGinType_t = 5;
pub const NCCL_GIN_MAX_TYPES: ncclGinType_t = 6;

/// `ncclGinConnectionType_t` of `nccl_device`.
pub type ncclGinConnectionType_t = c_int;
pub const NCCL_GIN_CONNECTION_NONE: ncclGinConnectionType_t = 0;
pub const NCCL_GIN_CONNECTION_FULL: ncclGinConnectionType_t = 1;
pub const NCCL_GIN_CONNECTION_RAIL: ncclGinConnectionType_t = 2;
pub const NCCL_GIN_CONNECTION_CUSTOM_STRIDE: ncclGinConnectionType_t = 3;

/// What `ncclCommQueryProperties` fills in (`nccl_device/core.h`'s
/// `ncclCommProperties_t`, initialised with `NCCL_COMM_PROPERTIES_INITIALIZER`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclCommProperties_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    pub rank: c_int,
    pub nRanks: c_int,
    /// The CUDA device; -1 on host memory.
    pub cudaDev: c_int,
    /// The NVML index of that device; -1 on host memory.
    pub nvmlDev: c_int,
    /// Whether `ncclDevCommCreate` works: false (no symmetric memory yet).
    pub deviceApiSupport: bool,
    /// Whether NVLink multicast is used: false.
    pub multimemSupport: bool,
    pub ginType: ncclGinType_t,
    /// Load/store-accessible teams: 0 without symmetric memory.
    pub nLsaTeams: c_int,
    /// Whether host-initiated one-sided operations work: false.
    pub hostRmaSupport: bool,
    pub railedGinType: ncclGinType_t,
    /// The communicator's hash (NCCL's commHash, as its logs print it).
    pub commHash: u64,
    pub ginMinStride: c_int,
    pub ginConnectionType: ncclGinConnectionType_t,
    /// `ginSupport[i]`: GIN type i works; all false.
    pub ginSupport: [bool; 64],
    /// Bytes of a device communicator of this library's own version: 0 (none).
    pub devCommRuntimeVersionSize: usize,
}

/// `NCCL_API_MAGIC` under the name this header gave it before NCCL named it.
pub const NCCL_CONFIG_MAGIC: c_uint = NCCL_API_MAGIC;

/// What `ncclGroupSimulateEnd` fills in.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclSimInfo_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    /// Predicted time of the group, in microseconds.
    pub estimatedTime: c_float,
}

/// `NCCL_SIM_INFO_INITIALIZER`'s magic.
pub const NCCL_SIM_INFO_MAGIC: c_uint = 0x7468_5283;

/// A communicator, as C code sees it: opaque.
pub struct ncclComm {
    pub(crate) _private: [u8; 0],
}
pub type ncclComm_t = *mut ncclComm;

/// A device communicator of `nccl_device` (`ncclDevComm_t`): opaque here.
pub struct ncclDevComm {
    pub(crate) _private: [u8; 0],
}
/// `ncclDevCommCreate`'s requirements (`ncclDevCommRequirements_t`): opaque here.
pub struct ncclDevCommRequirements {
    pub(crate) _private: [u8; 0],
}
/// A multicast handle of `nccl_device`, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclMultimemHandle_t {
    pub mcBasePtr: *mut c_void,
}
/// A team of `nccl_device` (a strided set of ranks), passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclTeam_t {
    pub nRanks: c_int,
    pub rank: c_int,
    pub stride: c_int,
}
/// `nccl_device`'s copy-engine (CFT) element id.
pub type ncclCftLeId = u32;

/// A registered window (`ncclCommWindowRegister`): opaque.
pub struct ncclWindow_vidmem {
    pub(crate) _private: [u8; 0],
}
pub type ncclWindow_t = *mut ncclWindow_vidmem;

/// What `ncclCommMemStats` reports. A plain `int` with NCCL's values, as
/// the datatypes: a caller may pass any value, which is refused.
pub type ncclCommMemStat_t = c_int;
/// GPU memory the communicator could release while suspended (bytes).
pub const ncclStatGpuMemSuspend: ncclCommMemStat_t = 0;
/// 1 while the communicator is suspended, else 0.
pub const ncclStatGpuMemSuspended: ncclCommMemStat_t = 1;
/// GPU memory kept for the communicator's whole life (bytes).
pub const ncclStatGpuMemPersist: ncclCommMemStat_t = 2;
/// All GPU memory the communicator allocated (bytes).
pub const ncclStatGpuMemTotal: ncclCommMemStat_t = 3;

/// One entry of `ncclWaitSignal`'s list: wait for `opCnt` signals from
/// `peer` on signal `sigIdx` of context `ctx`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclWaitSignalDesc_t {
    pub opCnt: c_int,
    pub peer: c_int,
    pub sigIdx: c_int,
    pub ctx: c_int,
}

/// A parameter bound by `ncclParamBind`: opaque, owned by the library.
pub struct ncclParamHandle {
    pub(crate) _private: [u8; 0],
}
pub type ncclParamHandle_t = *mut ncclParamHandle;

/// `cudaStream_t` (a `CUstream`); declared by CUDA's headers, or as an
/// opaque pointer by ours when they are not included.
pub type cudaStream_t = *mut c_void;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Offsets of NCCL 2.31.2's nccl.h on x86-64 (LP64).
    #[test]
    fn layouts_match_nccl() {
        assert_eq!(size_of::<ncclUniqueId>(), 128);
        assert_eq!(size_of::<ncclConfig_t>(), 112);
        // Where 2.30's struct ended: callers built against it pass size 96.
        assert_eq!(offset_of!(ncclConfig_t, launchOrderImplicit), 96);
        assert_eq!(offset_of!(ncclConfig_t, hostCftMode), 108);
        assert_eq!(size_of::<ncclCollConfig_t>(), 64);
        assert_eq!(offset_of!(ncclCollConfig_t, ext), 16);
        assert_eq!(offset_of!(ncclCollConfig_t, minCTAs), 24);
        assert_eq!(offset_of!(ncclCollConfig_t, cgaClusterSize), 36);
        assert_eq!(offset_of!(ncclCollConfig_t, algSelection), 40);
        assert_eq!(offset_of!(ncclCollConfig_t, forceAlgSelection), 48);
        assert_eq!(offset_of!(ncclCollConfig_t, CTAPolicy), 52);
        assert_eq!(offset_of!(ncclCollConfig_t, userProfilerTag), 56);
        assert_eq!(size_of::<ncclConfigExt_t>(), 24);
        assert_eq!(size_of::<ncclCommProperties_t>(), 144);
        assert_eq!(offset_of!(ncclCommProperties_t, deviceApiSupport), 32);
        assert_eq!(offset_of!(ncclCommProperties_t, ginType), 36);
        assert_eq!(offset_of!(ncclCommProperties_t, hostRmaSupport), 44);
        assert_eq!(offset_of!(ncclCommProperties_t, commHash), 56);
        assert_eq!(offset_of!(ncclCommProperties_t, ginSupport), 72);
        assert_eq!(
            offset_of!(ncclCommProperties_t, devCommRuntimeVersionSize),
            136
        );
        // Where 2.28's struct ended: callers built against it pass size 80.
        assert_eq!(offset_of!(ncclConfig_t, graphUsageMode), 80);
        assert_eq!(offset_of!(ncclConfig_t, graphStreamOrdering), 92);
        assert_eq!(size_of::<ncclWaitSignalDesc_t>(), 16);
        assert_eq!(
            NCCL_VERSION_CODE,
            NCCL_MAJOR * 10000 + NCCL_MINOR * 100 + NCCL_PATCH
        );
        assert_eq!(offset_of!(ncclConfig_t, blocking), 16);
        assert_eq!(offset_of!(ncclConfig_t, netName), 32);
        assert_eq!(offset_of!(ncclConfig_t, splitShare), 40);
        assert_eq!(offset_of!(ncclConfig_t, commName), 48);
        assert_eq!(offset_of!(ncclConfig_t, collnetEnable), 56);
        assert_eq!(offset_of!(ncclConfig_t, nvlinkCentricSched), 76);
        assert_eq!(size_of::<ncclSimInfo_t>(), 24);
        assert_eq!(size_of::<ncclResult_t>(), 4);
    }
}
