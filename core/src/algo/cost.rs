//! The cost model that picks an algorithm: time = latency + bytes / bandwidth
//! per algorithm, as NCCL's tuning tables (which a tuner plugin can replace).

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
}
