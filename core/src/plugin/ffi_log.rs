//! The logger every plugin's `init` receives (NCCL's `ncclDebugLogger_t`):
//! the C shim in `logger.c` formats the printf-style message, and the sink
//! here logs it through `tracing`, with NCCL's subsystem bits mapped onto
//! the core's targets.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_ulong};
use std::sync::Once;

use oxccl_plugin::ffi::*;

extern "C" {
    fn oxccl_plugin_log_set_sink(
        sink: extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char),
    );
    fn oxccl_plugin_log(
        level: c_int,
        subsys: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    );
}

fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the shim passes its NUL-terminated buffer, and plugins pass
    // NUL-terminated file names (NCCL's `__FILE__`/`__func__`).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// One line a plugin logged while [`capture`] held it back.
#[derive(Debug, Clone)]
pub struct Captured {
    level: c_int,
    subsys: c_ulong,
    file: String,
    line: c_int,
    msg: String,
}

thread_local! {
    /// Lines held back on this thread (see [`capture`]); `None`: log them.
    static HELD: RefCell<Option<Vec<Captured>>> = const { RefCell::new(None) };
}

/// Runs `f`, holding back what plugins log on this thread meanwhile: for
/// the env plugin, which is loaded while the configuration that sets up
/// logging is read, so its lines are [`replay`]ed once logging is set up.
pub fn capture<R>(f: impl FnOnce() -> R) -> (R, Vec<Captured>) {
    let outer = HELD.with(|h| h.borrow_mut().replace(Vec::new()));
    let r = f();
    let lines = HELD.with(|h| std::mem::replace(&mut *h.borrow_mut(), outer));
    (r, lines.unwrap_or_default())
}

/// Logs lines [`capture`] held back.
pub fn replay(lines: &[Captured]) {
    for c in lines {
        emit(c.level, c.subsys, &c.file, c.line, &c.msg);
    }
}

extern "C" fn sink(
    level: c_int,
    subsys: c_ulong,
    file: *const c_char,
    line: c_int,
    msg: *const c_char,
) {
    let (msg, file) = (text(msg), text(file));
    let msg = msg.trim_end_matches('\n').to_string();
    let held = HELD.with(|h| match h.borrow_mut().as_mut() {
        Some(v) => {
            v.push(Captured {
                level,
                subsys,
                file: file.clone(),
                line,
                msg: msg.clone(),
            });
            true
        }
        None => false,
    });
    if !held {
        emit(level, subsys, &file, line, &msg);
    }
}

fn emit(level: c_int, subsys: c_ulong, file: &str, line: c_int, msg: &str) {
    // `tracing` needs targets known at compile time, hence one arm per
    // subsystem family rather than a computed target.
    macro_rules! emit {
        ($target:literal) => {
            match level {
                NCCL_LOG_WARN | NCCL_LOG_ABORT => {
                    tracing::warn!(target: $target, "plugin {file}:{line} {msg}")
                }
                NCCL_LOG_TRACE => tracing::trace!(target: $target, "plugin {file}:{line} {msg}"),
                NCCL_LOG_NONE => {}
                _ => tracing::info!(target: $target, "plugin {file}:{line} {msg}"),
            }
        };
    }
    if subsys & NCCL_TUNING != 0 {
        emit!("oxccl::tuning")
    } else if subsys & NCCL_NET != 0 {
        emit!("oxccl::net")
    } else if subsys & NCCL_ENV != 0 {
        emit!("oxccl::env")
    } else {
        emit!("oxccl::plugin")
    }
}

/// The logger to pass to a plugin's `init`.
pub fn logger() -> Logger {
    static SINK: Once = Once::new();
    // SAFETY: registers a plain function; the shim stores it atomically.
    SINK.call_once(|| unsafe { oxccl_plugin_log_set_sink(sink) });
    Some(oxccl_plugin_log)
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_printf_arguments() {
        let f = super::logger().unwrap();
        // SAFETY: a printf format with matching arguments, as a plugin passes.
        unsafe {
            f(
                oxccl_plugin::ffi::NCCL_LOG_INFO,
                oxccl_plugin::ffi::NCCL_NET,
                c"t.c".as_ptr(),
                1,
                c"%s=%d".as_ptr(),
                c"x".as_ptr(),
                42i32,
            )
        };
    }
}
