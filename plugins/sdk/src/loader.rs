//! Finding and opening plugin libraries, as NCCL 2.30's `plugin_open.cc`:
//! the setting (`NCCL_NET_PLUGIN`, `NCCL_TUNER_PLUGIN`,
//! `NCCL_PROFILER_PLUGIN`, `NCCL_ENV_PLUGIN`) is tried as given, then, when it is a bare name
//! (no `/`, not `lib…​.so`), as `<prefix>-NAME.so`; `none` disables; unset
//! tries `<prefix>.so` on the library search path.
//!
//! A built-in plugin is a [`Lib`] too (its symbol table comes from the export
//! glue instead of `dlsym`), so built-ins and libraries share the version
//! negotiation and the C adapters.
#![allow(unsafe_code)]

use std::os::raw::c_void;
use std::sync::Arc;

use libloading::Library;

/// One plugin type's naming.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    /// `libnccl-net`, `libnccl-tuner`, `libnccl-profiler`.
    pub prefix: &'static str,
    /// The setting's environment name, for messages.
    pub key: &'static str,
}

pub const NET: Kind = Kind {
    prefix: "libnccl-net",
    key: "NCCL_NET_PLUGIN",
};
pub const TUNER: Kind = Kind {
    prefix: "libnccl-tuner",
    key: "NCCL_TUNER_PLUGIN",
};
pub const PROFILER: Kind = Kind {
    prefix: "libnccl-profiler",
    key: "NCCL_PROFILER_PLUGIN",
};
pub const ENV: Kind = Kind {
    prefix: "libnccl-env",
    key: "NCCL_ENV_PLUGIN",
};

/// What the search for a plugin found, for logs and `oxccl info`; the same
/// for every plugin type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Disabled, or the default library is not there: the built-in (or none).
    NotFound { searched: Vec<String> },
    /// Loaded at this ABI version.
    Loaded {
        library: String,
        version: String,
        searched: Vec<String>,
    },
    /// Found but refused (the reason is in the WARN line).
    Refused {
        library: String,
        reason: String,
        searched: Vec<String>,
    },
}

/// The one WARN line for a refused library of plugin type `what`: the
/// symbols looked for, those found, and why.
pub fn refusal(what: &str, library: &str, looked: &[&str], found: &[&str], reason: &str) -> String {
    format!(
        "{what} plugin {library}: looked for {}; found {}; {reason}",
        looked.join(", "),
        if found.is_empty() {
            "none".to_string()
        } else {
            found.join(", ")
        }
    )
}

/// Whether the setting names a library (as opposed to unset or `none`).
pub fn explicit(setting: Option<&str>) -> bool {
    setting.is_some_and(|s| !s.trim().is_empty() && !s.trim().eq_ignore_ascii_case("none"))
}

/// The library names tried for a setting, in order; empty for `none`.
pub fn candidates(kind: Kind, setting: Option<&str>) -> Vec<String> {
    match setting.map(str::trim) {
        Some(s) if s.eq_ignore_ascii_case("none") => Vec::new(),
        Some(s) if !s.is_empty() => {
            let is_lib_name = s.starts_with("lib") && s.ends_with(".so");
            if s.contains('/') || is_lib_name {
                vec![s.to_string()]
            } else {
                vec![s.to_string(), format!("{}-{s}.so", kind.prefix)]
            }
        }
        _ => vec![format!("{}.so", kind.prefix)],
    }
}

/// A plugin's symbols: an opened library, or a built-in's exported table.
#[derive(Clone)]
pub enum Lib {
    Dl {
        name: String,
        lib: Arc<Library>,
    },
    Builtin {
        name: &'static str,
        symbols: fn(&str) -> Option<*const c_void>,
    },
}

impl std::fmt::Debug for Lib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Lib {
    pub fn name(&self) -> &str {
        match self {
            Lib::Dl { name, .. } => name,
            Lib::Builtin { name, .. } => name,
        }
    }

    /// The address of a data symbol, or `None` when absent (or NULL).
    pub fn symbol(&self, sym: &str) -> Option<*const c_void> {
        match self {
            Lib::Dl { lib, .. } => {
                // SAFETY: the symbol is looked up as an address (a data
                // pointer), never called through this type.
                let s = unsafe { lib.get::<*const c_void>(sym) }.ok()?;
                let p = *s;
                (!p.is_null()).then_some(p)
            }
            Lib::Builtin { symbols, .. } => symbols(sym),
        }
    }

    /// Every one of `syms` this library has, in the order given.
    pub fn present<'a>(&self, syms: &[&'a str]) -> Vec<&'a str> {
        syms.iter()
            .copied()
            .filter(|s| self.symbol(s).is_some())
            .collect()
    }
}

/// What one search found.
#[derive(Debug, Default)]
pub struct Search {
    pub tried: Vec<String>,
    /// The first candidate that opened.
    pub opened: Option<Lib>,
    /// Candidates absent from the search path.
    pub missing: Vec<String>,
    /// Candidates that exist but failed to open, with the loader's message.
    pub failed: Vec<(String, String)>,
}

/// Opens the first candidate that loads. Opening a library runs its
/// initialisers, as in NCCL; the user named or installed it.
pub fn open(kind: Kind, setting: Option<&str>) -> Search {
    let mut s = Search {
        tried: candidates(kind, setting),
        ..Search::default()
    };
    for name in s.tried.clone() {
        // SAFETY: loading a plugin the configuration asks for (see above).
        match unsafe { Library::new(&name) } {
            Ok(lib) => {
                s.opened = Some(Lib::Dl {
                    name,
                    lib: Arc::new(lib),
                });
                break;
            }
            Err(e) => {
                // libloading's own text is only "dlopen failed": the
                // system's reason is its source.
                let msg =
                    std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
                if msg.contains("No such file or directory") {
                    s.missing.push(name);
                } else {
                    s.failed.push((name, msg));
                }
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_nccl_2_30() {
        assert_eq!(
            candidates(NET, Some("foo")),
            vec!["foo", "libnccl-net-foo.so"]
        );
        assert_eq!(candidates(TUNER, Some("/x/y.so")), vec!["/x/y.so"]);
        assert_eq!(candidates(PROFILER, Some("libp.so")), vec!["libp.so"]);
        assert_eq!(candidates(NET, Some("none")), Vec::<String>::new());
        assert_eq!(candidates(NET, None), vec!["libnccl-net.so"]);
        assert_eq!(candidates(TUNER, Some("")), vec!["libnccl-tuner.so"]);
    }

    #[test]
    fn missing_is_told_apart_from_broken() {
        let s = open(NET, Some("/nonexistent/libx.so"));
        assert!(s.opened.is_none());
        assert_eq!(s.missing, vec!["/nonexistent/libx.so"]);
        let dir = std::env::temp_dir().join(format!("oxccl-bad-{}.so", std::process::id()));
        std::fs::write(&dir, b"not an ELF").unwrap();
        let s = open(NET, dir.to_str());
        std::fs::remove_file(&dir).ok();
        assert_eq!(s.failed.len(), 1, "{s:?}");
    }
}
