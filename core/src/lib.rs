//! oxccl: collective communication (NCCL's role) with NCCL-ABI plugins.
#![deny(unsafe_code)]

pub mod bootstrap;
pub mod config;
pub mod error;

pub use error::{Error, Result};
