//! Random inputs every rank can regenerate, and the reference each output
//! is checked against (computed in f64, or exactly for integers), as
//! nccl-tests does: outputs are poisoned first, and `#wrong` counts the
//! elements outside the datatype's tolerance.

use oxccl::reduce::{load_f64, store_f64};
use oxccl::{DataType, RedOp};

/// A collective as the benchmark and the tests name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    SendRecv,
    AllToAll,
}

impl Coll {
    pub const ALL: [Coll; 7] = [
        Coll::AllReduce,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::SendRecv,
        Coll::AllToAll,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::SendRecv => "sendrecv",
            Coll::AllToAll => "all_to_all",
        }
    }

    pub fn parse(s: &str) -> Option<Coll> {
        Coll::ALL
            .into_iter()
            .find(|c| c.name() == s || c.name().replace('_', "") == s.replace('_', ""))
    }

    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter)
    }

    pub fn has_root(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }

    /// nccl-tests' factor from algorithm bandwidth to bus bandwidth.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv => 1.0,
        }
    }

    /// Per-rank element counts (input, output) for a benchmark `size` in
    /// bytes, as nccl-tests derives them (size is the larger buffer).
    pub fn counts(self, size: usize, dtype: DataType, n: usize) -> (usize, usize) {
        let c = size / dtype.size();
        match self {
            Coll::AllGather => (c / n, (c / n) * n),
            Coll::ReduceScatter => ((c / n) * n, c / n),
            Coll::AllToAll => ((c / n) * n, (c / n) * n),
            _ => (c, c),
        }
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Element `i` of rank `rank`'s input, as a value exactly representable in `dtype`.
pub fn value(seed: u64, rank: usize, i: usize, dtype: DataType, op: RedOp) -> f64 {
    let h = splitmix(seed ^ ((rank as u64) << 40) ^ i as u64);
    let u = (h >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
    let prod = matches!(op, RedOp::Prod);
    let v = if dtype.is_float() {
        if prod {
            0.5 + u
        } else {
            2.0 * u - 1.0
        }
    } else if prod {
        1.0 + (h & 1) as f64
    } else {
        (h % 8) as f64
    };
    // Rounded to the type; the common types without a trip through bytes.
    match dtype {
        DataType::Float64 => v,
        DataType::Float32 => v as f32 as f64,
        // Small integers, exact in every integer type.
        _ if !dtype.is_float() => v,
        _ => {
            let mut b = [0u8; 8];
            store_f64(dtype, &mut b, 0, v);
            load_f64(dtype, &b, 0)
        }
    }
}

/// Elements below which one thread fills or checks: a thread costs more
/// than it saves.
const PAR_MIN: usize = 1 << 20;

/// Splits `elems` elements into one span per thread worth starting:
/// inputs and checks of a GiB take minutes on one core.
fn spans(elems: usize) -> Vec<(usize, usize)> {
    // available_parallelism reads cgroup files on Linux: once per process.
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let threads =
        *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let k = (elems / PAR_MIN).clamp(1, threads);
    let per = elems.div_ceil(k).max(1);
    (0..elems)
        .step_by(per)
        .map(|a| (a, (a + per).min(elems)))
        .collect()
}

/// Fills `buf` with rank `rank`'s input starting at element `first`.
pub fn fill(buf: &mut [u8], seed: u64, rank: usize, first: usize, dtype: DataType, op: RedOp) {
    let es = dtype.size();
    let elems = buf.len() / es;
    let fill_span = |part: &mut [u8], start: usize| {
        for i in 0..part.len() / es {
            store_f64(
                dtype,
                part,
                i,
                value(seed, rank, first + start + i, dtype, op),
            );
        }
    };
    let spans = spans(elems);
    if spans.len() == 1 {
        return fill_span(&mut buf[..elems * es], 0);
    }
    std::thread::scope(|s| {
        let mut rest = &mut buf[..elems * es];
        for &(a, b) in &spans {
            let (part, tail) = rest.split_at_mut((b - a) * es);
            rest = tail;
            s.spawn(move || fill_span(part, a));
        }
    });
}

/// Fills with a value no correct result has (NaN for floats, a pattern for integers).
pub fn poison(buf: &mut [u8]) {
    buf.fill(0xff);
}

fn wrap_int(v: i128, dtype: DataType) -> i128 {
    let bits = dtype.size() as u32 * 8;
    let signed = matches!(dtype, DataType::Int8 | DataType::Int32 | DataType::Int64);
    let m = v & ((1i128 << bits) - 1);
    if signed && m >= 1i128 << (bits - 1) {
        m - (1i128 << bits)
    } else {
        m
    }
}

/// Unit roundoff of a datatype.
fn eps(dtype: DataType) -> f64 {
    match dtype {
        DataType::Float64 => 1e-15,
        DataType::Float32 => 1.2e-7,
        DataType::Float16 => 9.8e-4,
        DataType::Bfloat16 => 7.9e-3,
        DataType::Float8e4m3 => 0.0625,
        DataType::Float8e5m2 => 0.125,
        _ => 0.0,
    }
}

/// Spacing of a datatype's subnormals: the absolute error one rounding near
/// zero may make, whatever the relative precision.
fn tiny(dtype: DataType) -> f64 {
    match dtype {
        DataType::Float64 => f64::from_bits(1),
        DataType::Float32 => f32::from_bits(1) as f64,
        DataType::Float16 => 2f64.powi(-24),
        DataType::Bfloat16 => 2f64.powi(-133),
        DataType::Float8e4m3 => 2f64.powi(-9),
        DataType::Float8e5m2 => 2f64.powi(-16),
        _ => 0.0,
    }
}

/// The reduction of `n` ranks' element `i`; returns (value, tolerance).
pub fn reduced(seed: u64, n: usize, i: usize, dtype: DataType, op: RedOp) -> (f64, f64) {
    // Called once per checked element: no allocation, ranks regenerated.
    let xs = || (0..n).map(|r| value(seed, r, i, dtype, op));
    if !dtype.is_float() {
        let ints = || xs().map(|x| x as i128);
        let v = match op {
            RedOp::Sum => ints().fold(0i128, |a, b| wrap_int(a + b, dtype)),
            RedOp::Prod => ints().fold(1i128, |a, b| wrap_int(a * b, dtype)),
            RedOp::Max => ints().max().expect("n >= 1"),
            RedOp::Min => ints().min().expect("n >= 1"),
            RedOp::Avg => ints().fold(0i128, |a, b| wrap_int(a + b, dtype)) / n as i128,
            RedOp::PreMulSum(s) => {
                let s = wrap_int(s as i128, dtype);
                ints().fold(0i128, |a, b| wrap_int(a + wrap_int(b * s, dtype), dtype))
            }
        };
        return (v as f64, 0.0);
    }
    let e = eps(dtype);
    // One pass over the ranks' values: generating them is most of a
    // check's time (a GiB on 4 ranks took minutes on the GPU machine).
    let scale = match op {
        RedOp::PreMulSum(s) => s,
        _ => 1.0,
    };
    let (mut sum, mut abs, mut prod) = (0.0f64, 0.0f64, 1.0f64);
    let (mut max, mut min) = (f64::MIN, f64::MAX);
    for x in xs() {
        sum += x * scale;
        abs += x.abs();
        prod *= x;
        max = max.max(x);
        min = min.min(x);
    }
    let (v, tol) = match op {
        RedOp::Sum => (sum, abs),
        RedOp::Prod => (prod, prod.abs()),
        RedOp::Max => (max, 0.0),
        RedOp::Min => (min, 0.0),
        RedOp::Avg => (sum / n as f64, abs / n as f64),
        RedOp::PreMulSum(s) => (sum, abs * s.abs()),
    };
    // Each of the n steps rounds once, and so does the final store; near
    // zero a rounding loses up to a subnormal step (avg and premulsum scale
    // each input before summing, as NCCL does).
    (
        v,
        (tol * e + tiny(dtype)) * (n as f64 + 1.0) + f64::MIN_POSITIVE,
    )
}

/// Counts the elements of `out` (starting at element `first` of the
/// expected sequence) that differ from `expect(i)` beyond its tolerance.
pub fn count_wrong(
    out: &[u8],
    dtype: DataType,
    first: usize,
    expect: impl Fn(usize) -> (f64, f64) + Sync,
) -> u64 {
    let es = dtype.size();
    let span = |a: usize, b: usize| -> u64 {
        let part = &out[a * es..b * es];
        let mut wrong = 0;
        for k in 0..b - a {
            let got = match dtype {
                DataType::Float32 => {
                    let b = &part[4 * k..4 * k + 4];
                    f32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as f64
                }
                _ => load_f64(dtype, part, k),
            };
            let (want, tol) = expect(first + a + k);
            // NaN (a poisoned element left unwritten) must count as wrong.
            let within = (got - want).abs() <= tol;
            if !within {
                wrong += 1;
            }
        }
        wrong
    };
    let spans = spans(out.len() / es);
    if spans.len() == 1 {
        return spans.iter().map(|&(a, b)| span(a, b)).sum();
    }
    let span = &span;
    std::thread::scope(|s| {
        let hs: Vec<_> = spans
            .iter()
            .map(|&(a, b)| s.spawn(move || span(a, b)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("a check thread panicked"))
            .sum()
    })
}

/// Checks the output of `coll` on `rank` of `n` ranks. `count` is the
/// per-rank count in NCCL's sense (all-gather's send count, reduce-scatter's
/// receive count, all-to-all's block).
#[allow(clippy::too_many_arguments)]
pub fn check(
    coll: Coll,
    out: &[u8],
    seed: u64,
    rank: usize,
    n: usize,
    count: usize,
    dtype: DataType,
    op: RedOp,
    root: usize,
) -> u64 {
    match coll {
        Coll::AllReduce => count_wrong(out, dtype, 0, |i| reduced(seed, n, i, dtype, op)),
        Coll::Reduce if rank == root => {
            count_wrong(out, dtype, 0, |i| reduced(seed, n, i, dtype, op))
        }
        Coll::Reduce => 0,
        Coll::Broadcast => count_wrong(out, dtype, 0, |i| (value(seed, root, i, dtype, op), 0.0)),
        Coll::AllGather => count_wrong(out, dtype, 0, |i| {
            (
                value(seed, i / count.max(1), i % count.max(1), dtype, op),
                0.0,
            )
        }),
        Coll::ReduceScatter => count_wrong(out, dtype, 0, |i| {
            reduced(seed, n, rank * count + i, dtype, op)
        }),
        Coll::SendRecv => count_wrong(out, dtype, 0, |i| {
            (value(seed, (rank + n - 1) % n, i, dtype, op), 0.0)
        }),
        Coll::AllToAll => count_wrong(out, dtype, 0, |i| {
            (
                value(
                    seed,
                    i / count.max(1),
                    rank * count + i % count.max(1),
                    dtype,
                    op,
                ),
                0.0,
            )
        }),
    }
}

/// One checked all-reduce (float32 sum, in place) of iteration `it`'s
/// random data (each rank's from its own seed): the number of wrong
/// elements, or the call's error.
pub fn checked_all_reduce(comm: &oxccl::Comm, it: u64, buf: &mut [u8]) -> oxccl::Result<u64> {
    let (dtype, op) = (DataType::Float32, RedOp::Sum);
    let seed = 0x5eed ^ (it << 20);
    fill(buf, seed, comm.user_rank(), 0, dtype, op);
    comm.all_reduce(None, buf, dtype, op)?;
    Ok(count_wrong(buf, dtype, 0, |i| {
        reduced(seed, comm.count(), i, dtype, op)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_reference_wraps() {
        assert_eq!(wrap_int(130, DataType::Int8), -126);
        assert_eq!(wrap_int(256 + 3, DataType::Uint8), 3);
        assert_eq!(wrap_int(-1, DataType::Uint32), u32::MAX as i128);
    }

    #[test]
    fn values_are_representable_and_tolerance_sane() {
        for d in DataType::ALL {
            let v = value(1, 2, 3, d, RedOp::Sum);
            let mut b = [0u8; 8];
            store_f64(d, &mut b, 0, v);
            assert_eq!(load_f64(d, &b, 0), v);
        }
        let (v, t) = reduced(1, 4, 0, DataType::Float32, RedOp::Sum);
        assert!(t < 1e-5 && v.abs() < 4.0);
    }

    #[test]
    fn threaded_fill_and_check_match_one_thread() {
        // Float32 takes the check's own load, Float16 the library's.
        for d in [DataType::Float16, DataType::Float32] {
            let n = 3 * PAR_MIN + 7;
            let mut buf = vec![0u8; n * d.size()];
            fill(&mut buf, 9, 1, 5, d, RedOp::Sum);
            for i in [0, PAR_MIN - 1, PAR_MIN, 2 * PAR_MIN + 3, n - 1] {
                assert_eq!(load_f64(d, &buf, i), value(9, 1, 5 + i, d, RedOp::Sum));
            }
            let expect = |i: usize| (value(9, 1, i, d, RedOp::Sum), 0.0);
            assert_eq!(count_wrong(&buf, d, 5, expect), 0);
            buf[(2 * PAR_MIN + 3) * d.size()..][..2].fill(0xff);
            buf[..2].fill(0xff);
            assert_eq!(count_wrong(&buf, d, 5, expect), 2, "{d:?}");
        }
    }

    /// The values skip the trip through bytes for some types, and the
    /// reference takes one pass: both as they were with the trip and with
    /// one pass per statistic.
    #[test]
    fn shortcuts_give_what_the_byte_trip_and_separate_passes_give() {
        let ops = [
            RedOp::Sum,
            RedOp::Prod,
            RedOp::Max,
            RedOp::Min,
            RedOp::Avg,
            RedOp::PreMulSum(0.75),
        ];
        for d in DataType::ALL {
            for op in ops {
                for i in 0..200 {
                    let v = value(3, 1, i, d, op);
                    let mut b = [0u8; 8];
                    store_f64(d, &mut b, 0, v);
                    assert_eq!(load_f64(d, &b, 0), v, "{d:?} {op:?} {i}");
                }
            }
        }
        for d in [DataType::Float32, DataType::Float64, DataType::Bfloat16] {
            for op in ops {
                for n in [1, 3, 8] {
                    for i in 0..50 {
                        let xs: Vec<f64> = (0..n).map(|r| value(5, r, i, d, op)).collect();
                        let abs: f64 = xs.iter().map(|x| x.abs()).sum();
                        let want = match op {
                            RedOp::Sum => xs.iter().sum::<f64>(),
                            RedOp::Prod => xs.iter().product(),
                            RedOp::Max => xs.iter().copied().fold(f64::MIN, f64::max),
                            RedOp::Min => xs.iter().copied().fold(f64::MAX, f64::min),
                            RedOp::Avg => xs.iter().sum::<f64>() / n as f64,
                            RedOp::PreMulSum(s) => xs.iter().map(|x| x * s).sum(),
                        };
                        let (v, tol) = reduced(5, n, i, d, op);
                        assert_eq!(v, want, "{d:?} {op:?} n={n} i={i}");
                        assert!(tol > 0.0 && tol <= (abs + 1.0) * eps(d) * 20.0 + 1e-300);
                    }
                }
            }
        }
    }
}
