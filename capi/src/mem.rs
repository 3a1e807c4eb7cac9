//! Memory: allocation for NCCL's optimisations, buffer registration, and
//! the device-side API oxccl does not offer.

use std::os::raw::{c_int, c_void};

use oxccl::Error;

use crate::guard::{entry, not_implemented, ok};
use crate::handle;
use crate::types::*;

/// Device memory on the GPU current on this thread.
#[no_mangle]
pub extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t {
    entry("ncclMemAlloc", || {
        if ptr.is_null() {
            return Err(Error::InvalidArgument("ptr is NULL".into()));
        }
        let p = oxccl::cuda::alloc_raw(size)?;
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
        // SAFETY: NCCL's contract: `ptr` came from ncclMemAlloc.
        unsafe { oxccl::cuda::free_raw(ptr as u64) }?;
        ok()
    })
}

/// Registration lets NCCL skip copies through its own buffers. oxccl's
/// kernels read and write user buffers in place already, so there is
/// nothing to register: the handle is the buffer's address and
/// deregistering it is a no-op. Said at INFO so nobody is misled.
#[no_mangle]
pub extern "C" fn ncclCommRegister(
    comm: ncclComm_t,
    buff: *mut c_void,
    size: usize,
    handle_out: *mut *mut c_void,
) -> ncclResult_t {
    entry("ncclCommRegister", || {
        handle::get(comm)?;
        if handle_out.is_null() {
            return Err(Error::InvalidArgument("handle is NULL".into()));
        }
        tracing::info!(target: "oxccl::capi", "ncclCommRegister({buff:p}, {size} B): nothing to register (oxccl uses user buffers in place)");
        // SAFETY: non-null; NCCL's contract makes it writable.
        unsafe { handle_out.write(buff) };
        ok()
    })
}

#[no_mangle]
pub extern "C" fn ncclCommDeregister(comm: ncclComm_t, _handle: *mut c_void) -> ncclResult_t {
    entry("ncclCommDeregister", || {
        handle::get(comm)?;
        ok()
    })
}

#[no_mangle]
pub extern "C" fn ncclCommWindowRegister(
    _comm: ncclComm_t,
    _buff: *mut c_void,
    _size: usize,
    _win: *mut ncclWindow_t,
    _winFlags: c_int,
) -> ncclResult_t {
    not_implemented(
        "ncclCommWindowRegister",
        "symmetric memory windows; collectives work on unregistered buffers",
    )
}

#[no_mangle]
pub extern "C" fn ncclCommWindowDeregister(_comm: ncclComm_t, _win: ncclWindow_t) -> ncclResult_t {
    not_implemented("ncclCommWindowDeregister", "symmetric memory windows")
}

/// NCCL's device API (`nccl_device.h`), for kernels that communicate by themselves.
#[no_mangle]
pub extern "C" fn ncclDevCommCreate(
    _comm: ncclComm_t,
    _reqs: *const c_void,
    _outDevComm: *mut c_void,
) -> ncclResult_t {
    not_implemented("ncclDevCommCreate", "NCCL's device-side API")
}

#[no_mangle]
pub extern "C" fn ncclDevCommDestroy(_comm: ncclComm_t, _devComm: *const c_void) -> ncclResult_t {
    not_implemented("ncclDevCommDestroy", "NCCL's device-side API")
}
