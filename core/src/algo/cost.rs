//! The cost model that picks an algorithm: time = latency + bytes / bandwidth
//! per algorithm, as NCCL's tuning tables (which a tuner plugin can replace).

use oxccl_plugin::ffi::tuner::{
    NCCL_ALGO_PAT, NCCL_ALGO_PROTO_IGNORE, NCCL_ALGO_RING, NCCL_ALGO_TREE, NCCL_NUM_ALGORITHMS,
    NCCL_NUM_PROTOCOLS, NCCL_PROTO_LL, NCCL_PROTO_SIMPLE,
};

use super::{Algo, Coll};

/// Figures of one network path, measured or declared by the net plugin.
#[derive(Debug, Clone, Copy)]
pub struct LinkModel {
    /// Seconds one message takes to cross, start to finish, when tiny.
    pub latency_s: f64,
    /// Bytes per second of one link in one direction.
    pub bandwidth: f64,
}

impl Default for LinkModel {
    fn default() -> Self {
        // TCP on one host or a 10 Gb/s link: tens of microseconds, ~1 GB/s.
        LinkModel {
            latency_s: 20e-6,
            bandwidth: 1.0e9,
        }
    }
}

impl LinkModel {
    /// The slower of two links in both respects: what ranks that see
    /// different links plan with.
    pub fn worse(self, other: LinkModel) -> LinkModel {
        LinkModel {
            latency_s: self.latency_s.max(other.latency_s),
            bandwidth: self.bandwidth.min(other.bandwidth),
        }
    }

    /// Ranks of one host through a ring in shared memory: a cache line's
    /// hand-off between cores, and memcpy speed for each of the two copies.
    pub const SHM: LinkModel = LinkModel {
        latency_s: 1.5e-6,
        bandwidth: 8e9,
    };

    /// What a net plugin device reports (port speed in Mbit/s, latency in
    /// microseconds), falling back to the default where it reports 0.
    pub fn from_net(speed_mbps: i32, latency_us: f32) -> LinkModel {
        let d = LinkModel::default();
        LinkModel {
            latency_s: if latency_us > 0.0 {
                f64::from(latency_us) * 1e-6
            } else {
                d.latency_s
            },
            bandwidth: if speed_mbps > 0 {
                f64::from(speed_mbps) * 1e6 / 8.0
            } else {
                d.bandwidth
            },
        }
    }

    /// GPUs of one node storing into each other's memory (H100/H200 over
    /// NVLink): a flag round trip of a few microseconds, ~360 GB/s a way.
    pub const NVLINK: LinkModel = LinkModel {
        latency_s: 5e-6,
        bandwidth: 360e9,
    };

    /// GPUs of one node through step slots in shared host memory (one GPU
    /// writes over PCIe, the other reads): two H200 moved ~25 GB/s busbw
    /// this way and an 8-byte step took ~10 us (2026-11-27, e50db39).
    pub const SHM_DEVICE: LinkModel = LinkModel {
        latency_s: 10e-6,
        bandwidth: 25e9,
    };
}

/// The links a communicator's collectives cross: between ranks of one host
/// (shared memory, or the network when SHM is off) and between hosts (the
/// net plugin). A ring crosses between hosts once per host; every step of
/// it waits for its slowest hop.
#[derive(Debug, Clone, Copy)]
pub struct Fabric {
    pub intra: LinkModel,
    pub inter: LinkModel,
    /// Hosts the ranks are on.
    pub nodes: usize,
}

impl From<LinkModel> for Fabric {
    fn from(l: LinkModel) -> Fabric {
        Fabric {
            intra: l,
            inter: l,
            nodes: 1,
        }
    }
}

impl Fabric {
    /// The link every step of an algorithm spanning all ranks waits for.
    fn slowest(&self) -> LinkModel {
        if self.nodes > 1 {
            LinkModel {
                latency_s: self.intra.latency_s.max(self.inter.latency_s),
                bandwidth: self.intra.bandwidth.min(self.inter.bandwidth),
            }
        } else {
            self.intra
        }
    }
}

/// The share of a link's bandwidth a tree all-reduce gets: the busiest
/// rank, inner node of one tree and leaf of the other, moves as much as a
/// ring rank but folds two children into each slice, and its children's
/// sends meet on one link. NCCL's model also puts tree bandwidth below the
/// ring's.
const TREE_EFFICIENCY: f64 = 0.7;

/// The share of a link's bandwidth the log-depth all-gather and
/// reduce-scatter (PAT) get: its rounds wait for each other where the
/// ring streams, so its messages do not keep every link busy.
///
/// Fitted to the host executor's runs (docs/performance.md, "PAT's
/// reduce_scatter against the ring", 16 cores: 64 processes through the
/// socket network, which plans with 10 Gb/s and 20 us per hop): PAT was
/// 1.3x faster than the ring at 64 KiB per rank, 0.85-1.09x at 256 KiB and
/// 0.80-0.85x at 1 MiB. A least-squares fit of the ring-over-PAT ratio
/// from 16 KiB gives 0.90, the 1 MiB ratio alone 0.80; 0.85 sits between
/// and puts the crossover at 64 ranks near 125 KiB per rank on those
/// links (100 KiB at the 1 GB/s assumed when the net reports no speed).
/// The crossover scales with the link's latency x bandwidth and grows
/// with the rank count, as the ring's n-1 hops outgrow PAT's log2 n
/// rounds. NCCL's model (src/tuning/pat.cc, 2.31) gives its GPU PAT 0.75;
/// our GPU path has no PAT, so this figure is the host executor's alone.
const PAT_EFFICIENCY: f64 = 0.85;

/// What NCCL_ALGO (or a call's algorithm) leaves the model: one row it
/// holds the choice to, or rows it leaves out (`^PAT`). Where nothing the
/// setting leaves can run a collective, the ring runs it, as the ring
/// always can.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// The row the choice is held to (any algorithm of NCCL's row).
    pub forced: Option<Algo>,
    /// The algorithms left out, by bit `code - 1` ([`Algo::code`]).
    excluded: u8,
}

impl From<Option<Algo>> for Held {
    fn from(forced: Option<Algo>) -> Held {
        Held {
            forced,
            excluded: 0,
        }
    }
}

impl Held {
    /// Leaves `algos` out (nothing forced).
    pub fn excluding(algos: &[Algo]) -> Held {
        Held {
            forced: None,
            excluded: algos.iter().fold(0, |m, a| m | 1 << (a.code() - 1)),
        }
    }

    /// Whether `a` is left out.
    pub fn excludes(&self, a: Algo) -> bool {
        self.excluded & (1 << (a.code() - 1)) != 0
    }

    /// The algorithms left out, in [`Algo::ALL`]'s order.
    pub fn excluded(&self) -> Vec<Algo> {
        Algo::ALL
            .into_iter()
            .filter(|a| self.excludes(*a))
            .collect()
    }

    /// Whether the setting leaves anything out or holds the choice.
    pub fn is_some(&self) -> bool {
        self.forced.is_some() || self.excluded != 0
    }
}

/// Whether the model offers PAT: where each rank is on its own node, as
/// NCCL (src/tuning/pat.cc, 2.31: nNodes == nRanks, all_gather and
/// reduce_scatter, SIMPLE only), or where NCCL_ALGO asks for its row.
fn pat_offered(a: Algo, n: usize, f: &Fabric, held: Held) -> bool {
    a != Algo::Pat || (f.nodes == n && n > 1) || held.forced == Some(Algo::Pat)
}

fn log2_ceil(n: usize) -> f64 {
    (n.max(1) as f64).log2().ceil()
}

/// Predicted seconds for `coll` of `bytes` (per rank's buffer) on `n` ranks.
pub fn predict(
    algo: Algo,
    coll: Coll,
    bytes: usize,
    n: usize,
    fabric: impl Into<Fabric>,
) -> Option<f64> {
    if !algo.supports(coll) || n < 2 {
        return None;
    }
    let f: Fabric = fabric.into();
    let b = bytes as f64;
    let slow = f.slowest();
    let (a, bw) = (slow.latency_s, slow.bandwidth);
    let nf = n as f64;
    Some(match (algo, coll) {
        (Algo::Ring, Coll::AllReduce) => 2.0 * (nf - 1.0) * a + 2.0 * (nf - 1.0) / nf * b / bw,
        (Algo::Ring, Coll::AllGather | Coll::ReduceScatter) => (nf - 1.0) * (a + b / bw),
        (Algo::Ring, _) => (nf - 1.0) * a + b / bw,
        (Algo::RecDoubling, _) => {
            // The exchanges between hosts are the last log2(hosts) rounds
            // (ranks of a host are adjacent); the others stay inside.
            let extra = if n.is_power_of_two() { 0.0 } else { 2.0 };
            let across = if f.nodes > 1 { log2_ceil(f.nodes) } else { 0.0 };
            let inside = (log2_ceil(n) - across).max(0.0) + extra;
            let round = |l: LinkModel| l.latency_s + b / l.bandwidth;
            inside * round(f.intra) + across * round(if f.nodes > 1 { f.inter } else { f.intra })
        }
        (Algo::Tree, _) => {
            // Up and down a tree of depth log2(n), pipelined slice by
            // slice: every hop's latency, and the data through the
            // busiest rank's link twice (the two trees each carry half).
            let depth = log2_ceil(n + 1);
            2.0 * depth * a + 2.0 * b / (TREE_EFFICIENCY * bw)
        }
        (Algo::Pat, _) => {
            // ceil(log2 n) dependent rounds, n-1 blocks in and out (both
            // collectives: the reduce-scatter is the all-gather reversed).
            super::pat::rounds(n) as f64 * a + (nf - 1.0) * b / (PAT_EFFICIENCY * bw)
        }
    })
}

/// The fastest algorithm by the model, among those of a forced row
/// (NCCL_ALGO) when one is forced, leaving out those it excludes.
pub fn choose(
    coll: Coll,
    bytes: usize,
    n: usize,
    fabric: impl Into<Fabric>,
    held: impl Into<Held>,
) -> Algo {
    let f: Fabric = fabric.into();
    let held = held.into();
    Algo::ALL
        .into_iter()
        .filter(|a| allowed(*a, coll, held) && pat_offered(*a, n, &f, held))
        .filter_map(|a| predict(a, coll, bytes, n, f).map(|t| (a, t)))
        .min_by(|x, y| x.1.total_cmp(&y.1))
        .map(|(a, _)| a)
        .unwrap_or(Algo::Ring)
}

/// Whether `held` (NCCL_ALGO) admits `a`: not excluded, and of the forced
/// row (a row of NCCL's table) if one is; a forced row that cannot run
/// `coll` admits everything, as NCCL ignores it then.
fn allowed(a: Algo, coll: Coll, held: Held) -> bool {
    if held.excludes(a) {
        return false;
    }
    match held.forced {
        Some(f)
            if Algo::ALL
                .iter()
                .any(|x| x.supports(coll) && nccl_row(*x) == nccl_row(f)) =>
        {
            nccl_row(a) == nccl_row(f)
        }
        _ => true,
    }
}

/// Predicted seconds of an all-reduce of `bytes` through a CollNet (NCCL's
/// CollNet chain, on host memory): a reduce inside each node of `ppn`
/// ranks to its first rank, the all-reduce of those ranks in the collnet,
/// which reduces in the fabric (each sends its data once and receives the
/// result once, whatever the number of nodes), and a broadcast inside
/// each node.
pub fn predict_collnet(bytes: usize, ppn: usize, intra: LinkModel, collnet: LinkModel) -> f64 {
    let b = bytes as f64;
    let inside = if ppn > 1 {
        2.0 * ((ppn as f64 - 1.0) * intra.latency_s + b / intra.bandwidth)
    } else {
        0.0
    };
    inside + 2.0 * (collnet.latency_s + b / collnet.bandwidth)
}

/// Whether an all-reduce of `bytes` on `n` ranks (at most `ppn` a node)
/// takes the CollNet: asked only where it is enabled and has devices; never
/// with an algorithm forced (NCCL_ALGO names none of NCCL's CollNet rows
/// here); else when the model predicts it no slower than the best of the
/// others.
pub fn collnet_wins(
    bytes: usize,
    n: usize,
    ppn: usize,
    fabric: Fabric,
    collnet: LinkModel,
    held: impl Into<Held>,
) -> bool {
    beats_the_rest(
        Coll::AllReduce,
        bytes,
        n,
        fabric,
        held.into(),
        predict_collnet(bytes, ppn, fabric.intra, collnet),
    )
}

/// Whether `collnet_s` seconds through the CollNet is no slower than the
/// best of what NCCL_ALGO leaves for `coll`; never with an algorithm forced.
fn beats_the_rest(
    coll: Coll,
    bytes: usize,
    n: usize,
    fabric: Fabric,
    held: Held,
    collnet_s: f64,
) -> bool {
    if held.forced.is_some() {
        return false;
    }
    let best = choose(coll, bytes, n, fabric, held);
    collnet_s <= predict(best, coll, bytes, n, fabric).unwrap_or(f64::INFINITY)
}

/// Predicted seconds of an all-gather or reduce-scatter of `bytes` per
/// rank on `n` ranks through a CollNet (host memory, `ppn` ranks a node):
/// inside each node an all-gather (or a reduce of all `n` blocks) to its
/// first rank, the collnet's `iallgather` (`ireducescatter`) among the
/// first ranks, which sends or receives all `n` blocks once, and a
/// broadcast inside the node (of all `n` blocks, or of the node's `ppn`).
pub fn predict_collnet_gather(
    coll: Coll,
    bytes: usize,
    n: usize,
    ppn: usize,
    intra: LinkModel,
    collnet: LinkModel,
) -> f64 {
    let (b, nf, pf) = (bytes as f64, n as f64, ppn as f64);
    let hop = |l: LinkModel, x: f64| l.latency_s + x / l.bandwidth;
    let inside = if ppn <= 1 {
        0.0
    } else if matches!(coll, Coll::ReduceScatter) {
        (pf - 1.0) * intra.latency_s + hop(intra, nf * b) + hop(intra, pf * b)
    } else {
        (pf - 1.0) * hop(intra, b) + hop(intra, nf * b)
    };
    inside + hop(collnet, nf * b)
}

/// Whether an all-gather or reduce-scatter of `bytes` per rank on `n`
/// ranks takes the CollNet, as [`collnet_wins`] for all-reduces.
pub fn collnet_gather_wins(
    coll: Coll,
    bytes: usize,
    n: usize,
    ppn: usize,
    fabric: Fabric,
    collnet: LinkModel,
    held: impl Into<Held>,
) -> bool {
    let collnet_s = predict_collnet_gather(coll, bytes, n, ppn, fabric.intra, collnet);
    beats_the_rest(coll, bytes, n, fabric, held.into(), collnet_s)
}

/// NCCL's cost table (`collCostTable`): estimated microseconds per
/// (algorithm, protocol), [`NCCL_ALGO_PROTO_IGNORE`] where unusable. What a
/// tuner plugin receives and may change; the cheapest usable entry wins.
pub type CostTable = [[f32; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS];

/// The cell of NCCL's table that stands for one of our algorithms: ring is
/// ring (SIMPLE); the double binary tree is NCCL's tree (SIMPLE); recursive
/// doubling, the latency algorithm, is the tree row's low-latency protocol
/// (LL), the cell NCCL's small tree all-reduces fall in.
pub fn nccl_cell(algo: Algo) -> (usize, usize) {
    match algo {
        Algo::Ring => (NCCL_ALGO_RING as usize, NCCL_PROTO_SIMPLE as usize),
        Algo::Tree => (NCCL_ALGO_TREE as usize, NCCL_PROTO_SIMPLE as usize),
        Algo::RecDoubling => (NCCL_ALGO_TREE as usize, NCCL_PROTO_LL as usize),
        Algo::Pat => (NCCL_ALGO_PAT as usize, NCCL_PROTO_SIMPLE as usize),
    }
}

/// The NCCL algorithm row of `algo` (what profilers and tuners are told).
pub fn nccl_row(algo: Algo) -> usize {
    nccl_cell(algo).0
}

/// Which of our algorithms a cell of NCCL's table runs: the ring row runs
/// the ring at any protocol; the tree row's LL runs recursive doubling and
/// its other protocols the tree; the PAT row's SIMPLE runs [`Algo::Pat`].
/// Other rows (CollNet, NVLS) none.
fn algo_at(row: usize, proto: usize) -> Option<Algo> {
    match row {
        r if r == NCCL_ALGO_RING as usize => Some(Algo::Ring),
        r if r == NCCL_ALGO_TREE as usize && proto == NCCL_PROTO_LL as usize => {
            Some(Algo::RecDoubling)
        }
        r if r == NCCL_ALGO_TREE as usize => Some(Algo::Tree),
        r if r == NCCL_ALGO_PAT as usize => Some(Algo::Pat),
        _ => None,
    }
}

/// The table from the model: one cell per algorithm, and a forced row
/// (NCCL_ALGO) leaves only its own cells and an excluded one none, as
/// NCCL masks the table before its tuner sees it.
pub fn cost_table(
    coll: Coll,
    bytes: usize,
    n: usize,
    fabric: impl Into<Fabric>,
    held: impl Into<Held>,
) -> CostTable {
    let f: Fabric = fabric.into();
    let held = held.into();
    let mut t = [[NCCL_ALGO_PROTO_IGNORE; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS];
    for a in Algo::ALL {
        if !allowed(a, coll, held) || !pat_offered(a, n, &f, held) {
            continue;
        }
        if let Some(s) = predict(a, coll, bytes, n, f) {
            let (r, p) = nccl_cell(a);
            t[r][p] = (s * 1e6) as f32;
        }
    }
    if t.iter().flatten().all(|c| *c < 0.0) {
        // One rank, or nothing predicted: ring is always runnable.
        let (r, p) = nccl_cell(Algo::Ring);
        t[r][p] = 0.0;
    }
    t
}

/// Ranks up to which the device kernels run recursive doubling: its
/// templates (the fold of a non-power-of-two count, then log2 exchanges
/// of the whole buffer) are checked for deadlock on bounded FIFOs up to 9
/// ranks (`exec::device::plan`'s tests).
pub const DEVICE_REC_DOUBLING_MAX: usize = 8;

/// Whether the device kernels run `algo` for `coll` on `n` ranks: the ring
/// (chain) for everything; recursive doubling for all-reduce up to
/// [`DEVICE_REC_DOUBLING_MAX`] ranks; the double binary tree for
/// all-reduce (even channels on one tree, odd ones on the other).
pub fn device_runs(algo: Algo, coll: Coll, n: usize) -> bool {
    match algo {
        Algo::Ring => true,
        Algo::RecDoubling => coll == Coll::AllReduce && n <= DEVICE_REC_DOUBLING_MAX,
        Algo::Tree => coll == Coll::AllReduce,
        // The kernels have no PAT: the host executor runs it.
        Algo::Pat => false,
    }
}

/// The cost table of the device path: the cells its kernels run for this
/// call (a tuner may pick only among those, as NCCL's tuners pick among
/// the entries NCCL marked usable), costed by the model over the
/// communicator's links (`fabric`: NVLink, shared memory or the network
/// inside a node, the net plugin between nodes); NCCL_ALGO leaves its own
/// row where the device runs it.
pub fn device_table(
    coll: Coll,
    bytes: usize,
    n: usize,
    fabric: Fabric,
    held: impl Into<Held>,
) -> CostTable {
    let mut held = held.into();
    held.forced = held.forced.filter(|f| {
        Algo::ALL
            .iter()
            .any(|a| nccl_row(*a) == nccl_row(*f) && device_runs(*a, coll, n))
    });
    let forced = held.forced;
    let mut t = cost_table(coll, bytes, n, fabric, held);
    // Past two ranks the kernels' doubling runs only where NCCL_ALGO asks
    // for it (its row): on 4 H200 as two nodes of two it halved an 8-byte
    // all_reduce under `oxccl perf` (30 against 50-63 us) but was 5 us
    // slower than the ring under PyTorch (60-62 against 54-58 us), whose
    // calls come one by one; 2026-11-27, 1abda1b.
    let doubling_offered = n <= 2 || forced.is_some();
    // The tree where NCCL takes it, across nodes (inside one it is not
    // measured against the ring), or where NCCL_ALGO asks for its row.
    let tree_offered = fabric.nodes > 1 || forced.is_some();
    for (r, cells) in t.iter_mut().enumerate() {
        for (p, c) in cells.iter_mut().enumerate() {
            let runs = algo_at(r, p).is_some_and(|a| {
                device_runs(a, coll, n)
                    && (a != Algo::RecDoubling || doubling_offered)
                    && (a != Algo::Tree || tree_offered)
            });
            if !runs {
                *c = NCCL_ALGO_PROTO_IGNORE;
            }
        }
    }
    if t.iter().flatten().all(|c| *c < 0.0) {
        let (r, p) = nccl_cell(Algo::Ring);
        t[r][p] = 0.0;
    }
    t
}

/// The cheapest entry we can run, as (algorithm, NCCL protocol). Entries
/// of cells we have no algorithm for are ignored even when a tuner made
/// them cheapest.
pub fn pick(table: &CostTable, coll: Coll) -> Option<(Algo, usize)> {
    table
        .iter()
        .enumerate()
        .flat_map(|(r, cells)| cells.iter().enumerate().map(move |(p, c)| (r, p, *c)))
        .filter(|(_, _, c)| *c >= 0.0)
        .filter_map(|(r, p, c)| {
            algo_at(r, p)
                .filter(|a| a.supports(coll))
                .map(|a| (a, p, c))
        })
        .min_by(|x, y| x.2.total_cmp(&y.2))
        .map(|(a, p, _)| (a, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NVL: LinkModel = LinkModel::NVLINK;

    #[test]
    fn the_worse_of_two_links_is_slower_in_both_respects() {
        let nic = LinkModel {
            latency_s: 5e-6,
            bandwidth: 25e9,
        };
        let slow = LinkModel {
            latency_s: 2e-6,
            bandwidth: 1e9,
        };
        let w = nic.worse(slow);
        assert_eq!((w.latency_s, w.bandwidth), (5e-6, 1e9));
        let w2 = slow.worse(nic);
        assert_eq!((w2.latency_s, w2.bandwidth), (5e-6, 1e9));
    }

    /// The device table costs the communicator's own links: the ring over
    /// two nodes through the network costs more than over NVLink, which a
    /// tuner sees; two ranks still take doubling, whatever the links.
    #[test]
    fn device_table_costs_the_links_it_crosses() {
        let ring = nccl_cell(Algo::Ring);
        let nodes = Fabric {
            intra: LinkModel::NVLINK,
            inter: LinkModel::default(),
            nodes: 2,
        };
        for bytes in [8, 1 << 20, 1 << 28] {
            let over_nvl = device_table(Coll::AllReduce, bytes, 4, NVL.into(), None);
            let over_net = device_table(Coll::AllReduce, bytes, 4, nodes, None);
            assert!(
                over_net[ring.0][ring.1] > over_nvl[ring.0][ring.1],
                "{bytes} B"
            );
            for f in [NVL.into(), LinkModel::SHM_DEVICE.into(), nodes] {
                let t = device_table(Coll::AllReduce, bytes, 2, f, None);
                assert_eq!(pick(&t, Coll::AllReduce).unwrap().0, Algo::RecDoubling);
            }
        }
    }

    #[test]
    fn small_prefers_doubling_large_prefers_ring() {
        let l = LinkModel::default();
        assert_eq!(choose(Coll::AllReduce, 8, 8, l, None), Algo::RecDoubling);
        assert_eq!(choose(Coll::AllReduce, 64 << 20, 8, l, None), Algo::Ring);
        assert_eq!(choose(Coll::AllGather, 8, 8, l, None), Algo::Ring);
        assert_eq!(
            choose(Coll::AllReduce, 8, 8, l, Some(Algo::Ring)),
            Algo::Ring
        );
    }

    #[test]
    fn table_agrees_with_the_model_and_a_tuner_can_override() {
        let l = LinkModel::default();
        let mut t = cost_table(Coll::AllReduce, 8, 8, l, None);
        assert_eq!(pick(&t, Coll::AllReduce).unwrap().0, Algo::RecDoubling);
        t[nccl_row(Algo::Ring)][NCCL_PROTO_SIMPLE as usize] = 0.0;
        assert_eq!(pick(&t, Coll::AllReduce).unwrap().0, Algo::Ring);
        // A row we cannot run is never chosen.
        t[4][0] = 0.0;
        t[nccl_row(Algo::Ring)][NCCL_PROTO_SIMPLE as usize] = 1e6;
        assert_eq!(pick(&t, Coll::AllReduce).unwrap().0, Algo::RecDoubling);
        // The tree row's SIMPLE cell runs the double binary tree.
        t[nccl_row(Algo::Tree)][NCCL_PROTO_SIMPLE as usize] = 0.0;
        assert_eq!(pick(&t, Coll::AllReduce).unwrap(), (Algo::Tree, 2));
        let f = cost_table(Coll::AllReduce, 8, 8, l, Some(Algo::Ring));
        assert!(f[nccl_row(Algo::RecDoubling)].iter().all(|c| *c < 0.0));
        // NCCL_ALGO=Tree leaves both cells of the tree row.
        let tr = cost_table(Coll::AllReduce, 8, 8, l, Some(Algo::Tree));
        assert!(tr[nccl_row(Algo::Ring)].iter().all(|c| *c < 0.0));
        assert_eq!(
            choose(Coll::AllReduce, 8, 8, l, Some(Algo::Tree)),
            Algo::RecDoubling
        );
    }

    /// The device runs recursive doubling for all-reduce: on two ranks the
    /// model's choice at every size, on up to 8 ranks where NCCL_ALGO asks
    /// for it (its row), beyond that never, the row's tree instead; other
    /// collectives only on the ring. Inside one node the tree runs only
    /// where NCCL_ALGO asks for it.
    #[test]
    fn device_table_offers_what_the_kernels_run() {
        let algo = |coll, bytes, n, forced| {
            pick(&device_table(coll, bytes, n, NVL.into(), forced), coll)
                .unwrap()
                .0
        };
        for bytes in [8, 1 << 20, 1 << 30] {
            assert_eq!(algo(Coll::AllReduce, bytes, 2, None), Algo::RecDoubling);
            assert_eq!(
                algo(Coll::AllReduce, bytes, 2, Some(Algo::Ring)),
                Algo::Ring
            );
            assert_eq!(
                algo(Coll::AllReduce, bytes, 4, Some(Algo::RecDoubling)),
                Algo::RecDoubling
            );
            // Past 8 ranks the row runs its other cell, the tree.
            assert_eq!(
                algo(Coll::AllReduce, bytes, 16, Some(Algo::RecDoubling)),
                Algo::Tree
            );
            assert_eq!(algo(Coll::AllGather, bytes, 2, None), Algo::Ring);
        }
        for n in [3, 4, 8] {
            assert_eq!(algo(Coll::AllReduce, 8, n, None), Algo::Ring);
            let t = device_table(Coll::AllReduce, 8, n, NVL.into(), None);
            assert!(t[nccl_row(Algo::RecDoubling)].iter().all(|c| *c < 0.0));
        }
        let t = device_table(Coll::AllReduce, 8, 16, NVL.into(), None);
        assert!(t[nccl_row(Algo::RecDoubling)].iter().all(|c| *c < 0.0));
        for bytes in [8, 1 << 20, 1 << 30] {
            assert_eq!(
                algo(Coll::AllReduce, bytes, 16, Some(Algo::Tree)),
                Algo::Tree
            );
        }
        // One rank: the ring, always runnable.
        assert_eq!(algo(Coll::AllReduce, 8, 1, None), Algo::Ring);
    }

    /// On many ranks across hosts, mid-sized all-reduces go to the tree:
    /// the ring pays 2(n-1) slow hops, doubling moves the whole buffer
    /// log2(n) times.
    #[test]
    fn the_tree_wins_mid_sizes_at_scale() {
        let f = Fabric {
            intra: LinkModel {
                latency_s: 1e-6,
                bandwidth: 20e9,
            },
            inter: LinkModel {
                latency_s: 20e-6,
                bandwidth: 10e9,
            },
            nodes: 16,
        };
        assert_eq!(choose(Coll::AllReduce, 8, 128, f, None), Algo::RecDoubling);
        assert_eq!(choose(Coll::AllReduce, 1 << 20, 128, f, None), Algo::Tree);
        assert_eq!(choose(Coll::AllReduce, 1 << 30, 128, f, None), Algo::Ring);
        assert_eq!(choose(Coll::AllGather, 1 << 20, 128, f, None), Algo::Ring);
    }

    /// Across nodes the device offers its tree and takes it for mid-sized
    /// all-reduces at scale; at 4 nodes the ring's latency is no worse, so
    /// the ring keeps every size there.
    #[test]
    fn the_device_takes_its_tree_across_many_nodes() {
        let across = |nodes| Fabric {
            intra: LinkModel::NVLINK,
            inter: LinkModel {
                latency_s: 5e-6,
                bandwidth: 25e9,
            },
            nodes,
        };
        let algo = |bytes, n, f| {
            pick(
                &device_table(Coll::AllReduce, bytes, n, f, None),
                Coll::AllReduce,
            )
            .unwrap()
            .0
        };
        assert_eq!(algo(64 << 10, 16, across(16)), Algo::Tree);
        assert_eq!(algo(1 << 30, 16, across(16)), Algo::Ring);
        for bytes in [8, 64 << 10, 1 << 30] {
            assert_eq!(algo(bytes, 4, across(4)), Algo::Ring, "{bytes} B");
        }
        let (r, p) = nccl_cell(Algo::Tree);
        assert!(device_table(Coll::AllGather, 1 << 20, 16, across(16), None)[r][p] < 0.0);
    }

    #[test]
    fn collnet_wins_where_the_fabric_reduces_faster_and_nothing_is_forced() {
        let f = Fabric {
            intra: LinkModel::SHM,
            inter: LinkModel::default(),
            nodes: 2,
        };
        let fast = LinkModel::from_net(400_000, 1.0);
        let slow = LinkModel::from_net(10, 1000.0);
        for bytes in [8, 1 << 20, 64 << 20] {
            assert!(collnet_wins(bytes, 4, 2, f, fast, None), "{bytes}");
            assert!(!collnet_wins(bytes, 4, 2, f, slow, None), "{bytes}");
            assert!(!collnet_wins(bytes, 4, 2, f, fast, Some(Algo::Ring)));
        }
    }

    #[test]
    fn collnet_gathers_win_where_the_fabric_is_faster_and_nothing_is_forced() {
        let f = Fabric {
            intra: LinkModel::SHM,
            inter: LinkModel::default(),
            nodes: 2,
        };
        let fast = LinkModel::from_net(400_000, 1.0);
        let slow = LinkModel::from_net(10, 1000.0);
        for coll in [Coll::AllGather, Coll::ReduceScatter] {
            for bytes in [8, 1 << 20, 64 << 20] {
                assert!(
                    collnet_gather_wins(coll, bytes, 4, 2, f, fast, None),
                    "{bytes}"
                );
                assert!(!collnet_gather_wins(coll, bytes, 4, 2, f, slow, None));
                let ring = Some(Algo::Ring);
                assert!(!collnet_gather_wins(coll, bytes, 4, 2, f, fast, ring));
            }
        }
    }

    /// PAT where every rank is on its own node, as NCCL: small and mid
    /// all-gathers and reduce-scatters take it, large ones the ring; on
    /// one node only where NCCL_ALGO asks for it; never for other
    /// collectives.
    #[test]
    fn pat_with_one_rank_per_node() {
        let net = LinkModel {
            latency_s: 5e-6,
            bandwidth: 25e9,
        };
        let apart = |n| Fabric {
            intra: net,
            inter: net,
            nodes: n,
        };
        for n in [5, 64] {
            assert_eq!(choose(Coll::AllGather, 8, n, apart(n), None), Algo::Pat);
            assert_eq!(choose(Coll::ReduceScatter, 8, n, apart(n), None), Algo::Pat);
            assert_eq!(
                choose(Coll::ReduceScatter, 1 << 30, n, apart(n), None),
                Algo::Ring
            );
            assert_eq!(choose(Coll::ReduceScatter, 8, n, net, None), Algo::Ring);
        }
        // Up to three ranks PAT's rounds are the ring's hops, and the ring streams.
        for n in [2, 3] {
            assert_eq!(choose(Coll::AllGather, 8, n, apart(n), None), Algo::Ring);
        }
        assert_eq!(
            choose(Coll::AllGather, 64 << 10, 64, apart(64), None),
            Algo::Pat
        );
        assert_eq!(
            choose(Coll::AllGather, 1 << 30, 64, apart(64), None),
            Algo::Ring
        );
        assert_eq!(
            choose(Coll::AllReduce, 8, 64, apart(64), None),
            Algo::RecDoubling
        );
        let together = Fabric {
            intra: net,
            inter: net,
            nodes: 8,
        };
        assert_eq!(choose(Coll::AllGather, 8, 64, together, None), Algo::Ring);
        let one_node: Fabric = net.into();
        assert_eq!(choose(Coll::AllGather, 8, 64, one_node, None), Algo::Ring);
        assert_eq!(
            choose(Coll::AllGather, 1 << 30, 64, one_node, Some(Algo::Pat)),
            Algo::Pat
        );
        assert_eq!(
            choose(Coll::AllGather, 8, 64, apart(64), Some(Algo::Ring)),
            Algo::Ring
        );
        let t = cost_table(Coll::AllGather, 8, 64, apart(64), None);
        assert_eq!(pick(&t, Coll::AllGather), Some((Algo::Pat, 2)));
        // NCCL_ALGO=^PAT: the ring instead, and no PAT cell for a tuner.
        let no_pat = Held::excluding(&[Algo::Pat]);
        for coll in [Coll::AllGather, Coll::ReduceScatter] {
            assert_eq!(choose(coll, 8, 64, apart(64), no_pat), Algo::Ring);
            let t = cost_table(coll, 8, 64, apart(64), no_pat);
            assert_eq!(pick(&t, coll), Some((Algo::Ring, 2)));
        }
        assert_eq!(
            choose(Coll::AllReduce, 8, 64, apart(64), no_pat),
            Algo::RecDoubling
        );
        // Everything a collective has excluded: the ring still runs it.
        let none = Held::excluding(&[Algo::Ring, Algo::Pat]);
        assert_eq!(choose(Coll::AllGather, 8, 64, apart(64), none), Algo::Ring);
        // The kernels have no PAT.
        let d = device_table(Coll::AllGather, 8, 64, apart(64), None);
        assert_eq!(pick(&d, Coll::AllGather).unwrap().0, Algo::Ring);
        assert_eq!(Algo::parse("PAT"), Some(Algo::Pat));
        assert_eq!(Algo::from_code(Algo::Pat.code()), Some(Algo::Pat));
    }

    /// The host's PAT-vs-ring crossover follows the 64-rank runs on the
    /// GPU machine's host (docs/performance.md): on the socket network's
    /// links (10 Gb/s, 20 us) PAT up to 64 KiB per rank, the ring from
    /// 256 KiB, from 16 to 1,024 ranks; the crossover lower on few ranks,
    /// where PAT saves fewer hops, and far higher on a 50 GB/s network.
    #[test]
    fn pat_gives_way_to_the_ring_where_the_host_runs_measured_it() {
        let crossover = |n: usize, link: LinkModel| {
            let apart = Fabric {
                intra: link,
                inter: link,
                nodes: n,
            };
            let mut b = 8;
            while choose(Coll::AllGather, b, n, apart, None) == Algo::Pat {
                assert_eq!(choose(Coll::ReduceScatter, b, n, apart, None), Algo::Pat);
                b *= 2;
            }
            assert_eq!(choose(Coll::ReduceScatter, b, n, apart, None), Algo::Ring);
            b
        };
        for link in [LinkModel::from_net(10_000, 0.0), LinkModel::default()] {
            for n in [16, 64, 1024] {
                let b = crossover(n, link);
                assert!((64 << 10..=256 << 10).contains(&b), "{n} ranks: {b} B");
            }
            assert!(crossover(4, link) < crossover(64, link));
        }
        let fast = LinkModel::from_net(400_000, 0.0);
        assert!(crossover(64, fast) > 1 << 20);
    }
}
