//! Operations of a communicator bound to a GPU: handed to the device
//! executor, which enqueues kernels on the caller's stream and returns
//! without waiting (NCCL's contract). The communicator's bootstrap carries
//! the executor's setup exchange.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use oxccl_plugin::ffi::profiler::NCCL_PROFILE_KERNEL_CH;

use crate::bootstrap::Bootstrap;
use tracing::{debug, info};

use super::core::GpuPath;
use super::ident::Peers;
use super::kernel_events::KernelEvents;
use super::staged::Staged;
use crate::algo::{cost, Algo, Coll};
use crate::config::Config;
use crate::cuda::{pointer_kind, Context, Device, PtrKind, RawStream, SavedCurrent};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::exec::device::{Choice, DeviceComm, DeviceConfig, Oob};
use crate::exec::mem::OpBuffers;
use crate::op::{Op, OpKind};
use crate::plugin::profiler::{Event, Handle, ProfilerComm};
use crate::plugin::tuner::TunerComm;

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

/// Binds this rank to GPU `device`: every rank of the communicator calls
/// it during creation, and all take the same path: kernels over peer
/// mappings when every rank is on this node and none disabled P2P; else
/// staging through pinned host memory over the network.
pub(crate) fn open(
    bootstrap: &Bootstrap,
    (rank, nranks): (usize, usize),
    peers: &Peers,
    device: usize,
    cfg: &Config,
    net: &str,
) -> Result<GpuPath> {
    let _restore = SavedCurrent::save()?;
    let (nnodes, disabled) = (peers.nnodes, &peers.p2p_disabled);
    if nnodes == 1 && disabled.is_empty() {
        let oob = BootstrapOob {
            bootstrap,
            rank,
            nranks,
        };
        let dc = DeviceComm::new(
            &oob,
            device,
            DeviceConfig::from_env()?.with_nccl_bounds(cfg),
        )
        .map_err(|e| e.context(format!("binding rank {rank} to GPU {device}")))?;
        return Ok(GpuPath::Peer(Box::new(Mutex::new(dc))));
    }
    let why = if nnodes > 1 {
        format!("ranks on {nnodes} nodes")
    } else {
        format!("NCCL_P2P_DISABLE=1 on rank(s) {disabled:?}")
    };
    info!(target: "oxccl::init", "rank {rank} on GPU {device}: {why}: device buffers are staged through pinned host memory (shared memory to ranks of this host unless NCCL_SHM_DISABLE=1, network {net} to other hosts; no GPUDirect)");
    let ctx = Context::primary(Device::get(device)?)?;
    Ok(GpuPath::Staged(Staged::new(ctx).map_err(|e| {
        e.context(format!("binding rank {rank} to GPU {device}"))
    })?))
}

/// The profiler as one group of the device path reports to it: NCCL's
/// points (a group event, an event per operation, started before its
/// kernel is launched and stopped once it is enqueued), and, when the mask
/// asks for them, kernel-channel events from the launches' GPU times.
pub(crate) struct Profiling<'a> {
    pub comm: &'a Arc<ProfilerComm>,
    pub mask: i32,
    /// The number of the group's first collective.
    pub seq: u64,
    pub kernel_events: &'a OnceLock<KernelEvents>,
    /// How long a launch may run before its channel events are given up.
    pub limit: Duration,
    pub rank: usize,
}

/// What chooses how a collective runs, besides the device's own table:
/// the tuner plugin and NCCL_ALGO.
pub(crate) struct Tuning<'a> {
    pub tuner: Option<&'a TunerComm>,
    pub forced: Option<Algo>,
}

/// The algorithm and channels of one collective: the cheapest entry of the
/// device's cost table (NCCL_ALGO masks it), as the tuner changed it. Every
/// rank decides alike: the same table, tuner and settings.
fn choose(dc: &DeviceComm, t: &Tuning<'_>, coll: Coll, count: usize, dtype: DataType) -> Choice {
    let own = dc.default_choice(coll, count, dtype, t.forced);
    let Some(tuner) = t.tuner else {
        return own;
    };
    let (bytes, n, model) = (count * dtype.size(), dc.nranks(), own.algo);
    let table = cost::device_table(coll, bytes, n, t.forced);
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
    Choice { algo, channels }
}

/// Enqueues one group's operations of this communicator: collectives in
/// order, then the point-to-point messages together.
pub(crate) fn execute(
    dc: &Mutex<DeviceComm>,
    ops: &[(Op, OpBuffers)],
    tuning: Tuning<'_>,
    prof: Option<Profiling<'_>>,
) -> Result<()> {
    let mut dc = dc
        .lock()
        .map_err(|_| Error::Internal("device communicator poisoned by an earlier panic".into()))?;
    for (op, bufs) in ops {
        check_reachable(dc.context().device().ordinal(), op, bufs)?;
    }
    let _restore = SavedCurrent::save()?;
    let events = match &prof {
        Some(p) => kernel_events(&mut dc, p)?,
        None => None,
    };
    let p = prof.as_ref();
    let mask = p.map_or(0, |p| p.mask);
    let group = p.map(|p| p.comm.running(p.comm.start(mask, Event::Group)));
    // Each timed launch since the last call, with the events it ran for.
    let track = |dc: &mut DeviceComm, parents: &[Handle]| {
        if let Some(ev) = events {
            for t in dc.take_timed() {
                ev.track(t.slot, t.channels, parents.to_vec());
            }
        }
    };
    let colls = ops.iter().filter(|(op, _)| op.kind.coll().is_some());
    for (i, (op, _)) in colls.enumerate() {
        let coll = op.kind.coll().expect("a collective");
        let choice = choose(&dc, &tuning, coll, op.count, op.dtype);
        let event = match (p, &group) {
            (Some(p), Some(g)) => {
                let (seq, algo, nch) = (p.seq + i as u64, choice.algo, choice.channels);
                Some(
                    p.comm
                        .running(p.comm.coll(mask, op, seq, algo, nch, g.handle())),
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
        dc.collective(coll, Some(choice), i, o, n, t, op.redop, s)?;
        // A plugin may not track the operation (a NULL handle): its
        // channels still get events, parentless, as in NCCL, and the
        // launch's slot is freed when it ends.
        track(
            &mut dc,
            &[event.as_ref().map_or(Handle::NONE, |e| e.handle())],
        );
    }
    let p2p: Vec<&Op> = ops
        .iter()
        .map(|(op, _)| op)
        .filter(|op| op.kind.coll().is_none())
        .collect();
    let p2p_events: Vec<_> = match (p, &group) {
        (Some(p), Some(g)) => p2p
            .iter()
            .map(|op| {
                let nch = dc.channels_for(op.count * op.dtype.size());
                p.comm.running(p.comm.p2p(mask, op, nch, g.handle()))
            })
            .collect(),
        _ => Vec::new(),
    };
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
        dc.p2p(&sends, &recvs, count, dtype, stream(msgs[0]))?;
        // Every message of the size moves on every channel of its kernel.
        let parents: Vec<Handle> = p2p
            .iter()
            .zip(&p2p_events)
            .filter(|(op, _)| of_size(op))
            .map(|(_, e)| e.handle())
            .collect();
        track(&mut dc, &parents);
    }
    Ok(())
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

/// A kernel that touches memory its GPU cannot reach faults the context
/// for good; refusing the call instead names the buffer.
pub(super) fn check_reachable(gpu: usize, op: &Op, bufs: &OpBuffers) -> Result<()> {
    if op.count == 0 {
        return Ok(());
    }
    for (what, ptr, _) in bufs.used() {
        if pointer_kind(ptr) == PtrKind::Unknown {
            return Err(Error::InvalidArgument(format!(
                "{}: {what} {ptr:#x} is not memory CUDA knows (pageable host memory?): this communicator runs on GPU {}; pass device memory (cudaMalloc, ncclMemAlloc) or registered host memory",
                op.kind.name(),
                gpu
            )));
        }
    }
    Ok(())
}
