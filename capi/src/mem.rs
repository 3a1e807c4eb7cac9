//! Memory: allocation for NCCL's optimisations, buffer registration,
//! windows and the one-sided calls on them.

use std::os::raw::{c_int, c_uint, c_void};
use std::sync::Arc;

use oxccl::Error;

use crate::guard::{entry, ok};
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

/// Collective: every rank registers its buffer; same-host peers map it
/// (see `oxccl::win`). The handle is the window object's address, kept
/// alive by the communicator until ncclCommWindowDeregister.
#[no_mangle]
pub extern "C" fn ncclCommWindowRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    win: *mut ncclWindow_t,
    winFlags: c_int,
) -> ncclResult_t {
    entry("ncclCommWindowRegister", || {
        let h = crate::handle::get(comm)?;
        if win.is_null() {
            return Err(Error::InvalidArgument("win is NULL".into()));
        }
        let w = oxccl::win::register(&h.comm, buff as u64, size, winFlags)?;
        // SAFETY: non-null; NCCL's contract makes it writable.
        unsafe { win.write(Arc::as_ptr(&w) as ncclWindow_t) };
        ok()
    })
}

/// Local to the rank, as NCCL's: the peers' buffers are unmapped once the
/// GPU's queued work is done.
#[no_mangle]
pub extern "C" fn ncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t {
    entry("ncclCommWindowDeregister", || {
        let h = crate::handle::get(comm)?;
        let w = oxccl::win::by_addr(&h.comm, win as usize)?;
        oxccl::win::deregister(&h.comm, &w)?;
        ok()
    })
}

/// The buffer this rank registered as `win`.
#[no_mangle]
pub extern "C" fn ncclWinGetUserPtr(
    comm: ncclComm_t,
    win: ncclWindow_t,
    outUserPtr: *mut *mut c_void,
) -> ncclResult_t {
    entry("ncclWinGetUserPtr", || {
        let h = crate::handle::get(comm)?;
        if outUserPtr.is_null() {
            return Err(Error::InvalidArgument("outUserPtr is NULL".into()));
        }
        let w = oxccl::win::by_addr(&h.comm, win as usize)?;
        // SAFETY: non-null; NCCL's contract makes it writable.
        unsafe { outUserPtr.write(w.user_ptr() as *mut c_void) };
        ok()
    })
}

fn peer_arg(what: &str, peer: c_int) -> Result<usize, Error> {
    usize::try_from(peer)
        .map_err(|_| Error::InvalidArgument(format!("{what}: peer {peer} is negative")))
}

/// One-sided: `count` elements from `localbuff` into `peer`'s part of
/// `peerWin` at `peerWinOffset` bytes, then a signal to `peer`, on
/// `stream` with no kernel (a copy-engine copy and a stream write).
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
    entry("ncclPutSignal", || {
        let h = crate::handle::get(comm)?;
        let bytes = count
            .checked_mul(oxccl::DataType::from_raw(datatype)?.size())
            .ok_or_else(|| Error::InvalidArgument(format!("count {count} is too large")))?;
        if peerWin.is_null() {
            return Err(Error::InvalidArgument("peerWin is NULL".into()));
        }
        let w = oxccl::win::by_addr(&h.comm, peerWin as usize)?;
        // SAFETY: NCCL's contract: the stream is a live stream of the
        // communicator's GPU (or 0).
        let s = unsafe { oxccl::cuda::RawStream::from_raw(stream as u64) };
        oxccl::win::signal::put_signal(
            &h.comm,
            localbuff as u64,
            bytes,
            peer_arg("ncclPutSignal", peer)?,
            &w,
            peerWinOffset,
            sigIdx,
            ctx,
            flags,
            s,
        )?;
        ok()
    })
}

/// A signal to `peer` with no data, on `stream` with no kernel.
#[no_mangle]
pub extern "C" fn ncclSignal(
    peer: c_int,
    sigIdx: c_int,
    ctx: c_int,
    flags: c_uint,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    entry("ncclSignal", || {
        let h = crate::handle::get(comm)?;
        // SAFETY: as in ncclPutSignal.
        let s = unsafe { oxccl::cuda::RawStream::from_raw(stream as u64) };
        oxccl::win::signal::signal(
            &h.comm,
            peer_arg("ncclSignal", peer)?,
            sigIdx,
            ctx,
            flags,
            s,
        )?;
        ok()
    })
}

/// The stream's later work waits for the signals each descriptor names.
#[no_mangle]
pub extern "C" fn ncclWaitSignal(
    nDesc: c_int,
    signalDescs: *mut ncclWaitSignalDesc_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> ncclResult_t {
    entry("ncclWaitSignal", || {
        let h = crate::handle::get(comm)?;
        let n = usize::try_from(nDesc).unwrap_or(0);
        let descs: &[ncclWaitSignalDesc_t] = if signalDescs.is_null() || n == 0 {
            &[]
        } else {
            // SAFETY: NCCL's contract: `signalDescs` holds `nDesc` entries.
            unsafe { std::slice::from_raw_parts(signalDescs, n) }
        };
        let descs = descs
            .iter()
            .map(|d| {
                Ok(oxccl::win::signal::WaitDesc {
                    op_count: d.opCnt,
                    peer: peer_arg("ncclWaitSignal", d.peer)?,
                    sig_idx: d.sigIdx,
                    ctx: d.ctx,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        // SAFETY: as in ncclPutSignal.
        let s = unsafe { oxccl::cuda::RawStream::from_raw(stream as u64) };
        oxccl::win::signal::wait_signal(&h.comm, &descs, s)?;
        ok()
    })
}
