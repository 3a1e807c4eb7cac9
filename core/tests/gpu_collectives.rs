//! Every collective on two GPUs (ranks as threads of this process), for
//! several datatypes and ops, in and out of place, at counts 0, 1, small
//! odd, 1_000_003 and 64M: outputs are poisoned first and checked against a
//! reference computed on the host in f64 from the same inputs.

mod gpu_common;

use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex};

use gpu_common::{inputs, two_ranks, value, with_ranks, Rank, NRANKS};
use oxccl::cuda::DeviceBuffer;
use oxccl::exec::device::DeviceConfig;
use oxccl::{DataType, RedOp};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    AllReduce,
    Broadcast(usize),
    Reduce(usize),
    AllGather,
    ReduceScatter,
}

impl Kind {
    fn reduces(self) -> bool {
        matches!(
            self,
            Kind::AllReduce | Kind::Reduce(_) | Kind::ReduceScatter
        )
    }

    /// Elements of input and output per rank.
    fn sizes(self, count: usize) -> (usize, usize) {
        match self {
            Kind::AllGather => (count, NRANKS * count),
            Kind::ReduceScatter => (NRANKS * count, count),
            _ => (count, count),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Case {
    id: usize,
    kind: Kind,
    dtype: DataType,
    op: RedOp,
    in_place: bool,
    count: usize,
}

const LARGE: usize = 64 << 20;

fn cases() -> Vec<Case> {
    let kinds = [
        Kind::AllReduce,
        Kind::Broadcast(0),
        Kind::Reduce(1),
        Kind::AllGather,
        Kind::ReduceScatter,
    ];
    let dtypes = [
        DataType::Float32,
        DataType::Float16,
        DataType::Bfloat16,
        DataType::Int32,
        DataType::Float8e4m3,
    ];
    let mut v = Vec::new();
    let mut push = |kind, dtype, op, in_place, count| {
        let id = v.len();
        v.push(Case {
            id,
            kind,
            dtype,
            op,
            in_place,
            count,
        })
    };
    for dtype in dtypes {
        let premul = RedOp::PreMulSum(if dtype.is_float() { 0.3 } else { 3.0 });
        for kind in kinds {
            let ops = if kind.reduces() {
                vec![RedOp::Sum, RedOp::Max, RedOp::Avg, premul]
            } else {
                vec![RedOp::Sum]
            };
            for op in ops {
                for in_place in [false, true] {
                    for count in [0, 1, 7, 1_000_003] {
                        push(kind, dtype, op, in_place, count);
                    }
                }
            }
        }
    }
    for kind in kinds {
        for in_place in [false, true] {
            push(kind, DataType::Float32, RedOp::Sum, in_place, LARGE);
        }
    }
    push(
        Kind::AllReduce,
        DataType::Bfloat16,
        RedOp::Avg,
        false,
        LARGE,
    );
    push(
        Kind::ReduceScatter,
        DataType::Float16,
        RedOp::Sum,
        true,
        LARGE,
    );
    v
}

/// Relative tolerance (of the sum of the magnitudes of the terms) and the
/// absolute floor, from each type's rounding unit and the two or three
/// roundings on the way.
fn tolerance(dtype: DataType) -> (f64, f64) {
    match dtype {
        DataType::Float32 => (1e-6, 1e-37),
        DataType::Float64 => (1e-14, 1e-300),
        DataType::Float16 => (2e-3, 1e-7),
        DataType::Bfloat16 => (1.6e-2, 1e-37),
        DataType::Float8e4m3 => (0.25, 1.0 / 512.0),
        DataType::Float8e5m2 => (0.5, 1.0 / 65536.0),
        _ => (0.0, 0.0),
    }
}

/// The reduction of `terms` in f64, as the op defines it, and the sum of
/// the magnitudes it tolerates error against.
fn reference(dtype: DataType, op: RedOp, terms: &[f64]) -> (f64, f64) {
    let n = terms.len() as f64;
    let int = !dtype.is_float();
    let scaled: Vec<f64> = match op {
        RedOp::PreMulSum(s) if int => terms.iter().map(|x| x * s.trunc()).collect(),
        RedOp::PreMulSum(s) => terms.iter().map(|x| x * s).collect(),
        RedOp::Avg if !int => terms.iter().map(|x| x / n).collect(),
        _ => terms.to_vec(),
    };
    let mag = scaled.iter().map(|x| x.abs()).sum();
    let v = match op {
        RedOp::Max => scaled.iter().cloned().fold(f64::MIN, f64::max),
        RedOp::Min => scaled.iter().cloned().fold(f64::MAX, f64::min),
        RedOp::Prod => scaled.iter().product(),
        RedOp::Avg if int => (scaled.iter().sum::<f64>() / n).trunc(),
        _ => scaled.iter().sum(),
    };
    (v, mag)
}

fn poison_byte(dtype: DataType) -> u8 {
    // NaN in every float type; for integers a value no result can take.
    if dtype.is_float() {
        0xff
    } else {
        0xa5
    }
}

struct Buffers {
    input: DeviceBuffer,
    output: DeviceBuffer,
}

/// Inputs of every rank for the case in progress, shared by the threads.
type Shared = Mutex<HashMap<(usize, usize), Arc<Vec<u8>>>>;

/// Runs one case on this rank; returns (elements checked, wrong).
fn run_case(
    r: &mut Rank,
    b: &Buffers,
    c: &Case,
    shared: &Shared,
    barrier: &Barrier,
) -> (usize, usize) {
    let es = c.dtype.size();
    let (n_in, n_out) = c.kind.sizes(c.count);
    let mine = Arc::new(inputs(c.dtype, (c.id * NRANKS + r.rank) as u64 + 1, n_in));
    shared.lock().unwrap().insert((c.id, r.rank), mine.clone());
    // Out of place: the input buffer holds the input. In place: the output
    // buffer holds it where NCCL's rule puts it.
    b.output.fill_bytes(poison_byte(c.dtype)).unwrap();
    let (send, recv) = if c.in_place {
        let off = match c.kind {
            Kind::AllGather => r.rank * c.count * es,
            _ => 0,
        };
        b.output.write(off, &mine).unwrap();
        let recv_off = match c.kind {
            Kind::ReduceScatter => r.rank * c.count * es,
            _ => 0,
        };
        (
            b.output.ptr() + off as u64,
            b.output.ptr() + recv_off as u64,
        )
    } else {
        b.input.write(0, &mine).unwrap();
        (b.input.ptr(), b.output.ptr())
    };
    barrier.wait();
    let s = r.stream.handle();
    let comm = &mut r.comm;
    let res = match c.kind {
        Kind::AllReduce => comm.all_reduce(send, recv, c.count, c.dtype, c.op, s),
        Kind::Broadcast(root) => comm.broadcast(send, recv, c.count, c.dtype, root, s),
        Kind::Reduce(root) => comm.reduce(send, recv, c.count, c.dtype, c.op, root, s),
        Kind::AllGather => comm.all_gather(send, recv, c.count, c.dtype, s),
        Kind::ReduceScatter => comm.reduce_scatter(send, recv, c.count, c.dtype, c.op, s),
    };
    res.unwrap_or_else(|e| panic!("{c:?}: {e}"));
    r.stream
        .synchronize()
        .unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let mut out = vec![0u8; n_out * es];
    let out_off = (recv - b.output.ptr()) as usize;
    b.output.read(out_off, &mut out).unwrap();
    let all: Vec<Arc<Vec<u8>>> = (0..NRANKS)
        .map(|p| shared.lock().unwrap()[&(c.id, p)].clone())
        .collect();
    let (rtol, atol) = tolerance(c.dtype);
    let mut wrong = 0;
    let mut checked = 0;
    let mut report = |i: usize, got: f64, want: f64| {
        if wrong < 5 {
            println!("rank {} {c:?}: element {i}: got {got}, want {want}", r.rank);
        }
        wrong += 1;
    };
    match c.kind {
        Kind::Broadcast(root) => {
            checked = n_out;
            for i in 0..n_out {
                if out[i * es..(i + 1) * es] != all[root][i * es..(i + 1) * es] {
                    report(i, value(c.dtype, &out, i), value(c.dtype, &all[root], i));
                }
            }
        }
        Kind::AllGather => {
            checked = n_out;
            for i in 0..n_out {
                let (p, j) = (i / c.count, i % c.count);
                if out[i * es..(i + 1) * es] != all[p][j * es..(j + 1) * es] {
                    report(i, value(c.dtype, &out, i), value(c.dtype, &all[p], j));
                }
            }
        }
        Kind::Reduce(root) if root != r.rank => {}
        _ => {
            let base = match c.kind {
                Kind::ReduceScatter => r.rank * c.count,
                _ => 0,
            };
            let mut terms = [0f64; NRANKS];
            checked = n_out;
            for i in 0..n_out {
                for (p, t) in terms.iter_mut().enumerate() {
                    *t = value(c.dtype, &all[p], base + i);
                }
                let (want, mag) = reference(c.dtype, c.op, &terms);
                let got = value(c.dtype, &out, i);
                let ok = if c.dtype.is_float() {
                    (got - want).abs() <= atol + rtol * mag
                } else {
                    got == want
                };
                if !ok {
                    report(i, got, want);
                }
            }
        }
    }
    barrier.wait();
    if r.rank == 0 {
        shared.lock().unwrap().retain(|k, _| k.0 != c.id);
    }
    (checked, wrong)
}

#[test]
fn every_collective_matches_the_host_reference() {
    let Some((_gpus, _)) = two_ranks() else {
        return;
    };
    let cases = cases();
    let max_bytes = cases
        .iter()
        .map(|c| {
            let (i, o) = c.kind.sizes(c.count);
            i.max(o) * c.dtype.size()
        })
        .max()
        .unwrap();
    let shared: Shared = Mutex::new(HashMap::new());
    let results = with_ranks(DeviceConfig::from_env().unwrap(), |r, barrier| {
        let ctx = r.comm.context().clone();
        let b = Buffers {
            input: DeviceBuffer::alloc(&ctx, max_bytes).unwrap(),
            output: DeviceBuffer::alloc(&ctx, max_bytes).unwrap(),
        };
        let t = std::time::Instant::now();
        let mut checked = 0;
        let mut wrong = 0;
        let mut failed = Vec::new();
        for c in &cases {
            let (k, w) = run_case(r, &b, c, &shared, barrier);
            checked += k;
            wrong += w;
            if w > 0 {
                failed.push(*c);
            }
        }
        println!(
            "rank {}: {} cases, {checked} elements checked, {wrong} wrong, {:.1} s",
            r.rank,
            cases.len(),
            t.elapsed().as_secs_f64()
        );
        failed
    });
    for (rank, failed) in results.iter().enumerate() {
        for c in failed {
            println!("rank {rank} failed: {c:?}");
        }
    }
    assert!(
        results.iter().all(|f| f.is_empty()),
        "wrong elements (see above)"
    );
}

#[test]
fn send_and_recv_between_two_gpus() {
    let Some((_gpus, _)) = two_ranks() else {
        return;
    };
    let counts = [0usize, 1, 1_000_003, LARGE];
    let dtype = DataType::Float32;
    let bytes = LARGE * dtype.size();
    let wrong = with_ranks(DeviceConfig::from_env().unwrap(), |r, barrier| {
        let ctx = r.comm.context().clone();
        let buf = DeviceBuffer::alloc(&ctx, bytes).unwrap();
        let got = DeviceBuffer::alloc(&ctx, bytes).unwrap();
        let s = r.stream.handle();
        let peer = 1 - r.rank;
        let mut wrong = 0;
        for (k, &count) in counts.iter().enumerate() {
            let mine = inputs(dtype, 1000 + (k * NRANKS + r.rank) as u64, count);
            let theirs = inputs(dtype, 1000 + (k * NRANKS + peer) as u64, count);
            buf.write(0, &mine).unwrap();
            got.fill_bytes(0xff).unwrap();
            barrier.wait();
            // Rank 0 sends first, rank 1 receives first: messages of any size.
            if r.rank == 0 {
                r.comm.send(buf.ptr(), count, dtype, peer, s).unwrap();
                r.comm.recv(got.ptr(), count, dtype, peer, s).unwrap();
            } else {
                r.comm.recv(got.ptr(), count, dtype, peer, s).unwrap();
                r.comm.send(buf.ptr(), count, dtype, peer, s).unwrap();
            }
            r.stream.synchronize().unwrap();
            let mut out = vec![0u8; count * 4];
            got.read(0, &mut out).unwrap();
            let w = out
                .chunks(4)
                .zip(theirs.chunks(4))
                .filter(|(a, b)| a != b)
                .count();
            if w > 0 {
                println!("rank {}: send/recv of {count}: {w} wrong", r.rank);
            }
            wrong += w;
        }
        wrong
    });
    println!("send/recv: {} wrong", wrong.iter().sum::<usize>());
    assert_eq!(wrong.iter().sum::<usize>(), 0);
}
