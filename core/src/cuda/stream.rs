//! Streams: the caller's (by raw handle) and our own.

use std::sync::Arc;

use cudarc::driver::sys;

use super::check::check;
use super::context::Context;
use crate::error::Result;

/// A `CUstream` (`cudaStream_t`) handle the caller owns. Operations are
/// enqueued on it and never wait for it on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawStream(u64);

impl RawStream {
    /// The legacy default stream (handle 0), always valid.
    pub const DEFAULT: RawStream = RawStream(0);

    /// Wraps a handle from the CUDA runtime or driver (e.g. PyTorch's
    /// current stream).
    ///
    /// # Safety
    /// `handle` must be a live stream of the context the operations using
    /// it run in, or 0; the driver dereferences it.
    pub unsafe fn from_raw(handle: u64) -> RawStream {
        RawStream(handle)
    }

    pub fn raw(self) -> u64 {
        self.0
    }

    pub(crate) fn sys(self) -> sys::CUstream {
        self.0 as usize as sys::CUstream
    }

    /// Whether work enqueued now is recorded into a CUDA graph (which may
    /// run it many times, or never) rather than run.
    pub fn is_capturing(self) -> Result<bool> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        check(
            // SAFETY: the handle is valid by the contract of `from_raw`;
            // `status` is a valid out-pointer.
            unsafe { sys::cuStreamIsCapturing(self.sys(), &mut status) },
            "cuStreamIsCapturing",
        )?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// The id of the capture the stream is recording into, `None` when it
    /// runs work as it comes.
    pub fn capture_id(self) -> Result<Option<u64>> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut id: sys::cuuint64_t = 0;
        check(
            // SAFETY: the handle is valid by the contract of `from_raw`;
            // status and id are valid out-pointers, the rest may be NULL.
            unsafe {
                sys::cuStreamGetCaptureInfo_v3(
                    self.sys(),
                    &mut status,
                    &mut id,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            },
            "cuStreamGetCaptureInfo",
        )?;
        Ok((status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE).then_some(id))
    }

    /// Enqueues: store `value` at device address `addr` once the work
    /// before it is done (a stream memory operation: no kernel, so another
    /// process's stream waiting for it never waits for this one's turn on
    /// the GPU's SMs).
    ///
    /// # Safety
    /// `addr` is 4-byte aligned device memory mapped in this context, alive
    /// until the stream has run the store.
    pub unsafe fn write_u32(self, addr: u64, value: u32) -> Result<()> {
        check(
            // SAFETY: the caller's contract; flags 0: the store waits for
            // the stream's earlier work.
            unsafe { sys::cuStreamWriteValue32_v2(self.sys(), addr, value, 0) },
            "cuStreamWriteValue32",
        )
    }

    /// Enqueues: the stream's later work waits until the 32-bit word at
    /// `addr` is at least `value` (wrapping comparison).
    ///
    /// # Safety
    /// As [`RawStream::write_u32`].
    pub unsafe fn wait_u32(self, addr: u64, value: u32) -> Result<()> {
        let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        check(
            // SAFETY: the caller's contract.
            unsafe { sys::cuStreamWaitValue32_v2(self.sys(), addr, value, geq) },
            "cuStreamWaitValue32",
        )
    }

    /// Enqueues `ops` in order as one driver call (`cuStreamBatchMemOp`):
    /// where several ranks' words are stored or waited for at once, one
    /// call instead of one each keeps the enqueue of a small collective
    /// short on the host.
    ///
    /// # Safety
    /// Every op's address as for [`RawStream::write_u32`].
    pub unsafe fn mem_ops(self, ops: &[MemOp]) -> Result<()> {
        // The driver takes at most 256 operations per call.
        for chunk in ops.chunks(256) {
            let mut params: Vec<sys::CUstreamBatchMemOpParams> = chunk
                .iter()
                .map(|op| {
                    // SAFETY: the union is plain data; all zeros is a valid
                    // value of each of its members.
                    let mut p: sys::CUstreamBatchMemOpParams = unsafe { std::mem::zeroed() };
                    match *op {
                        MemOp::Write { addr, value } => {
                            p.writeValue.operation =
                                sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_32;
                            p.writeValue.address = addr;
                            p.writeValue.__bindgen_anon_1.value = value;
                        }
                        MemOp::Wait { addr, value } => {
                            p.waitValue.operation =
                                sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WAIT_VALUE_32;
                            p.waitValue.address = addr;
                            p.waitValue.__bindgen_anon_1.value = value;
                            p.waitValue.flags =
                                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
                        }
                    }
                    p
                })
                .collect();
            check(
                // SAFETY: the caller's contract for the addresses; `params`
                // holds `chunk.len()` filled entries and outlives the call
                // (the driver copies them).
                unsafe {
                    sys::cuStreamBatchMemOp_v2(
                        self.sys(),
                        params.len() as u32,
                        params.as_mut_ptr(),
                        0,
                    )
                },
                "cuStreamBatchMemOp",
            )?;
        }
        Ok(())
    }

    /// Enqueues a copy of `bytes` from `src` to `dst` (device addresses of
    /// the stream's context) on the copy engine, which takes no SM: what
    /// NCCL does for a communicator of one rank.
    ///
    /// # Safety
    /// Both ranges are device memory valid until the stream has run the
    /// copy, and they do not overlap.
    pub unsafe fn copy_device(self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        check(
            // SAFETY: the caller's contract; the handle is valid by the
            // contract of `from_raw`.
            unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.sys()) },
            "cuMemcpyDtoDAsync",
        )
    }

    /// Whether everything enqueued on the stream is done, without waiting
    /// (a caller that must also watch for a peer's failure polls this, as
    /// nccl-tests polls `cudaStreamQuery`).
    pub fn query(self, ctx: &Context) -> Result<bool> {
        ctx.bind()?;
        // SAFETY: the handle is valid by the contract of `from_raw`.
        let r = unsafe { sys::cuStreamQuery(self.sys()) };
        if r == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check(r, "cuStreamQuery").map(|()| true)
    }

    /// Enqueues, as one batch, a wait until each word at `addrs` is at
    /// least `value`.
    ///
    /// # Safety
    /// As [`RawStream::mem_ops`].
    pub unsafe fn wait_all(self, addrs: impl Iterator<Item = u64>, value: u32) -> Result<()> {
        let ops: Vec<MemOp> = addrs.map(|addr| MemOp::Wait { addr, value }).collect();
        // SAFETY: the caller's contract.
        unsafe { self.mem_ops(&ops) }
    }

    /// Enqueues, as one batch, a store of `value` at each of `addrs`.
    ///
    /// # Safety
    /// As [`RawStream::mem_ops`].
    pub unsafe fn write_all(self, addrs: impl Iterator<Item = u64>, value: u32) -> Result<()> {
        let ops: Vec<MemOp> = addrs.map(|addr| MemOp::Write { addr, value }).collect();
        // SAFETY: the caller's contract.
        unsafe { self.mem_ops(&ops) }
    }

    /// Waits on the host until everything enqueued on the stream is done.
    pub fn synchronize(self, ctx: &Context) -> Result<()> {
        ctx.bind()?;
        check(
            // SAFETY: the handle is valid by the contract of `from_raw`.
            unsafe { sys::cuStreamSynchronize(self.sys()) },
            "cuStreamSynchronize",
        )
    }
}

/// One stream memory operation of [`RawStream::mem_ops`], on a 32-bit
/// word: store `value`, or wait until the word is at least `value`
/// (wrapping comparison), as [`RawStream::write_u32`] and
/// [`RawStream::wait_u32`] do one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemOp {
    Write { addr: u64, value: u32 },
    Wait { addr: u64, value: u32 },
}

/// A stream oxccl created; destroyed on drop.
#[derive(Debug)]
pub struct Stream {
    ctx: Arc<Context>,
    raw: RawStream,
}

// SAFETY: a stream handle may be used from any thread with its context current.
unsafe impl Send for Stream {}
// SAFETY: as for Send.
unsafe impl Sync for Stream {}

impl Stream {
    /// A non-blocking stream: it does not wait for the legacy default stream.
    pub fn new(ctx: &Arc<Context>) -> Result<Stream> {
        ctx.bind()?;
        let mut s: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        check(
            // SAFETY: `s` is a valid out-pointer; the context is current.
            unsafe { sys::cuStreamCreate(&mut s, flags) },
            "cuStreamCreate",
        )?;
        Ok(Stream {
            ctx: ctx.clone(),
            raw: RawStream(s as usize as u64),
        })
    }

    pub fn handle(&self) -> RawStream {
        self.raw
    }

    pub fn synchronize(&self) -> Result<()> {
        self.raw.synchronize(&self.ctx)
    }

    pub fn query(&self) -> Result<bool> {
        self.raw.query(&self.ctx)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: created by cuStreamCreate, destroyed once.
            let _ = unsafe { sys::cuStreamDestroy_v2(self.raw.sys()) };
        }
    }
}
