//! Who a communicator is and where its ranks run, as plugins are told at
//! `init`: the communicator's hash (NCCL's `commHash`: of the unique id,
//! or for a split of the parent's hash, the split's number and the color)
//! and the number of nodes (distinct host hashes among the ranks).
//!
//! The hashes are FNV-1a, computed the same in every process and build so
//! that ranks agree; none of them is a security boundary.

use crate::algo::cost::LinkModel;
use crate::algo::Algo;
use crate::bootstrap::{Bootstrap, UniqueId};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::exec::host_direct::TERMS_BYTES;

fn fnv1a(parts: &[&[u8]]) -> u64 {
    parts
        .iter()
        .flat_map(|p| p.iter())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
        })
}

/// The hash of a communicator made from a unique id: the same on every
/// rank, and different between ids (each holds a random magic).
pub fn comm_hash(id: &UniqueId) -> u64 {
    fnv1a(&[&id.0])
}

/// The hash of the communicator of `color` made by split number `split_no`
/// of the communicator hashed `parent`.
pub fn split_hash(parent: u64, split_no: u64, color: i32) -> u64 {
    fnv1a(&[
        &parent.to_le_bytes(),
        &split_no.to_le_bytes(),
        &color.to_le_bytes(),
    ])
}

/// This host's identity: `NCCL_HOSTID` when set (NCCL's override, e.g. for
/// containers that share a kernel but stand for different nodes), else the
/// host name and the boot id, which differ between machines and between
/// boots of one.
pub fn host_hash(cfg: &Config) -> u64 {
    if let Some(id) = cfg.hostid.as_deref().filter(|s| !s.is_empty()) {
        return fnv1a(&[id.as_bytes()]);
    }
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let host = read("/proc/sys/kernel/hostname");
    let boot = read("/proc/sys/kernel/random/boot_id");
    fnv1a(&[host.as_bytes(), b"/", boot.as_bytes()])
}

/// Distinct values in `hashes`.
pub fn distinct(hashes: &[u64]) -> usize {
    let mut v = hashes.to_vec();
    v.sort_unstable();
    v.dedup();
    v.len()
}

/// What the ranks of a communicator learn of each other at creation.
#[derive(Debug, Clone)]
pub struct Peers {
    /// Distinct host hashes among the ranks.
    pub nnodes: usize,
    /// Each rank's host hash.
    pub hosts: Vec<u64>,
    /// Ranks that set NCCL_P2P_DISABLE (their GPUs must not map others').
    pub p2p_disabled: Vec<usize>,
    /// Ranks that set NCCL_SHM_DISABLE.
    pub shm_disabled: Vec<usize>,
    /// Each rank's GPU, -1 for a rank on host memory.
    pub devices: Vec<i32>,
    /// Each rank's /dev/shm device ([`shm_dev`]).
    pub shm_devs: Vec<u64>,
    /// The slowest network link any rank's net plugin reported: every
    /// rank's cost model prices the network alike, else ranks on
    /// different hardware would choose different algorithms for one call.
    pub net_link: LinkModel,
    /// Ranks with a tuner plugin loaded.
    pub tuned: Vec<usize>,
    /// Rank 0's NCCL_ALGO ([`algo_code`]).
    pub algo: u8,
    /// Rank 0's [`Shaping`].
    pub shaping: Shaping,
    /// Rank 0's direct-path terms ([`crate::exec::host_direct::Terms::encode`]).
    pub direct: [u8; TERMS_BYTES],
    /// Each rank's RAS id (`<ip:port>/<pid>` of its process's RAS service,
    /// [`crate::ras`]); empty where its RAS is off.
    pub ras: Vec<String>,
}

/// What one rank tells the others.
#[derive(Debug, Clone)]
pub struct Facts {
    pub host: u64,
    pub p2p_disable: bool,
    pub shm_disable: bool,
    pub device: Option<usize>,
    pub shm_dev: u64,
    /// The network between hosts as this rank's net plugin describes its
    /// first device.
    pub net_link: LinkModel,
    /// This rank has a tuner plugin loaded.
    pub tuned: bool,
    /// Its NCCL_ALGO ([`algo_code`]).
    pub algo: u8,
    /// Its values of [`crate::config::SHAPING`], in that order, each with
    /// whether it was set (the device path treats an unset maximum of
    /// channels as its own choice).
    pub shaping: Shaping,
    /// Its direct host path's terms ([`crate::exec::host_direct::Terms`]).
    pub direct: [u8; TERMS_BYTES],
    /// The network its process chose (its name), and how: from a plugin
    /// library, or built in and why no plugin was taken. Every rank must
    /// use the same one ([`agree_on_network`]).
    pub net: String,
    pub net_how: String,
    /// Its process's RAS id ([`Peers::ras`]); empty: RAS off.
    pub ras: String,
}

/// Longest text of a rank's [`Facts::net`] or [`Facts::net_how`] sent.
const NET_TEXT: usize = 1024;

/// Every rank must use the same network: a rank whose net plugin failed
/// to start (no NIC yet, a missing library) while the others' started
/// would otherwise fail at its first connection with a message that does
/// not say why (issue 40, item 10). `nets`: each rank's network name and
/// how it came to it. The error names which ranks use which network, and
/// why.
pub fn agree_on_network(nets: &[(String, String)]) -> Result<()> {
    let Some((first, _)) = nets.first() else {
        return Ok(());
    };
    if nets.iter().all(|(n, _)| n.eq_ignore_ascii_case(first)) {
        return Ok(());
    }
    // Ranks by network, in the order the networks first appear.
    let mut groups: Vec<(&str, &str, Vec<usize>)> = Vec::new();
    for (r, (n, how)) in nets.iter().enumerate() {
        match groups.iter_mut().find(|g| g.0.eq_ignore_ascii_case(n)) {
            Some(g) => g.2.push(r),
            None => groups.push((n, how, vec![r])),
        }
    }
    let said: Vec<String> = groups
        .iter()
        .map(|(n, how, ranks)| {
            let who = match ranks.as_slice() {
                [r] => format!("rank {r} uses"),
                rs => format!("ranks {rs:?} use"),
            };
            format!("{who} {n} ({how})")
        })
        .collect();
    Err(Error::InvalidUsage(format!(
        "ranks use different networks: {}. Every rank must use the same network: give every rank the same NCCL_NET_PLUGIN and NCCL_NET, and see the WARN line of each rank that fell back for why its plugin did not start",
        said.join("; ")
    )))
}

/// Appends `text` (at most [`NET_TEXT`] bytes of it) with its length.
fn put_text(b: &mut Vec<u8>, text: &str) {
    let mut end = text.len().min(NET_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    b.extend_from_slice(&(end as u16).to_le_bytes());
    b.extend_from_slice(&text.as_bytes()[..end]);
}

/// A text [`put_text`] wrote at the start of `b`, and the bytes after it.
fn take_text(b: &[u8]) -> Option<(String, &[u8])> {
    let len = u16::from_le_bytes(b.get(..2)?.try_into().ok()?) as usize;
    let text = b.get(2..2 + len)?;
    Some((String::from_utf8_lossy(text).into_owned(), &b[2 + len..]))
}

/// Values of [`crate::config::SHAPING`] and whether each was set.
pub type Shaping = [(u64, bool); 3];

/// This rank's [`Shaping`].
pub fn shaping(cfg: &Config) -> Shaping {
    let v = [cfg.chunk_size, cfg.min_nchannels, cfg.max_nchannels];
    std::array::from_fn(|i| (v[i], cfg.is_set(crate::config::SHAPING[i])))
}

/// Takes rank 0's `first` settings and NCCL_ALGO (`algo`, its
/// [`algo_code`]) into `cfg` where this rank's differ: each difference,
/// with both values, for the caller's warning. Ranks that forced
/// different algorithms would cut the data differently: on the device
/// path, whose steps carry no header to compare, that gave wrong results
/// and then a failed kernel launch.
pub fn adopt_shaping(cfg: &mut Config, first: Shaping, algo: u8) -> Vec<String> {
    let said = |(v, set): (u64, bool)| {
        if set {
            v.to_string()
        } else {
            format!("unset ({v})")
        }
    };
    let mine = shaping(cfg);
    let mut differ = Vec::new();
    for (i, key) in crate::config::SHAPING.iter().enumerate() {
        if mine[i] != first[i] {
            differ.push(format!(
                "NCCL_{key}: {} here, {} on rank 0",
                said(mine[i]),
                said(first[i])
            ));
            cfg.adopt(key, first[i].0, first[i].1);
        }
    }
    let mine = algo_code(cfg);
    if mine != algo && algo != 255 {
        let said = |c: u8| algo_name(c).unwrap_or_else(|| "unset".into());
        differ.push(format!(
            "NCCL_ALGO: {} here, {} on rank 0",
            if mine == 255 {
                cfg.algo.clone().unwrap_or_else(|| "?".into())
            } else {
                said(mine)
            },
            said(algo)
        ));
        cfg.adopt_algo(algo_name(algo).as_deref());
    }
    differ
}

/// Marks an [`algo_code`] that leaves algorithms out: the low bits are
/// theirs, bit `code - 1` for each.
const EXCLUDING: u8 = 0x40;

/// NCCL_ALGO as one byte: 0 unset (or holding nothing), 255 a value that
/// does not parse (the communicator's creation refuses it), [`EXCLUDING`]
/// with a bit per algorithm it leaves out, else the [`Algo::code`] of the
/// one algorithm it holds the communicator to.
pub fn algo_code(cfg: &Config) -> u8 {
    match cfg.algo.as_deref().map(crate::algo::setting::parse) {
        None => 0,
        Some(Err(_)) => 255,
        Some(Ok(crate::algo::setting::AlgoSetting {
            forced: Some(a), ..
        })) => a.code(),
        Some(Ok(a)) if a.excluded.is_empty() => 0,
        Some(Ok(a)) => a
            .excluded
            .iter()
            .fold(EXCLUDING, |m, x| m | 1 << (x.code() - 1)),
    }
}

/// The NCCL_ALGO value an [`algo_code`] stands for (`^PAT` for PAT left out).
fn algo_name(code: u8) -> Option<String> {
    if code & EXCLUDING != 0 && code != 255 {
        let out: Vec<&str> = Algo::ALL
            .into_iter()
            .filter(|a| code & (1 << (a.code() - 1)) != 0)
            .map(Algo::name)
            .collect();
        return Some(format!("^{}", out.join(",")));
    }
    Algo::from_code(code).map(|a| a.name().to_string())
}

const FACT_BYTES: usize = 67 + TERMS_BYTES;

/// The device of this process's /dev/shm (0 where there is none): containers
/// of one host share shared memory only if it is the same (NCCL's shmDev).
pub fn shm_dev() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/dev/shm").map_or(0, |m| m.dev())
}

impl Facts {
    fn encode(&self) -> Vec<u8> {
        let mut b = self.host.to_le_bytes().to_vec();
        b.push(u8::from(self.p2p_disable));
        b.push(u8::from(self.shm_disable));
        let dev = self
            .device
            .map_or(-1, |d| i32::try_from(d).unwrap_or(i32::MAX));
        b.extend_from_slice(&dev.to_le_bytes());
        b.extend_from_slice(&self.shm_dev.to_le_bytes());
        b.extend_from_slice(&self.net_link.latency_s.to_le_bytes());
        b.extend_from_slice(&self.net_link.bandwidth.to_le_bytes());
        b.push(u8::from(self.tuned));
        b.push(self.algo);
        for (v, set) in self.shaping {
            b.extend_from_slice(&v.to_le_bytes());
            b.push(u8::from(set));
        }
        b.extend_from_slice(&self.direct);
        debug_assert_eq!(b.len(), FACT_BYTES);
        put_text(&mut b, &self.net);
        put_text(&mut b, &self.net_how);
        put_text(&mut b, &self.ras);
        b
    }
}

/// One allgather of each rank's [`Facts`].
pub fn exchange(bootstrap: &Bootstrap, mine: Facts) -> Result<Peers> {
    let all = bootstrap.allgather(&mine.encode())?;
    let mut peers = Peers {
        nnodes: 0,
        hosts: Vec::with_capacity(all.len()),
        p2p_disabled: Vec::new(),
        shm_disabled: Vec::new(),
        devices: Vec::with_capacity(all.len()),
        shm_devs: Vec::with_capacity(all.len()),
        net_link: mine.net_link,
        tuned: Vec::new(),
        algo: mine.algo,
        shaping: mine.shaping,
        direct: mine.direct,
        ras: Vec::with_capacity(all.len()),
    };
    let mut nets = Vec::with_capacity(all.len());
    for (r, b) in all.iter().enumerate() {
        let net = b
            .get(FACT_BYTES..)
            .and_then(take_text)
            .and_then(|(net, rest)| Some((net, take_text(rest)?)))
            .and_then(|(net, (how, rest))| Some((net, how, take_text(rest)?)))
            .filter(|(_, _, (_, rest))| rest.is_empty());
        let Some((net, how, (ras, _))) = net else {
            return Err(Error::Internal(format!(
                "rank {r} sent {} bytes of rank facts, not the {FACT_BYTES} and three texts expected",
                b.len()
            )));
        };
        nets.push((net, how));
        peers.ras.push(ras);
        peers
            .hosts
            .push(u64::from_le_bytes(b[..8].try_into().expect("8 bytes")));
        if b[8] == 1 {
            peers.p2p_disabled.push(r);
        }
        if b[9] == 1 {
            peers.shm_disabled.push(r);
        }
        peers
            .devices
            .push(i32::from_le_bytes(b[10..14].try_into().expect("4 bytes")));
        peers
            .shm_devs
            .push(u64::from_le_bytes(b[14..22].try_into().expect("8 bytes")));
        let f = |at: usize| f64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        peers.net_link = peers.net_link.worse(LinkModel {
            latency_s: f(22),
            bandwidth: f(30),
        });
        if b[38] == 1 {
            peers.tuned.push(r);
        }
        if r == 0 {
            peers.algo = b[39];
            peers.shaping = std::array::from_fn(|i| {
                let at = 40 + 9 * i;
                let v = u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
                (v, b[at + 8] == 1)
            });
            peers.direct.copy_from_slice(&b[67..FACT_BYTES]);
        }
    }
    agree_on_network(&nets)?;
    peers.nnodes = distinct(&peers.hosts);
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_hashes_differ_by_parent_split_and_color() {
        let base = split_hash(1, 0, 0);
        assert_eq!(base, split_hash(1, 0, 0));
        assert_ne!(base, split_hash(2, 0, 0));
        assert_ne!(base, split_hash(1, 1, 0));
        assert_ne!(base, split_hash(1, 0, 1));
    }

    #[test]
    fn rank_0s_shaping_is_taken_and_what_differed_is_said() {
        let mut cfg = Config::load_with(&[("CHUNK_SIZE", "128K"), ("MAX_NCHANNELS", "2")]).unwrap();
        let first = [
            (1 << 20, false),
            (cfg.min_nchannels, cfg.is_set("MIN_NCHANNELS")),
            (2, false),
        ];
        let algo = algo_code(&cfg);
        let said = adopt_shaping(&mut cfg, first, algo);
        assert_eq!(
            said,
            [
                "NCCL_CHUNK_SIZE: 131072 here, unset (1048576) on rank 0",
                "NCCL_MAX_NCHANNELS: 2 here, unset (2) on rank 0"
            ]
        );
        assert_eq!(shaping(&cfg), first);
        assert!(adopt_shaping(&mut cfg, first, 0).is_empty());
        let said = adopt_shaping(&mut cfg, first, 1);
        assert_eq!(said, ["NCCL_ALGO: unset here, Ring on rank 0"]);
        assert_eq!(cfg.algo.as_deref(), Some("Ring"));
        assert_eq!(algo_code(&cfg), 1);
        let said = adopt_shaping(&mut cfg, first, 0);
        assert_eq!(said, ["NCCL_ALGO: Ring here, unset on rank 0"]);
        assert_eq!(cfg.algo, None);
        // Rank 0 leaves PAT out: so does every rank.
        let no_pat = Config::load_with(&[("ALGO", "^PAT")]).unwrap();
        let code = algo_code(&no_pat);
        assert_ne!(code, 0);
        let said = adopt_shaping(&mut cfg, first, code);
        assert_eq!(said, ["NCCL_ALGO: unset here, ^PAT on rank 0"]);
        assert_eq!(algo_code(&cfg), code);
    }

    #[test]
    fn ranks_on_different_networks_are_named_with_why() {
        let n = |name: &str, how: &str| (name.to_string(), how.to_string());
        assert!(agree_on_network(&[n("Socket", "built in"), n("socket", "built in")]).is_ok());
        let e = agree_on_network(&[
            n("AWS Libfabric", "the plugin libnccl-net-ofi.so"),
            n(
                "Socket",
                "built in, as net plugin libnccl-net-ofi.so: init failed: no NIC",
            ),
            n("AWS Libfabric", "the plugin libnccl-net-ofi.so"),
        ])
        .unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(_)));
        assert_eq!(
            e.message(),
            "ranks use different networks: ranks [0, 2] use AWS Libfabric (the plugin libnccl-net-ofi.so); rank 1 uses Socket (built in, as net plugin libnccl-net-ofi.so: init failed: no NIC). Every rank must use the same network: give every rank the same NCCL_NET_PLUGIN and NCCL_NET, and see the WARN line of each rank that fell back for why its plugin did not start"
        );
        let mut b = Vec::new();
        put_text(&mut b, "Socket");
        put_text(&mut b, &"é".repeat(NET_TEXT));
        let (a, rest) = take_text(&b).unwrap();
        let (h, rest) = take_text(rest).unwrap();
        assert_eq!((a.as_str(), h.len(), rest.len()), ("Socket", NET_TEXT, 0));
        assert!(take_text(&b[..3]).is_none());
    }

    #[test]
    fn hostid_overrides_the_host_name() {
        let a = Config::load_with(&[("HOSTID", "node-a")]).unwrap();
        let b = Config::load_with(&[("HOSTID", "node-b")]).unwrap();
        let plain = Config::load_with(&[]).unwrap();
        assert_ne!(host_hash(&a), host_hash(&b));
        assert_eq!(host_hash(&a), host_hash(&a));
        assert_eq!(host_hash(&plain), host_hash(&plain));
        assert_eq!(distinct(&[3, 1, 3, 2, 1]), 3);
    }
}
