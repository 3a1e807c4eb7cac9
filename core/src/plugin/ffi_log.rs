//! The logger every plugin's `init` receives (NCCL's `ncclDebugLogger_t`):
//! the C shim in `logger.c` formats the printf-style message, and the sink
//! here logs it through `tracing`, with NCCL's subsystem bits mapped onto
//! the core's targets.
#![allow(unsafe_code)]

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

extern "C" fn sink(
    level: c_int,
    subsys: c_ulong,
    file: *const c_char,
    line: c_int,
    msg: *const c_char,
) {
    let (msg, file) = (text(msg), text(file));
    let msg = msg.trim_end_matches('\n');
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
