//! The error a tuner or profiler plugin returns; the export glue turns it
//! into an `ncclResult_t` and a WARN line through NCCL's logger.

use crate::ffi::types::{
    NcclResult, NCCL_INTERNAL_ERROR, NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE, NCCL_SYSTEM_ERROR,
};

/// Why a tuner or profiler call failed. The message is shown to the user in
/// NCCL's WARN line, so it should say what to fix.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// NCCL passed something the plugin cannot use (`ncclInvalidArgument`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The user's configuration is wrong (`ncclInvalidUsage`).
    #[error("{0}")]
    InvalidUsage(String),
    /// A system call failed (`ncclSystemError`).
    #[error("system error: {0}")]
    System(String),
    /// A bug in the plugin (`ncclInternalError`).
    #[error("internal error: {0}")]
    Internal(String),
}

impl PluginError {
    /// The `ncclResult_t` NCCL receives for this error.
    pub fn code(&self) -> NcclResult {
        match self {
            PluginError::InvalidArgument(_) => NCCL_INVALID_ARGUMENT,
            PluginError::InvalidUsage(_) => NCCL_INVALID_USAGE,
            PluginError::System(_) => NCCL_SYSTEM_ERROR,
            PluginError::Internal(_) => NCCL_INTERNAL_ERROR,
        }
    }
}

/// Result of tuner and profiler plugin calls.
pub type PluginResult<T> = Result<T, PluginError>;
