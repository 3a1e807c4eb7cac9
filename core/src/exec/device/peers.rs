//! What ranks tell each other when the device window is set up, one
//! record each ([`PeerInfo`]), and what the records say of the ranks'
//! GPUs and processes: which ranks share a GPU, how many blocks each may
//! launch so that theirs all fit at once, and where ranks of several
//! processes share GPUs. `super::window` exchanges the records and
//! assembles the transports from them.

use crate::cuda::IpcMemHandle;

/// What a rank tells its peers at setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PeerInfo {
    pub pid: u32,
    pub node: u64,
    pub device: u32,
    pub maxch: u32,
    pub nslots: u32,
    pub slot_bytes: u64,
    pub window: u64,
    pub ipc: Option<IpcMemHandle>,
    /// The host area's name in /dev/shm, for SHM peers; empty without one.
    pub area: String,
    /// This GPU, whatever CUDA_VISIBLE_DEVICES numbers it: a hash of its
    /// PCI address (ranks with the same `node` and `gpu` share a GPU).
    pub gpu: u64,
    /// Blocks of the kernel that are resident on this GPU at once.
    pub resident: u32,
    /// The FIFO slots of the P2P peers (0 without any), apart from the
    /// window so that a suspend can release them and keep the window.
    pub fifo: u64,
    pub fifo_ipc: Option<IpcMemHandle>,
    /// Its LL FIFO's slot bytes (part of the layout, which must match) and
    /// the largest operation it would run through LL (NCCL_PROTO: rank 0's
    /// is taken).
    pub ll_slot_bytes: u64,
    pub ll_max_bytes: u64,
}

const MAGIC: u64 = 0x6f78_6363_6c57_6e34; // "oxcclWn4"
const NAME_BYTES: usize = 64;
const INFO_BYTES: usize =
    8 + 4 + 8 + 4 + 4 + 4 + 8 + 8 + 1 + 64 + NAME_BYTES + 8 + 4 + 8 + 1 + 64 + 8 + 8;

impl PeerInfo {
    pub fn encode(&self) -> Vec<u8> {
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
        let mut name = [0u8; NAME_BYTES];
        name[..self.area.len()].copy_from_slice(self.area.as_bytes());
        b.extend_from_slice(&name);
        b.extend_from_slice(&self.gpu.to_le_bytes());
        b.extend_from_slice(&self.resident.to_le_bytes());
        b.extend_from_slice(&self.fifo.to_le_bytes());
        b.push(self.fifo_ipc.is_some() as u8);
        b.extend_from_slice(&self.fifo_ipc.map_or([0; 64], |h| h.0));
        b.extend_from_slice(&self.ll_slot_bytes.to_le_bytes());
        b.extend_from_slice(&self.ll_max_bytes.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<PeerInfo> {
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
            area: {
                let name = &b[113..113 + NAME_BYTES];
                let end = name.iter().position(|c| *c == 0).unwrap_or(NAME_BYTES);
                String::from_utf8(name[..end].to_vec()).ok()?
            },
            gpu: u64_at(113 + NAME_BYTES),
            resident: u32_at(121 + NAME_BYTES),
            fifo: u64_at(125 + NAME_BYTES),
            fifo_ipc: (b[133 + NAME_BYTES] != 0)
                .then(|| IpcMemHandle(b[134 + NAME_BYTES..198 + NAME_BYTES].try_into().unwrap())),
            ll_slot_bytes: u64_at(198 + NAME_BYTES),
            ll_max_bytes: u64_at(206 + NAME_BYTES),
        })
    }
}

pub(super) fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &c| {
        (h ^ u64::from(c)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The channels a launch may use, the same on every rank: ranks sharing a
/// GPU run kernels whose blocks wait for each other's, so all of them must
/// be resident at once (in one process, or several under MPS; without MPS
/// the GPU runs one process at a time and each kernel waits for its turn).
/// Also the ranks on this rank's GPU, and in how many processes.
pub(super) fn shared_gpus(
    infos: &[PeerInfo],
    rank: usize,
    channels: usize,
) -> (usize, Vec<usize>, usize) {
    let gpus = &gpu_of(infos);
    let on = |g: usize| (0..infos.len()).filter(move |&r| gpus[r] == g);
    let cap = infos
        .iter()
        .zip(gpus)
        .map(|(i, &g)| i.resident as usize / on(g).count())
        .min()
        .unwrap_or(channels)
        .clamp(1, channels);
    let mine: Vec<usize> = on(gpus[rank]).collect();
    let procs = processes(mine.iter().map(|&r| infos[r].pid));
    (cap, mine, procs)
}

/// Each rank's GPU as an index, GPUs numbered in the order of their first
/// ranks (the same GPU id on another node is another GPU).
pub(super) fn gpu_of(infos: &[PeerInfo]) -> Vec<usize> {
    let mut seen: Vec<(u64, u64)> = Vec::new();
    infos
        .iter()
        .map(|i| {
            let k = (i.node, i.gpu);
            seen.iter().position(|&g| g == k).unwrap_or_else(|| {
                seen.push(k);
                seen.len() - 1
            })
        })
        .collect()
}

/// How many processes the pids name.
pub(super) fn processes(pids: impl Iterator<Item = u32>) -> usize {
    let mut p: Vec<u32> = pids.collect();
    p.sort_unstable();
    p.dedup();
    p.len()
}

/// Each rank's GPU as an index (in order of first appearance), where the
/// ranks use more than one GPU and the ranks on one of them are in more
/// than one process: there every operation on that GPU waits for the GPU
/// to switch between the processes (without MPS), which the communicator
/// avoids by running all-reduce in steps on the ranks of each GPU and on
/// one rank per GPU (`crate::comm` `hier`). `None` for any other layout,
/// and where a process holds several ranks: the communicators that path
/// splits off are made at its first all-reduce, a blocking call on every
/// rank, which one thread driving several ranks would never get past.
pub(super) fn mixed_groups(infos: &[PeerInfo]) -> Option<Vec<usize>> {
    if processes(infos.iter().map(|i| i.pid)) < infos.len() {
        return None;
    }
    let gpus = gpu_of(infos);
    let ngpus = gpus.iter().max().map_or(0, |g| g + 1);
    // One rank per process: a GPU with two ranks has them in two processes.
    let shared = (0..ngpus).any(|g| gpus.iter().filter(|&&x| x == g).count() > 1);
    (ngpus > 1 && shared).then_some(gpus)
}

/// This boot of this machine: ranks with the same id share a node.
pub(super) fn node_id() -> u64 {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .unwrap_or_default();
    oxccl_kernels::fnv1a64(id.trim().as_bytes())
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
            area: "/oxccl-dev-1-2-ab".into(),
            gpu: 0x1b00_feed,
            resident: 264,
            fifo: 0x7f01_0000_0000,
            fifo_ipc: Some(IpcMemHandle([5; 64])),
            ll_slot_bytes: 8192,
            ll_max_bytes: u64::MAX,
        };
        assert_eq!(PeerInfo::decode(&i.encode()), Some(i.clone()));
        let none = PeerInfo {
            ipc: None,
            area: String::new(),
            fifo: 0,
            fifo_ipc: None,
            ..i
        };
        assert_eq!(PeerInfo::decode(&none.encode()), Some(none));
        assert_eq!(PeerInfo::decode(b"short"), None);
    }

    #[test]
    fn ranks_sharing_a_gpu_cap_every_ranks_channels_alike() {
        let info = |pid: u32, gpu: u64| PeerInfo {
            pid,
            node: 1,
            device: 0,
            maxch: 128,
            nslots: 8,
            slot_bytes: 1 << 18,
            window: 0,
            ipc: None,
            area: String::new(),
            gpu,
            resident: 264,
            fifo: 0,
            fifo_ipc: None,
            ll_slot_bytes: 0,
            ll_max_bytes: 0,
        };
        // Four ranks on one GPU: 264 resident blocks, 66 each.
        let one: Vec<_> = (0..4).map(|p| info(p, 7)).collect();
        assert!((0..4).all(|r| shared_gpus(&one, r, 128) == (66, vec![0, 1, 2, 3], 4)));
        // Two share GPU 7, one is alone: all launch 128 (132 would fit).
        let mixed = [info(1, 7), info(2, 7), info(3, 8)];
        assert!((0..3).all(|r| shared_gpus(&mixed, r, 128).0 == 128));
        assert_eq!(shared_gpus(&mixed, 1, 128), (128, vec![0, 1], 2));
        assert_eq!(shared_gpus(&mixed, 2, 128), (128, vec![2], 1));
        // The same GPU id on another node is another GPU.
        let mut apart = one.clone();
        for (k, i) in apart.iter_mut().enumerate() {
            i.node = k as u64;
        }
        assert_eq!(shared_gpus(&apart, 0, 128), (128, vec![0], 1));
        // Mixed: several GPUs, and ranks of several processes on one.
        assert_eq!(mixed_groups(&mixed), Some(vec![0, 0, 1]));
        let round = [info(1, 7), info(2, 8), info(3, 7), info(4, 8)];
        assert_eq!(mixed_groups(&round), Some(vec![0, 1, 0, 1]));
        // One GPU (the shared path's), one rank per GPU, or threads of one
        // process on each GPU (their kernels run together): not mixed.
        assert_eq!(mixed_groups(&one), None);
        assert_eq!(mixed_groups(&apart), None);
        let threads = [info(1, 7), info(1, 7), info(2, 8), info(2, 8)];
        assert_eq!(mixed_groups(&threads), None);
        // A process with a rank on each GPU: one thread would split for two.
        let across = [info(1, 7), info(1, 8), info(2, 7), info(2, 8)];
        assert_eq!(mixed_groups(&across), None);
    }
}
