//! The boundary every entry point goes through: panics are caught, errors
//! become NCCL's result codes, and the last error's message is kept for
//! `ncclGetLastError` and logged once as NCCL's WARN lines are.

use std::os::raw::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use oxccl::Error;

use crate::types::ncclResult_t;

/// Result of an entry point's body: a code to return (success or
/// in-progress) or an error.
pub(crate) type Outcome = Result<ncclResult_t, Error>;

const LAST_BYTES: usize = 1024;

/// The last error's message, NUL-terminated. NCCL keeps one per process
/// too; the pointer handed out stays valid (its contents change with the
/// next error).
static LAST: Mutex<[u8; LAST_BYTES]> = Mutex::new([0; LAST_BYTES]);

pub(crate) fn code_of(e: &Error) -> ncclResult_t {
    match e.code() {
        1 => ncclResult_t::ncclUnhandledCudaError,
        2 => ncclResult_t::ncclSystemError,
        4 => ncclResult_t::ncclInvalidArgument,
        5 => ncclResult_t::ncclInvalidUsage,
        6 => ncclResult_t::ncclRemoteError,
        _ => ncclResult_t::ncclInternalError,
    }
}

pub(crate) fn set_last_error(msg: &str) {
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    let n = msg.len().min(LAST_BYTES - 1);
    last[..n].copy_from_slice(&msg.as_bytes()[..n]);
    last[n] = 0;
}

pub(crate) fn last_error() -> *const c_char {
    let last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    last.as_ptr().cast()
}

/// Runs an entry point's body at the C boundary.
pub(crate) fn entry(name: &'static str, body: impl FnOnce() -> Outcome) -> ncclResult_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            let msg = format!("{name}: {e}");
            tracing::warn!(target: "oxccl::capi", "{msg}");
            set_last_error(&msg);
            code_of(&e)
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            let msg = format!("{name}: internal error (a bug in oxccl, please report it): {what}");
            tracing::error!(target: "oxccl::capi", "{msg}");
            set_last_error(&msg);
            ncclResult_t::ncclInternalError
        }
    }
}

/// `Ok(success)`, for bodies that have nothing else to report.
pub(crate) fn ok() -> Outcome {
    Ok(ncclResult_t::ncclSuccess)
}
