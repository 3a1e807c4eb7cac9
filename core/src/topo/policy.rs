//! The decisions NCCL's topology settings change, as pure functions of
//! what the node holds: whether two GPUs map each other's memory
//! (NCCL_P2P_LEVEL), whether the network reads GPU memory on sends
//! (NCCL_NET_GDR_READ), which NICs a GPU's channels use
//! (NCCL_NETDEVS_POLICY) and whether the two ends of a connection may sit
//! on different rails (NCCL_CROSS_NIC). The callers read the settings and
//! the node ([`super::system::Node`]) and log each decision.

use std::fmt;

use super::pci::PciPath;

/// NCCL's path types between two devices, near to far, as the P2P and
/// GDR levels name them. NCCL's NVB and C2C (through another GPU, chip to
/// chip) count as NVL here; P2C and PXN as PXB: oxccl's paths have
/// neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathLevel {
    /// The same GPU.
    Loc,
    /// NVLink.
    Nvl,
    Pix,
    Pxb,
    Phb,
    Sys,
}

impl PathLevel {
    /// A level as NCCL's settings spell it: a path name or NCCL's older
    /// integers (0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 and above SYS).
    pub fn parse(s: &str) -> Result<PathLevel, String> {
        let t = s.trim();
        Ok(match t.to_ascii_uppercase().as_str() {
            "LOC" => PathLevel::Loc,
            "NVL" | "NVB" | "C2C" => PathLevel::Nvl,
            "PIX" => PathLevel::Pix,
            "PXB" | "P2C" | "PXN" => PathLevel::Pxb,
            "PHB" => PathLevel::Phb,
            "SYS" => PathLevel::Sys,
            n => match n.parse::<u32>() {
                Ok(0) => PathLevel::Loc,
                Ok(1) => PathLevel::Pix,
                Ok(2) => PathLevel::Pxb,
                Ok(3) => PathLevel::Phb,
                Ok(_) => PathLevel::Sys,
                Err(_) => return Err(format!("{t:?} is no path type")),
            },
        })
    }

    pub fn of(p: PciPath) -> PathLevel {
        match p {
            PciPath::Pix => PathLevel::Pix,
            PciPath::Pxb => PathLevel::Pxb,
            PciPath::Phb | PciPath::Node => PathLevel::Phb,
            PciPath::Sys => PathLevel::Sys,
        }
    }
}

impl fmt::Display for PathLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathLevel::Loc => "LOC",
            PathLevel::Nvl => "NVL",
            PathLevel::Pix => "PIX",
            PathLevel::Pxb => "PXB",
            PathLevel::Phb => "PHB",
            PathLevel::Sys => "SYS",
        })
    }
}

/// NCCL_P2P_LEVEL's default where unset: PXB (never through the CPU),
/// SYS on AMD x86 nodes of at most two GPUs (NCCL's `ncclTopoCheckP2p`).
pub fn default_p2p_level(arch: Option<&str>, vendor: Option<&str>, gpus: usize) -> PathLevel {
    let x86 = arch.is_none_or(|a| a == "x86_64");
    if x86 && vendor == Some("AuthenticAMD") && gpus <= 2 {
        PathLevel::Sys
    } else {
        PathLevel::Pxb
    }
}

/// Whether two GPUs of one host map each other's memory, and why (for
/// the INFO line). `path`: their path type, None where the node does not
/// tell (a GPU missing from it, or no NVLink information and PCIe that
/// alone would say no); `level`: NCCL_P2P_LEVEL where set; `default`:
/// [`default_p2p_level`]. An unknown path keeps P2P unless a level was
/// set, as before the setting existed: the driver still refuses a mapping
/// it cannot make.
pub fn p2p_allowed(
    path: Option<PathLevel>,
    level: Option<PathLevel>,
    default: PathLevel,
) -> (bool, String) {
    match (path, level) {
        (Some(p), Some(l)) => (p <= l, format!("path {p}, NCCL_P2P_LEVEL {l}")),
        (Some(p), None) => (p <= default, format!("path {p}, default level {default}")),
        (None, Some(l)) => (
            l >= PathLevel::Sys,
            format!("path unknown (taken as SYS), NCCL_P2P_LEVEL {l}"),
        ),
        (None, None) => (true, "path unknown, no NCCL_P2P_LEVEL".into()),
    }
}

/// Whether the network reads GPU memory on sends (GPUDirect read), given
/// that GPUDirect is on for receives: NCCL_NET_GDR_READ where set; unset,
/// on from compute capability 8.0, and below it only where the GPU has an
/// NVLink to another GPU or is the node's only one (NCCL's
/// `ncclTopoCheckGdr`, which keeps PCIe free for peers otherwise).
pub fn gdr_read(setting: Option<bool>, cc: (i32, i32), nvlink_peer: bool, one_gpu: bool) -> bool {
    match setting {
        Some(v) => v,
        None => cc.0 >= 8 || nvlink_peer || one_gpu,
    }
}

/// NCCL_NETDEVS_POLICY: how many of its nearest NICs a GPU's channels
/// use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetDevsPolicy {
    /// The nearest NICs shared out among the GPUs nearest to them.
    Auto,
    /// At most N of the nearest.
    Max(usize),
    /// Every nearest NIC, whatever other GPUs use.
    All,
}

impl NetDevsPolicy {
    pub fn parse(s: &str) -> Result<NetDevsPolicy, String> {
        let t = s.trim();
        let u = t.to_ascii_uppercase();
        match u.as_str() {
            "" | "AUTO" => Ok(NetDevsPolicy::Auto),
            "ALL" => Ok(NetDevsPolicy::All),
            _ => match u.strip_prefix("MAX:").map(|n| n.trim().parse::<usize>()) {
                Some(Ok(n)) if n > 0 => Ok(NetDevsPolicy::Max(n)),
                Some(_) => Err(format!("{t:?}: MAX takes a whole number from 1")),
                None => Err(format!("{t:?} is no policy")),
            },
        }
    }
}

impl fmt::Display for NetDevsPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetDevsPolicy::Auto => f.write_str("AUTO"),
            NetDevsPolicy::Max(n) => write!(f, "MAX:{n}"),
            NetDevsPolicy::All => f.write_str("ALL"),
        }
    }
}

/// One network device as the choice sees it: the plugin's index, its path
/// type from the GPU and its speed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetCandidate {
    pub dev: usize,
    pub path: PathLevel,
    pub speed_mbps: u64,
}

/// The nearest of `cands` (NCCL's `ncclTopoGetLocal`, with the path type
/// first and the speed breaking ties): their plugin indices, in index
/// order.
pub fn local_nets(cands: &[NetCandidate]) -> Vec<usize> {
    let Some(best) = cands
        .iter()
        .map(|c| (c.path, std::cmp::Reverse(c.speed_mbps)))
        .min()
    else {
        return Vec::new();
    };
    let mut v: Vec<usize> = cands
        .iter()
        .filter(|c| (c.path, std::cmp::Reverse(c.speed_mbps)) == best)
        .map(|c| c.dev)
        .collect();
    v.sort_unstable();
    v
}

/// The NICs a GPU's channels take in turn (NCCL's
/// `ncclTopoGetLocalNetType`): `local`, its nearest NICs; `gpus_sharing`,
/// how many GPUs have the first of them among their nearest; `position`,
/// this GPU's place among those (bus order). Channel `c` takes entry
/// `c % len` of the result.
pub fn gpu_nets(
    local: &[usize],
    gpus_sharing: usize,
    position: usize,
    policy: NetDevsPolicy,
) -> Vec<usize> {
    let n = local.len();
    if n == 0 {
        return Vec::new();
    }
    let gpus = gpus_sharing.max(1);
    let per_gpu = match policy {
        NetDevsPolicy::Auto => n.div_ceil(gpus),
        NetDevsPolicy::All => n,
        NetDevsPolicy::Max(m) => m.min(n),
    };
    let mut start = position % gpus;
    if n.is_power_of_two() {
        start = mirror_bits(start, n);
    }
    (0..per_gpu).map(|c| local[(start + c) % n]).collect()
}

/// `v`'s bits reversed within log2(`pow2`) bits: spreads GPUs 0, 1, 2, 3
/// over NICs 0, 2, 1, 3.
fn mirror_bits(v: usize, pow2: usize) -> usize {
    let bits = pow2.trailing_zeros();
    (0..bits).fold(0, |m, b| m | (((v >> b) & 1) << (bits - 1 - b)))
}

/// NCCL_CROSS_NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrossNic {
    /// 0: both ends of a connection on one rail (the same NIC index).
    Never,
    /// 1: each end on its own GPU's NIC.
    Allow,
    /// 2: one rail where the receiver has the sender's NIC among its
    /// nearest, else each its own.
    Prefer,
}

impl CrossNic {
    pub fn from_setting(v: u64) -> Result<CrossNic, String> {
        match v {
            0 => Ok(CrossNic::Never),
            1 => Ok(CrossNic::Allow),
            2 => Ok(CrossNic::Prefer),
            _ => Err(format!("{v}: 0, 1 or 2")),
        }
    }
}

/// The device a receiving rank listens on for a channel whose sender
/// sends from `sender_dev`: `own`, what its GPU's own choice for the
/// channel is; `local`, its GPU's nearest NICs; `ndev`, the network's
/// devices.
pub fn receive_dev(
    cross: CrossNic,
    sender_dev: Option<usize>,
    own: usize,
    local: &[usize],
    ndev: usize,
) -> usize {
    match (cross, sender_dev) {
        (CrossNic::Never, Some(s)) if s < ndev => s,
        (CrossNic::Prefer, Some(s)) if local.contains(&s) => s,
        _ => own,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_as_nccl_spells_them() {
        assert_eq!(PathLevel::parse("nvl"), Ok(PathLevel::Nvl));
        assert_eq!(PathLevel::parse(" PXB "), Ok(PathLevel::Pxb));
        assert_eq!(PathLevel::parse("0"), Ok(PathLevel::Loc));
        assert_eq!(PathLevel::parse("1"), Ok(PathLevel::Pix));
        assert_eq!(PathLevel::parse("3"), Ok(PathLevel::Phb));
        assert_eq!(PathLevel::parse("4"), Ok(PathLevel::Sys));
        assert_eq!(PathLevel::parse("7"), Ok(PathLevel::Sys));
        assert!(PathLevel::parse("NET").is_err());
        assert!(PathLevel::parse("near").is_err());
        assert!(PathLevel::Loc < PathLevel::Nvl && PathLevel::Nvl < PathLevel::Pix);
    }

    #[test]
    fn p2p_follows_the_level() {
        let pxb = PathLevel::Pxb;
        // NVLink passes every level but LOC.
        assert!(p2p_allowed(Some(PathLevel::Nvl), None, pxb).0);
        assert!(p2p_allowed(Some(PathLevel::Nvl), Some(PathLevel::Nvl), pxb).0);
        assert!(!p2p_allowed(Some(PathLevel::Nvl), Some(PathLevel::Loc), pxb).0);
        // PCIe through the CPU: off by default, on with PHB or SYS.
        assert!(!p2p_allowed(Some(PathLevel::Phb), None, pxb).0);
        assert!(p2p_allowed(Some(PathLevel::Phb), Some(PathLevel::Phb), pxb).0);
        assert!(!p2p_allowed(Some(PathLevel::Sys), Some(PathLevel::Phb), pxb).0);
        assert!(p2p_allowed(Some(PathLevel::Sys), None, PathLevel::Sys).0);
        // NVL alone: PCIe neighbours go through host memory.
        let (ok, why) = p2p_allowed(Some(PathLevel::Pix), Some(PathLevel::Nvl), pxb);
        assert!(!ok && why.contains("PIX") && why.contains("NVL"), "{why}");
        // Unknown paths: as before unless a level asks.
        assert!(p2p_allowed(None, None, pxb).0);
        assert!(!p2p_allowed(None, Some(PathLevel::Phb), pxb).0);
        assert!(p2p_allowed(None, Some(PathLevel::Sys), pxb).0);
        // A rank's two GPUs of one: LOC passes even LOC.
        assert!(p2p_allowed(Some(PathLevel::Loc), Some(PathLevel::Loc), pxb).0);
    }

    #[test]
    fn default_level_as_nccl() {
        let amd = Some("AuthenticAMD");
        assert_eq!(default_p2p_level(Some("x86_64"), amd, 2), PathLevel::Sys);
        assert_eq!(default_p2p_level(Some("x86_64"), amd, 8), PathLevel::Pxb);
        assert_eq!(
            default_p2p_level(Some("x86_64"), Some("GenuineIntel"), 2),
            PathLevel::Pxb
        );
        assert_eq!(default_p2p_level(Some("arm64"), amd, 2), PathLevel::Pxb);
    }

    #[test]
    fn gdr_read_as_nccl() {
        assert!(!gdr_read(Some(false), (9, 0), true, false));
        assert!(gdr_read(Some(true), (7, 0), false, false));
        assert!(gdr_read(None, (8, 0), false, false));
        assert!(gdr_read(None, (9, 0), false, false));
        assert!(!gdr_read(None, (7, 0), false, false));
        assert!(gdr_read(None, (7, 0), true, false));
        assert!(gdr_read(None, (7, 5), false, true));
    }

    #[test]
    fn policies_parse() {
        assert_eq!(NetDevsPolicy::parse("auto"), Ok(NetDevsPolicy::Auto));
        assert_eq!(NetDevsPolicy::parse("ALL"), Ok(NetDevsPolicy::All));
        assert_eq!(NetDevsPolicy::parse("max:2"), Ok(NetDevsPolicy::Max(2)));
        assert!(NetDevsPolicy::parse("MAX:0").is_err());
        assert!(NetDevsPolicy::parse("MAX:x").is_err());
        assert!(NetDevsPolicy::parse("some").is_err());
        assert_eq!(NetDevsPolicy::Max(3).to_string(), "MAX:3");
        assert!(CrossNic::from_setting(3).is_err());
    }

    #[test]
    fn nearest_nets_and_sharing() {
        let c = |dev, path, speed_mbps| NetCandidate {
            dev,
            path,
            speed_mbps,
        };
        let cands = [
            c(0, PathLevel::Pix, 400_000),
            c(1, PathLevel::Sys, 400_000),
            c(2, PathLevel::Pix, 400_000),
            c(3, PathLevel::Pix, 100_000),
        ];
        assert_eq!(local_nets(&cands), vec![0, 2]);
        assert!(local_nets(&[]).is_empty());
        // Two GPUs share NICs 0 and 2: one each under AUTO, both under ALL.
        assert_eq!(gpu_nets(&[0, 2], 2, 0, NetDevsPolicy::Auto), vec![0]);
        assert_eq!(gpu_nets(&[0, 2], 2, 1, NetDevsPolicy::Auto), vec![2]);
        assert_eq!(gpu_nets(&[0, 2], 2, 1, NetDevsPolicy::All), vec![2, 0]);
        assert_eq!(gpu_nets(&[0, 2], 2, 0, NetDevsPolicy::Max(1)), vec![0]);
        // Four GPUs over four NICs: spread by mirrored bits.
        let four = [0, 1, 2, 3];
        let firsts: Vec<usize> = (0..4)
            .map(|g| gpu_nets(&four, 4, g, NetDevsPolicy::Auto)[0])
            .collect();
        assert_eq!(firsts, vec![0, 2, 1, 3]);
        // One GPU with four NICs: all four under AUTO, two under MAX:2.
        assert_eq!(gpu_nets(&four, 1, 0, NetDevsPolicy::Auto), vec![0, 1, 2, 3]);
        assert_eq!(gpu_nets(&four, 1, 0, NetDevsPolicy::Max(2)), vec![0, 1]);
        assert!(gpu_nets(&[], 1, 0, NetDevsPolicy::All).is_empty());
    }

    #[test]
    fn rails_follow_cross_nic() {
        // The sender sends from NIC 5; this GPU's own is NIC 0, nearest 0, 1.
        let r = |x, s| receive_dev(x, s, 0, &[0, 1], 8);
        assert_eq!(r(CrossNic::Never, Some(5)), 5);
        assert_eq!(r(CrossNic::Allow, Some(5)), 0);
        assert_eq!(r(CrossNic::Prefer, Some(5)), 0);
        assert_eq!(r(CrossNic::Prefer, Some(1)), 1);
        // A sender's NIC this node lacks, or none known: its own.
        assert_eq!(r(CrossNic::Never, Some(9)), 0);
        assert_eq!(r(CrossNic::Never, None), 0);
    }
}
