//! Each rank's window: GPU memory holding the kernel's header and
//! counters, and the receive areas its peers store into. A peer reaches
//! this rank through the transport chosen for the pair (see
//! `crate::transport`): P2P peers store into the window itself, mapped by
//! address (ranks of one process, peer access on) or through CUDA IPC
//! (`crate::transport::p2p`);
//! SHM peers into this rank's host area, a POSIX segment every such peer
//! maps into its own GPU; net peers through the proxy, which fills the same
//! host area from the network and sends what the kernel stores into a
//! local mirror of the peer's area. With GPUDirect the net peers' slots
//! (both ways) are GPU memory the plugin reads and writes; their counters
//! stay in the host areas, where the proxy polls them. The record each
//! rank sends the others at setup, and what the records say of shared
//! GPUs, are `super::peers`'s.

use std::sync::Arc;

use oxccl_kernels::MAX_RANKS;

use oxccl_plugin::PtrType;

use super::config::{DeviceConfig, LL_CHANNELS};
use super::oob::Oob;
use super::peers::{fnv1a, gpu_of, mixed_groups, node_id, processes, shared_gpus, PeerInfo};
use super::shared::{self, SharedGpu};
use crate::cuda::abi::WinHeader;
use crate::cuda::{Context, DeviceBuffer, Registered};
use crate::error::{Error, Result};
use crate::transport::layout::{Layout, Proto};
use crate::transport::p2p;
use crate::transport::proxy::{Areas, Link, Proxy, Slots};
use crate::transport::shm::area::Area;
use crate::transport::Transport;

/// Connects to `peers` on the given channels, both directions, in one
/// exchange; each link carries its channel's number.
pub type Connect<'a> = Box<dyn FnOnce(&[usize], &[usize]) -> Result<Vec<Link>> + 'a>;

/// How this rank reaches the others, and how its net connections are made.
pub struct Transports<'a> {
    /// Per rank (this rank's own entry is ignored).
    pub routes: Vec<Transport>,
    /// Connects to `peers` on channels `0..channels`, both directions.
    pub connect: Connect<'a>,
    /// The network reads and writes device memory (GPUDirect): net peers'
    /// step slots go in GPU memory rather than host memory.
    pub gdr: bool,
    /// With `gdr`: those slots are registered with the network as a dma-buf
    /// of them (`regMrDmaBuf`) rather than as CUDA memory (`regMr`).
    pub dmabuf: bool,
    /// A profiler plugin is loaded, which the communicator will attach
    /// (or say it did not): see `Areas::profiled`.
    pub profiled: bool,
    /// The links the cost table prices, the same on every rank.
    pub fabric: crate::algo::cost::Fabric,
    /// The node as NCCL_TOPO_FILE describes it (fused over detection),
    /// whose links give the channel count; None: the links as detected.
    pub topo: Option<Arc<crate::topo::system::Node>>,
    /// GPUDirect on sends too (NCCL_NET_GDR_READ); with `gdr` only.
    pub gdr_read: bool,
    /// The CPUs the proxy thread binds to (NCCL_IGNORE_CPU_AFFINITY);
    /// `None`: it keeps the ones it inherits.
    pub cpus: Option<Vec<usize>>,
    /// The proxy thread takes NCCL's name (NCCL_SET_THREAD_NAME=1).
    pub nccl_names: bool,
}

impl Transports<'_> {
    /// Every peer over P2P (ranks of one node with peer access).
    pub fn all_p2p(n: usize) -> Transports<'static> {
        Transports {
            routes: vec![Transport::P2p; n],
            connect: Box::new(|_, _| Ok(Vec::new())),
            gdr: false,
            dmabuf: false,
            profiled: false,
            fabric: crate::algo::cost::LinkModel::NVLINK.into(),
            topo: None,
            gdr_read: false,
            cpus: None,
            nccl_names: false,
        }
    }
}

/// Says once, on each rank that shares its GPU, with whom and which path
/// its collectives take.
fn say_shared(
    rank: usize,
    n: usize,
    mine: &[usize],
    procs: usize,
    cap: usize,
    shared: Option<&SharedGpu>,
) {
    if mine.len() < 2 {
        return;
    }
    let path = match shared {
        Some(SharedGpu::Local(_)) => format!("collectives: the last of the {n} ranks to call one runs it over every rank's buffers (one fused reduce/copy launch per output block, no ring), the others record an event and wait for its DONE word (OXCCL_SHARED_GPU=kernels: every rank's ring kernels); send/recv: every rank's kernels"),
        Some(SharedGpu::Processes(p)) => format!("collectives: rank 0 runs each over every rank's buffers (CUDA IPC; one fused reduce/copy launch per output block), the others only signal with stream memory operations (OXCCL_SHARED_GPU=kernels: every rank's kernels, time-sliced); send/recv: {}", p.p2p_path()),
        None if procs == 1 => "every rank's ring kernels, run together".to_string(),
        None => "every rank's ring kernels: they run together under MPS (nvidia-cuda-mps-control -d); without it the GPU switches between the processes and each operation waits for its turn (milliseconds); the one-launch path needs every rank of the communicator on this GPU, each in its own process or all in one".to_string(),
    };
    let how = if procs == 1 {
        "in one process".to_string()
    } else {
        format!("in {procs} processes")
    };
    tracing::info!(target: "oxccl::init", "rank {rank} shares its GPU with ranks {mine:?} {how}: {path}; up to {cap} channels per ring launch so that every rank's blocks fit on the GPU at once");
}

/// How a peer's area is reached; held for as long as the window is used.
#[derive(Debug)]
enum PeerMap {
    /// A peer GPU's window (see `crate::transport::p2p`).
    P2p(p2p::Mapping),
    /// A peer's host area, mapped here and into this GPU.
    Shm { _area: Registered<Area> },
}

/// This rank's window and its mappings of every peer's.
pub(crate) struct Window {
    /// First, so that it stops before the memory it works in goes.
    proxy: Option<Proxy>,
    /// The peers reached through the proxy.
    pub net_peers: Vec<usize>,
    ctx: Arc<Context>,
    rank: usize,
    /// The header and the counters (the layout's bytes before the slots):
    /// kept for the communicator's life, so that the address the kernels
    /// are given (CUDA graphs hold it) and the counters stay.
    pub buf: DeviceBuffer,
    /// The P2P peers' FIFO slots (the layout's slots), the bulk of the
    /// memory; `None` without P2P peers and while suspended.
    fifo: Option<DeviceBuffer>,
    /// Whether this rank has P2P peers (and so `fifo` outside a suspend).
    p2p: bool,
    suspended: bool,
    pub layout: Layout,
    /// Where this rank stores for each rank, as this process addresses it.
    pub peers: Vec<u64>,
    /// Where this rank receives from each rank.
    pub mine: Vec<u64>,
    /// Slot 0 of those areas' slots (the kernels' `fifo_peer`, `fifo_mine`).
    fifo_peer: Vec<u64>,
    fifo_mine: Vec<u64>,
    /// By peer.
    maps: Vec<(usize, PeerMap)>,
    /// This rank's host area (SHM and net peers) and send mirror (net peers).
    area: Option<Arc<Registered<Area>>>,
    mirror: Option<Arc<Registered<Area>>>,
    /// With GPUDirect, the net peers' receive slots and send slots.
    /// (receive, send); the send slots only with GPUDirect reads.
    gdr_slots: [Option<DeviceBuffer>; 2],
    /// Channels a launch may use (see `shared_gpus`), the same on every
    /// rank; the layout has room for more.
    pub launch_channels: usize,
    /// Operations of at most this many bytes per rank take the LL FIFO
    /// (rank 0's setting); `None` where the layout has none.
    pub ll_max_bytes: Option<usize>,
    /// Channels an LL launch uses at most (those with LL net connections).
    pub ll_channels: usize,
    /// Every rank on this one GPU, each in its own process, without MPS:
    /// the all-reduce that runs no kernel on the other ranks.
    pub shared: Option<SharedGpu>,
    /// How the shared-GPU path was set up (its wait bound and stop flag),
    /// to set it up again at a resume; `None` where it is not used.
    /// (all ranks in this process, wait bound, stop flag, most CTAs a
    /// launch of the path takes)
    shared_setup: Option<(
        bool,
        std::time::Duration,
        Arc<std::sync::atomic::AtomicBool>,
        usize,
    )>,
    /// Each rank's GPU as an index, where ranks of several processes share
    /// a GPU and the communicator spans other GPUs too (see
    /// `mixed_groups`); `None` for any other layout.
    pub mixed: Option<Vec<usize>>,
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("layout", &self.layout)
            .field("peers", &self.peers)
            .field("mine", &self.mine)
            .field("proxy", &self.proxy.is_some())
            .finish()
    }
}

/// `bytes` of device memory, zeroed.
fn zeroed(ctx: &Arc<Context>, bytes: usize) -> Result<DeviceBuffer> {
    let b = DeviceBuffer::alloc(ctx, bytes)?;
    b.fill_bytes(0)?;
    Ok(b)
}

fn area_name(rank: usize) -> String {
    format!(
        "/oxccl-dev-{}-{rank}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    )
}

impl Window {
    /// Allocates and zeroes this rank's window (and host areas where
    /// peers need them), exchanges how to reach them, maps every peer's and
    /// connects the net peers. Every rank's memory is zeroed before any
    /// rank returns from the exchange, so no kernel can write into memory
    /// that is not ready.
    pub fn setup(
        ctx: &Arc<Context>,
        oob: &dyn Oob,
        cfg: &DeviceConfig,
        tr: Transports<'_>,
        stop: &super::DeviceStop,
        coll_channels: usize,
    ) -> Result<Window> {
        let (rank, n) = (oob.rank(), oob.nranks());
        if n > MAX_RANKS {
            return Err(Error::InvalidUsage(format!(
                "{n} ranks: the device path addresses at most {MAX_RANKS}"
            )));
        }
        if tr.routes.len() != n {
            return Err(Error::Internal(format!(
                "{} routes for {n} ranks",
                tr.routes.len()
            )));
        }
        let route = |p: usize| {
            if p == rank {
                Transport::P2p
            } else {
                tr.routes[p]
            }
        };
        let has = |t: Transport| (0..n).any(|p| route(p) == t);
        let p2p = (0..n).any(|p| p != rank && route(p) == Transport::P2p);
        let layout = Layout::new(
            n,
            cfg.channels,
            cfg.slots,
            cfg.slot_bytes,
            cfg.ll_slot_bytes,
        );
        let buf = DeviceBuffer::alloc(ctx, layout.off_fifo)?;
        buf.fill_bytes(0)?;
        let fifo = if p2p {
            Some(zeroed(ctx, layout.bytes - layout.off_fifo)?)
        } else {
            None
        };
        let name = area_name(rank);
        let area = if has(Transport::Shm) {
            Some(Area::create_shared(&name, layout.bytes)?)
        } else if has(Transport::Net) {
            Some(Area::private(layout.bytes)?)
        } else {
            None
        };
        let area = area
            .map(|a| Registered::new(ctx, a).map(Arc::new))
            .transpose()?;
        let mirror = if has(Transport::Net) {
            Some(Arc::new(Registered::new(
                ctx,
                Area::private(layout.bytes)?,
            )?))
        } else {
            None
        };
        let gdr_slots = if tr.gdr && has(Transport::Net) {
            let bytes = layout.bytes - layout.off_fifo;
            // A dma-buf starts on a page: the driver places allocations of
            // whole 2 MiB granules on granule boundaries.
            let bytes = if tr.dmabuf {
                bytes.next_multiple_of(2 << 20)
            } else {
                bytes
            };
            // Receive slots, then send slots: those stay in host memory
            // where the network does not read GPU memory (NCCL_NET_GDR_READ).
            [
                Some(DeviceBuffer::alloc(ctx, bytes)?),
                tr.gdr_read
                    .then(|| DeviceBuffer::alloc(ctx, bytes))
                    .transpose()?,
            ]
        } else {
            [None, None]
        };
        let me = PeerInfo {
            pid: std::process::id(),
            node: node_id(),
            device: ctx.device().ordinal() as u32,
            maxch: layout.maxch as u32,
            nslots: layout.nslots as u32,
            slot_bytes: layout.slot_bytes as u64,
            window: buf.ptr(),
            // Only P2P peers of other processes need it; where IPC is
            // unavailable those fail below.
            ipc: if p2p { buf.ipc_handle().ok() } else { None },
            area: if has(Transport::Shm) {
                name
            } else {
                String::new()
            },
            gpu: fnv1a(ctx.device().pci_bus_id()?.to_ascii_lowercase().as_bytes()),
            resident: ctx
                .device()
                .resident_blocks(cfg.threads)?
                .min(u32::MAX as usize) as u32,
            fifo: fifo.as_ref().map_or(0, DeviceBuffer::ptr),
            fifo_ipc: fifo.as_ref().and_then(|f| f.ipc_handle().ok()),
            ll_slot_bytes: layout.ll_slot_bytes as u64,
            ll_max_bytes: cfg.ll_max_bytes.min(u64::MAX as usize) as u64,
        };
        let all = oob.allgather(&me.encode())?;
        if all.len() != n {
            return Err(Error::Internal(format!(
                "exchange returned {} entries for {n} ranks",
                all.len()
            )));
        }
        let infos = all
            .iter()
            .enumerate()
            .map(|(p, bytes)| {
                PeerInfo::decode(bytes).ok_or_else(|| {
                    Error::Remote(format!("rank {p} sent no device window description"))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (launch_channels, on_my_gpu, my_gpu_procs) = shared_gpus(&infos, rank, cfg.channels);
        let mixed = mixed_groups(&infos);
        let pids: Vec<u32> = infos.iter().map(|i| i.pid).collect();
        let one_gpu = gpu_of(&infos).iter().all(|&g| g == 0);
        let procs = processes(pids.iter().copied());
        let off = layout.off_fifo as u64;
        let my_fifo = me.fifo;
        let mut peers = vec![0u64; n];
        let mut mine = vec![0u64; n];
        let mut fifo_peer = vec![0u64; n];
        let mut fifo_mine = vec![0u64; n];
        let mut maps = Vec::with_capacity(n);
        let mut net_peers = Vec::new();
        let ll_max_bytes = infos[0].ll_max_bytes.min(usize::MAX as u64) as usize;
        if ll_max_bytes != cfg.ll_max_bytes {
            tracing::warn!(target: "oxccl::init", "rank {rank}: operations of up to {} bytes take the LL protocol here (NCCL_PROTO, OXCCL_DEV_LL_BYTES), up to {ll_max_bytes} on rank 0: every rank takes rank 0's", cfg.ll_max_bytes);
        }
        for (p, info) in infos.into_iter().enumerate() {
            if (info.maxch, info.nslots, info.slot_bytes, info.ll_slot_bytes)
                != (me.maxch, me.nslots, me.slot_bytes, me.ll_slot_bytes)
            {
                return Err(Error::InvalidUsage(format!(
                    "rank {p} uses {} channels x {} slots x {} bytes ({} per LL slot), rank {rank} {} x {} x {} ({}): every rank needs the same device config",
                    info.maxch, info.nslots, info.slot_bytes, info.ll_slot_bytes, me.maxch, me.nslots, me.slot_bytes, me.ll_slot_bytes
                )));
            }
            let host_area = || area.as_ref().map_or(0, |a| a.device_ptr());
            match route(p) {
                _ if p == rank => {
                    peers[p] = buf.ptr();
                    mine[p] = buf.ptr();
                }
                Transport::P2p => {
                    let peer = p2p::Peer {
                        rank: p,
                        node: info.node,
                        device: info.device,
                        same_process: info.pid == me.pid,
                        window: info.window,
                        fifo: info.fifo,
                        ipc: info.ipc,
                        fifo_ipc: info.fifo_ipc,
                    };
                    let c = p2p::connect(ctx, &peer, me.node)?;
                    mine[p] = buf.ptr();
                    fifo_mine[p] = my_fifo;
                    peers[p] = c.window;
                    fifo_peer[p] = c.fifo;
                    maps.push((p, PeerMap::P2p(c.mapping)));
                }
                Transport::Shm => {
                    if info.area.is_empty() {
                        return Err(Error::Remote(format!(
                            "rank {p} made no shared-memory area for this rank"
                        )));
                    }
                    let a = Area::open_shared(&info.area, layout.bytes)
                        .map_err(|e| e.context(format!("mapping rank {p}'s area")))?;
                    let a = Registered::new(ctx, a)?;
                    peers[p] = a.device_ptr();
                    mine[p] = host_area();
                    fifo_peer[p] = peers[p] + off;
                    fifo_mine[p] = mine[p] + off;
                    maps.push((p, PeerMap::Shm { _area: a }));
                }
                Transport::Net => {
                    peers[p] = mirror.as_ref().map_or(0, |m| m.device_ptr());
                    mine[p] = host_area();
                    let [recv, send] = &gdr_slots;
                    fifo_peer[p] = send.as_ref().map_or(peers[p] + off, |b| b.ptr());
                    fifo_mine[p] = recv.as_ref().map_or(mine[p] + off, |b| b.ptr());
                    net_peers.push(p);
                }
            }
        }
        // Every peer has mapped this rank's area: its name can go.
        oob.allgather(&[])?;
        let mut shared = None;
        let mut shared_setup = None;
        // Every rank of the communicator on this one GPU, either all in
        // this process or each in its own (ranks of one process among
        // others would wait on the host for a rank their own thread has
        // yet to call: those keep the ring).
        let local = procs == 1;
        if n > 1 && one_gpu && (local || procs == n) && (0..n).all(|p| route(p) == Transport::P2p) {
            // Every rank must take the same path: all want it or none.
            let votes = oob.allgather(&[u8::from(shared::wanted(local)?)])?;
            if votes.iter().all(|v| v.first() == Some(&1)) {
                let stop = stop.host_flag();
                // NCCL refuses ranks sharing a GPU, so it has no p2p count
                // for them: every launch of the path takes the collectives'.
                let blocks = coll_channels.clamp(1, cfg.channels);
                shared = Some(SharedGpu::setup(
                    ctx,
                    oob,
                    local,
                    cfg.timeout,
                    stop.clone(),
                    blocks,
                )?);
                shared_setup = Some((local, cfg.timeout, stop, blocks));
            }
        }
        say_shared(
            rank,
            n,
            &on_my_gpu,
            my_gpu_procs,
            launch_channels,
            shared.as_ref(),
        );
        if let Some(a) = &area {
            a.mem().unlink();
        }
        // The LL FIFOs have connections of their own, on channels numbered
        // after the simple ones': a receive is posted before its step is
        // known, so each FIFO needs its own stream of messages. Only the
        // channels LL launches use have them: the proxy tests every posted
        // receive on every pass, a system call each with the socket net.
        let maxch = layout.maxch;
        let ll_channels = if layout.has_ll() {
            maxch.min(LL_CHANNELS)
        } else {
            0
        };
        let chans: Vec<usize> = (0..maxch + ll_channels).collect();
        let (links, mut ll_links): (Vec<Link>, Vec<Link>) = (tr.connect)(&net_peers, &chans)?
            .into_iter()
            .partition(|l| l.chan < maxch);
        for l in &mut ll_links {
            l.chan -= maxch;
        }
        // The network registers the GPU slots through dma-bufs of them.
        let export = |b: &Option<DeviceBuffer>| match b {
            Some(b) if tr.dmabuf && !links.is_empty() => {
                crate::cuda::export_dma_buf(b.ptr(), b.len())
                    .map(Some)
                    .map_err(|e| e.context("exporting the net peers' GPU step slots as a dma-buf"))
            }
            _ => Ok(None),
        };
        let dmabufs = [export(&gdr_slots[0])?, export(&gdr_slots[1])?];
        let proxy = match (&area, &mirror) {
            (Some(a), Some(m)) if !links.is_empty() => Some(Proxy::start(
                links,
                ll_links,
                Areas {
                    mine: a.clone(),
                    mirror: m.clone(),
                    slots: [(&gdr_slots[0], a), (&gdr_slots[1], m)].map(|(g, h)| match g {
                        Some(b) => Slots {
                            base: b.ptr() as usize,
                            ty: PtrType::Cuda,
                        },
                        None => Slots::host(h.mem(), &layout.fifo(Proto::Simple)),
                    }),
                    dmabufs,
                    ctx: Some(ctx.clone()),
                    layout,
                    rank,
                    profiled: tr.profiled,
                    cpus: tr.cpus.clone(),
                    name: crate::log::thread_name(
                        tr.nccl_names,
                        format!("oxccl-proxy-{rank}"),
                        || format!("NCCL Progress{:2}", ctx.device().ordinal()),
                    ),
                },
            )?),
            _ => None,
        };
        let w = Window {
            proxy,
            net_peers,
            ctx: ctx.clone(),
            rank,
            buf,
            fifo,
            p2p,
            suspended: false,
            layout,
            peers,
            mine,
            fifo_peer,
            fifo_mine,
            maps,
            area,
            mirror,
            gdr_slots,
            launch_channels,
            ll_max_bytes: layout.has_ll().then_some(ll_max_bytes),
            ll_channels,
            shared,
            shared_setup,
            mixed,
        };
        w.write_header()?;
        Ok(w)
    }

    /// Writes the kernels' header at the start of the window: where this
    /// rank stores for and receives from each rank.
    fn write_header(&self) -> Result<()> {
        let (n, layout) = (self.layout.nranks, &self.layout);
        self.ctx.bind()?;
        let table = |v: &[u64]| {
            let mut t = [0u64; MAX_RANKS];
            t[..n].copy_from_slice(v);
            t
        };
        let header = WinHeader {
            off_tail: layout.off_tail as u64,
            off_head: layout.off_head as u64,
            off_state: layout.off_state as u64,
            off_fifo: layout.off_fifo as u64,
            off_size: layout.off_size as u64,
            slot_bytes: layout.slot_bytes as u64,
            nslots: layout.nslots as u32,
            maxch: layout.maxch as u32,
            rank: self.rank as u32,
            nranks: n as u32,
            off_tail_ll: layout.off_tail_ll as u64,
            off_head_ll: layout.off_head_ll as u64,
            off_size_ll: layout.off_size_ll as u64,
            off_fifo_ll: layout.off_fifo_ll as u64,
            ll_slot_bytes: layout.ll_slot_bytes as u64,
            peer: table(&self.peers),
            mine: table(&self.mine),
            fifo_peer: table(&self.fifo_peer),
            fifo_mine: table(&self.fifo_mine),
        };
        self.buf.write(0, &header.to_bytes())
    }

    /// The P2P peers that are threads of this process (a bit per rank):
    /// they address this rank's device memory at this rank's addresses,
    /// so they can read its registered buffers where they lie.
    pub fn same_process_p2p(&self) -> u64 {
        self.maps
            .iter()
            .filter(|(p, m)| *p < 64 && matches!(m, PeerMap::P2p(p2p::Mapping::Direct { .. })))
            .fold(0, |mask, (p, _)| mask | 1 << p)
    }

    /// Refuses a launch while suspended.
    pub fn check_active(&self) -> Result<()> {
        if self.suspended {
            return Err(Error::InvalidUsage(
                "the communicator is suspended (ncclCommSuspend): its device memory is released until ncclCommResume".into(),
            ));
        }
        Ok(())
    }

    pub fn suspended(&self) -> bool {
        self.suspended
    }

    /// Releases what a suspend releases (every rank calls it, once its
    /// streams have passed all of this communicator's work): the P2P
    /// peers' FIFO slots (the bulk: channels x slots x slot bytes per
    /// peer), the mappings of peers' slots, and the shared-GPU path's flag
    /// words, mailbox and mappings of other ranks' buffers. Every rank
    /// closes its mappings of the others' memory before any frees its own,
    /// as NCCL's suspend unmaps peers' buffers before it releases its own.
    ///
    /// Kept: the window's header and counters (pages; the counters go on
    /// from where they were, and the window's address, which CUDA graphs
    /// captured before the suspend hold, stays valid, as NCCL remaps its
    /// buffers at their old addresses), and what NCCL keeps of its network
    /// transport (its buffers are ncclMemPersist in its net.cc, and its
    /// connections stay): the net proxy, its connections and GPUDirect
    /// slots, the host areas of SHM and net peers and their mappings. The
    /// slots hold nothing then: every slice stored was consumed before
    /// the streams came free.
    pub fn suspend(&mut self, oob: &dyn Oob) -> Result<()> {
        self.check_active()?;
        // Every rank's streams are past its work: no peer's kernel still
        // stores into this rank's slots.
        oob.allgather(&[])?;
        for (_, m) in &mut self.maps {
            if let PeerMap::P2p(m) = m {
                m.unmap_fifo();
            }
        }
        if let Some(sh) = &mut self.shared {
            sh.unmap_peers();
        }
        // No rank maps another's slots any more: each may free its own.
        oob.allgather(&[])?;
        self.shared = None;
        self.fifo = None;
        self.suspended = true;
        Ok(())
    }

    /// Allocates the slots again, exchanges their address (and IPC
    /// handle) with the P2P peers, maps theirs and rewrites the header;
    /// sets the shared-GPU path up again. Every rank calls it; each has
    /// allocated and zeroed its slots before any returns from the
    /// exchange, so no peer's kernel can store into memory that is not
    /// ready.
    pub fn resume(&mut self, oob: &dyn Oob) -> Result<()> {
        if !self.suspended {
            return Err(Error::InvalidUsage(
                "the device window is not suspended".into(),
            ));
        }
        let fifo = if self.p2p {
            Some(zeroed(&self.ctx, self.layout.bytes - self.layout.off_fifo)?)
        } else {
            None
        };
        let ipc = self
            .maps
            .iter()
            .any(|(_, m)| matches!(m, PeerMap::P2p(m) if m.is_ipc()));
        let mut me = fifo
            .as_ref()
            .map_or(0, DeviceBuffer::ptr)
            .to_le_bytes()
            .to_vec();
        if let (true, Some(f)) = (ipc, &fifo) {
            me.extend_from_slice(&f.ipc_handle()?.0);
        }
        let all = oob.allgather(&me)?;
        let mine = fifo.as_ref().map_or(0, DeviceBuffer::ptr);
        for (p, m) in &mut self.maps {
            let p = *p;
            if let PeerMap::P2p(m) = m {
                let sent = all.get(p).map_or(&[][..], Vec::as_slice);
                self.fifo_peer[p] = m.remap_fifo(&self.ctx, p, sent)?;
                self.fifo_mine[p] = mine;
            }
        }
        self.fifo = fifo;
        self.write_header()?;
        if let Some((local, timeout, stop, blocks)) = &self.shared_setup {
            self.shared = Some(SharedGpu::setup(
                &self.ctx,
                oob,
                *local,
                *timeout,
                stop.clone(),
                (*blocks).min(self.launch_channels),
            )?);
        }
        self.suspended = false;
        Ok(())
    }

    /// The proxy thread reports its proxy-control events to `p` (and its
    /// proxy ops and steps, if it was set up for a profiler): whether
    /// launches must be announced to it from now on.
    pub fn set_profiler(&self, p: Option<&Arc<crate::plugin::profiler::ProfilerComm>>) -> bool {
        self.proxy
            .as_ref()
            .is_some_and(|proxy| proxy.set_profiler(p.cloned()))
    }

    /// See [`Proxy::announce`].
    pub fn announce(&self, l: crate::transport::proxy::Launch) {
        if let Some(p) = &self.proxy {
            p.announce(l);
        }
    }

    /// See [`Proxy::lost`].
    pub fn lost(&self) {
        if let Some(p) = &self.proxy {
            p.lost();
        }
    }

    /// A kernel was launched: the proxy polls without napping.
    pub fn kick(&self) {
        if let Some(p) = &self.proxy {
            p.kick();
        }
    }

    /// Ends what a stop can end here: the proxy's net transfers (it says
    /// goodbye to its peers and returns; its thread is joined at drop)
    /// and, on the shared-GPU path, this rank's stream waits.
    pub fn stop(&self) -> Result<()> {
        if let Some(p) = &self.proxy {
            p.halt();
        }
        match &self.shared {
            Some(sh) => sh.release(),
            None => Ok(()),
        }
    }

    /// What stopped the proxy, if anything did.
    pub fn failure(&self) -> Option<Error> {
        self.proxy.as_ref().and_then(Proxy::failure)
    }

    /// A net peer that destroyed its communicator, if one did.
    pub fn gone(&self) -> Option<Error> {
        self.proxy.as_ref().and_then(Proxy::gone)
    }

    /// Device memory this rank allocated: the window, the P2P slots, the
    /// shared-GPU flags and the GPUDirect slots, counting what a suspend
    /// released (as NCCL's ncclStatGpuMemTotal).
    pub fn device_bytes(&self) -> usize {
        self.buf.len()
            + self.suspendable_bytes()
            + self
                .gdr_slots
                .iter()
                .flatten()
                .map(DeviceBuffer::len)
                .sum::<usize>()
    }

    /// The part of [`Window::device_bytes`] a suspend releases: the P2P
    /// slots and the shared-GPU path's flag words (NCCL's
    /// ncclStatGpuMemSuspend).
    pub fn suspendable_bytes(&self) -> usize {
        let slots = if self.p2p {
            self.layout.bytes - self.layout.off_fifo
        } else {
            0
        };
        slots
            + self
                .shared_setup
                .as_ref()
                .map_or(0, |(local, ..)| SharedGpu::flag_bytes(*local))
    }

    /// Host memory this rank registered for its peers (area and mirror).
    /// Counted once per area.
    pub fn host_bytes(&self) -> usize {
        [&self.area, &self.mirror]
            .iter()
            .filter_map(|a| a.as_ref())
            .map(|a| a.mem().len())
            .sum()
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // Kernels still queued need the proxy to finish (their peers'
        // data comes through it): let them, before the fields go in order.
        if self.proxy.is_some() || self.shared.is_some() {
            let _ = self.buf.context().synchronize();
        }
    }
}
