//! An env plugin for NCCL and oxccl: every `NCCL_*` value NCCL (2.28 and
//! later) or oxccl reads comes from the process environment, else from the
//! `[env]` table of oxccl's TOML file (`OXCCL_CONFIG`), the file oxccl
//! itself reads; so a cluster ships one file and both libraries see the
//! same settings. The environment wins, as it does over NCCL's own
//! `nccl.conf` and over oxccl's configuration files.
//!
//! Built as a cdylib exporting `ncclEnvPlugin_v1` (NCCL 2.28) and `_v2`
//! (NCCL 2.30, oxccl). The file is read once, at `init`; a file that cannot
//! be read or parsed fails `init` with a message naming it, and NCCL then
//! reads the process environment alone.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::path::PathBuf;

use oxccl_plugin::env::{load_config, ConfigFile, OXCCL_CONFIG};
use oxccl_plugin::{EnvPlugin, NcclLogger, NcclVersion, PluginError, PluginResult};

/// The plugin: the file's variables.
#[derive(Debug, Default)]
pub struct TomlEnv {
    pub path: Option<PathBuf>,
    pub vars: BTreeMap<String, String>,
}

impl TomlEnv {
    /// The value NCCL sees for `name`: the environment's, else the file's.
    pub fn lookup(&self, name: &str) -> Option<String> {
        std::env::var(name)
            .ok()
            .or_else(|| self.vars.get(name).cloned())
    }
}

impl EnvPlugin for TomlEnv {
    const NAME: &'static CStr = c"oxccl-env";

    fn init(nccl: &NcclVersion, logger: NcclLogger) -> PluginResult<Self> {
        let v = format!(
            "{}.{}.{}{}",
            nccl.major, nccl.minor, nccl.patch, nccl.suffix
        );
        // Logged here, once: `get` must not log (see EnvPlugin::get).
        match load_config() {
            Ok(None) => {
                logger.info(&format!(
                    "oxccl-env: {OXCCL_CONFIG} is unset; serving the process environment to NCCL {v}"
                ));
                Ok(TomlEnv::default())
            }
            Ok(Some(ConfigFile { path, vars })) => {
                let list: Vec<String> = vars.iter().map(|(k, v)| format!("{k}={v}")).collect();
                logger.info(&format!(
                    "oxccl-env: {} variable(s) from {} for NCCL {v} (the environment wins): {}",
                    vars.len(),
                    path.display(),
                    list.join(" ")
                ));
                Ok(TomlEnv {
                    path: Some(path),
                    vars,
                })
            }
            Err(e) => Err(PluginError::InvalidUsage(format!("oxccl-env: {e}"))),
        }
    }

    fn get(&mut self, name: &str) -> Option<String> {
        self.lookup(name)
    }
}

oxccl_plugin::export_env_plugin!(TomlEnv);
