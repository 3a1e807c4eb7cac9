//! Memory from the CUDA virtual memory API, as NCCL's `ncclMemAlloc` gives
//! it: physical memory created with `cuMemCreate` so that it can be
//! exported as a POSIX file descriptor (and mapped by a peer process that
//! imports it), mapped at an address reserved for it, readable and writable
//! from this GPU and every GPU that can reach it. Sizes are rounded up to
//! the driver's recommended granularity, as NCCL rounds them. Where the
//! GPU has no virtual memory management, the caller falls back to
//! `cuMemAlloc` (NCCL does the same when cuMem is off).

use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::sys;

use super::check::check;
use super::device::{device_count, driver, Device};
use crate::error::{Error, Result};

/// One allocation: what freeing it, or exporting it, needs.
#[derive(Debug, Clone, Copy)]
struct Vmm {
    handle: sys::CUmemGenericAllocationHandle,
    bytes: usize,
    device: usize,
}

fn live() -> &'static Mutex<HashMap<u64, Vmm>> {
    static LIVE: OnceLock<Mutex<HashMap<u64, Vmm>>> = OnceLock::new();
    LIVE.get_or_init(Mutex::default)
}

fn prop(device: usize, rdma: bool) -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct for which all-zero is a valid value (the
    // driver's documented defaults); the fields that matter are set below.
    let mut p: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device as i32;
    p.allocFlags.gpuDirectRDMACapable = u8::from(rdma);
    p
}

/// Whether `dev` supports the virtual memory API (every GPU since Pascal
/// with a recent driver does; some virtualised ones do not).
pub fn vmm_supported(dev: &Device) -> Result<bool> {
    Ok(dev.attribute(
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
    )? != 0)
}

/// The granularity sizes are rounded up to on `dev`: the driver's
/// recommended one, 2 MiB on an H200.
pub fn granularity(dev: &Device) -> Result<usize> {
    let p = prop(dev.ordinal(), false);
    let mut g = 0usize;
    check(
        // SAFETY: `g` and `p` are valid for the call.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &p,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            )
        },
        "cuMemGetAllocationGranularity",
    )?;
    Ok(g.max(1))
}

/// Allocates at least `bytes` on GPU `device` through the virtual memory
/// API; returns the address. Free with [`vmm_free`].
pub fn vmm_alloc(device: usize, bytes: usize) -> Result<u64> {
    driver()?;
    let dev = Device::get(device)?;
    let gran = granularity(&dev)?;
    let size = bytes.max(1).checked_next_multiple_of(gran).ok_or_else(|| {
        Error::InvalidArgument(format!("ncclMemAlloc: {bytes} bytes is too large"))
    })?;
    let rdma = dev
        .attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
        )
        .unwrap_or(0)
        != 0;
    let p = prop(device, rdma);
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    check(
        // SAFETY: `handle` and `p` are valid for the call.
        unsafe { sys::cuMemCreate(&mut handle, size, &p, 0) },
        format!("cuMemCreate({size} bytes on GPU {device})"),
    )?;
    let mut ptr: sys::CUdeviceptr = 0;
    let undo_handle = |e: Error| {
        // SAFETY: `handle` came from cuMemCreate above and is released once.
        unsafe { sys::cuMemRelease(handle) };
        e
    };
    check(
        // SAFETY: `ptr` is a valid out-pointer.
        unsafe { sys::cuMemAddressReserve(&mut ptr, size, gran, 0, 0) },
        format!("cuMemAddressReserve({size} bytes)"),
    )
    .map_err(undo_handle)?;
    let undo = |e: Error| {
        // SAFETY: the range was reserved above (and maybe mapped); it is
        // unmapped, freed and its memory released once, here.
        unsafe {
            sys::cuMemUnmap(ptr, size);
            sys::cuMemAddressFree(ptr, size);
            sys::cuMemRelease(handle);
        }
        e
    };
    check(
        // SAFETY: the range is reserved for `size` bytes; `handle` has `size`.
        unsafe { sys::cuMemMap(ptr, size, 0, handle, 0) },
        "cuMemMap",
    )
    .map_err(undo)?;
    // This GPU, and every GPU that can reach it (NCCL's rule), may access it.
    let mut access = Vec::new();
    for d in 0..device_count()? {
        let other = Device::get(d)?;
        if d == device || other.can_access_peer(&dev).unwrap_or(false) {
            // SAFETY: as in `prop`: all-zero is valid, fields set below.
            let mut a: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
            a.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
            a.location.id = d as i32;
            a.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            access.push(a);
        }
    }
    check(
        // SAFETY: the range is mapped; `access` holds `access.len()` entries.
        unsafe { sys::cuMemSetAccess(ptr, size, access.as_ptr(), access.len()) },
        "cuMemSetAccess",
    )
    .map_err(undo)?;
    live().lock().unwrap_or_else(|p| p.into_inner()).insert(
        ptr,
        Vmm {
            handle,
            bytes: size,
            device,
        },
    );
    Ok(ptr)
}

/// Whether `ptr` is the start of a live [`vmm_alloc`] allocation.
pub fn is_vmm(ptr: u64) -> bool {
    live()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains_key(&ptr)
}

/// The bytes of the live [`vmm_alloc`] allocation at `ptr` (rounded up to
/// the granularity), or `None`.
pub fn vmm_bytes(ptr: u64) -> Option<usize> {
    live()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&ptr)
        .map(|v| v.bytes)
}

/// The live [`vmm_alloc`] allocation that holds `ptr` (anywhere in it):
/// its start and its bytes.
pub fn vmm_containing(ptr: u64) -> Option<(u64, usize)> {
    live()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(&base, v)| base <= ptr && ptr < base + v.bytes as u64)
        .map(|(&base, v)| (base, v.bytes))
}

/// Frees what [`vmm_alloc`] gave. `Ok(false)`: `ptr` is not one of its
/// allocations (the caller frees it otherwise).
///
/// # Safety
/// No work that uses the memory is queued or running.
pub unsafe fn vmm_free(ptr: u64) -> Result<bool> {
    let Some(v) = live()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&ptr)
    else {
        return Ok(false);
    };
    // SAFETY: `ptr..ptr + v.bytes` was reserved and mapped to `v.handle`
    // by vmm_alloc and is released once (the entry is gone).
    unsafe {
        check(sys::cuMemUnmap(ptr, v.bytes), "cuMemUnmap")?;
        check(sys::cuMemAddressFree(ptr, v.bytes), "cuMemAddressFree")?;
        check(sys::cuMemRelease(v.handle), "cuMemRelease")?;
    }
    Ok(true)
}

/// The memory of the [`vmm_alloc`] allocation at `ptr` as a file
/// descriptor another process can import ([`VmmImport::new`]), with its
/// size and GPU.
pub fn vmm_export(ptr: u64) -> Result<(OwnedFd, usize, usize)> {
    let v = live()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&ptr)
        .copied()
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{ptr:#x} is not the start of memory from ncclMemAlloc"
            ))
        })?;
    let mut fd: i32 = -1;
    check(
        // SAFETY: for a POSIX handle the driver writes an int to the pointer.
        unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut i32).cast(),
                v.handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        },
        "cuMemExportToShareableHandle",
    )?;
    // SAFETY: the driver returned a new descriptor that nothing else owns.
    Ok((unsafe { OwnedFd::from_raw_fd(fd) }, v.bytes, v.device))
}

/// Memory exported by [`vmm_export`] (in this process or another), mapped
/// here for GPU `device`; unmapped when dropped.
#[derive(Debug)]
pub struct VmmImport {
    ptr: u64,
    bytes: usize,
    handle: sys::CUmemGenericAllocationHandle,
}

impl VmmImport {
    /// Maps `bytes` (the exporter's rounded size) of the memory behind `fd`.
    pub fn new(fd: &OwnedFd, bytes: usize, device: usize) -> Result<VmmImport> {
        use std::os::fd::AsRawFd;
        driver()?;
        let dev = Device::get(device)?;
        let gran = granularity(&dev)?;
        if bytes == 0 || !bytes.is_multiple_of(gran) {
            return Err(Error::InvalidArgument(format!(
                "imported memory of {bytes} bytes is not a multiple of the granularity {gran}"
            )));
        }
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        check(
            // SAFETY: for a POSIX handle the driver takes the fd by value,
            // passed in the pointer; `handle` is a valid out-pointer.
            unsafe {
                sys::cuMemImportFromShareableHandle(
                    &mut handle,
                    fd.as_raw_fd() as usize as *mut std::ffi::c_void,
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                )
            },
            "cuMemImportFromShareableHandle",
        )?;
        let mut ptr: sys::CUdeviceptr = 0;
        let release = |e: Error| {
            // SAFETY: imported above, released once.
            unsafe { sys::cuMemRelease(handle) };
            e
        };
        check(
            // SAFETY: `ptr` is a valid out-pointer.
            unsafe { sys::cuMemAddressReserve(&mut ptr, bytes, gran, 0, 0) },
            "cuMemAddressReserve",
        )
        .map_err(release)?;
        let me = VmmImport { ptr, bytes, handle };
        check(
            // SAFETY: the range is reserved for `bytes`; the handle has as many.
            unsafe { sys::cuMemMap(ptr, bytes, 0, handle, 0) },
            "cuMemMap (imported)",
        )?;
        // SAFETY: as in `prop`: all-zero is valid, fields set below.
        let mut a: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
        a.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        a.location.id = device as i32;
        a.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        check(
            // SAFETY: the range is mapped; one descriptor.
            unsafe { sys::cuMemSetAccess(ptr, bytes, &a, 1) },
            "cuMemSetAccess (imported)",
        )?;
        Ok(me)
    }

    /// The address the memory is mapped at here.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for VmmImport {
    fn drop(&mut self) {
        // SAFETY: reserved, mapped and imported by `new`; undone once. An
        // unmap of a range that was never mapped (a failed `new`) fails
        // harmlessly.
        unsafe {
            sys::cuMemUnmap(self.ptr, self.bytes);
            sys::cuMemAddressFree(self.ptr, self.bytes);
            sys::cuMemRelease(self.handle);
        }
    }
}
