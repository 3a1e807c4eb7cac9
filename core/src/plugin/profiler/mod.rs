//! The profiler plugin: `NCCL_PROFILER_PLUGIN` as NCCL 2.30 reads it (a
//! name → `libnccl-profiler-NAME.so`, a path, `none`; unset tries
//! `libnccl-profiler.so`), `ncclProfiler_v7` down to `_v1`. The core starts
//! and stops events at NCCL's points: one group event per executed group,
//! one collective or p2p event per operation, children of the group; on the
//! network paths (the host executor's lanes, the device path's proxy
//! thread) one proxy-op event per (operation, peer, direction, channel),
//! child of the operation's event, and one proxy-step event per network
//! send or receive, child of its proxy op ([`OpEvents`]); proxy-control events from the
//! threads that progress network transfers ([`ProxyCtrl`]). An event is
//! started only when
//! the activation mask the plugin set has its bit or the bit of an event
//! below it (NCCL's rule, so that a wanted event has its parents). With no
//! profiler the core pays one branch; with one, one atomic load per group.
//!
//! Each call's [`crate::op::Op::user_tag`] reaches a v7 plugin unchanged on
//! the call's API event and its collective or p2p event (older versions
//! have no field for it). v7's kernel-phase events are not emitted: oxccl's
//! kernels stamp only each channel's start and end, so a phase would be a
//! guess (NCCL, too, emits none for a kernel that stamps no phases).

mod net_events;
mod proxy_events;

use std::os::raw::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use oxccl_plugin::ffi::profiler::{
    NCCL_PROFILER_PROXY_CTRL_ACTIVE, NCCL_PROFILER_PROXY_CTRL_APPEND,
    NCCL_PROFILER_PROXY_CTRL_APPEND_END, NCCL_PROFILER_PROXY_CTRL_IDLE,
    NCCL_PROFILER_PROXY_CTRL_SLEEP, NCCL_PROFILER_PROXY_CTRL_WAKEUP,
};

use tracing::{info, warn};

use oxccl_plugin::profiler::load;

use crate::error::{Error, Result};
use oxccl_plugin::loader;

pub use load::{
    cname, Codes, Event, Handle, StateArgs, GROUP_API_BITS, PROXY_OP_BITS, PROXY_STEP_BITS, SYMBOLS,
};

pub use net_events::{callback as net_callback, NetParent};
pub use oxccl_plugin::loader::Outcome;
pub use proxy_events::{OpDescr, OpEvents, ProxyProfiler};

/// The most channels a plugin is told of. NCCL never runs more than its
/// MAXCHANNELS (64), and its plugins size per-channel arrays by that (the
/// Inspector) or by 32 (the example profiler), indexed by the channel id
/// of kernel-channel and proxy-op events; the device path runs up to 128.
/// So channel `c` of `n` is reported as channel `c % 32`, and a reported
/// channel's kernel-channel event spans the channels folded onto it (an
/// Inspector with oxccl's 128 channels died of SIGSEGV in a 16 MiB
/// collective before this).
pub const REPORTED_CHANNELS: usize = 32;

/// The channel count a plugin is told for an operation on `nch` channels.
pub fn reported_channels(nch: usize) -> usize {
    nch.min(REPORTED_CHANNELS)
}

pub fn candidates(setting: Option<&str>) -> Vec<String> {
    loader::candidates(loader::PROFILER, setting)
}

fn refused(lib: &str, found: &[&str], reason: &str) -> String {
    let looked: Vec<&str> = SYMBOLS.iter().map(|s| s.0).collect();
    loader::refusal("profiler", lib, &looked, found, reason)
}

/// Finds and checks the profiler library.
pub fn load(setting: Option<&str>) -> Result<(Option<Arc<load::CProfiler>>, Outcome)> {
    let search = loader::open(loader::PROFILER, setting);
    let searched = search.tried.clone();
    let lib = match (search.opened, search.failed.first()) {
        (Some(l), _) => l,
        (None, Some((library, why))) => {
            let reason = format!("cannot be opened: {why}");
            warn!(target: "oxccl::init|profiler", "{}; no profiler", refused(library, &[], &reason));
            return Ok((
                None,
                Outcome::Refused {
                    library: library.clone(),
                    reason,
                    searched,
                },
            ));
        }
        (None, None) if loader::explicit(setting) => {
            return Err(Error::InvalidArgument(format!(
                "NCCL_PROFILER_PLUGIN={}: no such library (tried {}); set it to a library name, a path, or none",
                setting.unwrap_or_default().trim(),
                searched.join(", ")
            )));
        }
        (None, None) => return Ok((None, Outcome::NotFound { searched })),
    };
    match load::CProfiler::negotiate(&lib) {
        Ok(p) => {
            let version = format!("v{}", p.version);
            info!(target: "oxccl::init|profiler",
                "loaded profiler plugin {} from {} (ncclProfiler_{version})", p.name, lib.name());
            Ok((
                Some(Arc::new(p)),
                Outcome::Loaded {
                    library: lib.name().to_string(),
                    version,
                    searched,
                },
            ))
        }
        Err((found, reason)) => {
            warn!(target: "oxccl::init|profiler", "{}; no profiler", refused(lib.name(), &found, &reason));
            Ok((
                None,
                Outcome::Refused {
                    library: lib.name().to_string(),
                    reason,
                    searched,
                },
            ))
        }
    }
}

/// The process's profiler, loaded once.
pub fn shared(setting: Option<&str>) -> Result<Option<Arc<load::CProfiler>>> {
    static PROFILER: OnceLock<Option<Arc<load::CProfiler>>> = OnceLock::new();
    if let Some(p) = PROFILER.get() {
        return Ok(p.clone());
    }
    let (p, _) = load(setting)?;
    Ok(PROFILER.get_or_init(|| p).clone())
}

/// A profiler bound to one communicator.
pub struct ProfilerComm {
    p: Arc<load::CProfiler>,
    ctx: load::Ctx,
    rank: i32,
    /// The communicator's hash, which descriptors before v4 carry.
    comm_hash: u64,
    /// The next sequence number of each collective function: NCCL numbers
    /// each function's collectives on its own (`comm->seqNumber[func]`).
    seqs: [AtomicU64; 5],
}

impl ProfilerComm {
    /// `None` (one WARN line) when `init` fails: NCCL disables the plugin.
    pub fn new(
        p: Arc<load::CProfiler>,
        comm_id: u64,
        comm_name: Option<&str>,
        nranks: usize,
        rank: usize,
        nnodes: usize,
    ) -> Option<ProfilerComm> {
        match p.init(
            crate::plugin::ffi_log::logger(),
            comm_id,
            comm_name,
            nranks,
            rank,
            nnodes,
        ) {
            Ok(ctx) => Some(ProfilerComm {
                p,
                ctx,
                rank: rank as i32,
                comm_hash: comm_id,
                seqs: Default::default(),
            }),
            Err(e) => {
                warn!(target: "oxccl::profiler", "profiler plugin {}: {e}; no profiler for this communicator", p.name);
                None
            }
        }
    }

    /// The activation mask as the plugin has it now. The core reads it
    /// once per group and decides every event of the group with that
    /// value, as NCCL copies it into each task.
    pub fn mask(&self) -> i32 {
        load::MASK.load(Ordering::Relaxed)
    }

    /// Starts an event if `mask` (from [`ProfilerComm::mask`]) enables it.
    pub fn start(&self, mask: i32, ev: Event<'_>) -> Handle {
        if mask & ev.enabled_by() == 0 {
            return Handle::NONE;
        }
        self.p.start(&self.ctx, self.rank, self.comm_hash, &ev)
    }

    pub fn stop(&self, h: Handle) {
        self.p.stop(h)
    }

    /// Reports a state change of a started event (nothing for an untracked
    /// one).
    pub fn record(&self, h: Handle, state: i32, args: StateArgs) {
        self.p.record(h, state, args)
    }
}

/// The proxy-control events of a thread that progresses network
/// transfers (NCCL's `ncclProfileProxyCtrl`, which its proxy thread reports
/// in proxy.cc): "append" with the proxy ops taken on, "idle" / "active"
/// when a pass over its transfers stops or starts moving data, and
/// "sleep" / "wakeup" around a nap. Each is an event of its own, with no
/// parent, started and stopped around its states. Whether to report is
/// decided per event from the plugin's mask as it is then (NCCL does not
/// read these from a group's copy of the mask), so a profiler that never
/// asks costs one atomic load per state change.
pub struct ProxyCtrl<'a> {
    comm: Option<&'a ProfilerComm>,
    /// NCCL's proxy starts "not idle", so its first idle pass is reported.
    idle: bool,
}

impl<'a> ProxyCtrl<'a> {
    pub fn new(comm: Option<&'a ProfilerComm>) -> ProxyCtrl<'a> {
        ProxyCtrl { comm, idle: false }
    }

    pub fn has_profiler(&self) -> bool {
        self.comm.is_some()
    }

    fn start(&self) -> Option<(&'a ProfilerComm, Handle)> {
        let c = self.comm?;
        let h = c.start(c.mask(), Event::ProxyCtrl);
        (!h.0.is_null()).then_some((c, h))
    }

    fn record(c: &ProfilerComm, h: Handle, state: i32, appended: c_int) {
        c.record(h, state, StateArgs::ProxyCtrl { appended });
    }

    /// The thread took on `appended` proxy ops.
    pub fn append(&self, appended: usize) {
        if let Some((c, h)) = self.start() {
            Self::record(c, h, NCCL_PROFILER_PROXY_CTRL_APPEND, 0);
            let n = c_int::try_from(appended).unwrap_or(c_int::MAX);
            Self::record(c, h, NCCL_PROFILER_PROXY_CTRL_APPEND_END, n);
            c.stop(h);
        }
    }

    /// A pass over the transfers moved data (`moved`) or found nothing to
    /// do: reported when that changes.
    pub fn pass(&mut self, moved: bool) {
        if self.idle != moved {
            return;
        }
        self.idle = !moved;
        if let Some((c, h)) = self.start() {
            let state = if moved {
                NCCL_PROFILER_PROXY_CTRL_ACTIVE
            } else {
                NCCL_PROFILER_PROXY_CTRL_IDLE
            };
            Self::record(c, h, state, 0);
            c.stop(h);
        }
    }

    /// Runs `nap` between a "sleep" and a "wakeup".
    pub fn sleep<T>(&self, nap: impl FnOnce() -> T) -> T {
        let ev = self.start();
        if let Some((c, h)) = ev {
            Self::record(c, h, NCCL_PROFILER_PROXY_CTRL_SLEEP, 0);
        }
        let r = nap();
        if let Some((c, h)) = ev {
            Self::record(c, h, NCCL_PROFILER_PROXY_CTRL_WAKEUP, 0);
            c.stop(h);
        }
        r
    }
}

impl Drop for ProfilerComm {
    fn drop(&mut self) {
        self.p.finalize(&self.ctx);
    }
}

/// `ncclFunc_t` of an operation (profiler v1 carries codes).
fn func_code(kind: &crate::op::OpKind) -> u8 {
    use crate::op::OpKind;
    use oxccl_plugin::ffi::*;
    (match kind {
        OpKind::AllReduce => NCCL_FUNC_ALL_REDUCE,
        OpKind::Broadcast { .. } => NCCL_FUNC_BROADCAST,
        OpKind::Reduce { .. } => NCCL_FUNC_REDUCE,
        OpKind::AllGather => NCCL_FUNC_ALL_GATHER,
        OpKind::ReduceScatter => NCCL_FUNC_REDUCE_SCATTER,
        OpKind::Send { .. } => NCCL_FUNC_SEND,
        OpKind::Recv { .. } => NCCL_FUNC_RECV,
    }) as u8
}

/// `ncclRedOp_t` (sum, prod, max, min, avg; pre-multiplied sums are
/// user-created ops, numbered from ncclNumOps).
fn redop_code(op: crate::RedOp) -> u32 {
    use crate::RedOp;
    match op {
        RedOp::Sum => 0,
        RedOp::Prod => 1,
        RedOp::Max => 2,
        RedOp::Min => 3,
        RedOp::Avg => 4,
        RedOp::PreMulSum(_) => 5,
    }
}

/// NCCL's datatype names, as its profiler descriptors carry them
/// (`ncclDatatypeToString`; NCCL 2.30 has no case for ncclUint8 and says
/// "Unknown" there, which is not copied).
fn dtype_name(t: crate::DataType) -> &'static str {
    use crate::DataType as T;
    match t {
        T::Int8 => "ncclInt8",
        T::Uint8 => "ncclUint8",
        T::Int32 => "ncclInt32",
        T::Uint32 => "ncclUint32",
        T::Int64 => "ncclInt64",
        T::Uint64 => "ncclUint64",
        T::Float16 => "ncclFloat16",
        T::Float32 => "ncclFloat32",
        T::Float64 => "ncclFloat64",
        T::Bfloat16 => "ncclBfloat16",
        T::Float8e4m3 => "ncclFloat8e4m3",
        T::Float8e5m2 => "ncclFloat8e5m2",
    }
}

/// NCCL's function names, as profilers print them.
fn func(kind: &crate::op::OpKind) -> &'static str {
    use crate::op::OpKind;
    match kind {
        OpKind::AllReduce => "AllReduce",
        OpKind::Broadcast { .. } => "Broadcast",
        OpKind::Reduce { .. } => "Reduce",
        OpKind::AllGather => "AllGather",
        OpKind::ReduceScatter => "ReduceScatter",
        OpKind::Send { .. } => "Send",
        OpKind::Recv { .. } => "Recv",
    }
}

impl ProfilerComm {
    /// The API event of the call that queued `op` (`ncclProfileCollApi`
    /// or `ncclProfileP2pApi`), child of the group API event `parent`;
    /// started and stopped within the call, as NCCL does.
    pub fn api(&self, mask: i32, op: &crate::op::Op, parent: Handle) -> Handle {
        let (func, dtype) = (cname(func(&op.kind)), cname(dtype_name(op.dtype)));
        let ev = if op.kind.coll().is_some() {
            Event::CollApi {
                func,
                count: op.count,
                dtype,
                root: op.kind.root() as i32,
                parent,
                user_tag: op.user_tag,
            }
        } else {
            Event::P2pApi {
                func,
                count: op.count,
                dtype,
                parent,
                user_tag: op.user_tag,
            }
        };
        let h = self.start(mask, ev);
        self.stop(h);
        h
    }

    /// The collective event of `op` (child of the group event `parent`;
    /// from v5 on, of the API event `api`, with the group as `parentGroup`),
    /// numbered among its function's collectives whether or not the mask
    /// starts it, as NCCL counts them.
    /// `algo` is `None` for oxccl's direct host path, which NCCL has no
    /// name or code for: it is named "Direct", its v1 code is -1.
    #[allow(clippy::too_many_arguments, reason = "NCCL's descriptor fields")]
    pub fn coll(
        &self,
        mask: i32,
        op: &crate::op::Op,
        algo: Option<crate::algo::Algo>,
        nch: usize,
        parent: Handle,
        api: Handle,
    ) -> Handle {
        use crate::op::OpKind;
        let f = match op.kind {
            OpKind::AllReduce => 0,
            OpKind::Broadcast { .. } => 1,
            OpKind::Reduce { .. } => 2,
            OpKind::AllGather => 3,
            _ => 4,
        };
        let seq = self.seqs[f].fetch_add(1, Ordering::Relaxed);
        self.start(
            mask,
            Event::Coll {
                seq,
                func: cname(func(&op.kind)),
                count: op.count,
                root: op.kind.root() as i32,
                dtype: cname(dtype_name(op.dtype)),
                algo: cname(algo.map_or("Direct", |a| a.name())),
                nchannels: reported_channels(nch) as u8,
                parent,
                api,
                user_tag: op.user_tag,
                codes: Codes {
                    func: func_code(&op.kind),
                    dtype: op.dtype as u8,
                    op: redop_code(op.redop),
                    algo: algo.map_or(u8::MAX, |a| crate::algo::cost::nccl_row(a) as u8),
                },
            },
        )
    }

    /// The p2p event of `op` (child of the group event `parent`; from v5
    /// on, of the API event `api`), moving on `nch` channels.
    pub fn p2p(
        &self,
        mask: i32,
        op: &crate::op::Op,
        nch: usize,
        parent: Handle,
        api: Handle,
    ) -> Handle {
        use crate::op::OpKind;
        let peer = match op.kind {
            OpKind::Send { peer } | OpKind::Recv { peer } => peer as i32,
            _ => -1,
        };
        self.start(
            mask,
            Event::P2p {
                func: cname(func(&op.kind)),
                count: op.count,
                dtype: cname(dtype_name(op.dtype)),
                peer,
                nchannels: reported_channels(nch) as u8,
                parent,
                api,
                user_tag: op.user_tag,
                codes: Codes {
                    func: func_code(&op.kind),
                    dtype: op.dtype as u8,
                    ..Codes::default()
                },
            },
        )
    }
}

/// The API events above one group's operations on a communicator (NCCL's
/// `ncclProfilerApiState` and each task's API handle): the group API
/// event, and per operation, in order, the API event of its call.
#[derive(Clone, Default)]
pub struct ApiEvents {
    pub group: Option<Handle>,
    /// The first operation's event apart from the others', so that a lone
    /// call's events need no vector.
    first: Option<Handle>,
    rest: Vec<Handle>,
}

impl ApiEvents {
    /// The events of a group whose first operation's API event is `first`.
    pub fn new(group: Option<Handle>, first: Handle) -> ApiEvents {
        ApiEvents {
            group,
            first: Some(first),
            rest: Vec::new(),
        }
    }

    /// Adds the API event of the next operation.
    pub fn push(&mut self, h: Handle) {
        if self.first.is_none() {
            self.first = Some(h);
        } else {
            self.rest.push(h);
        }
    }

    /// The API event of operation `i` (NONE when none was started).
    pub fn op(&self, i: usize) -> Handle {
        let h = match i {
            0 => self.first,
            _ => self.rest.get(i - 1).copied(),
        };
        h.unwrap_or(Handle::NONE)
    }

    pub fn group(&self) -> Handle {
        self.group.unwrap_or(Handle::NONE)
    }

    /// The events of the operations `kept` (their indices in this group,
    /// in order), numbered from 0 as a group of those alone.
    pub fn of(&self, kept: impl IntoIterator<Item = usize>) -> ApiEvents {
        let mut a = ApiEvents {
            group: self.group,
            first: None,
            rest: Vec::new(),
        };
        kept.into_iter().for_each(|i| a.push(self.op(i)));
        a
    }
}

/// The group API event of an outermost group (started at its first
/// operation, as NCCL starts it in the first task append), with the
/// profiler and mask it was started under; stopped when dropped.
pub struct GroupApi {
    prof: Arc<ProfilerComm>,
    mask: i32,
    handle: Handle,
}

impl GroupApi {
    /// Starts it (`depth`: NCCL's group depth at the first call) and
    /// records `ncclProfilerGroupStartApiStop`, as NCCL does right away.
    pub fn start(prof: &Arc<ProfilerComm>, depth: i32) -> GroupApi {
        let mask = prof.mask();
        let handle = prof.start(mask, Event::GroupApi { depth });
        prof.record(
            handle,
            oxccl_plugin::ffi::profiler::NCCL_PROFILER_GROUP_START_API_STOP,
            StateArgs::None,
        );
        GroupApi {
            prof: prof.clone(),
            mask,
            handle,
        }
    }

    /// The API event of one call queued in the group, on `prof` (the
    /// call's communicator's profiler).
    pub fn call(&self, prof: &ProfilerComm, op: &crate::op::Op) -> Handle {
        prof.api(self.mask, op, self.handle)
    }

    /// `ncclProfilerGroupEndApiStart`: the outermost `group_end` begins.
    pub fn end_starts(&self) {
        self.prof.record(
            self.handle,
            oxccl_plugin::ffi::profiler::NCCL_PROFILER_GROUP_END_API_START,
            StateArgs::None,
        );
    }

    pub fn handle(&self) -> Handle {
        self.handle
    }
}

impl Drop for GroupApi {
    fn drop(&mut self) {
        self.prof.stop(self.handle);
    }
}

/// Stops its event when dropped, so that an operation's event ends on every
/// path out of it, errors included.
pub struct Running<'a>(&'a ProfilerComm, Handle);

impl ProfilerComm {
    pub fn running(&self, h: Handle) -> Running<'_> {
        Running(self, h)
    }
}

impl Running<'_> {
    /// The event, as the parent of events below it.
    pub fn handle(&self) -> Handle {
        self.1
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.stop(self.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_renumbers_its_operations_events() {
        let h = |n: usize| Handle(n as *mut std::os::raw::c_void);
        let mut all = ApiEvents::new(Some(h(9)), h(1));
        (2..5).for_each(|n| all.push(h(n)));
        let some = all.of([1, 3]);
        assert_eq!(
            (some.group(), some.op(0), some.op(1), some.op(2)),
            (h(9), h(2), h(4), Handle::NONE)
        );
    }
}
