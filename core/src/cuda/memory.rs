//! Device memory owned by oxccl, with synchronous copies from and to the
//! host (setup and tests; the data path never copies through the host).

use std::sync::Arc;

use cudarc::driver::sys;

use super::check::check;
use super::context::Context;
use super::ipc::IpcMemHandle;
use crate::error::{Error, Result};

/// `cuMemAlloc` memory, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    ctx: Arc<Context>,
    ptr: u64,
    bytes: usize,
}

impl DeviceBuffer {
    /// At least one byte is allocated, so that every buffer has an address.
    pub fn alloc(ctx: &Arc<Context>, bytes: usize) -> Result<DeviceBuffer> {
        ctx.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        check(
            // SAFETY: `ptr` is a valid out-pointer; the context is current.
            unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(1)) },
            format!(
                "cuMemAlloc({bytes} bytes on device {})",
                ctx.device().ordinal()
            ),
        )?;
        Ok(DeviceBuffer {
            ctx: ctx.clone(),
            ptr,
            bytes,
        })
    }

    /// The device address (valid in every context with peer access to this one).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    fn range(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(Error::InvalidArgument(format!(
                "bytes {offset}..{} are outside a {}-byte device buffer",
                offset.saturating_add(len),
                self.bytes
            )));
        }
        Ok(())
    }

    /// Sets every byte to `value`; done when this returns.
    pub fn fill_bytes(&self, value: u8) -> Result<()> {
        self.ctx.bind()?;
        check(
            // SAFETY: the range is this allocation.
            unsafe { sys::cuMemsetD8_v2(self.ptr, value, self.bytes) },
            "cuMemsetD8",
        )?;
        legacy_stream_done()
    }

    /// Copies `data` to `offset`; done when this returns.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.range(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        check(
            // SAFETY: the destination range is inside the allocation (checked),
            // the source is a live slice of that length.
            unsafe {
                sys::cuMemcpyHtoD_v2(self.ptr + offset as u64, data.as_ptr().cast(), data.len())
            },
            "cuMemcpyHtoD",
        )?;
        legacy_stream_done()
    }

    /// Copies from `offset` into `out`, synchronously.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.range(offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        self.ctx.bind()?;
        check(
            // SAFETY: the source range is inside the allocation (checked), the
            // destination is a live mutable slice of that length.
            unsafe {
                sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr + offset as u64, out.len())
            },
            "cuMemcpyDtoH",
        )
    }

    /// A handle another process can open to map this memory.
    pub fn ipc_handle(&self) -> Result<IpcMemHandle> {
        self.ctx.bind()?;
        let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
        check(
            // SAFETY: `h` is a valid out-pointer; the pointer is this allocation.
            unsafe { sys::cuIpcGetMemHandle(&mut h, self.ptr) },
            "cuIpcGetMemHandle",
        )?;
        Ok(IpcMemHandle(h.reserved.map(|b| b as u8)))
    }
}

/// The plain memset and copy-from-host calls run on the legacy default
/// stream and may return before the device has finished them (a copy from
/// pageable memory returns once the data is staged); streams created
/// non-blocking, as the caller's usually are, do not wait for that stream.
/// Waiting here makes "done when this returns" true.
fn legacy_stream_done() -> Result<()> {
    check(
        // SAFETY: the null handle names the legacy default stream of the
        // current context, which the callers bound.
        unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) },
        "cuStreamSynchronize(default stream)",
    )
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: allocated by cuMemAlloc in this context, freed once.
            let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

/// Where an address points, as the driver knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PtrKind {
    /// Device memory of some GPU: the CPU must not touch it.
    Device,
    /// Managed (unified) memory: both the CPU and the GPUs may touch it.
    Managed,
    /// Host memory registered with or allocated by CUDA (device-accessible).
    PinnedHost,
    /// Memory CUDA does not know: ordinary pageable host memory.
    Unknown,
}

/// Asks the driver what `ptr` is (NCCL's check that user buffers are
/// device-accessible). Never fails: an address the driver does not know is
/// [`PtrKind::Unknown`].
pub fn pointer_kind(ptr: u64) -> PtrKind {
    if super::device::driver().is_err() || ptr == 0 {
        return PtrKind::Unknown;
    }
    let mut ty: u32 = 0;
    // SAFETY: `ty` is a valid out-pointer of the attribute's size (an
    // unsigned int); the driver only reads its tables for `ptr`.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ty as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return PtrKind::Unknown;
    }
    match ty {
        t if t == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32 => PtrKind::PinnedHost,
        0 => PtrKind::Unknown,
        _ if is_managed(ptr) => PtrKind::Managed,
        _ => PtrKind::Device,
    }
}

/// The start and size of the CUDA allocation holding `ptr` (as
/// `cuMemGetAddressRange` gives them, through the pointer's attributes,
/// which need no current context), or None where CUDA knows no allocation
/// there (or there is no driver).
pub fn address_range(ptr: u64) -> Option<(u64, u64)> {
    if super::device::driver().is_err() || ptr == 0 {
        return None;
    }
    let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    let mut attrs = [
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    ];
    let mut data: [*mut std::ffi::c_void; 2] = [
        (&mut base as *mut sys::CUdeviceptr).cast(),
        (&mut size as *mut usize).cast(),
    ];
    // SAFETY: two attributes, each written to the out-pointer beside it (a
    // device address and a size_t); the driver only reads `ptr`'s value
    // and answers zeros for an address that is not CUDA's.
    let r = unsafe { sys::cuPointerGetAttributes(2, attrs.as_mut_ptr(), data.as_mut_ptr(), ptr) };
    (r == sys::CUresult::CUDA_SUCCESS && base != 0 && size != 0).then_some((base, size as u64))
}

/// The driver's id of the allocation holding `ptr`
/// (CU_POINTER_ATTRIBUTE_BUFFER_ID: never reused in a process, so a freed
/// allocation's successor at the same address has another), or None where
/// CUDA knows no allocation there.
pub fn buffer_id(ptr: u64) -> Option<u64> {
    if super::device::driver().is_err() || ptr == 0 {
        return None;
    }
    let mut id: u64 = 0;
    // SAFETY: `id` is a valid out-pointer of the attribute's size (an
    // unsigned long long); the driver only reads its tables for `ptr`.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut id as *mut u64).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
            ptr,
        )
    };
    (r == sys::CUresult::CUDA_SUCCESS && id != 0).then_some(id)
}

/// The GPU (CUDA's ordinal) whose memory `ptr` is, or None where CUDA
/// knows no allocation there.
pub fn device_of(ptr: u64) -> Option<usize> {
    if super::device::driver().is_err() || ptr == 0 {
        return None;
    }
    let mut ordinal: i32 = -1;
    // SAFETY: `ordinal` is a valid out-pointer of the attribute's size (an
    // int); the driver only reads its tables for `ptr`.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    (r == sys::CUresult::CUDA_SUCCESS && ordinal >= 0).then_some(ordinal as usize)
}

fn is_managed(ptr: u64) -> bool {
    let mut managed: u32 = 0;
    // SAFETY: `managed` is a valid out-pointer of the attribute's size (a
    // bool stored as an unsigned int); the driver only reads its tables.
    let r = unsafe {
        sys::cuPointerGetAttribute(
            (&mut managed as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
            ptr,
        )
    };
    r == sys::CUresult::CUDA_SUCCESS && managed != 0
}

/// Allocates `bytes` of device memory in the calling thread's current
/// context (NCCL's `ncclMemAlloc`); free with [`free_raw`].
pub fn alloc_raw(bytes: usize) -> Result<u64> {
    super::device::driver()?;
    let mut p: sys::CUdeviceptr = 0;
    check(
        // SAFETY: `p` is a valid out-pointer; the driver checks the context.
        unsafe { sys::cuMemAlloc_v2(&mut p, bytes.max(1)) },
        format!("cuMemAlloc({bytes} bytes)"),
    )?;
    Ok(p)
}

/// Frees memory from [`alloc_raw`].
///
/// # Safety
/// `ptr` came from [`alloc_raw`] and is not used afterwards.
pub unsafe fn free_raw(ptr: u64) -> Result<()> {
    super::device::driver()?;
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuMemFree_v2(ptr) }, "cuMemFree")
}

/// Copies `out.len()` bytes from device address `ptr` to the host; done
/// when this returns (a scalar NCCL lets callers keep in device memory).
///
/// # Safety
/// `ptr..ptr + out.len()` is device memory of the current context.
pub unsafe fn read_raw(ptr: u64, out: &mut [u8]) -> Result<()> {
    super::device::driver()?;
    check(
        // SAFETY: the caller's contract; `out` is a live slice of that length.
        unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), ptr, out.len()) },
        "cuMemcpyDtoH",
    )
}

/// `bytes` of device memory from `ptr` (page-aligned, inside one
/// allocation) exported as a dma-buf file descriptor, for a network's
/// `regMrDmaBuf`; the length is rounded up to whole pages as NCCL does.
/// Only after [`super::Device::dma_buf_supported`] said yes.
pub fn export_dma_buf(ptr: u64, bytes: usize) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // The host's page (64 KiB on some Arm hosts), as NCCL rounds to it.
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p.max(1) as u64);
    if !ptr.is_multiple_of(page) {
        return Err(Error::InvalidArgument(format!(
            "device memory at {ptr:#x} is not page-aligned: a dma-buf cannot start there"
        )));
    }
    let len = (bytes as u64).next_multiple_of(page) as usize;
    let mut fd: std::ffi::c_int = -1;
    check(
        // SAFETY: `fd` is a valid out-pointer for the descriptor; the range
        // is the caller's device memory.
        unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut std::ffi::c_int).cast(),
                ptr,
                len,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        },
        "cuMemGetHandleForAddressRange",
    )?;
    if fd < 0 {
        return Err(Error::System(
            "cuMemGetHandleForAddressRange gave no file descriptor".into(),
        ));
    }
    // SAFETY: the driver just opened `fd` for us; nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}
