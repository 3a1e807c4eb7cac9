//! The loader's side of the profiler: `ncclProfiler_v1_t` …
//! `ncclProfiler_v7_t` behind one Rust type, [`CProfiler`], which the core's
//! `ProfilerComm` drives: one adapter, one match arm per version where the
//! descriptor or `init` changed (v1 carries enum codes where later versions
//! carry names; v4 dropped the communicator name and hash; v5 added the
//! parent group and a 64-bit type; v7 the caller's tag on each call's
//! events). Loading, `init`, states and `stop` are here; starting an event,
//! one function per kind, in `load/start.rs`.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::AtomicI32;

use super::abi::{
    v1, v2, v3, v4, v5, v6, v7, EventState, NCCL_PROFILER_GROUP_END_API_START,
    NCCL_PROFILER_GROUP_START_API_STOP, NCCL_PROFILER_KERNEL_CH_STOP,
    NCCL_PROFILER_NET_PLUGIN_UPDATE, NCCL_PROFILER_PROXY_CTRL_APPEND_END,
    NCCL_PROFILER_PROXY_CTRL_IDLE, NCCL_PROFILER_PROXY_OP_IN_PROGRESS_V4,
    NCCL_PROFILER_PROXY_OP_RECV_DONE, NCCL_PROFILER_PROXY_STEP_RECV_GPU_WAIT,
    NCCL_PROFILER_PROXY_STEP_SEND_GPU_WAIT, NCCL_PROFILER_PROXY_STEP_SEND_PEER_WAIT_V4,
    NCCL_PROFILE_CE_BATCH, NCCL_PROFILE_CE_COLL, NCCL_PROFILE_CE_SYNC, NCCL_PROFILE_COLL,
    NCCL_PROFILE_COLL_API, NCCL_PROFILE_GROUP, NCCL_PROFILE_GROUP_API, NCCL_PROFILE_KERNEL_CH,
    NCCL_PROFILE_KERNEL_LAUNCH, NCCL_PROFILE_KERNEL_PHASE, NCCL_PROFILE_NET_PLUGIN,
    NCCL_PROFILE_P2P, NCCL_PROFILE_P2P_API, NCCL_PROFILE_PROXY_CTRL, NCCL_PROFILE_PROXY_OP,
    NCCL_PROFILE_PROXY_STEP,
};
use crate::ffi::{Logger, NCCL_SUCCESS};
use crate::loader::Lib;

/// The symbol table, the vtable of each version and the cast from a
/// symbol's address, from the one list of versions.
macro_rules! loadable {
    ($([$n:literal, $sym:ident, $m:ident, $ty:ident, $var:ident, $f:ident])*) => {
        /// Profiler symbols, newest first, with the version loaded (`None`:
        /// known, not adapted by this oxccl).
        pub const SYMBOLS: &[(&str, Option<u32>)] = &[$((stringify!($sym), Some($n)),)*];

        #[derive(Clone, Copy)]
        enum Vt {
            $($var(&'static $m::$ty),)*
        }

        /// The vtable of `version` at `p`.
        ///
        /// # Safety
        /// `p` is the address of the symbol `SYMBOLS` gives for `version`,
        /// in a library that stays loaded for `'static`.
        unsafe fn vtable_at(version: u32, p: *const c_void) -> Option<Vt> {
            match version {
                // SAFETY: by the ABI the symbol `ncclProfiler_vN` is an
                // `ncclProfiler_vN_t` (the caller's contract).
                $($n => Some(Vt::$var(unsafe { &*(p as *const $m::$ty) })),)*
                _ => None,
            }
        }
    };
}
crate::profiler_versions!((loadable));

/// The activation mask NCCL shares with the plugin: one process-wide int
/// the plugin may change at any time, read before every event.
pub static MASK: AtomicI32 = AtomicI32::new(0);

/// A loaded profiler vtable (process-wide).
pub struct CProfiler {
    vt: Vt,
    _lib: Lib,
    pub name: String,
    pub version: u32,
}

// SAFETY: the vtable is immutable data of a library kept loaded by `_lib`;
// NCCL calls profilers from every thread as well.
unsafe impl Send for CProfiler {}
// SAFETY: as above.
unsafe impl Sync for CProfiler {}

/// A profiler context of one communicator, with what `init` was given that
/// the plugin may keep: NCCL hands over `comm->config.commName`, which
/// lives as long as the communicator, and plugins (NCCL's example among
/// them) store the pointer at `init` and print it at `finalize`. The name
/// is owned here, so it outlives `finalize` (`ProfilerComm`'s `Drop`).
pub struct Ctx {
    pub ptr: *mut c_void,
    /// The C string `init`'s `commName` points into; a `CString` keeps its
    /// bytes on the heap, so moving the `Ctx` does not move them.
    _comm_name: CString,
}
// SAFETY: the plugin's context; the ABI has it used from any thread.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

/// An event handle; NULL means "not tracked".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle(pub *mut c_void);
// SAFETY: handles are opaque to us and passed back to the plugin only.
unsafe impl Send for Handle {}
// SAFETY: as above: never dereferenced here, only copied.
unsafe impl Sync for Handle {}

impl Handle {
    pub const NONE: Handle = Handle(null_mut());
}

/// One event of the core, before its per-version descriptor is built.
pub enum Event<'a> {
    /// An outermost group of API calls (`ncclProfileGroupApi`, v5+): from
    /// the first operation queued in it to the end of its `group_end`.
    /// `depth` is NCCL's `ncclGroupDepth` at that first call: 1 for a lone
    /// call (its implicit group), 2 inside one explicit group.
    GroupApi {
        depth: c_int,
    },
    /// One collective API call (`ncclProfileCollApi`, v5+), child of its
    /// group API event; it parents the collective's execution event.
    CollApi {
        func: &'a CStr,
        count: usize,
        dtype: &'a CStr,
        root: c_int,
        parent: Handle,
        /// The caller's tag (the core's `Op::user_tag`), for v7.
        user_tag: u64,
    },
    /// One send or receive call (`ncclProfileP2pApi`, v5+).
    P2pApi {
        func: &'a CStr,
        count: usize,
        dtype: &'a CStr,
        parent: Handle,
        /// The caller's tag, for v7.
        user_tag: u64,
    },
    /// One kernel launch on `stream` (`ncclProfileKernelLaunch`, v5+),
    /// child of the group API event.
    KernelLaunch {
        parent: Handle,
        stream: *mut c_void,
    },
    Group,
    Coll {
        seq: u64,
        func: &'a CStr,
        count: usize,
        root: c_int,
        dtype: &'a CStr,
        algo: &'a CStr,
        nchannels: u8,
        parent: Handle,
        /// The collective's API event: the parent from v5 on, where
        /// `parent` (the group) is `parentGroup`.
        api: Handle,
        /// The caller's tag, for v7.
        user_tag: u64,
        codes: Codes,
    },
    P2p {
        func: &'a CStr,
        count: usize,
        dtype: &'a CStr,
        peer: c_int,
        nchannels: u8,
        parent: Handle,
        /// The call's API event (the parent from v5 on).
        api: Handle,
        /// The caller's tag, for v7.
        user_tag: u64,
        codes: Codes,
    },
    /// The network transfers of one operation with one peer in one
    /// direction on one channel (NCCL's `ncclProfileProxyOp`).
    ProxyOp {
        parent: Handle,
        channel: u8,
        peer: c_int,
        n_steps: c_int,
        /// Bytes per step.
        chunk_size: c_int,
        is_send: bool,
    },
    /// One network send or receive of a proxy op (`ncclProfileProxyStep`).
    ProxyStep {
        parent: Handle,
        step: c_int,
    },
    /// One channel (thread block) of a kernel running an operation, child
    /// of the operation's event (`ncclProfileKernelCh`, v3 and later);
    /// `p_timer` is the GPU's globaltimer when the channel started (v4+).
    KernelCh {
        parent: Handle,
        channel: u8,
        p_timer: u64,
    },
    /// A state of the thread that progresses network transfers (NCCL's
    /// `ncclProfileProxyCtrl`): no parent, one state, stopped at once.
    ProxyCtrl,
    /// An event the net plugin defined (`ncclProfileNetPlugin`, v3 and
    /// later), reported through the profiler callback under the proxy step
    /// that posted the operation: `id` names the layout of `data`
    /// (`NCCL_PROFILER_NET_TYPE_*` | version), which the plugin owns.
    NetPlugin {
        parent: Handle,
        id: i64,
        data: *mut c_void,
    },
}

/// The attributes a state change carries (`ncclProfilerEventStateArgs`).
#[derive(Clone, Copy)]
pub enum StateArgs {
    /// States that carry none (the group API states).
    None,
    /// Proxy step states (v4 and later carry the bytes moved).
    Step { trans_size: usize },
    /// Proxy-op states of v1 to v3: steps done so far and their bytes.
    Op { steps: c_int, trans_size: usize },
    /// `ncclProfilerKernelChStop` (v4+): the GPU's globaltimer at the end.
    KernelCh { p_timer: u64 },
    /// Proxy-control states: the proxy ops appended (`AppendEnd` only).
    ProxyCtrl { appended: c_int },
    /// `ncclProfilerNetPluginUpdate` (v4+): the net plugin's new event data.
    NetPlugin { data: *mut c_void },
}

/// The enum codes v1 carries where later versions carry names:
/// `ncclFunc_t`, `ncclDataType_t`, `ncclRedOp_t`, `NCCL_ALGO_*`.
#[derive(Clone, Copy, Default)]
pub struct Codes {
    pub func: u8,
    pub dtype: u8,
    pub op: u32,
    pub algo: u8,
}

/// What a kernel-side or network event needs above it: NCCL starts an
/// event when its own bit or the bit of any event below it is in the mask,
/// so that a wanted event always has its parents.
const BELOW_TASK: c_int = NCCL_PROFILE_PROXY_OP
    | NCCL_PROFILE_PROXY_STEP
    | NCCL_PROFILE_KERNEL_CH
    | NCCL_PROFILE_NET_PLUGIN;

/// Copy-engine events (v6), below a collective API event.
const CE_BITS: c_int = NCCL_PROFILE_CE_COLL | NCCL_PROFILE_CE_SYNC | NCCL_PROFILE_CE_BATCH;

/// The mask bits that start a group API event: any event at all.
pub const GROUP_API_BITS: c_int = NCCL_PROFILE_GROUP_API
    | NCCL_PROFILE_COLL_API
    | NCCL_PROFILE_P2P_API
    | NCCL_PROFILE_KERNEL_LAUNCH
    | NCCL_PROFILE_GROUP
    | NCCL_PROFILE_COLL
    | NCCL_PROFILE_P2P
    | BELOW_TASK
    | CE_BITS;

/// The mask bits that start proxy-op events (NCCL's proxy.cc and profiler.cc).
pub const PROXY_OP_BITS: c_int =
    NCCL_PROFILE_PROXY_OP | NCCL_PROFILE_PROXY_STEP | NCCL_PROFILE_NET_PLUGIN;
/// The mask bits that start proxy-step events.
pub const PROXY_STEP_BITS: c_int = NCCL_PROFILE_PROXY_STEP | NCCL_PROFILE_NET_PLUGIN;

impl Event<'_> {
    /// The activation-mask bits any of which starts this event, as NCCL
    /// tests them.
    pub fn enabled_by(&self) -> c_int {
        match self {
            Event::Group => NCCL_PROFILE_GROUP | NCCL_PROFILE_COLL | NCCL_PROFILE_P2P | BELOW_TASK,
            Event::Coll { .. } => NCCL_PROFILE_COLL | BELOW_TASK,
            Event::P2p { .. } => NCCL_PROFILE_P2P | BELOW_TASK,
            Event::ProxyOp { .. } => PROXY_OP_BITS,
            Event::ProxyStep { .. } => PROXY_STEP_BITS,
            Event::KernelCh { .. } => NCCL_PROFILE_KERNEL_CH,
            Event::GroupApi { .. } => GROUP_API_BITS,
            Event::CollApi { .. } => {
                NCCL_PROFILE_COLL_API | NCCL_PROFILE_COLL | BELOW_TASK | CE_BITS
            }
            Event::P2pApi { .. } => NCCL_PROFILE_P2P_API | NCCL_PROFILE_P2P | BELOW_TASK,
            Event::KernelLaunch { .. } => NCCL_PROFILE_KERNEL_LAUNCH,
            Event::ProxyCtrl => NCCL_PROFILE_PROXY_CTRL,
            Event::NetPlugin { .. } => NCCL_PROFILE_NET_PLUGIN,
        }
    }
}

/// Calls `startEvent` of vtable `$v` with a zeroed `$descr` (type field of
/// `$int`) for type `$ty`, and the union member `$detail` where the event
/// has one; the handle the plugin set, or [`Handle::NONE`].
macro_rules! start_event {
    ($ctx:expr, $v:expr, $descr:ty, $int:ty, $ty:expr, $rank:expr, $parent:expr $(, $detail:expr)?) => {{
        // SAFETY: a zeroed descriptor is valid (NULL pointers, zero counts).
        let mut d: $descr = unsafe { std::mem::zeroed() };
        d.ty = $ty as $int;
        d.rank = $rank;
        d.parent_obj = $parent;
        $(d.detail = $detail;)?
        let mut h = null_mut();
        // SAFETY: entry checked non-null at load; the descriptor lives for
        // the call.
        let _ = unsafe { $v.start_event.expect("checked")($ctx.ptr, &mut h, &mut d) };
        Handle(h)
    }};
}

mod start;

impl CProfiler {
    pub fn negotiate(lib: &Lib) -> Result<CProfiler, (Vec<&'static str>, String)> {
        let looked: Vec<&'static str> = SYMBOLS.iter().map(|s| s.0).collect();
        let found = lib.present(&looked);
        let Some((sym, version)) = SYMBOLS
            .iter()
            .find_map(|(s, v)| v.filter(|_| found.contains(s)).map(|v| (*s, v)))
        else {
            return Err((
                found,
                "no profiler ABI version this oxccl loads (v1 to v7)".into(),
            ));
        };
        let p = lib.symbol(sym).expect("found above");
        // SAFETY: `sym` is `version`'s symbol in SYMBOLS; `lib` keeps it
        // loaded while we hold it.
        let vt = unsafe { vtable_at(version, p) }.expect("a version of SYMBOLS");
        let (name, entries) = match vt {
            Vt::V1(v) => (
                v.name,
                [
                    v.init.is_some(),
                    v.start_event.is_some(),
                    v.stop_event.is_some(),
                    v.record_event_state.is_some(),
                    v.finalize.is_some(),
                ],
            ),
            Vt::V2(v) => (
                v.name,
                [
                    v.init.is_some(),
                    v.start_event.is_some(),
                    v.stop_event.is_some(),
                    v.record_event_state.is_some(),
                    v.finalize.is_some(),
                ],
            ),
            Vt::V3(v) => (
                v.name,
                [
                    v.init.is_some(),
                    v.start_event.is_some(),
                    v.stop_event.is_some(),
                    v.record_event_state.is_some(),
                    v.finalize.is_some(),
                ],
            ),
            Vt::V4(v) => (
                v.name,
                [
                    v.init.is_some(),
                    v.start_event.is_some(),
                    v.stop_event.is_some(),
                    v.record_event_state.is_some(),
                    v.finalize.is_some(),
                ],
            ),
            Vt::V5(v) => (
                v.name,
                [
                    v.init.is_some(),
                    v.start_event.is_some(),
                    v.stop_event.is_some(),
                    v.record_event_state.is_some(),
                    v.finalize.is_some(),
                ],
            ),
            Vt::V6(v) => (
                v.name,
                [
                    v.init.is_some(),
                    v.start_event.is_some(),
                    v.stop_event.is_some(),
                    v.record_event_state.is_some(),
                    v.finalize.is_some(),
                ],
            ),
            Vt::V7(v) => (
                v.name,
                [
                    v.init.is_some(),
                    v.start_event.is_some(),
                    v.stop_event.is_some(),
                    v.record_event_state.is_some(),
                    v.finalize.is_some(),
                ],
            ),
        };
        let names = [
            "init",
            "startEvent",
            "stopEvent",
            "recordEventState",
            "finalize",
        ];
        let mut null: Vec<&str> = names
            .iter()
            .zip(entries)
            .filter(|(_, ok)| !ok)
            .map(|(n, _)| *n)
            .collect();
        if name.is_null() {
            null.insert(0, "name");
        }
        if !null.is_empty() {
            return Err((found, format!("{sym} has NULL {}", null.join(", "))));
        }
        // SAFETY: checked non-null; the plugin's C string.
        let name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        Ok(CProfiler {
            vt,
            _lib: lib.clone(),
            name,
            version,
        })
    }

    /// `init` for one communicator; sets [`MASK`]. `log`: the logger v4
    /// and later receive; `comm_name`: the config's commName, else a name
    /// made from the hash.
    pub fn init(
        &self,
        log: Logger,
        comm_id: u64,
        comm_name: Option<&str>,
        nranks: usize,
        rank: usize,
        nnodes: usize,
    ) -> Result<Ctx, String> {
        let mut ctx = null_mut();
        let mask = MASK.as_ptr();
        let name = comm_name.map_or_else(|| format!("oxccl-{comm_id:x}"), str::to_string);
        let name = CString::new(name.replace('\0', " ")).unwrap_or_default();
        let comm_name = name.as_ptr();
        let (n, r, nn) = (nranks as c_int, rank as c_int, nnodes as c_int);
        // SAFETY: entries checked non-null at load; the mask is a
        // process-lifetime int as the ABI asks; `comm_name` points into
        // `name`, which the returned `Ctx` owns past `finalize`; valid
        // out-pointer.
        let rc = unsafe {
            match self.vt {
                Vt::V1(v) => v.init.expect("checked")(&mut ctx, mask),
                Vt::V2(v) => v.init.expect("checked")(&mut ctx, mask),
                Vt::V3(v) => v.init.expect("checked")(&mut ctx, mask),
                Vt::V4(v) => {
                    v.init.expect("checked")(&mut ctx, mask, comm_name, comm_id, nn, n, r, log)
                }
                Vt::V5(v) => {
                    v.init.expect("checked")(&mut ctx, comm_id, mask, comm_name, nn, n, r, log)
                }
                Vt::V6(v) => {
                    v.init.expect("checked")(&mut ctx, comm_id, mask, comm_name, nn, n, r, log)
                }
                Vt::V7(v) => {
                    v.init.expect("checked")(&mut ctx, comm_id, mask, comm_name, nn, n, r, log)
                }
            }
        };
        // As NCCL 2.31: kernel phases live below kernel channels, so a plugin
        // that asks for the one gets the other.
        let m = MASK.load(std::sync::atomic::Ordering::Relaxed);
        if m & NCCL_PROFILE_KERNEL_PHASE != 0 && m & NCCL_PROFILE_KERNEL_CH == 0 {
            MASK.fetch_or(NCCL_PROFILE_KERNEL_CH, std::sync::atomic::Ordering::Relaxed);
        }
        if rc == NCCL_SUCCESS {
            Ok(Ctx {
                ptr: ctx,
                _comm_name: name,
            })
        } else {
            Err(format!("init returned error {rc}"))
        }
    }

    /// `recordEventState`, filtered and converted as NCCL's adapter of the
    /// version does: v1 to v3 get the step states without arguments (and,
    /// as the NCCL they were written for gave them, the proxy-op states
    /// with steps and bytes); v4 and later the step states with the bytes,
    /// and the v4-only states, but no proxy-op states of v1 to v3.
    pub fn record(&self, h: Handle, state: EventState, args: StateArgs) {
        if h.0.is_null() {
            return;
        }
        let old_op = (0..=NCCL_PROFILER_PROXY_OP_RECV_DONE).contains(&state);
        let step = (NCCL_PROFILER_PROXY_STEP_SEND_GPU_WAIT
            ..=NCCL_PROFILER_PROXY_STEP_RECV_GPU_WAIT)
            .contains(&state);
        let v4_only = state == NCCL_PROFILER_PROXY_OP_IN_PROGRESS_V4
            || state == NCCL_PROFILER_PROXY_STEP_SEND_PEER_WAIT_V4;
        let ctrl =
            (NCCL_PROFILER_PROXY_CTRL_IDLE..=NCCL_PROFILER_PROXY_CTRL_APPEND_END).contains(&state);
        // Net-plugin updates reach v4 and later (NCCL's v3 adapter drops them).
        let net = state == NCCL_PROFILER_NET_PLUGIN_UPDATE;
        let (trans_size, steps, p_timer, appended) = match args {
            StateArgs::Step { trans_size } => (trans_size, 0, 0, 0),
            StateArgs::Op { steps, trans_size } => (trans_size, steps, 0, 0),
            StateArgs::KernelCh { p_timer } => (0, 0, p_timer, 0),
            StateArgs::ProxyCtrl { appended } => (0, 0, 0, appended),
            StateArgs::None | StateArgs::NetPlugin { .. } => (0, 0, 0, 0),
        };
        let net_data = match args {
            StateArgs::NetPlugin { data } => data,
            _ => null_mut(),
        };
        // v3's kernel-channel events end with stopEvent alone.
        let kernel_stop = state == NCCL_PROFILER_KERNEL_CH_STOP;
        // The group API states (v5+) carry no arguments: NCCL passes NULL.
        if state == NCCL_PROFILER_GROUP_START_API_STOP || state == NCCL_PROFILER_GROUP_END_API_START
        {
            let f = match self.vt {
                Vt::V5(v) => v.record_event_state,
                // The same type: v6's state arguments are v5's.
                Vt::V6(v) => v.record_event_state,
                Vt::V7(v) => v.record_event_state,
                _ => None,
            };
            if let Some(f) = f {
                // SAFETY: a live handle startEvent returned; NULL arguments
                // as NCCL gives these states.
                let _ = unsafe { f(h.0, state, null_mut()) };
            }
            return;
        }
        macro_rules! old {
            ($v:expr, $args:ty, $sm:ident :: $st:ident, $cm:ident :: $ct:ident) => {{
                if !(old_op || step || ctrl) {
                    return;
                }
                // SAFETY: all-zero is a valid argument union.
                let mut a: $args = unsafe { std::mem::zeroed() };
                if old_op {
                    a.proxy_op = $sm::$st { trans_size, steps };
                } else if ctrl {
                    a.proxy_ctrl = $cm::$ct {
                        appended_proxy_ops: appended,
                    };
                }
                if let Some(f) = $v.record_event_state {
                    // SAFETY: a live handle startEvent returned; `a` lives for the call.
                    let _ = unsafe { f(h.0, state, &mut a) };
                }
            }};
        }
        macro_rules! new {
            ($v:expr, $args:ty, $sm:ident :: $st:ident, $km:ident :: $kt:ident, $cm:ident :: $ct:ident, $nm:ident :: $nt:ident) => {{
                if !(step || v4_only || kernel_stop || ctrl || net) {
                    return;
                }
                // SAFETY: all-zero is a valid argument union.
                let mut a: $args = unsafe { std::mem::zeroed() };
                if net {
                    a.net_plugin = $nm::$nt { data: net_data };
                } else if kernel_stop {
                    a.kernel_ch = $km::$kt { p_timer };
                } else if ctrl {
                    a.proxy_ctrl = $cm::$ct {
                        appended_proxy_ops: appended,
                    };
                } else {
                    a.proxy_step = $sm::$st { trans_size };
                }
                if let Some(f) = $v.record_event_state {
                    // SAFETY: a live handle startEvent returned; `a` lives for the call.
                    let _ = unsafe { f(h.0, state, &mut a) };
                }
            }};
        }
        match self.vt {
            Vt::V1(v) => old!(
                v,
                v1::EventStateArgsV1,
                v1::ProxyOpStateV1,
                v1::ProxyCtrlStateV1
            ),
            Vt::V2(v) => old!(
                v,
                v2::EventStateArgsV2,
                v2::ProxyOpStateV2,
                v2::ProxyCtrlStateV2
            ),
            Vt::V3(v) => old!(
                v,
                v3::EventStateArgsV3,
                v3::ProxyOpStateV3,
                v3::ProxyCtrlStateV3
            ),
            Vt::V4(v) => new!(
                v,
                v4::EventStateArgsV4,
                v4::ProxyStepStateV4,
                v4::KernelChStateV4,
                v4::ProxyCtrlStateV4,
                v4::NetPluginStateV4
            ),
            Vt::V5(v) => new!(
                v,
                v5::EventStateArgsV5,
                v5::ProxyStepStateV5,
                v5::KernelChStateV5,
                v5::ProxyCtrlStateV5,
                v5::NetPluginStateV5
            ),
            Vt::V6(v) => new!(
                v,
                v6::EventStateArgsV6,
                v5::ProxyStepStateV5,
                v5::KernelChStateV5,
                v5::ProxyCtrlStateV5,
                v5::NetPluginStateV5
            ),
            Vt::V7(v) => new!(
                v,
                v7::EventStateArgsV7,
                v5::ProxyStepStateV5,
                v5::KernelChStateV5,
                v5::ProxyCtrlStateV5,
                v5::NetPluginStateV5
            ),
        }
    }

    pub fn stop(&self, h: Handle) {
        if h.0.is_null() {
            return;
        }
        let f = match self.vt {
            Vt::V1(v) => v.stop_event,
            Vt::V2(v) => v.stop_event,
            Vt::V3(v) => v.stop_event,
            Vt::V4(v) => v.stop_event,
            Vt::V5(v) => v.stop_event,
            Vt::V6(v) => v.stop_event,
            Vt::V7(v) => v.stop_event,
        };
        if let Some(f) = f {
            // SAFETY: a handle startEvent returned, stopped once.
            let _ = unsafe { f(h.0) };
        }
    }

    /// `finalize`, only for a context `init` set: NCCL skips it for a NULL
    /// one (profiler.cc), and plugins rely on that (the Inspector returns
    /// success with no context when it disables itself, and its finalize
    /// reads the context).
    pub fn finalize(&self, ctx: &Ctx) {
        if ctx.ptr.is_null() {
            return;
        }
        let f = match self.vt {
            Vt::V1(v) => v.finalize,
            Vt::V2(v) => v.finalize,
            Vt::V3(v) => v.finalize,
            Vt::V4(v) => v.finalize,
            Vt::V5(v) => v.finalize,
            Vt::V6(v) => v.finalize,
            Vt::V7(v) => v.finalize,
        };
        if let Some(f) = f {
            // SAFETY: the context init returned, finalized once.
            let _ = unsafe { f(ctx.ptr) };
        }
    }
}

/// A C string for a name, kept for the process (names are few and static).
pub fn cname(s: &'static str) -> &'static CStr {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static NAMES: Mutex<Option<HashMap<&'static str, &'static CStr>>> = Mutex::new(None);
    let mut g = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    g.get_or_insert_with(HashMap::new)
        .entry(s)
        .or_insert_with(|| Box::leak(CString::new(s).unwrap_or_default().into_boxed_c_str()))
}
