//! CUDA for the core: the driver and NVRTC through cudarc, both loaded at
//! run time, so that oxccl builds and runs where no CUDA is installed.
//!
//! This is the one place in the core where cudarc and unsafe code meet;
//! everything above sees safe types and [`Result`](crate::Result)s. A
//! machine without `libcuda`, without `libnvrtc` or without a GPU gets an
//! [`Error`](crate::Error) from the first call that needs them, never a panic.
#![allow(unsafe_code)]

pub mod abi;
mod cache;
mod check;
pub mod context;
pub mod device;
pub mod event;
pub mod ipc;
pub mod kernels;
pub mod memory;
pub mod module;
pub mod nvrtc;
pub mod pinned;
pub mod stream;
pub mod vmm;

pub use context::Context;
pub use context::{bind_runtime_device, current_device, runtime_device, SavedCurrent};
pub use device::{device_count, driver, Device, P2p};
pub use event::Event;
pub use ipc::{IpcMapping, IpcMemHandle};
pub use kernels::{FillPattern, KernelSet};
pub use memory::{
    alloc_raw, buffer_id, export_dma_buf, free_raw, pointer_kind, read_raw, DeviceBuffer, PtrKind,
};
pub use pinned::{HostFlag, HostMapping, PinnedHost, Registered};
pub use stream::{MemOp, RawStream, Stream};
