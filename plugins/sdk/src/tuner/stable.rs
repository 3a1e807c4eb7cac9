//! The tuner's abi_stable root module ([`crate::stable`]): what
//! [`crate::export_tuner_plugin!`] exports as [`SYMBOL`] beside
//! `ncclTunerPlugin_v2` … `_v6`, and what [`super::load::CTuner`] prefers
//! to them. The functions mirror [`Tuner`]'s methods one for one, so the
//! host drives both paths through the same calls.
#![allow(unsafe_code)]

use std::os::raw::c_void;
use std::panic::catch_unwind;

use abi_stable::library::{
    CheckTypeLayout, LibHeader, RootModule, RootModuleError, RootModuleResult,
};
use abi_stable::marker_type::ErasedPrefix;
use abi_stable::prefix_type::{PrefixRefTrait, PrefixTypeTrait};
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{ROption, RResult, RSliceMut, RStr, RString};
use abi_stable::StableAbi;

use crate::ffi::types::{LogLevel, LogSubsys, NCCL_TUNING};
use crate::logger::NcclLogger;
use crate::plugin_error::PluginError;
use crate::stable::{guarded, SDK_VERSION};
use crate::tuner::{
    Algorithm, CollInfoRequest, CollType, CostTable, NvlDomainInfo, Protocol, Tuner, TunerInit,
};

/// The symbol of the tuner's root module. A name of its own per kind, not
/// abi_stable's one `#[export_root_module]` symbol, so that one library can
/// carry a net plugin and a tuner as NCCL allows.
pub const SYMBOL: &str = "oxccl_tuner_root_module";

/// NVLink domain shape, as [`NvlDomainInfo`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct NvlDomain {
    pub n_nvl_domains: i32,
    pub min_ranks_per_nvl_domain: i32,
    pub max_ranks_per_nvl_domain: i32,
}

/// What `init` receives, as [`TunerInit`].
#[repr(C)]
#[derive(StableAbi)]
pub struct InitArgs {
    pub n_ranks: usize,
    pub n_nodes: usize,
    pub comm_id: ROption<u64>,
    pub nvl_domain: ROption<NvlDomain>,
    /// A [`crate::stable::LogSink`], spelled out: abi_stable reads a function pointer's
    /// signature only where it is written in the struct.
    pub log: extern "C" fn(level: LogLevel, subsys: LogSubsys, msg: RStr<'_>),
}

/// One question of the host, as [`CollInfoRequest`] (`coll` is NCCL's
/// `ncclFunc_t`, so values this SDK does not know still cross).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct CollRequest {
    pub coll: i32,
    pub n_bytes: usize,
    pub num_pipe_ops: i32,
    pub reg_buff: ROption<bool>,
    /// Only in plugins built with the test-only skew feature: the changed
    /// struct that the host must refuse.
    #[cfg(feature = "abi-skew-for-tests")]
    pub skew: u64,
}

/// One tuner instance of the plugin, opaque to the host.
#[repr(transparent)]
#[derive(StableAbi, Debug, Clone, Copy)]
pub struct Instance(pub *mut c_void);

/// The tuner's functions. A prefix type: a later SDK may append fields
/// after `destroy`, which an older host ignores.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = TunerModRef)))]
#[sabi(missing_field(panic))]
pub struct TunerMod {
    /// [`Tuner::NAME`].
    pub name: extern "C" fn() -> RStr<'static>,
    /// [`Tuner::init`]: an instance for one communicator.
    pub init: extern "C" fn(args: &InitArgs) -> RResult<Instance, RString>,
    /// [`Tuner::get_coll_info`] on a row-major `num_algo` x `num_proto` table.
    pub get_coll_info: extern "C" fn(
        inst: Instance,
        req: &CollRequest,
        table: RSliceMut<'_, f32>,
        num_algo: usize,
        num_proto: usize,
        n_channels: &mut i32,
    ) -> RResult<(), RString>,
    /// [`Tuner::get_chunk_size`]; `algo` and `proto` are NCCL's indices.
    pub get_chunk_size: extern "C" fn(
        inst: Instance,
        coll: i32,
        n_bytes: usize,
        algo: usize,
        proto: usize,
        n_channels: i32,
    ) -> RResult<ROption<usize>, RString>,
    /// [`Tuner::destroy`]; the instance is gone afterwards, whatever it returns.
    #[sabi(last_prefix_field)]
    pub destroy: extern "C" fn(inst: Instance) -> RResult<(), RString>,
}

impl RootModule for TunerModRef {
    abi_stable::declare_root_module_statics! {TunerModRef}
    const BASE_NAME: &'static str = "oxccl_tuner";
    const NAME: &'static str = "oxccl tuner plugin";
    const VERSION_STRINGS: VersionStrings = VersionStrings::new(SDK_VERSION);
}

impl From<&CollRequest> for CollInfoRequest {
    fn from(r: &CollRequest) -> Self {
        CollInfoRequest {
            coll: CollType::from_raw(r.coll),
            n_bytes: r.n_bytes,
            num_pipe_ops: r.num_pipe_ops,
            reg_buff: r.reg_buff.into_option(),
        }
    }
}

impl From<&CollInfoRequest> for CollRequest {
    fn from(r: &CollInfoRequest) -> Self {
        CollRequest {
            coll: r.coll.to_raw(),
            n_bytes: r.n_bytes,
            num_pipe_ops: r.num_pipe_ops,
            reg_buff: r.reg_buff.into(),
            #[cfg(feature = "abi-skew-for-tests")]
            skew: 0,
        }
    }
}

/// # Safety
/// `inst` came from `init::<T>` and was not destroyed.
unsafe fn instance<'a, T: Tuner>(inst: Instance) -> Result<&'a T, PluginError> {
    // SAFETY: per the function contract; shared access only (T: Sync).
    unsafe { (inst.0 as *const T).as_ref() }
        .ok_or_else(|| PluginError::InvalidArgument("tuner instance is NULL".into()))
}

extern "C" fn name<T: Tuner>() -> RStr<'static> {
    RStr::from_str(T::NAME.to_str().unwrap_or("(name not UTF-8)"))
}

extern "C" fn init<T: Tuner>(args: &InitArgs) -> RResult<Instance, RString> {
    guarded("init", || {
        let init = TunerInit {
            n_ranks: args.n_ranks,
            n_nodes: args.n_nodes,
            comm_id: args.comm_id.into_option(),
            nvl_domain: args.nvl_domain.into_option().map(|n| NvlDomainInfo {
                n_nvl_domains: n.n_nvl_domains,
                min_ranks_per_nvl_domain: n.min_ranks_per_nvl_domain,
                max_ranks_per_nvl_domain: n.max_ranks_per_nvl_domain,
            }),
            logger: NcclLogger::from_sink(args.log, NCCL_TUNING),
        };
        let tuner = T::init(&init)?;
        Ok(Instance(Box::into_raw(Box::new(tuner)) as *mut c_void))
    })
}

extern "C" fn get_coll_info<T: Tuner>(
    inst: Instance,
    req: &CollRequest,
    mut table: RSliceMut<'_, f32>,
    num_algo: usize,
    num_proto: usize,
    n_channels: &mut i32,
) -> RResult<(), RString> {
    guarded("getCollInfo", || {
        // SAFETY: the host passes an instance `init` returned, until `destroy`.
        let t = unsafe { instance::<T>(inst) }?;
        let cells = table.as_mut_slice();
        if num_algo.checked_mul(num_proto) != Some(cells.len()) {
            return Err(PluginError::InvalidArgument(format!(
                "cost table of {} cells for {num_algo} x {num_proto}",
                cells.len()
            )));
        }
        let mut view = CostTable::new(cells, num_algo, num_proto);
        t.get_coll_info(&CollInfoRequest::from(req), &mut view, n_channels)
    })
}

extern "C" fn get_chunk_size<T: Tuner>(
    inst: Instance,
    coll: i32,
    n_bytes: usize,
    algo: usize,
    proto: usize,
    n_channels: i32,
) -> RResult<ROption<usize>, RString> {
    guarded("getChunkSize", || {
        // SAFETY: as in `get_coll_info`.
        let t = unsafe { instance::<T>(inst) }?;
        let bad = |what: &str, v: usize| {
            PluginError::InvalidArgument(format!("{what} {v} is not one this SDK knows"))
        };
        let a = Algorithm::from_index(algo).ok_or_else(|| bad("algorithm", algo))?;
        let p = Protocol::from_index(proto).ok_or_else(|| bad("protocol", proto))?;
        let size = t.get_chunk_size(CollType::from_raw(coll), n_bytes, a, p, n_channels)?;
        Ok(size.into())
    })
}

extern "C" fn destroy<T: Tuner>(inst: Instance) -> RResult<(), RString> {
    guarded("destroy", || {
        if inst.0.is_null() {
            return Err(PluginError::InvalidArgument(
                "tuner instance is NULL".into(),
            ));
        }
        // SAFETY: the host destroys an instance `init` returned, once.
        let t = unsafe { Box::from_raw(inst.0 as *mut T) };
        t.destroy()
    })
}

/// The module of a tuner.
pub fn module<T: Tuner>() -> TunerModRef {
    TunerMod {
        name: name::<T>,
        init: init::<T>,
        get_coll_info: get_coll_info::<T>,
        get_chunk_size: get_chunk_size::<T>,
        destroy: destroy::<T>,
    }
    .leak_into_prefix()
}

/// Builds the module when the host first asks (abi_stable keeps it).
extern "C" fn constructor<T: Tuner>() -> RootModuleResult {
    match catch_unwind(module::<T>) {
        // SAFETY: erasing the prefix type is how abi_stable hands a root
        // module to its loader, which casts it back to `TunerModRef` after
        // checking the layouts.
        Ok(m) => RResult::ROk(unsafe { m.to_prefix_ref().cast::<ErasedPrefix>() }),
        Err(_) => RResult::RErr(RootModuleError::Unwound),
    }
}

/// The header [`crate::export_tuner_plugin!`] exports as [`SYMBOL`]: the
/// module's layout and [`SDK_VERSION`], and the constructor.
pub const fn lib_header<T: Tuner>() -> LibHeader {
    // SAFETY: `constructor::<T>` returns a `TunerModRef`, the module type
    // given, as `from_constructor` requires.
    unsafe { LibHeader::from_constructor::<TunerModRef>(constructor::<T>, CheckTypeLayout::Yes) }
}
