//! The cost model that picks an algorithm: time = latency + bytes / bandwidth
//! per algorithm, as NCCL's tuning tables (which a tuner plugin can replace).

use oxccl_plugin::ffi::tuner::{
    NCCL_ALGO_PROTO_IGNORE, NCCL_ALGO_RING, NCCL_ALGO_TREE, NCCL_NUM_ALGORITHMS,
    NCCL_NUM_PROTOCOLS, NCCL_PROTO_SIMPLE,
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
    /// GPUs of one node storing into each other's memory (H100/H200 over
    /// NVLink): a flag round trip of a few microseconds, ~360 GB/s a way.
    pub const NVLINK: LinkModel = LinkModel {
        latency_s: 5e-6,
        bandwidth: 360e9,
    };
}

/// Predicted seconds for `coll` of `bytes` (per rank's buffer) on `n` ranks.
pub fn predict(algo: Algo, coll: Coll, bytes: usize, n: usize, link: LinkModel) -> Option<f64> {
    if !algo.supports(coll) || n < 2 {
        return None;
    }
    let b = bytes as f64;
    let (a, bw) = (link.latency_s, link.bandwidth);
    let nf = n as f64;
    Some(match (algo, coll) {
        (Algo::Ring, Coll::AllReduce) => 2.0 * (nf - 1.0) * a + 2.0 * (nf - 1.0) / nf * b / bw,
        (Algo::Ring, Coll::AllGather | Coll::ReduceScatter) => (nf - 1.0) * (a + b / bw),
        (Algo::Ring, _) => (nf - 1.0) * a + b / bw,
        (Algo::RecDoubling, _) => {
            let rounds = (nf.log2().ceil()) + if n.is_power_of_two() { 0.0 } else { 2.0 };
            rounds * (a + b / bw)
        }
    })
}

/// The fastest algorithm by the model, unless one is forced.
pub fn choose(coll: Coll, bytes: usize, n: usize, link: LinkModel, forced: Option<Algo>) -> Algo {
    if let Some(f) = forced.filter(|f| f.supports(coll)) {
        return f;
    }
    [Algo::Ring, Algo::RecDoubling]
        .into_iter()
        .filter_map(|a| predict(a, coll, bytes, n, link).map(|t| (a, t)))
        .min_by(|x, y| x.1.total_cmp(&y.1))
        .map(|(a, _)| a)
        .unwrap_or(Algo::Ring)
}

/// NCCL's cost table (`collCostTable`): estimated microseconds per
/// (algorithm, protocol), [`NCCL_ALGO_PROTO_IGNORE`] where unusable. What a
/// tuner plugin receives and may change; the cheapest usable entry wins.
pub type CostTable = [[f32; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS];

/// The row of NCCL's table that stands for one of our algorithms: ring is
/// ring; recursive doubling takes the tree row, NCCL's latency-bound choice.
pub fn nccl_row(algo: Algo) -> usize {
    match algo {
        Algo::Ring => NCCL_ALGO_RING as usize,
        Algo::RecDoubling => NCCL_ALGO_TREE as usize,
    }
}

/// The table from the model: only the SIMPLE protocol exists here, and a
/// forced algorithm (NCCL_ALGO) leaves only its own row, as NCCL masks the
/// table before its tuner sees it.
pub fn cost_table(
    coll: Coll,
    bytes: usize,
    n: usize,
    link: LinkModel,
    forced: Option<Algo>,
) -> CostTable {
    let mut t = [[NCCL_ALGO_PROTO_IGNORE; NCCL_NUM_PROTOCOLS]; NCCL_NUM_ALGORITHMS];
    let forced = forced.filter(|f| f.supports(coll));
    for a in [Algo::Ring, Algo::RecDoubling] {
        if forced.is_some_and(|f| f != a) {
            continue;
        }
        if let Some(s) = predict(a, coll, bytes, n, link) {
            t[nccl_row(a)][NCCL_PROTO_SIMPLE as usize] = (s * 1e6) as f32;
        }
    }
    if t.iter().flatten().all(|c| *c < 0.0) {
        // One rank, or nothing predicted: ring is always runnable.
        t[nccl_row(Algo::Ring)][NCCL_PROTO_SIMPLE as usize] = 0.0;
    }
    t
}

/// Whether the device kernels run `algo` for `coll` on `n` ranks: the ring
/// (chain) for everything; recursive doubling only as the one exchange of
/// a two-rank all-reduce, the shape proven on GPUs.
pub fn device_runs(algo: Algo, coll: Coll, n: usize) -> bool {
    match algo {
        Algo::Ring => true,
        Algo::RecDoubling => coll == Coll::AllReduce && n == 2,
    }
}

/// The cost table of the device path: the rows its kernels run for this
/// call (a tuner may pick only among those, as NCCL's tuners pick among
/// the entries NCCL marked usable), costed by the model over NVLink;
/// NCCL_ALGO leaves its own row where the device runs it.
pub fn device_table(coll: Coll, bytes: usize, n: usize, forced: Option<Algo>) -> CostTable {
    let forced = forced.filter(|f| device_runs(*f, coll, n));
    let mut t = cost_table(coll, bytes, n, LinkModel::NVLINK, forced);
    for a in [Algo::Ring, Algo::RecDoubling] {
        if !device_runs(a, coll, n) {
            t[nccl_row(a)] = [NCCL_ALGO_PROTO_IGNORE; NCCL_NUM_PROTOCOLS];
        }
    }
    t
}

/// The cheapest entry of rows we can run, as (algorithm, NCCL protocol).
/// Entries of rows we have no algorithm for are ignored even when a tuner
/// made them cheapest; any protocol of a row runs as SIMPLE.
pub fn pick(table: &CostTable, coll: Coll) -> Option<(Algo, usize)> {
    [Algo::Ring, Algo::RecDoubling]
        .into_iter()
        .filter(|a| a.supports(coll))
        .flat_map(|a| {
            table[nccl_row(a)]
                .iter()
                .enumerate()
                .filter(|(_, c)| **c >= 0.0)
                .map(move |(p, c)| (a, p, *c))
        })
        .min_by(|x, y| x.2.total_cmp(&y.2))
        .map(|(a, p, _)| (a, p))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let f = cost_table(Coll::AllReduce, 8, 8, l, Some(Algo::Ring));
        assert!(f[nccl_row(Algo::RecDoubling)].iter().all(|c| *c < 0.0));
    }

    /// The device runs recursive doubling only as a two-rank all-reduce,
    /// where it is the model's choice at every size; elsewhere only the
    /// ring is on offer, even when NCCL_ALGO asks for the other.
    #[test]
    fn device_table_offers_what_the_kernels_run() {
        let algo =
            |coll, bytes, n, forced| pick(&device_table(coll, bytes, n, forced), coll).unwrap().0;
        for bytes in [8, 1 << 20, 1 << 30] {
            assert_eq!(algo(Coll::AllReduce, bytes, 2, None), Algo::RecDoubling);
            assert_eq!(
                algo(Coll::AllReduce, bytes, 2, Some(Algo::Ring)),
                Algo::Ring
            );
            assert_eq!(algo(Coll::AllReduce, bytes, 4, None), Algo::Ring);
            assert_eq!(
                algo(Coll::AllReduce, bytes, 4, Some(Algo::RecDoubling)),
                Algo::Ring
            );
            assert_eq!(algo(Coll::AllGather, bytes, 2, None), Algo::Ring);
        }
        let t = device_table(Coll::AllReduce, 8, 4, None);
        assert!(t[nccl_row(Algo::RecDoubling)].iter().all(|c| *c < 0.0));
        // One rank: the ring, always runnable.
        assert_eq!(algo(Coll::AllReduce, 8, 1, None), Algo::Ring);
    }
}
