//! A ready communicator and how it runs operations: collectives one after
//! the other, each over its channels; point-to-point messages of a group all
//! at once.

mod collective;
mod sendrecv;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use oxccl_plugin::Net;
use tracing::{debug, info, warn};

use super::device_watch::{DeviceWatch, Watched};
use super::kernel_events::HostChannels;
use super::on_device::GpuPath;
use crate::algo::{self, cost, Algo, Region, Step};
use crate::bootstrap::{Bootstrap, PeerCall, PeerProgress};
use crate::config::Config;
use crate::dtype::{DataType, RedOp};
use crate::error::{Error, Failure, Result};
use crate::exec::header::OpHeader;
use crate::exec::{self, ExecCtx, Lane, ProxyProfiler, Stop, StopReason};
use crate::mem::OpBuffers;
use crate::op::{Op, OpKind};
use crate::plugin::profiler::{ApiEvents, Event, Handle, ProfilerComm, PROXY_OP_BITS};
use crate::plugin::tuner::TunerComm;
use crate::reduce::Reducer;
use crate::transport::cma::{PeerMem, Post};
use crate::transport::shm::ShmNet;
use crate::transport::{ConnKey, Connections, Locality, Transport, P2P_CHANNEL};

/// The direct host path ([`crate::algo::pull`]), peers' buffers read in
/// place. Every rank calls it at creation: a host-memory communicator whose
/// ranks all share this host (and its /dev/shm) and none of which
/// disabled shared memory gets the direct path if every rank may read
/// every other's memory. The INFO log says which way it went. `terms` are
/// rank 0's (every rank's came with the rank facts), `threads` this rank's.
pub(crate) fn setup_direct(
    bootstrap: &Bootstrap,
    loc: &Locality,
    terms: exec::host_direct::Terms,
    threads: exec::host_direct::Threads,
) -> Result<Option<exec::host_direct::Direct>> {
    let n = loc.hosts.len();
    let one_host = loc.hosts.iter().all(|h| *h == loc.hosts[0])
        && loc.shm_devs.iter().all(|d| *d == loc.shm_devs[0]);
    if n < 2 || !one_host || !loc.shm_disabled.is_empty() {
        return Ok(None);
    }
    let mut why = String::new();
    let pm = PeerMem::setup(loc.rank, n, &|b| bootstrap.allgather(b), &mut why)?;
    match pm {
        Some(pm) => {
            let d = exec::host_direct::Direct::new(pm, n, terms, threads)?;
            info!(target: "oxccl::init",
                "Host collectives of {} bytes and more (broadcast and reduce: {}) read peers' buffers directly (SHM/direct/CMA, up to {} threads per rank; OXCCL_HOST_DIRECT=0 turns it off)", d.terms.min, d.terms.rooted_min, d.threads.most());
            Ok(Some(d))
        }
        None => {
            info!(target: "oxccl::init",
                "Host collectives go through shared-memory rings only: {why}");
            Ok(None)
        }
    }
}
/// How old a progress query's answers a failure record may reuse.
const PROBE_FRESH: std::time::Duration = std::time::Duration::from_secs(1);

/// A failure record found without a timeout asks the ranks again, this
/// long apart, until no answer moves, for at most [`SETTLE_MOST`].
const SETTLE_STEP: std::time::Duration = std::time::Duration::from_millis(5);
const SETTLE_MOST: std::time::Duration = std::time::Duration::from_millis(300);

use crate::exec::Staging;

/// Whose staging a lane takes: a collective channel's, or for a
/// point-to-point lane (they all share one channel) its peer's and
/// direction's, so that the lanes of one group each keep their own.
type StagingKey = (usize, Option<(usize, bool)>);

/// What a host collective's plan depends on, besides this rank and the
/// ring order (fixed for the communicator): algorithm, collective (with
/// its root), element count, channels.
type PlanKey = (Algo, algo::Coll, usize, usize, usize);

/// A host collective's schedules and the containers of its lanes, kept
/// for the next call of the same shape: a loop of equal calls (a
/// benchmark's, a training step's) then builds no schedule, peer list or
/// lane vector per call, which for a small message were a visible share
/// of its latency.
struct Plan {
    key: PlanKey,
    /// One schedule per channel; moved into the lanes while they run.
    steps: Vec<Vec<Step>>,
    sends: Vec<ConnKey>,
    recvs: Vec<ConnKey>,
    /// Emptied, for their capacity.
    lanes: Vec<Lane>,
    bufs: Vec<Vec<OpBuffers>>,
}

fn staging_key(chan: usize, steps: &[Step]) -> StagingKey {
    if chan != P2P_CHANNEL {
        return (chan, None);
    }
    let peer = steps
        .first()
        .and_then(|s| s.send.map(|p| (p, true)).or(s.recv.map(|p| (p, false))));
    (chan, peer)
}

/// What plugins are told about the communicator at `init`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ident {
    /// NCCL's `commHash`: the same on every rank, different between
    /// communicators.
    pub comm_hash: u64,
    /// Distinct hosts among the ranks.
    pub nnodes: usize,
}

/// What a communicator's ranks told each other at creation
/// ([`super::ident::exchange`]) that the core plans with alike.
pub(crate) struct Agreed {
    pub ident: Ident,
    /// The slowest network link any rank's net plugin reported.
    pub inter: cost::LinkModel,
    /// Ranks with a tuner plugin library: unless every rank's tuner
    /// chooses alike ([`super::tuning`]), none is used.
    pub tuned: Vec<usize>,
    /// This rank's commName (its config's; not compared across ranks), for
    /// the profiler plugin.
    pub name: Option<String>,
}

/// The ids this rank made for growing its communicator (NCCL's
/// ncclCommGetUniqueId), each good for one grow.
#[derive(Default)]
pub(crate) struct GrowIds {
    /// Made and not yet used: no other may be made meanwhile.
    pub pending: Option<crate::bootstrap::UniqueId>,
    /// Used by a grow: never again.
    pub used: Vec<crate::bootstrap::UniqueId>,
}

pub(crate) struct Core {
    pub rank: usize,
    pub nranks: usize,
    pub cfg: Config,
    pub bootstrap: Bootstrap,
    pub net: Arc<dyn Net>,
    /// Set by abort, revoke and NCCL_SHRINK_ABORT: running operations end.
    pub stop: Stop,
    /// Calls inside [`Core::execute`] now, which a revoke waits out.
    inflight: AtomicUsize,
    /// Suspended (NCCL's `ncclCommSuspend`): operations are refused until
    /// a resume.
    pub suspended: AtomicBool,
    /// Collectives started, the number other ranks compare with on a timeout.
    seq: AtomicU64,
    /// Splits, shrinks and grows made from this communicator: every rank
    /// counts alike, which keeps their bootstrap messages apart.
    splits: AtomicU64,
    pub grow_ids: Mutex<GrowIds>,
    /// Point-to-point groups exchanged with each (peer, is_send).
    p2p_seq: Mutex<BTreeMap<(usize, bool), u64>>,
    conns: Mutex<Connections>,
    /// Staging buffers per lane, reused by every operation. Never freed
    /// before the connections that registered them are closed (see the
    /// `Drop`).
    staging: Mutex<BTreeMap<StagingKey, Staging>>,
    /// The last host collective's plan, for the next one of the same shape.
    plan: Mutex<Option<Plan>>,
    /// What NCCL_ALGO leaves the cost model: an algorithm it holds every
    /// collective to, or algorithms it leaves out.
    held: cost::Held,
    /// Whether collectives may take the direct path: no algorithm is
    /// forced and no tuner plugin chooses (NCCL's tables know only the
    /// rings and trees; the direct path runs none that NCCL_ALGO can
    /// exclude).
    direct_colls: bool,
    /// The ranks in ring order (the ring and trees are built over it).
    ring: Vec<usize>,
    /// The links collectives cross, for the cost model.
    fabric: cost::Fabric,
    /// The GPU this rank is bound to, when it was created on one: its
    /// operations take device memory.
    pub device: Option<GpuPath>,
    tuner: Option<TunerComm>,
    /// Shared with the thread that reports the device path's kernel-channel
    /// events.
    profiler: Option<Arc<ProfilerComm>>,
    /// That thread, started by the first group that asks for KernelCh events.
    kernel_events: std::sync::OnceLock<super::kernel_events::KernelEvents>,
    pub ident: Ident,
    /// Where the ranks run, which decides each peer's transport.
    pub locality: Locality,
    /// NCCL's `shareResources`: this communicator's splits take its network
    /// context (`net`) instead of making their own.
    pub split_share: bool,
    /// NCCL's `shrinkShare`: as `split_share`, for a shrink in its default
    /// mode from a communicator that is not revoked.
    pub shrink_share: bool,
    direct: Option<exec::host_direct::Direct>,
    /// The first failure record of an operation here, kept through a revoke.
    failure: Mutex<Option<Failure>>,
    /// On a GPU: the thread that watches launched collectives until they
    /// end, for a peer that called another count ([`Core::start_watch`]).
    watch: std::sync::OnceLock<DeviceWatch>,
    /// What RAS reports of this rank: collectives launched and in flight.
    pub ras: Option<Arc<crate::ras::CommRecord>>,
}

/// What the ranks must agree on about collective `seq`, `op`.
fn header_of(op: &Op, seq: u64) -> OpHeader {
    OpHeader {
        seq,
        kind: op.kind.code(),
        dtype: op.dtype as u8,
        redop: redop_code(op.redop),
        root: op.kind.root() as u32,
        count: op.count as u64,
        plan: None,
    }
}

fn redop_code(op: RedOp) -> u8 {
    match op {
        RedOp::Sum => 0,
        RedOp::Prod => 1,
        RedOp::Max => 2,
        RedOp::Min => 3,
        RedOp::Avg => 4,
        RedOp::PreMulSum(_) => 5,
    }
}

/// The links collectives cross, for the cost model, as every rank sees
/// them: between ranks of a host, shared memory where every pair of every
/// host uses it, else the network; between hosts, `inter` (the slowest any
/// rank reported). A rank judging only its own host would plan from other
/// links than its peers on another host, and choose another algorithm.
fn fabric_of(local: &Locality, inter: cost::LinkModel, nodes: usize) -> cost::Fabric {
    let intra = if local.shm_on_every_host() {
        cost::LinkModel::SHM
    } else {
        inter
    };
    cost::Fabric {
        intra,
        inter,
        nodes,
    }
}

/// The link between hosts as the net plugin's first device describes it.
pub(super) fn net_link(net: &dyn Net) -> cost::LinkModel {
    net.properties(0)
        .map(|p| cost::LinkModel::from_net(p.speed_mbps, p.latency_us))
        .unwrap_or_default()
}

/// NCCL's ring lines (`Channel 00/02 : 0 1 2 3`), one per channel, under
/// INIT: the order the ring (and the trees) follow, ranks of a host next to
/// each other.
fn log_rings(ring: &[usize], channels: usize) {
    let order: Vec<String> = ring.iter().map(|r| r.to_string()).collect();
    for c in 0..channels {
        info!(target: "oxccl::init", "Channel {c:02}/{channels:02} : {}", order.join(" "));
    }
}

impl Core {
    /// The core of rank `locality.rank` of `locality.hosts.len()`.
    pub fn new(
        cfg: Config,
        bootstrap: Bootstrap,
        net: Arc<dyn Net>,
        device: Option<GpuPath>,
        agreed: Agreed,
        locality: Locality,
        direct: Option<exec::host_direct::Direct>,
    ) -> Result<Core> {
        let ident = agreed.ident;
        let (rank, nranks) = (locality.rank, locality.hosts.len());
        let held = match cfg.algo.as_deref() {
            None => cost::Held::default(),
            Some(s) => {
                let a = algo::setting::parse(s)
                    .map_err(|why| Error::InvalidArgument(format!("NCCL_ALGO={s:?}: {why}")))?;
                if rank == 0 {
                    if let Some(why) = &a.unhonoured {
                        tracing::warn!(target: "oxccl::init|tuning", "NCCL_ALGO={s:?} is not honoured: {why}");
                    }
                    if !a.lacked.is_empty() {
                        info!(target: "oxccl::init|tuning", "NCCL_ALGO={s:?} excludes {}, which oxccl does not have", a.lacked.join(", "));
                    }
                    if !a.excluded.is_empty() {
                        let names: Vec<&str> = a.excluded.iter().map(|x| x.name()).collect();
                        info!(target: "oxccl::init|tuning", "NCCL_ALGO={s:?}: no collective runs {}", names.join(", "));
                    }
                }
                a.held()
            }
        };
        let cfg_tuner = cfg.tuner_plugin.clone();
        let profiler = crate::plugin::profiler::shared(cfg.profiler_plugin.as_deref())?
            .and_then(|p| {
                let name = agreed.name.as_deref();
                ProfilerComm::new(p, ident.comm_hash, name, nranks, rank, ident.nnodes)
            })
            .map(Arc::new);
        // Told either way: a proxy set up for a profiler waits to know.
        if let Some(GpuPath(dc, _)) = &device {
            if let Ok(mut dc) = dc.lock() {
                dc.set_profiler(profiler.as_ref());
                dc.set_graph_register(cfg.graph_register);
            }
        }
        let ring = algo::ring_order(&locality.hosts);
        let fabric = fabric_of(&locality, agreed.inter, ident.nnodes);
        let mut tuner = crate::plugin::tuner::shared(cfg_tuner.as_deref())?
            .and_then(|t| TunerComm::new(t, ident.comm_hash, nranks, ident.nnodes));
        if !agreed.tuned.is_empty() {
            // Every rank takes part: some rank has a tuner library.
            let mine = tuner.as_ref().map(|t| {
                super::tuning::answers(
                    |c, b| cost::cost_table(c, b, nranks, fabric, held),
                    |c, b, table, nch| t.tune(c, b, table, nch),
                )
            });
            if let Some(why) = super::tuning::agree(&bootstrap, mine.as_deref())? {
                warn!(target: "oxccl::init|tuning",
                    "Every rank must choose alike for each collective, and the ranks' tuner plugins do not: {why}. Every rank runs without its tuner (load the same tuner with the same configuration on every rank)");
                tuner = None;
            }
        }
        // NCCL_ALGO is rank 0's on every rank by now, and the tuner is on
        // every rank or on none.
        let direct_colls = tuner.is_none() && held.forced.is_none();
        log_rings(&ring, cfg.max_nchannels.max(1) as usize);
        let conns = Connections::new(net.clone(), ShmNet::new(cfg.buffsize), locality.clone());
        Ok(Core {
            rank,
            nranks,
            cfg,
            bootstrap,
            net,
            stop: Stop::default(),
            inflight: AtomicUsize::new(0),
            suspended: AtomicBool::new(false),
            seq: AtomicU64::new(0),
            splits: AtomicU64::new(0),
            grow_ids: Mutex::default(),
            p2p_seq: Mutex::default(),
            conns: Mutex::new(conns),
            staging: Mutex::default(),
            plan: Mutex::default(),
            held,
            direct_colls,
            ring,
            fabric,
            device,
            tuner,
            profiler,
            kernel_events: std::sync::OnceLock::new(),
            ident,
            locality,
            split_share: false,
            shrink_share: false,
            direct,
            failure: Mutex::new(None),
            watch: std::sync::OnceLock::new(),
            ras: None,
        })
    }

    /// Starts the watch of a GPU communicator's launched collectives
    /// (nothing on host memory), once the core is shared.
    pub fn start_watch(self: &Arc<Self>) -> Result<()> {
        if self.device.is_some() && self.watch.get().is_none() && crate::config::ox::device_watch()?
        {
            let w = DeviceWatch::start(Arc::downgrade(self), self.rank, self.nranks)?;
            let _ = self.watch.set(w);
        }
        Ok(())
    }

    /// Establishes the connections a set of lanes needs.
    fn connect(&self, conns: &mut Connections, sends: &[ConnKey], recvs: &[ConnKey]) -> Result<()> {
        conns
            .ensure(&self.bootstrap, sends, recvs, self.cfg.timeout(), &|| {
                self.stop.error("connecting to peers")
            })
            .map_err(|e| match self.bootstrap.remote_failure() {
                // A peer that failed (and left) refuses what follows: its
                // report says why.
                Some((who, msg)) if matches!(e, Error::Remote(_) | Error::System(_)) => {
                    Error::Remote(format!("rank {who} failed: {msg} (seen here as: {e})"))
                }
                _ => e,
            })
    }

    /// How this rank reaches `peer`.
    pub fn transport(&self, peer: usize) -> Transport {
        self.locality.transport(peer)
    }

    /// Seconds the cost model predicts for `op` on this communicator.
    /// The links the cost model plans with and what NCCL_ALGO leaves it,
    /// for choices made outside this module (CollNet).
    pub fn model(&self) -> (cost::Fabric, cost::Held) {
        (self.fabric, self.held)
    }

    pub fn predict(&self, op: &Op) -> f64 {
        let bytes = op.count * op.dtype.size();
        match op.kind.coll() {
            Some(coll) => {
                let algo = cost::choose(coll, bytes, self.nranks, self.fabric, self.held);
                cost::predict(algo, coll, bytes, self.nranks, self.fabric).unwrap_or(0.0)
            }
            None => {
                // A point-to-point message may cross hosts: the slower link.
                let l = self.fabric.inter;
                l.latency_s + bytes as f64 / l.bandwidth
            }
        }
    }

    /// Numbers the splits of this communicator, to keep their messages apart.
    pub fn next_split(&self) -> u64 {
        self.splits.fetch_add(1, Ordering::SeqCst)
    }

    /// The number [`Core::next_split`] gives next.
    pub fn peek_split(&self) -> u64 {
        self.splits.load(Ordering::SeqCst)
    }

    fn ctx<'a>(
        &'a self,
        what: &'a (dyn Fn() -> String + Sync),
        seq: Option<u64>,
        mask: i32,
    ) -> ExecCtx<'a> {
        ExecCtx {
            rank: self.rank,
            what,
            seq,
            timeout: self.cfg.timeout(),
            stop: &self.stop,
            bootstrap: &self.bootstrap,
            prof: self
                .profiler
                .as_ref()
                .filter(|_| mask & PROXY_OP_BITS != 0)
                .map(|comm| ProxyProfiler { comm, mask }),
            ctrl: self.profiler.as_deref(),
            direct: self.direct.as_ref(),
        }
    }

    /// A failure found after the call that enqueued it returned (the
    /// device path's network proxy stopped), as NCCL's asynchronous error.
    pub fn async_failure(&self) -> Option<Error> {
        if let Some(e) = self.watch.get().and_then(DeviceWatch::failure) {
            return Some(e);
        }
        let dc = self.device.as_ref()?.0.lock().ok()?;
        dc.failure()
    }

    /// The communicator's profiler, if a plugin is loaded.
    pub fn profiler(&self) -> Option<&Arc<ProfilerComm>> {
        self.profiler.as_ref()
    }

    /// Ends the operations running on this communicator (and refuses new
    /// ones) for `why`: the executor's loops see the flag, and waits on
    /// the bootstrap (connection handles) end at once.
    pub fn stop_operations(&self, why: StopReason) {
        self.stop_host(why);
        self.stop_device();
    }

    /// [`Core::stop_operations`] on the host alone: calls end, the device's
    /// work is left to run.
    pub fn stop_host(&self, why: StopReason) {
        self.stop.set(why);
        if let Some(e) = self.stop.error("waiting on a peer") {
            self.bootstrap.interrupt(e.message());
        }
    }

    /// Ends this GPU communicator's device work for good (nothing on host
    /// memory): its kernels return at their next poll and its host waits
    /// at once; [`Core::quiescent`] releases the rest and says when all
    /// ended.
    pub fn stop_device(&self) {
        if let Some(GpuPath(_, stop)) = &self.device {
            stop.raise();
        }
    }

    /// Whether no call is inside [`Core::execute`] and, on a GPU whose
    /// device work was stopped, none of it runs any more (the first look
    /// releases what waits on the streams).
    pub fn quiescent(&self) -> bool {
        if self.inflight.load(Ordering::SeqCst) != 0 {
            return false;
        }
        match &self.device {
            // A CUDA error here means the context runs nothing any more.
            Some(GpuPath(dc, stop)) if stop.is_raised() => dc
                .try_lock()
                .is_ok_and(|mut dc| dc.settle().unwrap_or(true)),
            _ => true,
        }
    }

    /// Whether this GPU communicator's device work has all finished (the
    /// work its caller put after it on the last stream too): true on host
    /// memory, false while another thread enqueues.
    pub fn device_idle(&self) -> bool {
        match &self.device {
            Some(GpuPath(dc, _)) => dc.try_lock().is_ok_and(|dc| dc.idle().unwrap_or(true)),
            None => true,
        }
    }

    /// Waits up to `limit` for [`Core::quiescent`]; whether it came.
    pub fn wait_quiescent(&self, limit: std::time::Duration) -> bool {
        let start = std::time::Instant::now();
        while !self.quiescent() {
            if start.elapsed() >= limit {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        true
    }

    /// A revoked communicator whose operations have ended: its bootstrap
    /// waits again (they were interrupted to end those operations), and
    /// the failure notices of other ranks no longer end them, so that a
    /// split or shrink among the living goes on. Idempotent.
    pub fn settle_revoke(&self) {
        self.bootstrap.resume();
        self.bootstrap.forgive_failures();
    }

    /// Waits (up to NCCL_TIMEOUT) for the operations a revoke ended, then
    /// settles the communicator.
    pub fn wait_revoked(&self) -> Result<()> {
        if !self.wait_quiescent(self.cfg.timeout()) {
            return Err(self.still_running());
        }
        self.settle_revoke();
        Ok(())
    }

    pub fn still_running(&self) -> Error {
        Error::Internal(format!(
            "rank {}: operations of the communicator were still running {:.1} s (NCCL_TIMEOUT) after they were told to end",
            self.rank,
            self.cfg.timeout().as_secs_f64()
        ))
    }

    /// Runs the operations of one group on this communicator; `api` holds
    /// the profiler's API events above them.
    pub fn execute(&self, ops: &[(Op, OpBuffers)], api: &ApiEvents) -> Result<()> {
        // Counted before the flag is read: a revoke sets the flag and then
        // waits for the count, so no call slips through unseen.
        self.inflight.fetch_add(1, Ordering::SeqCst);
        struct Leave<'a>(&'a AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _leave = Leave(&self.inflight);
        if let Some(e) = self.stop.error("operation") {
            return Err(e);
        }
        if self.suspended.load(Ordering::SeqCst) {
            return Err(Error::InvalidUsage(
                "the communicator is suspended (ncclCommSuspend): resume it (ncclCommResume) first"
                    .into(),
            ));
        }
        if let Some(GpuPath(dc, _)) = &self.device {
            let colls = || {
                ops.iter()
                    .map(|(op, _)| op)
                    .filter(|op| op.kind.coll().is_some())
            };
            let n = colls().count() as u64;
            let seq = self.seq.fetch_add(n, Ordering::SeqCst);
            let watch = self.watch.get();
            // As on host memory (`run_collective`): what each collective
            // is, a count of 0 too, for peers whose watch asks
            // (`device_watch`); without a watch (OXCCL_DEVICE_WATCH=0, the
            // default) nobody asks, and the launch does no more than before.
            if watch.is_some() {
                for (at, op) in (seq..).zip(colls()) {
                    self.bootstrap.record_call(at, header_of(op, at).encode());
                }
                if n > 0 {
                    self.bootstrap.progress().store(seq + n, Ordering::SeqCst);
                }
            }
            // The watch ended this communicator's device work: its kernels
            // no longer wait for their peers.
            if let Some(e) = watch.and_then(DeviceWatch::failure) {
                return Err(e);
            }
            if let Some(r) = &self.ras {
                ops.iter()
                    .filter_map(|(op, _)| op.kind.coll())
                    .for_each(|c| r.launched(crate::ras::func_index(c)));
            }
            let prof = self
                .profiler
                .as_ref()
                .map(|comm| super::on_device::Profiling {
                    comm,
                    mask: comm.mask(),
                    kernel_events: &self.kernel_events,
                    limit: self.cfg.timeout(),
                    rank: self.rank,
                    api,
                });
            let tuning = super::on_device::Tuning {
                tuner: self.tuner.as_ref(),
                held: self.held,
                checks: !self.cfg.checks_disable,
            };
            let watch = watch.map(|w| (w, seq..seq + n));
            return super::on_device::execute(dc, ops, tuning, prof, watch).map_err(|e| {
                // Ended by a revoke or abort: no peer failed.
                if let Some(stopped) = self.stop.error("operation") {
                    return stopped;
                }
                let e = e.context(format!(
                    "rank {} (device operations from #{seq})",
                    self.rank
                ));
                // A peer's failure gets its record and tells the other
                // ranks at once; a mistake of this caller's stays its own.
                if !matches!(e, Error::Remote(_) | Error::System(_)) {
                    return e;
                }
                let op = ops.first().map_or("?", |(op, _)| op.kind.name());
                self.failed(e, Some(seq), op)
            });
        }
        self.execute_host(ops, api)
    }

    /// Runs one group on host memory over the network.
    pub fn execute_host(&self, ops: &[(Op, OpBuffers)], api: &ApiEvents) -> Result<()> {
        let mut conns = self
            .conns
            .lock()
            .map_err(|_| Error::Internal("connection table poisoned by an earlier panic".into()))?;
        // Stopped while this call waited for the operation before it.
        if let Some(e) = self.stop.error("operation") {
            return Err(e);
        }
        // NCCL's profiler points: one group event per executed group, its
        // operations' events as children (started in run_collective, here
        // for p2p), the proxy events below those (in the executor). The
        // mask is read once for the group. Without a profiler, one branch.
        let prof = self.profiler.as_deref();
        let mask = prof.map_or(0, |p| p.mask());
        let group = prof.map(|p| p.start(mask, Event::Group));
        let r = (|| {
            let is_coll = |(_, (op, _)): &(usize, &(Op, OpBuffers))| op.kind.coll().is_some();
            for (i, (op, bufs)) in ops.iter().enumerate().filter(is_coll) {
                let parents = group.map(|g| (g, api.op(i)));
                self.run_collective(&mut conns, op, *bufs, parents, mask)?;
            }
            let p2p: Vec<(usize, &(Op, OpBuffers))> =
                ops.iter().enumerate().filter(|x| !is_coll(x)).collect();
            if !p2p.is_empty() {
                let evs: Vec<_> = match (prof, group) {
                    (Some(p), Some(g)) => p2p
                        .iter()
                        .map(|(i, (o, _))| p.p2p(mask, o, 1, g, api.op(*i)))
                        .collect(),
                    _ => Vec::new(),
                };
                let p2p: Vec<&(Op, OpBuffers)> = p2p.into_iter().map(|(_, x)| x).collect();
                let channels: Vec<_> = evs
                    .iter()
                    .filter_map(|&h| HostChannels::start(prof, mask, Some(h), 1))
                    .collect();
                let r = self.run_p2p(&mut conns, &p2p, &evs, mask);
                drop(channels);
                if let Some(p) = prof {
                    evs.into_iter().for_each(|h| p.stop(h));
                }
                r?;
            }
            Ok(())
        })();
        if let (Some(p), Some(g)) = (prof, group) {
            p.stop(g);
        }
        r
    }

    /// The host path's channel bounds (NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS).
    fn channel_bounds(&self) -> (usize, usize) {
        let lo = self.cfg.min_nchannels.max(1) as usize;
        let hi = (self.cfg.max_nchannels as usize).max(lo);
        (lo, hi)
    }

    fn channels(&self, bytes: usize) -> usize {
        let (lo, hi) = self.channel_bounds();
        // A channel is worth its thread once each rank's chunk fills several slices.
        let per = (self.cfg.chunk_size as usize).max(1) * 4 * self.nranks;
        (bytes / per).clamp(lo, hi)
    }

    /// Takes the connections a lane's steps use out of the table.
    #[allow(clippy::too_many_arguments)]
    fn lane(
        &self,
        conns: &mut Connections,
        label: exec::LaneLabel,
        chan: usize,
        steps: Vec<Step>,
        bufs: Vec<OpBuffers>,
        parents: Vec<Handle>,
        reducer: Reducer,
        header: OpHeader,
    ) -> Lane {
        // A collective's channel is one lane: it takes the channel's
        // connections whole. Point-to-point lanes share their channel, so
        // each takes only its peers.
        let (send, recv) = if chan < P2P_CHANNEL {
            (conns.send.take_channel(chan), conns.recv.take_channel(chan))
        } else {
            let (s, r) = peers_of(std::slice::from_ref(&steps), chan);
            (
                s.iter()
                    .filter_map(|k| conns.send.take(*k).map(|c| (k.1, c)))
                    .collect(),
                r.iter()
                    .filter_map(|k| conns.recv.take(*k).map(|c| (k.1, c)))
                    .collect(),
            )
        };
        let slice_bytes = (self.cfg.chunk_size as usize).max(64);
        // Through a poisoned lock too: buffers dropped here would still be
        // registered with connections.
        let staging = self
            .staging
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&staging_key(chan, &steps))
            .unwrap_or_default();
        Lane {
            staging,
            label,
            chan,
            steps,
            send,
            recv,
            bufs,
            reducer,
            header,
            slice_bytes,
            parents,
        }
    }

    /// Gives the lanes' connections and staging back, and their schedules
    /// and buffer lists to `keep`, in lane order; `lanes` is left empty.
    fn put_back(
        &self,
        conns: &mut Connections,
        lanes: &mut Vec<Lane>,
        mut keep: impl FnMut(Vec<Step>, Vec<OpBuffers>),
    ) {
        for lane in lanes.drain(..) {
            let chan = lane.chan;
            self.staging
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(staging_key(chan, &lane.steps), lane.staging);
            conns.send.put_back(chan, lane.send);
            conns.recv.put_back(chan, lane.recv);
            keep(lane.steps, lane.bufs);
        }
    }

    /// Ends the error of operation `op` (collective number `seq`) with its
    /// failure record ([`Failure`]): the one a peer's failure notice
    /// carries, else this rank's own, naming the ranks that do not answer
    /// a progress query. And tells the other ranks about a failure that
    /// started here, so that they fail at once rather than at their
    /// timeout, and take its record.
    fn failed(&self, e: Error, seq: Option<u64>, op: &str) -> Error {
        if self.stop.reason().is_some() {
            return e;
        }
        let from_peer = self.bootstrap.remote_failure();
        let e = match e {
            Error::Remote(_) | Error::System(_) if e.failure().is_none() => {
                let theirs = from_peer.as_ref().and_then(|(_, m)| Failure::parse(m));
                let record = theirs.unwrap_or_else(|| self.failure_record(seq, op));
                e.append(&record.tag())
            }
            e => e,
        };
        if let Some(f) = e.failure() {
            self.failure
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert(f);
        }
        if from_peer.is_none() {
            warn!(target: "oxccl::coll", rank = self.rank, "{e}");
            self.bootstrap.broadcast_failure(&e.to_string());
        }
        e
    }

    /// This rank's failure record of operation `op` (collective `seq`):
    /// the ranks that do not answer a progress query, and the lowest
    /// collective one of those that answer is in (a rank between two
    /// counts as in the last it started): a rank that finished `seq`
    /// before the failure reached it has the same record as one that did
    /// not.
    fn failure_record(&self, seq: Option<u64>, op: &str) -> Failure {
        // The timeout path has just asked, after NCCL_TIMEOUT without
        // progress: every rank has long stopped where it stops, and a
        // second ask would wait on a hung rank again.
        let progress = match self.bootstrap.cached_progress(PROBE_FRESH) {
            Some(p) => p,
            None => self.settled_progress(),
        };
        let ranks = (0..progress.len())
            .filter(|&r| progress[r] == PeerProgress::Unreachable)
            .collect();
        let seq = seq.map(|mine| {
            progress
                .iter()
                .filter_map(|p| match p {
                    PeerProgress::Started(n) => n.checked_sub(1),
                    PeerProgress::Unreachable => None,
                })
                .fold(mine, u64::min)
        });
        Failure {
            ranks,
            seq,
            op: op.to_string(),
        }
    }

    /// The ranks' progress once it stops moving. A rank that sees a peer
    /// leave (a closed connection, a dead process) sees it at once, while
    /// other survivors may still be finishing the operation before the
    /// one they stop in: a record from that moment would name an earlier
    /// collective than a survivor that looks later, and every survivor's
    /// record must be the same (it is the shrink's exclude list and what
    /// the application compares).
    fn settled_progress(&self) -> Vec<PeerProgress> {
        let start = std::time::Instant::now();
        let mut progress = self.bootstrap.query_progress();
        while start.elapsed() < SETTLE_MOST {
            std::thread::sleep(SETTLE_STEP);
            let again = self.bootstrap.query_progress();
            if again == progress {
                break;
            }
            progress = again;
        }
        progress
    }

    /// The first failure record of an operation here (see [`Failure`]).
    pub fn failure(&self) -> Option<Failure> {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Watched for Core {
    fn own_call(&self, seq: u64) -> Option<[u8; crate::bootstrap::CALL_BYTES]> {
        self.bootstrap.own_call(seq)
    }

    fn ask(&self, peers: &[usize], seq: u64, wait: std::time::Duration) -> Vec<(usize, PeerCall)> {
        self.bootstrap.query_call(peers, seq, wait)
    }

    fn remote_failure(&self) -> Option<(usize, String)> {
        self.bootstrap.remote_failure()
    }

    /// Records and tells the other ranks first (a peer's notice ends their
    /// watch), then ends this rank's kernels and releases its stream waits,
    /// as a revoke does.
    fn fail(&self, e: Error, seq: u64) -> Error {
        let op = self
            .bootstrap
            .own_call(seq)
            .and_then(|b| OpHeader::decode(&b))
            .and_then(|h| exec::header::KIND_NAMES.get(h.kind as usize).copied())
            .unwrap_or("collective");
        let e = self.failed(e, Some(seq), op);
        self.stop_device();
        if let Some(GpuPath(dc, _)) = &self.device {
            // An enqueue may hold the lock a while; the kernels have ended
            // their waits already, the stream waits are released here.
            for _ in 0..1000 {
                if let Ok(mut dc) = dc.try_lock() {
                    let _ = dc.settle();
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        e
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        if let Some(w) = self.watch.get() {
            w.close();
        }
        // The connections deregister the host path's slots as they close:
        // they go first, while that memory still exists.
        let conns = self.conns.get_mut().unwrap_or_else(PoisonError::into_inner);
        conns.send.clear();
        conns.recv.clear();
    }
}

/// The connections steps use, as (channel, peer) keys.
fn peers_of(plans: &[Vec<Step>], first_chan: usize) -> (Vec<ConnKey>, Vec<ConnKey>) {
    let (mut s, mut r) = (Vec::new(), Vec::new());
    for (i, steps) in plans.iter().enumerate() {
        let chan = if first_chan == P2P_CHANNEL {
            P2P_CHANNEL
        } else {
            first_chan + i
        };
        for st in steps {
            if let Some(p) = st.send {
                s.push((chan, p));
            }
            if let Some(p) = st.recv {
                r.push((chan, p));
            }
        }
    }
    s.sort_unstable();
    s.dedup();
    r.sort_unstable();
    r.dedup();
    (s, r)
}
