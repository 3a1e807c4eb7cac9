//! Operations of a communicator bound to a GPU: handed to the device
//! executor, which enqueues kernels on the caller's stream and returns
//! without waiting (NCCL's contract). The communicator's bootstrap carries
//! the executor's setup exchange.

use std::sync::Mutex;

use crate::bootstrap::Bootstrap;
use tracing::info;

use super::core::GpuPath;
use super::ident::Peers;
use super::staged::Staged;
use crate::config::Config;
use crate::cuda::{pointer_kind, Context, Device, PtrKind, RawStream, SavedCurrent};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::exec::device::{DeviceComm, DeviceConfig, Oob};
use crate::exec::mem::OpBuffers;
use crate::op::{Op, OpKind};

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
    info!(target: "oxccl::init", "rank {rank} on GPU {device}: {why}: device buffers are staged through pinned host memory over network {net}");
    let ctx = Context::primary(Device::get(device)?)?;
    Ok(GpuPath::Staged(Staged::new(ctx).map_err(|e| {
        e.context(format!("binding rank {rank} to GPU {device}"))
    })?))
}

/// Enqueues one group's operations of this communicator: collectives in
/// order, then the point-to-point messages together.
pub(crate) fn execute(dc: &Mutex<DeviceComm>, ops: &[(Op, OpBuffers)]) -> Result<()> {
    let mut dc = dc
        .lock()
        .map_err(|_| Error::Internal("device communicator poisoned by an earlier panic".into()))?;
    for (op, bufs) in ops {
        check_reachable(dc.context().device().ordinal(), op, bufs)?;
    }
    let _restore = SavedCurrent::save()?;
    for (op, _) in ops.iter().filter(|(op, _)| op.kind.coll().is_some()) {
        collective(&mut dc, op)?;
    }
    let p2p: Vec<&Op> = ops
        .iter()
        .map(|(op, _)| op)
        .filter(|op| op.kind.coll().is_none())
        .collect();
    // Messages of one size go together in one kernel; each size is a kernel.
    let mut sizes: Vec<usize> = Vec::new();
    for op in &p2p {
        let b = op.count * op.dtype.size();
        if b > 0 && !sizes.contains(&b) {
            sizes.push(b);
        }
    }
    for bytes in sizes {
        let group: Vec<&&Op> = p2p
            .iter()
            .filter(|op| op.count * op.dtype.size() == bytes)
            .collect();
        let dtype = group[0].dtype;
        let (count, dtype) = if group.iter().all(|op| op.dtype == dtype) {
            (group[0].count, dtype)
        } else {
            (bytes, DataType::Uint8)
        };
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for op in &group {
            match op.kind {
                OpKind::Send { peer } => sends.push((peer, op.input as u64)),
                OpKind::Recv { peer } => recvs.push((peer, op.output as u64)),
                _ => {}
            }
        }
        dc.p2p(&sends, &recvs, count, dtype, stream(group[0]))?;
    }
    Ok(())
}

#[allow(unsafe_code)] // the one place an op's stream handle is trusted
pub(super) fn stream(op: &Op) -> RawStream {
    // SAFETY: the caller of `Comm::enqueue` promised a live stream of the
    // communicator's GPU (or 0), as NCCL requires of its callers.
    unsafe { RawStream::from_raw(op.stream) }
}

fn collective(dc: &mut DeviceComm, op: &Op) -> Result<()> {
    let (i, o, n, t, s) = (
        op.input as u64,
        op.output as u64,
        op.count,
        op.dtype,
        stream(op),
    );
    match op.kind {
        OpKind::AllReduce => dc.all_reduce(i, o, n, t, op.redop, s),
        OpKind::Broadcast { root } => dc.broadcast(i, o, n, t, root, s),
        OpKind::Reduce { root } => dc.reduce(i, o, n, t, op.redop, root, s),
        OpKind::AllGather => dc.all_gather(i, o, n, t, s),
        OpKind::ReduceScatter => dc.reduce_scatter(i, o, n, t, op.redop, s),
        OpKind::Send { .. } | OpKind::Recv { .. } => Ok(()),
    }
}

/// A kernel that touches memory its GPU cannot reach faults the context
/// for good; refusing the call instead names the buffer.
pub(super) fn check_reachable(gpu: usize, op: &Op, bufs: &OpBuffers) -> Result<()> {
    for (what, ptr, len) in [
        ("sendbuff", bufs.input as u64, bufs.in_bytes),
        ("recvbuff", bufs.output as u64, bufs.out_bytes),
    ] {
        if len == 0 || op.count == 0 {
            continue;
        }
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
