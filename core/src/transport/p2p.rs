//! P2P: a peer GPU's window reached by its address. A peer in this process
//! is addressed as it is once peer access between the two contexts is on;
//! a peer in another process through CUDA IPC mappings of its window and
//! of its FIFO slots. The kernel then stores into the peer's slots and
//! polls counters in its own window (see `kernels/cuda/coll.cu`). The
//! device window (`exec::device::window`) assembles these beside the
//! SHM and net peers.

use std::sync::Arc;

use crate::cuda::{Context, Device, IpcMapping, IpcMemHandle};
use crate::error::{Error, Result};

/// What a P2P peer told this rank of its window.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub rank: usize,
    /// The machine it runs on (`/etc/machine-id`'s hash).
    pub node: u64,
    /// Its GPU's ordinal.
    pub device: u32,
    pub same_process: bool,
    /// Its window and its FIFO slots, at its own addresses.
    pub window: u64,
    pub fifo: u64,
    /// Their IPC handles, for a peer in another process.
    pub ipc: Option<IpcMemHandle>,
    pub fifo_ipc: Option<IpcMemHandle>,
}

/// How a P2P peer's window is held; for as long as the window is used.
#[derive(Debug)]
pub enum Mapping {
    /// Same process: the address works once peer access to its context is on.
    Direct { _peer_ctx: Option<Arc<Context>> },
    /// Another process: IPC mappings of its window and of its FIFO slots
    /// (none while suspended).
    Ipc {
        _window: IpcMapping,
        fifo: Option<IpcMapping>,
    },
}

/// Where this process stores into a P2P peer, and what keeps it mapped.
#[derive(Debug)]
pub struct Connected {
    pub window: u64,
    pub fifo: u64,
    pub mapping: Mapping,
}

/// The node of a P2P peer must be this one, whatever NCCL_HOSTID says (the
/// mapping needs the same machine), and this GPU must reach the peer's.
pub fn check(ctx: &Arc<Context>, peer: &Peer, my_node: u64) -> Result<Device> {
    let p = peer.rank;
    if peer.node != my_node {
        return Err(Error::InvalidUsage(format!(
            "rank {p} shares this rank's host id but runs on another machine: P2P needs one machine (set NCCL_HOSTID alike only on one machine, or NCCL_P2P_DISABLE=1)"
        )));
    }
    let dev = Device::get(peer.device as usize)?;
    if !ctx.device().can_access_peer(&dev)? {
        return Err(Error::System(format!(
            "GPU {} cannot access GPU {} (no peer-to-peer path; NCCL_P2P_DISABLE=1 takes shared memory instead)",
            ctx.device().ordinal(),
            peer.device
        )));
    }
    Ok(dev)
}

/// Checks and maps `peer`'s window and slots into this context.
pub fn connect(ctx: &Arc<Context>, peer: &Peer, my_node: u64) -> Result<Connected> {
    let dev = check(ctx, peer, my_node)?;
    if peer.same_process {
        let peer_ctx = if dev == ctx.device() {
            None
        } else {
            let pc = Context::primary(dev)?;
            ctx.enable_peer_access(&pc)?;
            Some(pc)
        };
        return Ok(Connected {
            window: peer.window,
            fifo: peer.fifo,
            mapping: Mapping::Direct {
                _peer_ctx: peer_ctx,
            },
        });
    }
    let (Some(h), Some(fh)) = (peer.ipc, peer.fifo_ipc) else {
        return Err(Error::System(format!(
            "rank {} could not export its window (CUDA IPC)",
            peer.rank
        )));
    };
    let window = IpcMapping::open(ctx, &h)?;
    let f = IpcMapping::open(ctx, &fh)?;
    Ok(Connected {
        window: window.ptr(),
        fifo: f.ptr(),
        mapping: Mapping::Ipc {
            _window: window,
            fifo: Some(f),
        },
    })
}

impl Mapping {
    /// Whether the peer is in another process (its slots come by IPC).
    pub fn is_ipc(&self) -> bool {
        matches!(self, Mapping::Ipc { .. })
    }

    /// Drops the mapping of the peer's slots (a suspend frees them).
    pub fn unmap_fifo(&mut self) {
        if let Mapping::Ipc { fifo, .. } = self {
            *fifo = None;
        }
    }

    /// Maps rank `p`'s new slots at a resume, from what it sent: their
    /// address (8 bytes), then for IPC their handle (64 bytes). Where this
    /// process stores into them.
    pub fn remap_fifo(&mut self, ctx: &Arc<Context>, p: usize, sent: &[u8]) -> Result<u64> {
        let part = |at: std::ops::Range<usize>| {
            sent.get(at)
                .ok_or_else(|| Error::Remote(format!("rank {p} sent no FIFO slots at the resume")))
        };
        match self {
            Mapping::Direct { .. } => {
                let b: [u8; 8] = part(0..8)?.try_into().expect("8 bytes");
                Ok(u64::from_le_bytes(b))
            }
            Mapping::Ipc { fifo, .. } => {
                let h = IpcMemHandle(part(8..72)?.try_into().expect("64 bytes"));
                let mapped = IpcMapping::open(ctx, &h)
                    .map_err(|e| e.context(format!("mapping rank {p}'s FIFO slots again")))?;
                let at = mapped.ptr();
                *fifo = Some(mapped);
                Ok(at)
            }
        }
    }
}
