//! Plugins loaded from libraries, speaking NCCL's C ABI. Each interface
//! version has its own adapter (`ffi_vN`) into the one Rust trait the core
//! uses, so nothing else in the core sees a C struct.

pub mod net;
