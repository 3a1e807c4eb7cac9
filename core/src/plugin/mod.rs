//! Plugins loaded from libraries, speaking NCCL's C ABI. Discovery is shared
//! (`oxccl_plugin::loader`, beside the ABI it opens); each interface has an
//! adapter from its C vtables into the one Rust type the core uses, so
//! nothing else in the core sees a C struct.

pub mod env;
mod ffi_log;
pub mod net;
pub mod profiler;
pub mod tuner;
