//! Loading an env plugin: its abi_stable root module ([`super::stable`])
//! where it has one, else `ncclEnvPlugin_v2`, else `_v1`, behind one
//! adapter, [`CEnv`], which the host (oxccl's core) drives the same way
//! whichever was taken. v1 is called in v2's shape, as NCCL's `env_v1.cc`
//! adapts it: its `init` gets no logger.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::os::raw::c_void;

use abi_stable::std_types::RStr;

use super::abi::{EnvV1, EnvV2, FinalizeFn, GetEnvFn, InitV1Fn, InitV2Fn, LOADABLE};
use super::stable::{self as rs, EnvModRef};
use crate::ffi::types::{Logger, NCCL_SUCCESS};
use crate::loader::Lib;
use crate::stable::{host_sink, root_module, AbiChoice, SDK_VERSION};

/// Why a library's env plugin was not taken, with what the refusal line
/// names: the symbols looked for and those the library has.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason}")]
pub struct Refused {
    pub looked: Vec<&'static str>,
    pub found: Vec<&'static str>,
    pub reason: String,
}

/// Every symbol a refusal names as looked for: the root module first.
pub fn symbols() -> Vec<&'static str> {
    std::iter::once(rs::SYMBOL)
        .chain(LOADABLE.iter().map(|l| l.0))
        .collect()
}

/// A library's C vtable of either version.
#[derive(Clone, Copy)]
enum Vt {
    V1(&'static EnvV1),
    V2(&'static EnvV2),
}

/// `init` of the version taken.
#[derive(Clone, Copy)]
enum Init {
    V1(InitV1Fn),
    V2(InitV2Fn),
}

/// A C vtable's entries, checked non-NULL once at `open`.
#[derive(Clone, Copy)]
struct CFns {
    version: u32,
    init: Init,
    get_env: GetEnvFn,
    finalize: FinalizeFn,
}

/// The functions a [`CEnv`] calls.
#[derive(Clone, Copy)]
enum Api {
    C(CFns),
    Stable(EnvModRef),
}

/// A loaded env plugin (one per process, as NCCL's).
///
/// `Send` but not `Sync`: a C plugin's `getEnv` result lives only until the
/// next `getEnv` of the same name, so calls must not overlap; the host
/// serialises them by owning the one `CEnv` (behind a mutex).
pub struct CEnv {
    api: Api,
    _lib: Lib,
    name: String,
    /// The symbol taken: `ncclEnvPlugin_vN` or the root module's.
    symbol: &'static str,
    /// The symbols of the library, for a refusal at `init`.
    found: Vec<&'static str>,
    /// The suffix handed to `init`, kept for as long as the plugin may
    /// hold the pointer (NCCL's is a static string).
    suffix: Option<CString>,
    /// Whether `init` succeeded: NCCL's contract has no `getEnv` before it.
    ready: bool,
}

// SAFETY: the vtable is immutable data of a library that `_lib` keeps
// mapped; without `Sync` no two threads call into it at once.
unsafe impl Send for CEnv {}

impl CEnv {
    /// The env plugin in `lib`: its root module unless `abi` is
    /// [`AbiChoice::C`] or it has none, else the newest C version with
    /// every entry NCCL calls non-NULL. A root module built against
    /// another SDK is refused, not passed over: its message says what to
    /// rebuild.
    pub fn open(lib: &Lib, abi: AbiChoice) -> Result<CEnv, Refused> {
        let root = root_module::<EnvModRef>(lib, abi, rs::SYMBOL).map_err(|e| Refused {
            looked: symbols(),
            found: vec![rs::SYMBOL],
            reason: e.to_string(),
        })?;
        if let Some(m) = root {
            return Ok(CEnv {
                api: Api::Stable(m),
                _lib: lib.clone(),
                name: m.name()().as_str().to_string(),
                symbol: rs::SYMBOL,
                found: vec![rs::SYMBOL],
                suffix: None,
                ready: false,
            });
        }
        let looked: Vec<&'static str> = LOADABLE.iter().map(|l| l.0).collect();
        let found = lib.present(&looked);
        let refused = |reason: String| Refused {
            looked: symbols(),
            found: found.clone(),
            reason,
        };
        let Some((vt, symbol)) = LOADABLE.iter().find_map(|&(sym, version)| {
            let p = lib.symbol(sym)?;
            // SAFETY: `p` is the address of the library's `ncclEnv_vN_t`
            // of this version; the returned `CEnv` keeps `lib` mapped.
            unsafe { vtable_at(version, p) }.map(|vt| (vt, sym))
        }) else {
            return Err(refused(
                "no env ABI version this oxccl loads (v1, v2)".into(),
            ));
        };
        let Some(fns) = vt.entries() else {
            return Err(refused(format!(
                "{symbol} has NULL entries: {}",
                vt.null_entries().join(", ")
            )));
        };
        let name = vt.name().unwrap_or_else(|| lib.name().to_string());
        Ok(CEnv {
            api: Api::C(fns),
            _lib: lib.clone(),
            name,
            symbol,
            found,
            suffix: None,
            ready: false,
        })
    }

    /// The plugin's name (the library's where the C vtable gives none).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The NCCL ABI version taken; 0 for the root module.
    pub fn version(&self) -> u32 {
        match self.api {
            Api::C(fns) => fns.version,
            Api::Stable(_) => 0,
        }
    }

    /// Whether the root module was taken.
    pub fn is_stable(&self) -> bool {
        matches!(self.api, Api::Stable(_))
    }

    /// Which ABI was taken, for logs: the C symbol or the root module.
    pub fn loaded_as(&self) -> String {
        match self.api {
            Api::C(_) => self.symbol.to_string(),
            Api::Stable(_) => format!("{}, oxccl-plugin {SDK_VERSION}", rs::SYMBOL),
        }
    }

    /// `init`, before any [`CEnv::get`]: the host's NCCL version (major,
    /// minor, patch), its version suffix, and the logger the plugin may
    /// call until `finalize`. Until it succeeds, `get` answers `None`; a
    /// second call does nothing, as the ABI allows one per process.
    pub fn init(
        &mut self,
        version: (u8, u8, u8),
        suffix: &str,
        log: Logger,
    ) -> Result<(), Refused> {
        if self.ready {
            return Ok(());
        }
        let (major, minor, patch) = version;
        let refused = |reason: String, looked: Vec<&'static str>| Refused {
            looked,
            found: self.found.clone(),
            reason,
        };
        let fns = match self.api {
            Api::C(fns) => fns,
            Api::Stable(m) => {
                let args = rs::InitArgs {
                    major,
                    minor,
                    patch,
                    suffix: suffix.into(),
                    #[cfg(feature = "abi-skew-for-tests")]
                    skew: 0,
                    log: host_sink(log),
                };
                m.init()(&args).into_result().map_err(|e| {
                    // The module was taken: the refusal names it alone.
                    refused(
                        format!("{}'s init failed: {e}", self.name),
                        vec![rs::SYMBOL],
                    )
                })?;
                self.ready = true;
                return Ok(());
            }
        };
        let suffix = CString::new(suffix.replace('\0', "")).unwrap_or_default();
        let p = suffix.as_ptr();
        // Moving a CString keeps its heap buffer, so `p` stays valid.
        self.suffix = Some(suffix);
        let r = match fns.init {
            // SAFETY: the plugin's `init`, called first and once, with a C
            // string that `self` keeps alive; v1 has no logger argument.
            Init::V1(f) => unsafe { f(major, minor, patch, p) },
            // SAFETY: as above; `log` is the host's logger, valid for the
            // life of the process.
            Init::V2(f) => unsafe { f(major, minor, patch, p, log) },
        };
        if r == NCCL_SUCCESS {
            self.ready = true;
            Ok(())
        } else {
            Err(refused(
                format!("{}'s init returned {r}", self.name),
                symbols(),
            ))
        }
    }

    /// The value of the variable `name`, or `None` when unset (or when
    /// `name` holds a NUL, which no C name can, or before `init`).
    pub fn get(&self, name: &str) -> Option<String> {
        if !self.ready {
            return None;
        }
        let fns = match self.api {
            Api::C(fns) => fns,
            Api::Stable(m) => {
                return m.get()(RStr::from_str(name))
                    .into_option()
                    .map(String::from)
            }
        };
        let c = CString::new(name).ok()?;
        // SAFETY: the plugin's `getEnv`, after `init` and before
        // `finalize` (which consumes `self`), with a C string that outlives
        // the call.
        let v = unsafe { (fns.get_env)(c.as_ptr()) };
        if v.is_null() {
            return None;
        }
        // SAFETY: non-NULL: the plugin's C string, valid until the next
        // `getEnv` of this name or `finalize`; neither can run before it
        // is copied here, as `CEnv` is not `Sync` and `finalize` takes it.
        Some(unsafe { CStr::from_ptr(v) }.to_string_lossy().into_owned())
    }

    /// `finalize`, once, after which the plugin is not called again; a
    /// plugin never initialised is not finalised either.
    pub fn finalize(self) -> Result<(), String> {
        if !self.ready {
            return Ok(());
        }
        let fns = match self.api {
            Api::C(fns) => fns,
            Api::Stable(m) => return m.finalize()().into_result().map_err(String::from),
        };
        // SAFETY: the plugin's `finalize`; once (`self` is consumed, so no
        // `getEnv` follows) and after `init`, while `self` keeps the
        // library mapped.
        let r = unsafe { (fns.finalize)() };
        if r == NCCL_SUCCESS {
            Ok(())
        } else {
            Err(format!("{}'s finalize returned {r}", self.name))
        }
    }
}

/// The vtable of `version` at `p`.
///
/// # Safety
/// `p` is the address of `LOADABLE`'s symbol of `version`: a static
/// `ncclEnv_vN_t` that stays mapped while the result is used.
unsafe fn vtable_at(version: u32, p: *const c_void) -> Option<Vt> {
    match version {
        // SAFETY: per the contract.
        2 => Some(Vt::V2(unsafe { &*(p as *const EnvV2) })),
        // SAFETY: per the contract.
        1 => Some(Vt::V1(unsafe { &*(p as *const EnvV1) })),
        _ => None,
    }
}

impl Vt {
    /// The vtable's `name`, where it gives one.
    fn name(&self) -> Option<String> {
        let p = match self {
            Vt::V1(v) => v.name,
            Vt::V2(v) => v.name,
        };
        // SAFETY: a non-NULL `name` is the plugin's static C string.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    /// Every entry, or `None` when one NCCL calls without a check is NULL.
    fn entries(&self) -> Option<CFns> {
        Some(match self {
            Vt::V1(v) => CFns {
                version: 1,
                init: Init::V1(v.init?),
                get_env: v.get_env?,
                finalize: v.finalize?,
            },
            Vt::V2(v) => CFns {
                version: 2,
                init: Init::V2(v.init?),
                get_env: v.get_env?,
                finalize: v.finalize?,
            },
        })
    }

    /// The entries NCCL calls without a NULL check that are NULL here.
    fn null_entries(&self) -> Vec<&'static str> {
        let (init, finalize, get_env) = match self {
            Vt::V1(v) => (v.init.is_some(), v.finalize.is_some(), v.get_env.is_some()),
            Vt::V2(v) => (v.init.is_some(), v.finalize.is_some(), v.get_env.is_some()),
        };
        [("init", init), ("finalize", finalize), ("getEnv", get_env)]
            .into_iter()
            .filter(|(_, ok)| !ok)
            .map(|(n, _)| n)
            .collect()
    }
}
