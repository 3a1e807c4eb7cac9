//! Finding and opening a network plugin library, as NCCL 2.30 does:
//! `NCCL_NET_PLUGIN` names a library (`foo` → `libnccl-net-foo.so`), a path,
//! or `none`; unset, `libnccl-net.so` is tried on the library search path.

mod ffi_v8;

use std::sync::Arc;

use oxccl_plugin::Net;
use tracing::{info, warn};

use crate::error::{Error, Result};

/// Symbols of every net ABI version NCCL has defined, newest first, and
/// whether this oxccl can load it.
const VERSIONS: &[(&str, bool)] = &[
    ("ncclNetPlugin_v12", false),
    ("ncclNetPlugin_v11", false),
    ("ncclNetPlugin_v10", false),
    ("ncclNetPlugin_v9", false),
    ("ncclNetPlugin_v8", true),
    ("ncclNetPlugin_v7", false),
    ("ncclNetPlugin_v6", false),
];

/// The library names tried for a setting, or none for `none`.
pub fn candidates(setting: Option<&str>) -> Vec<String> {
    match setting.map(str::trim) {
        Some(s) if s.eq_ignore_ascii_case("none") => Vec::new(),
        Some(s) if s.contains('/') || s.ends_with(".so") || s.starts_with("lib") => {
            vec![s.to_string()]
        }
        Some(s) if !s.is_empty() => vec![format!("libnccl-net-{s}.so")],
        _ => vec!["libnccl-net.so".to_string()],
    }
}

/// What happened when looking for a plugin, for logs and `oxccl info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Disabled, or the default library is not there: the built-in network.
    NotFound,
    /// Loaded at this ABI version.
    Loaded {
        library: String,
        version: &'static str,
    },
    /// Opened but refused (the reason is in the WARN line): the built-in network.
    Refused { library: String, reason: String },
}

/// Loads the network plugin the setting asks for. A library named
/// explicitly that cannot be opened is an error naming NCCL_NET_PLUGIN; one
/// that opens but offers no version we load, or fails `init`, gives one WARN
/// line and `None` (NCCL falls back to its internal network likewise).
pub fn load(setting: Option<&str>) -> Result<(Option<Arc<dyn Net>>, Outcome)> {
    let explicit =
        setting.is_some_and(|s| !s.trim().is_empty() && !s.trim().eq_ignore_ascii_case("none"));
    if let Some(lib) = candidates(setting).into_iter().next() {
        // Opening a plugin runs its initialisers; NCCL does the same, and the
        // user named or installed the library.
        let opened = ffi_v8::open(&lib);
        let library = match opened {
            Ok(l) => l,
            Err(e) if explicit => {
                return Err(Error::InvalidArgument(format!(
                    "NCCL_NET_PLUGIN={}: cannot open {lib}: {e}",
                    setting.unwrap_or_default()
                )))
            }
            Err(_) => return Ok((None, Outcome::NotFound)),
        };
        let found: Vec<&str> = VERSIONS
            .iter()
            .filter(|(s, _)| library.has(s))
            .map(|(s, _)| *s)
            .collect();
        let looked: Vec<&str> = VERSIONS.iter().map(|(s, _)| *s).collect();
        let Some(&(sym, _)) = VERSIONS.iter().find(|(s, ok)| *ok && found.contains(s)) else {
            let reason = format!(
                "exports no net ABI version this oxccl loads (looked for {}; found {}; loadable: ncclNetPlugin_v8)",
                looked.join(", "),
                if found.is_empty() { "none".to_string() } else { found.join(", ") }
            );
            warn!(target: "oxccl::net", "net plugin {lib}: {reason}; using the built-in network");
            return Ok((
                None,
                Outcome::Refused {
                    library: lib,
                    reason,
                },
            ));
        };
        match ffi_v8::CNet::new(library) {
            Ok(net) => {
                info!(target: "oxccl::net", "loaded net plugin {} from {lib} ({sym})", net.name());
                return Ok((
                    Some(Arc::new(net)),
                    Outcome::Loaded {
                        library: lib,
                        version: "v8",
                    },
                ));
            }
            Err(e) => {
                let reason = format!("{sym} found but unusable: {e}");
                warn!(target: "oxccl::net", "net plugin {lib}: {reason}; using the built-in network");
                return Ok((
                    None,
                    Outcome::Refused {
                        library: lib,
                        reason,
                    },
                ));
            }
        }
    }
    Ok((None, Outcome::NotFound))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_nccl() {
        assert_eq!(candidates(Some("foo")), vec!["libnccl-net-foo.so"]);
        assert_eq!(candidates(Some("/x/y.so")), vec!["/x/y.so"]);
        assert_eq!(candidates(Some("none")), Vec::<String>::new());
        assert_eq!(candidates(None), vec!["libnccl-net.so"]);
    }

    #[test]
    fn explicit_missing_library_names_the_setting() {
        let e = load(Some("/nonexistent/libx.so"))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("NCCL_NET_PLUGIN") && e.contains("/nonexistent/libx.so"),
            "{e}"
        );
        assert_eq!(load(Some("none")).unwrap().1, Outcome::NotFound);
    }
}
