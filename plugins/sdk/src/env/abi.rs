//! NCCL's environment plugin ABI, `ncclEnv_vN_t` (NCCL 2.28 has v1, 2.30
//! adds v2): a library NCCL reads every `NCCL_*` value through
//! (`ncclGetEnv`). Both versions are frozen here; v2 is the newest shape,
//! and `crate::env::load` calls either in it, as NCCL's `env_v1.cc` adapts
//! v1.
//!
//! The contract (NCCL's `env_v2.h` and `plugins/env/README.md`):
//! - `init` comes first, once per process, with NCCL's version; an error
//!   makes NCCL fall back to its internal plugin (the process environment);
//! - `getEnv(name)` returns the value or NULL when unset; the string must
//!   stay valid until `finalize`, or until `getEnv` is called again for the
//!   same name;
//! - `finalize` comes at process exit (NCCL registers it with `atexit`).

use std::os::raw::c_char;

use crate::ffi::types::{Logger, NcclResult};

/// Symbol of [`EnvV1`].
pub const SYMBOL_V1: &str = "ncclEnvPlugin_v1";
/// Symbol of [`EnvV2`].
pub const SYMBOL_V2: &str = "ncclEnvPlugin_v2";

/// `init` of v1: NCCL's major, minor and patch numbers and its version
/// suffix (e.g. `+cuda12.0`).
pub type InitV1Fn =
    unsafe extern "C" fn(major: u8, minor: u8, patch: u8, suffix: *const c_char) -> NcclResult;
/// `init` of v2: v1's arguments and NCCL's logger.
pub type InitV2Fn = unsafe extern "C" fn(
    major: u8,
    minor: u8,
    patch: u8,
    suffix: *const c_char,
    log_function: Logger,
) -> NcclResult;
/// `finalize` (both versions).
pub type FinalizeFn = unsafe extern "C" fn() -> NcclResult;
/// `getEnv` (both versions).
pub type GetEnvFn = unsafe extern "C" fn(name: *const c_char) -> *const c_char;

/// `ncclEnv_v1_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EnvV1 {
    pub name: *const c_char,
    pub init: Option<InitV1Fn>,
    pub finalize: Option<FinalizeFn>,
    pub get_env: Option<GetEnvFn>,
}

/// `ncclEnv_v2_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EnvV2 {
    pub name: *const c_char,
    pub init: Option<InitV2Fn>,
    pub finalize: Option<FinalizeFn>,
    pub get_env: Option<GetEnvFn>,
}

/// Every version a loader can take, newest first.
pub const LOADABLE: [(&str, u32); 2] = [(SYMBOL_V2, 2), (SYMBOL_V1, 1)];

#[cfg(test)]
mod tests {
    use super::*;

    // Measured from NCCL 2.30.7's env_v1.h and env_v2.h with gcc 12 on
    // x86_64 (sizeof, offsetof): a name and three function pointers.
    #[test]
    fn layouts() {
        for (size, align, offs) in [
            (
                std::mem::size_of::<EnvV1>(),
                std::mem::align_of::<EnvV1>(),
                [
                    std::mem::offset_of!(EnvV1, name),
                    std::mem::offset_of!(EnvV1, init),
                    std::mem::offset_of!(EnvV1, finalize),
                    std::mem::offset_of!(EnvV1, get_env),
                ],
            ),
            (
                std::mem::size_of::<EnvV2>(),
                std::mem::align_of::<EnvV2>(),
                [
                    std::mem::offset_of!(EnvV2, name),
                    std::mem::offset_of!(EnvV2, init),
                    std::mem::offset_of!(EnvV2, finalize),
                    std::mem::offset_of!(EnvV2, get_env),
                ],
            ),
        ] {
            assert_eq!((size, align, offs), (32, 8, [0, 8, 16, 24]));
        }
    }

    #[test]
    fn symbols_are_the_names_nccl_looks_up() {
        // NCCL_ENV_PLUGIN_SYMBOL (2.30) and env_v1.cc's dlsym.
        assert_eq!(LOADABLE, [("ncclEnvPlugin_v2", 2), ("ncclEnvPlugin_v1", 1)]);
    }
}
