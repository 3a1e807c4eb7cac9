//! The environment plugin interface for plugin authors: NCCL (2.28 and
//! later) and oxccl read every `NCCL_*` value through it. Implement
//! [`EnvPlugin`] and export it with [`crate::export_env_plugin!`]; the glue
//! in [`export`] serves both ABI versions (v1, v2) and keeps each
//! returned string alive as long as NCCL may read it.
//!
//! Also here: oxccl's TOML configuration file ([`OXCCL_CONFIG`]), read by
//! the core and by oxccl's env plugin alike, so that a cluster ships one
//! file for both libraries.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::path::{Path, PathBuf};

use crate::logger::NcclLogger;
use crate::plugin_error::PluginResult;

pub mod abi;
pub mod export;
pub mod load;
pub mod slot;
pub mod stable;

/// The NCCL (or oxccl) that initialised the plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclVersion {
    pub major: u8,
    pub minor: u8,
    pub patch: u8,
    /// NCCL's version suffix (`+cuda12.0`; oxccl passes `+oxccl`).
    pub suffix: String,
}

/// An environment plugin: one per process, made by `init`, asked for
/// values by name until NCCL finalizes it at exit.
pub trait EnvPlugin: Sized + Send + 'static {
    /// The vtable's `name`, shown in NCCL's log.
    const NAME: &'static CStr;
    /// Called once; an error makes NCCL read the process environment
    /// instead. Under NCCL's v1 ABI (no logger) `logger` writes to stderr.
    fn init(nccl: &NcclVersion, logger: NcclLogger) -> PluginResult<Self>;
    /// The value of the variable `name` (`NCCL_SOCKET_IFNAME`, ...), or
    /// `None` when unset. It should not log: NCCL's logger reads
    /// `NCCL_DEBUG` through this plugin on its first call, and the glue
    /// holds the plugin's lock here.
    fn get(&mut self, name: &str) -> Option<String>;
}

/// The variable naming oxccl's TOML file.
pub const OXCCL_CONFIG: &str = "OXCCL_CONFIG";

/// Why oxccl's TOML file cannot be used; the message names the file.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{path}: {why}")]
pub struct ConfigFileError {
    pub path: PathBuf,
    pub why: String,
}

/// The variables oxccl's TOML file sets, by name: its `[env]` table, e.g.
///
/// ```toml
/// [env]
/// NCCL_SOCKET_IFNAME = "eth0"
/// NCCL_MAX_NCHANNELS = 4
/// NCCL_SHM_DISABLE = true   # written as "1"
/// ```
///
/// Strings, integers, floats and booleans (as `1`/`0`) are taken; other
/// top-level keys and nested values are refused, naming them, so that a
/// typo is not silently ignored.
pub fn parse_config(text: &str) -> Result<BTreeMap<String, String>, String> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
    let mut out = BTreeMap::new();
    for (key, value) in table {
        let toml::Value::Table(env) = value else {
            return Err(format!(
                "top-level key {key:?}: this oxccl reads the [env] table only"
            ));
        };
        if key != "env" {
            return Err(format!(
                "table [{key}]: this oxccl reads the [env] table only"
            ));
        }
        for (name, v) in env {
            let text = match v {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => if b { "1" } else { "0" }.to_string(),
                other => {
                    return Err(format!(
                        "[env] {name}: a value of type {} is not one a variable can hold (use a string, number or boolean)",
                        other.type_str()
                    ))
                }
            };
            out.insert(name, text);
        }
    }
    Ok(out)
}

/// oxccl's TOML file, read.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    pub path: PathBuf,
    /// Its `[env]` table: variable name to value.
    pub vars: BTreeMap<String, String>,
}

/// The file [`OXCCL_CONFIG`] names; `Ok(None)` when the variable is unset
/// or empty.
pub fn load_config() -> Result<Option<ConfigFile>, ConfigFileError> {
    match std::env::var_os(OXCCL_CONFIG) {
        Some(p) if !p.is_empty() => read_config(Path::new(&p)).map(Some),
        _ => Ok(None),
    }
}

/// Reads and parses one TOML file.
pub fn read_config(path: &Path) -> Result<ConfigFile, ConfigFileError> {
    let err = |why: String| ConfigFileError {
        path: path.to_path_buf(),
        why,
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| err(format!("cannot read it ({e}); {OXCCL_CONFIG} names it")))?;
    let vars = parse_config(&text).map_err(err)?;
    Ok(ConfigFile {
        path: path.to_path_buf(),
        vars,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_table_values_become_text() {
        let v = parse_config(
            "[env]\nNCCL_SOCKET_IFNAME = \"lo\"\nNCCL_MAX_NCHANNELS = 4\nNCCL_SHM_DISABLE = true\nNCCL_TIMEOUT = 2.5\n",
        )
        .unwrap();
        assert_eq!(v["NCCL_SOCKET_IFNAME"], "lo");
        assert_eq!(v["NCCL_MAX_NCHANNELS"], "4");
        assert_eq!(v["NCCL_SHM_DISABLE"], "1");
        assert_eq!(v["NCCL_TIMEOUT"], "2.5");
        assert_eq!(v.len(), 4);
    }

    #[test]
    fn other_tables_and_shapes_are_named() {
        let e = parse_config("[tuner]\nx = 1\n").unwrap_err();
        assert!(e.contains("[tuner]"), "{e}");
        let e = parse_config("NCCL_DEBUG = \"INFO\"\n").unwrap_err();
        assert!(e.contains("NCCL_DEBUG") && e.contains("[env]"), "{e}");
        let e = parse_config("[env]\nNCCL_X = [1, 2]\n").unwrap_err();
        assert!(e.contains("NCCL_X") && e.contains("array"), "{e}");
        assert!(parse_config("[env\n").is_err());
    }

    #[test]
    fn unreadable_file_is_named() {
        let e = read_config(Path::new("/nonexistent/oxccl.toml")).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("/nonexistent/oxccl.toml") && msg.contains(OXCCL_CONFIG),
            "{msg}"
        );
    }
}
