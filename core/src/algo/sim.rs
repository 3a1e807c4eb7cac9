//! Runs every rank's schedule in memory, with FIFO channels between ranks,
//! to check schedules without sockets: results, and that each input is
//! scaled exactly once and each result finalized exactly once.

use std::collections::{HashMap, VecDeque};

use super::{schedule_on, Algo, Buf, Coll, Region, Step};

/// A value: the running sum, and whether post-processing was applied.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct V(f64, bool);

fn combine(a: V, b: V) -> V {
    assert!(!a.1 && !b.1, "combined a finalized value");
    V(a.0 + b.0, false)
}

struct Rank {
    input: Vec<V>,
    output: Vec<Option<V>>,
    scratch: Vec<Option<V>>,
    pc: usize,
    steps: Vec<Step>,
    sent_local: bool,
}

fn read(r: &Rank, reg: Region, i: usize, reducing: bool) -> V {
    match reg.buf {
        // The input enters a reduction scaled by 2 (the pre-multiplied sum).
        Buf::Input => {
            let v = r.input[reg.offset + i];
            if reducing {
                V(v.0 * 2.0, false)
            } else {
                v
            }
        }
        Buf::Output => r.output[reg.offset + i].expect("read an output element never written"),
        Buf::Scratch => r.scratch[reg.offset + i].expect("read a scratch element never written"),
    }
}

/// Runs all ranks; returns every rank's output. `join` as
/// [`schedule_on`] takes it (the simulator runs each step whole, so any
/// value is safe here).
pub(crate) fn run(
    algo: Algo,
    coll: Coll,
    n: usize,
    count: usize,
    nch: usize,
    join: usize,
) -> Vec<Vec<Option<V>>> {
    let reducing = matches!(
        coll,
        Coll::AllReduce | Coll::Reduce { .. } | Coll::ReduceScatter
    );
    let (in_len, out_len) = match coll {
        Coll::AllGather => (count, n * count),
        Coll::ReduceScatter => (n * count, count),
        _ => (count, count),
    };
    let mut out_all = vec![vec![None; out_len]; n];
    // A ring order other than rank order, as ranks grouped by host make.
    let order: Vec<usize> = (0..n).map(|i| (i * 5 + 3) % n).collect();
    let order = if order.iter().collect::<std::collections::HashSet<_>>().len() == n {
        order
    } else {
        (0..n).rev().collect()
    };
    for ch in 0..nch {
        let (lo, hi) = super::split(0, count, nch, ch);
        let mut ranks: Vec<Rank> = (0..n)
            .map(|r| Rank {
                input: (0..in_len)
                    .map(|i| V((r * 1000 + i + 1) as f64, false))
                    .collect(),
                output: out_all[r].clone(),
                // Poisoned: every read of it must follow a write.
                scratch: vec![None; super::pat::scratch_blocks(n) * count],
                pc: 0,
                steps: schedule_on(algo, coll, r, &order, ch, count, lo, hi, join),
                sent_local: false,
            })
            .collect();
        let mut wires: HashMap<(usize, usize), VecDeque<Vec<V>>> = HashMap::new();
        loop {
            let mut progressed = false;
            #[allow(
                clippy::needless_range_loop,
                reason = "r is also the rank number on the wire"
            )]
            for r in 0..n {
                let rk = &mut ranks[r];
                let Some(st) = rk.steps.get(rk.pc).copied() else {
                    continue;
                };
                let local = |rk: &Rank| {
                    st.src.map(|s| {
                        (0..st.count)
                            .map(|i| read(rk, s, i, reducing))
                            .collect::<Vec<_>>()
                    })
                };
                if st.send_local && !rk.sent_local {
                    let l = local(rk).expect("send_local without src");
                    wires.entry((r, st.send.unwrap())).or_default().push_back(l);
                    rk.sent_local = true;
                    progressed = true;
                }
                let received = match st.recv {
                    Some(p) => match wires.get_mut(&(p, r)).and_then(|q| q.pop_front()) {
                        Some(m) => Some(m),
                        None => continue,
                    },
                    None => None,
                };
                if let Some(m) = &received {
                    assert_eq!(m.len(), st.count, "message size");
                }
                let loc = local(rk);
                let mut result: Vec<V> = match (&loc, &received) {
                    (Some(l), Some(m)) => l.iter().zip(m).map(|(a, b)| combine(*a, *b)).collect(),
                    (None, Some(m)) => m.clone(),
                    (Some(l), None) => l.clone(),
                    (None, None) => panic!("step with no data"),
                };
                if st.finalize {
                    for v in &mut result {
                        assert!(!v.1, "finalized twice");
                        v.1 = true;
                    }
                }
                if let Some(d) = st.dst {
                    let to = match d.buf {
                        Buf::Output => &mut rk.output,
                        Buf::Scratch => &mut rk.scratch,
                        Buf::Input => panic!("a step writes the input"),
                    };
                    for (i, v) in result.iter().enumerate() {
                        to[d.offset + i] = Some(*v);
                    }
                }
                if let Some(p) = st.send {
                    if !st.send_local {
                        wires.entry((r, p)).or_default().push_back(result);
                    }
                }
                rk.pc += 1;
                rk.sent_local = false;
                progressed = true;
            }
            if ranks.iter().all(|r| r.pc == r.steps.len()) {
                break;
            }
            assert!(
                progressed,
                "deadlock: {:?}",
                ranks.iter().map(|r| r.pc).collect::<Vec<_>>()
            );
        }
        assert!(
            wires.values().all(|q| q.is_empty()),
            "messages left unreceived"
        );
        for (r, rk) in ranks.into_iter().enumerate() {
            out_all[r] = rk.output;
        }
    }
    out_all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(r: usize, i: usize) -> f64 {
        (r * 1000 + i + 1) as f64
    }

    fn check(algo: Algo, coll: Coll, n: usize, count: usize, nch: usize) {
        check_joined(algo, coll, n, count, nch, 0);
    }

    fn check_joined(algo: Algo, coll: Coll, n: usize, count: usize, nch: usize, join: usize) {
        let out = run(algo, coll, n, count, nch, join);
        let red = |i: usize| V((0..n).map(|r| 2.0 * x(r, i)).sum(), true);
        for (r, o) in out.iter().enumerate() {
            let want: Vec<Option<V>> = match coll {
                Coll::AllReduce => (0..count).map(|i| Some(red(i))).collect(),
                Coll::AllGather => (0..n * count)
                    .map(|i| Some(V(x(i / count, i % count), n == 1)))
                    .collect(),
                Coll::ReduceScatter => (0..count).map(|i| Some(red(r * count + i))).collect(),
                Coll::Broadcast { root } => {
                    (0..count).map(|i| Some(V(x(root, i), n == 1))).collect()
                }
                Coll::Reduce { root } if r == root => (0..count).map(|i| Some(red(i))).collect(),
                Coll::Reduce { .. } => vec![None; count],
            };
            // One rank: the executor's local step applies the pre-scaling of reductions too.
            let want = if n == 1 && !matches!(coll, Coll::AllGather | Coll::Broadcast { .. }) {
                (0..want.len())
                    .map(|i| Some(V(2.0 * x(0, i), true)))
                    .collect()
            } else {
                want
            };
            assert_eq!(
                o, &want,
                "{algo:?} {coll:?} n={n} count={count} nch={nch} rank {r}"
            );
        }
    }

    #[test]
    fn every_schedule_on_many_shapes() {
        for n in 1..=9 {
            for count in [0, 1, 2, 7, 13, 64] {
                for nch in [1, 3] {
                    check(Algo::Ring, Coll::AllReduce, n, count, nch);
                    check(Algo::RecDoubling, Coll::AllReduce, n, count, nch);
                    check(Algo::Tree, Coll::AllReduce, n, count, nch);
                    check(Algo::Ring, Coll::AllGather, n, count, nch);
                    check(Algo::Pat, Coll::AllGather, n, count, nch);
                    check(Algo::Ring, Coll::ReduceScatter, n, count, nch);
                    check(Algo::Pat, Coll::ReduceScatter, n, count, nch);
                    check_joined(Algo::Pat, Coll::ReduceScatter, n, count, nch, 1 << 20);
                    for root in [0, n / 2, n - 1] {
                        check(Algo::Ring, Coll::Broadcast { root }, n, count, nch);
                        check(Algo::Ring, Coll::Reduce { root }, n, count, nch);
                    }
                }
            }
        }
    }

    /// PAT's all-gather and reduce-scatter on every rank count from 2 to
    /// 64, whole blocks (one step per run of blocks; the reduce-scatter
    /// joined without bound, in runs of two blocks and block by block)
    /// and parts of blocks (one step per block).
    #[test]
    fn pat_on_every_count_to_64() {
        for n in 2..=64 {
            check(Algo::Pat, Coll::AllGather, n, 3, 1);
            check(Algo::Pat, Coll::AllGather, n, 5, 2);
            for join in [0, 6, usize::MAX] {
                check_joined(Algo::Pat, Coll::ReduceScatter, n, 3, 1, join);
            }
            check(Algo::Pat, Coll::ReduceScatter, n, 5, 2);
        }
    }

    /// At 1,024 ranks, simulated without running them: the ring, the
    /// double binary tree and PAT, and what the cost model chooses on a
    /// cluster of that size (128 nodes of 8 ranks; 1,024 nodes of one) at
    /// a small, a mid and a large size; every rank's every element checked
    /// (the sum of the right inputs, scaled and finalized once).
    #[test]
    fn at_1024_ranks() {
        use super::super::cost::{choose, Fabric, LinkModel};
        let n = 1024;
        check(Algo::Ring, Coll::AllGather, n, 1, 1);
        check(Algo::Ring, Coll::AllReduce, n, 2, 1);
        check(Algo::Tree, Coll::AllReduce, n, 4, 2);
        check(Algo::Pat, Coll::AllGather, n, 1, 1);
        check(Algo::Pat, Coll::AllGather, n, 3, 2);
        check_joined(Algo::Pat, Coll::ReduceScatter, n, 1, 1, usize::MAX);
        check(Algo::Pat, Coll::ReduceScatter, n, 3, 2);
        let net = LinkModel {
            latency_s: 5e-6,
            bandwidth: 50e9,
        };
        let mut seen = std::collections::HashSet::new();
        for (nodes, intra) in [(128, LinkModel::NVLINK), (1024, net)] {
            let f = Fabric {
                intra,
                inter: net,
                nodes,
            };
            for coll in [Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter] {
                for bytes in [8, 64 << 10, 64 << 20] {
                    let a = choose(coll, bytes, n, f, None);
                    seen.insert(a);
                    check(a, coll, n, 2, if a == Algo::Tree { 2 } else { 1 });
                }
            }
        }
        // One rank per node: small all-gathers take PAT; at 128 x 8 mid
        // all-reduces take the tree.
        assert!(
            seen.contains(&Algo::Pat) && seen.contains(&Algo::Tree),
            "{seen:?}"
        );
    }
}
