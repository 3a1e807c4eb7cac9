//! CUDA IPC: memory of one process mapped into another on the same node.

use std::sync::Arc;

use cudarc::driver::sys;

use super::check::check;
use super::context::Context;
use crate::error::Result;

/// The 64 opaque bytes that name an allocation across processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcMemHandle(pub [u8; 64]);

/// Another process's allocation mapped into this one; unmapped on drop.
#[derive(Debug)]
pub struct IpcMapping {
    ctx: Arc<Context>,
    ptr: u64,
}

impl IpcMapping {
    /// Maps the allocation; peer access to its GPU is enabled as needed.
    pub fn open(ctx: &Arc<Context>, handle: &IpcMemHandle) -> Result<IpcMapping> {
        ctx.bind()?;
        let h = sys::CUipcMemHandle {
            reserved: handle.0.map(|b| b as _),
        };
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        check(
            // SAFETY: `ptr` is a valid out-pointer; the handle is passed by value.
            unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, h, flags) },
            "cuIpcOpenMemHandle",
        )?;
        Ok(IpcMapping {
            ctx: ctx.clone(),
            ptr,
        })
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }
}

/// The allocation holding device address `ptr` as a handle another
/// process can open, and `ptr`'s offset in it; `None` when the allocation
/// cannot be shared this way (virtual-memory allocations such as PyTorch's
/// expandable segments, memory of another context).
pub fn export(ctx: &Arc<Context>, ptr: u64) -> Result<Option<(IpcMemHandle, u64)>> {
    ctx.bind()?;
    let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: both out-pointers are valid; the driver only reads `ptr`'s value.
    let r = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) };
    if check(r, "cuMemGetAddressRange").is_err() {
        return Ok(None);
    }
    let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: `h` is a valid out-pointer; `base` starts an allocation.
    let r = unsafe { sys::cuIpcGetMemHandle(&mut h, base) };
    if check(r, "cuIpcGetMemHandle").is_err() {
        return Ok(None);
    }
    Ok(Some((
        IpcMemHandle(h.reserved.map(|b| b as u8)),
        ptr - base,
    )))
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: opened by cuIpcOpenMemHandle in this context, closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}
