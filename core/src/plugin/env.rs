//! The env plugin: `NCCL_ENV_PLUGIN` as NCCL 2.30 reads it (a name →
//! `libnccl-env-NAME.so`, a path, `none`; unset tries `libnccl-env.so`),
//! its abi_stable root module where it has one (unless OXCCL_PLUGIN_ABI=c),
//! else `ncclEnvPlugin_v2`, else `_v1`, opened and called by the SDK's
//! [`CEnv`], so that all the unsafe calls into a plugin live beside its
//! frozen ABI. Loaded once per process, at the first read of a setting;
//! from then on every `NCCL_*` value oxccl reads comes through its
//! `getEnv` ([`var`]), and `finalize` runs at exit, as NCCL
//! registers it with `atexit`. Without one (none found, refused, or its
//! `init` failed) values come from the process environment, as from NCCL's
//! internal plugin.
//!
//! The plugin is loaded while the configuration that sets up logging is
//! read, so what the search found, and what the plugin logged in `init`,
//! is logged by [`announce`] once logging is up.
#![allow(unsafe_code)]

use std::sync::{Mutex, Once, OnceLock};

use oxccl_plugin::env::load::{self as sdk, CEnv};
/// The symbol of an env plugin's abi_stable root module, tried first.
pub use oxccl_plugin::env::stable::SYMBOL as ROOT_SYMBOL;
pub use oxccl_plugin::ffi::env::LOADABLE;
use oxccl_plugin::stable::AbiChoice;
use tracing::{info, warn};

use crate::error::Error;
use crate::plugin::ffi_log::{self, Captured};
use oxccl_plugin::loader;
pub use oxccl_plugin::loader::Outcome;

/// The variable naming the plugin (read from the process environment, as
/// NCCL reads it with `getenv`).
pub const SETTING: &str = "NCCL_ENV_PLUGIN";

/// The NCCL version oxccl passes to `init`: the API it implements.
const NCCL_VERSION: (u8, u8, u8) = (2, 31, 2);
const SUFFIX: &str = "+oxccl";

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
    plugin: Mutex<Option<CEnv>>,
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
    let refuse = |st: &mut State, library: &str, e: sdk::Refused| {
        st.lines.push((
            true,
            format!(
                "{}; reading the process environment",
                loader::refusal("env", library, &e.looked, &e.found, &e.reason)
            ),
        ));
        st.report.outcome = Outcome::Refused {
            library: library.to_string(),
            reason: e.reason,
            searched: searched.clone(),
        };
    };
    let lib = match (search.opened, search.failed.first()) {
        (Some(l), _) => l,
        (None, Some((library, why))) => {
            let e = sdk::Refused {
                looked: sdk::symbols(),
                found: Vec::new(),
                reason: format!("cannot be opened: {why}"),
            };
            refuse(&mut st, library, e);
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
    let opened = CEnv::open(&lib, abi).and_then(|mut p| {
        p.init(NCCL_VERSION, SUFFIX, ffi_log::logger())?;
        Ok(p)
    });
    let plugin = match opened {
        Ok(p) => p,
        Err(e) => {
            refuse(&mut st, lib.name(), e);
            return st;
        }
    };
    st.lines.push((
        false,
        format!(
            "loaded env plugin {} from {} ({}); every NCCL_ value is read through it",
            plugin.name(),
            lib.name(),
            plugin.loaded_as()
        ),
    ));
    // `oxccl info` prefixes a C version with its symbol's stem.
    let version = if plugin.is_stable() {
        plugin.loaded_as()
    } else {
        format!("v{}", plugin.version())
    };
    st.report.outcome = Outcome::Loaded {
        library: lib.name().to_string(),
        version,
        searched,
    };
    st.report.name = Some(plugin.name().to_string());
    st.plugin = Mutex::new(Some(plugin));
    // SAFETY: registers a plain function that never unwinds.
    unsafe { libc::atexit(finalize_at_exit) };
    st
}

extern "C" fn finalize_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        // `get`, not `state()`: the exit handler must not start a load.
        let Some(Ok(mut slot)) = STATE.get().map(|s| s.plugin.lock()) else {
            return;
        };
        // Taken, so later reads see no plugin and never follow finalize;
        // at exit a failing finalize has nobody left to tell.
        if let Some(p) = slot.take() {
            let _ = p.finalize();
        }
    });
}

/// The value of the variable `name`: the plugin's answer when one is in
/// use, else the process environment's.
pub fn var(name: &str) -> Option<String> {
    let slot = state().plugin.lock().unwrap_or_else(|p| p.into_inner());
    match slot.as_ref() {
        // The lock keeps one read at a time, as the C ABI's results ask.
        Some(p) => p.get(name),
        None => {
            drop(slot);
            std::env::var(name).ok()
        }
    }
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
