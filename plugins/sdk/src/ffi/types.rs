//! Scalars shared by every plugin ABI (net, tuner, profiler): result codes,
//! the logger NCCL hands to `init`, and the enums of `nccl.h` and
//! `nccl_common.h` that cross the boundary by value.
//!
//! C enums are passed as `int` on every ABI NCCL supports, so each one is a
//! `c_int` alias here plus one `pub const` per value; values never change
//! once NCCL has published them.

use std::os::raw::{c_char, c_int, c_ulong, c_void};

/// `ncclResult_t`: what every call of every plugin vtable returns.
pub type NcclResult = i32;

/// `ncclSuccess`.
pub const NCCL_SUCCESS: NcclResult = 0;
/// `ncclUnhandledCudaError`: a CUDA call failed (rare in plugins).
pub const NCCL_UNHANDLED_CUDA_ERROR: NcclResult = 1;
/// `ncclSystemError`: a system call or the network failed; the usual error
/// of a net plugin.
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
/// `ncclInternalError`: NCCL used the plugin wrongly (too many requests, a
/// bad handle).
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;
/// `ncclInvalidArgument`.
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;
/// `ncclInvalidUsage`: most likely the user's mistake (configuration, sizes).
pub const NCCL_INVALID_USAGE: NcclResult = 5;
/// `ncclRemoteError`: the peer failed or went away.
pub const NCCL_REMOTE_ERROR: NcclResult = 6;
/// `ncclInProgress`: a non-blocking operation has not finished.
pub const NCCL_IN_PROGRESS: NcclResult = 7;
/// `ncclTimeout` (NCCL 2.30 and later; 2.28 and 2.29 end at 7).
pub const NCCL_TIMEOUT: NcclResult = 8;
/// `ncclNumResults` of the newest headers (2.30): one past the last code.
pub const NCCL_NUM_RESULTS: NcclResult = 9;

/// `ncclDebugLogLevel`, the first argument of [`Logger`].
pub type LogLevel = c_int;
pub const NCCL_LOG_NONE: LogLevel = 0;
pub const NCCL_LOG_VERSION: LogLevel = 1;
pub const NCCL_LOG_WARN: LogLevel = 2;
pub const NCCL_LOG_INFO: LogLevel = 3;
pub const NCCL_LOG_ABORT: LogLevel = 4;
pub const NCCL_LOG_TRACE: LogLevel = 5;

/// `ncclDebugLogSubSys` bits, the second argument of [`Logger`]
/// (`NCCL_DEBUG_SUBSYS` filters on them).
pub type LogSubsys = c_ulong;
pub const NCCL_INIT: LogSubsys = 0x1;
pub const NCCL_COLL: LogSubsys = 0x2;
pub const NCCL_P2P: LogSubsys = 0x4;
pub const NCCL_SHM: LogSubsys = 0x8;
pub const NCCL_NET: LogSubsys = 0x10;
pub const NCCL_GRAPH: LogSubsys = 0x20;
pub const NCCL_TUNING: LogSubsys = 0x40;
pub const NCCL_ENV: LogSubsys = 0x80;
pub const NCCL_ALLOC: LogSubsys = 0x100;
pub const NCCL_CALL: LogSubsys = 0x200;
pub const NCCL_PROXY: LogSubsys = 0x400;
pub const NCCL_NVLS: LogSubsys = 0x800;
pub const NCCL_BOOTSTRAP: LogSubsys = 0x1000;
pub const NCCL_REG: LogSubsys = 0x2000;
pub const NCCL_PROFILE: LogSubsys = 0x4000;
pub const NCCL_RAS: LogSubsys = 0x8000;
/// Added in 2.30; older NCCLs ignore the bit.
pub const NCCL_DESTROY: LogSubsys = 0x10000;
/// Added in 2.30; older NCCLs ignore the bit.
pub const NCCL_ALLOC_HOST: LogSubsys = 0x20000;
/// `NCCL_ALL`: `~0` as an `unsigned long`.
pub const NCCL_ALL: LogSubsys = !0;

/// `ncclDebugLogger_t`: NCCL's printf-like logger, handed to every plugin's
/// `init`. Arguments: level, subsystem bits, file (or function) name, line,
/// then a printf format and its arguments. NULL when NCCL gives none. A
/// plugin may keep it for as long as it is loaded and call it from any
/// thread.
pub type Logger = Option<
    unsafe extern "C" fn(
        level: LogLevel,
        flags: LogSubsys,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    ),
>;

/// `ncclProfilerCallback_t`, handed to a net plugin's `init` (net v10 and
/// later): lets the network define events of its own and report them to the
/// profiler plugin. `ty` is one of the `NCCL_PROFILER_NET_EVENT_*` values;
/// `p_handle` is the per-operation handle NCCL passed to `isend`/`irecv`;
/// `plugin_id` names the layout of `ext_data` (type and version bits, see
/// `profiler::NCCL_PROFILER_NET_TYPE_IB`). On start, `*e_handle` receives the
/// event to pass to later updates and the stop.
pub type ProfilerCallback = Option<
    unsafe extern "C" fn(
        e_handle: *mut *mut c_void,
        ty: c_int,
        p_handle: *mut c_void,
        plugin_id: i64,
        ext_data: *mut c_void,
    ) -> NcclResult,
>;

/// `ty` of [`ProfilerCallback`]: start a network-defined event.
pub const NCCL_PROFILER_NET_EVENT_START: c_int = 0;
/// `ty` of [`ProfilerCallback`]: stop it.
pub const NCCL_PROFILER_NET_EVENT_STOP: c_int = 1;
/// `ty` of [`ProfilerCallback`]: update its state.
pub const NCCL_PROFILER_NET_EVENT_UPDATE: c_int = 2;
/// `ty` of [`ProfilerCallback`]: update, then stop.
pub const NCCL_PROFILER_NET_EVENT_UPDATE_AND_STOP: c_int = 3;

/// `ncclDataType_t`.
pub type DataType = c_int;
pub const NCCL_INT8: DataType = 0;
pub const NCCL_UINT8: DataType = 1;
pub const NCCL_INT32: DataType = 2;
pub const NCCL_UINT32: DataType = 3;
pub const NCCL_INT64: DataType = 4;
pub const NCCL_UINT64: DataType = 5;
pub const NCCL_FLOAT16: DataType = 6;
pub const NCCL_FLOAT32: DataType = 7;
pub const NCCL_FLOAT64: DataType = 8;
pub const NCCL_BFLOAT16: DataType = 9;
pub const NCCL_FLOAT8E4M3: DataType = 10;
pub const NCCL_FLOAT8E5M2: DataType = 11;
/// `ncclNumTypes`: one past the last type.
pub const NCCL_NUM_TYPES: DataType = 12;

/// `ncclRedOp_t`: the built-in reductions; values from `NCCL_NUM_OPS` up are
/// operators created at run time (`ncclRedOpCreatePreMulSum`).
pub type RedOp = c_int;
pub const NCCL_SUM: RedOp = 0;
pub const NCCL_PROD: RedOp = 1;
pub const NCCL_MAX: RedOp = 2;
pub const NCCL_MIN: RedOp = 3;
pub const NCCL_AVG: RedOp = 4;
/// `ncclNumOps`: the number of built-in operators.
pub const NCCL_NUM_OPS: RedOp = 5;

/// `ncclFunc_t`: the operation a tuner is asked about.
pub type Func = c_int;
pub const NCCL_FUNC_BROADCAST: Func = 0;
pub const NCCL_FUNC_REDUCE: Func = 1;
pub const NCCL_FUNC_ALL_GATHER: Func = 2;
pub const NCCL_FUNC_REDUCE_SCATTER: Func = 3;
pub const NCCL_FUNC_ALL_REDUCE: Func = 4;
pub const NCCL_FUNC_SEND_RECV: Func = 5;
pub const NCCL_FUNC_SEND: Func = 6;
pub const NCCL_FUNC_RECV: Func = 7;
pub const NCCL_FUNC_ALL_TO_ALL: Func = 8;
pub const NCCL_FUNC_SCATTER: Func = 9;
pub const NCCL_FUNC_GATHER: Func = 10;
/// From here on: NCCL 2.29 and later (2.28's `ncclNumFuncs` is 11).
pub const NCCL_FUNC_ALL_GATHER_V: Func = 11;
pub const NCCL_FUNC_PUT_SIGNAL: Func = 12;
pub const NCCL_FUNC_SIGNAL: Func = 13;
pub const NCCL_FUNC_WAIT_SIGNAL: Func = 14;
/// `ncclNumFuncs` of the newest headers (2.30).
pub const NCCL_NUM_FUNCS: Func = 15;
/// `NCCL_NUM_FUNCTIONS`: the collectives that have an algorithm and a
/// protocol (broadcast to all-reduce); rows of tuning tables.
pub const NCCL_NUM_FUNCTIONS: usize = 5;

/// `ncclPid_t` (`pid_t` on Linux), in profiler proxy-operation descriptors.
pub type Pid = c_int;
