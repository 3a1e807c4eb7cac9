//! Operations of a communicator bound to a GPU: handed to the device
//! executor, which enqueues kernels on the caller's stream and returns
//! without waiting (NCCL's contract). The communicator's bootstrap carries
//! the executor's setup exchange.

use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use oxccl_plugin::ffi::profiler::{NCCL_PROFILE_KERNEL_CH, NCCL_PROFILE_KERNEL_LAUNCH};

use crate::bootstrap::Bootstrap;
use tracing::{debug, info};

use super::device_watch::DeviceWatch;
use super::ident::Peers;
use super::kernel_events::KernelEvents;
use super::topology::NodeTopo;
use crate::algo::{cost, Coll};
use crate::config::Config;
use crate::cuda::{pointer_kind, Device, PtrKind, RawStream, SavedCurrent};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::exec::device::{
    Choice, DeviceComm, DeviceConfig, DeviceStop, Oob, ProxyParents, Transports,
};
use crate::mem::OpBuffers;
use crate::op::{Op, OpKind};
use crate::plugin::profiler::{Event, Handle, ProfilerComm, ProxyProfiler};
use crate::plugin::tuner::TunerComm;
use crate::topo::system::PluginDev;
use crate::topo::{policy, BusId, PciNode};
use crate::transport::gdr;
use crate::transport::shm::ShmNet;
use crate::transport::{ConnKey, Connections, Locality, P2pPairs, Transport};
use oxccl_plugin::{Net, PtrType};

/// The bootstrap as the device executor's out-of-band exchange.
struct BootstrapOob<'a> {
    bootstrap: &'a Bootstrap,
    rank: usize,
    nranks: usize,
}

impl Oob for BootstrapOob<'_> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn nranks(&self) -> usize {
        self.nranks
    }

    fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.bootstrap.allgather(mine)
    }
}

/// How a GPU rank's operations move: kernels storing into the areas of
/// its peers, whichever transport reaches each; and what ends them now,
/// outside the lock (which an enqueue may hold while it waits on a peer).
pub(crate) struct GpuPath(pub Mutex<DeviceComm>, pub Arc<DeviceStop>);

impl GpuPath {
    pub fn ordinal(&self) -> Option<usize> {
        self.0.lock().ok().map(|d| d.context().device().ordinal())
    }
}

/// Binds this rank to GPU `device`: every rank of the communicator calls
/// it during creation. Each peer is reached as NCCL reaches it (see
/// [`Locality::device_transport`]): the peer's GPU memory over P2P, else
/// shared host memory on one host, else the network through a proxy
/// thread; the same kernels run over all three.
pub(crate) fn open(
    bootstrap: &Bootstrap,
    peers: &Peers,
    device: usize,
    cfg: &Config,
    net: &Arc<dyn Net>,
    locality: &Locality,
) -> Result<GpuPath> {
    let _restore = SavedCurrent::save()?;
    let (rank, nranks) = (locality.rank, locality.hosts.len());
    let topo = NodeTopo::open(bootstrap, cfg, device, rank)?;
    let p2p = topo.p2p_pairs(bootstrap, cfg, locality, peers)?;
    let routes: Vec<Transport> = (0..nranks)
        .map(|p| locality.device_transport(p, &p2p))
        .collect();
    let mut dcfg = DeviceConfig::from_env()?.with_nccl_bounds(cfg)?;
    // Every rank takes the window layout of host memory where any pair of
    // ranks goes through it (NCCL_P2P_DISABLE on a rank, a pair beyond
    // NCCL_P2P_LEVEL, or another host): the layout stays the same on
    // every rank, which all know every pair's transport.
    let hosted = (0..nranks).any(|a| {
        (0..nranks)
            .any(|b| a != b && locality.device_transport_between(a, b, &p2p) != Transport::P2p)
    });
    if hosted {
        dcfg = dcfg
            .through_host(cfg)?
            .with_protocols(cfg.proto.as_deref())?;
        log_routes(locality, &routes, dcfg.channels_for(None));
    }
    let oob = BootstrapOob {
        bootstrap,
        rank,
        nranks,
    };
    let (gdr, gdr_read) = match routes.contains(&Transport::Net) {
        true => gpu_direct(&**net, device, cfg, &topo)?,
        false => (gdr::Decision::off(String::new()), false),
    };
    let mut conns = Connections::new(net.clone(), ShmNet::new(cfg.buffsize), locality.clone());
    if routes.contains(&Transport::Net) {
        conns = conns.with_nics(topo.nic_plan(&**net, cfg, locality)?);
    }
    let timeout = cfg.timeout();
    let connect = move |peers: &[usize], chans: &[usize]| {
        let keys: Vec<ConnKey> = peers
            .iter()
            .flat_map(|&p| chans.iter().map(move |&c| (c, p)))
            .collect();
        conns.ensure(bootstrap, &keys, &keys, timeout, &|| None)?;
        conns.take_links(peers, chans)
    };
    // The communicator attaches the profiler after this; a proxy that may
    // report to it waits to know (see `Areas::profiled`).
    let profiled = crate::plugin::profiler::shared(cfg.profiler_plugin.as_deref())
        .ok()
        .flatten()
        .is_some();
    let inter = peers.net_link;
    let tr = Transports {
        routes,
        connect: Box::new(connect),
        gdr: gdr.on,
        dmabuf: gdr.dmabuf,
        profiled,
        fabric: device_fabric(locality, &p2p, inter, peers.nnodes),
        topo: topo.from_file.then(|| Arc::new(topo.node.clone())),
        gdr_read,
        cpus: helper_cpus(device, cfg.ignore_cpu_affinity),
        nccl_names: cfg.set_thread_name,
    };
    let dc = DeviceComm::with_transports(&oob, device, dcfg, tr)
        .map_err(|e| e.context(format!("binding rank {rank} to GPU {device}")))?;
    if hosted {
        info!(target: "oxccl::init", "rank {rank} on GPU {device}: {} MiB of host memory registered for peers reached through it{}{}", dc.host_bytes() >> 20,
        match (gdr.on, gdr.dmabuf, gdr_read) {
            (true, true, true) => "; net peers' step slots in GPU memory (GPUDirect), registered as dma-buf",
            (true, false, true) => "; net peers' step slots in GPU memory (GPUDirect)",
            (true, true, false) => "; net peers' receive slots in GPU memory (GPUDirect), registered as dma-buf, send slots in host memory (NCCL_NET_GDR_READ)",
            (true, false, false) => "; net peers' receive slots in GPU memory (GPUDirect), send slots in host memory (NCCL_NET_GDR_READ)",
            _ => "",
        },
        match dc.ll_bound() {
            Some(0) => "; LL protocol off (NCCL_PROTO)".to_string(),
            Some(usize::MAX) => "; LL protocol at every size (NCCL_PROTO)".to_string(),
            Some(b) => format!("; LL protocol up to {b} B per rank"),
            None => String::new(),
        });
    }
    let stop = dc.stopper();
    Ok(GpuPath(Mutex::new(dc), stop))
}

/// Releases this rank's device memory that a resume rebuilds (NCCL's
/// `ncclCommSuspend` with `NCCL_SUSPEND_MEM`; see
/// [`DeviceComm::suspend`]): every rank calls it. The bytes released.
pub(crate) fn suspend(gpu: &GpuPath, bootstrap: &Bootstrap, limit: Duration) -> Result<usize> {
    let mut dc = lock(gpu)?;
    let oob = BootstrapOob {
        bootstrap,
        rank: dc.rank(),
        nranks: dc.nranks(),
    };
    dc.suspend(&oob, limit)
}

/// Rebuilds what [`suspend`] released, as at creation (NCCL's
/// `ncclCommResume`); every rank calls it.
pub(crate) fn resume(gpu: &GpuPath, bootstrap: &Bootstrap) -> Result<()> {
    let mut dc = lock(gpu)?;
    let oob = BootstrapOob {
        bootstrap,
        rank: dc.rank(),
        nranks: dc.nranks(),
    };
    dc.resume(&oob)
}

pub(super) fn lock(gpu: &GpuPath) -> Result<std::sync::MutexGuard<'_, DeviceComm>> {
    gpu.0
        .lock()
        .map_err(|_| Error::Internal("device communicator poisoned by an earlier panic".into()))
}

/// Whether the network reads and writes this GPU's memory itself, and
/// through what registration (see [`gdr::decide`]), said once per
/// communicator in NCCL's words.
fn gpu_direct(
    net: &dyn Net,
    device: usize,
    cfg: &Config,
    topo: &NodeTopo,
) -> Result<(gdr::Decision, bool)> {
    let sys = std::path::Path::new("/sys");
    let props = (0..net.devices()?.max(1))
        .map(|d| net.properties(d))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let dev = Device::get(device)?;
    let gpu = dev
        .pci_bus_id()
        .ok()
        .and_then(|b| b.parse::<BusId>().ok())
        .and_then(|b| PciNode::read(sys, b).ok());
    // As NCCL, only for a network that takes dma-buf (a C plugin's only
    // with a regMrDmaBuf entry, see plugin::net).
    let takes_dmabuf = props
        .iter()
        .any(|p| p.ptr_support & PtrType::Dmabuf as i32 != 0);
    let dmabuf = cfg.dmabuf_enable && takes_dmabuf && dev.dma_buf_supported();
    if dmabuf {
        info!(target: "oxccl::init", "DMA-BUF is available on GPU device {device}");
    }
    // A topology file places the GPU and the NICs; else sysfs does.
    let placed = topo
        .buses
        .get(topo.rank)
        .copied()
        .flatten()
        .and_then(|b| topo.node.gpu(b))
        .filter(|_| topo.from_file);
    let mut d = match placed {
        Some(g) => {
            let devs: Vec<PluginDev> = props
                .iter()
                .map(|p| PluginDev::new(&p.name, &p.pci_path, p.speed_mbps.max(0) as u64))
                .collect();
            let paths: Vec<gdr::Level> = topo
                .node
                .net_candidates(g, &devs)
                .iter()
                .map(|c| gdr::Level::of_path(c.path))
                .collect();
            gdr::decide_on(&props, &paths, cfg.net_gdr_level.as_deref(), dmabuf)?
        }
        None => gdr::decide(
            &props,
            gpu.as_ref(),
            cfg.net_gdr_level.as_deref(),
            sys,
            dmabuf,
        )?,
    };
    let cc = dev.compute_capability()?;
    if d.on && cc.0 < 9 {
        // NCCL flushes GPUDirect receives there (iflush); the proxy does not.
        d = gdr::Decision::off(format!("sm_{}{} needs a flush after each GPUDirect receive, which is not built (Hopper and later need none)", cc.0, cc.1));
    }
    info!(target: "oxccl::init", "NET/{} : GPU Direct RDMA {} for GPU {device}: {}", net.name(),
        if d.on { "Enabled" } else { "Disabled" }, d.why);
    let read = d.on
        && {
            let node = &topo.node;
            let me = topo.buses[topo.rank].and_then(|b| node.gpu(b));
            let nvlink_peer = me.is_some_and(|g| {
                node.gpus()
                    .iter()
                    .any(|o| o.bus != g.bus && node.nvlinks(g, o) > 0)
            });
            let read = policy::gdr_read(cfg.net_gdr_read, cc, nvlink_peer, node.gpus().len() == 1);
            info!(target: "oxccl::init", "NET/{} : GPU Direct RDMA reads (sends) {} for GPU {device} ({})", net.name(),
            if read { "Enabled" } else { "Disabled" },
            match cfg.net_gdr_read {
                Some(v) => format!("NCCL_NET_GDR_READ={}", u8::from(v)),
                None => format!("default for sm_{}{}{}", cc.0, cc.1, if nvlink_peer { " with NVLink" } else { "" }),
            });
            read
        };
    Ok((d, read))
}

/// The links the device path's cost table prices: inside a node the
/// slowest transport any pair of ranks there uses (NVLink P2P, step slots
/// in shared memory, or the network when both are off), between nodes
/// `inter` (the net plugin's) across `nodes` hosts. Computed from what
/// every rank was told, so that every rank prices alike and chooses alike.
fn device_fabric(
    local: &Locality,
    p2p: &P2pPairs,
    inter: cost::LinkModel,
    nodes: usize,
) -> cost::Fabric {
    let n = local.hosts.len();
    // How far each transport is from NVLink, for the worst of them.
    let slowness = |t: &Transport| match t {
        Transport::P2p => 0,
        Transport::Shm => 1,
        Transport::Net => 2,
    };
    let worst = (0..n)
        .flat_map(|r| (0..n).map(move |p| (r, p)))
        .filter(|&(r, p)| r != p && local.hosts[p] == local.hosts[r])
        .map(|(r, p)| local.device_transport_between(r, p, p2p))
        .max_by_key(slowness);
    let intra = match worst {
        None | Some(Transport::P2p) => cost::LinkModel::NVLINK,
        Some(Transport::Shm) => cost::LinkModel::SHM_DEVICE,
        Some(Transport::Net) => inter,
    };
    cost::Fabric {
        intra,
        inter,
        nodes,
    }
}

/// NCCL's connection lines for the peers the kernels reach directly (P2P
/// and SHM; the network's connections log themselves as they are made),
/// the ring's next rank on every channel, as NCCL logs its rings.
fn log_routes(local: &Locality, routes: &[Transport], channels: usize) {
    let n = routes.len();
    let next = (local.rank + 1) % n;
    if next == local.rank {
        return;
    }
    let (me, peer) = (local.who(local.rank), local.who(next));
    let via = match routes[next] {
        Transport::P2p => "P2P/IPC",
        Transport::Shm => "SHM/direct/direct",
        Transport::Net => return,
    };
    for c in 0..channels {
        info!(target: "oxccl::init", "Channel {c:02}/0 : {me} -> {peer} via {via}");
    }
}

/// The profiler as one group of the device path reports to it: NCCL's
/// points (a group event, an event per operation, started before its
/// kernel is launched and stopped once it is enqueued), and, when the mask
/// asks for them, kernel-channel events from the launches' GPU times.
pub(crate) struct Profiling<'a> {
    pub comm: &'a Arc<ProfilerComm>,
    pub mask: i32,
    pub kernel_events: &'a OnceLock<KernelEvents>,
    /// How long a launch may run before its channel events are given up.
    pub limit: Duration,
    pub rank: usize,
    /// The API events above the group's operations.
    pub api: &'a crate::plugin::profiler::ApiEvents,
}

/// What chooses how a collective runs, besides the device's own table:
/// the tuner plugin and NCCL_ALGO.
pub(crate) struct Tuning<'a> {
    pub tuner: Option<&'a TunerComm>,
    /// What NCCL_ALGO leaves the cost table.
    pub held: cost::Held,
    /// Whether buffers are checked before launch (not NCCL_CHECKS_DISABLE).
    pub checks: bool,
}

/// The algorithm and channels of one collective: the cheapest entry of the
/// device's cost table (NCCL_ALGO masks it), as the tuner changed it. Every
/// rank decides alike: the same table, tuner and settings.
/// A call's own settings (`op.call`) narrow the communicator's: its
/// algorithm row replaces NCCL_ALGO's, its CTA bounds hold the count
/// within 1 and the window's channels.
fn choose(dc: &DeviceComm, t: &Tuning<'_>, coll: Coll, op: &Op) -> Choice {
    let (count, dtype) = (op.count, op.dtype);
    let forced = match op.call.algo {
        Some(a) => cost::Held::from(Some(a)),
        None => t.held,
    };
    let narrow =
        |c: Choice| Choice::new(c.algo, op.call.narrow(c.channels, 1, dc.config().channels));
    let own = narrow(dc.default_choice(coll, count, dtype, forced));
    let Some(tuner) = t.tuner else {
        return own;
    };
    let (bytes, n, model) = (count * dtype.size(), dc.nranks(), own.algo);
    let table = cost::device_table(coll, bytes, n, dc.fabric(), forced);
    let (algo, channels) = crate::plugin::tuner::decide(
        tuner,
        coll,
        bytes,
        n,
        table,
        model,
        own.channels,
        dc.config().channels,
    );
    // A tuner that made an entry the device does not run the cheapest is
    // not obeyed there (NCCL's tuners may only lower usable entries).
    let algo = if cost::device_runs(algo, coll, n) {
        algo
    } else {
        debug!(target: "oxccl::tuning", "tuner {} chose {} for {} on {n} ranks, which the device does not run; {} instead",
            tuner.name(), algo.name(), coll.name(), model.name());
        model
    };
    narrow(Choice::new(algo, channels))
}

/// Enqueues one group's operations of this communicator: collectives in
/// order, then the point-to-point messages together.
/// `watch`: the communicator's watch and the numbers of the group's
/// collectives, which it watches behind a fence until they end.
pub(crate) fn execute(
    dc: &Mutex<DeviceComm>,
    ops: &[(Op, OpBuffers)],
    tuning: Tuning<'_>,
    prof: Option<Profiling<'_>>,
    watch: Option<(&DeviceWatch, Range<u64>)>,
) -> Result<()> {
    let mut dc = dc
        .lock()
        .map_err(|_| Error::Internal("device communicator poisoned by an earlier panic".into()))?;
    check_all(dc.context().device().ordinal(), ops, tuning.checks)?;
    let _restore = SavedCurrent::save()?;
    let events = match &prof {
        Some(p) => kernel_events(&mut dc, p)?,
        None => None,
    };
    let p = prof.as_ref();
    let mask = p.map_or(0, |p| p.mask);
    let group = p.map(|p| p.comm.running(p.comm.start(mask, Event::Group)));
    // The network proxy's proxy ops hang under the operations' events.
    let wants_proxy = p.is_some() && ProxyProfiler::wants_ops(mask);
    // Each timed launch since the last call, with the events it ran for.
    let track = |dc: &mut DeviceComm, parents: &[Handle]| {
        if let Some(ev) = events {
            for t in dc.take_timed() {
                ev.track(t.slot, t.channels, parents.to_vec());
            }
        }
    };
    // A kernel launch event (v5+, its own mask bit) around each launch,
    // child of the group API event, as NCCL's enqueue.cc does.
    let launch = |op: &Op| {
        p.filter(|p| p.mask & NCCL_PROFILE_KERNEL_LAUNCH != 0)
            .map(|p| {
                let parent = p.api.group();
                let ev = Event::KernelLaunch {
                    parent,
                    stream: op.stream as *mut std::os::raw::c_void,
                };
                p.comm.running(p.comm.start(p.mask, ev))
            })
    };
    let colls = ops
        .iter()
        .enumerate()
        .filter(|(_, (op, _))| op.kind.coll().is_some());
    for (at, (op, _)) in colls {
        let coll = op.kind.coll().expect("a collective");
        let choice = choose(&dc, &tuning, coll, op);
        dc.hold_protocol(op.call.proto);
        dc.hold_cluster(op.call.cluster);
        debug!(target: "oxccl::coll", "{}: {} on {} channel(s), {}", op.describe(), choice.algo.name(), choice.channels, dc.protocol(op.count * op.dtype.size()).name());
        let event = match (p, &group) {
            (Some(p), Some(g)) => {
                let (algo, nch) = (choice.algo, choice.channels);
                let api = p.api.op(at);
                Some(
                    p.comm
                        .running(p.comm.coll(mask, op, Some(algo), nch, g.handle(), api)),
                )
            }
            _ => None,
        };
        let (i, o, n, t, s) = (
            op.input as u64,
            op.output as u64,
            op.count,
            op.dtype,
            stream(op),
        );
        let launched = launch(op);
        if wants_proxy {
            dc.run_for(Some(ProxyParents {
                mask,
                coll: Some(event.as_ref().map_or(Handle::NONE, |e| e.handle())),
                p2p: Vec::new(),
            }));
        }
        let r = dc.collective(coll, Some(choice), i, o, n, t, op.redop, s);
        dc.hold_protocol(None);
        dc.hold_cluster(None);
        dc.run_for(None);
        r?;
        drop(launched);
        // A plugin may not track the operation (a NULL handle): its
        // channels still get events, parentless, as in NCCL, and the
        // launch's slot is freed when it ends.
        track(
            &mut dc,
            &[event.as_ref().map_or(Handle::NONE, |e| e.handle())],
        );
    }
    let p2p_at: Vec<(usize, &Op)> = ops
        .iter()
        .map(|(op, _)| op)
        .enumerate()
        .filter(|(_, op)| op.kind.coll().is_none())
        .collect();
    let p2p_ops: Vec<&Op> = p2p_at.iter().map(|(_, op)| *op).collect();
    let p2p_events: Vec<_> = match (p, &group) {
        (Some(p), Some(g)) => p2p_at
            .iter()
            .map(|(at, op)| {
                let nch = p2p_channels(&dc, &p2p_ops, op.count * op.dtype.size());
                let api = p.api.op(*at);
                p.comm.running(p.comm.p2p(mask, op, nch, g.handle(), api))
            })
            .collect(),
        _ => Vec::new(),
    };
    let p2p: Vec<&Op> = p2p_at.into_iter().map(|(_, op)| op).collect();
    // Messages of one size go together in one kernel; each size is a kernel.
    let mut sizes: Vec<usize> = Vec::new();
    for op in &p2p {
        let b = op.count * op.dtype.size();
        if b > 0 && !sizes.contains(&b) {
            sizes.push(b);
        }
    }
    for bytes in sizes {
        let of_size = |op: &Op| op.count * op.dtype.size() == bytes;
        let msgs: Vec<&&Op> = p2p.iter().filter(|op| of_size(op)).collect();
        let dtype = msgs[0].dtype;
        let (count, dtype) = if msgs.iter().all(|op| op.dtype == dtype) {
            (msgs[0].count, dtype)
        } else {
            (bytes, DataType::Uint8)
        };
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for op in &msgs {
            match op.kind {
                OpKind::Send { peer } => sends.push((peer, op.input as u64)),
                OpKind::Recv { peer } => recvs.push((peer, op.output as u64)),
                _ => {}
            }
        }
        let launched = launch(msgs[0]);
        // Every message of the size moves on every channel of its kernel.
        let parents: Vec<Handle> = p2p
            .iter()
            .zip(&p2p_events)
            .filter(|(op, _)| of_size(op))
            .map(|(_, e)| e.handle())
            .collect();
        if wants_proxy {
            let p2p: Vec<(usize, bool, Handle)> = msgs
                .iter()
                .zip(&parents)
                .filter_map(|(op, &h)| match op.kind {
                    OpKind::Send { peer } => Some((peer, true, h)),
                    OpKind::Recv { peer } => Some((peer, false, h)),
                    _ => None,
                })
                .collect();
            dc.run_for(Some(ProxyParents {
                mask,
                coll: None,
                p2p,
            }));
        }
        let nch = p2p_channels(&dc, &p2p, bytes);
        let r = dc.p2p_on(&sends, &recvs, count, dtype, stream(msgs[0]), nch);
        dc.run_for(None);
        r?;
        drop(launched);
        track(&mut dc, &parents);
    }
    if let Some((w, seqs)) = watch.filter(|(_, s)| !s.is_empty()) {
        fence_group(&dc, w, seqs);
    }
    Ok(())
}

/// The channels a group's messages of `bytes` run on: the default for
/// the size, within the calls' own CTA bounds (`op.call`: an all-to-all's,
/// a gather's or a scatter's, which become such messages) where every
/// message of the size carries the same bounds. Both ends of a message
/// must use alike: every rank of such a call passes the same bounds; a
/// group that mixes them with other messages of the size keeps the
/// default, so its peers' groups must mix alike (as NCCL, which asks
/// every rank of a call for the same config).
fn p2p_channels(dc: &DeviceComm, p2p: &[&Op], bytes: usize) -> usize {
    let n = dc.p2p_channels_for(bytes);
    let mut calls = p2p
        .iter()
        .filter(|op| op.count * op.dtype.size() == bytes)
        .map(|op| op.call);
    match calls.next() {
        Some(c) if calls.all(|o| o == c) => c.narrow(n, 1, dc.config().channels),
        _ => n,
    }
}

/// Records a fence behind a group's collectives `seqs` and hands both to
/// the watch ([`DeviceWatch`]); where none is recorded (a graph capture,
/// an event that cannot be made) the group goes unwatched, as before the
/// watch: its kernels end at NCCL_TIMEOUT if a peer never comes.
fn fence_group(dc: &DeviceComm, w: &DeviceWatch, seqs: Range<u64>) {
    let fence = match w.take_fence() {
        Some(f) => f,
        None => match crate::cuda::Event::new(dc.context(), false) {
            Ok(f) => f,
            Err(e) => {
                debug!(target: "oxccl::coll", "collectives #{}..#{} go unwatched: {e}", seqs.start, seqs.end);
                return;
            }
        },
    };
    match dc.fence(&fence) {
        Ok(true) => w.launched(seqs, fence),
        Ok(false) => w.give_back(fence),
        Err(e) => {
            debug!(target: "oxccl::coll", "collectives #{}..#{} go unwatched: {e}", seqs.start, seqs.end);
            w.give_back(fence);
        }
    }
}

/// Times this group's launches when the mask asks for kernel-channel
/// events (starting the thread that reports them, once), and not when it
/// does not: the mask may change between groups.
fn kernel_events<'a>(dc: &mut DeviceComm, p: &Profiling<'a>) -> Result<Option<&'a KernelEvents>> {
    let wanted = p.mask & NCCL_PROFILE_KERNEL_CH != 0;
    let Some(stamps) = dc.time_launches(wanted)?.filter(|_| wanted) else {
        return Ok(None);
    };
    if p.kernel_events.get().is_none() {
        // The device communicator's lock is held: no other group races here.
        let ev = KernelEvents::spawn(p.comm.clone(), stamps, p.limit, p.rank)?;
        let _ = p.kernel_events.set(ev);
    }
    Ok(p.kernel_events.get())
}

#[allow(unsafe_code)] // the one place an op's stream handle is trusted
pub(super) fn stream(op: &Op) -> RawStream {
    // SAFETY: the caller of `Comm::enqueue` promised a live stream of the
    // communicator's GPU (or 0), as NCCL requires of its callers.
    unsafe { RawStream::from_raw(op.stream) }
}

/// The CPUs this GPU's helper threads bind to (NCCL_IGNORE_CPU_AFFINITY:
/// [`crate::topo::affinity`]), `None` where they keep what they inherit.
fn helper_cpus(device: usize, ignore_inherited: bool) -> Option<Vec<usize>> {
    let bus = Device::get(device).and_then(|d| d.pci_bus_id()).ok()?;
    let cpus = crate::topo::affinity::for_gpu(&bus, ignore_inherited);
    debug!(target: "oxccl::init", "GPU {device} ({bus}): helper threads on CPUs {}{}",
        cpus.as_deref().map_or("inherited".into(), crate::topo::affinity::format_cpulist),
        if ignore_inherited { " (NCCL_IGNORE_CPU_AFFINITY=1: the GPU's alone)" } else { "" });
    cpus
}

/// Checks every operation's buffers ([`check_reachable`]) unless `checks`
/// is false (NCCL_CHECKS_DISABLE=1).
fn check_all(gpu: usize, ops: &[(Op, OpBuffers)], checks: bool) -> Result<()> {
    if checks {
        for (op, bufs) in ops {
            check_reachable(gpu, op, bufs)?;
        }
    }
    Ok(())
}

/// A kernel that touches memory its GPU cannot reach faults the context
/// for good; refusing the call instead names the buffer.
pub(super) fn check_reachable(gpu: usize, op: &Op, bufs: &OpBuffers) -> Result<()> {
    if op.count == 0 {
        return Ok(());
    }
    for (what, ptr, bytes) in bufs.used() {
        let kind = pointer_kind(ptr);
        if kind == PtrKind::Unknown {
            return Err(Error::InvalidArgument(format!(
                "{}: {what} {ptr:#x} is not memory CUDA knows (pageable host memory?): this communicator runs on GPU {}; pass device memory (cudaMalloc, ncclMemAlloc) or registered host memory",
                op.kind.name(),
                gpu
            )));
        }
        // Pinned and managed memory are mappings of this process too.
        super::check_extent(op, what, ptr, bytes, kind == PtrKind::Device)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A heap buffer is no memory CUDA knows: checked, the call is refused
    /// naming it; under NCCL_CHECKS_DISABLE=1 it is not looked at.
    #[test]
    fn checks_disable_skips_the_pointer_checks() {
        let mut data = vec![0u8; 64];
        let p = data.as_mut_ptr();
        let op = Op {
            kind: OpKind::AllReduce,
            input: p,
            output: p,
            count: 16,
            dtype: DataType::Float32,
            redop: crate::dtype::RedOp::Sum,
            stream: 0,
            user_tag: 0,
            call: Default::default(),
        };
        let bufs = OpBuffers {
            input: p,
            in_bytes: 64,
            output: p,
            out_bytes: 64,
            scratch: std::ptr::null_mut(),
            scratch_bytes: 0,
        };
        let e = check_all(0, &[(op, bufs)], true).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("sendbuff"),
            "{e}"
        );
        check_all(0, &[(op, bufs)], false).unwrap();
    }

    fn local(rank: usize, hosts: &[u64]) -> Locality {
        let n = hosts.len();
        Locality {
            rank,
            hosts: hosts.to_vec(),
            shm_devs: vec![0; n],
            shm_disabled: Vec::new(),
            devices: (0..n as i32).collect(),
        }
    }

    /// (intra bandwidth, inter bandwidth, nodes) as every rank prices them.
    fn priced(hosts: &[u64], p2p_off: &[usize]) -> Vec<(f64, f64, usize)> {
        (0..hosts.len())
            .map(|r| {
                let mut nodes = hosts.to_vec();
                nodes.sort_unstable();
                nodes.dedup();
                let f = device_fabric(
                    &local(r, hosts),
                    &P2pPairs::disabled(p2p_off),
                    cost::LinkModel::default(),
                    nodes.len(),
                );
                (f.intra.bandwidth, f.inter.bandwidth, f.nodes)
            })
            .collect()
    }

    #[test]
    fn every_rank_prices_the_same_links() {
        let (nvl, shm) = (cost::LinkModel::NVLINK, cost::LinkModel::SHM_DEVICE);
        let net = cost::LinkModel::default().bandwidth;
        // Two nodes of two GPUs: NVLink inside, the network between.
        let two = [7, 7, 9, 9];
        assert_eq!(priced(&two, &[]), vec![(nvl.bandwidth, net, 2); 4]);
        // Rank 3 turned P2P off: its node's pair goes through shared
        // memory, and every rank, of either node, prices that.
        assert_eq!(priced(&two, &[3]), vec![(shm.bandwidth, net, 2); 4]);
        // A rank alone on its node prices the others' node link as they do.
        assert_eq!(priced(&[1, 2, 2], &[1]), vec![(shm.bandwidth, net, 2); 3]);
        // One node: the network is priced but never crossed.
        assert_eq!(priced(&[5, 5], &[]), vec![(nvl.bandwidth, net, 1); 2]);
    }
}
