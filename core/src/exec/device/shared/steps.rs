//! What the leader does for one collective of the ranks sharing its GPU: a
//! list of copies and two-input reductions over every rank's buffers, all
//! mapped into the leader's process. Apart from the GPU so that the order,
//! which matters when a rank's buffers overlap (in place), is tested on
//! the host.

use crate::algo::Coll;
use crate::cuda::abi::{F_POST, F_PRE_A, F_PRE_B, LOCAL_MAX};

/// One launch of the local reduce kernel: every output gets the inputs
/// reduced, or, with one input, a copy of it. `flags` says which of the
/// op's pre and post steps apply, as [`KernelSet::reduce`] reads them.
///
/// [`KernelSet::reduce`]: crate::cuda::KernelSet::reduce
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Step {
    pub outputs: Vec<u64>,
    pub inputs: Vec<u64>,
    pub flags: u32,
}

/// A rank's buffers as the leader addresses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bufs {
    pub send: u64,
    pub recv: u64,
}

/// Which of a rank's buffers `coll` reads or writes: (send, recv).
pub(crate) fn used(coll: Coll, rank: usize) -> (bool, bool) {
    match coll {
        Coll::Broadcast { root } | Coll::Reduce { root } if rank == root => (true, true),
        Coll::Broadcast { .. } => (false, true),
        Coll::Reduce { .. } => (true, false),
        _ => (true, true),
    }
}

/// `outputs[0]` and every other output = op over `inputs`, read first
/// to last: the first input may be `outputs[0]` (in place); the other
/// outputs are written after every input is read. More than `LOCAL_MAX`
/// of either take several launches, each continuing from `outputs[0]`.
fn reduce_into(out: &mut Vec<Step>, outputs: &[u64], inputs: &[u64]) {
    let dst = outputs[0];
    let mut rest = &inputs[1..];
    let mut first = vec![inputs[0]];
    let mut flags = F_PRE_A | F_PRE_B;
    loop {
        let take = rest.len().min(LOCAL_MAX - first.len());
        first.extend_from_slice(&rest[..take]);
        rest = &rest[take..];
        if rest.is_empty() {
            out.push(Step {
                outputs: outputs[..outputs.len().min(LOCAL_MAX)].to_vec(),
                inputs: first,
                flags: flags | F_POST,
            });
            break;
        }
        out.push(Step {
            outputs: vec![dst],
            inputs: first,
            flags,
        });
        first = vec![dst];
        flags = F_PRE_B;
    }
    copy(out, dst, &outputs[outputs.len().min(LOCAL_MAX)..]);
}

/// `src` into every one of `outputs` but itself.
fn copy(out: &mut Vec<Step>, src: u64, outputs: &[u64]) {
    let outputs: Vec<u64> = outputs.iter().copied().filter(|&o| o != src).collect();
    for chunk in outputs.chunks(LOCAL_MAX) {
        out.push(Step {
            outputs: chunk.to_vec(),
            inputs: vec![src],
            flags: 0,
        });
    }
}

/// The steps of `coll` over `count` elements of `es` bytes, for ranks whose
/// buffers are `bufs` (at least two ranks); `leader` owns the result that
/// the all-reduce copies out.
pub(crate) fn steps(
    coll: Coll,
    bufs: &[Bufs],
    count: usize,
    es: usize,
    leader: usize,
) -> Vec<Step> {
    let n = bufs.len();
    let bytes = count * es;
    let mut out = Vec::new();
    if count == 0 {
        return out;
    }
    // Rank `first`'s send (or receive) buffer, then everyone else's, `at`
    // bytes in.
    let order = |first: usize, at: usize, recv: bool| -> Vec<u64> {
        std::iter::once(first)
            .chain((0..n).filter(|&r| r != first))
            .map(|r| if recv { bufs[r].recv } else { bufs[r].send } + at as u64)
            .collect()
    };
    let inputs = |first, at| order(first, at, false);
    let recvs = |first, at| order(first, at, true);
    match coll {
        Coll::AllReduce => reduce_into(&mut out, &recvs(leader, 0), &inputs(leader, 0)),
        Coll::Broadcast { root } => copy(&mut out, bufs[root].send, &recvs(root, 0)),
        Coll::Reduce { root } => reduce_into(&mut out, &[bufs[root].recv], &inputs(root, 0)),
        Coll::AllGather => {
            for (r, b) in bufs.iter().enumerate() {
                copy(&mut out, b.send, &recvs(r, r * bytes));
            }
        }
        Coll::ReduceScatter => {
            for (q, b) in bufs.iter().enumerate() {
                reduce_into(&mut out, &[b.recv], &inputs(q, q * bytes));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Host memory with device-like addresses: each rank's buffers in its
    /// own region, 8-byte elements.
    struct Mem {
        regions: BTreeMap<u64, Vec<f64>>,
    }

    impl Mem {
        fn slot(&mut self, addr: u64) -> &mut f64 {
            let (&base, v) = self.regions.range_mut(..=addr).next_back().unwrap();
            &mut v[((addr - base) / 8) as usize]
        }
        fn get(&mut self, addr: u64) -> f64 {
            *self.slot(addr)
        }
        /// Runs the steps as the GPU would, pass by pass (each pass over
        /// every element before the next, as each block does over its
        /// range); the op is a sum, the post step a division by `n`.
        fn run(&mut self, steps: &[Step], count: usize, n: usize, avg: bool) {
            let at = |p: u64, i: usize| p + 8 * i as u64;
            for s in steps {
                let (dst, src) = (s.outputs[0], s.inputs[0]);
                let mut outs = &s.outputs[..];
                if s.inputs.len() > 1 {
                    let last = s.inputs.len() - 1;
                    for k in 1..=last {
                        let a = if k == 1 { src } else { dst };
                        for i in 0..count {
                            let mut v = self.get(at(a, i)) + self.get(at(s.inputs[k], i));
                            if avg && k == last && s.flags & F_POST != 0 {
                                v /= n as f64;
                            }
                            *self.slot(at(dst, i)) = v;
                            if k == last && s.outputs.len() > 1 {
                                *self.slot(at(s.outputs[1], i)) = v;
                            }
                        }
                    }
                    outs = &s.outputs[s.outputs.len().min(2)..];
                }
                let from = if s.inputs.len() > 1 { dst } else { src };
                for &o in outs {
                    for i in 0..count {
                        let v = self.get(at(from, i));
                        *self.slot(at(o, i)) = v;
                    }
                }
            }
        }
    }

    fn check(coll: Coll, n: usize, count: usize, in_place: bool, avg: bool) {
        let big = n * count;
        let mut mem = Mem {
            regions: BTreeMap::new(),
        };
        let mut bufs = Vec::new();
        let mut inputs = Vec::new();
        for r in 0..n {
            let region = 1u64 << 40 | (r as u64) << 32;
            let (sl, rl) = match coll {
                Coll::AllGather => (count, big),
                Coll::ReduceScatter => (big, count),
                _ => (count, count),
            };
            let input: Vec<f64> = (0..sl).map(|i| (r * 1000 + i * 7 % 13) as f64).collect();
            inputs.push(input.clone());
            let b = if in_place {
                // One buffer in NCCL's in-place layout for the collective.
                let mut v = vec![-1.0; sl.max(rl)];
                let at = if coll == Coll::AllGather {
                    r * count
                } else {
                    0
                };
                v[at..at + sl].copy_from_slice(&input);
                mem.regions.insert(region, v);
                let mine = region + 8 * (r * count) as u64;
                match coll {
                    Coll::AllGather => Bufs {
                        send: mine,
                        recv: region,
                    },
                    Coll::ReduceScatter => Bufs {
                        send: region,
                        recv: mine,
                    },
                    _ => Bufs {
                        send: region,
                        recv: region,
                    },
                }
            } else {
                mem.regions.insert(region, input);
                mem.regions.insert(region + (1 << 30), vec![-1.0; rl]);
                Bufs {
                    send: region,
                    recv: region + (1 << 30),
                }
            };
            bufs.push(b);
        }
        mem.run(&steps(coll, &bufs, count, 8, 0), count, n, avg);
        let div = if avg { n as f64 } else { 1.0 };
        let sum = |i: usize| inputs.iter().map(|x| x[i]).sum::<f64>() / div;
        let what = format!("{coll:?} n {n} in place {in_place} avg {avg}");
        let inp = &inputs;
        for (r, b) in bufs.iter().enumerate() {
            let (len, want): (usize, Box<dyn Fn(usize) -> f64>) = match coll {
                Coll::AllReduce => (count, Box::new(sum)),
                Coll::Broadcast { root } => (count, Box::new(move |i| inp[root][i])),
                Coll::Reduce { root } if r == root => (count, Box::new(sum)),
                Coll::Reduce { .. } => (0, Box::new(sum)),
                Coll::AllGather => (big, Box::new(move |i| inp[i / count][i % count])),
                Coll::ReduceScatter => (count, Box::new(move |i| sum(r * count + i))),
            };
            for i in 0..len {
                assert_eq!(
                    mem.get(b.recv + 8 * i as u64),
                    want(i),
                    "{what}: rank {r} [{i}]"
                );
            }
        }
    }

    #[test]
    fn every_collective_in_and_out_of_place() {
        for n in [2, 3, 4, 5, 8, 9, 17] {
            for root in [0, n - 1] {
                let colls = [
                    Coll::AllReduce,
                    Coll::Broadcast { root },
                    Coll::Reduce { root },
                    Coll::AllGather,
                    Coll::ReduceScatter,
                ];
                for coll in colls {
                    for in_place in [false, true] {
                        for avg in [false, true] {
                            check(coll, n, 5, in_place, avg);
                        }
                    }
                }
            }
        }
    }
}
