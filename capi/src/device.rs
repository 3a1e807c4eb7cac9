//! The host functions of NCCL 2.31's device API (`nccl_device/core.h`):
//! the communicator's properties, which oxccl reports as they are, and
//! the window pointer getters of peers' parts (`oxccl::win`), and the
//! device communicator, multicast and copy-engine element getters, which
//! need NCCL's device API that oxccl does not build: those return
//! `ncclInvalidUsage` with a WARN naming what is missing.

use std::os::raw::{c_int, c_void};

use oxccl::Error;

use crate::guard::{entry, ok};
use crate::handle;
use crate::types::*;

/// Fills `props` (initialised with `NCCL_COMM_PROPERTIES_INITIALIZER`)
/// from the communicator: its rank, size, GPU and hash. What names
/// something oxccl lacks is reported as absent: no device API
/// (`deviceApiSupport` false, `devCommRuntimeVersionSize` 0), no NVLink
/// multicast, no GPU-initiated networking (every GIN field NONE or false),
/// no host one-sided operations, no load/store teams (`nLsaTeams` 0).
/// `nvmlDev` is the CUDA ordinal (oxccl does not map it to NVML's order;
/// they agree where CUDA_VISIBLE_DEVICES is unset and CUDA_DEVICE_ORDER is
/// PCI_BUS_ID); -1 for both on host memory.
#[no_mangle]
pub extern "C" fn ncclCommQueryProperties(
    comm: ncclComm_t,
    props: *mut ncclCommProperties_t,
) -> ncclResult_t {
    entry("ncclCommQueryProperties", || {
        let h = handle::get(comm)?;
        if props.is_null() {
            return Err(Error::InvalidArgument("props is NULL".into()));
        }
        // SAFETY: non-null; `size`, `magic` and `version` open the struct.
        let (size, magic, version) = unsafe { ((*props).size, (*props).magic, (*props).version) };
        if magic != NCCL_API_MAGIC {
            return Err(Error::InvalidUsage(format!(
                "ncclCommProperties_t has magic {magic:#x}, not NCCL_API_MAGIC: initialise it with NCCL_COMM_PROPERTIES_INITIALIZER"
            )));
        }
        let full = std::mem::size_of::<ncclCommProperties_t>();
        if size < full || version < 23100 {
            return Err(Error::InvalidUsage(format!(
                "ncclCommProperties_t of size {size}, version {version}: oxccl fills NCCL 2.31's ({full} bytes, version 23100 or later); initialise it with NCCL_COMM_PROPERTIES_INITIALIZER"
            )));
        }
        let c = &h.comm;
        let dev = c.device()?.map_or(-1, |d| d as c_int);
        let p = ncclCommProperties_t {
            size,
            magic,
            version,
            rank: c.user_rank() as c_int,
            nRanks: c.count() as c_int,
            cudaDev: dev,
            nvmlDev: dev,
            deviceApiSupport: false,
            multimemSupport: false,
            ginType: NCCL_GIN_TYPE_NONE,
            nLsaTeams: 0,
            hostRmaSupport: false,
            railedGinType: NCCL_GIN_TYPE_NONE,
            commHash: c.comm_hash()?,
            ginMinStride: 1,
            ginConnectionType: NCCL_GIN_CONNECTION_NONE,
            ginSupport: [false; 64],
            devCommRuntimeVersionSize: 0,
        };
        // SAFETY: non-null and at least this struct's size (checked).
        unsafe { props.write(p) };
        ok()
    })
}

/// Why each function below is refused.
const NO_WINDOWS: &str =
    "oxccl builds memory windows (ncclCommWindowRegister) but not NCCL's device API on them (device communicators, NVLink multicast, copy-engine elements)";

fn refuse(name: &'static str, what: &str) -> ncclResult_t {
    entry(name, || {
        Err(Error::InvalidUsage(format!(
            "{what} is not implemented by oxccl: {NO_WINDOWS}"
        )))
    })
}

/// A device communicator for kernels that communicate by themselves:
/// refused (NCCL's device API is not built).
#[no_mangle]
pub extern "C" fn ncclDevCommCreate(
    comm: ncclComm_t,
    reqs: *const ncclDevCommRequirements,
    outDevComm: *mut ncclDevComm,
) -> ncclResult_t {
    let _ = (comm, reqs, outDevComm);
    refuse(
        "ncclDevCommCreate",
        "NCCL's device API (device communicators)",
    )
}

#[no_mangle]
pub extern "C" fn ncclDevCommDestroy(
    comm: ncclComm_t,
    devComm: *const ncclDevComm,
) -> ncclResult_t {
    let _ = (comm, devComm);
    refuse(
        "ncclDevCommDestroy",
        "NCCL's device API (device communicators)",
    )
}

/// A window's NVLink multicast address: refused (no windows, no multicast).
#[no_mangle]
pub extern "C" fn ncclGetLsaMultimemDevicePointer(
    window: ncclWindow_t,
    offset: usize,
    outPtr: *mut *mut c_void,
) -> ncclResult_t {
    let _ = (window, offset, outPtr);
    refuse(
        "ncclGetLsaMultimemDevicePointer",
        "a window's multicast pointer",
    )
}

/// A window's multicast address through a multicast handle: refused.
#[no_mangle]
pub extern "C" fn ncclGetMultimemDevicePointer(
    window: ncclWindow_t,
    offset: usize,
    multimem: ncclMultimemHandle_t,
    outPtr: *mut *mut c_void,
) -> ncclResult_t {
    let _ = (window, offset, multimem, outPtr);
    refuse(
        "ncclGetMultimemDevicePointer",
        "a window's multicast pointer",
    )
}

/// A load/store team peer's address of a window: where rank `lsaRank`'s
/// part is mapped in this process, `offset` bytes in. Windows span one
/// host, so the load/store team is the communicator and its ranks are the
/// communicator's.
#[no_mangle]
pub extern "C" fn ncclGetLsaDevicePointer(
    window: ncclWindow_t,
    offset: usize,
    lsaRank: c_int,
    outPtr: *mut *mut c_void,
) -> ncclResult_t {
    entry("ncclGetLsaDevicePointer", || {
        peer_pointer(window, offset, lsaRank, outPtr)
    })
}

/// A peer's address of a window: as ncclGetLsaDevicePointer.
#[no_mangle]
pub extern "C" fn ncclGetPeerDevicePointer(
    window: ncclWindow_t,
    offset: usize,
    peer: c_int,
    outPtr: *mut *mut c_void,
) -> ncclResult_t {
    entry("ncclGetPeerDevicePointer", || {
        peer_pointer(window, offset, peer, outPtr)
    })
}

fn peer_pointer(
    window: ncclWindow_t,
    offset: usize,
    peer: c_int,
    out: *mut *mut c_void,
) -> crate::guard::Outcome {
    if out.is_null() {
        return Err(Error::InvalidArgument("outPtr is NULL".into()));
    }
    let w = oxccl::win::find(window as usize)?;
    let (base, size) = usize::try_from(peer)
        .ok()
        .and_then(|p| w.peer(p))
        .ok_or_else(|| Error::InvalidArgument(format!("peer {peer} has no part of the window")))?;
    if offset >= size {
        return Err(Error::InvalidArgument(format!(
            "offset {offset} is beyond peer {peer}'s part of the window ({size} bytes)"
        )));
    }
    // SAFETY: non-null; NCCL's contract makes it writable.
    unsafe { out.write((base + offset as u64) as *mut c_void) };
    ok()
}

/// A window's multicast copy-engine element: refused.
#[no_mangle]
pub extern "C" fn ncclGetMultimemDeviceLeInfo(
    window: ncclWindow_t,
    offset: usize,
    leId: *mut ncclCftLeId,
    leOffset: *mut usize,
) -> ncclResult_t {
    let _ = (window, offset, leId, leOffset);
    refuse(
        "ncclGetMultimemDeviceLeInfo",
        "a window's copy-engine (CFT) element",
    )
}

/// A CFT team peer's copy-engine element of a window: refused.
#[no_mangle]
pub extern "C" fn ncclGetCftDeviceLeInfo(
    window: ncclWindow_t,
    offset: usize,
    peerCft: c_int,
    cftTeam: ncclTeam_t,
    leId: *mut ncclCftLeId,
    leOffset: *mut usize,
) -> ncclResult_t {
    let _ = (window, offset, peerCft, cftTeam, leId, leOffset);
    refuse(
        "ncclGetCftDeviceLeInfo",
        "a window's copy-engine (CFT) element",
    )
}

/// A peer's copy-engine element of a window: refused.
#[no_mangle]
pub extern "C" fn ncclGetPeerDeviceLeInfo(
    window: ncclWindow_t,
    offset: usize,
    peerWorld: c_int,
    leId: *mut ncclCftLeId,
    leOffset: *mut usize,
) -> ncclResult_t {
    let _ = (window, offset, peerWorld, leId, leOffset);
    refuse(
        "ncclGetPeerDeviceLeInfo",
        "a window's copy-engine (CFT) element",
    )
}
