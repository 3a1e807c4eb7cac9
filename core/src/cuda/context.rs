//! Primary contexts: the one context per GPU that the CUDA runtime (and so
//! PyTorch, and NCCL) uses too, so that pointers and streams the caller
//! hands over belong to it.

use std::sync::Arc;

use cudarc::driver::sys;

use super::check::check;
use super::device::Device;
use crate::error::Result;

/// A retained primary context; released when the last handle goes.
#[derive(Debug)]
pub struct Context {
    device: Device,
    raw: sys::CUcontext,
}

// SAFETY: a CUDA context may be made current and used from any thread; the
// handle is an opaque pointer the driver owns.
unsafe impl Send for Context {}
// SAFETY: as for Send: the driver serialises what needs serialising.
unsafe impl Sync for Context {}

impl Context {
    pub fn primary(device: Device) -> Result<Arc<Context>> {
        let mut raw: sys::CUcontext = std::ptr::null_mut();
        check(
            // SAFETY: `raw` is a valid out-pointer; the device is valid.
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut raw, device.raw()) },
            format!("cuDevicePrimaryCtxRetain(device {})", device.ordinal()),
        )?;
        let ctx = Arc::new(Context { device, raw });
        ctx.bind()?;
        Ok(ctx)
    }

    /// Makes this context current on the calling thread: every driver call
    /// that follows acts on this GPU. Cheap; done at each entry point.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for as long as `self` lives.
        check(unsafe { sys::cuCtxSetCurrent(self.raw) }, "cuCtxSetCurrent")
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// Waits for all work on this GPU (all streams).
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: no arguments; the context is current.
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
    }

    /// Lets kernels of this context address memory of `peer`'s context.
    /// Enabling twice is fine.
    pub fn enable_peer_access(&self, peer: &Context) -> Result<()> {
        if peer.device == self.device {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both contexts are retained; flags must be 0.
        let r = unsafe { sys::cuCtxEnablePeerAccess(peer.raw, 0) };
        if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check(
            r,
            format!(
                "cuCtxEnablePeerAccess(device {} -> device {})",
                self.device.ordinal(),
                peer.device.ordinal()
            ),
        )
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `primary`.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device.raw()) };
    }
}

/// The GPU of the context current on the calling thread, if any: the
/// device a CUDA runtime caller selected with `cudaSetDevice` (NCCL binds
/// a communicator to it). `None` where no driver, no GPU or no context.
pub fn current_device() -> Option<usize> {
    super::device::driver().ok()?;
    let mut raw: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `raw` is a valid out-pointer.
    check(unsafe { sys::cuCtxGetCurrent(&mut raw) }, "cuCtxGetCurrent").ok()?;
    if raw.is_null() {
        return None;
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: a context is current; `dev` is a valid out-pointer.
    check(unsafe { sys::cuCtxGetDevice(&mut dev) }, "cuCtxGetDevice").ok()?;
    usize::try_from(dev).ok()
}

/// Puts back, when dropped, the context that was current when it was made:
/// entry points that switch GPUs (one thread driving several) leave the
/// caller's CUDA runtime state as they found it, as NCCL does.
pub struct SavedCurrent(sys::CUcontext);

impl SavedCurrent {
    pub fn save() -> Result<SavedCurrent> {
        // The first CUDA call of a process may be this one (a communicator
        // created on a GPU before anything else touched CUDA).
        super::device::driver()?;
        let mut raw: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check(unsafe { sys::cuCtxGetCurrent(&mut raw) }, "cuCtxGetCurrent")?;
        Ok(SavedCurrent(raw))
    }
}

impl Drop for SavedCurrent {
    fn drop(&mut self) {
        // SAFETY: the handle was current on this thread, so it is a live
        // context or null (which unbinds); the caller keeps it alive.
        let _ = unsafe { sys::cuCtxSetCurrent(self.0) };
    }
}
