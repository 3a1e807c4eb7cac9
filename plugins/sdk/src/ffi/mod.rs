//! NCCL's plugin C ABI: one frozen file per interface version (as NCCL
//! keeps `net_v8.h` …; `net/`, `tuner/`, `profiler/`, `env`), the scalars they
//! share (`types`), and the glue that exports a Rust [`crate::Net`] through
//! it (`export`), so the same plugin loads into NCCL and oxccl.

pub mod env;
pub mod export;
pub mod export_env;
pub mod export_profiler;
pub mod export_tuner;
pub mod net;
pub mod profiler;
pub mod tuner;
pub mod types;

pub use types::*;
