//! The smallest tuner and env plugin. What matters is the SDK they are
//! built against (see Cargo.toml).

use oxccl_plugin::{CollInfoRequest, CostTable, PluginResult, Tuner, TunerInit};

pub struct Skewed;

impl Tuner for Skewed {
    const NAME: &'static std::ffi::CStr = c"abi-skew";

    fn init(_args: &TunerInit) -> PluginResult<Self> {
        Ok(Skewed)
    }

    fn get_coll_info(
        &self,
        _req: &CollInfoRequest,
        _table: &mut CostTable<'_>,
        _n_channels: &mut i32,
    ) -> PluginResult<()> {
        Ok(())
    }
}

oxccl_plugin::export_tuner_plugin!(Skewed);

/// An env plugin in the same library (each kind has a root module symbol
/// of its own), built against the same changed SDK.
pub struct SkewedEnv;

impl oxccl_plugin::EnvPlugin for SkewedEnv {
    const NAME: &'static std::ffi::CStr = c"abi-skew-env";

    fn init(
        _nccl: &oxccl_plugin::NcclVersion,
        _logger: oxccl_plugin::NcclLogger,
    ) -> PluginResult<Self> {
        Ok(SkewedEnv)
    }

    fn get(&mut self, _name: &str) -> Option<String> {
        None
    }
}

oxccl_plugin::export_env_plugin!(SkewedEnv);
