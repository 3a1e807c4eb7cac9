//! The `oxccl` command's library: the benchmark, the checker, and the local
//! launcher, shared with the integration tests.

mod bench;
pub mod check;
mod hostmem;
pub mod info;
pub mod launch;
pub mod perf;
mod perf_device;
pub mod ras;
pub use perf_device::check_once_on_device;
pub mod recover;
pub mod tune;
