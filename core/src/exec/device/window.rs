//! Each rank's window: GPU memory its peers write into (FIFO slots and flag
//! words), mapped by every other rank of the node, either by address (ranks
//! in one process, with peer access enabled) or through CUDA IPC.

use std::sync::Arc;

use oxccl_kernels::{FLAG_BYTES, MAX_RANKS};

use super::config::DeviceConfig;
use super::oob::Oob;
use crate::cuda::abi::WinHeader;
use crate::cuda::{Context, Device, DeviceBuffer, IpcMapping, IpcMemHandle};
use crate::error::{Error, Result};

/// Where each part of a window lies; the same on every rank (checked at
/// setup), since a rank computes offsets in its peers' windows from its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub nslots: usize,
    pub maxch: usize,
    pub slot_bytes: usize,
    pub off_tail: usize,
    pub off_head: usize,
    pub off_state: usize,
    pub off_fifo: usize,
    pub bytes: usize,
}

const PAGE: usize = 4096;

impl Layout {
    pub fn new(nranks: usize, cfg: &DeviceConfig) -> Layout {
        // One cell per (peer, channel); the peer index skips this rank.
        let cells = nranks.saturating_sub(1) * cfg.channels;
        let off_tail = WinHeader::BYTES.next_multiple_of(PAGE);
        let off_head = off_tail + cells * FLAG_BYTES;
        let off_state = off_head + cells * FLAG_BYTES;
        let off_fifo = (off_state + cells * 16).next_multiple_of(PAGE);
        Layout {
            nslots: cfg.slots,
            maxch: cfg.channels,
            slot_bytes: cfg.slot_bytes,
            off_tail,
            off_head,
            off_state,
            off_fifo,
            bytes: off_fifo + cells * cfg.slots * cfg.slot_bytes,
        }
    }
}

/// What a rank tells its peers at setup.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PeerInfo {
    pid: u32,
    node: u64,
    device: u32,
    maxch: u32,
    nslots: u32,
    slot_bytes: u64,
    window: u64,
    ipc: Option<IpcMemHandle>,
}

const MAGIC: u64 = 0x6f78_6363_6c57_6e31; // "oxcclWn1"
const INFO_BYTES: usize = 8 + 4 + 8 + 4 + 4 + 4 + 8 + 8 + 1 + 64;

impl PeerInfo {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(INFO_BYTES);
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.node.to_le_bytes());
        b.extend_from_slice(&self.device.to_le_bytes());
        b.extend_from_slice(&self.maxch.to_le_bytes());
        b.extend_from_slice(&self.nslots.to_le_bytes());
        b.extend_from_slice(&self.slot_bytes.to_le_bytes());
        b.extend_from_slice(&self.window.to_le_bytes());
        b.push(self.ipc.is_some() as u8);
        b.extend_from_slice(&self.ipc.map_or([0; 64], |h| h.0));
        b
    }

    fn decode(b: &[u8]) -> Option<PeerInfo> {
        if b.len() != INFO_BYTES {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        if u64_at(0) != MAGIC {
            return None;
        }
        Some(PeerInfo {
            pid: u32_at(8),
            node: u64_at(12),
            device: u32_at(20),
            maxch: u32_at(24),
            nslots: u32_at(28),
            slot_bytes: u64_at(32),
            window: u64_at(40),
            ipc: (b[48] != 0).then(|| IpcMemHandle(b[49..113].try_into().unwrap())),
        })
    }
}

/// This boot of this machine: ranks with the same id share a node.
fn node_id() -> u64 {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .unwrap_or_default();
    oxccl_kernels::fnv1a64(id.trim().as_bytes())
}

/// How a peer's window is reached; held for as long as the window is used.
#[derive(Debug)]
enum PeerMap {
    /// Same process: the address works once peer access to its context is on.
    Direct { _peer_ctx: Option<Arc<Context>> },
    /// Another process: an IPC mapping.
    Ipc { _map: IpcMapping },
}

/// This rank's window and its mappings of every peer's.
#[derive(Debug)]
pub(crate) struct Window {
    pub buf: DeviceBuffer,
    pub layout: Layout,
    /// Every rank's window as this process addresses it.
    pub peers: Vec<u64>,
    _maps: Vec<PeerMap>,
}

impl Window {
    /// Allocates and zeroes this rank's window, exchanges how to reach it,
    /// and maps every peer's. Every rank's window is zeroed before any rank
    /// returns from the exchange, so no kernel can write into a window that
    /// is not ready.
    pub fn setup(ctx: &Arc<Context>, oob: &dyn Oob, cfg: &DeviceConfig) -> Result<Window> {
        let (rank, n) = (oob.rank(), oob.nranks());
        if n > MAX_RANKS {
            return Err(Error::InvalidUsage(format!(
                "{n} ranks: the device path addresses at most {MAX_RANKS}"
            )));
        }
        let layout = Layout::new(n, cfg);
        let buf = DeviceBuffer::alloc(ctx, layout.bytes)?;
        buf.fill_bytes(0)?;
        let me = PeerInfo {
            pid: std::process::id(),
            node: node_id(),
            device: ctx.device().ordinal() as u32,
            maxch: layout.maxch as u32,
            nslots: layout.nslots as u32,
            slot_bytes: layout.slot_bytes as u64,
            window: buf.ptr(),
            // Only other processes need it; where IPC is unavailable those fail below.
            ipc: if n > 1 { buf.ipc_handle().ok() } else { None },
        };
        let all = oob.allgather(&me.encode())?;
        if all.len() != n {
            return Err(Error::Internal(format!(
                "exchange returned {} entries for {n} ranks",
                all.len()
            )));
        }
        let mut peers = vec![0u64; n];
        let mut maps = Vec::with_capacity(n);
        for (p, bytes) in all.iter().enumerate() {
            let info = PeerInfo::decode(bytes).ok_or_else(|| {
                Error::Remote(format!("rank {p} sent no device window description"))
            })?;
            if (info.maxch, info.nslots, info.slot_bytes) != (me.maxch, me.nslots, me.slot_bytes) {
                return Err(Error::InvalidUsage(format!(
                    "rank {p} uses {} channels x {} slots x {} bytes, rank {rank} {} x {} x {}: every rank needs the same device config",
                    info.maxch, info.nslots, info.slot_bytes, me.maxch, me.nslots, me.slot_bytes
                )));
            }
            if p == rank {
                peers[p] = buf.ptr();
                continue;
            }
            if info.node != me.node {
                return Err(Error::InvalidUsage(format!(
                    "rank {p} is on another node: the device path connects GPUs of one node only"
                )));
            }
            let dev = Device::get(info.device as usize)?;
            if !ctx.device().can_access_peer(&dev)? {
                return Err(Error::System(format!(
                    "GPU {} cannot access GPU {} (no peer-to-peer path)",
                    ctx.device().ordinal(),
                    info.device
                )));
            }
            if info.pid == me.pid {
                let peer_ctx = if dev == ctx.device() {
                    None
                } else {
                    let pc = Context::primary(dev)?;
                    ctx.enable_peer_access(&pc)?;
                    Some(pc)
                };
                peers[p] = info.window;
                maps.push(PeerMap::Direct {
                    _peer_ctx: peer_ctx,
                });
            } else {
                let h = info.ipc.ok_or_else(|| {
                    Error::System(format!("rank {p} could not export its window (CUDA IPC)"))
                })?;
                let m = IpcMapping::open(ctx, &h)?;
                peers[p] = m.ptr();
                maps.push(PeerMap::Ipc { _map: m });
            }
        }
        ctx.bind()?;
        let mut peer = [0u64; MAX_RANKS];
        peer[..n].copy_from_slice(&peers);
        let header = WinHeader {
            off_tail: layout.off_tail as u64,
            off_head: layout.off_head as u64,
            off_state: layout.off_state as u64,
            off_fifo: layout.off_fifo as u64,
            slot_bytes: layout.slot_bytes as u64,
            nslots: layout.nslots as u32,
            maxch: layout.maxch as u32,
            rank: rank as u32,
            nranks: n as u32,
            peer,
        };
        buf.write(0, &header.to_bytes())?;
        Ok(Window {
            buf,
            layout,
            peers,
            _maps: maps,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_round_trips() {
        let i = PeerInfo {
            pid: 7,
            node: 0x1234_5678_9abc,
            device: 1,
            maxch: 32,
            nslots: 8,
            slot_bytes: 1 << 17,
            window: 0x7f00_0000_0000,
            ipc: Some(IpcMemHandle([9; 64])),
        };
        assert_eq!(PeerInfo::decode(&i.encode()), Some(i.clone()));
        let none = PeerInfo { ipc: None, ..i };
        assert_eq!(PeerInfo::decode(&none.encode()), Some(none));
        assert_eq!(PeerInfo::decode(b"short"), None);
    }

    #[test]
    fn layout_parts_do_not_overlap() {
        let cfg = DeviceConfig::default();
        let l = Layout::new(2, &cfg);
        assert!(l.off_tail >= WinHeader::BYTES);
        assert_eq!(l.off_head - l.off_tail, cfg.channels * FLAG_BYTES);
        assert!(l.off_fifo >= l.off_state + cfg.channels * 16);
        assert_eq!(
            l.bytes - l.off_fifo,
            cfg.channels * cfg.slots * cfg.slot_bytes
        );
        assert_eq!(l.off_fifo % PAGE, 0);
    }
}
