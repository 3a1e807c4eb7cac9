//! The Rust-to-Rust ABI a plugin exports beside NCCL's C one: per kind an
//! `abi_stable` root module (a prefix type of `extern "C"` functions taking
//! and returning `abi_stable` types: `RResult<_, RString>` for errors with
//! their message, `RSlice`/`RSliceMut` for tables, `RStr` for names).
//!
//! Why two: NCCL's C structs are frozen per version and carry no layout
//! information, so a plugin built against another SDK whose Rust types
//! changed would be called with the wrong layout unnoticed. `abi_stable`
//! stores the layout of every type reachable from the root module in the
//! library and compares it with the host's at load, so such a plugin is
//! refused with the type named. The C symbols stay, so the same library
//! still loads into NCCL, and `OXCCL_PLUGIN_ABI=c` makes oxccl take them.
#![allow(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::RwLock;

use abi_stable::library::{AbiHeaderRef, LibraryError, RawLibrary, RootModule};
use abi_stable::std_types::{RResult, RStr, RString};

use crate::ffi::types::{LogLevel, LogSubsys, Logger};
use crate::loader::Lib;
use crate::logger::NcclLogger;
use crate::plugin_error::PluginResult;

/// The version of this SDK a plugin carries in its root modules and oxccl
/// names when it refuses one. The test-only skew feature marks it, so that
/// the refusal a test provokes shows two different versions as a real one
/// does.
pub const SDK_VERSION: &str = if cfg!(feature = "abi-skew-for-tests") {
    concat!(env!("CARGO_PKG_VERSION"), "+abi-skew-for-tests")
} else {
    env!("CARGO_PKG_VERSION")
};

/// The setting that picks the ABI oxccl loads a plugin through.
pub const ABI_KEY: &str = "OXCCL_PLUGIN_ABI";

/// Which of a plugin's two ABIs a loader takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbiChoice {
    /// The root module where the library has one, else NCCL's C symbols.
    Auto,
    /// NCCL's C symbols only, as NCCL loads the plugin.
    C,
}

/// `OXCCL_PLUGIN_ABI` holds something other than `auto` or `c`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{ABI_KEY}={0:?}: expected auto (a plugin's abi_stable root module where it has one, else NCCL's C symbols) or c (NCCL's C symbols only)")]
pub struct AbiChoiceError(pub String);

impl AbiChoice {
    /// Parses the setting: unset or empty is `auto`; anything but `auto`
    /// and `c` (any case) is refused rather than guessed at.
    pub fn parse(value: Option<&str>) -> Result<Self, AbiChoiceError> {
        match value.map(str::trim) {
            None | Some("") => Ok(Self::Auto),
            Some(v) if v.eq_ignore_ascii_case("auto") => Ok(Self::Auto),
            Some(v) if v.eq_ignore_ascii_case("c") => Ok(Self::C),
            Some(v) => Err(AbiChoiceError(v.to_string())),
        }
    }

    /// The choice the process environment makes.
    pub fn from_env() -> Result<Self, AbiChoiceError> {
        Self::parse(std::env::var(ABI_KEY).ok().as_deref())
    }
}

/// Why a plugin's root module was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StableError {
    /// A type crossing the boundary differs between the plugin's SDK and ours.
    #[error("{symbol} was built against oxccl-plugin {theirs} and this oxccl has oxccl-plugin {ours}, and abi_stable found types whose layout differs: {detail}; rebuild the plugin against oxccl-plugin {ours}, or set {ABI_KEY}=c to load its NCCL C symbols")]
    Layout {
        symbol: String,
        theirs: String,
        ours: &'static str,
        /// Each differing type with abi_stable's words for how.
        detail: String,
        /// abi_stable's whole report (both layouts of every type on the
        /// way), too long for a log line.
        report: String,
    },
    /// The versions are too far apart for abi_stable to compare layouts.
    #[error("{symbol} was built against oxccl-plugin {theirs} and this oxccl has oxccl-plugin {ours}, which abi_stable does not load together: {detail}; rebuild the plugin against oxccl-plugin {ours}, or set {ABI_KEY}=c to load its NCCL C symbols")]
    Version {
        symbol: String,
        theirs: String,
        ours: &'static str,
        detail: String,
    },
    /// Anything else abi_stable refused (another abi_stable, a broken library).
    #[error("{symbol}: {detail}; set {ABI_KEY}=c to load the plugin's NCCL C symbols")]
    Other { symbol: String, detail: String },
}

/// The root module a loader takes from `lib`: `symbol`'s, unless `abi`
/// is [`AbiChoice::C`] or the library has none (`Ok(None)`: the caller
/// takes NCCL's C symbols). One built against another SDK is an error,
/// not passed over: its message says what to rebuild.
pub fn root_module<M: RootModule>(
    lib: &Lib,
    abi: AbiChoice,
    symbol: &str,
) -> Result<Option<M>, StableError> {
    match abi {
        AbiChoice::C => Ok(None),
        AbiChoice::Auto => load_root(lib, symbol).transpose(),
    }
}

/// The root module `M` a library exports as `symbol`, with its layout
/// checked against this SDK's; `None` when the library has none (or is a
/// built-in, which has only the C tables), so the caller takes the C path.
pub fn load_root<M: RootModule>(lib: &Lib, symbol: &str) -> Option<Result<M, StableError>> {
    let Lib::Dl { name, .. } = lib else {
        return None;
    };
    lib.symbol(symbol)?;
    let other = |detail: String| StableError::Other {
        symbol: symbol.to_string(),
        detail,
    };
    // abi_stable reads the header through its own handle; the library is
    // already open, so this only takes another reference to it, which is
    // kept: the module's functions and layouts point into the library.
    let raw = match RawLibrary::load_at(Path::new(name)) {
        Ok(r) => Box::leak(Box::new(r)),
        Err(e) => return Some(Err(other(one_line(&e.to_string())))),
    };
    let sym = format!("{symbol}\0");
    // SAFETY: `symbol` is a name only the SDK's export macros define, as a
    // `LibHeader` static; abi_stable reads its own exported header the same
    // way (the symbol's address taken as an `AbiHeaderRef`), and `upgrade`
    // checks the header's magic and ABI version before trusting the rest.
    let header = match unsafe { raw.get::<AbiHeaderRef>(sym.as_bytes()) } {
        Ok(h) => *h,
        Err(e) => return Some(Err(other(one_line(&e.to_string())))),
    };
    let header = match header.upgrade() {
        Ok(h) => h,
        Err(e) => return Some(Err(other(one_line(&e.to_string())))),
    };
    let theirs = header.version_strings().version.as_str().to_string();
    Some(header.init_root_module::<M>().map_err(|e| match e {
        LibraryError::AbiInstability(_) => {
            let report = one_line(&e.to_string());
            StableError::Layout {
                symbol: symbol.to_string(),
                theirs,
                ours: SDK_VERSION,
                detail: differing_types(&report),
                report,
            }
        }
        LibraryError::IncompatibleVersionNumber { .. } => StableError::Version {
            symbol: symbol.to_string(),
            theirs,
            ours: SDK_VERSION,
            detail: one_line(&e.to_string()),
        },
        e => other(one_line(&e.to_string())),
    }))
}

/// "CollRequest: incompatible type size (expected 24, found 32), ..." from
/// abi_stable's report, which shows the expected and found layout of each
/// type from the root module down to the one that differs, followed by
/// "Error:" and its words for the difference; the whole report where it
/// has another shape.
fn differing_types(report: &str) -> String {
    let mut types = Vec::new();
    for seg in report.split("Layout of expected type:").skip(1) {
        let Some(at) = seg.find("Error:") else {
            continue;
        };
        let ty = seg
            .split("type:")
            .nth(1)
            .and_then(|t| t.split(" size:").next())
            .unwrap_or("?")
            .trim();
        let errors: Vec<String> = seg[at..]
            .split("Error:")
            .filter_map(|e| {
                // What may follow an error is the next level's "N error(s)inside".
                let e = match e.find("error(s)") {
                    Some(p) => e[..p]
                        .trim_end()
                        .trim_end_matches(|c: char| c.is_ascii_digit()),
                    None => e,
                };
                let e = e.trim();
                if e.is_empty() {
                    return None;
                }
                Some(match e.split_once(" Expected: ") {
                    Some((what, rest)) => match rest.split_once(" Found: ") {
                        Some((want, got)) => format!("{what} (expected {want}, found {got})"),
                        None => e.to_string(),
                    },
                    None => e.to_string(),
                })
            })
            .collect();
        types.push(format!("{ty}: {}", errors.join(", ")));
    }
    if types.is_empty() {
        report.to_string()
    } else {
        types.join("; ")
    }
}

/// abi_stable's reports span many indented lines; logs want one.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Runs a plugin body behind an `extern "C"` function of a root module: an
/// error becomes its message and a panic a message saying so, since
/// neither may unwind into the host.
pub fn guarded<R>(what: &str, f: impl FnOnce() -> PluginResult<R>) -> RResult<R, RString> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => RResult::ROk(v),
        Ok(Err(e)) => RResult::RErr(RString::from(e.to_string())),
        Err(_) => RResult::RErr(RString::from(format!(
            "{what}: panic inside the plugin (caught at the abi_stable boundary)"
        ))),
    }
}

pub use crate::logger::LogSink;

/// NCCL's C logger the host handed last, which [`host_sink`] forwards to.
/// The host has one logger for the process (oxccl's core passes the same
/// function to every plugin), so one slot suffices.
static HOST_LOGGER: RwLock<Logger> = RwLock::new(None);

/// The sink a host hands a root module, forwarding to `log` (NCCL's C
/// logger) as the C path would.
pub fn host_sink(log: Logger) -> LogSink {
    *HOST_LOGGER.write().unwrap_or_else(|e| e.into_inner()) = log;
    forward
}

extern "C" fn forward(level: LogLevel, subsys: LogSubsys, msg: RStr<'_>) {
    // A panic must not unwind into the plugin; a lost line is the lesser harm.
    let _ = catch_unwind(|| {
        let log = *HOST_LOGGER.read().unwrap_or_else(|e| e.into_inner());
        NcclLogger::new(log, subsys).log(level, msg.as_str());
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_abi_setting_is_parsed_strictly() {
        assert_eq!(AbiChoice::parse(None).unwrap(), AbiChoice::Auto);
        assert_eq!(AbiChoice::parse(Some(" ")).unwrap(), AbiChoice::Auto);
        assert_eq!(AbiChoice::parse(Some("AUTO")).unwrap(), AbiChoice::Auto);
        assert_eq!(AbiChoice::parse(Some("c")).unwrap(), AbiChoice::C);
        let e = AbiChoice::parse(Some("rust")).unwrap_err().to_string();
        assert!(
            e.starts_with("OXCCL_PLUGIN_ABI=\"rust\": expected auto"),
            "{e}"
        );
    }

    #[test]
    fn the_differing_type_is_taken_from_abi_stables_report() {
        let report = "Compared <this>: --- Type Layout --- type:PrefixRef<'a, M> size:8 \
            0 error(s). Layout of expected type: --- Type Layout --- type:M size:40 \
            Layout of found type: --- Type Layout --- type:M size:40 0 error(s)inside: <other> \
            Layout of expected type: --- Type Layout --- type:Req size:24 align:8 \
            Layout of found type: --- Type Layout --- type:Req size:32 align:8 \
            Error:incompatible type size Expected: 24 Found: 32 \
            Error:too many fields Expected: 4 Found: 5";
        assert_eq!(
            differing_types(report),
            "Req: incompatible type size (expected 24, found 32), too many fields (expected 4, found 5)"
        );
        assert_eq!(differing_types("something else"), "something else");
    }

    #[test]
    fn a_panic_becomes_a_message() {
        let r: RResult<(), RString> = guarded("init", || panic!("boom"));
        assert_eq!(
            r.into_result().unwrap_err().as_str(),
            "init: panic inside the plugin (caught at the abi_stable boundary)"
        );
    }
}
