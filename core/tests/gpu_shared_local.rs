//! Ranks of one process that all share GPU 0 (nccl-tests' `-t N -g 1`
//! with every thread on one GPU, and `-g N` where one thread drives every
//! rank): every collective, in and out of place, against a host reference,
//! with the ranks as threads (one of them late) and with one thread calling
//! each rank in turn (no rank may wait on the host for a rank called after
//! it). Skips, saying why, without a GPU.

mod gpu_common;

use std::sync::Barrier;
use std::time::Duration;

use oxccl::algo::Coll;
use oxccl::cuda::{DeviceBuffer, Stream};
use oxccl::exec::device::{DeviceComm, DeviceConfig, LocalOob, Oob};
use oxccl::{DataType, RedOp};

const COUNTS: [usize; 3] = [1, 1000, (1 << 20) + 3];

/// Integers, so that any order of summing gives the same float.
fn val(r: usize, i: usize) -> f32 {
    ((r * 7 + i * 3) % 17) as f32 - 8.0
}

struct Rank {
    rank: usize,
    comm: DeviceComm,
    stream: Stream,
    a: DeviceBuffer,
    b: DeviceBuffer,
}

fn colls(n: usize) -> Vec<Coll> {
    vec![
        Coll::AllReduce,
        Coll::Broadcast { root: n - 1 },
        Coll::Reduce { root: 1 % n },
        Coll::AllGather,
        Coll::ReduceScatter,
    ]
}

fn floats(v: impl Iterator<Item = f32>) -> Vec<u8> {
    v.flat_map(f32::to_ne_bytes).collect()
}

impl Rank {
    fn new(oob: &LocalOob, n: usize) -> Rank {
        let comm = DeviceComm::new(oob, 0, DeviceConfig::from_env().unwrap()).unwrap();
        let ctx = comm.context().clone();
        comm.kernels().prepare(DataType::Float32).unwrap();
        let bytes = n * COUNTS[2] * 4;
        Rank {
            rank: oob.rank(),
            stream: Stream::new(&ctx).unwrap(),
            a: DeviceBuffer::alloc(&ctx, bytes).unwrap(),
            b: DeviceBuffer::alloc(&ctx, bytes).unwrap(),
            comm,
        }
    }

    /// Poisons both buffers and writes this rank's input where `coll`
    /// reads it.
    fn prepare(&self, coll: Coll, count: usize, n: usize, in_place: bool) {
        self.a.fill_bytes(0xff).unwrap();
        self.b.fill_bytes(0xff).unwrap();
        let r = self.rank;
        let (at, len) = match coll {
            Coll::ReduceScatter => (0, n * count),
            Coll::AllGather if in_place => (r * count, count),
            _ => (0, count),
        };
        let input = floats((0..len).map(|i| val(r, i)));
        self.a.write(at * 4, &input).unwrap();
    }

    /// (send, recv) as NCCL lays them out.
    fn bufs(&self, coll: Coll, count: usize, in_place: bool) -> (u64, u64) {
        let (a, b) = (self.a.ptr(), self.b.ptr());
        let mine = (self.rank * count * 4) as u64;
        match (coll, in_place) {
            (_, false) => (a, b),
            (Coll::AllGather, true) => (a + mine, a),
            (Coll::ReduceScatter, true) => (a, a + mine),
            (_, true) => (a, a),
        }
    }

    fn issue(&mut self, coll: Coll, count: usize, in_place: bool) {
        let (send, recv) = self.bufs(coll, count, in_place);
        let s = self.stream.handle();
        let (f, sum) = (DataType::Float32, RedOp::Sum);
        self.comm
            .collective(coll, None, send, recv, count, f, sum, s)
            .unwrap_or_else(|e| panic!("rank {} {coll:?} of {count}: {e}", self.rank));
    }

    /// Wrong elements of this rank's output.
    fn wrong(&self, coll: Coll, count: usize, n: usize, in_place: bool) -> usize {
        self.stream.synchronize().unwrap();
        let r = self.rank;
        let sum = |i: usize| (0..n).map(|q| val(q, i)).sum::<f32>();
        let (len, want): (usize, Box<dyn Fn(usize) -> f32>) = match coll {
            Coll::AllReduce => (count, Box::new(sum)),
            Coll::Broadcast { root } => (count, Box::new(move |i| val(root, i))),
            Coll::Reduce { root } if root == r => (count, Box::new(sum)),
            Coll::Reduce { .. } => return 0,
            Coll::AllGather => (n * count, Box::new(move |i| val(i / count, i % count))),
            Coll::ReduceScatter => (count, Box::new(move |i| sum(r * count + i))),
        };
        let (_, recv) = self.bufs(coll, count, in_place);
        let buf = if in_place { &self.a } else { &self.b };
        let off = (recv - buf.ptr()) as usize;
        let mut got = vec![0u8; len * 4];
        buf.read(off, &mut got).unwrap();
        let got: Vec<f32> = got
            .chunks(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        let wrong = (0..len).filter(|&i| got[i] != want(i)).count();
        if wrong > 0 {
            let i = (0..len).find(|&i| got[i] != want(i)).unwrap();
            println!(
                "rank {r} {coll:?} of {count} in place {in_place}: {wrong} wrong, first [{i}] {} want {}",
                got[i],
                want(i)
            );
        }
        wrong
    }
}

/// `body` on `n` ranks, each in its own thread with a barrier they
/// share; the sum of what they return (wrong elements).
fn on_threads(n: usize, body: impl Fn(&mut Rank, &Barrier) -> usize + Sync) -> usize {
    let oobs = LocalOob::group(n);
    let barrier = Barrier::new(n);
    std::thread::scope(|s| {
        let hs: Vec<_> = oobs
            .iter()
            .map(|oob| {
                let (barrier, body) = (&barrier, &body);
                s.spawn(move || body(&mut Rank::new(oob, n), barrier))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

/// Every collective on `n` ranks, each rank in its own thread, rank 1
/// calling each a while after the others.
fn threads(n: usize) -> usize {
    on_threads(n, |r, barrier| {
        let mut wrong = 0;
        for count in COUNTS {
            for coll in colls(n) {
                for in_place in [false, true] {
                    r.prepare(coll, count, n, in_place);
                    r.stream.synchronize().unwrap();
                    barrier.wait();
                    if r.rank == 1 {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    r.issue(coll, count, in_place);
                    wrong += r.wrong(coll, count, n, in_place);
                }
            }
        }
        wrong
    })
}

/// The same with one thread calling every rank in turn, in a different
/// order each time (rank 0 first, then last), as nccl-tests' `-g N` does
/// inside one group.
fn one_thread(n: usize) -> usize {
    let oobs = LocalOob::group(n);
    let mut ranks: Vec<Rank> = std::thread::scope(|s| {
        let hs: Vec<_> = oobs
            .iter()
            .map(|oob| s.spawn(move || Rank::new(oob, n)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut wrong = 0;
    for (k, count) in COUNTS.into_iter().enumerate() {
        for coll in colls(n) {
            for in_place in [false, true] {
                for r in &ranks {
                    r.prepare(coll, count, n, in_place);
                    r.stream.synchronize().unwrap();
                }
                let order: Vec<usize> = if k % 2 == 0 {
                    (0..n).collect()
                } else {
                    (0..n).rev().collect()
                };
                for &i in &order {
                    ranks[i].issue(coll, count, in_place);
                }
                for r in &ranks {
                    wrong += r.wrong(coll, count, n, in_place);
                }
            }
        }
    }
    // Several calls of one rank before the others' first: each rank's
    // calls are numbered, so the last rank to come to each runs it.
    for r in &ranks {
        r.prepare(Coll::AllReduce, 1000, n, false);
        r.stream.synchronize().unwrap();
    }
    for r in ranks.iter_mut() {
        r.issue(Coll::AllReduce, 1000, false);
        r.issue(Coll::AllReduce, 1000, false);
    }
    for r in &ranks {
        wrong += r.wrong(Coll::AllReduce, 1000, n, false);
    }
    wrong
}

#[test]
fn ranks_of_one_process_on_one_gpu_as_threads() {
    let Some(_gpu) = gpu_common::gpus(1) else {
        return;
    };
    for n in [2, 4] {
        let w = threads(n);
        println!("{n} ranks as threads on GPU 0: {w} wrong");
        assert_eq!(w, 0);
    }
}

#[test]
fn ranks_of_one_process_on_one_gpu_from_one_thread() {
    let Some(_gpu) = gpu_common::gpus(1) else {
        return;
    };
    for n in [2, 3] {
        let w = one_thread(n);
        println!("{n} ranks from one thread on GPU 0: {w} wrong");
        assert_eq!(w, 0);
    }
}

/// A caller may destroy a stream once its work is done and use a new one
/// for the next call (a framework's per-call streams): the communicator
/// must not touch the old stream again. (It recorded its ordering event
/// on the previous call's stream at the next call, a use of a destroyed
/// stream that crashed in the driver.) Two ranks as threads, each call on
/// a fresh stream, the one before destroyed.
#[test]
fn a_destroyed_stream_is_never_used_again() {
    let Some(_gpu) = gpu_common::gpus(1) else {
        return;
    };
    let n = 2;
    let wrong = on_threads(n, |r, barrier| {
        let mut wrong = 0;
        for it in 0..10 {
            let coll = colls(n)[it % 5];
            r.prepare(coll, 1000, n, false);
            r.stream = Stream::new(r.comm.context()).unwrap();
            barrier.wait();
            r.issue(coll, 1000, false);
            wrong += r.wrong(coll, 1000, n, false);
        }
        wrong
    });
    println!("10 calls, each on a new stream: {wrong} wrong");
    assert_eq!(wrong, 0);
}
