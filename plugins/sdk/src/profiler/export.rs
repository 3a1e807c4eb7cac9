//! Exports a Rust [`Profiler`] as NCCL's `ncclProfiler_v1` … `_v7`, so one
//! implementation loads into NCCL 2.23 and later (2.28 takes v1 to v5, 2.31
//! v1 to v7) and into oxccl. What differs per version is adapted here, into one
//! [`Event`] view: v1 passes function, type, algorithm and protocol as
//! numbers (named here), v2 and v3 as strings with the communicator hash per
//! event, v3 adds kernel-channel and net-plugin events, v4 passes the
//! communicator (name, hash, ranks, logger) to `init` and moves state data
//! (proxy step, net plugin, kernel timer), v5 widens the type to 64 bits
//! and adds the API-level events, v6 adds copy-engine events (shown as
//! [`EventKind::Other`]), v7 the caller's tag on each call's events and
//! kernel-phase events.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use super::abi::*;
use crate::ffi::types::*;
use crate::logger::NcclLogger;
use crate::plugin_error::{PluginError, PluginResult};
use crate::profiler::*;

/// The logger of the first `init` that had one: `stopEvent` and
/// `recordEventState` get no context, so their warnings need a global.
static LOGGER: OnceLock<NcclLogger> = OnceLock::new();

fn logger() -> NcclLogger {
    LOGGER
        .get()
        .copied()
        .unwrap_or_else(|| NcclLogger::stderr(NCCL_PROFILE))
}

fn guard(what: &str, f: impl FnOnce() -> PluginResult<()>) -> NcclResult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => NCCL_SUCCESS,
        Ok(Err(e)) => {
            logger().warn(&format!("profiler {what}: {e}"));
            e.code()
        }
        Err(_) => {
            logger().warn(&format!(
                "profiler {what}: panic inside the plugin (caught at the C boundary)"
            ));
            NCCL_INTERNAL_ERROR
        }
    }
}

fn null(what: &str) -> PluginError {
    PluginError::InvalidArgument(format!("{what} is NULL"))
}

/// # Safety
/// `p` is NULL or a NUL-terminated string valid for `'a`.
unsafe fn text<'a>(p: *const c_char) -> &'a str {
    if p.is_null() {
        return "";
    }
    // SAFETY: per the function contract.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("?")
}

fn name_of(table: &'static [&'static str], i: u8) -> &'static str {
    table.get(i as usize).copied().unwrap_or("unknown")
}

/// `ncclFunc_t` names as NCCL prints them (v1 passes the number).
const FUNCS: &[&str] = &[
    "Broadcast",
    "Reduce",
    "AllGather",
    "ReduceScatter",
    "AllReduce",
    "SendRecv",
    "Send",
    "Recv",
];
/// `ncclDataType_t` names as `ncclDatatypeToString` prints them.
const TYPES: &[&str] = &[
    "ncclInt8",
    "ncclUint8",
    "ncclInt32",
    "ncclUint32",
    "ncclInt64",
    "ncclUint64",
    "ncclFloat16",
    "ncclFloat32",
    "ncclFloat64",
    "ncclBfloat16",
    "ncclFloat8e4m3",
    "ncclFloat8e5m2",
];
const ALGOS: &[&str] = &[
    "Tree",
    "Ring",
    "CollNetDirect",
    "CollNetChain",
    "NVLS",
    "NVLSTree",
    "PAT",
];
const PROTOS: &[&str] = &["LL", "LL128", "Simple"];

fn proxy_op(
    pid: c_int,
    channel_id: u8,
    peer: c_int,
    n_steps: c_int,
    chunk: c_int,
    is_send: c_int,
) -> EventKind<'static> {
    EventKind::ProxyOp(ProxyOpEvent {
        pid,
        channel_id,
        peer,
        n_steps,
        chunk_size: chunk,
        is_send: is_send != 0,
    })
}

/// Decodes a v1 descriptor.
///
/// # Safety
/// `d` is a valid descriptor whose union member matches `ty`.
unsafe fn event_v1(d: &v1::EventDescrV1) -> Event<'_> {
    let ty = d.ty as c_int;
    // SAFETY: the member read is the one `ty` selects (NCCL's contract).
    let kind = unsafe {
        match ty {
            NCCL_PROFILE_GROUP => EventKind::Group,
            NCCL_PROFILE_COLL => {
                let c = &d.detail.coll;
                EventKind::Coll(CollEvent {
                    seq_number: c.seq_number,
                    func: name_of(FUNCS, c.func),
                    count: c.count,
                    root: c.root,
                    datatype: name_of(TYPES, c.datatype),
                    algo: name_of(ALGOS, c.algo),
                    proto: name_of(PROTOS, c.proto),
                    n_channels: c.n_max_channels,
                    n_warps: c.n_warps,
                    comm_hash: Some(c.comm_hash),
                    send_buff: c.send_buff as usize,
                    recv_buff: c.recv_buff as usize,
                    user_tag: 0,
                })
            }
            NCCL_PROFILE_P2P => {
                let p = &d.detail.p2p;
                EventKind::P2p(P2pEvent {
                    func: name_of(FUNCS, p.func),
                    count: p.count,
                    datatype: name_of(TYPES, p.datatype),
                    peer: p.peer,
                    n_channels: None,
                    comm_hash: Some(p.comm_hash),
                    buff: p.buff as usize,
                    user_tag: 0,
                })
            }
            NCCL_PROFILE_PROXY_OP => {
                let o = &d.detail.proxy_op;
                proxy_op(
                    o.pid,
                    o.channel_id,
                    o.peer,
                    o.n_steps,
                    o.chunk_size,
                    o.is_send,
                )
            }
            NCCL_PROFILE_PROXY_STEP => EventKind::ProxyStep {
                step: d.detail.proxy_step.step,
            },
            NCCL_PROFILE_PROXY_CTRL => EventKind::ProxyCtrl,
            other => EventKind::Other(other as u64),
        }
    };
    Event {
        kind,
        rank: d.rank,
        parent: d.parent_obj as usize,
    }
}

/// v2 and v3 share the string-based coll/p2p layout with a per-event hash.
macro_rules! decode_v2_v3 {
    ($d:expr, $extra:tt) => {{
        let d = $d;
        let ty = d.ty as c_int;
        // SAFETY: the member read is the one `ty` selects (NCCL's contract);
        // strings are NCCL's, valid for the call.
        let kind = unsafe {
            match ty {
                NCCL_PROFILE_GROUP => EventKind::Group,
                NCCL_PROFILE_COLL => {
                    let c = &d.detail.coll;
                    EventKind::Coll(CollEvent {
                        seq_number: c.seq_number,
                        func: text(c.func),
                        count: c.count,
                        root: c.root,
                        datatype: text(c.datatype),
                        algo: text(c.algo),
                        proto: text(c.proto),
                        n_channels: c.n_max_channels,
                        n_warps: c.n_warps,
                        comm_hash: Some(c.comm_hash),
                        send_buff: c.send_buff as usize,
                        recv_buff: c.recv_buff as usize,
                        user_tag: 0,
                    })
                }
                NCCL_PROFILE_P2P => {
                    let p = &d.detail.p2p;
                    EventKind::P2p(P2pEvent {
                        func: text(p.func),
                        count: p.count,
                        datatype: text(p.datatype),
                        peer: p.peer,
                        n_channels: None,
                        comm_hash: Some(p.comm_hash),
                        buff: p.buff as usize,
                        user_tag: 0,
                    })
                }
                NCCL_PROFILE_PROXY_OP => {
                    let o = &d.detail.proxy_op;
                    proxy_op(o.pid, o.channel_id, o.peer, o.n_steps, o.chunk_size, o.is_send)
                }
                NCCL_PROFILE_PROXY_STEP => EventKind::ProxyStep {
                    step: d.detail.proxy_step.step,
                },
                NCCL_PROFILE_PROXY_CTRL => EventKind::ProxyCtrl,
                other => decode_v2_v3!(@extra $extra, d, other),
            }
        };
        Event {
            kind,
            rank: d.rank,
            parent: d.parent_obj as usize,
        }
    }};
    (@extra none, $d:expr, $other:expr) => {
        EventKind::Other($other as u64)
    };
    (@extra v3, $d:expr, $other:expr) => {
        match $other {
            NCCL_PROFILE_KERNEL_CH => EventKind::KernelCh {
                channel_id: $d.detail.kernel_ch.channel_id,
                p_timer: None,
            },
            NCCL_PROFILE_NET_PLUGIN => EventKind::NetPlugin {
                id: $d.detail.net_plugin.id,
                data: $d.detail.net_plugin.data as usize,
            },
            other => EventKind::Other(other as u64),
        }
    };
}

/// v4 to v7: communicator-free coll/p2p descriptors; v5 and later add the
/// API-level events, v7 the caller's tag on them and kernel phases.
macro_rules! decode_v4_up {
    ($d:expr, $extra:tt) => {{
        let d = $d;
        let ty = d.ty as u64;
        // SAFETY: the member read is the one `ty` selects (NCCL's contract);
        // strings are NCCL's, valid for the call.
        let kind = unsafe {
            match ty as c_int {
                NCCL_PROFILE_GROUP => EventKind::Group,
                NCCL_PROFILE_COLL => {
                    let c = &d.detail.coll;
                    EventKind::Coll(CollEvent {
                        seq_number: c.seq_number,
                        func: text(c.func),
                        count: c.count,
                        root: c.root,
                        datatype: text(c.datatype),
                        algo: text(c.algo),
                        proto: text(c.proto),
                        n_channels: c.n_channels,
                        n_warps: c.n_warps,
                        comm_hash: None,
                        send_buff: c.send_buff as usize,
                        recv_buff: c.recv_buff as usize,
                        user_tag: decode_v4_up!(@tag $extra, c),
                    })
                }
                NCCL_PROFILE_P2P => {
                    let p = &d.detail.p2p;
                    EventKind::P2p(P2pEvent {
                        func: text(p.func),
                        count: p.count,
                        datatype: text(p.datatype),
                        peer: p.peer,
                        n_channels: Some(p.n_channels),
                        comm_hash: None,
                        buff: p.buff as usize,
                        user_tag: decode_v4_up!(@tag $extra, p),
                    })
                }
                NCCL_PROFILE_PROXY_OP => {
                    let o = &d.detail.proxy_op;
                    proxy_op(o.pid, o.channel_id, o.peer, o.n_steps, o.chunk_size, o.is_send)
                }
                NCCL_PROFILE_PROXY_STEP => EventKind::ProxyStep {
                    step: d.detail.proxy_step.step,
                },
                NCCL_PROFILE_PROXY_CTRL => EventKind::ProxyCtrl,
                NCCL_PROFILE_KERNEL_CH => EventKind::KernelCh {
                    channel_id: d.detail.kernel_ch.channel_id,
                    p_timer: Some(d.detail.kernel_ch.p_timer),
                },
                NCCL_PROFILE_NET_PLUGIN => EventKind::NetPlugin {
                    id: d.detail.net_plugin.id,
                    data: d.detail.net_plugin.data as usize,
                },
                _ => decode_v4_up!(@extra $extra, d, ty),
            }
        };
        Event {
            kind,
            rank: d.rank,
            parent: decode_v4_up!(@parent $extra, d, ty),
        }
    }};
    (@parent none, $d:expr, $ty:expr) => {
        $d.parent_obj as usize
    };
    (@parent v7, $d:expr, $ty:expr) => {
        decode_v4_up!(@parent api, $d, $ty)
    };
    // The caller's tag: v7's descriptors carry it, older ones none.
    (@tag v7, $c:expr) => {
        $c.user_tag
    };
    (@tag $other:tt, $c:expr) => {
        0
    };
    // v5+: a collective's or p2p's parent is its API event; where the
    // plugin did not track that one (a NULL parent), the group it ran in
    // (`parentGroup`, kept by NCCL for this) stands in.
    (@parent api, $d:expr, $ty:expr) => {{
        let d = $d;
        match ($ty as c_int, d.parent_obj.is_null()) {
            // SAFETY: the member read is the one the type selects.
            (NCCL_PROFILE_COLL, true) => unsafe { d.detail.coll.parent_group as usize },
            // SAFETY: as above.
            (NCCL_PROFILE_P2P, true) => unsafe { d.detail.p2p.parent_group as usize },
            _ => d.parent_obj as usize,
        }
    }};
    (@extra none, $d:expr, $ty:expr) => {
        EventKind::Other($ty)
    };
    (@extra v7, $d:expr, $ty:expr) => {
        match $ty as c_int {
            NCCL_PROFILE_KERNEL_PHASE => {
                let k = &$d.detail.kernel_phase;
                EventKind::KernelPhase {
                    channel_id: k.channel_id,
                    phase_id: k.phase_id,
                    phase_name: text(k.phase_name),
                    p_timer: k.p_timer,
                }
            }
            _ => decode_v4_up!(@api v7, $d, $ty),
        }
    };
    (@extra api, $d:expr, $ty:expr) => {
        decode_v4_up!(@api api, $d, $ty)
    };
    (@api $v:tt, $d:expr, $ty:expr) => {
        match $ty as c_int {
            NCCL_PROFILE_GROUP_API => EventKind::GroupApi {
                graph_captured: $d.detail.group_api.graph_captured,
                depth: $d.detail.group_api.group_depth,
            },
            NCCL_PROFILE_COLL_API => {
                let c = &$d.detail.coll_api;
                EventKind::CollApi(CollApiEvent {
                    func: text(c.func),
                    count: c.count,
                    datatype: text(c.datatype),
                    root: c.root,
                    stream: c.stream as usize,
                    graph_captured: c.graph_captured,
                    user_tag: decode_v4_up!(@tag $v, c),
                })
            }
            NCCL_PROFILE_P2P_API => {
                let p = &$d.detail.p2p_api;
                EventKind::P2pApi(P2pApiEvent {
                    func: text(p.func),
                    count: p.count,
                    datatype: text(p.datatype),
                    stream: p.stream as usize,
                    graph_captured: p.graph_captured,
                    user_tag: decode_v4_up!(@tag $v, p),
                })
            }
            NCCL_PROFILE_KERNEL_LAUNCH => EventKind::KernelLaunch {
                stream: $d.detail.kernel_launch.stream as usize,
            },
            _ => EventKind::Other($ty),
        }
    };
}

fn state_kind(state: EventState) -> u8 {
    match state {
        0..=12
        | NCCL_PROFILER_PROXY_OP_IN_PROGRESS_V4
        | NCCL_PROFILER_PROXY_STEP_SEND_PEER_WAIT_V4 => 1,
        NCCL_PROFILER_PROXY_CTRL_APPEND_END => 2,
        NCCL_PROFILER_NET_PLUGIN_UPDATE => 3,
        NCCL_PROFILER_KERNEL_CH_STOP | NCCL_PROFILER_KERNEL_PHASE_STOP => 4,
        _ => 0,
    }
}

/// # Safety
/// `a` is NULL or NCCL's state arguments, valid for the call.
unsafe fn state_v1(state: EventState, a: *const v1::EventStateArgsV1) -> StateUpdate {
    // SAFETY: per the function contract; the member read is the one the
    // state value selects.
    let args = match (unsafe { a.as_ref() }, state_kind(state)) {
        // SAFETY: as above.
        (Some(a), 1) => unsafe {
            StateArgs::Transfer {
                trans_size: a.proxy_op.trans_size,
                steps: Some(a.proxy_op.steps),
            }
        },
        // SAFETY: as above.
        (Some(a), 2) => StateArgs::AppendedProxyOps(unsafe { a.proxy_ctrl.appended_proxy_ops }),
        _ => StateArgs::None,
    };
    StateUpdate { state, args }
}

/// # Safety
/// `a` is NULL or NCCL's state arguments, valid for the call.
unsafe fn state_v4(state: EventState, a: *const v4::EventStateArgsV4) -> StateUpdate {
    // SAFETY: per the function contract; the member read is the one the
    // state value selects.
    let args = unsafe {
        match (a.as_ref(), state_kind(state)) {
            (Some(a), 1) => StateArgs::Transfer {
                trans_size: a.proxy_step.trans_size,
                steps: None,
            },
            (Some(a), 2) => StateArgs::AppendedProxyOps(a.proxy_ctrl.appended_proxy_ops),
            (Some(a), 3) => StateArgs::NetPlugin {
                data: a.net_plugin.data as usize,
            },
            (Some(a), 4) => StateArgs::KernelChStop {
                p_timer: a.kernel_ch.p_timer,
            },
            _ => StateArgs::None,
        }
    };
    StateUpdate { state, args }
}

/// # Safety
/// `out` is NULL or valid for a pointer write; `mask` likewise for an int.
unsafe fn init_common<T: Profiler>(
    out: *mut *mut c_void,
    mask: *mut c_int,
    args: ProfilerInit,
) -> NcclResult {
    if args.logger.has_sink() {
        let _ = LOGGER.set(args.logger);
    }
    guard("init", || {
        if out.is_null() {
            return Err(null("context"));
        }
        if mask.is_null() {
            return Err(null("eActivationMask"));
        }
        // SAFETY: checked non-null; NCCL's int, read and written in place.
        let m = unsafe { &mut *mask };
        let p = T::init(&args, m)?;
        // SAFETY: checked non-null.
        unsafe { *out = Box::into_raw(Box::new(p)) as *mut c_void };
        Ok(())
    })
}

fn start_common<T: Profiler>(
    ctx: *mut c_void,
    out: *mut *mut c_void,
    decode: impl FnOnce() -> Option<Event<'static>>,
) -> NcclResult {
    guard("startEvent", || {
        if out.is_null() {
            return Err(null("eHandle"));
        }
        // SAFETY: checked non-null; NCCL's `void**`. Cleared first so that
        // a failure below leaves "not tracked".
        unsafe { *out = std::ptr::null_mut() };
        // SAFETY: `ctx` is NULL or the Box made by `init_common::<T>`, alive
        // until finalize; shared access only (T: Sync).
        let p = unsafe { (ctx as *const T).as_ref() }.ok_or_else(|| null("context"))?;
        let ev = decode().ok_or_else(|| null("eDescr"))?;
        if let Some(h) = p.start_event(&ev) {
            // SAFETY: checked non-null above.
            unsafe { *out = Box::into_raw(Box::new(h)) as *mut c_void };
        }
        Ok(())
    })
}

/// Allocations of stopped events held back from reuse, oldest first.
/// A handle is the event's address, and a stopped event stays a parent:
/// NCCL (and oxccl) start a collective's kernel-channel events, naming it
/// as their parent, when its kernel's blocks start, long after the
/// collective itself stopped (at enqueue) where a GPU is busy or time-
/// sliced. Were its memory reused at once, the next event started would
/// take the same handle and be mistaken for that parent (seen on a GPU
/// shared by two processes). NCCL's example profiler keeps events in
/// pools for the same reason. The last `QUARANTINE` stopped events' memory
/// (a few MiB) waits here before it is freed.
static STOPPED: std::sync::Mutex<std::collections::VecDeque<Box<dyn Send>>> =
    std::sync::Mutex::new(std::collections::VecDeque::new());
const QUARANTINE: usize = 1 << 15;

unsafe extern "C" fn stop_event<T: Profiler>(h: *mut c_void) -> NcclResult {
    if h.is_null() {
        // NCCL does not stop untracked events; tolerate it anyway.
        return NCCL_SUCCESS;
    }
    let ptr = h as *mut T::Event;
    // SAFETY: a non-null handle was made by `start_common::<T>` (a Box of
    // T::Event) and is stopped once: the event is moved out here, and the
    // allocation, now holding nothing to drop, is kept as a MaybeUninit
    // box (same layout) until `QUARANTINE` later stops free it.
    let (ev, shell) = unsafe {
        let ev = std::ptr::read(ptr);
        (
            ev,
            Box::from_raw(ptr.cast::<std::mem::MaybeUninit<T::Event>>()),
        )
    };
    let old = {
        let mut q = STOPPED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        q.push_back(shell);
        (q.len() > QUARANTINE).then(|| q.pop_front()).flatten()
    };
    drop(old);
    guard("stopEvent", move || {
        T::stop_event_with_handle(ev, h as usize);
        Ok(())
    })
}

fn record_common<T: Profiler>(h: *mut c_void, update: impl FnOnce() -> StateUpdate) -> NcclResult {
    if h.is_null() {
        return NCCL_SUCCESS;
    }
    guard("recordEventState", || {
        // SAFETY: a live handle made by `start_common::<T>`; NCCL does not
        // use a handle from two threads at once.
        let ev = unsafe { &mut *(h as *mut T::Event) };
        T::record_event_state(ev, &update());
        Ok(())
    })
}

unsafe extern "C" fn finalize<T: Profiler>(ctx: *mut c_void) -> NcclResult {
    guard("finalize", || {
        if ctx.is_null() {
            return Err(null("context"));
        }
        // SAFETY: the Box made by `init_common::<T>`, finalized once.
        let p = unsafe { Box::from_raw(ctx as *mut T) };
        p.finalize()
    })
}

fn bare_init() -> ProfilerInit {
    ProfilerInit {
        comm_id: None,
        comm_name: None,
        n_nodes: None,
        n_ranks: None,
        rank: None,
        logger: NcclLogger::stderr(NCCL_PROFILE),
    }
}

unsafe extern "C" fn init_v1<T: Profiler>(ctx: *mut *mut c_void, mask: *mut c_int) -> NcclResult {
    // SAFETY: NCCL's out-parameters.
    unsafe { init_common::<T>(ctx, mask, bare_init()) }
}

#[allow(clippy::too_many_arguments)] // NCCL's signature
unsafe extern "C" fn init_v4<T: Profiler>(
    ctx: *mut *mut c_void,
    mask: *mut c_int,
    comm_name: *const c_char,
    comm_hash: u64,
    n_nodes: c_int,
    n_ranks: c_int,
    rank: c_int,
    log: Logger,
) -> NcclResult {
    let args = ProfilerInit {
        comm_id: Some(comm_hash),
        // SAFETY: NULL or NCCL's string, valid for the call (copied).
        comm_name: (!comm_name.is_null()).then(|| unsafe { text(comm_name) }.to_owned()),
        n_nodes: Some(n_nodes),
        n_ranks: Some(n_ranks),
        rank: Some(rank),
        logger: NcclLogger::new(log, NCCL_PROFILE),
    };
    // SAFETY: NCCL's out-parameters.
    unsafe { init_common::<T>(ctx, mask, args) }
}

#[allow(clippy::too_many_arguments)] // NCCL's signature
unsafe extern "C" fn init_v5<T: Profiler>(
    ctx: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    comm_name: *const c_char,
    n_nodes: c_int,
    n_ranks: c_int,
    rank: c_int,
    log: Logger,
) -> NcclResult {
    // SAFETY: same arguments as v4 in another order.
    unsafe { init_v4::<T>(ctx, mask, comm_name, comm_id, n_nodes, n_ranks, rank, log) }
}

// The descriptor borrows are widened to 'static for the closure only; the
// Event never outlives the start call (the trait takes `&Event<'_>`).
unsafe extern "C" fn start_v1<T: Profiler>(
    ctx: *mut c_void,
    out: *mut *mut c_void,
    d: *mut v1::EventDescrV1,
) -> NcclResult {
    // SAFETY: NULL or NCCL's descriptor, valid for this call.
    start_common::<T>(ctx, out, || unsafe { d.as_ref().map(|d| event_v1(d)) })
}

unsafe extern "C" fn start_v2<T: Profiler>(
    ctx: *mut c_void,
    out: *mut *mut c_void,
    d: *mut v2::EventDescrV2,
) -> NcclResult {
    start_common::<T>(ctx, out, || {
        // SAFETY: NULL or NCCL's descriptor, valid for this call.
        unsafe { d.as_ref() }.map(|d| decode_v2_v3!(d, none))
    })
}

unsafe extern "C" fn start_v3<T: Profiler>(
    ctx: *mut c_void,
    out: *mut *mut c_void,
    d: *mut v3::EventDescrV3,
) -> NcclResult {
    start_common::<T>(ctx, out, || {
        // SAFETY: NULL or NCCL's descriptor, valid for this call.
        unsafe { d.as_ref() }.map(|d| decode_v2_v3!(d, v3))
    })
}

unsafe extern "C" fn start_v4<T: Profiler>(
    ctx: *mut c_void,
    out: *mut *mut c_void,
    d: *mut v4::EventDescrV4,
) -> NcclResult {
    start_common::<T>(ctx, out, || {
        // SAFETY: NULL or NCCL's descriptor, valid for this call.
        unsafe { d.as_ref() }.map(|d| decode_v4_up!(d, none))
    })
}

unsafe extern "C" fn start_v5<T: Profiler>(
    ctx: *mut c_void,
    out: *mut *mut c_void,
    d: *mut v5::EventDescrV5,
) -> NcclResult {
    start_common::<T>(ctx, out, || {
        // SAFETY: NULL or NCCL's descriptor, valid for this call.
        unsafe { d.as_ref() }.map(|d| decode_v4_up!(d, api))
    })
}

unsafe extern "C" fn start_v6<T: Profiler>(
    ctx: *mut c_void,
    out: *mut *mut c_void,
    d: *mut v6::EventDescrV6,
) -> NcclResult {
    start_common::<T>(ctx, out, || {
        // SAFETY: NULL or NCCL's descriptor, valid for this call.
        unsafe { d.as_ref() }.map(|d| decode_v4_up!(d, api))
    })
}

unsafe extern "C" fn start_v7<T: Profiler>(
    ctx: *mut c_void,
    out: *mut *mut c_void,
    d: *mut v7::EventDescrV7,
) -> NcclResult {
    start_common::<T>(ctx, out, || {
        // SAFETY: NULL or NCCL's descriptor, valid for this call.
        unsafe { d.as_ref() }.map(|d| decode_v4_up!(d, v7))
    })
}

unsafe extern "C" fn record_v1<T: Profiler>(
    h: *mut c_void,
    s: EventState,
    a: *mut v1::EventStateArgsV1,
) -> NcclResult {
    // SAFETY: NULL or NCCL's arguments, valid for this call.
    record_common::<T>(h, || unsafe { state_v1(s, a) })
}

unsafe extern "C" fn record_v2<T: Profiler>(
    h: *mut c_void,
    s: EventState,
    a: *mut v2::EventStateArgsV2,
) -> NcclResult {
    // SAFETY: v2's state arguments have v1's layout (same members).
    record_common::<T>(h, || unsafe {
        state_v1(s, a as *const v1::EventStateArgsV1)
    })
}

unsafe extern "C" fn record_v3<T: Profiler>(
    h: *mut c_void,
    s: EventState,
    a: *mut v3::EventStateArgsV3,
) -> NcclResult {
    // SAFETY: v3's state arguments have v1's layout (same members).
    record_common::<T>(h, || unsafe {
        state_v1(s, a as *const v1::EventStateArgsV1)
    })
}

unsafe extern "C" fn record_v4<T: Profiler>(
    h: *mut c_void,
    s: EventState,
    a: *mut v4::EventStateArgsV4,
) -> NcclResult {
    // SAFETY: NULL or NCCL's arguments, valid for this call.
    record_common::<T>(h, || unsafe { state_v4(s, a) })
}

unsafe extern "C" fn record_v5<T: Profiler>(
    h: *mut c_void,
    s: EventState,
    a: *mut v5::EventStateArgsV5,
) -> NcclResult {
    // SAFETY: v5's (and v6's and v7's) state arguments have v4's layout.
    record_common::<T>(h, || unsafe {
        state_v4(s, a as *const v4::EventStateArgsV4)
    })
}

macro_rules! vtable_fn {
    ($fn_name:ident, $ty:ident, $init:ident, $start:ident, $record:ident) => {
        #[doc = concat!("The `", stringify!($ty), "` vtable of a profiler.")]
        pub const fn $fn_name<T: Profiler>() -> $ty {
            $ty {
                name: T::NAME.as_ptr(),
                init: Some($init::<T>),
                start_event: Some($start::<T>),
                stop_event: Some(stop_event::<T>),
                record_event_state: Some($record::<T>),
                finalize: Some(finalize::<T>),
            }
        }
    };
}

use v1::ProfilerV1;
use v2::ProfilerV2;
use v3::ProfilerV3;
use v4::ProfilerV4;
use v5::ProfilerV5;
use v6::ProfilerV6;
use v7::ProfilerV7;

vtable_fn!(vtable_v1, ProfilerV1, init_v1, start_v1, record_v1);
vtable_fn!(vtable_v2, ProfilerV2, init_v1, start_v2, record_v2);
vtable_fn!(vtable_v3, ProfilerV3, init_v1, start_v3, record_v3);
vtable_fn!(vtable_v4, ProfilerV4, init_v4, start_v4, record_v4);
vtable_fn!(vtable_v5, ProfilerV5, init_v5, start_v5, record_v5);
vtable_fn!(vtable_v6, ProfilerV6, init_v5, start_v6, record_v5);
vtable_fn!(vtable_v7, ProfilerV7, init_v5, start_v7, record_v5);

/// A profiler vtable in a `static`.
#[repr(transparent)]
pub struct ExportedProfiler<T>(pub T);

// SAFETY: the wrapped vtables hold pointers only to 'static C strings and
// functions, never mutated.
unsafe impl<T> Sync for ExportedProfiler<T> {}

/// Exports every version [`crate::profiler_versions!`] lists
/// (`ncclProfiler_v1` … `ncclProfiler_v7`) for a type implementing
/// [`crate::Profiler`].
#[macro_export]
macro_rules! export_profiler_plugin {
    ($profiler:ty) => {
        $crate::profiler_versions!(($crate::export_profiler_plugin) @each $profiler;);
    };
    (@each $profiler:ty; $([$n:literal, $sym:ident, $m:ident, $ty:ident, $var:ident, $f:ident])*) => {
        $($crate::export_profiler_plugin!(@one $profiler, $sym, $m, $ty, $f);)*
    };
    (@one $profiler:ty, $sym:ident, $m:ident, $ty:ident, $f:ident) => {
        #[doc = concat!("NCCL's profiler plugin symbol `", stringify!($sym), "`.")]
        #[no_mangle]
        #[allow(non_upper_case_globals)]
        pub static $sym: $crate::profiler::export::ExportedProfiler<
            $crate::profiler::abi::$m::$ty,
        > = $crate::profiler::export::ExportedProfiler(
            $crate::profiler::export::$f::<$profiler>(),
        );
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// What [`Capture`] saw of one kernel-channel event.
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Seen {
        channel: u8,
        start: Option<u64>,
        stop: Option<u64>,
    }

    /// Kernel-channel events seen, in stop order. Only the test below
    /// drives [`Capture`], so no other test touches this.
    static SEEN: Mutex<Vec<Seen>> = Mutex::new(Vec::new());

    /// Keeps the GPU timers a kernel-channel event carries.
    struct Capture;
    impl Profiler for Capture {
        const NAME: &'static CStr = c"capture";
        type Event = Seen;
        fn init(_: &ProfilerInit, mask: &mut i32) -> PluginResult<Self> {
            *mask = NCCL_PROFILE_KERNEL_CH;
            Ok(Capture)
        }
        fn start_event(&self, e: &Event<'_>) -> Option<Seen> {
            match e.kind {
                EventKind::KernelCh {
                    channel_id,
                    p_timer,
                } => Some(Seen {
                    channel: channel_id,
                    start: p_timer,
                    stop: None,
                }),
                _ => None,
            }
        }
        fn stop_event(e: Seen) {
            SEEN.lock().unwrap().push(e);
        }
        fn record_event_state(e: &mut Seen, u: &StateUpdate) {
            if let StateArgs::KernelChStop { p_timer } = u.args {
                assert_eq!(u.state, NCCL_PROFILER_KERNEL_CH_STOP);
                e.stop = Some(p_timer);
            }
        }
    }

    /// Tracks every event, keeping nothing.
    struct Every;
    impl Profiler for Every {
        const NAME: &'static CStr = c"every";
        type Event = [u64; 4];
        fn init(_: &ProfilerInit, mask: &mut i32) -> PluginResult<Self> {
            *mask = NCCL_PROFILE_KERNEL_CH;
            Ok(Every)
        }
        fn start_event(&self, _: &Event<'_>) -> Option<[u64; 4]> {
            Some([1, 2, 3, 4])
        }
        fn stop_event(_: [u64; 4]) {}
        fn record_event_state(_: &mut [u64; 4], _: &StateUpdate) {}
    }

    /// A stopped event's handle is not handed to the next events started:
    /// the core may still name it as their parent (kernel channels start
    /// after their collective stopped), so a reused address would name
    /// the wrong event. The allocator, left alone, hands the freed block
    /// straight back.
    #[test]
    fn a_stopped_events_handle_is_not_reused_by_the_next_ones() {
        let vt = vtable_v5::<Every>();
        let (mut ctx, mut mask): (*mut c_void, c_int) = (std::ptr::null_mut(), 0);
        // SAFETY: valid out-pointers, NULL name and logger.
        let rc =
            unsafe { vt.init.unwrap()(&mut ctx, 1, &mut mask, std::ptr::null(), 1, 2, 0, None) };
        assert_eq!(rc, NCCL_SUCCESS);
        // SAFETY: all-zero is a valid descriptor.
        let mut d: v5::EventDescrV5 = unsafe { std::mem::zeroed() };
        d.ty = NCCL_PROFILE_KERNEL_CH as u64;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let mut h: *mut c_void = std::ptr::null_mut();
            // SAFETY: the context from init, the descriptor and `h` live for
            // the calls; each handle is stopped once.
            unsafe {
                assert_eq!(vt.start_event.unwrap()(ctx, &mut h, &mut d), NCCL_SUCCESS);
                assert_eq!(vt.stop_event.unwrap()(h), NCCL_SUCCESS);
            }
            assert!(seen.insert(h as usize), "handle {h:?} handed out twice");
        }
        // SAFETY: the context from init, finalized once.
        assert_eq!(unsafe { vt.finalize.unwrap()(ctx) }, NCCL_SUCCESS);
    }

    /// What [`Tags`] saw: (type bit, user tag or phase id, phase name).
    static TAGS: Mutex<Vec<(u64, u64, String)>> = Mutex::new(Vec::new());

    /// Keeps the user tag of every call's event and the kernel phases.
    struct Tags;
    impl Profiler for Tags {
        const NAME: &'static CStr = c"tags";
        type Event = ();
        fn init(_: &ProfilerInit, mask: &mut i32) -> PluginResult<Self> {
            *mask = -1;
            Ok(Tags)
        }
        fn start_event(&self, e: &Event<'_>) -> Option<()> {
            let seen = match e.kind {
                EventKind::KernelPhase {
                    phase_id,
                    phase_name,
                    ..
                } => (phase_id as u64, phase_name.to_string()),
                k => (k.user_tag()?, String::new()),
            };
            TAGS.lock()
                .unwrap()
                .push((e.kind.type_bit(), seen.0, seen.1));
            None
        }
        fn stop_event(_: ()) {}
    }

    /// v7's tags reach the plugin from the collective, p2p and API
    /// descriptors, and its kernel phase is decoded; v6 gives tag 0.
    #[test]
    fn v7_user_tags_and_kernel_phases_reach_the_plugin() {
        let vt = vtable_v7::<Tags>();
        let (mut ctx, mut mask): (*mut c_void, c_int) = (std::ptr::null_mut(), 0);
        // SAFETY: valid out-pointers, NULL name and logger.
        let rc =
            unsafe { vt.init.unwrap()(&mut ctx, 1, &mut mask, std::ptr::null(), 1, 2, 0, None) };
        assert_eq!(rc, NCCL_SUCCESS);
        let start = |d: &mut v7::EventDescrV7| {
            let mut h: *mut c_void = std::ptr::null_mut();
            // SAFETY: the context from init; `d` and `h` live for the call.
            let rc = unsafe { vt.start_event.unwrap()(ctx, &mut h, d) };
            assert_eq!(rc, NCCL_SUCCESS);
        };
        // SAFETY: all-zero is a valid descriptor (NULL pointers, zeros).
        let mut d: v7::EventDescrV7 = unsafe { std::mem::zeroed() };
        d.ty = NCCL_PROFILE_COLL as u64;
        d.detail.coll.user_tag = 11;
        start(&mut d);
        // SAFETY: as above.
        let mut d: v7::EventDescrV7 = unsafe { std::mem::zeroed() };
        d.ty = NCCL_PROFILE_P2P as u64;
        d.detail.p2p.user_tag = 12;
        start(&mut d);
        // SAFETY: as above.
        let mut d: v7::EventDescrV7 = unsafe { std::mem::zeroed() };
        d.ty = NCCL_PROFILE_COLL_API as u64;
        d.detail.coll_api.user_tag = 13;
        start(&mut d);
        // SAFETY: as above.
        let mut d: v7::EventDescrV7 = unsafe { std::mem::zeroed() };
        d.ty = NCCL_PROFILE_P2P_API as u64;
        d.detail.p2p_api.user_tag = u64::MAX;
        start(&mut d);
        // SAFETY: as above.
        let mut d: v7::EventDescrV7 = unsafe { std::mem::zeroed() };
        d.ty = NCCL_PROFILE_KERNEL_PHASE as u64;
        d.detail.kernel_phase = v7::KernelPhaseDescrV7 {
            channel_id: 1,
            phase_id: 2,
            phase_name: c"final_sync".as_ptr(),
            p_timer: 5,
        };
        start(&mut d);
        // SAFETY: the context from init, finalized once.
        assert_eq!(unsafe { vt.finalize.unwrap()(ctx) }, NCCL_SUCCESS);
        let bit = |b: c_int| b as u64;
        assert_eq!(
            std::mem::take(&mut *TAGS.lock().unwrap()),
            [
                (bit(NCCL_PROFILE_COLL), 11, String::new()),
                (bit(NCCL_PROFILE_P2P), 12, String::new()),
                (bit(NCCL_PROFILE_COLL_API), 13, String::new()),
                (bit(NCCL_PROFILE_P2P_API), u64::MAX, String::new()),
                (bit(NCCL_PROFILE_KERNEL_PHASE), 2, "final_sync".to_string()),
            ]
        );
    }

    fn take_seen() -> Vec<Seen> {
        std::mem::take(&mut *SEEN.lock().unwrap())
    }

    /// The start timer (descriptor) and the stop timer (state args of
    /// `NCCL_PROFILER_KERNEL_CH_STOP`) reach the plugin through every
    /// version that has them, v4 to v6; v3's kernel channel has neither.
    #[test]
    fn kernel_channel_gpu_timers_reach_the_plugin() {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        let mut mask: c_int = 0;
        // One kernel-channel event through a version's vtable: start, the
        // stop state with its timer, stop, then the context's finalize.
        macro_rules! run {
            ($vt:expr, $ctx:expr, $d:expr, $a:expr) => {{
                let mut h: *mut c_void = std::ptr::null_mut();
                // SAFETY: the context from init; the descriptor, the state
                // args (or NULL, which the ABI allows) and `h` live for the
                // calls; the handle is stopped once, the context finalized once.
                unsafe {
                    assert_eq!($vt.start_event.unwrap()($ctx, &mut h, $d), NCCL_SUCCESS);
                    let rc = $vt.record_event_state.unwrap()(h, NCCL_PROFILER_KERNEL_CH_STOP, $a);
                    assert_eq!(rc, NCCL_SUCCESS);
                    assert_eq!($vt.stop_event.unwrap()(h), NCCL_SUCCESS);
                    assert_eq!($vt.finalize.unwrap()($ctx), NCCL_SUCCESS);
                }
            }};
        }

        // v4.
        let vt = vtable_v4::<Capture>();
        // SAFETY: valid out-pointers, NULL name and logger.
        let rc =
            unsafe { vt.init.unwrap()(&mut ctx, &mut mask, std::ptr::null(), 1, 1, 2, 0, None) };
        assert_eq!((rc, mask), (NCCL_SUCCESS, NCCL_PROFILE_KERNEL_CH));
        // SAFETY: all-zero is a valid descriptor (NULL pointers, zeros).
        let mut d: v4::EventDescrV4 = unsafe { std::mem::zeroed() };
        d.ty = NCCL_PROFILE_KERNEL_CH as u8;
        d.detail.kernel_ch = v4::KernelChDescrV4 {
            channel_id: 3,
            p_timer: 1_000,
        };
        let mut a = v4::EventStateArgsV4 {
            kernel_ch: v4::KernelChStateV4 { p_timer: 1_750 },
        };
        run!(vt, ctx, &mut d, &mut a);

        // v5.
        let vt = vtable_v5::<Capture>();
        // SAFETY: valid out-pointers, NULL name and logger.
        let rc =
            unsafe { vt.init.unwrap()(&mut ctx, 1, &mut mask, std::ptr::null(), 1, 2, 0, None) };
        assert_eq!(rc, NCCL_SUCCESS);
        // SAFETY: all-zero is a valid descriptor.
        let mut d: v5::EventDescrV5 = unsafe { std::mem::zeroed() };
        d.ty = NCCL_PROFILE_KERNEL_CH as u64;
        d.detail.kernel_ch = v5::KernelChDescrV5 {
            channel_id: 5,
            p_timer: 2_000,
        };
        let mut a = v5::EventStateArgsV5 {
            kernel_ch: v5::KernelChStateV5 { p_timer: 2_500 },
        };
        run!(vt, ctx, &mut d, &mut a);

        // v6 (its descriptor keeps v5's kernel-channel member).
        let vt = vtable_v6::<Capture>();
        // SAFETY: valid out-pointers, NULL name and logger.
        let rc =
            unsafe { vt.init.unwrap()(&mut ctx, 1, &mut mask, std::ptr::null(), 1, 2, 0, None) };
        assert_eq!(rc, NCCL_SUCCESS);
        // SAFETY: all-zero is a valid descriptor.
        let mut d: v6::EventDescrV6 = unsafe { std::mem::zeroed() };
        d.ty = NCCL_PROFILE_KERNEL_CH as u64;
        d.detail.kernel_ch = v5::KernelChDescrV5 {
            channel_id: 7,
            p_timer: 3_000,
        };
        let mut a = v6::EventStateArgsV6 {
            kernel_ch: v5::KernelChStateV5 { p_timer: 3_125 },
        };
        run!(vt, ctx, &mut d, &mut a);

        // v3: a channel id only; its state args have no kernel member, so
        // a stop state brings no timer.
        let vt = vtable_v3::<Capture>();
        // SAFETY: valid out-pointers.
        let rc = unsafe { vt.init.unwrap()(&mut ctx, &mut mask) };
        assert_eq!(rc, NCCL_SUCCESS);
        // SAFETY: all-zero is a valid descriptor.
        let mut d: v3::EventDescrV3 = unsafe { std::mem::zeroed() };
        d.ty = NCCL_PROFILE_KERNEL_CH as u8;
        d.detail.kernel_ch = v3::KernelChDescrV3 { channel_id: 9 };
        run!(vt, ctx, &mut d, std::ptr::null_mut());

        let seen = |channel, start, stop| Seen {
            channel,
            start,
            stop,
        };
        assert_eq!(
            take_seen(),
            [
                seen(3, Some(1_000), Some(1_750)),
                seen(5, Some(2_000), Some(2_500)),
                seen(7, Some(3_000), Some(3_125)),
                seen(9, None, None),
            ]
        );
    }
}
