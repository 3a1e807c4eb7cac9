//! The GPU executor: collectives on device memory between the GPUs of one
//! node, moved by kernels that store into the peers' memory over NVLink.
//!
//! A [`DeviceComm`] is one rank on one GPU. At setup each rank allocates a
//! window (FIFO slots and flag words per peer and channel; see
//! `kernels/cuda/coll.cu`) and maps every peer's. An operation is one kernel
//! launch on the caller's stream: it sees the work enqueued before it on
//! that stream, work enqueued after it sees its result, and the host never
//! waits. Schedules are `crate::algo`'s: the ring (all-reduce as
//! reduce-scatter then all-gather; chains for broadcast and reduce), and for
//! an all-reduce between two ranks the exchange of recursive doubling (one
//! step, each rank reducing the whole buffer: the same bytes on the link as
//! the ring, half the synchronisation).
//!
//! Addresses are device addresses (`u64`) valid in this rank's context; the
//! caller keeps buffers alive and untouched until the stream has passed the
//! operation (NCCL's contract). A bad address faults the GPU, which the
//! driver reports as an error at the next synchronisation.

pub mod config;
mod launch;
pub mod oob;
mod peers;
mod plan;
pub mod registry;
mod sendrecv;
mod shared;
pub mod stamps;
pub mod stop;
mod window;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

pub use config::{ChannelChoice, DeviceConfig};
pub use oob::{LocalOob, Oob};
pub use stamps::Stamps;
pub use stop::DeviceStop;

use crate::algo::{cost, Algo, Coll};
use crate::cuda::{Context, Device, Event, KernelSet, RawStream};
use crate::dtype::{DataType, RedOp};
use crate::error::{Error, Result};
use crate::plugin::profiler::Handle;
use crate::topo::BusId;
use crate::transport::layout::Proto;
use plan::Template;
pub use window::Transports;
use window::Window;

/// The channel count every rank will use: each proposes what the link to
/// its ring neighbours asks for (`crate::topo::ring_channels`, from the
/// GPUs' PCI addresses exchanged first), and the fewest wins, since the
/// window layout must be the same on every rank and the slowest link
/// bounds the ring anyway.
fn topology_channels(
    oob: &dyn Oob,
    dev: &Device,
    cfg: &DeviceConfig,
    topo: Option<&crate::topo::system::Node>,
) -> Result<usize> {
    // Every rank must reach both exchanges, whatever it failed to learn.
    let mine = dev.pci_bus_id().unwrap_or_default();
    let all = oob.allgather(mine.as_bytes())?;
    let ring: Option<Vec<BusId>> = all
        .iter()
        .map(|b| std::str::from_utf8(b).ok()?.parse().ok())
        .collect();
    let found = ring.filter(|_| cfg.asks_link()).and_then(|r| {
        let cc = dev.compute_capability().ok()?;
        match topo {
            Some(node) => crate::topo::system::ring_channels(node, &r, cc),
            None => crate::topo::ring_channels(&r, cc, Path::new("/sys")),
        }
    });
    let proposal = cfg.channels_for(found.map(|(n, _)| n)) as u32;
    let all = oob.allgather(&proposal.to_le_bytes())?;
    let agreed = all
        .iter()
        .map(|b| {
            b.as_slice()
                .try_into()
                .map(u32::from_le_bytes)
                .map_err(|_| Error::Remote("a rank sent no channel count".into()))
        })
        .collect::<Result<Vec<u32>>>()?
        .into_iter()
        .min()
        .unwrap_or(proposal) as usize;
    match found {
        Some((n, link)) => {
            tracing::info!(target: "oxccl::init", "rank {}: {agreed} channels (the ring's slowest link is {link}, which asks for {n}; this rank proposed {proposal})", oob.rank())
        }
        None if cfg.asks_link() => {
            tracing::info!(target: "oxccl::init", "rank {}: {agreed} channels (no link between the ranks' GPUs known; this rank proposed {proposal})", oob.rank())
        }
        None => {
            tracing::info!(target: "oxccl::init", "rank {}: {agreed} channels (peers through host memory; this rank proposed {proposal})", oob.rank())
        }
    }
    Ok(agreed)
}

/// Which schedule a template belongs to: algorithm, collective, root.
type Key = (Algo, u8, usize);

/// One rank of a communicator whose ranks are GPUs of one node.
pub struct DeviceComm {
    rank: usize,
    nranks: usize,
    ctx: Arc<Context>,
    /// `channels` is the window's count, which sends and receives use.
    cfg: DeviceConfig,
    /// Most CTAs a collective uses by default (NCCL's "coll channels"); at
    /// most the window's. A tuner or a call's minCTAs may ask for more,
    /// up to the window's.
    coll_channels: usize,
    /// The links its cost table prices ([`Transports::fabric`]).
    fabric: cost::Fabric,
    kernels: Arc<KernelSet>,
    window: Window,
    templates: HashMap<Key, Template>,
    /// Where the last operation's work went: its stream and the capture
    /// it was recorded into; `order` was recorded on that stream after the
    /// work, so that the next operation, if it comes on another stream,
    /// waits for it. The stream is only compared, never used again: the
    /// caller may destroy it once its work is enqueued (a later call that
    /// recorded on a destroyed stream crashed in the driver).
    last: Option<(RawStream, Option<u64>)>,
    /// The operation being enqueued, between `order_after_last` and `mark`.
    opened: Option<(RawStream, Option<u64>)>,
    order: Event,
    /// Kernel-channel timing for the profiler: made at the first timed
    /// launch; `timed` says whether launches are timed now.
    stamps: Option<Arc<Stamps>>,
    timed: bool,
    launched: Vec<TimedLaunch>,
    /// Ends this rank's operations now (see [`DeviceStop`]).
    stop: Arc<DeviceStop>,
    /// [`DeviceComm::settle`] released the stream waits.
    released: bool,
    /// Every launch is announced to the network proxy, for the profiler's
    /// proxy events (a profiler is attached and launches can be counted).
    announce: bool,
    /// The events the next launches run for (see [`ProxyParents`]).
    parents: Option<ProxyParents>,
    /// The protocol the next launches are held to (a call's own, see
    /// [`DeviceComm::hold_protocol`]).
    held: Option<Proto>,
    /// The CTAs per cluster a call holds its launches to (its
    /// `cgaClusterSize`), until released ([`DeviceComm::hold_cluster`]).
    held_cluster: Option<u32>,
    /// Buffers registered with this rank (`ncclCommRegister`).
    registry: registry::Registry,
    /// NCCL_GRAPH_REGISTER: buffers of launches captured into a CUDA graph
    /// count as registered (their device memory checked), as NCCL
    /// registers them for the graph's life.
    graph_register: bool,
    /// Launches whose peers read a registered buffer where it lies.
    direct_launches: u64,
    /// Where a rank's message to itself is copied beside the group's
    /// kernel; made at the first such group.
    side: Option<sendrecv::SideCopy>,
}

/// Which peers (a bit per rank) a launch lets read its input and its
/// output where they lie (registered buffers; see `registry`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Direct {
    input: u64,
    output: u64,
}

/// The profiler events of the operations the next launches run, which
/// the network proxy's proxy ops hang under: a collective's, or each
/// point-to-point message's by (peer, is_send), taken in order.
#[derive(Debug, Clone, Default)]
pub struct ProxyParents {
    /// The group's activation mask.
    pub mask: i32,
    pub coll: Option<Handle>,
    pub p2p: Vec<(usize, bool, Handle)>,
}

/// How one collective runs: the algorithm and the channels (thread
/// blocks), which a tuner plugin or NCCL_ALGO may choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub algo: Algo,
    pub channels: usize,
}

impl Choice {
    /// `channels` as asked, but at least two for the tree: the double
    /// binary tree runs its trees on channels of each parity, and on one
    /// channel only the first would carry data.
    pub fn new(algo: Algo, channels: usize) -> Choice {
        let channels = match algo {
            Algo::Tree => channels.max(2),
            _ => channels,
        };
        Choice { algo, channels }
    }
}

/// A launch whose blocks write their start and end times into a slot of
/// [`Stamps`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedLaunch {
    pub slot: usize,
    pub channels: usize,
}

impl DeviceComm {
    /// Joins the communicator as `oob.rank()` on GPU `device`. Every rank
    /// calls it at the same time (it exchanges through `oob`).
    pub fn new(oob: &dyn Oob, device: usize, cfg: DeviceConfig) -> Result<DeviceComm> {
        DeviceComm::with_transports(oob, device, cfg, Transports::all_p2p(oob.nranks()))
    }

    /// As [`DeviceComm::new`], each peer reached as `tr` says (P2P, shared
    /// host memory, or the network through a proxy thread).
    pub fn with_transports(
        oob: &dyn Oob,
        device: usize,
        mut cfg: DeviceConfig,
        tr: Transports<'_>,
    ) -> Result<DeviceComm> {
        cfg.validate()?;
        let dev = Device::get(device)?;
        // Collectives take the link's count; sends and receives NCCL's
        // p2p count, that count rounded up to a power of two (32 for 24:
        // NCCL 2.28.9's SendRecv kernel ran 32 blocks on 2 H200, its
        // collectives 24), within the maximum. The window has room for
        // the larger.
        let mut coll_channels = cfg.channels;
        if cfg.choice != ChannelChoice::Fixed {
            coll_channels = topology_channels(oob, &dev, &cfg, tr.topo.as_deref())?;
            cfg.channels = config::p2p_channels(coll_channels, cfg.choice);
            cfg.choice = ChannelChoice::Fixed;
        }
        let ctx = Context::primary(dev)?;
        let kernels = KernelSet::shared(&ctx)?;
        let stop = Arc::new(DeviceStop::new(&ctx)?);
        let fabric = tr.fabric;
        let window = Window::setup(&ctx, oob, &cfg, tr, &stop, coll_channels)?;
        cfg.channels = window.launch_channels;
        let coll_channels = coll_channels.min(cfg.channels);
        let order = Event::new(&ctx, false)?;
        tracing::info!(target: "oxccl::init", "rank {}/{} on GPU {device}: device window of {} MiB ({} channels x {} slots x {} KiB per P2P peer); collectives on up to {coll_channels} CTAs, sends and receives on up to {}",
            oob.rank(), oob.nranks(), window.device_bytes() >> 20, cfg.channels, cfg.slots, cfg.slot_bytes >> 10, cfg.channels);
        Ok(DeviceComm {
            rank: oob.rank(),
            nranks: oob.nranks(),
            ctx,
            cfg,
            coll_channels,
            fabric,
            kernels,
            window,
            templates: HashMap::new(),
            last: None,
            opened: None,
            order,
            side: None,
            stamps: None,
            timed: false,
            launched: Vec::new(),
            stop,
            released: false,
            announce: false,
            parents: None,
            held: None,
            held_cluster: None,
            registry: registry::Registry::new(device),
            graph_register: true,
            direct_launches: 0,
        })
    }

    /// Registers `len` bytes of device memory at `ptr` with this rank
    /// (NCCL's `ncclCommRegister`): where a peer that is a thread of this
    /// process reads from it (send/recv, all_gather, broadcast, and the
    /// all_reduce ring's all-gather half), it reads it where it lies
    /// instead of through a step slot. The handle, for
    /// [`DeviceComm::deregister`]. Refused for host memory, another GPU's,
    /// or a range past its allocation.
    pub fn register(&mut self, ptr: u64, len: usize) -> Result<u64> {
        let h = self.registry.register(ptr, len, &registry::Probe::of)?;
        tracing::info!(target: "oxccl::reg", "rank {}: registered {len} bytes at {ptr:#x} (handle {h:#x}); {} buffer(s) registered", self.rank, self.registry.len());
        Ok(h)
    }

    /// Releases a registration made by [`DeviceComm::register`]; refused
    /// for a handle it did not give or gave and took back.
    pub fn deregister(&mut self, handle: u64) -> Result<()> {
        self.registry.deregister(handle)?;
        tracing::info!(target: "oxccl::reg", "rank {}: deregistered handle {handle:#x}; {} buffer(s) registered", self.rank, self.registry.len());
        Ok(())
    }

    /// Buffers registered now.
    pub fn registered(&self) -> usize {
        self.registry.len()
    }

    /// NCCL_GRAPH_REGISTER (on by default): buffers of operations captured
    /// into a CUDA graph count as registered.
    pub fn set_graph_register(&mut self, on: bool) {
        self.graph_register = on;
    }

    /// Launches so far whose peers read a registered buffer of this rank
    /// where it lies (no step slot): what shows the direct path ran.
    pub fn direct_launches(&self) -> u64 {
        self.direct_launches
    }

    /// Whether `len` bytes at `ptr` may be read by peers where they lie:
    /// registered, or (NCCL_GRAPH_REGISTER) device memory of an operation
    /// being captured into a graph. A registration whose memory was freed
    /// is an error. `captured`: whether the launch's stream is capturing,
    /// asked of the driver at most once per launch (`None` until then).
    fn readable_in_place(
        &self,
        ptr: u64,
        len: usize,
        stream: RawStream,
        captured: &mut Option<bool>,
    ) -> Result<bool> {
        if self
            .registry
            .covering(ptr, len, &registry::Probe::of)?
            .is_some()
        {
            return Ok(true);
        }
        if !self.graph_register || ptr == 0 || len == 0 {
            return Ok(false);
        }
        let captured = match *captured {
            Some(c) => c,
            None => *captured.insert(stream.capture_id()?.is_some()),
        };
        if !captured {
            return Ok(false);
        }
        let p = registry::Probe::of(ptr);
        Ok(p.kind == crate::cuda::PtrKind::Device
            && p.device == Some(self.ctx.device().ordinal())
            && p.range
                .is_some_and(|(b, n)| ptr.saturating_add(len as u64) <= b + n))
    }

    /// The peers that may read a collective's buffers where they lie: the
    /// same-process P2P peers, for the schedules whose sent slices are
    /// final data that the sender leaves untouched until the launch ends
    /// (all_gather and broadcast: input and output; the all_reduce ring:
    /// its output, which its all-gather half sends from).
    #[allow(clippy::too_many_arguments)] // one collective's buffers
    fn collective_direct(
        &self,
        coll: Coll,
        algo: Algo,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        stream: RawStream,
    ) -> Result<Direct> {
        let peers = self.window.same_process_p2p();
        if peers == 0 || (self.registry.is_empty() && !self.graph_register) {
            return Ok(Direct::default());
        }
        let bytes = count * dtype.size();
        let (in_bytes, out_bytes) = match (coll, algo) {
            (Coll::AllGather, Algo::Ring) => (bytes, bytes * self.nranks),
            (Coll::Broadcast { .. }, Algo::Ring) => (bytes, bytes),
            (Coll::AllReduce, Algo::Ring) => (0, bytes),
            _ => return Ok(Direct::default()),
        };
        let mut captured = None;
        let input =
            in_bytes > 0 && self.readable_in_place(send, in_bytes, stream, &mut captured)?;
        let output = self.readable_in_place(recv, out_bytes, stream, &mut captured)?;
        Ok(Direct {
            input: if input { peers } else { 0 },
            output: if output { peers } else { 0 },
        })
    }

    /// The network proxy reports its proxy-control events to `p`, and its
    /// proxy ops and steps when the group's mask asks for them; `None`:
    /// the communicator has no profiler.
    pub fn set_profiler(&mut self, p: Option<&Arc<crate::plugin::profiler::ProfilerComm>>) {
        self.announce = self.window.set_profiler(p);
    }

    /// The operations' events the next launches run for (`None` after
    /// them, or when the group's mask asks for no proxy events).
    pub fn run_for(&mut self, parents: Option<ProxyParents>) {
        self.parents = parents;
    }

    /// What ends this rank's operations now, usable while another thread
    /// holds the communicator: [`DeviceStop::raise`] ends the kernels' and
    /// the host's waits at once; [`DeviceComm::drain`] then ends the rest.
    pub fn stopper(&self) -> Arc<DeviceStop> {
        self.stop.clone()
    }

    /// Whether the work this communicator enqueued has finished (with the
    /// work the caller put after it on the last stream: more than needed,
    /// never less). Graph captures enqueue nothing that runs now.
    pub fn idle(&self) -> Result<bool> {
        match self.last {
            Some((_, None)) => self.order.query(),
            _ => Ok(true),
        }
    }

    /// Records `fence` behind the work enqueued so far (on the last
    /// operation's stream, after which every earlier operation ends), for
    /// a host thread to see it end; false where that work went into a
    /// graph capture or there is none (nothing recorded).
    pub fn fence(&self, fence: &Event) -> Result<bool> {
        match self.last {
            Some((stream, None)) => fence.record(stream).map(|()| true),
            _ => Ok(false),
        }
    }

    /// After [`DeviceStop::raise`]: the first call ends the proxy's
    /// transfers and releases this rank's stream waits; each says whether
    /// the streams have passed this communicator's work (each operation
    /// is ordered after the one before, so the last stream's tail covers
    /// them all; the kernels return at their next poll of the stop word).
    pub fn settle(&mut self) -> Result<bool> {
        if !self.released {
            self.released = true;
            self.window.stop()?;
        }
        self.idle()
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub fn config(&self) -> &DeviceConfig {
        &self.cfg
    }

    /// This GPU's kernels, for copies, fills and local reductions.
    pub fn kernels(&self) -> &KernelSet {
        &self.kernels
    }

    /// Copies `bytes` between device buffers on `stream` with the copy
    /// kernel, on at most this communicator's CTA budget.
    pub fn copy(&self, dst: u64, src: u64, bytes: usize, stream: RawStream) -> Result<()> {
        self.kernels
            .copy(dst, src, bytes, self.coll_channels, stream)
    }

    /// Each rank's GPU as an index where ranks of several processes share
    /// a GPU and the communicator spans other GPUs too; `None` otherwise.
    pub fn mixed_gpus(&self) -> Option<&[usize]> {
        self.window.mixed.as_deref()
    }

    /// Times the launches from now on (or stops): each block writes its
    /// start and end into the returned [`Stamps`], and [`take_timed`]
    /// lists the launches so timed. Launches recorded into a CUDA graph are
    /// never timed: they may run many times, or never.
    ///
    /// [`take_timed`]: DeviceComm::take_timed
    pub fn time_launches(&mut self, on: bool) -> Result<Option<Arc<Stamps>>> {
        self.timed = on;
        if on && self.stamps.is_none() {
            self.stamps = Some(Arc::new(Stamps::new(&self.ctx, self.cfg.channels)?));
        }
        Ok(self.stamps.clone())
    }

    /// The launches timed since the last call, in launch order.
    pub fn take_timed(&mut self) -> Vec<TimedLaunch> {
        std::mem::take(&mut self.launched)
    }

    /// How the device runs a collective when no tuner chooses: the cheapest
    /// algorithm of its cost table ([`cost::device_table`], which a forced
    /// algorithm, NCCL_ALGO, masks) and a channel per `channel_bytes`.
    pub fn default_choice(
        &self,
        coll: Coll,
        count: usize,
        dtype: DataType,
        forced: impl Into<cost::Held>,
    ) -> Choice {
        let bytes = count * dtype.size();
        let table = cost::device_table(coll, bytes, self.nranks, self.fabric, forced);
        Choice::new(
            cost::pick(&table, coll).map_or(Algo::Ring, |(a, _)| a),
            self.channels_for(bytes),
        )
    }

    /// The links its cost table prices.
    pub fn fabric(&self) -> cost::Fabric {
        self.fabric
    }

    /// The channels a collective moving `bytes` per rank uses by default.
    pub fn channels_for(&self, bytes: usize) -> usize {
        plan::channels(&self.cfg, bytes).min(self.coll_channels)
    }

    /// The channels sends and receives of `bytes` per message use by
    /// default: up to the window's count (NCCL's p2p count).
    pub fn p2p_channels_for(&self, bytes: usize) -> usize {
        plan::channels(&self.cfg, bytes)
    }

    /// Most CTAs a collective uses by default.
    pub fn coll_channels(&self) -> usize {
        self.coll_channels
    }

    /// Device memory this rank allocated: its window, and with GPUDirect
    /// the net peers' step slots. Peers' windows are mapped, not
    /// allocated, here.
    pub fn device_bytes(&self) -> usize {
        self.window.device_bytes()
    }

    /// The part of [`DeviceComm::device_bytes`] that [`DeviceComm::suspend`]
    /// releases.
    pub fn suspendable_bytes(&self) -> usize {
        self.window.suspendable_bytes()
    }

    /// Whether [`DeviceComm::suspend`] released the window.
    pub fn suspended(&self) -> bool {
        self.window.suspended()
    }

    /// Releases the device memory that [`DeviceComm::resume`] can rebuild
    /// (see `Window::suspend` for what goes and what stays). Every rank
    /// calls it; the operations this rank enqueued must end within
    /// `limit` (NCCL asks for none outstanding: it synchronizes the
    /// device). Returns the bytes released.
    pub fn suspend(&mut self, oob: &dyn Oob, limit: std::time::Duration) -> Result<usize> {
        let start = std::time::Instant::now();
        loop {
            match self.idle() {
                Ok(true) => break,
                Ok(false) => {}
                // The last stream is gone (its owner destroyed it): wait
                // for the device, as NCCL's suspend always does.
                Err(_) => {
                    self.ctx.synchronize()?;
                    break;
                }
            }
            if start.elapsed() >= limit {
                return Err(Error::InvalidUsage(format!(
                    "rank {}: operations of this communicator still ran {:.1} s (NCCL_TIMEOUT) after ncclCommSuspend was called: suspend needs none outstanding (synchronize the streams first)",
                    self.rank,
                    limit.as_secs_f64()
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let _restore = crate::cuda::SavedCurrent::save()?;
        self.window.suspend(oob)?;
        Ok(self.window.suspendable_bytes())
    }

    /// Allocates and exchanges again what [`DeviceComm::suspend`]
    /// released; every rank calls it. The next operation runs as if there
    /// had been no suspend.
    pub fn resume(&mut self, oob: &dyn Oob) -> Result<()> {
        let _restore = crate::cuda::SavedCurrent::save()?;
        self.window.resume(oob)
    }

    /// What stopped this rank's network proxy, if anything did: its
    /// kernels would wait for the peer until their timeout.
    pub fn failure(&self) -> Option<Error> {
        self.window.failure()
    }

    /// Host memory this rank registered for SHM and net peers.
    pub fn host_bytes(&self) -> usize {
        self.window.host_bytes()
    }

    /// Every rank's window address as this process sees it (diagnostics).
    pub fn windows(&self) -> &[u64] {
        &self.window.peers
    }

    /// `recv[i] = op over ranks of send[i]`, `count` elements.
    pub fn all_reduce(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: RedOp,
        stream: RawStream,
    ) -> Result<()> {
        let coll = Coll::AllReduce;
        self.collective(coll, None, send, recv, count, dtype, op, stream)
    }

    /// `recv = root's send` on every rank (the root may pass send == recv).
    #[allow(clippy::too_many_arguments)] // NCCL's signature
    pub fn broadcast(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: RawStream,
    ) -> Result<()> {
        let coll = Coll::Broadcast { root };
        self.collective(coll, None, send, recv, count, dtype, RedOp::Sum, stream)
    }

    /// The root's `recv = op over ranks of send`; other ranks' recv is untouched.
    #[allow(clippy::too_many_arguments)] // NCCL's signature
    pub fn reduce(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: RedOp,
        root: usize,
        stream: RawStream,
    ) -> Result<()> {
        let coll = Coll::Reduce { root };
        self.collective(coll, None, send, recv, count, dtype, op, stream)
    }

    /// `recv[r * count ..][..count] = rank r's send`. In place when
    /// `send == recv + rank * count * size` (NCCL's rule).
    pub fn all_gather(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        stream: RawStream,
    ) -> Result<()> {
        let coll = Coll::AllGather;
        self.collective(coll, None, send, recv, count, dtype, RedOp::Sum, stream)
    }

    /// `recv[..count] = op over ranks of send[rank * count ..][..count]`. In
    /// place when `recv == send + rank * count * size`.
    pub fn reduce_scatter(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: RedOp,
        stream: RawStream,
    ) -> Result<()> {
        let coll = Coll::ReduceScatter;
        self.collective(coll, None, send, recv, count, dtype, op, stream)
    }

    /// Any collective, run as `choice` says (`None`: the
    /// [`default_choice`](DeviceComm::default_choice)). Every rank must pass
    /// the same choice: the ranks' kernels follow one schedule.
    #[allow(clippy::too_many_arguments)] // one collective's whole description
    pub fn collective(
        &mut self,
        coll: Coll,
        choice: Option<Choice>,
        send: u64,
        recv: u64,
        count: usize,
        dtype: DataType,
        op: RedOp,
        stream: RawStream,
    ) -> Result<()> {
        let what = coll.name();
        self.window.check_active()?;
        let bufs = match coll {
            Coll::Broadcast { root } | Coll::Reduce { root } => {
                self.check_peer(what, "root", root, true)?;
                match coll {
                    _ if self.rank == root => vec![send, recv],
                    Coll::Broadcast { .. } => vec![recv],
                    _ => vec![send],
                }
            }
            _ => vec![send, recv],
        };
        self.check(what, count, dtype, &bufs)?;
        // One rank: every collective is a copy (a pre-multiplied sum
        // scales, which takes a kernel), done by the copy engine as NCCL
        // does it, with no SM taken from the application.
        if self.nranks == 1 && count > 0 && !matches!(op, RedOp::PreMulSum(_)) {
            self.order_after_last(stream)?;
            if send != recv {
                #[allow(unsafe_code)]
                // SAFETY: both buffers passed `check` for `count` elements
                // of `dtype` (device memory of this context); the caller
                // keeps them until the stream has run the operation, and
                // NCCL's API has the input and output either the same
                // buffer or apart.
                unsafe {
                    stream.copy_device(recv, send, count * dtype.size())?
                };
            }
            return self.mark();
        }
        let choice = choice.unwrap_or_else(|| self.default_choice(coll, count, dtype, None));
        if !cost::device_runs(choice.algo, coll, self.nranks) {
            return Err(Error::InvalidUsage(format!(
                "{what} on {} ranks: the device kernels do not run {} for it (they run Ring, and for all_reduce Tree, and RecDoubling on up to {} ranks)",
                self.nranks,
                choice.algo.name(),
                cost::DEVICE_REC_DOUBLING_MAX,
            )));
        }
        if self.window.shared.is_some() && count > 0 {
            self.order_after_last(stream)?;
            if let Some(sh) = self.window.shared.as_mut() {
                let timed = self.timed && self.stamps.is_some();
                if sh.run(
                    timed,
                    &self.kernels,
                    coll,
                    send,
                    recv,
                    count,
                    dtype,
                    op,
                    stream,
                )? {
                    return self.mark();
                }
            }
        }
        let t = self.template(coll, choice.algo)?;
        let direct = self.collective_direct(coll, choice.algo, send, recv, count, dtype, stream)?;
        self.launch(
            t,
            send,
            recv,
            count,
            dtype,
            op,
            stream,
            choice.channels,
            direct,
        )
    }

    fn check_peer(&self, what: &str, role: &str, p: usize, self_ok: bool) -> Result<()> {
        if p >= self.nranks || (!self_ok && p == self.rank) {
            return Err(Error::InvalidArgument(format!(
                "{what}: {role} {p} is not another rank of this communicator of {} (this is rank {})",
                self.nranks, self.rank
            )));
        }
        Ok(())
    }

    fn check(&self, what: &str, count: usize, dtype: DataType, bufs: &[u64]) -> Result<()> {
        let fits = count
            .checked_mul(dtype.size())
            .and_then(|b| b.checked_mul(self.nranks))
            .is_some_and(|b| b <= isize::MAX as usize);
        if !fits {
            return Err(Error::InvalidArgument(format!(
                "{what}: count {count} of {} overflows the address space",
                dtype.name()
            )));
        }
        if count > 0 && bufs.contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "{what}: a buffer is null with count {count}"
            )));
        }
        Ok(())
    }

    fn template(&mut self, coll: Coll, algo: Algo) -> Result<Template> {
        let (code, root) = match coll {
            Coll::AllReduce => (0, 0),
            Coll::Broadcast { root } => (1, root),
            Coll::Reduce { root } => (2, root),
            Coll::AllGather => (3, 0),
            Coll::ReduceScatter => (4, 0),
        };
        let key: Key = (algo, code, root);
        let t = match self.templates.get(&key) {
            Some(t) => *t,
            None => {
                let t = plan::template(algo, coll, self.rank, self.nranks)?;
                self.templates.insert(key, t);
                t
            }
        };
        Ok(t)
    }

    /// The protocol an operation of `bytes` per rank runs with: LL where
    /// the window has an LL FIFO and the size is within rank 0's bound,
    /// unless the call holds it to Simple ([`DeviceComm::hold_protocol`]).
    pub fn protocol(&self, bytes: usize) -> Proto {
        match (self.window.ll_max_bytes, self.held) {
            (_, Some(Proto::Simple)) => Proto::Simple,
            (Some(max), _) if bytes <= max => Proto::Ll,
            _ => Proto::Simple,
        }
    }

    /// Holds the launches that follow to clusters of `cluster` CTAs (a
    /// call's `cgaClusterSize`, within 0..=8) instead of the
    /// communicator's; `None` releases them.
    pub fn hold_cluster(&mut self, cluster: Option<u32>) {
        self.held_cluster = cluster;
    }

    /// The CTAs per cluster of the next launch: 0 before Hopper, which
    /// has no thread-block clusters.
    pub(super) fn cluster(&self) -> u32 {
        if self.kernels.arch() < (9, 0) {
            return 0;
        }
        self.held_cluster.unwrap_or(self.cfg.cluster)
    }

    /// Holds the next launches to `proto` (a call's `algSelection`), or
    /// frees them (`None`). LL needs an LL FIFO, which only a window with
    /// peers through host memory has, and is taken there within the LL
    /// bound only, as without a hold: beyond it, or without the FIFO, the
    /// launch runs Simple. Every rank of the call holds alike.
    pub fn hold_protocol(&mut self, proto: Option<Proto>) {
        if proto == Some(Proto::Ll) && self.window.ll_max_bytes.is_none() {
            static NO_LL: std::sync::Once = std::sync::Once::new();
            NO_LL.call_once(|| tracing::warn!(target: "oxccl::coll", "rank {}: a call's algSelection asks for the LL protocol, which this communicator's kernels have only towards peers through host memory (none here): it runs Simple", self.rank));
        }
        self.held = proto;
    }

    /// Operations of at most this many bytes per rank run LL (`None`:
    /// the window has no LL FIFO).
    pub fn ll_bound(&self) -> Option<usize> {
        self.window.ll_max_bytes
    }
}
