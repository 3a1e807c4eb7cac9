//! What the leader does for one collective of the ranks sharing its GPU: a
//! list of copies and two-input reductions over every rank's buffers, all
//! mapped into the leader's process. Apart from the GPU so that the order,
//! which matters when a rank's buffers overlap (in place), is tested on
//! the host.

use crate::algo::Coll;
use crate::cuda::abi::{F_POST, F_PRE_A, F_PRE_B};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// `bytes` from `src` to `dst` (a copy engine).
    Copy { dst: u64, src: u64, bytes: usize },
    /// `dst = a op b` over `n` elements, with the pre and post steps of the
    /// op that `flags` names, and a copy into `dst2` unless it is 0 (a
    /// kernel).
    Reduce {
        dst: u64,
        dst2: u64,
        a: u64,
        b: u64,
        n: usize,
        flags: u32,
    },
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

/// `dst = op over inputs`, and the result into `dst2` too unless it is 0.
/// The first input is read first: it may be `dst` itself (in place), which
/// the later reductions no longer read.
fn reduce_into(out: &mut Vec<Step>, dst: u64, dst2: u64, inputs: &[u64], n: usize) {
    let last = inputs.len() - 1;
    for (k, &b) in inputs.iter().enumerate().skip(1) {
        let (a, mut flags) = if k == 1 {
            (inputs[0], F_PRE_A | F_PRE_B)
        } else {
            (dst, F_PRE_B)
        };
        if k == last {
            flags |= F_POST;
        }
        out.push(Step::Reduce {
            dst,
            dst2: if k == last { dst2 } else { 0 },
            a,
            b,
            n,
            flags,
        });
    }
}

fn copy(out: &mut Vec<Step>, dst: u64, src: u64, bytes: usize) {
    if dst != src {
        out.push(Step::Copy { dst, src, bytes });
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
    // Rank `first`'s input, then everyone else's, at `at` bytes in.
    let inputs = |first: usize, at: usize| -> Vec<u64> {
        std::iter::once(first)
            .chain((0..n).filter(|&r| r != first))
            .map(|r| bufs[r].send + at as u64)
            .collect()
    };
    match coll {
        Coll::AllReduce => {
            // The last reduction also writes one other rank's output (one
            // launch for two ranks); copies serve the rest.
            let dst = bufs[leader].recv;
            let mut others = (0..n).filter(|&r| r != leader).map(|r| bufs[r].recv);
            let dst2 = others.next().unwrap_or(0);
            reduce_into(&mut out, dst, dst2, &inputs(leader, 0), count);
            for recv in others {
                copy(&mut out, recv, dst, bytes);
            }
        }
        Coll::Broadcast { root } => {
            for b in bufs {
                copy(&mut out, b.recv, bufs[root].send, bytes);
            }
        }
        Coll::Reduce { root } => reduce_into(&mut out, bufs[root].recv, 0, &inputs(root, 0), count),
        Coll::AllGather => {
            for q in bufs {
                for (r, b) in bufs.iter().enumerate() {
                    copy(&mut out, q.recv + (r * bytes) as u64, b.send, bytes);
                }
            }
        }
        Coll::ReduceScatter => {
            for (q, b) in bufs.iter().enumerate() {
                reduce_into(&mut out, b.recv, 0, &inputs(q, q * bytes), count);
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
        /// Runs the steps as the GPU would, one after another; the op is a
        /// sum, the post step a division by `n` (an average).
        fn run(&mut self, steps: &[Step], n: usize, avg: bool) {
            for s in steps {
                match *s {
                    Step::Copy { dst, src, bytes } => {
                        let vals: Vec<f64> = (0..bytes as u64 / 8)
                            .map(|i| self.get(src + 8 * i))
                            .collect();
                        for (i, v) in vals.into_iter().enumerate() {
                            *self.slot(dst + 8 * i as u64) = v;
                        }
                    }
                    Step::Reduce {
                        dst,
                        dst2,
                        a,
                        b,
                        n: len,
                        flags,
                    } => {
                        for i in 0..len as u64 {
                            let mut v = self.get(a + 8 * i) + self.get(b + 8 * i);
                            if avg && flags & F_POST != 0 {
                                v /= n as f64;
                            }
                            *self.slot(dst + 8 * i) = v;
                            if dst2 != 0 {
                                *self.slot(dst2 + 8 * i) = v;
                            }
                        }
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
        mem.run(&steps(coll, &bufs, count, 8, 0), n, avg);
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
        for n in 2..=5 {
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
