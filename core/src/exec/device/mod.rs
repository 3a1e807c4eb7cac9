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
pub mod oob;
mod peers;
mod plan;
pub mod registry;
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
use crate::cuda::abi::{CollArgs, PROTO_LL, PROTO_SIMPLE};
use crate::cuda::kernels::kernel_op;
use crate::cuda::{Context, Device, Event, KernelSet, RawStream};
use crate::dtype::{DataType, RedOp};
use crate::error::{Error, Result};
use crate::plugin::profiler::{Handle, ProxyProfiler};
use crate::topo::BusId;
use crate::transport::layout::Proto;
use crate::transport::proxy::{ConnSteps, Launch};
use plan::{Shape, Template};
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

/// Messages to itself up to this many bytes a rank copies in the kernel of
/// its group's other messages (an all_to_all's own block); larger ones go
/// by the copy engine beside it. On 2 H200 the copy engine's fork and join
/// made an all_to_all of 1 KiB take 26 us where in place took 17.
const SELF_COPY_IN_KERNEL: usize = 1 << 20;

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
    side: Option<SideCopy>,
}

/// A stream of the communicator's own and the events that fork a copy
/// onto it from the caller's stream and join it back, so that the copy
/// engine moves a rank's message to itself while the kernel moves the
/// peers' (in a graph capture the fork and the join are captured too).
/// Copied before the kernel on the caller's stream instead, an
/// all_to_all's own block added its whole copy to the call: 14 us at
/// 1 KiB on 2 H200, where NCCL took 21 us in all.
struct SideCopy {
    stream: crate::cuda::Stream,
    fork: Event,
    join: Event,
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

    /// Sends `count` elements to `peer`, which calls [`DeviceComm::recv`]
    /// with the same count. Messages between two ranks match in order. A
    /// send waits (on the GPU) for the receiver once more than a FIFO's
    /// worth is in flight, so two ranks that both send before receiving
    /// need messages below `slots * slot_bytes` per channel.
    pub fn send(
        &mut self,
        buf: u64,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: RawStream,
    ) -> Result<()> {
        self.check_peer("send", "peer", peer, false)?;
        self.check("send", count, dtype, &[buf])?;
        if self.window.shared.is_some() {
            return self.p2p(&[(peer, buf)], &[], count, dtype, stream);
        }
        let nch = self.p2p_channels_for(count * dtype.size());
        let t = Template::send(peer);
        let direct = self.p2p_direct(&[(peer, buf)], count * dtype.size(), stream)?;
        self.launch(t, buf, 0, count, dtype, RedOp::Sum, stream, nch, direct)
    }

    /// The peers that may read a group's send buffers where they lie: each
    /// same-process P2P peer all of whose messages come from registered
    /// buffers.
    fn p2p_direct(
        &self,
        sends: &[(usize, u64)],
        bytes: usize,
        stream: RawStream,
    ) -> Result<Direct> {
        let peers = self.window.same_process_p2p();
        if peers == 0 || (self.registry.is_empty() && !self.graph_register) {
            return Ok(Direct::default());
        }
        let (mut yes, mut no) = (0u64, 0u64);
        let mut captured = None;
        for &(p, b) in sends {
            if p >= 64 || peers & (1 << p) == 0 {
                continue;
            }
            if self.readable_in_place(b, bytes, stream, &mut captured)? {
                yes |= 1 << p;
            } else {
                no |= 1 << p;
            }
        }
        Ok(Direct {
            input: yes & !no,
            output: 0,
        })
    }

    /// Receives `count` elements from `peer` into `buf`.
    pub fn recv(
        &mut self,
        buf: u64,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: RawStream,
    ) -> Result<()> {
        self.check_peer("recv", "peer", peer, false)?;
        self.check("recv", count, dtype, &[buf])?;
        if self.window.shared.is_some() {
            return self.p2p(&[], &[(peer, buf)], count, dtype, stream);
        }
        let nch = self.p2p_channels_for(count * dtype.size());
        let t = Template::recv(peer);
        self.launch(
            t,
            0,
            buf,
            count,
            dtype,
            RedOp::Sum,
            stream,
            nch,
            Direct::default(),
        )
    }

    /// A group's sends and receives, `count` elements each, as one kernel
    /// where they can be: all slices advance together, so two ranks that
    /// both send before they receive never wait on each other, whatever the
    /// size (NCCL fuses a group's point-to-point work likewise). One kernel
    /// addresses buffers as blocks of `count` elements from one base each
    /// way; a group whose buffers are not laid out so (or too many peers)
    /// runs as one kernel per message, in order, which is safe for messages
    /// up to a FIFO per channel. Sends to and receives from this rank are
    /// matched in order and copied.
    pub fn p2p(
        &mut self,
        sends: &[(usize, u64)],
        recvs: &[(usize, u64)],
        count: usize,
        dtype: DataType,
        stream: RawStream,
    ) -> Result<()> {
        let nch = self.p2p_channels_for(count * dtype.size());
        self.p2p_on(sends, recvs, count, dtype, stream, nch)
    }

    /// [`DeviceComm::p2p`] on `channels` thread blocks (at most the
    /// window's), which both ends of every message must use alike: a
    /// call's own CTA bounds (all-to-all, gather, scatter), which every
    /// rank of the call passes.
    pub fn p2p_on(
        &mut self,
        sends: &[(usize, u64)],
        recvs: &[(usize, u64)],
        count: usize,
        dtype: DataType,
        stream: RawStream,
        channels: usize,
    ) -> Result<()> {
        self.window.check_active()?;
        for &(p, _) in sends.iter().chain(recvs) {
            self.check_peer("send/recv", "peer", p, true)?;
        }
        let bufs: Vec<u64> = sends.iter().chain(recvs).map(|&(_, b)| b).collect();
        self.check("send/recv", count, dtype, &bufs)?;
        if count == 0 {
            return Ok(());
        }
        let bytes = count * dtype.size();
        let nch = channels.clamp(1, self.cfg.channels.max(1));
        let me = self.rank;
        let self_sends: Vec<u64> = sends.iter().filter(|s| s.0 == me).map(|s| s.1).collect();
        let self_recvs: Vec<u64> = recvs.iter().filter(|r| r.0 == me).map(|r| r.1).collect();
        if self_sends.len() != self_recvs.len() {
            return Err(Error::InvalidUsage(format!(
                "rank {me} sends {} message(s) to itself and receives {} from itself in one group: they must pair up",
                self_sends.len(),
                self_recvs.len()
            )));
        }
        self.order_after_last(stream)?;
        let routes_self = self
            .window
            .shared
            .as_ref()
            .is_some_and(|sh| sh.routes_self());
        let mut sends: Vec<(usize, u64)> = sends.to_vec();
        let mut recvs: Vec<(usize, u64)> = recvs.to_vec();
        let mut forked = false;
        let mut local = Vec::new();
        if !routes_self {
            // A rank's message to itself goes by the copy engine, taking no
            // SM, beside the kernel where there is one; up to
            // SELF_COPY_IN_KERNEL bytes, by the kernel itself, whose time
            // the copy then hides in, where the fork and join cost more
            // than the copy.
            let mut copies: Vec<(u64, u64)> = self_sends
                .iter()
                .zip(&self_recvs)
                .filter(|(s, r)| s != r)
                .map(|(s, r)| (*s, *r))
                .collect();
            sends.retain(|s| s.0 != me);
            recvs.retain(|r| r.0 != me);
            let peers = !(sends.is_empty() && recvs.is_empty());
            let fits = sends.len() + recvs.len() + copies.len() <= oxccl_kernels::MAX_STEPS;
            if peers && fits && bytes <= SELF_COPY_IN_KERNEL && self.window.shared.is_none() {
                local = std::mem::take(&mut copies);
            }
            let beside = !copies.is_empty() && peers;
            let on = if beside {
                Some(self.fork(stream)?)
            } else {
                None
            };
            for (s, r) in copies {
                #[allow(unsafe_code)]
                // SAFETY: both buffers passed `check` for `count` elements
                // of `dtype` (device memory of this context) and stay the
                // caller's until the stream has run the group (the side
                // stream's copy joins it below); a send and a receive
                // buffer of one group are the same buffer or apart, as
                // NCCL requires.
                unsafe {
                    on.unwrap_or(stream).copy_device(r, s, bytes)?
                };
            }
            if let (Some(side), Some(c)) = (on, self.side.as_ref()) {
                c.join.record(side)?;
                forked = true;
            }
        }
        if let Some(sh) = self.window.shared.as_mut() {
            (sends, recvs) = sh.p2p(
                self.timed,
                &self.kernels,
                &sends,
                &recvs,
                count,
                dtype,
                stream,
            )?;
        }
        if routes_self {
            // Those the shared path left to this rank (its stream is being
            // captured, or its memory cannot be shared): copied here.
            let left_s: Vec<u64> = sends.iter().filter(|s| s.0 == me).map(|s| s.1).collect();
            let left_r: Vec<u64> = recvs.iter().filter(|r| r.0 == me).map(|r| r.1).collect();
            for (s, r) in left_s.iter().zip(&left_r) {
                self.kernels
                    .copy(*r, *s, bytes, self.cfg.channels, stream)?;
            }
            sends.retain(|s| s.0 != me);
            recvs.retain(|r| r.0 != me);
        }
        if sends.is_empty() && recvs.is_empty() {
            return self.mark();
        }
        let launched = self.launch_p2p(&sends, &recvs, &local, count, dtype, stream, nch, bytes);
        if forked {
            // Joined whether or not the launch went through, so the side
            // stream never holds the caller's work back.
            if let Some(c) = self.side.as_ref() {
                c.join.wait_on(stream)?;
            }
            launched?;
            return self.mark();
        }
        launched
    }

    /// The caller's stream's work so far forks onto the side stream
    /// (made on the first call), which is returned.
    fn fork(&mut self, stream: RawStream) -> Result<RawStream> {
        if self.side.is_none() {
            self.side = Some(SideCopy {
                stream: crate::cuda::Stream::new(&self.ctx)?,
                fork: Event::new(&self.ctx, false)?,
                join: Event::new(&self.ctx, false)?,
            });
        }
        let c = self.side.as_ref().expect("made above");
        c.fork.record(stream)?;
        c.fork.wait_on(c.stream.handle())?;
        Ok(c.stream.handle())
    }

    /// The kernels of a group's messages to other ranks, and the copies of
    /// its messages to itself in `local` (source, destination): in the same
    /// kernel, or by the copy engine first where the group takes several.
    #[allow(clippy::too_many_arguments)] // one group's messages
    fn launch_p2p(
        &mut self,
        sends: &[(usize, u64)],
        recvs: &[(usize, u64)],
        local: &[(u64, u64)],
        count: usize,
        dtype: DataType,
        stream: RawStream,
        nch: usize,
        bytes: usize,
    ) -> Result<()> {
        match fused_p2p(sends, recvs, local, bytes) {
            Some((t, input, output)) => {
                // One kernel moves every message, so a send's wait for its
                // reader at the end never holds up a receive.
                let direct = self.p2p_direct(sends, bytes, stream)?;
                self.launch(
                    t,
                    input,
                    output,
                    count,
                    dtype,
                    RedOp::Sum,
                    stream,
                    nch,
                    direct,
                )
            }
            None => {
                tracing::debug!(target: "oxccl::coll", "send/recv group of {} send(s), {} recv(s) not addressable from one base: one kernel each", sends.len(), recvs.len());
                for &(s, d) in local {
                    #[allow(unsafe_code)]
                    // SAFETY: as for the copies in `p2p_on`: checked device
                    // buffers of this context, the caller's until the
                    // stream has run the group, the same or apart.
                    unsafe {
                        stream.copy_device(d, s, bytes)?
                    };
                }
                // Sends never read in place here: a send kernel that waited
                // for its reader would hold up this rank's receives after it.
                let none = Direct::default();
                for &(p, b) in sends {
                    let t = Template::send(p);
                    self.launch(t, b, 0, count, dtype, RedOp::Sum, stream, nch, none)?;
                }
                for &(p, b) in recvs {
                    let t = Template::recv(p);
                    self.launch(t, 0, b, count, dtype, RedOp::Sum, stream, nch, none)?;
                }
                Ok(())
            }
        }
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

    /// `channels`: thread blocks, at most the window's (`cfg.channels`).
    #[allow(clippy::too_many_arguments)] // one kernel launch's whole description
    fn launch(
        &mut self,
        t: Template,
        input: u64,
        output: u64,
        count: usize,
        dtype: DataType,
        op: RedOp,
        stream: RawStream,
        channels: usize,
        direct: Direct,
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        self.window.check_active()?;
        let (kop, sc) = kernel_op(dtype, op, self.nranks);
        let kernel = self.kernels.coll(dtype, kop)?;
        // Small operations go through the LL FIFO where the window has one
        // (peers through host memory): the receiver polls the data itself,
        // the sender posts without a fence. NCCL_PROTO decides alike on
        // every rank (rank 0's).
        let proto = self.protocol(count * dtype.size());
        let ll = proto == Proto::Ll;
        let shape = if ll {
            let channels = channels.min(self.window.ll_channels);
            plan::shape_ll(&self.cfg, count, dtype.size(), t.nchunks as usize, channels)
        } else {
            plan::shape(&self.cfg, count, dtype.size(), t.nchunks as usize, channels)
        };
        self.order_after_last(stream)?;
        let nch = shape.channels as usize;
        let timed = match &self.stamps {
            Some(st) if self.timed && !self.capturing() => st.claim(nch),
            _ => None,
        };
        let mut args = CollArgs {
            comm: self.window.buf.ptr(),
            input,
            output,
            count: count as u64,
            sc,
            timeout_ns: self.cfg.timeout.as_nanos().min(u64::MAX as u128) as u64,
            nsteps: t.nsteps,
            nchunks: t.nchunks,
            slice_elems: shape.slice_elems,
            nchannels: shape.channels,
            group: self.cfg.group as u32,
            proto: if ll { PROTO_LL } else { PROTO_SIMPLE },
            stamps: match (&self.stamps, timed) {
                (Some(st), Some(slot)) => st.device_addr(slot),
                _ => 0,
            },
            abort: self.stop.device_word(),
            direct_in: 0,
            direct_out: 0,
            direct_from: 0,
            steps: t.steps,
        };
        // Registered buffers are read in place through the simple FIFO only
        // (an LL line carries its data with its flag).
        if !ll {
            args.direct_from = self.window.same_process_p2p();
            let (i, o) = (
                direct.input & args.direct_from,
                direct.output & args.direct_from,
            );
            if sends_in_place(&t, i, o) {
                (args.direct_in, args.direct_out) = (i, o);
            }
        }
        let in_place = args.direct_in | args.direct_out;
        if let Some(e) = self.window.failure() {
            return Err(e.context("the network proxy of this communicator stopped"));
        }
        if let Some(e) = self.window.gone() {
            return Err(e.context("a peer of this communicator left"));
        }
        if self.stop.is_raised() {
            return Err(Error::InvalidUsage(
                "the communicator was told to end its operations (revoke, abort or NCCL_SHRINK_ABORT): no launch runs on it".into(),
            ));
        }
        if self.announce {
            // A captured launch runs whenever the graph is replayed, never
            // announced: the proxy can no longer number its steps.
            if self.capturing() {
                self.announce = false;
                self.window.lost();
            } else {
                let l = self.launch_steps(&t, count, dtype.size(), shape, proto);
                self.window.announce(l);
            }
        }
        let r = kernel.launch(shape.channels, self.cfg.threads, stream, &args);
        if r.is_ok() && in_place != 0 {
            self.direct_launches += 1;
            if self.direct_launches == 1 {
                let peers: Vec<usize> = (0..64).filter(|p| in_place & (1 << p) != 0).collect();
                tracing::info!(target: "oxccl::reg", "rank {}: peers {peers:?} read this rank's registered {} where it lies, no step slot (first such launch of this communicator)", self.rank,
                    match (args.direct_in != 0, args.direct_out != 0) { (true, true) => "input and output", (true, false) => "input", _ => "output" });
            }
        }
        if r.is_err() && self.announce {
            self.announce = false;
            self.window.lost();
        }
        self.window.kick();
        if let (Some(st), Some(slot)) = (&self.stamps, timed) {
            match r {
                Ok(()) => self.launched.push(TimedLaunch {
                    slot,
                    channels: nch,
                }),
                Err(_) => st.release(slot, nch),
            }
        }
        r.and_then(|()| self.mark())
    }

    /// The steps a launch moves on each net connection, in the kernel's
    /// order, each run with the event of the operation it belongs to when
    /// the group's mask asks for proxy events.
    /// `proto`: the FIFOs the launch goes through (the LL ones have links
    /// of their own).
    fn launch_steps(
        &mut self,
        t: &Template,
        count: usize,
        esize: usize,
        shape: Shape,
        proto: Proto,
    ) -> Launch {
        let steps = &t.steps[..t.nsteps as usize];
        let mut parents = self
            .parents
            .as_mut()
            .filter(|p| ProxyProfiler::wants_ops(p.mask));
        let mask = parents.as_ref().map_or(0, |p| p.mask);
        let mut of_step: Vec<Option<Handle>> = Vec::with_capacity(steps.len());
        for d in steps {
            of_step.push(parents.as_mut().map(|p| match p.coll {
                Some(h) => h,
                None => {
                    let (peer, send) = if d.send >= 0 {
                        (d.send as usize, true)
                    } else {
                        (d.recv as usize, false)
                    };
                    p.p2p
                        .iter()
                        .position(|e| (e.0, e.1) == (peer, send))
                        .map_or(Handle::NONE, |i| p.p2p.remove(i).2)
                }
            }));
        }
        let net = |p: i16| p >= 0 && self.window.net_peers.contains(&(p as usize));
        // Steps of different operations on one connection interleave as
        // the kernel's groups do: only then is the order needed.
        let ordered = steps.iter().enumerate().any(|(i, a)| {
            steps[i + 1..].iter().enumerate().any(|(j, b)| {
                of_step[i] != of_step[i + 1 + j]
                    && ((net(a.send) && a.send == b.send) || (net(a.recv) && a.recv == b.recv))
            })
        });
        let chunk_bytes = shape.slice_elems as usize * esize;
        let mut conns: Vec<ConnSteps> = Vec::new();
        for ch in 0..shape.channels as usize {
            let runs = plan::slice_runs(t, count, esize, shape, self.cfg.group, ch, ordered);
            for (i, n) in runs {
                let d = steps[i];
                for (peer, send) in [(d.send, true), (d.recv, false)] {
                    if !net(peer) {
                        continue;
                    }
                    let peer = peer as usize;
                    let last = conns
                        .iter_mut()
                        .rev()
                        .find(|c| (c.peer, c.chan, c.send) == (peer, ch, send));
                    match last {
                        Some(c) if c.parent == of_step[i] => c.steps += n,
                        _ => conns.push(ConnSteps {
                            peer,
                            chan: ch,
                            send,
                            steps: n,
                            parent: of_step[i],
                            chunk_bytes,
                            proto,
                        }),
                    }
                }
            }
        }
        Launch { mask, conns }
    }

    /// Operations share the window's counters, so each must run after the
    /// previous one even when the caller switches streams. On a switch, the
    /// new stream waits for the event recorded after the previous
    /// operation's work ([`DeviceComm::mark`]): the old stream itself may
    /// be gone by then, so nothing is asked of it.
    ///
    /// An event joins two streams only when both are in the same CUDA graph
    /// capture or neither is: CUDA refuses a wait that would tie a capture
    /// to work outside it (CUDA_ERROR_STREAM_CAPTURE_ISOLATION, which also
    /// invalidates the capture; PyTorch captures on a side stream after
    /// warming up on another). Across that border the caller orders the
    /// graph's launches, as with NCCL.
    fn order_after_last(&mut self, stream: RawStream) -> Result<()> {
        let capture = stream.capture_id()?;
        if let Some((_, last)) = self.last.filter(|(l, _)| *l != stream) {
            if last == capture {
                self.order.wait_on(stream)?;
            }
        }
        self.opened = Some((stream, capture));
        Ok(())
    }

    /// Whether the operation being enqueued goes into a graph capture (as
    /// `order_after_last` found its stream).
    fn capturing(&self) -> bool {
        self.opened.is_some_and(|(_, capture)| capture.is_some())
    }

    /// After an operation's work is enqueued (on a live stream: the
    /// caller's, during its call): records `order` behind it for the next
    /// operation. One event record per operation, as NCCL records one per
    /// launch to order its streams.
    fn mark(&mut self) -> Result<()> {
        if let Some((stream, capture)) = self.opened {
            self.order.record(stream)?;
            self.last = Some((stream, capture));
        }
        Ok(())
    }
}

/// Whether a step of `t` sends from a buffer its peer reads in place
/// (`input`, `output`: the peers that read each, a bit per rank), as the
/// kernel's `oxccl_direct` decides: from the step's destination, or from
/// its source where it receives nothing. The exchange (a step that sends
/// its source and overwrites it in place) never does.
fn sends_in_place(t: &Template, input: u64, output: u64) -> bool {
    use crate::cuda::abi::{BUF_INPUT, BUF_OUTPUT};
    let reads = |buf: u8, peer: i16| {
        let mask = match buf {
            BUF_INPUT => input,
            BUF_OUTPUT => output,
            _ => 0,
        };
        (0..64).contains(&peer) && mask & (1 << peer) != 0
    };
    t.steps[..t.nsteps as usize].iter().any(|d| {
        d.send >= 0
            && d.flags & crate::cuda::abi::STEP_SEND_LOCAL == 0
            && (reads(d.dst_buf, d.send) || (d.recv < 0 && reads(d.src_buf, d.send)))
    })
}

/// One template for a group of sends and receives of `bytes` each, and
/// the copies of a rank's messages to itself (`local`: source, destination),
/// when every buffer is a whole number of blocks from the lowest of its
/// side: the template, the input base and the output base.
fn fused_p2p(
    sends: &[(usize, u64)],
    recvs: &[(usize, u64)],
    local: &[(u64, u64)],
    bytes: usize,
) -> Option<(Template, u64, u64)> {
    let lowest = |v: &mut dyn Iterator<Item = u64>| v.min().unwrap_or(0);
    let ib = lowest(&mut sends.iter().map(|x| x.1).chain(local.iter().map(|x| x.0)));
    let ob = lowest(&mut recvs.iter().map(|x| x.1).chain(local.iter().map(|x| x.1)));
    let block = |b: u64, base: u64| -> Option<u16> {
        let off = b - base;
        off.is_multiple_of(bytes as u64)
            .then(|| u16::try_from(off / bytes as u64).ok())?
    };
    let mut steps = Vec::with_capacity(sends.len() + recvs.len() + local.len());
    for &(p, b) in sends {
        let mut t = Template::send(p).steps[0];
        t.src_block = block(b, ib)?;
        steps.push(t);
    }
    for &(p, b) in recvs {
        let mut t = Template::recv(p).steps[0];
        t.dst_block = block(b, ob)?;
        steps.push(t);
    }
    for &(s, d) in local {
        // Neither sends nor receives: the kernel copies the slice.
        let mut t = Template::send(0).steps[0];
        t.send = -1;
        t.dst_buf = crate::cuda::abi::BUF_OUTPUT;
        t.src_block = block(s, ib)?;
        t.dst_block = block(d, ob)?;
        steps.push(t);
    }
    Some((Template::from_steps(&steps).ok()?, ib, ob))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_all_to_all_copies_its_own_block_in_its_kernel() {
        use crate::cuda::abi::{BUF_INPUT, BUF_OUTPUT};
        let (inp, out, b) = (0x1000_0000u64, 0x2000_0000u64, 4096usize);
        // Rank 0 of 2: block 1 to and from rank 1, block 0 to itself.
        let (t, ib, ob) = fused_p2p(
            &[(1, inp + b as u64)],
            &[(1, out + b as u64)],
            &[(inp, out)],
            b,
        )
        .unwrap();
        assert_eq!((ib, ob, t.nsteps), (inp, out, 3));
        let own = t.steps[2];
        assert_eq!((own.recv, own.send), (-1, -1), "no peer");
        assert_eq!((own.src_buf, own.src_block), (BUF_INPUT, 0));
        assert_eq!((own.dst_buf, own.dst_block), (BUF_OUTPUT, 0));
        assert_eq!((t.steps[0].send, t.steps[0].src_block), (1, 1));
        assert_eq!((t.steps[1].recv, t.steps[1].dst_block), (1, 1));
        // Not a whole number of blocks apart: no fused template.
        assert!(fused_p2p(&[(1, inp + 8)], &[], &[(inp, out)], b).is_none());
    }

    #[test]
    fn which_schedules_send_from_buffers_read_in_place() {
        let peer1 = 1 << 1;
        let ag = plan::template(Algo::Ring, Coll::AllGather, 0, 2).unwrap();
        assert!(sends_in_place(&ag, 0, peer1), "from its output");
        assert!(sends_in_place(&ag, peer1, 0), "from its input");
        assert!(!sends_in_place(&ag, 1 << 0, 0), "no bit for the peer");
        let ar = plan::template(Algo::Ring, Coll::AllReduce, 0, 2).unwrap();
        assert!(sends_in_place(&ar, 0, peer1), "the final reduced slices");
        // The exchange overwrites what it sends: never in place.
        let ex = plan::template(Algo::RecDoubling, Coll::AllReduce, 0, 2).unwrap();
        assert!(!sends_in_place(&ex, peer1, peer1));
        // A broadcast's last rank only receives.
        let leaf = plan::template(Algo::Ring, Coll::Broadcast { root: 0 }, 1, 2).unwrap();
        assert!(!sends_in_place(&leaf, 1, 1));
        assert!(sends_in_place(&Template::send(1), peer1, 0));
        assert!(!sends_in_place(&Template::recv(1), peer1, peer1));
    }
}
