//! NCCL's logger as a plugin instance sees it: the `ncclDebugLogger_t` handed
//! to `init`, wrapped so that plugin code logs a Rust string without touching
//! varargs. Tuner and profiler plugins get one per `init` (per communicator),
//! so that no global state is needed.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::raw::c_char;

use crate::ffi::types::{LogLevel, LogSubsys, Logger, NCCL_LOG_INFO, NCCL_LOG_WARN};

/// NCCL's logger with the subsystem bit this plugin logs under.
#[derive(Clone, Copy, Debug)]
pub struct NcclLogger {
    f: Logger,
    subsys: LogSubsys,
}

impl NcclLogger {
    /// Wraps the logger NCCL gave (possibly NULL: then lines go to stderr).
    pub fn new(f: Logger, subsys: LogSubsys) -> Self {
        Self { f, subsys }
    }

    /// A logger that writes to stderr (tests, or NCCL gave none).
    pub fn stderr(subsys: LogSubsys) -> Self {
        Self { f: None, subsys }
    }

    /// Whether NCCL gave a logger (else lines go to stderr).
    pub fn has_sink(&self) -> bool {
        self.f.is_some()
    }

    /// Logs one line at `level` (`NCCL_LOG_*`).
    pub fn log(&self, level: LogLevel, msg: &str) {
        let Some(f) = self.f else {
            eprintln!("{msg}");
            return;
        };
        // Interior NULs would cut the message short; NCCL prints C strings.
        let Ok(text) = CString::new(msg.replace('\0', " ")) else {
            return;
        };
        // SAFETY: `f` is the non-null `ncclDebugLogger_t` NCCL gave at init,
        // valid while the plugin is loaded; the format "%s" consumes exactly
        // the one NUL-terminated string passed, which outlives the call.
        unsafe {
            f(
                level,
                self.subsys,
                c"oxccl-plugin".as_ptr() as *const c_char,
                0,
                c"%s".as_ptr(),
                text.as_ptr(),
            )
        };
    }

    /// An INFO line (shown with `NCCL_DEBUG=INFO` and the subsystem enabled).
    pub fn info(&self, msg: &str) {
        self.log(NCCL_LOG_INFO, msg);
    }

    /// A WARN line.
    pub fn warn(&self, msg: &str) {
        self.log(NCCL_LOG_WARN, msg);
    }
}
