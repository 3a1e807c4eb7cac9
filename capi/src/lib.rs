//! NCCL's C API over oxccl: `libnccl.so.2`, so that nccl-tests, PyTorch and
//! any program built against NCCL (up to 2.31) run on oxccl by finding this library
//! first on the library path.
//!
//! Every entry point goes through [`guard::entry`]: no panic crosses the
//! boundary, errors come back as NCCL's codes with their message kept for
//! `ncclGetLastError`. A communicator is created on the GPU current on the
//! calling thread (as NCCL does) and then takes device memory and streams;
//! where no CUDA context is current it runs on host memory, which is how
//! the C tests run on machines without a GPU. Functions of NCCL's API that
//! oxccl does not implement return `ncclInvalidUsage` and say so.
#![allow(non_snake_case, non_upper_case_globals)]
// NCCL's names
// Entry points take C pointers whose contract is NCCL's documentation; C
// callers cannot see a Rust `unsafe`, so the functions are not marked so,
// and each dereference states what it relies on in its SAFETY comment.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

mod coll;
mod collconfig;
mod comm;
mod device;
mod group;
mod guard;
mod handle;
mod mem;
mod param;
mod profiling;
pub mod types;

pub use coll::*;
pub use comm::*;
pub use device::*;
pub use group::*;
pub use mem::*;
pub use param::*;
