//! NCCL's plugin C ABI: one frozen file per interface version (as NCCL
//! keeps `net_v8.h` …), and the glue that exports a Rust [`crate::Net`]
//! through it (`export`), so the same plugin loads into NCCL and oxccl.

pub mod export;
pub mod net_v8;

use std::os::raw::{c_char, c_int, c_ulong};

/// `ncclResult_t` values.
pub const NCCL_SUCCESS: i32 = 0;
pub const NCCL_SYSTEM_ERROR: i32 = 2;
pub const NCCL_INTERNAL_ERROR: i32 = 3;
pub const NCCL_INVALID_ARGUMENT: i32 = 4;
pub const NCCL_INVALID_USAGE: i32 = 5;
pub const NCCL_REMOTE_ERROR: i32 = 6;

/// `ncclDebugLogLevel` values used by plugins.
pub const NCCL_LOG_WARN: c_int = 2;
pub const NCCL_LOG_INFO: c_int = 3;
/// `ncclDebugLogSubSys` bits.
pub const NCCL_INIT: c_ulong = 1;
pub const NCCL_NET: c_ulong = 16;

/// `ncclDebugLogger_t`: NCCL's printf-like logger, handed to `init`.
pub type Logger = Option<
    unsafe extern "C" fn(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    ),
>;
