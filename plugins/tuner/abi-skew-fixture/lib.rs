//! The smallest tuner: it keeps NCCL's choice. What matters is the SDK it
//! is built against (see Cargo.toml).

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
