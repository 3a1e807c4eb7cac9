//! The plugin interfaces of oxccl.
//!
//! A plugin (network, tuner, profiler, env) depends on this crate only: it holds the
//! traits the core calls and the types crossing that boundary, and no logic of
//! the core. The network interface mirrors NCCL's `ncclNet` (devices,
//! properties, non-blocking listen/connect/accept, tagged `isend`/`irecv`/`test`)
//! so that one implementation can be exported through NCCL's C ABI as well.

pub mod env;
pub mod ffi;
pub mod handle;
pub mod loader;
pub mod logger;
pub mod net;
pub mod net_prof;
pub mod plugin_error;
pub mod profiler;
pub mod stable;
pub mod tuner;

pub use net::{
    builtin_nets, BuiltinNet, DeviceMr, DmaBuf, ListenComm, MrHandle, Net, NetError, NetEvent,
    NetHandle, NetProf, NetProperties, NetResult, PtrType, RecvComm, Request, SendComm,
    NET_HANDLE_MAXSIZE,
};

pub use env::{EnvPlugin, NcclVersion};
pub use logger::NcclLogger;
pub use plugin_error::{PluginError, PluginResult};
pub use profiler::{
    CollApiEvent, CollEvent, Event, EventKind, P2pApiEvent, P2pEvent, Profiler, ProfilerInit,
    ProxyOpEvent, StateArgs, StateUpdate,
};
pub use tuner::{
    Algorithm, CollInfoRequest, CollType, CostTable, NvlDomainInfo, Protocol, Tuner, TunerInit,
};

/// Re-exported so that the export macros can name it from plugin crates
/// that do not depend on it themselves.
pub use abi_stable;

/// Re-exported so that plugin crates can register built-ins without naming
/// `inventory` in their own manifests.
pub use inventory;
