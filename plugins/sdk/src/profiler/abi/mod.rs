//! NCCL's profiler plugin ABI, `ncclProfiler_vN_t`, one frozen file per
//! version as NCCL keeps `profiler_v1.h` … `profiler_v7.h`, plus the event
//! layouts NCCL's own net plugins report through the profiler callback
//! (`net_ib_v1`, `net_socket_v1`).
//!
//! A library exports a vtable under [`v5::SYMBOL`] (`ncclProfiler_v5`) and so
//! on; the loader takes the newest it knows. NCCL 2.28 loads v1 to v5; v6
//! (copy-engine events) came with 2.29; v7 (the caller's tag on each call's
//! events, kernel phases) with 2.31.
//!
//! The contract common to every version:
//! - `init` runs once per communicator and returns a context; it also sets
//!   the activation mask (`NCCL_PROFILE_*` bits) of the events wanted. The
//!   mask is one process-wide `int` that NCCL reads on every event, so the
//!   plugin may change it later (atomically);
//! - `startEvent` gets a descriptor whose `ty` selects the member of its
//!   union; a NULL `*eHandle` means "not tracked", and NCCL then makes no
//!   further call for that event; the descriptor lives only for the call;
//! - `stopEvent` ends a handle, which is not used afterwards;
//! - `recordEventState` reports a state change (`NCCL_PROFILER_*` states) of
//!   the events that have states (group API, proxy op and step, proxy
//!   control, kernel channel, net plugin);
//! - calls come from application threads and NCCL's proxy threads at once;
//! - only `init` may fail (NCCL then disables the plugin); every other call
//!   should return success.

use std::os::raw::{c_char, c_int, c_void};

use crate::ffi::types::{Logger, NcclResult};

pub mod net_ib_v1;
pub mod net_socket_v1;
pub mod v1;
pub mod v2;
pub mod v3;
pub mod v4;
pub mod v5;
pub mod v6;
pub mod v7;

/// Event type bits: `ty` of a descriptor (`u8` before v5, `u64` from v5)
/// and the activation mask written by `init`.
pub const NCCL_PROFILE_GROUP: c_int = 1 << 0;
/// A collective as NCCL runs it (after grouping).
pub const NCCL_PROFILE_COLL: c_int = 1 << 1;
/// A point-to-point operation as NCCL runs it.
pub const NCCL_PROFILE_P2P: c_int = 1 << 2;
/// The proxy's work for one channel of an operation.
pub const NCCL_PROFILE_PROXY_OP: c_int = 1 << 3;
/// One network transfer (step) of a proxy operation.
pub const NCCL_PROFILE_PROXY_STEP: c_int = 1 << 4;
/// The proxy thread when it is not moving data (idle, sleeping, appending).
pub const NCCL_PROFILE_PROXY_CTRL: c_int = 1 << 5;
/// A channel of a kernel (v3 and later).
pub const NCCL_PROFILE_KERNEL_CH: c_int = 1 << 6;
/// An event defined by the net plugin (v3 and later).
pub const NCCL_PROFILE_NET_PLUGIN: c_int = 1 << 7;
/// A `ncclGroupStart`/`ncclGroupEnd` pair as the user called it (v5).
pub const NCCL_PROFILE_GROUP_API: c_int = 1 << 8;
/// A collective call as the user made it (v5).
pub const NCCL_PROFILE_COLL_API: c_int = 1 << 9;
/// A send or receive call as the user made it (v5).
pub const NCCL_PROFILE_P2P_API: c_int = 1 << 10;
/// A kernel launch (v5).
pub const NCCL_PROFILE_KERNEL_LAUNCH: c_int = 1 << 11;
/// A collective run by the copy engines (v6).
pub const NCCL_PROFILE_CE_COLL: c_int = 1 << 12;
/// A copy-engine synchronisation (v6).
pub const NCCL_PROFILE_CE_SYNC: c_int = 1 << 13;
/// A batch of copy-engine operations (v6).
pub const NCCL_PROFILE_CE_BATCH: c_int = 1 << 14;
/// One phase of a kernel on a channel, below its kernel-channel event (v7).
pub const NCCL_PROFILE_KERNEL_PHASE: c_int = 1 << 15;

/// `ncclProfilerEventState_t` (the same enum for every version):
/// `eState` of `recordEventState`.
pub type EventState = c_int;
/// Proxy-op states, used up to v3 (from v4 the step events carry this).
pub const NCCL_PROFILER_PROXY_OP_SEND_POSTED: EventState = 0;
pub const NCCL_PROFILER_PROXY_OP_SEND_REM_FIFO_WAIT: EventState = 1;
pub const NCCL_PROFILER_PROXY_OP_SEND_TRANSMITTED: EventState = 2;
pub const NCCL_PROFILER_PROXY_OP_SEND_DONE: EventState = 3;
pub const NCCL_PROFILER_PROXY_OP_RECV_POSTED: EventState = 4;
pub const NCCL_PROFILER_PROXY_OP_RECV_RECEIVED: EventState = 5;
pub const NCCL_PROFILER_PROXY_OP_RECV_TRANSMITTED: EventState = 6;
pub const NCCL_PROFILER_PROXY_OP_RECV_DONE: EventState = 7;
/// v4 and later: the proxy op starts progressing.
pub const NCCL_PROFILER_PROXY_OP_IN_PROGRESS_V4: EventState = 19;
/// Proxy step: a send waits for the GPU to produce its data.
pub const NCCL_PROFILER_PROXY_STEP_SEND_GPU_WAIT: EventState = 8;
/// Proxy step (v4 and later): a send waits for the receiver's credit.
pub const NCCL_PROFILER_PROXY_STEP_SEND_PEER_WAIT_V4: EventState = 20;
/// Proxy step: a send is on the network.
pub const NCCL_PROFILER_PROXY_STEP_SEND_WAIT: EventState = 9;
/// Proxy step: a receive waits for the network.
pub const NCCL_PROFILER_PROXY_STEP_RECV_WAIT: EventState = 10;
/// Proxy step: a receive waits for its flush to the GPU.
pub const NCCL_PROFILER_PROXY_STEP_RECV_FLUSH_WAIT: EventState = 11;
/// Proxy step: a receive waits for the GPU to consume the data.
pub const NCCL_PROFILER_PROXY_STEP_RECV_GPU_WAIT: EventState = 12;
/// Proxy control states.
pub const NCCL_PROFILER_PROXY_CTRL_IDLE: EventState = 13;
pub const NCCL_PROFILER_PROXY_CTRL_ACTIVE: EventState = 14;
pub const NCCL_PROFILER_PROXY_CTRL_SLEEP: EventState = 15;
pub const NCCL_PROFILER_PROXY_CTRL_WAKEUP: EventState = 16;
pub const NCCL_PROFILER_PROXY_CTRL_APPEND: EventState = 17;
pub const NCCL_PROFILER_PROXY_CTRL_APPEND_END: EventState = 18;
/// A net-plugin event was updated.
pub const NCCL_PROFILER_NET_PLUGIN_UPDATE: EventState = 21;
/// A kernel channel stopped (its end timestamp comes in the state args).
pub const NCCL_PROFILER_KERNEL_CH_STOP: EventState = 22;
/// Group API (v5): `ncclGroupStart` returned.
pub const NCCL_PROFILER_GROUP_START_API_STOP: EventState = 23;
/// Group API (v5): `ncclGroupEnd` was entered.
pub const NCCL_PROFILER_GROUP_END_API_START: EventState = 24;
/// Copy-engine states (v6).
pub const NCCL_PROFILER_CE_COLL_START: EventState = 25;
pub const NCCL_PROFILER_CE_COLL_COMPLETE: EventState = 26;
pub const NCCL_PROFILER_CE_SYNC_START: EventState = 27;
pub const NCCL_PROFILER_CE_SYNC_COMPLETE: EventState = 28;
pub const NCCL_PROFILER_CE_BATCH_START: EventState = 29;
pub const NCCL_PROFILER_CE_BATCH_COMPLETE: EventState = 30;
/// A kernel phase ended (v7): its end time comes in the kernel-channel
/// member of the state arguments.
pub const NCCL_PROFILER_KERNEL_PHASE_STOP: EventState = 31;

/// The net-plugin id of a `netPlugin` event: the low
/// `NCCL_PROFILER_NET_VER_BITS` bits are the version of the event layout,
/// the next bits the network type.
pub const NCCL_PROFILER_NET_VER_BITS: u32 = 16;
/// Version part of a net-plugin id.
pub const NCCL_PROFILER_NET_VER_MASK: u32 = !0u32 >> NCCL_PROFILER_NET_VER_BITS;
/// Type part of a net-plugin id.
pub const NCCL_PROFILER_NET_TYPE_MASK: u32 = !0u32 << NCCL_PROFILER_NET_VER_BITS;
/// Type part: NCCL's InfiniBand plugin ([`net_ib_v1`]).
pub const NCCL_PROFILER_NET_TYPE_IB: u32 = 1 << NCCL_PROFILER_NET_VER_BITS;
/// Type part: NCCL's socket plugin ([`net_socket_v1`]).
pub const NCCL_PROFILER_NET_TYPE_SOCK: u32 = 2 << NCCL_PROFILER_NET_VER_BITS;

/// The vtable of every version: `name` (for logs), then these entries,
/// `init` being the one that changes between versions ([`InitV1Fn`],
/// [`InitV4Fn`], [`InitV5Fn`]); `D` and `A` are the version's descriptor
/// and state-argument types.
macro_rules! vtable {
    ($(#[$m:meta])* $name:ident, $init:ty, $descr:ty, $args:ty) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy)]
        pub struct $name {
            pub name: *const std::os::raw::c_char,
            pub init: Option<$init>,
            pub start_event: Option<$crate::profiler::abi::StartEventFn<$descr>>,
            pub stop_event: Option<$crate::profiler::abi::StopEventFn>,
            pub record_event_state: Option<$crate::profiler::abi::RecordEventStateFn<$args>>,
            pub finalize: Option<$crate::profiler::abi::FinalizeFn>,
        }
    };
}
pub(crate) use vtable;

/// `init` of v1 to v3: writes the plugin's context into `*context` and the
/// `NCCL_PROFILE_*` bits it wants into `*e_activation_mask`, for every
/// communicator. An error disables the plugin.
pub type InitV1Fn =
    unsafe extern "C" fn(context: *mut *mut c_void, e_activation_mask: *mut c_int) -> NcclResult;
/// `init` of v4: v1's, told the communicator (name, hash, node count, size,
/// the caller's rank) and given NCCL's logger.
pub type InitV4Fn = unsafe extern "C" fn(
    context: *mut *mut c_void,
    e_activation_mask: *mut c_int,
    comm_name: *const c_char,
    comm_hash: u64,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: Logger,
) -> NcclResult;
/// `init` of v5 to v7: v4's with the communicator's id first and no hash.
pub type InitV5Fn = unsafe extern "C" fn(
    context: *mut *mut c_void,
    comm_id: u64,
    e_activation_mask: *mut c_int,
    comm_name: *const c_char,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    logfn: Logger,
) -> NcclResult;
/// `startEvent`: writes a handle into `*e_handle`, or NULL to leave the
/// event untracked. `e_descr` is valid only during the call.
pub type StartEventFn<D> = unsafe extern "C" fn(
    context: *mut c_void,
    e_handle: *mut *mut c_void,
    e_descr: *mut D,
) -> NcclResult;
/// `stopEvent`: ends an event; its handle is not used again.
pub type StopEventFn = unsafe extern "C" fn(e_handle: *mut c_void) -> NcclResult;
/// `recordEventState`: a state change of an event, with the attributes it
/// updates (`e_state_args` may be NULL).
pub type RecordEventStateFn<A> = unsafe extern "C" fn(
    e_handle: *mut c_void,
    e_state: EventState,
    e_state_args: *mut A,
) -> NcclResult;
/// `finalize`: frees the context made by `init`, when its communicator is
/// destroyed.
pub type FinalizeFn = unsafe extern "C" fn(context: *mut c_void) -> NcclResult;

#[cfg(test)]
mod symbol_tests {
    use std::ffi::CStr;

    /// The names NCCL's loader looks up with dlsym (src/plugin/profiler/profiler_vN.cc).
    #[test]
    fn symbols_are_the_names_nccl_looks_up() {
        let all: [(&[u8], &str); 7] = [
            (super::v1::SYMBOL, "ncclProfiler_v1"),
            (super::v2::SYMBOL, "ncclProfiler_v2"),
            (super::v3::SYMBOL, "ncclProfiler_v3"),
            (super::v4::SYMBOL, "ncclProfiler_v4"),
            (super::v5::SYMBOL, "ncclProfiler_v5"),
            (super::v6::SYMBOL, "ncclProfiler_v6"),
            (super::v7::SYMBOL, "ncclProfiler_v7"),
        ];
        for (sym, name) in all {
            assert_eq!(CStr::from_bytes_with_nul(sym).unwrap().to_str(), Ok(name));
        }
    }

    /// A net-plugin id splits into the type and version masks.
    #[test]
    fn net_plugin_id_masks() {
        let id = super::NCCL_PROFILER_NET_TYPE_IB | super::net_ib_v1::NET_IB_VER;
        assert_eq!(id & super::NCCL_PROFILER_NET_VER_MASK, 1);
        assert_eq!(id & super::NCCL_PROFILER_NET_TYPE_MASK, 0x1_0000);
        assert_eq!(super::NCCL_PROFILER_NET_TYPE_SOCK, 0x2_0000);
    }
}
