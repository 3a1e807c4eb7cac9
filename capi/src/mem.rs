//! Memory: allocation for NCCL's optimisations, buffer registration, and
//! the device-side API oxccl does not offer.

use std::os::raw::{c_int, c_uint, c_void};

use oxccl::Error;

use crate::guard::{entry, not_implemented, ok};
use crate::types::*;

/// Device memory on the GPU current on this thread (cudaGetDevice's: device
/// 0 where the thread selected none), from the CUDA virtual memory API as
/// NCCL allocates it, so that peers can map it (see `oxccl::cuda::vmm`);
/// plain `cuMemAlloc` memory where the GPU has no virtual memory API.
#[no_mangle]
pub extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    entry("ncclMemAlloc", || {
        if ptr.is_null() {
            return Err(Error::InvalidArgument("ptr is NULL".into()));
        }
        oxccl::cuda::bind_runtime_device()?;
        let device = oxccl::cuda::current_device().unwrap_or(0);
        let dev = oxccl::cuda::Device::get(device)?;
        let p = if oxccl::cuda::vmm::vmm_supported(&dev)? {
            oxccl::cuda::vmm::vmm_alloc(device, size)?
        } else {
            tracing::info!(target: "oxccl::alloc", "ncclMemAlloc: GPU {device} has no virtual memory management; {size} bytes from cuMemAlloc, which peers cannot map by handle");
            oxccl::cuda::alloc_raw(size)?
        };
        // SAFETY: non-null; NCCL's contract makes it writable.
        unsafe { ptr.write(p as *mut c_void) };
        ok()
    })
}

#[no_mangle]
pub extern "C" fn ncclMemFree(ptr: *mut c_void) -> ncclResult_t {
    entry("ncclMemFree", || {
        if ptr.is_null() {
            return ok();
        }
        // SAFETY: NCCL's contract: `ptr` came from ncclMemAlloc and no work
        // on it is pending.
        if !unsafe { oxccl::cuda::vmm::vmm_free(ptr as u64) }? {
            // SAFETY: the same contract, for the cuMemAlloc fallback.
            unsafe { oxccl::cuda::free_raw(ptr as u64) }?;
        }
        ok()
    })
}

/// Registers a device buffer with the communicator, so that peers read it
/// where it lies instead of through step slots (see
/// `oxccl::Comm::register_buffer`: today, peers that are threads of this
/// process over P2P; other processes' and network peers still take the
/// step slots). NCCL_LOCAL_REGISTER=0 turns it off: the handle is NULL, as
/// NCCL's. Host memory, another GPU's memory and a range past its
/// allocation are refused with ncclInvalidArgument.
#[no_mangle]
pub extern "C" fn ncclCommRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> ncclResult_t {
    entry("ncclCommRegister", || {
        let h = crate::handle::get(comm)?;
        if handle.is_null() {
            return Err(Error::InvalidArgument("handle is NULL".into()));
        }
        let reg = h.comm.register_buffer(buff as u64, size)?;
        // SAFETY: non-null; NCCL's contract makes it writable.
        unsafe { handle.write(reg.map_or(std::ptr::null_mut(), |r| r as usize as *mut c_void)) };
        ok()
    })
}

/// Releases a registration; NULL (what NCCL_LOCAL_REGISTER=0 hands out) is
/// accepted as NCCL accepts it, a handle the communicator never gave (or
/// gave and took back) is refused with ncclInvalidArgument.
#[no_mangle]
pub extern "C" fn ncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t {
    entry("ncclCommDeregister", || {
        let h = crate::handle::get(comm)?;
        if handle.is_null() {
            return ok();
        }
        h.comm.deregister_buffer(handle as u64)?;
        ok()
    })
}

#[no_mangle]
pub extern "C" fn ncclCommWindowRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut ncclWindow_t,
    winFlags: c_int,
) -> ncclResult_t {
    let _ = (comm, buff, size, win, winFlags);
    not_implemented(
        "ncclCommWindowRegister",
        "symmetric memory windows; collectives work on unregistered buffers",
    )
}

#[no_mangle]
pub extern "C" fn ncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
    let _ = (comm, win);
    not_implemented("ncclCommWindowDeregister", "symmetric memory windows")
}

/// oxccl registers no windows (ncclCommWindowRegister refuses), so no
/// window exists to read a pointer from.
#[no_mangle]
pub extern "C" fn ncclWinGetUserPtr(
    comm: ncclComm_t,
    win: ncclWindow_t,
    outUserPtr: *mut *mut c_void,
) -> ncclResult_t {
    let _ = (comm, win, outUserPtr);
    not_implemented(
        "ncclWinGetUserPtr",
        "memory windows: ncclCommWindowRegister makes none",
    )
}

/// One-sided transfers write into a peer's registered window; without
/// windows there is nothing to write into or signal on.
const ONE_SIDED: &str =
    "one-sided transfers and signals need memory windows, which oxccl does not offer; use ncclSend/ncclRecv";

#[no_mangle]
#[allow(clippy::too_many_arguments)] // NCCL's arguments, one each
pub extern "C" fn ncclPutSignal(
    localbuff: *const c_void,
    count: usize,
    datatype: ncclDataType_t,
    peer: c_int,
    peerWin: ncclWindow_t,
    peerWinOffset: usize,
    sigIdx: c_int,
    ctx: c_int,
    flags: c_uint,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let _ = (
        localbuff,
        count,
        datatype,
        peer,
        peerWin,
        peerWinOffset,
        sigIdx,
        ctx,
        flags,
        comm,
        stream,
    );
    not_implemented("ncclPutSignal", ONE_SIDED)
}

#[no_mangle]
pub extern "C" fn ncclSignal(
    peer: c_int,
    sigIdx: c_int,
    ctx: c_int,
    flags: c_uint,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let _ = (peer, sigIdx, ctx, flags, comm, stream);
    not_implemented("ncclSignal", ONE_SIDED)
}

#[no_mangle]
pub extern "C" fn ncclWaitSignal(
    nDesc: c_int,
    signalDescs: *mut ncclWaitSignalDesc_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    let _ = (nDesc, signalDescs, comm, stream);
    not_implemented("ncclWaitSignal", ONE_SIDED)
}
