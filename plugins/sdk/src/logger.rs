//! NCCL's logger as a plugin instance sees it: the `ncclDebugLogger_t` handed
//! to `init`, wrapped so that plugin code logs a Rust string without touching
//! varargs. Tuner and profiler plugins get one per `init` (per communicator),
//! so that no global state is needed. Where no logger was given, lines go
//! to stderr in NCCL's own form ([`nccl_line`]), so that what scrapes
//! NCCL's logs finds them.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::raw::c_char;

use abi_stable::std_types::RStr;

use crate::ffi::types::{
    LogLevel, LogSubsys, Logger, NCCL_LOG_ABORT, NCCL_LOG_INFO, NCCL_LOG_TRACE, NCCL_LOG_WARN,
};

/// How a plugin logs through an abi_stable root module (`crate::stable`):
/// a line at an `NCCL_LOG_*` level for an `NCCL_*` subsystem, as a Rust
/// string (no varargs to cross).
pub type LogSink = extern "C" fn(level: LogLevel, subsys: LogSubsys, msg: RStr<'_>);

/// `msg` as NCCL prints a line: `host:pid:tid [dev] NCCL LEVEL msg`. A
/// plugin does not know the communicator's GPU: `[0]`, what NCCL shows for
/// threads that never set one.
pub fn nccl_line(level: LogLevel, msg: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into());
    let pid = std::process::id();
    // "/proc/thread-self" links to "<pid>/task/<tid>".
    let tid = std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse::<u32>().ok())
        .unwrap_or(pid);
    let word = match level {
        NCCL_LOG_WARN | NCCL_LOG_ABORT => "WARN",
        NCCL_LOG_TRACE => "TRACE",
        _ => "INFO",
    };
    format!("{host}:{pid}:{tid} [0] NCCL {word} {msg}")
}

/// Whether a line of `level` is shown where no logger was given: warnings
/// always, INFO and TRACE lines as `NCCL_DEBUG` asks (NCCL's rule).
pub fn shown_without_logger(level: LogLevel) -> bool {
    let debug = std::env::var("NCCL_DEBUG")
        .unwrap_or_default()
        .trim()
        .to_ascii_uppercase();
    match level {
        NCCL_LOG_WARN | NCCL_LOG_ABORT => true,
        NCCL_LOG_INFO => matches!(debug.as_str(), "INFO" | "TRACE"),
        NCCL_LOG_TRACE => debug == "TRACE",
        _ => false,
    }
}

/// Writes `msg` to stderr in NCCL's form, if `level` is shown there.
pub fn to_stderr(level: LogLevel, msg: &str) {
    if shown_without_logger(level) {
        eprintln!("{}", nccl_line(level, msg));
    }
}

/// NCCL's logger with the subsystem bit this plugin logs under.
#[derive(Clone, Copy, Debug)]
pub struct NcclLogger {
    f: Logger,
    subsys: LogSubsys,
    /// The host's sink when loaded through a root module (`crate::stable`).
    sink: Option<LogSink>,
}

impl NcclLogger {
    /// Wraps the logger NCCL gave (possibly NULL: then lines go to stderr).
    pub fn new(f: Logger, subsys: LogSubsys) -> Self {
        Self {
            f,
            subsys,
            sink: None,
        }
    }

    /// Logs through the sink a host handed a root module.
    pub fn from_sink(sink: LogSink, subsys: LogSubsys) -> Self {
        Self {
            f: None,
            subsys,
            sink: Some(sink),
        }
    }

    /// A logger that writes to stderr (tests, or NCCL gave none).
    pub fn stderr(subsys: LogSubsys) -> Self {
        Self {
            f: None,
            subsys,
            sink: None,
        }
    }

    /// Whether NCCL gave a logger (else lines go to stderr).
    pub fn has_sink(&self) -> bool {
        self.f.is_some() || self.sink.is_some()
    }

    /// Logs one line at `level` (`NCCL_LOG_*`).
    pub fn log(&self, level: LogLevel, msg: &str) {
        if let Some(sink) = self.sink {
            sink(level, self.subsys, RStr::from_str(msg));
            return;
        }
        let Some(f) = self.f else {
            to_stderr(level, msg);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_without_a_logger_take_nccls_form() {
        let l = nccl_line(NCCL_LOG_WARN, "NET/Socket : refused a connection");
        // host:pid:tid [0] NCCL WARN message
        let (head, msg) = l.split_once(" [0] NCCL WARN ").expect(&l);
        assert_eq!(msg, "NET/Socket : refused a connection");
        let parts: Vec<&str> = head.rsplitn(3, ':').collect();
        assert_eq!(parts.len(), 3, "{l}");
        assert_eq!(parts[1], std::process::id().to_string(), "{l}");
        assert!(parts[0].parse::<u32>().is_ok(), "{l}");
        assert!(!parts[2].is_empty(), "{l}");
        assert!(nccl_line(NCCL_LOG_INFO, "x").ends_with(" NCCL INFO x"));
        assert!(shown_without_logger(NCCL_LOG_WARN));
    }
}
