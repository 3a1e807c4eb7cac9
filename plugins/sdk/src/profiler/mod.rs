//! The profiler interface for plugin authors: NCCL reports events (groups,
//! collectives, point-to-point operations, proxy operations and steps,
//! kernel channels, network plugin events) as start/stop pairs with state
//! updates in between. Implement [`Profiler`] and export it with
//! [`crate::export_profiler_plugin!`]; the glue in [`export`] turns every
//! ABI version's descriptors (v1 to v7) into the one [`Event`] view below.
//!
//! The whole profiler kind lives in this folder: the frozen C layouts of
//! each version ([`abi`], also reachable as `ffi::profiler`), the export
//! adapters ([`export`]) and the loader that drives a profiler library from
//! the core ([`load`]), both generated from one list of versions
//! ([`versions`]).

use std::ffi::CStr;

use crate::logger::NcclLogger;
use crate::plugin_error::PluginResult;

pub mod abi;
pub mod export;
pub mod load;
pub mod versions;

pub use abi::{
    NCCL_PROFILE_COLL, NCCL_PROFILE_COLL_API, NCCL_PROFILE_GROUP, NCCL_PROFILE_GROUP_API,
    NCCL_PROFILE_KERNEL_CH, NCCL_PROFILE_KERNEL_LAUNCH, NCCL_PROFILE_KERNEL_PHASE,
    NCCL_PROFILE_NET_PLUGIN, NCCL_PROFILE_P2P, NCCL_PROFILE_P2P_API, NCCL_PROFILE_PROXY_CTRL,
    NCCL_PROFILE_PROXY_OP, NCCL_PROFILE_PROXY_STEP,
};

/// What `init` receives. Fields a version does not pass are `None`
/// (v1 to v3 pass only the mask; v4 adds the communicator's name, hash,
/// size and rank; v5 to v7 the communicator id).
#[derive(Debug, Clone)]
pub struct ProfilerInit {
    pub comm_id: Option<u64>,
    pub comm_name: Option<String>,
    pub n_nodes: Option<i32>,
    pub n_ranks: Option<i32>,
    pub rank: Option<i32>,
    /// NCCL's logger (subsystem `NCCL_PROFILE`; stderr before v4).
    pub logger: NcclLogger,
}

/// A collective as NCCL runs it (`NCCL_PROFILE_COLL`).
#[derive(Debug, Clone, Copy)]
pub struct CollEvent<'a> {
    pub seq_number: u64,
    /// "AllReduce", "Broadcast", …
    pub func: &'a str,
    pub count: usize,
    pub root: i32,
    pub datatype: &'a str,
    pub algo: &'a str,
    pub proto: &'a str,
    pub n_channels: u8,
    pub n_warps: u8,
    /// The communicator's hash (v1 to v3 carry it per event).
    pub comm_hash: Option<u64>,
    pub send_buff: usize,
    pub recv_buff: usize,
    /// The caller's tag for the call (v7; 0 for none and before v7).
    pub user_tag: u64,
}

/// A send or receive as NCCL runs it (`NCCL_PROFILE_P2P`).
#[derive(Debug, Clone, Copy)]
pub struct P2pEvent<'a> {
    /// "Send" or "Recv".
    pub func: &'a str,
    pub count: usize,
    pub datatype: &'a str,
    pub peer: i32,
    /// v4 and later.
    pub n_channels: Option<u8>,
    pub comm_hash: Option<u64>,
    pub buff: usize,
    /// The caller's tag for the call (v7; 0 for none and before v7).
    pub user_tag: u64,
}

/// A collective as the application called it (`NCCL_PROFILE_COLL_API`, v5+).
#[derive(Debug, Clone, Copy)]
pub struct CollApiEvent<'a> {
    pub func: &'a str,
    pub count: usize,
    pub datatype: &'a str,
    pub root: i32,
    pub stream: usize,
    pub graph_captured: bool,
    /// The caller's tag for the call (v7; 0 for none and before v7).
    pub user_tag: u64,
}

/// A send/receive as the application called it (`NCCL_PROFILE_P2P_API`, v5+).
#[derive(Debug, Clone, Copy)]
pub struct P2pApiEvent<'a> {
    pub func: &'a str,
    pub count: usize,
    pub datatype: &'a str,
    pub stream: usize,
    pub graph_captured: bool,
    /// The caller's tag for the call (v7; 0 for none and before v7).
    pub user_tag: u64,
}

/// A network operation of the proxy thread (`NCCL_PROFILE_PROXY_OP`).
#[derive(Debug, Clone, Copy)]
pub struct ProxyOpEvent {
    pub pid: i32,
    pub channel_id: u8,
    pub peer: i32,
    pub n_steps: i32,
    pub chunk_size: i32,
    pub is_send: bool,
}

/// What an event is, whatever the ABI version it came through.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum EventKind<'a> {
    /// `NCCL_PROFILE_GROUP`: a group of operations launched together.
    Group,
    /// `NCCL_PROFILE_GROUP_API` (v5+): ncclGroupStart..End as called.
    GroupApi {
        graph_captured: bool,
        depth: i32,
    },
    CollApi(CollApiEvent<'a>),
    P2pApi(P2pApiEvent<'a>),
    /// `NCCL_PROFILE_KERNEL_LAUNCH` (v5+).
    KernelLaunch {
        stream: usize,
    },
    Coll(CollEvent<'a>),
    P2p(P2pEvent<'a>),
    ProxyOp(ProxyOpEvent),
    /// `NCCL_PROFILE_PROXY_STEP`: one step of a proxy operation.
    ProxyStep {
        step: i32,
    },
    /// `NCCL_PROFILE_PROXY_CTRL`: the proxy thread's own activity.
    ProxyCtrl,
    /// `NCCL_PROFILE_KERNEL_CH` (v3+): a kernel's work on one channel;
    /// `p_timer` is the GPU's globaltimer at start (v4+).
    KernelCh {
        channel_id: u8,
        p_timer: Option<u64>,
    },
    /// `NCCL_PROFILE_NET_PLUGIN` (v3+): an event the net plugin defined;
    /// `id` names the layout of `data` (`NCCL_PROFILER_NET_TYPE_*`).
    NetPlugin {
        id: i64,
        data: usize,
    },
    /// `NCCL_PROFILE_KERNEL_PHASE` (v7): one phase of a kernel on a
    /// channel, child of its kernel-channel event; `phase_id` 0, 1, 2 are
    /// "initial_sync", "compute", "final_sync"; `p_timer` is the GPU's
    /// globaltimer at the phase's start (its end comes with
    /// [`StateArgs::KernelChStop`] and state
    /// `NCCL_PROFILER_KERNEL_PHASE_STOP`).
    KernelPhase {
        channel_id: u8,
        phase_id: u8,
        phase_name: &'a str,
        p_timer: u64,
    },
    /// A type this SDK does not decode (copy-engine events of v6 and v7,
    /// newer ones): the raw `NCCL_PROFILE_*` bit.
    Other(u64),
}

impl EventKind<'_> {
    /// The caller's tag of a call's event (collective, p2p and their API
    /// events; v7 passes it, older versions give 0), `None` for the kinds
    /// that carry none.
    pub fn user_tag(&self) -> Option<u64> {
        match self {
            EventKind::Coll(c) => Some(c.user_tag),
            EventKind::P2p(p) => Some(p.user_tag),
            EventKind::CollApi(c) => Some(c.user_tag),
            EventKind::P2pApi(p) => Some(p.user_tag),
            _ => None,
        }
    }

    /// The `NCCL_PROFILE_*` bit of this kind.
    pub fn type_bit(&self) -> u64 {
        (match self {
            EventKind::Group => NCCL_PROFILE_GROUP,
            EventKind::GroupApi { .. } => NCCL_PROFILE_GROUP_API,
            EventKind::CollApi(_) => NCCL_PROFILE_COLL_API,
            EventKind::P2pApi(_) => NCCL_PROFILE_P2P_API,
            EventKind::KernelLaunch { .. } => NCCL_PROFILE_KERNEL_LAUNCH,
            EventKind::Coll(_) => NCCL_PROFILE_COLL,
            EventKind::P2p(_) => NCCL_PROFILE_P2P,
            EventKind::ProxyOp(_) => NCCL_PROFILE_PROXY_OP,
            EventKind::ProxyStep { .. } => NCCL_PROFILE_PROXY_STEP,
            EventKind::ProxyCtrl => NCCL_PROFILE_PROXY_CTRL,
            EventKind::KernelCh { .. } => NCCL_PROFILE_KERNEL_CH,
            EventKind::NetPlugin { .. } => NCCL_PROFILE_NET_PLUGIN,
            EventKind::KernelPhase { .. } => NCCL_PROFILE_KERNEL_PHASE,
            EventKind::Other(t) => return *t,
        }) as u64
    }
}

/// One `startEvent` descriptor. It lives only for the call: copy what you
/// keep.
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    pub kind: EventKind<'a>,
    /// The rank of the communicator that emits it.
    pub rank: i32,
    /// The parent's handle as NCCL passes it (the pointer this plugin
    /// returned for the parent event; 0 for none). Opaque: compare, do not
    /// dereference.
    pub parent: usize,
}

/// Extra data of a state update, chosen by the state value.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum StateArgs {
    None,
    /// Proxy op/step states: bytes moved (and steps, before v4).
    Transfer {
        trans_size: usize,
        steps: Option<i32>,
    },
    /// `NCCL_PROFILER_PROXY_CTRL_APPEND_END`.
    AppendedProxyOps(i32),
    /// `NCCL_PROFILER_NET_PLUGIN_UPDATE`: the net plugin's data.
    NetPlugin {
        data: usize,
    },
    /// `NCCL_PROFILER_KERNEL_CH_STOP`, and `NCCL_PROFILER_KERNEL_PHASE_STOP`
    /// (v7): GPU globaltimer at stop.
    KernelChStop {
        p_timer: u64,
    },
}

/// One `recordEventState` call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StateUpdate {
    /// `NCCL_PROFILER_*` state value (see [`abi`]).
    pub state: i32,
    pub args: StateArgs,
}

/// A profiler plugin: one instance per communicator (`init` .. `finalize`).
/// Calls come from application and proxy threads at once. `stop_event` and
/// `record_event_state` get only the event (NCCL passes no context to
/// them), so an event keeps what it needs (e.g. an `Arc` of shared state).
pub trait Profiler: Send + Sync + Sized + 'static {
    /// The name NCCL prints when it loads the plugin.
    const NAME: &'static CStr;
    /// What the plugin keeps for an event between start and stop.
    type Event: Send + 'static;

    /// Creates the instance and sets `activation_mask` (`NCCL_PROFILE_*`
    /// bits) to the event types wanted. An error disables the plugin.
    fn init(args: &ProfilerInit, activation_mask: &mut i32) -> PluginResult<Self>;

    /// An event begins; `None` means "not tracked" (NCCL then makes no more
    /// calls for it).
    fn start_event(&self, event: &Event<'_>) -> Option<Self::Event>;

    /// The event ends; its handle is not used again.
    fn stop_event(event: Self::Event);

    /// As [`Profiler::stop_event`], also told the handle NCCL held for the
    /// event: the value its children received as [`Event::parent`]. A
    /// plugin that links children to parents after the fact (when it writes
    /// its output) overrides this one; the default calls `stop_event`.
    fn stop_event_with_handle(event: Self::Event, _handle: usize) {
        Self::stop_event(event)
    }

    /// A state change of a tracked event.
    fn record_event_state(_event: &mut Self::Event, _update: &StateUpdate) {}

    /// The communicator ends (NCCL's `finalize`).
    fn finalize(self) -> PluginResult<()> {
        Ok(())
    }
}
