//! The env plugin: `NCCL_ENV_PLUGIN` as NCCL 2.30 reads it (a name →
//! `libnccl-env-NAME.so`, a path, `none`; unset tries `libnccl-env.so`),
//! its abi_stable root module where it has one (unless OXCCL_PLUGIN_ABI=c),
//! else `ncclEnvPlugin_v2`, else `_v1`. Loaded once per process, at the first
//! read of a setting; from then on every `NCCL_*` value oxccl reads comes
//! through its `getEnv` ([`var`]), and `finalize` runs at exit, as NCCL
//! registers it with `atexit`. Without one (none found, refused, or its
//! `init` failed) values come from the process environment, as from NCCL's
//! internal plugin.
//!
//! The plugin is loaded while the configuration that sets up logging is
//! read, so what the search found, and what the plugin logged in `init`,
//! is logged by [`announce`] once logging is up.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::sync::{Mutex, Once, OnceLock};

use oxccl_plugin::abi_stable::std_types::RStr;
/// The symbol of an env plugin's abi_stable root module, tried first.
pub use oxccl_plugin::env::stable::SYMBOL as ROOT_SYMBOL;
use oxccl_plugin::env::stable::{self as rs, EnvModRef};
use oxccl_plugin::ffi::env::Vtable;
pub use oxccl_plugin::ffi::env::LOADABLE;
use oxccl_plugin::ffi::NCCL_SUCCESS;
use oxccl_plugin::stable::{host_sink, load_root, AbiChoice, SDK_VERSION};
use tracing::{info, warn};

use crate::error::Error;
use crate::plugin::ffi_log::{self, Captured};
pub use oxccl_plugin::loader::Outcome;
use oxccl_plugin::loader::{self, Lib};

/// The variable naming the plugin (read from the process environment, as
/// NCCL reads it with `getenv`).
pub const SETTING: &str = "NCCL_ENV_PLUGIN";

/// The NCCL version oxccl passes to `init`: the API it implements.
const NCCL_VERSION: (u8, u8, u8) = (2, 31, 2);
const SUFFIX: &CStr = c"+oxccl";

/// The functions of a loaded plugin.
enum Api {
    C(Vtable),
    Stable(EnvModRef),
}

struct Loaded {
    api: Api,
    /// Keeps the library mapped for the life of the process.
    _lib: Lib,
}

// SAFETY: the vtable points into the library's static data, which `_lib`
// keeps mapped; calls into it are serialized by the mutex around `Loaded`.
unsafe impl Send for Loaded {}

/// What the search found, for `oxccl info` and [`announce`].
#[derive(Debug, Clone)]
pub struct Report {
    pub outcome: Outcome,
    /// The plugin's `name`, when loaded.
    pub name: Option<String>,
    /// The value of [`SETTING`], if set.
    pub setting: Option<String>,
}

struct State {
    report: Report,
    /// An explicit setting that names no library: every read of the
    /// configuration fails with it, as an explicit net plugin that is not
    /// there fails the communicator.
    error: Option<String>,
    /// Lines to log once logging is set up.
    lines: Vec<(bool, String)>,
    held: Vec<Captured>,
    /// `None` after `finalize`, or when no plugin is in use.
    plugin: Mutex<Option<Loaded>>,
}

static STATE: OnceLock<State> = OnceLock::new();

fn state() -> &'static State {
    STATE.get_or_init(|| {
        let setting = std::env::var(SETTING).ok();
        let (state, held) = ffi_log::capture(|| load(setting));
        State { held, ..state }
    })
}

fn load(setting: Option<String>) -> State {
    let search = loader::open(loader::ENV, setting.as_deref());
    let searched = search.tried.clone();
    let looked: Vec<&str> = LOADABLE.iter().map(|l| l.0).collect();
    // What a refusal names as looked for: the root module first.
    let named: Vec<&str> = std::iter::once(rs::SYMBOL)
        .chain(looked.iter().copied())
        .collect();
    let mut st = State {
        report: Report {
            outcome: Outcome::NotFound {
                searched: searched.clone(),
            },
            name: None,
            setting: setting.clone(),
        },
        error: None,
        lines: Vec::new(),
        held: Vec::new(),
        plugin: Mutex::new(None),
    };
    let refuse = |st: &mut State, library: &str, found: &[&str], reason: String| {
        st.lines.push((
            true,
            format!(
                "{}; reading the process environment",
                loader::refusal("env", library, &named, found, &reason)
            ),
        ));
        st.report.outcome = Outcome::Refused {
            library: library.to_string(),
            reason,
            searched: searched.clone(),
        };
    };
    let lib = match (search.opened, search.failed.first()) {
        (Some(l), _) => l,
        (None, Some((library, why))) => {
            refuse(&mut st, library, &[], format!("cannot be opened: {why}"));
            return st;
        }
        (None, None) => {
            if loader::explicit(setting.as_deref()) {
                st.error = Some(format!(
                    "{SETTING}={}: no such library (tried {}); set it to a library name, a path, or none",
                    setting.unwrap_or_default().trim(),
                    searched.join(", ")
                ));
            }
            return st;
        }
    };
    let abi = match AbiChoice::from_env() {
        Ok(a) => a,
        Err(e) => {
            // As an explicit setting naming no library: every read fails
            // with it, rather than a guess at what was meant.
            st.error = Some(e.to_string());
            return st;
        }
    };
    if abi == AbiChoice::Auto {
        match load_root::<EnvModRef>(&lib, rs::SYMBOL) {
            Some(Ok(m)) => {
                load_stable(&mut st, m, lib, searched);
                return st;
            }
            Some(Err(e)) => {
                refuse(&mut st, lib.name(), &[rs::SYMBOL], e.to_string());
                return st;
            }
            None => {}
        }
    }
    let found = lib.present(&looked);
    let Some((vt, sym)) = LOADABLE.iter().find_map(|&(sym, version)| {
        let p = lib.symbol(sym)?;
        // SAFETY: `p` is the address of the library's `ncclEnv_vN_t` of
        // this version; `lib` stays mapped (kept in `Loaded`, or dropped
        // with the vtable unused).
        unsafe { Vtable::from_symbol(version, p) }.map(|vt| (vt, sym))
    }) else {
        refuse(
            &mut st,
            lib.name(),
            &found,
            "no env ABI version this oxccl loads (v1, v2)".into(),
        );
        return st;
    };
    let null = vt.null_entries();
    if !null.is_empty() {
        let reason = format!("{sym} has NULL entries: {}", null.join(", "));
        refuse(&mut st, lib.name(), &found, reason);
        return st;
    }
    let name = if vt.name().is_null() {
        lib.name().to_string()
    } else {
        // SAFETY: a non-null `name` is the plugin's static C string.
        unsafe { CStr::from_ptr(vt.name()) }
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: first call into the vtable, with a C string and our logger.
    let r = unsafe { vt.init(NCCL_VERSION, SUFFIX.as_ptr(), ffi_log::logger()) };
    if r != NCCL_SUCCESS {
        let reason = format!("{name}'s init returned {r}");
        refuse(&mut st, lib.name(), &found, reason);
        return st;
    }
    st.lines.push((
        false,
        format!(
            "loaded env plugin {name} from {} ({sym}); every NCCL_ value is read through it",
            lib.name()
        ),
    ));
    st.report.outcome = Outcome::Loaded {
        library: lib.name().to_string(),
        version: format!("v{}", vt.version()),
        searched,
    };
    st.report.name = Some(name);
    st.plugin = Mutex::new(Some(Loaded {
        api: Api::C(vt),
        _lib: lib,
    }));
    // SAFETY: registers a plain function that never unwinds.
    unsafe { libc::atexit(finalize_at_exit) };
    st
}

/// The root module's side of [`load`]: the same steps and lines, the
/// plugin's own error message where its `init` fails.
fn load_stable(st: &mut State, m: EnvModRef, lib: Lib, searched: Vec<String>) {
    let name = m.name()().as_str().to_string();
    let (major, minor, patch) = NCCL_VERSION;
    let args = rs::InitArgs {
        major,
        minor,
        patch,
        suffix: SUFFIX.to_string_lossy().as_ref().into(),
        log: host_sink(ffi_log::logger()),
    };
    if let Err(e) = m.init()(&args).into_result() {
        let reason = format!("{name}'s init failed: {e}");
        st.lines.push((
            true,
            format!(
                "{}; reading the process environment",
                loader::refusal("env", lib.name(), &[rs::SYMBOL], &[rs::SYMBOL], &reason)
            ),
        ));
        st.report.outcome = Outcome::Refused {
            library: lib.name().to_string(),
            reason,
            searched,
        };
        return;
    }
    let how = format!("{}, oxccl-plugin {SDK_VERSION}", rs::SYMBOL);
    st.lines.push((
        false,
        format!(
            "loaded env plugin {name} from {} ({how}); every NCCL_ value is read through it",
            lib.name()
        ),
    ));
    st.report.outcome = Outcome::Loaded {
        library: lib.name().to_string(),
        version: how,
        searched,
    };
    st.report.name = Some(name);
    st.plugin = Mutex::new(Some(Loaded {
        api: Api::Stable(m),
        _lib: lib,
    }));
    // SAFETY: registers a plain function that never unwinds.
    unsafe { libc::atexit(finalize_at_exit) };
}

extern "C" fn finalize_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        // `get`, not `state()`: the exit handler must not start a load.
        let Some(Ok(mut slot)) = STATE.get().map(|s| s.plugin.lock()) else {
            return;
        };
        // `p` keeps the library mapped until its finalize has returned.
        let Some(p) = slot.take() else {
            return;
        };
        match p.api {
            Api::C(vt) => {
                // SAFETY: once (the slot is emptied), after init, with no
                // getEnv after it (later reads see an empty slot).
                unsafe { vt.finalize() };
            }
            // At exit a failing finalize has nobody left to tell.
            Api::Stable(m) => {
                let _ = m.finalize()();
            }
        }
    });
}

/// The value of the variable `name`: the plugin's answer when one is in
/// use, else the process environment's.
pub fn var(name: &str) -> Option<String> {
    let slot = state().plugin.lock().unwrap_or_else(|p| p.into_inner());
    let Some(p) = slot.as_ref() else {
        drop(slot);
        return std::env::var(name).ok();
    };
    let vt = match p.api {
        Api::C(vt) => vt,
        Api::Stable(m) => {
            return m.get()(RStr::from_str(name))
                .into_option()
                .map(String::from)
        }
    };
    let c = CString::new(name).ok()?;
    // SAFETY: after init, before finalize (the slot holds the plugin); the
    // lock keeps the result valid while it is copied (no other getEnv of
    // this name can run meanwhile).
    let v = unsafe { vt.get_env(c.as_ptr()) };
    if v.is_null() {
        return None;
    }
    // SAFETY: non-null: the plugin's C string, valid until the next getEnv
    // of this name, which the lock holds off.
    Some(unsafe { CStr::from_ptr(v) }.to_string_lossy().into_owned())
}

/// The plugin's name while values come through it.
pub fn source() -> Option<String> {
    let st = state();
    let live = st.plugin.lock().map(|p| p.is_some()).unwrap_or(false);
    live.then(|| st.report.name.clone()).flatten()
}

/// An explicit [`SETTING`] that names no library, as the error every read
/// of the configuration fails with.
pub fn setting_error() -> Option<Error> {
    state().error.clone().map(Error::InvalidArgument)
}

// The configuration reads every `NCCL_` value through these.
oxccl_plugin::inventory::submit! {
    crate::config::EnvReader { var, source, setting_error }
}

/// What the search found.
pub fn report() -> Report {
    state().report.clone()
}

/// Logs, once, what the search found and what the plugin logged in `init`
/// (called when logging is set up).
pub fn announce() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let st = state();
        ffi_log::replay(&st.held);
        for (is_warn, line) in &st.lines {
            if *is_warn {
                warn!(target: "oxccl::init|env", "{line}");
            } else {
                info!(target: "oxccl::init|env", "{line}");
            }
        }
    });
}
