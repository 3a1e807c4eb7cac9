//! Page-locked host memory mapped into the GPU's address space: the
//! staging area between device buffers and a network that only reaches host
//! memory, and the flag word a stream waits on for the host to finish.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use cudarc::driver::sys;

use super::check::check;
use super::context::Context;
use super::stream::RawStream;
use crate::error::{Error, Result};

/// `cuMemHostAlloc` memory (portable, device-mapped), freed on drop.
#[derive(Debug)]
pub struct PinnedHost {
    ctx: Arc<Context>,
    host: *mut u8,
    device: u64,
    bytes: usize,
}

// SAFETY: the allocation is plain memory owned by this value; who may touch
// which bytes when is the staging protocol's business (stream order and the
// proxy's flag), not the type's.
unsafe impl Send for PinnedHost {}
// SAFETY: as for Send.
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    pub fn alloc(ctx: &Arc<Context>, bytes: usize) -> Result<PinnedHost> {
        ctx.bind()?;
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        check(
            // SAFETY: `host` is a valid out-pointer; the context is current.
            unsafe { sys::cuMemHostAlloc(&mut host, bytes.max(8), flags) },
            format!("cuMemHostAlloc({bytes} bytes of pinned host memory)"),
        )?;
        let mut device: sys::CUdeviceptr = 0;
        let r = check(
            // SAFETY: `host` was just allocated with DEVICEMAP in this context.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) },
            "cuMemHostGetDevicePointer",
        );
        let buf = PinnedHost {
            ctx: ctx.clone(),
            host: host.cast(),
            device,
            bytes,
        };
        r.map(|_| buf)
    }

    /// The host address (what the network reads and writes).
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    /// The same memory as the GPU addresses it.
    pub fn device_ptr(&self) -> u64 {
        self.device
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Reads the `i`th 64-bit word as the GPU last wrote it.
    ///
    /// # Panics
    /// If the word is outside the allocation (a bug of the caller's layout).
    pub fn load_u64(&self, i: usize) -> u64 {
        assert!(
            (i + 1) * 8 <= self.bytes.max(8),
            "word {i} outside {} bytes",
            self.bytes
        );
        // SAFETY: inside this live allocation (asserted), 8-aligned (the
        // allocation is page-aligned); volatile, since the GPU writes it.
        unsafe { std::ptr::read_volatile(self.host.cast::<u64>().add(i)) }
    }

    /// Writes the `i`th 64-bit word; what this thread wrote before is
    /// visible to a GPU that sees it (fences on both sides, for DMA readers
    /// that poll).
    ///
    /// # Panics
    /// If the word is outside the allocation.
    pub fn store_u64(&self, i: usize, v: u64) {
        assert!(
            (i + 1) * 8 <= self.bytes.max(8),
            "word {i} outside {} bytes",
            self.bytes
        );
        fence(Ordering::SeqCst);
        // SAFETY: as in `load_u64`.
        unsafe { std::ptr::write_volatile(self.host.cast::<u64>().add(i), v) };
        fence(Ordering::SeqCst);
    }

    /// Zeroes 64-bit words `words`, then fences once (visible to the GPU
    /// before anything this thread writes next).
    ///
    /// # Panics
    /// If the words are outside the allocation.
    pub fn zero_u64(&self, words: std::ops::Range<usize>) {
        assert!(
            words.end * 8 <= self.bytes.max(8),
            "words {words:?} outside {} bytes",
            self.bytes
        );
        for i in words {
            // SAFETY: as in `load_u64`.
            unsafe { std::ptr::write_volatile(self.host.cast::<u64>().add(i), 0) };
        }
        fence(Ordering::SeqCst);
    }

    fn range(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(Error::Internal(format!(
                "bytes {offset}..{} are outside a {}-byte staging buffer",
                offset.saturating_add(len),
                self.bytes
            )));
        }
        Ok(())
    }

    /// Checks a copy's range and binds the context; `false`: nothing to copy.
    fn ready(&self, offset: usize, len: usize) -> Result<bool> {
        self.range(offset, len)?;
        if len == 0 {
            return Ok(false);
        }
        self.ctx.bind()?;
        Ok(true)
    }

    /// Enqueues a copy of `len` bytes from device address `src` to `offset`.
    pub fn copy_from_device(
        &self,
        offset: usize,
        src: u64,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        if !self.ready(offset, len)? {
            return Ok(());
        }
        check(
            // SAFETY: the destination range is inside this allocation
            // (checked); the source is the caller's device buffer, valid by
            // the operation's contract.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(self.host.add(offset).cast(), src, len, stream.sys())
            },
            "cuMemcpyDtoHAsync (staging a device buffer)",
        )
    }

    /// Enqueues a copy of `len` bytes at `offset` to device address `dst`.
    pub fn copy_to_device(
        &self,
        dst: u64,
        offset: usize,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        if !self.ready(offset, len)? {
            return Ok(());
        }
        check(
            // SAFETY: the source range is inside this allocation (checked);
            // the destination is the caller's device buffer.
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(dst, self.host.add(offset).cast(), len, stream.sys())
            },
            "cuMemcpyHtoDAsync (unstaging into a device buffer)",
        )
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc and freed once, here.
            let _ = unsafe { sys::cuMemFreeHost(self.host.cast()) };
        }
    }
}

/// A 64-bit counter in pinned memory: the host raises it, streams wait for
/// it to reach a value, so a stream can depend on host work without the
/// enqueuing thread waiting.
#[derive(Debug)]
pub struct HostFlag {
    mem: PinnedHost,
}

impl HostFlag {
    pub fn new(ctx: &Arc<Context>) -> Result<HostFlag> {
        let mem = PinnedHost::alloc(ctx, 8)?;
        let flag = HostFlag { mem };
        flag.store(0);
        Ok(flag)
    }

    /// Publishes `v`; everything this thread wrote before is visible to a
    /// GPU that sees `v` (x86 and Arm both need the fence before the store
    /// for DMA readers that poll).
    pub fn store(&self, v: u64) {
        self.mem.store_u64(0, v)
    }

    pub fn load(&self) -> u64 {
        self.mem.load_u64(0)
    }

    /// The flag as the GPU addresses it (kernels poll it).
    pub fn device_ptr(&self) -> u64 {
        self.mem.device
    }

    /// Makes later work on `stream` wait (on the GPU) until the flag is at
    /// least `v`.
    pub fn wait_on(&self, stream: RawStream, v: u64) -> Result<()> {
        self.mem.ctx.bind()?;
        check(
            // SAFETY: the address is this live allocation as the GPU maps it;
            // the stream is valid by the operation's contract.
            unsafe {
                sys::cuStreamWaitValue64_v2(
                    stream.sys(),
                    self.mem.device,
                    v,
                    sys::CUstreamWaitValue_flags_enum::CU_STREAM_WAIT_VALUE_GEQ as u32,
                )
            },
            "cuStreamWaitValue64 (stream waits for the staging proxy)",
        )
    }
}

/// Host memory that some other owner mapped (a shared-memory segment, a
/// private mapping), to be made visible to the GPU.
///
/// # Safety
/// `host_range` names memory that stays mapped, readable and writable for
/// as long as the implementing value lives.
pub unsafe trait HostMapping: Send + Sync {
    fn host_range(&self) -> (*mut u8, usize);
}

/// A [`HostMapping`] registered with CUDA (page-locked, mapped into the
/// GPU's address space): kernels store into it and load from it, the CPU
/// (a peer process, the proxy) reads and writes it directly. Owns the
/// mapping, so the memory outlives the registration.
pub struct Registered<M: HostMapping> {
    ctx: Arc<Context>,
    mem: M,
    device: u64,
}

impl<M: HostMapping> std::fmt::Debug for Registered<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Registered({:#x}, {} bytes)",
            self.device,
            self.mem.host_range().1
        )
    }
}

impl<M: HostMapping> Registered<M> {
    pub fn new(ctx: &Arc<Context>, mem: M) -> Result<Registered<M>> {
        ctx.bind()?;
        let (host, bytes) = mem.host_range();
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        check(
            // SAFETY: the range is mapped for as long as `mem` lives (the
            // trait's contract), and `mem` is dropped after the unregister.
            unsafe { sys::cuMemHostRegister_v2(host.cast(), bytes, flags) },
            format!("cuMemHostRegister({bytes} bytes of host memory for the GPU)"),
        )?;
        let mut device: sys::CUdeviceptr = 0;
        let r = check(
            // SAFETY: `host` was just registered with DEVICEMAP in this context.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) },
            "cuMemHostGetDevicePointer",
        );
        let reg = Registered {
            ctx: ctx.clone(),
            mem,
            device,
        };
        r.map(|_| reg)
    }

    /// The memory as the GPU addresses it.
    pub fn device_ptr(&self) -> u64 {
        self.device
    }

    pub fn mem(&self) -> &M {
        &self.mem
    }
}

impl<M: HostMapping> Drop for Registered<M> {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: registered in `new`, unregistered once, here, before
            // the mapping (`mem`) goes.
            let _ = unsafe { sys::cuMemHostUnregister(self.mem.host_range().0.cast()) };
        }
    }
}
