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

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: opened by cuIpcOpenMemHandle in this context, closed once.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}
