//! `oxccl info --tune`: what oxccl's cost model chooses on a described
//! cluster (nodes x GPUs, NVLink and network speeds), per collective and
//! size, beside what NCCL's tuning model chooses for the same cluster.
//!
//! NCCL's side is our own re-implementation of the model of NCCL 2.31.0
//! (github.com/NVIDIA/nccl, branch `dev`, 86fa684, 2026-06-13):
//! src/tuning/cost_model.cc (the constants: base and hardware latencies,
//! LL/LL128/tree bandwidth caps, the tree correction factors),
//! src/tuning/ring.cc, tree.cc and pat.cc (latency and bandwidth per
//! algorithm and protocol), src/tuning/tuning_general.cc (the time
//! `lat + bytes / bw`, the channel and thread reduction of
//! `ncclTuningGetChannels`) and src/tuning/tuning.cc (cheapest wins). What
//! it leaves out, and assumes, is listed by [`NCCL_ASSUMPTIONS`].

use oxccl::algo::cost::{self, Fabric, LinkModel};
use oxccl::algo::{Algo, Coll};

/// A described cluster.
#[derive(Debug, Clone, Copy)]
pub struct Cluster {
    pub nodes: usize,
    pub gpus_per_node: usize,
    /// NVLink GB/s (gigabytes) per GPU, one way.
    pub nvlink_gbps: f64,
    /// Network GB/s (gigabytes) per NIC, one way.
    pub net_gbps: f64,
    /// NICs per node.
    pub nics_per_node: usize,
    /// Latency the net plugin reports, microseconds (NCCL's IB plugin: 0).
    pub net_latency_us: f64,
    /// Compute capability's major number (9 Hopper, 10 Blackwell, 8 Ampere).
    pub sm: i32,
}

impl Cluster {
    pub fn nranks(&self) -> usize {
        self.nodes * self.gpus_per_node
    }
}

pub const NCCL_ASSUMPTIONS: &str = "\
NCCL's model: our re-implementation of NCCL 2.31.0's src/tuning/{cost_model,ring,tree,pat,tuning_general,tuning}.cc.
  Assumed where NCCL measures: x86 Intel CPUs; the ring and tree graphs of its topology search are
  taken as NICs-per-node channels (1 node: one per 20 GB/s of NVLink) at min(NIC, NVLink/channels) GB/s
  each, doubled for the communicator (connect.cc); balanced trees; LL128 allowed (NVLink, PXB NICs);
  no NVLS, CollNet or symmetric kernels (no NVSwitch multicast, no SHARP, no registered windows);
  one operation per launch; no tuner plugin, no NCCL_ALGO/NCCL_PROTO.";

// Indices of NCCL's tables.
const TREE: usize = 0;
const RING: usize = 1;
const PAT: usize = 6;
const LL: usize = 0;
const LL128: usize = 1;
const SIMPLE: usize = 2;
const HW_NVLINK: usize = 0;
const HW_PCI: usize = 1;
const HW_NET: usize = 2;
const ALGO_NAMES: [&str; 7] = [
    "Tree",
    "Ring",
    "CollnetDirect",
    "CollnetChain",
    "NVLS",
    "NVLSTree",
    "PAT",
];
const PROTO_NAMES: [&str; 3] = ["LL", "LL128", "Simple"];

/// NCCL's `baseLatencies` (us) for the rows we model: [algo][proto].
fn base_latency(algo: usize, proto: usize) -> f64 {
    match algo {
        TREE => [6.8, 14.0, 8.4][proto],
        RING => [6.6, 14.0, 8.4][proto],
        PAT => [8.0, 8.0, 8.0][proto],
        _ => 0.0,
    }
}

/// NCCL's `hwLatencies` (us): [hw][algo][proto].
fn hw_latency(hw: usize, algo: usize, proto: usize) -> f64 {
    let row: [[f64; 3]; 3] = match hw {
        HW_NVLINK => [[0.6, 1.25, 4.0], [0.6, 1.9, 3.4], [0.0, 0.0, 4.0]],
        HW_PCI => [[1.0, 1.9, 4.0], [1.0, 2.5, 5.7], [0.0, 0.0, 4.0]],
        _ => [[5.0, 8.5, 14.0], [2.7, 4.0, 14.0], [0.0, 0.0, 14.0]],
    };
    match algo {
        TREE => row[0][proto],
        RING => row[1][proto],
        PAT => row[2][proto],
        _ => 0.0,
    }
}

/// Compute-capability index of NCCL's tables (Volta, Ampere, Hopper, Blackwell).
fn cc_index(sm: i32) -> usize {
    match sm {
        s if s >= 10 => 3,
        9 => 2,
        8 => 1,
        _ => 0,
    }
}

const LL_MAX_BWS: [[f64; 3]; 4] = [
    [39.0, 39.0, 20.4],
    [87.7, 22.5, 19.0],
    [141.0, 45.0, 35.0],
    [282.0, 90.0, 70.0],
];
const PER_CH_MAX_RING_LL128: [[f64; 3]; 4] = [
    [20.0, 20.0, 20.0],
    [20.0, 20.0, 20.0],
    [36.7, 36.7, 36.7],
    [40.0, 40.0, 40.0],
];
const PER_CH_MAX_TREE_LL128: [[f64; 3]; 4] = [
    [20.0, 20.0, 20.0],
    [20.0, 20.0, 20.0],
    [36.7, 36.7, 29.0],
    [55.6, 31.67, 20.0],
];
const PER_CH_MAX_TREE: [[f64; 3]; 4] = [
    [26.5, 18.5, 10.0],
    [24.0, 23.6, 17.8],
    [38.7, 41.4, 36.0],
    [70.0, 42.8, 24.0],
];
const TREE_CORRECTION: [[f64; 24]; 3] = [
    [
        1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8,
        0.9, 1.0, 1.0, 1.0, 1.0, 1.0,
    ],
    [
        1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9,
        0.9, 0.9, 0.9, 1.0, 1.0, 1.0,
    ],
    [
        0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8,
        0.7, 0.7, 0.8, 0.9, 0.9, 0.9,
    ],
];

fn log2i(n: u64) -> i64 {
    if n == 0 {
        -1
    } else {
        63 - i64::from(n.leading_zeros())
    }
}

/// NCCL's function index: Broadcast, Reduce, AllGather, ReduceScatter, AllReduce.
fn func(coll: Coll) -> usize {
    match coll {
        Coll::Broadcast { .. } => 0,
        Coll::Reduce { .. } => 1,
        Coll::AllGather => 2,
        Coll::ReduceScatter => 3,
        Coll::AllReduce => 4,
    }
}

/// What NCCL's model chooses: algorithm, protocol, channels, predicted us.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NcclChoice {
    pub algo: usize,
    pub proto: usize,
    pub channels: usize,
    pub time_us: f64,
}

impl NcclChoice {
    pub fn algo_name(&self) -> &'static str {
        ALGO_NAMES[self.algo]
    }
    pub fn proto_name(&self) -> &'static str {
        PROTO_NAMES[self.proto]
    }
}

/// The graph NCCL's search would find, as assumed (see [`NCCL_ASSUMPTIONS`]).
struct Graph {
    channels: usize,
    bw_intra: f64,
    bw_inter: f64,
    /// typeIntra is NVLink (else PCI).
    nvl: bool,
    /// Every channel alike (one GPU per node).
    same_channels: bool,
}

fn graph(c: &Cluster) -> Graph {
    if c.nodes > 1 {
        let channels = c.nics_per_node.max(1);
        let per = c.net_gbps.min(if c.gpus_per_node > 1 {
            c.nvlink_gbps / channels as f64
        } else {
            f64::INFINITY
        });
        Graph {
            channels,
            bw_intra: per,
            bw_inter: per,
            nvl: c.gpus_per_node > 1 && c.nvlink_gbps > 0.0,
            same_channels: c.gpus_per_node == 1,
        }
    } else {
        let channels = ((c.nvlink_gbps / 20.0).round() as usize).clamp(1, 16);
        let per = c.nvlink_gbps / channels as f64;
        Graph {
            channels,
            bw_intra: per,
            bw_inter: per,
            nvl: c.nvlink_gbps > 0.0,
            same_channels: false,
        }
    }
}

/// NCCL's estimate (us) for one (algorithm, protocol) cell, None where the
/// cell is disabled; `nbytes` is NCCL's (the larger of the send and
/// receive buffers).
fn nccl_time(c: &Cluster, coll: Coll, nbytes: u64, algo: usize, proto: usize) -> Option<f64> {
    let g = graph(c);
    let (n, nodes) = (c.nranks(), c.nodes);
    let ccx = cc_index(c.sm);
    let idx2 = if nodes <= 2 { nodes - 1 } else { 2 };
    let idx1 = if nodes == 1 { ccx } else { 0 };
    let ll_max = LL_MAX_BWS[idx1][idx2];
    let nch = g.channels as f64;
    let intra_hw = if g.nvl { HW_NVLINK } else { HW_PCI };
    let inter_hw = if nodes == 1 { intra_hw } else { HW_NET };
    let f = func(coll);
    let inter_lat = |a: usize| {
        let mut l = if nodes == 1 {
            hw_latency(intra_hw, a, proto)
        } else {
            hw_latency(inter_hw, a, proto)
        };
        l += c.net_latency_us;
        if proto == SIMPLE {
            l += c.net_latency_us;
        }
        l
    };
    let (lat, bw) = match algo {
        RING => {
            let nsteps = match f {
                4 => 2 * (n - 1),
                2 | 3 => n - 1,
                _ => n,
            } as f64;
            let mut bus = if nodes > 1 { g.bw_inter } else { g.bw_intra } * nch;
            if proto == LL {
                bus = ll_max.min(bus * 0.5);
            }
            if proto == LL128 {
                bus = (bus * 0.92).min(nch * PER_CH_MAX_RING_LL128[ccx][idx2]);
            }
            let bw = bus * n as f64 / nsteps;
            let mut lat = base_latency(RING, proto);
            let intra = hw_latency(intra_hw, RING, proto);
            if f <= 1 {
                if g.same_channels {
                    lat += intra;
                } else {
                    let l = if proto == SIMPLE {
                        hw_latency(intra_hw, TREE, proto)
                    } else {
                        intra
                    };
                    lat += nsteps * l;
                }
            } else {
                let mut overhead = 0.0;
                if nodes > 1 {
                    overhead = 1.0; // x86 Intel
                    if proto == SIMPLE {
                        overhead *= 3.0;
                    }
                }
                let intra = intra.max(overhead);
                let inter_steps = if nodes == 1 {
                    0
                } else if f == 4 {
                    2 * (nodes - 1)
                } else {
                    nodes - 1
                } as f64;
                lat += (nsteps - inter_steps) * intra + inter_steps * inter_lat(RING);
            }
            // The ring's plateau, NCCL's per-call correction.
            let plateau = proto == SIMPLE
                && nodes > 1
                && f == 4
                && nbytes / (2 * g.channels as u64 * n as u64).max(1) >= 64;
            if plateau {
                lat *= if c.sm < 8 { 1.9 } else { 1.4 };
            }
            (lat, bw)
        }
        TREE => {
            if f != 4 {
                return None;
            }
            let mut bus = g.bw_inter.min(g.bw_intra) * nch;
            bus = (bus * 0.92).min(nch * PER_CH_MAX_TREE[ccx][idx2]);
            if proto == LL {
                bus = (bus / 3.8).min(ll_max);
            }
            if proto == LL128 {
                let k = if nodes == 1 { 7.0 / 9.0 } else { 120.0 / 128.0 };
                bus = (bus * k).min(nch * PER_CH_MAX_TREE_LL128[ccx][idx2]);
            }
            let mut bw = bus * 0.5;
            let log_size = log2i(nbytes >> 6);
            if (0..23).contains(&log_size) {
                bw *= TREE_CORRECTION[proto][log_size as usize];
            }
            let lat = base_latency(TREE, proto)
                + 2.0
                    * ((n / nodes - 1) as f64 * hw_latency(intra_hw, TREE, proto)
                        + log2i(nodes as u64) as f64 * inter_lat(TREE));
            (lat, bw)
        }
        PAT => {
            // One GPU per node, SIMPLE, all_gather and reduce_scatter only.
            if nodes != n || proto != SIMPLE || !(f == 2 || f == 3) {
                return None;
            }
            let bw = g.bw_inter.min(g.bw_intra) * nch * 0.75;
            let mut inter = hw_latency(inter_hw, PAT, proto);
            inter += c.net_latency_us;
            let lat = base_latency(PAT, proto)
                + log2i(nodes as u64) as f64 * (inter / 3.5)
                + n as f64 * 2.8;
            (lat, bw)
        }
        _ => return None,
    };
    Some(lat + nbytes as f64 / (1000.0 * bw))
}

/// NCCL's choice for `coll` of `nbytes` (NCCL's size) on `c`.
pub fn nccl_choose(c: &Cluster, coll: Coll, nbytes: u64) -> NcclChoice {
    let mut best: Option<NcclChoice> = None;
    if c.nranks() > 1 {
        for algo in [TREE, RING, PAT] {
            for proto in [LL, LL128, SIMPLE] {
                if let Some(t) = nccl_time(c, coll, nbytes, algo, proto) {
                    if t > 0.0 && best.is_none_or(|b| t < b.time_us) {
                        best = Some(NcclChoice {
                            algo,
                            proto,
                            channels: 0,
                            time_us: t,
                        });
                    }
                }
            }
        }
    }
    let mut b = best.unwrap_or(NcclChoice {
        algo: RING,
        proto: SIMPLE,
        channels: 1,
        time_us: 0.0,
    });
    b.channels = nccl_channels(c, nbytes, b.algo, b.proto);
    b
}

/// `ncclTuningGetChannels`: fewer channels while each would get less than
/// its threads' share.
fn nccl_channels(c: &Cluster, nbytes: u64, algo: usize, proto: usize) -> usize {
    let mut nc = (2 * graph(c).channels).min(64) as u64;
    let nt: u64 = match (algo, proto) {
        (PAT, _) => 0, // NCCL sets no thread count for PAT before this.
        (_, LL128) => 640,
        _ => 512,
    };
    let mut thr: u64 = match proto {
        LL | LL128 => 8,
        _ => 64,
    };
    if algo == RING && proto == LL {
        thr *= c.nranks() as u64;
    }
    while nbytes < nc * nt * thr && nc >= 2 {
        nc -= 1;
    }
    nc as usize
}

/// oxccl's links on `c`: NVLink inside a node, the network between.
pub fn fabric(c: &Cluster) -> Fabric {
    Fabric {
        intra: LinkModel {
            latency_s: LinkModel::NVLINK.latency_s,
            bandwidth: c.nvlink_gbps * 1e9,
        },
        inter: LinkModel::from_net(
            (c.net_gbps * 8000.0) as i32 * c.nics_per_node.max(1) as i32
                / c.gpus_per_node.max(1) as i32,
            c.net_latency_us as f32,
        ),
        nodes: c.nodes,
    }
}

/// The channels oxccl's GPU path takes for `bytes` per rank: at most one
/// per 15.5 GB/s of NVLink (as its topology counts) within a node, and
/// NCCL's count through host memory (the network) once there are several
/// nodes, where a communicator's windows go through the proxy.
fn oxccl_channels(c: &Cluster, bytes: usize) -> usize {
    let per = oxccl::exec::device::DeviceConfig::default().channel_bytes;
    if c.nodes > 1 {
        return bytes
            .div_ceil(per)
            .clamp(1, oxccl::exec::device::config::HOST_CTAS);
    }
    let links = (c.nvlink_gbps / oxccl::topo::channels::nvlink_gbps((c.sm, 0))).round() as u32;
    let max = oxccl::topo::channels::channels(
        oxccl::topo::Link::NvLink {
            links: links.max(1),
        },
        (c.sm, 0),
    )
    .unwrap_or(oxccl::exec::device::config::DEFAULT_P2P_CTAS);
    bytes.div_ceil(per).clamp(1, max)
}

/// oxccl's choice on the GPU path: algorithm, NCCL protocol, channels, us;
/// and the host path's algorithm (its executor runs every algorithm).
pub fn oxccl_choose(c: &Cluster, coll: Coll, nbytes: u64) -> (Algo, usize, usize, f64, Algo) {
    let n = c.nranks();
    let per_rank = match coll {
        Coll::AllGather | Coll::ReduceScatter => nbytes as usize / n,
        _ => nbytes as usize,
    };
    let f = fabric(c);
    let table = cost::device_table(coll, per_rank, n, f, None);
    let (algo, proto) = cost::pick(&table, coll).unwrap_or((Algo::Ring, SIMPLE));
    let t = cost::predict(algo, coll, per_rank, n, f).unwrap_or(0.0) * 1e6;
    let host = cost::choose(coll, per_rank, n, f, None);
    (algo, proto, oxccl_channels(c, per_rank), t, host)
}

pub const SIZES: [u64; 11] = [
    8,
    64,
    1 << 10,
    16 << 10,
    128 << 10,
    1 << 20,
    16 << 20,
    128 << 20,
    1 << 30,
    2 << 30,
    4 << 30,
];

pub const COLLS: [Coll; 5] = [
    Coll::AllReduce,
    Coll::AllGather,
    Coll::ReduceScatter,
    Coll::Broadcast { root: 0 },
    Coll::Reduce { root: 0 },
];

fn size_name(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// The whole table, as printed.
pub fn report(c: &Cluster) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## Cost model on {} nodes x {} GPUs ({} ranks), NVLink {} GB/s, {} NIC(s)/node at {} GB/s, net latency {} us, sm{}0",
        c.nodes,
        c.gpus_per_node,
        c.nranks(),
        c.nvlink_gbps,
        c.nics_per_node,
        c.net_gbps,
        c.net_latency_us,
        c.sm
    );
    let _ = writeln!(s, "{NCCL_ASSUMPTIONS}");
    let _ = writeln!(
        s,
        "oxccl: algo::cost's device table (what its GPU kernels run) and channels per 32 KiB; `host` is the\n  host executor's choice (algo::cost::choose). Size: NCCL's (all_gather/reduce_scatter: the whole buffer).\n"
    );
    let _ = writeln!(
        s,
        "{:<15} {:>8} | {:<6} {:<7} {:>3} {:>11} | {:<11} {:<7} {:>3} {:>11} {:<11}",
        "collective", "size", "NCCL", "proto", "ch", "us", "oxccl", "proto", "ch", "us", "host"
    );
    for coll in COLLS {
        for &b in &SIZES {
            let nc = nccl_choose(c, coll, b);
            let (a, p, ch, t, host) = oxccl_choose(c, coll, b);
            let _ = writeln!(
                s,
                "{:<15} {:>8} | {:<6} {:<7} {:>3} {:>11.1} | {:<11} {:<7} {:>3} {:>11.1} {:<11}",
                coll.name(),
                size_name(b),
                nc.algo_name(),
                nc.proto_name(),
                nc.channels,
                nc.time_us,
                a.name(),
                PROTO_NAMES.get(p).copied().unwrap_or("?"),
                ch,
                t,
                host.name()
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(nodes: usize, gpn: usize) -> Cluster {
        Cluster {
            nodes,
            gpus_per_node: gpn,
            nvlink_gbps: 450.0,
            net_gbps: 50.0,
            nics_per_node: gpn,
            net_latency_us: 0.0,
            sm: 9,
        }
    }

    /// NCCL's model picks PAT for mid-sized all_gathers on one GPU per
    /// node across many nodes (the ring's LL below: PAT's latency keeps a
    /// part linear in the ranks), the ring for large ones, and never PAT
    /// with several GPUs per node; LL for tiny all_reduces, Simple for
    /// large.
    #[test]
    fn nccl_model_picks_as_nccls_rules_say() {
        let one = cluster(64, 1);
        let tiny = nccl_choose(&one, Coll::AllGather, 8);
        assert_eq!((tiny.algo_name(), tiny.proto_name()), ("Ring", "LL"));
        let mid = nccl_choose(&one, Coll::AllGather, 16 << 20);
        assert_eq!(mid.algo_name(), "PAT", "{mid:?}");
        let big = nccl_choose(&one, Coll::AllGather, 4 << 30);
        assert_eq!(big.algo_name(), "Ring", "{big:?}");
        let eight = cluster(16, 8);
        for b in SIZES {
            assert_ne!(nccl_choose(&eight, Coll::AllGather, b).algo_name(), "PAT");
        }
        let tiny = nccl_choose(&eight, Coll::AllReduce, 8);
        assert_eq!(tiny.proto_name(), "LL", "{tiny:?}");
        let large = nccl_choose(&eight, Coll::AllReduce, 4 << 30);
        assert_eq!(large.proto_name(), "Simple", "{large:?}");
        assert!(large.channels > tiny.channels);
    }

    #[test]
    fn report_has_a_row_per_collective_and_size() {
        let r = report(&cluster(128, 8));
        assert_eq!(
            r.lines().filter(|l| l.contains(" | ")).count(),
            1 + COLLS.len() * SIZES.len()
        );
    }
}
