//! NCCL's environment plugin ABI, `ncclEnv_vN_t` (NCCL 2.28 has v1, 2.30
//! adds v2): a library NCCL reads every `NCCL_*` value through
//! (`ncclGetEnv`). Both versions are frozen here; v2 is the newest shape,
//! and [`Vtable`] calls either in it, as NCCL's `env_v1.cc` adapts v1.
//!
//! The contract (NCCL's `env_v2.h` and `plugins/env/README.md`):
//! - `init` comes first, once per process, with NCCL's version; an error
//!   makes NCCL fall back to its internal plugin (the process environment);
//! - `getEnv(name)` returns the value or NULL when unset; the string must
//!   stay valid until `finalize`, or until `getEnv` is called again for the
//!   same name;
//! - `finalize` comes at process exit (NCCL registers it with `atexit`).

use std::os::raw::c_char;

use super::types::{Logger, NcclResult, NCCL_INTERNAL_ERROR};

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

/// A library's env vtable of either version, called in v2's shape.
#[derive(Debug, Clone, Copy)]
pub enum Vtable {
    V1(&'static EnvV1),
    V2(&'static EnvV2),
}

/// Every version a loader can take, newest first.
pub const LOADABLE: [(&str, u32); 2] = [(SYMBOL_V2, 2), (SYMBOL_V1, 1)];

impl Vtable {
    /// The vtable at a symbol's address.
    ///
    /// # Safety
    /// `p` is the address of `LOADABLE`'s symbol of `version`: a static
    /// `ncclEnv_vN_t` that stays mapped for the rest of the process.
    pub unsafe fn from_symbol(version: u32, p: *const std::os::raw::c_void) -> Option<Vtable> {
        match version {
            // SAFETY: per the contract.
            2 => Some(Vtable::V2(unsafe { &*(p as *const EnvV2) })),
            // SAFETY: per the contract.
            1 => Some(Vtable::V1(unsafe { &*(p as *const EnvV1) })),
            _ => None,
        }
    }

    /// N of `ncclEnv_vN_t`.
    pub fn version(&self) -> u32 {
        match self {
            Vtable::V1(_) => 1,
            Vtable::V2(_) => 2,
        }
    }

    /// The vtable's `name` (NULL when the plugin gives none).
    pub fn name(&self) -> *const c_char {
        match self {
            Vtable::V1(v) => v.name,
            Vtable::V2(v) => v.name,
        }
    }

    /// The entries NCCL calls without a NULL check that are NULL here.
    pub fn null_entries(&self) -> Vec<&'static str> {
        let (init, finalize, get_env) = match self {
            Vtable::V1(v) => (v.init.is_some(), v.finalize.is_some(), v.get_env.is_some()),
            Vtable::V2(v) => (v.init.is_some(), v.finalize.is_some(), v.get_env.is_some()),
        };
        [("init", init), ("finalize", finalize), ("getEnv", get_env)]
            .into_iter()
            .filter(|(_, ok)| !ok)
            .map(|(n, _)| n)
            .collect()
    }

    /// `init`; v1 gets no logger, as in NCCL's adapter.
    ///
    /// # Safety
    /// `suffix` is a C string; `log` a valid logger or none.
    pub unsafe fn init(
        &self,
        version: (u8, u8, u8),
        suffix: *const c_char,
        log: Logger,
    ) -> NcclResult {
        let (major, minor, patch) = version;
        match self {
            // SAFETY: the plugin's entry, with the arguments its C type takes.
            Vtable::V1(v) => v.init.map_or(NCCL_INTERNAL_ERROR, |f| unsafe {
                f(major, minor, patch, suffix)
            }),
            // SAFETY: as above.
            Vtable::V2(v) => v.init.map_or(NCCL_INTERNAL_ERROR, |f| unsafe {
                f(major, minor, patch, suffix, log)
            }),
        }
    }

    /// `getEnv`: NULL when unset (or the entry is NULL).
    ///
    /// # Safety
    /// After a successful `init` and before `finalize`; `name` a C string.
    pub unsafe fn get_env(&self, name: *const c_char) -> *const c_char {
        let f = match self {
            Vtable::V1(v) => v.get_env,
            Vtable::V2(v) => v.get_env,
        };
        // SAFETY: per the contract.
        f.map_or(std::ptr::null(), |f| unsafe { f(name) })
    }

    /// `finalize`.
    ///
    /// # Safety
    /// Once, after `init`, with no `getEnv` after it.
    pub unsafe fn finalize(&self) -> NcclResult {
        let f = match self {
            Vtable::V1(v) => v.finalize,
            Vtable::V2(v) => v.finalize,
        };
        // SAFETY: per the contract.
        f.map_or(NCCL_INTERNAL_ERROR, |f| unsafe { f() })
    }
}

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
