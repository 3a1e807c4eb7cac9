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

    /// Whether both are the same driver context (every retain of a
    /// device's primary context is).
    pub fn same(&self, other: &Context) -> bool {
        self.raw == other.raw
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

    /// Free and total memory of this GPU, in bytes (`cuMemGetInfo`): every
    /// process's allocations count.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        check(
            // SAFETY: both are valid out-pointers; the context is current.
            unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
            "cuMemGetInfo",
        )?;
        Ok((free, total))
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

/// The GPU a CUDA runtime caller on this thread would run on, as NCCL
/// binds a communicator: `cudaGetDevice`, which is the current context's
/// device, else the device the thread selected with `cudaSetDevice`, else
/// device 0. The runtime is asked only if the process already loaded it
/// (a program that never touched the runtime has selected nothing, so 0 is
/// its answer too). `None` only where there is no driver or no GPU.
pub fn runtime_device() -> Option<usize> {
    if super::device::device_count().ok()? == 0 {
        return None;
    }
    if let Some(d) = current_device() {
        return Some(d);
    }
    Some(loaded_runtime_device().unwrap_or(0))
}

/// Makes the primary context of [`runtime_device`] current on this thread
/// when none is, as the CUDA runtime does on a thread's first call (NCCL's
/// `ncclMemAlloc` allocates there). The context is kept retained for the
/// process's life, as the runtime keeps it: releasing it would free what
/// was allocated in it.
pub fn bind_runtime_device() -> Result<()> {
    use std::sync::{Mutex, OnceLock};
    static KEPT: OnceLock<Mutex<Vec<Arc<Context>>>> = OnceLock::new();
    if current_device().is_some() {
        return Ok(());
    }
    let Some(dev) = runtime_device() else {
        return Err(crate::Error::InvalidUsage(
            "no GPU: the CUDA driver finds no device to allocate on".into(),
        ));
    };
    let kept = KEPT.get_or_init(Mutex::default);
    let mut kept = kept.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = kept.iter().find(|c| c.device().ordinal() == dev) {
        return c.bind();
    }
    let ctx = Context::primary(Device::get(dev)?)?;
    kept.push(ctx);
    Ok(())
}

/// `cudaGetDevice` of a CUDA runtime this process has loaded, without
/// loading one: a runtime PyTorch loaded privately (RTLD_LOCAL) is still
/// found by its SONAME.
fn loaded_runtime_device() -> Option<usize> {
    use libloading::os::unix::{Library, RTLD_LAZY};
    const SONAMES: &[&str] = &[
        "libcudart.so.13",
        "libcudart.so.12",
        "libcudart.so.11.0",
        "libcudart.so",
    ];
    type GetDevice = unsafe extern "C" fn(*mut std::os::raw::c_int) -> std::os::raw::c_int;
    for name in SONAMES {
        // SAFETY: RTLD_NOLOAD only returns a library that is already loaded
        // (and initialised), so no initialiser runs here.
        let Ok(lib) = (unsafe { Library::open(Some(*name), RTLD_LAZY | libc::RTLD_NOLOAD) }) else {
            continue;
        };
        // SAFETY: `cudaGetDevice` has had this signature in every CUDA
        // runtime: int cudaGetDevice(int *device).
        let Ok(get) = (unsafe { lib.get::<GetDevice>(b"cudaGetDevice\0") }) else {
            continue;
        };
        let mut dev: std::os::raw::c_int = -1;
        // SAFETY: `dev` is a valid out-pointer; cudaGetDevice creates no
        // context, it reads the thread's selection.
        if unsafe { get(&mut dev) } == 0 {
            return usize::try_from(dev).ok();
        }
    }
    None
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
