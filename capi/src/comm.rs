//! Creating, splitting, querying and ending communicators.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int};
use std::sync::Once;

use oxccl::{Comm, CommConfig, Error, InitState, ShrinkMode, UniqueId};

use crate::guard::{entry, last_error, ok, Outcome};
use crate::handle;
use crate::types::*;

/// NCCL's version line, naming oxccl, where NCCL prints its own
/// (`NCCL_DEBUG=VERSION` or `INFO`), so a log tells which library ran.
fn start() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        oxccl::log::init();
        let nccl = format!("{NCCL_MAJOR}.{NCCL_MINOR}.{NCCL_PATCH}");
        let line = format!(
            "NCCL version {nccl}+oxccl-{} (oxccl's libnccl.so.2, implementing the NCCL {nccl} C API)",
            env!("CARGO_PKG_VERSION")
        );
        // As NCCL: a bare line at VERSION, a log line (any subsystem) above.
        let level = oxccl::config::var("NCCL_DEBUG").unwrap_or_default();
        match level.trim().to_ascii_uppercase().as_str() {
            "VERSION" => eprintln!("{line}"),
            "INFO" | "TRACE" => tracing::info!(target: "oxccl::all", "{line}"),
            _ => {}
        }
    });
}

/// Writes through a C out-pointer, refusing NULL with its name.
pub(crate) fn out<T>(what: &str, p: *mut T, v: T) -> Result<(), Error> {
    if p.is_null() {
        return Err(Error::InvalidArgument(format!("{what} is NULL")));
    }
    // SAFETY: non-null, and the caller passes a pointer to writable T, as
    // NCCL's signature requires.
    unsafe { p.write(v) };
    Ok(())
}

pub(crate) fn c_str(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-null string argument of NCCL's API is NUL-terminated.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// The caller's `ncclConfig_t`, read as far as its `size` says it goes,
/// with NCCL_COMM_BLOCKING, where set, replacing its `blocking` (or the
/// default's, for a NULL config), as NCCL's envConfigOverride does.
fn read_config(config: *const ncclConfig_t) -> Result<CommConfig, Error> {
    let mut cc = read_config_fields(config)?;
    if let Some(b) = oxccl::config::Config::load()?.comm_blocking {
        if b != cc.blocking {
            tracing::info!(target: "oxccl::env", "Comm config blocking {} reset to NCCL_COMM_BLOCKING={}", u8::from(cc.blocking), u8::from(b));
        }
        cc.blocking = b;
    }
    Ok(cc)
}

fn read_config_fields(config: *const ncclConfig_t) -> Result<CommConfig, Error> {
    let mut cc = CommConfig::default();
    if config.is_null() {
        return Ok(cc);
    }
    // SAFETY: non-null; `size` and `magic` are the first fields of every
    // version of the struct, so reading them is in bounds.
    let (size, magic) = unsafe { ((*config).size, (*config).magic) };
    if magic != NCCL_CONFIG_MAGIC {
        return Err(Error::InvalidArgument(format!(
            "config has magic {magic:#x}, not {NCCL_CONFIG_MAGIC:#x}: initialise it with NCCL_CONFIG_INITIALIZER"
        )));
    }
    let has = |end: usize| size >= end;
    let undef = c_int::MIN;
    // SAFETY: every field is read only when `size` covers it (fields keep
    // their offsets across versions; newer ones are appended).
    let c = unsafe { &*config };
    if has(std::mem::offset_of!(ncclConfig_t, blocking) + 4) && c.blocking != undef {
        cc.blocking = c.blocking != 0;
    }
    if has(std::mem::offset_of!(ncclConfig_t, netName) + 8) {
        if let Some(n) = c_str(c.netName) {
            cc.settings.push(("NET".into(), n));
        }
    }
    let flag = |v: c_int, name: &str| match v {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(Error::InvalidArgument(format!(
            "config {name} is {v}: it must be 0 or 1 (or left at NCCL_CONFIG_UNDEF_INT)"
        ))),
    };
    if has(std::mem::offset_of!(ncclConfig_t, splitShare) + 4) && c.splitShare != undef {
        cc.split_share = Some(flag(c.splitShare, "splitShare")?);
    }
    if has(std::mem::offset_of!(ncclConfig_t, shrinkShare) + 4) && c.shrinkShare != undef {
        cc.shrink_share = Some(flag(c.shrinkShare, "shrinkShare")?);
    }
    let int = |off: usize, v: c_int| (has(off + 4) && v != undef).then_some(v);
    use std::mem::offset_of;
    // The CTA fields become settings, which the environment replaces where
    // set (NCCL's envConfigOverride: "Comm config minCTAs reset to
    // NCCL_MIN_CTAS").
    let min = int(offset_of!(ncclConfig_t, minCTAs), c.minCTAs);
    let max = int(offset_of!(ncclConfig_t, maxCTAs), c.maxCTAs);
    for (v, field) in [(min, "minCTAs"), (max, "maxCTAs")] {
        if v.is_some_and(|v| v <= 0) {
            return Err(Error::InvalidArgument(format!(
                "config {field} is {}: it must be at least 1 (or left at NCCL_CONFIG_UNDEF_INT)",
                v.unwrap_or_default()
            )));
        }
    }
    if let (Some(lo), Some(hi)) = (min, max) {
        if lo > hi {
            return Err(Error::InvalidArgument(format!(
                "config minCTAs {lo} is above maxCTAs {hi}"
            )));
        }
    }
    let cluster = int(offset_of!(ncclConfig_t, cgaClusterSize), c.cgaClusterSize);
    if cluster.is_some_and(|v| v < 0) {
        return Err(Error::InvalidArgument(format!(
            "config cgaClusterSize is {}: it must be 0 or more",
            cluster.unwrap_or_default()
        )));
    }
    let policy = int(offset_of!(ncclConfig_t, CTAPolicy), c.CTAPolicy);
    if policy.is_some_and(|p| p & !(NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO) != 0) {
        return Err(Error::InvalidArgument(format!(
            "config CTAPolicy is {}: NCCL_CTA_POLICY_DEFAULT (0), _EFFICIENCY (1) or _ZERO (2)",
            policy.unwrap_or_default()
        )));
    }
    for (v, key) in [
        (min, "MIN_CTAS"),
        (max, "MAX_CTAS"),
        (cluster, "CGA_CLUSTER_SIZE"),
        (policy, "CTA_POLICY"),
    ] {
        let Some(v) = v else { continue };
        let var = format!("NCCL_{key}");
        match oxccl::config::var(&var) {
            Some(e) if !e.trim().is_empty() => {
                tracing::info!(target: "oxccl::env", "Comm config {key} {v} reset to {var}={e}")
            }
            _ => cc.settings.push((key.into(), v.to_string())),
        }
    }
    if has(offset_of!(ncclConfig_t, commName) + 8) {
        cc.name = c_str(c.commName);
    }
    cc.traffic_class = int(offset_of!(ncclConfig_t, trafficClass), c.trafficClass);
    // Fields oxccl has no use for: refused where they ask for something it
    // would silently not do, named in a WARN where running without them
    // gives the same results.
    // CollNet (all_reduce on host memory through a collnet plugin), as
    // NCCL_COLLNET_ENABLE, which replaces it where set, as in NCCL.
    if let Some(v) = int(offset_of!(ncclConfig_t, collnetEnable), c.collnetEnable) {
        if !(0..=1).contains(&v) {
            return Err(Error::InvalidArgument(format!(
                "config collnetEnable is {v}: 0 or 1"
            )));
        }
        match oxccl::config::var("NCCL_COLLNET_ENABLE") {
            Some(e) if !e.trim().is_empty() => {
                tracing::info!(target: "oxccl::env", "Comm config collnetEnable {v} reset to NCCL_COLLNET_ENABLE={e}")
            }
            _ => cc.settings.push(("COLLNET_ENABLE".into(), v.to_string())),
        }
    }
    let warn_if_set = [
        (offset_of!(ncclConfig_t, nvlsCTAs), c.nvlsCTAs, "nvlsCTAs", "oxccl runs no NVLS (NVLink SHARP) algorithm"),
        (offset_of!(ncclConfig_t, nChannelsPerNetPeer), c.nChannelsPerNetPeer, "nChannelsPerNetPeer", "send/recv to a net peer runs on the communicator's channels (NCCL_MAX_CTAS bounds them)"),
        (offset_of!(ncclConfig_t, nvlinkCentricSched), c.nvlinkCentricSched, "nvlinkCentricSched", "oxccl has one schedule per algorithm"),
        (offset_of!(ncclConfig_t, graphUsageMode), c.graphUsageMode, "graphUsageMode", "CUDA graphs and eager launches share one path"),
        (offset_of!(ncclConfig_t, numRmaCtx), c.numRmaCtx, "numRmaCtx", "oxccl has no one-sided (RMA) contexts yet"),
        (offset_of!(ncclConfig_t, maxP2pPeers), c.maxP2pPeers, "maxP2pPeers", "every peer is connected at creation"),
        (offset_of!(ncclConfig_t, graphStreamOrdering), c.graphStreamOrdering, "graphStreamOrdering", "captured work is always ordered on its stream"),
        (offset_of!(ncclConfig_t, launchOrderImplicit), c.launchOrderImplicit, "launchOrderImplicit", "each communicator's kernels are launched in the caller's order on the caller's stream; nothing orders launches across communicators"),
        (offset_of!(ncclConfig_t, numRmaSig), c.numRmaSig, "numRmaSig", "oxccl has no one-sided (RMA) signals yet"),
        (offset_of!(ncclConfig_t, rmaEagerInit), c.rmaEagerInit, "rmaEagerInit", "oxccl has no one-sided (RMA) contexts to set up"),
        (offset_of!(ncclConfig_t, hostCftMode), c.hostCftMode, "hostCftMode", "oxccl has no copy-engine (CFT) collectives"),
    ];
    for (off, v, field, why) in warn_if_set {
        if let Some(v) = int(off, v) {
            unused(field, v, why);
        }
    }
    Ok(cc)
}

/// One WARN for a config field that oxccl accepts but does not act on.
fn unused(field: &str, value: c_int, why: &str) {
    tracing::warn!(target: "oxccl::init", "config {field}={value} is not implemented by oxccl and is ignored: {why}");
}

/// As NCCL: a communicator belongs to the GPU the CUDA runtime would use on
/// the calling thread (cudaGetDevice: device 0 when none was selected),
/// whether or not a context is current yet. Host memory only where there is
/// no GPU, or when asked for.
fn device_for_new_comm() -> Result<Option<usize>, Error> {
    if host_memory_asked()? {
        return Ok(None);
    }
    Ok(oxccl::cuda::runtime_device())
}

/// OXCCL_HOST_MEMORY=1: communicators made through the C API run on host
/// memory even where GPUs exist (NCCL has no such mode; oxccl's host path
/// is its own).
fn host_memory_asked() -> Result<bool, Error> {
    oxccl::config::ox::host_memory()
}

fn init(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    id: &ncclUniqueId,
    rank: c_int,
    config: *const ncclConfig_t,
) -> Outcome {
    init_ids(newcomm, nranks, std::slice::from_ref(id), rank, config)
}

/// [`init`] through the roots of `ids` (several: ncclCommInitRankScalable).
fn init_ids(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    ids: &[ncclUniqueId],
    rank: c_int,
    config: *const ncclConfig_t,
) -> Outcome {
    start();
    if newcomm.is_null() {
        return Err(Error::InvalidArgument("newcomm is NULL".into()));
    }
    let n = usize::try_from(nranks)
        .map_err(|_| Error::InvalidArgument(format!("nranks {nranks} is negative")))?;
    let r = usize::try_from(rank)
        .map_err(|_| Error::InvalidArgument(format!("rank {rank} is negative")))?;
    let mut cc = read_config(config)?;
    cc.device = device_for_new_comm()?;
    // Inside a group NCCL creates communicators at ncclGroupEnd, so that
    // one thread can create several ranks of one communicator (nccl-tests
    // -g N). Here creation starts at once in the background, and
    // ncclGroupEnd waits for it.
    let in_group = oxccl::group::depth() > 0;
    let user_blocking = cc.blocking;
    if in_group {
        cc.blocking = false;
    }
    let ids: Vec<UniqueId> = ids.iter().map(id_from_c).collect();
    let comm = Comm::init_rank_scalable(n, &ids, r, &cc)?;
    if in_group && user_blocking {
        DEFERRED.with(|d| d.borrow_mut().push(comm.clone()));
    }
    publish_child(newcomm, comm, user_blocking)
}

thread_local! {
    /// Blocking communicators created inside this thread's group, which
    /// the outermost ncclGroupEnd waits for.
    static DEFERRED: std::cell::RefCell<Vec<Comm>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Waits for the communicators created inside the group that is ending.
pub(crate) fn finish_deferred() -> Result<(), Error> {
    let comms = DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut()));
    let mut first = Ok(());
    for c in comms {
        let r = c.wait_ready(std::time::Duration::from_secs(24 * 3600));
        if first.is_ok() {
            first = r;
        }
    }
    first
}

fn id_from_c(id: &ncclUniqueId) -> UniqueId {
    let mut bytes = [0u8; NCCL_UNIQUE_ID_BYTES];
    for (b, c) in bytes.iter_mut().zip(id.internal) {
        *b = c as u8;
    }
    UniqueId(bytes)
}

fn id_to_c(id: UniqueId) -> ncclUniqueId {
    let mut u = ncclUniqueId {
        internal: [0; NCCL_UNIQUE_ID_BYTES],
    };
    for (c, b) in u.internal.iter_mut().zip(id.0) {
        *c = b as c_char;
    }
    u
}

/// Writes the version of NCCL's API this library implements
/// (`NCCL_VERSION_CODE`, 23102 for 2.31.2).
#[no_mangle]
pub extern "C" fn ncclGetVersion(version: *mut c_int) -> ncclResult_t {
    entry("ncclGetVersion", || {
        out("version", version, NCCL_VERSION_CODE)?;
        ok()
    })
}

/// Creates a unique id and, unless `NCCL_COMM_ID` is set, starts its root here.
#[no_mangle]
pub extern "C" fn ncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t {
    entry("ncclGetUniqueId", || {
        start();
        let id = Comm::unique_id()?;
        out("uniqueId", uniqueId, id_to_c(id))?;
        ok()
    })
}

#[no_mangle]
pub extern "C" fn ncclCommInitRankConfig(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    entry("ncclCommInitRankConfig", || {
        init(comm, nranks, &commId, rank, config)
    })
}

#[no_mangle]
pub extern "C" fn ncclCommInitRank(
    comm: *mut ncclComm_t,
    nranks: c_int,
    commId: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    entry("ncclCommInitRank", || {
        init(comm, nranks, &commId, rank, std::ptr::null())
    })
}

/// Joins through the roots of the `nId` ids (the same ids in the same
/// order on every rank; 1 to nranks of them): the ranks are spread over
/// the roots in blocks as NCCL spreads them, each rank says hello to its
/// block's root, and the communicator is the one a single root makes.
#[no_mangle]
pub extern "C" fn ncclCommInitRankScalable(
    newcomm: *mut ncclComm_t,
    nranks: c_int,
    myrank: c_int,
    nId: c_int,
    commIds: *mut ncclUniqueId,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    entry("ncclCommInitRankScalable", || {
        if nId < 1 || nId > nranks.max(0) || commIds.is_null() {
            start();
            return Err(Error::InvalidArgument(format!(
                "nId is {nId} with nranks {nranks} and commIds {commIds:p}: nId must be 1 to nranks (one root per id, at most one per rank) and commIds must hold them"
            )));
        }
        // SAFETY: non-null and holding nId ids, by NCCL's contract.
        let ids = unsafe { std::slice::from_raw_parts(commIds, nId as usize) };
        init_ids(newcomm, nranks, ids, myrank, config)
    })
}

/// One communicator per GPU of `devlist` (or GPUs 0..ndev), all in this
/// process. Where no GPU exists they run on host memory.
#[no_mangle]
pub extern "C" fn ncclCommInitAll(
    comms: *mut ncclComm_t,
    ndev: c_int,
    devlist: *const c_int,
) -> ncclResult_t {
    entry("ncclCommInitAll", || {
        start();
        if comms.is_null() {
            return Err(Error::InvalidArgument("comms is NULL".into()));
        }
        let n = usize::try_from(ndev)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| Error::InvalidArgument(format!("ndev is {ndev}: must be at least 1")))?;
        let devs: Vec<usize> = if devlist.is_null() {
            (0..n).collect()
        } else {
            // SAFETY: non-null and holding ndev ints, by NCCL's contract.
            let d = unsafe { std::slice::from_raw_parts(devlist, n) };
            d.iter()
                .map(|&x| {
                    usize::try_from(x).map_err(|_| {
                        Error::InvalidArgument(format!("devlist holds {x}: not a GPU ordinal"))
                    })
                })
                .collect::<Result<_, _>>()?
        };
        let gpus = if host_memory_asked()? {
            0
        } else {
            oxccl::cuda::device_count().unwrap_or(0)
        };
        let made = if gpus == 0 {
            Comm::init_all(n, &CommConfig::default())?
        } else {
            if let Some(bad) = devs.iter().find(|&&d| d >= gpus) {
                return Err(Error::InvalidArgument(format!(
                    "devlist names GPU {bad}, but this machine has {gpus}"
                )));
            }
            Comm::init_all_devices(&devs, &CommConfig::default())?
        };
        for (i, c) in made.into_iter().enumerate() {
            // SAFETY: comms holds ndev handles, by NCCL's contract; i < ndev.
            unsafe { comms.add(i).write(handle::publish(c)) };
        }
        ok()
    })
}

#[no_mangle]
pub extern "C" fn ncclCommSplit(
    comm: ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    entry("ncclCommSplit", || {
        let h = handle::get(comm)?;
        if newcomm.is_null() {
            return Err(Error::InvalidArgument("newcomm is NULL".into()));
        }
        let mut cc = read_config(config)?;
        if config.is_null() {
            // NCCL copies the parent's config for a split given none.
            cc.split_share = Some(h.comm.split_share()?);
        }
        let child = h.comm.split(color, key, &cc)?;
        out(
            "newcomm",
            newcomm,
            child.map_or(std::ptr::null_mut(), handle::publish),
        )?;
        ok()
    })
}

/// The config of a communicator made from `parent` (shrink, grow): the
/// caller's, or for NULL the parent's blocking, splitShare and
/// shrinkShare, as NCCL copies the parent's config.
fn child_config(parent: &handle::Handle, config: *const ncclConfig_t) -> Result<CommConfig, Error> {
    let mut cc = read_config(config)?;
    if config.is_null() {
        cc.blocking = parent.blocking;
        cc.split_share = Some(parent.comm.split_share()?);
        cc.shrink_share = Some(parent.comm.shrink_share()?);
    }
    Ok(cc)
}

/// Hands a new communicator to the caller: ncclInProgress while a
/// non-blocking one is still being made.
fn publish_child(newcomm: *mut ncclComm_t, child: Comm, blocking: bool) -> Outcome {
    let pending = !blocking && matches!(child.async_error(), Ok(InitState::InProgress));
    out("newcomm", newcomm, handle::publish_as(child, blocking))?;
    Ok(if pending {
        ncclResult_t::ncclInProgress
    } else {
        ncclResult_t::ncclSuccess
    })
}

/// The survivors' communicator: every rank outside `excludeRanksList`
/// calls it with the same list (the excluded ones may be dead). With
/// `NCCL_SHRINK_ABORT` the operations still running on `comm` are ended
/// first. A NULL `config` inherits `comm`'s blocking, splitShare and
/// shrinkShare, as NCCL copies the parent's config.
#[no_mangle]
pub extern "C" fn ncclCommShrink(
    comm: ncclComm_t,
    excludeRanksList: *mut c_int,
    excludeRanksCount: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    shrinkFlags: c_int,
) -> ncclResult_t {
    entry("ncclCommShrink", || {
        let h = handle::get(comm)?;
        if newcomm.is_null() {
            return Err(Error::InvalidArgument("newcomm is NULL".into()));
        }
        let mode = match shrinkFlags {
            NCCL_SHRINK_DEFAULT => ShrinkMode::Default,
            NCCL_SHRINK_ABORT => ShrinkMode::Abort,
            f => {
                return Err(Error::InvalidArgument(format!(
                    "shrinkFlags is {f}: NCCL_SHRINK_DEFAULT (0) or NCCL_SHRINK_ABORT (1)"
                )))
            }
        };
        if excludeRanksList.is_null() {
            return Err(Error::InvalidArgument("excludeRanksList is NULL".into()));
        }
        let n = usize::try_from(excludeRanksCount)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "excludeRanksCount is {excludeRanksCount}: at least one rank is excluded"
                ))
            })?;
        // SAFETY: non-null and holding excludeRanksCount ints, by NCCL's
        // contract; only read.
        let list = unsafe { std::slice::from_raw_parts(excludeRanksList, n) };
        let exclude = list
            .iter()
            .map(|&r| {
                usize::try_from(r).map_err(|_| {
                    Error::InvalidArgument(format!("excludeRanksList holds {r}: not a rank"))
                })
            })
            .collect::<Result<Vec<usize>, Error>>()?;
        let cc = child_config(&h, config)?;
        let child = h.comm.shrink(&exclude, &cc, mode)?;
        publish_child(newcomm, child, cc.blocking)
    })
}

/// Ends this rank's operations in flight on `comm`; a blocking
/// communicator returns once they have ended, a non-blocking one may
/// return `ncclInProgress`, and `ncclCommGetAsyncError` then reports
/// `ncclInProgress` until they have, then `ncclSuccess`. Afterwards only
/// destroy, split and shrink are accepted. Host-memory communicators only
/// (a GPU communicator's revoke is refused, saying so).
#[no_mangle]
pub extern "C" fn ncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) -> ncclResult_t {
    entry("ncclCommRevoke", || {
        if comm.is_null() {
            // NCCL accepts revoking the NULL communicator.
            return ok();
        }
        if revokeFlags != NCCL_REVOKE_DEFAULT {
            return Err(Error::InvalidArgument(format!(
                "revokeFlags is {revokeFlags}: only NCCL_REVOKE_DEFAULT (0) is defined"
            )));
        }
        let h = handle::get(comm)?;
        let mut state = h.comm.revoke()?;
        // Made inside a group, a blocking communicator is non-blocking
        // underneath: wait here as the caller asked.
        if h.blocking && state == InitState::InProgress {
            state = h.comm.wait_revoked()?;
        }
        Ok(match state {
            InitState::Ready => ncclResult_t::ncclSuccess,
            InitState::InProgress => ncclResult_t::ncclInProgress,
        })
    })
}

/// The id of a grow of `comm`, made here (its root runs in this process)
/// and sent to `comm`'s other ranks; one at a time, each used by one grow.
#[no_mangle]
pub extern "C" fn ncclCommGetUniqueId(
    comm: ncclComm_t,
    uniqueId: *mut ncclUniqueId,
) -> ncclResult_t {
    entry("ncclCommGetUniqueId", || {
        let h = handle::get(comm)?;
        if uniqueId.is_null() {
            return Err(Error::InvalidArgument("uniqueId is NULL".into()));
        }
        let id = h.comm.grow_id()?;
        out("uniqueId", uniqueId, id_to_c(id))?;
        ok()
    })
}

/// NCCL's three ways in: an existing rank that made the id (comm, &id,
/// rank -1), the other existing ranks (comm, NULL, -1), and new ranks
/// (NULL, &id, their rank), which join as ncclCommInitRankConfig does. A
/// NULL config on an existing rank inherits its communicator's blocking,
/// splitShare and shrinkShare.
#[no_mangle]
pub extern "C" fn ncclCommGrow(
    comm: ncclComm_t,
    nRanks: c_int,
    uniqueId: *const ncclUniqueId,
    rank: c_int,
    newcomm: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    entry("ncclCommGrow", || {
        if newcomm.is_null() {
            return Err(Error::InvalidArgument("newcomm is NULL".into()));
        }
        out("newcomm", newcomm, std::ptr::null_mut())?;
        let n = usize::try_from(nRanks)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("nRanks is {nRanks}: it must be positive"))
            })?;
        // SAFETY: NULL or pointing at an id, by NCCL's contract; copied.
        let id = unsafe { uniqueId.as_ref() }.map(id_from_c);
        if comm.is_null() {
            let Some(id) = id else {
                return Err(Error::InvalidArgument(
                    "a new rank (comm NULL) passes the uniqueId its grow was given".into(),
                ));
            };
            if !(0..nRanks).contains(&rank) {
                return Err(Error::InvalidArgument(format!(
                    "a new rank's rank is {rank}: it must be in 0..{nRanks}"
                )));
            }
            return init(newcomm, nRanks, &id_to_c(id), rank, config);
        }
        let h = handle::get(comm)?;
        if rank != -1 {
            return Err(Error::InvalidArgument(format!(
                "rank is {rank}: existing ranks pass -1 (they keep their rank)"
            )));
        }
        let cc = child_config(&h, config)?;
        let grown = h.comm.grow(n, id, &cc)?;
        publish_child(newcomm, grown, cc.blocking)
    })
}

/// With `NCCL_SUSPEND_MEM`, suspends `comm` (every rank calls it, with
/// none of its operations outstanding): operations are refused until
/// ncclCommResume. On a GPU the device memory a resume rebuilds is
/// released (ncclStatGpuMemSuspend bytes); host-memory communicators hold
/// none. Without the flag it does nothing, as in NCCL.
#[no_mangle]
pub extern "C" fn ncclCommSuspend(comm: ncclComm_t, flags: c_int) -> ncclResult_t {
    entry("ncclCommSuspend", || {
        let h = handle::get(comm)?;
        if flags & NCCL_SUSPEND_MEM != 0 {
            h.comm.suspend()?;
        }
        ok()
    })
}

#[no_mangle]
pub extern "C" fn ncclCommResume(comm: ncclComm_t) -> ncclResult_t {
    entry("ncclCommResume", || {
        handle::get(comm)?.comm.resume()?;
        ok()
    })
}

/// NCCL's figures for the GPU memory a communicator allocated: Suspend
/// (what a suspend releases), Persist (what it keeps), Total (both; as in
/// NCCL, Suspend and Total count released memory too), Suspended (1 while
/// suspended). Memory held now is Persist while suspended, else Total. A
/// communicator on host memory holds no GPU memory.
#[no_mangle]
pub extern "C" fn ncclCommMemStats(
    comm: ncclComm_t,
    stat: ncclCommMemStat_t,
    value: *mut u64,
) -> ncclResult_t {
    entry("ncclCommMemStats", || {
        let h = handle::get(comm)?;
        if value.is_null() {
            return Err(Error::InvalidArgument("value is NULL".into()));
        }
        let st = h.comm.mem_stats()?;
        let v = match stat {
            ncclStatGpuMemSuspend => st.suspendable_bytes,
            ncclStatGpuMemSuspended => u64::from(st.suspended),
            ncclStatGpuMemPersist => st.device_bytes - st.suspendable_bytes,
            ncclStatGpuMemTotal => st.device_bytes,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "stat {other} is not an ncclCommMemStat_t (ncclStatGpuMemSuspend 0, ncclStatGpuMemSuspended 1, ncclStatGpuMemPersist 2, ncclStatGpuMemTotal 3)"
                )))
            }
        };
        out("value", value, v)?;
        ok()
    })
}

#[no_mangle]
pub extern "C" fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
    entry("ncclCommFinalize", || {
        handle::get(comm)?.comm.finalize()?;
        ok()
    })
}

#[no_mangle]
pub extern "C" fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
    entry("ncclCommDestroy", || {
        if comm.is_null() {
            // NCCL accepts destroying the NULL communicator.
            return ok();
        }
        handle::retire(comm)?.comm.destroy()?;
        ok()
    })
}

#[no_mangle]
pub extern "C" fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
    entry("ncclCommAbort", || {
        if comm.is_null() {
            return ok();
        }
        handle::retire(comm)?.comm.abort();
        ok()
    })
}

#[no_mangle]
pub extern "C" fn ncclCommGetAsyncError(
    comm: ncclComm_t,
    asyncError: *mut ncclResult_t,
) -> ncclResult_t {
    entry("ncclCommGetAsyncError", || {
        let h = handle::get(comm)?;
        let state = match h.comm.async_error() {
            Ok(InitState::Ready) => ncclResult_t::ncclSuccess,
            Ok(InitState::InProgress) => ncclResult_t::ncclInProgress,
            Err(e) => {
                crate::guard::set_last_error(&e.to_string());
                crate::guard::code_of(&e)
            }
        };
        out("asyncError", asyncError, state)?;
        ok()
    })
}

#[no_mangle]
pub extern "C" fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    entry("ncclCommCount", || {
        let n = handle::get(comm)?.comm.count();
        out("count", count, n as c_int)?;
        ok()
    })
}

#[no_mangle]
pub extern "C" fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    entry("ncclCommUserRank", || {
        let r = handle::get(comm)?.comm.user_rank();
        out("rank", rank, r as c_int)?;
        ok()
    })
}

/// The communicator's GPU; a host-memory communicator has none.
#[no_mangle]
pub extern "C" fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
    entry("ncclCommCuDevice", || {
        let d = handle::get(comm)?.comm.device()?.ok_or_else(|| {
            Error::InvalidUsage(
                "this communicator runs on host memory (no GPU was found when it was created, or OXCCL_HOST_MEMORY=1 was set): it has no GPU".into(),
            )
        })?;
        out("device", device, d as c_int)?;
        ok()
    })
}

#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: c_int) -> *const c_char {
    let s: &'static [u8] = match result {
        0 => b"no error\0",
        1 => b"unhandled cuda error (run with NCCL_DEBUG=INFO for details)\0",
        2 => b"unhandled system error (run with NCCL_DEBUG=INFO for details)\0",
        3 => b"internal error - please report this issue to the oxccl developers\0",
        4 => b"invalid argument (run with NCCL_DEBUG=WARN for details)\0",
        5 => b"invalid usage (run with NCCL_DEBUG=WARN for details)\0",
        6 => b"remote process exited or there was a network error\0",
        7 => b"NCCL operation in progress\0",
        8 => b"timeout\0",
        _ => b"unknown result code\0",
    };
    s.as_ptr().cast()
}

/// Reads NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE again, as
/// NCCL does (a call its header marks deprecated and not part of the
/// API): the lines after it follow the new values.
#[no_mangle]
pub extern "C" fn ncclResetDebugInit() {
    // No result to return: a failure here can only be logged.
    let _ = std::panic::catch_unwind(|| {
        start();
        if !oxccl::log::reinit() {
            tracing::warn!(target: "oxccl::init", "ncclResetDebugInit: another logger was installed before oxccl's; NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE are left to it");
        }
    });
}

/// The message of the last error in this process (empty if none).
#[no_mangle]
pub extern "C" fn ncclGetLastError(comm: ncclComm_t) -> *const c_char {
    let _ = (comm,);
    last_error()
}
