//! The env plugin's abi_stable root module ([`crate::stable`]): what
//! [`crate::export_env_plugin!`] exports as [`SYMBOL`] beside
//! `ncclEnvPlugin_v1` and `_v2`, and what oxccl prefers to them. Values
//! cross as owned `RString`s, so the C ABI's rule (a returned string lives
//! until the same name is asked again) has no counterpart here.
#![allow(unsafe_code)]

use std::panic::catch_unwind;

use abi_stable::library::{
    CheckTypeLayout, LibHeader, RootModule, RootModuleError, RootModuleResult,
};
use abi_stable::marker_type::ErasedPrefix;
use abi_stable::prefix_type::{PrefixRefTrait, PrefixTypeTrait};
use abi_stable::sabi_types::VersionStrings;
use abi_stable::std_types::{ROption, RResult, RStr, RString};
use abi_stable::StableAbi;

use super::slot::Slot;
use crate::env::{EnvPlugin, NcclVersion};
use crate::ffi::types::{LogLevel, LogSubsys, NCCL_ENV};
use crate::logger::NcclLogger;
use crate::stable::{guarded, SDK_VERSION};

/// The symbol of the env plugin's root module (one name per kind).
pub const SYMBOL: &str = "oxccl_env_root_module";

/// What `init` receives: the host's NCCL version, as [`NcclVersion`], and
/// its logger.
#[repr(C)]
#[derive(StableAbi)]
pub struct InitArgs {
    pub major: u8,
    pub minor: u8,
    pub patch: u8,
    pub suffix: RString,
    /// Only in plugins built with the test-only skew feature.
    #[cfg(feature = "abi-skew-for-tests")]
    pub skew: u64,
    /// A [`crate::stable::LogSink`], spelled out: abi_stable reads a
    /// function pointer's signature only where it is written in the struct.
    pub log: extern "C" fn(level: LogLevel, subsys: LogSubsys, msg: RStr<'_>),
}

/// The env plugin's functions, acting on the library's one plugin (NCCL's
/// env ABI has no context either). A prefix type: a later SDK may append
/// fields after `finalize`.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = EnvModRef)))]
#[sabi(missing_field(panic))]
pub struct EnvMod {
    /// [`EnvPlugin::NAME`].
    pub name: extern "C" fn() -> RStr<'static>,
    /// [`EnvPlugin::init`], once per process.
    pub init: extern "C" fn(args: &InitArgs) -> RResult<(), RString>,
    /// [`EnvPlugin::get`]: the value of a variable, or none when unset.
    pub get: extern "C" fn(name: RStr<'_>) -> ROption<RString>,
    /// Drops the plugin (at process exit).
    #[sabi(last_prefix_field)]
    pub finalize: extern "C" fn() -> RResult<(), RString>,
}

impl RootModule for EnvModRef {
    abi_stable::declare_root_module_statics! {EnvModRef}
    const BASE_NAME: &'static str = "oxccl_env";
    const NAME: &'static str = "oxccl env plugin";
    const VERSION_STRINGS: VersionStrings = VersionStrings::new(SDK_VERSION);
}

/// The library's plugin slot, which [`crate::export_env_plugin!`] declares
/// in the plugin's crate and implements this for.
pub trait EnvSlot: EnvPlugin {
    fn slot() -> &'static Slot<Self>;
}

extern "C" fn name<T: EnvSlot>() -> RStr<'static> {
    RStr::from_str(T::NAME.to_str().unwrap_or("(name not UTF-8)"))
}

extern "C" fn init<T: EnvSlot>(args: &InitArgs) -> RResult<(), RString> {
    guarded("init", || {
        let nccl = NcclVersion {
            major: args.major,
            minor: args.minor,
            patch: args.patch,
            suffix: args.suffix.to_string(),
        };
        T::slot().init_with(&nccl, NcclLogger::from_sink(args.log, NCCL_ENV))
    })
}

extern "C" fn get<T: EnvSlot>(name: RStr<'_>) -> ROption<RString> {
    // `get_owned` catches the plugin's panics; this one guards the rest.
    catch_unwind(|| T::slot().get_owned(name.as_str()))
        .ok()
        .flatten()
        .map(RString::from)
        .into()
}

extern "C" fn finalize<T: EnvSlot>() -> RResult<(), RString> {
    guarded("finalize", || {
        T::slot().finalize();
        Ok(())
    })
}

/// The module of an env plugin.
pub fn module<T: EnvSlot>() -> EnvModRef {
    EnvMod {
        name: name::<T>,
        init: init::<T>,
        get: get::<T>,
        finalize: finalize::<T>,
    }
    .leak_into_prefix()
}

/// Builds the module when the host first asks (abi_stable keeps it).
extern "C" fn constructor<T: EnvSlot>() -> RootModuleResult {
    match catch_unwind(module::<T>) {
        // SAFETY: erasing the prefix type is how abi_stable hands a root
        // module to its loader, which casts it back to `EnvModRef` after
        // checking the layouts.
        Ok(m) => RResult::ROk(unsafe { m.to_prefix_ref().cast::<ErasedPrefix>() }),
        Err(_) => RResult::RErr(RootModuleError::Unwound),
    }
}

/// The header [`crate::export_env_plugin!`] exports as [`SYMBOL`].
pub const fn lib_header<T: EnvSlot>() -> LibHeader {
    // SAFETY: `constructor::<T>` returns an `EnvModRef`, the module type
    // given, as `from_constructor` requires.
    unsafe { LibHeader::from_constructor::<EnvModRef>(constructor::<T>, CheckTypeLayout::Yes) }
}
