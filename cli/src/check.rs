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
    let mut b = [0u8; 8];
    store_f64(dtype, &mut b, 0, v);
    load_f64(dtype, &b, 0)
}

/// Fills `buf` with rank `rank`'s input starting at element `first`.
pub fn fill(buf: &mut [u8], seed: u64, rank: usize, first: usize, dtype: DataType, op: RedOp) {
    for i in 0..buf.len() / dtype.size() {
        store_f64(dtype, buf, i, value(seed, rank, first + i, dtype, op));
    }
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

/// The reduction of `n` ranks' element `i`; returns (value, tolerance).
pub fn reduced(seed: u64, n: usize, i: usize, dtype: DataType, op: RedOp) -> (f64, f64) {
    let xs = (0..n).map(|r| value(seed, r, i, dtype, op));
    if !dtype.is_float() {
        let ints: Vec<i128> = xs.map(|x| x as i128).collect();
        let v = match op {
            RedOp::Sum => ints.iter().fold(0i128, |a, b| wrap_int(a + b, dtype)),
            RedOp::Prod => ints.iter().fold(1i128, |a, b| wrap_int(a * b, dtype)),
            RedOp::Max => *ints.iter().max().expect("n >= 1"),
            RedOp::Min => *ints.iter().min().expect("n >= 1"),
            RedOp::Avg => ints.iter().fold(0i128, |a, b| wrap_int(a + b, dtype)) / n as i128,
            RedOp::PreMulSum(s) => {
                let s = wrap_int(s as i128, dtype);
                ints.iter()
                    .fold(0i128, |a, b| wrap_int(a + wrap_int(b * s, dtype), dtype))
            }
        };
        return (v as f64, 0.0);
    }
    let xs: Vec<f64> = xs.collect();
    let e = eps(dtype);
    let abs: f64 = xs.iter().map(|x| x.abs()).sum();
    let (v, tol) = match op {
        RedOp::Sum => (xs.iter().sum::<f64>(), abs),
        RedOp::Prod => {
            let p: f64 = xs.iter().product();
            (p, p.abs())
        }
        RedOp::Max => (xs.iter().cloned().fold(f64::MIN, f64::max), 0.0),
        RedOp::Min => (xs.iter().cloned().fold(f64::MAX, f64::min), 0.0),
        RedOp::Avg => (xs.iter().sum::<f64>() / n as f64, abs / n as f64),
        RedOp::PreMulSum(s) => (xs.iter().map(|x| x * s).sum(), abs * s.abs()),
    };
    // Each of the n steps rounds once, and so does the final store.
    (v, tol * e * (n as f64 + 1.0) + f64::MIN_POSITIVE)
}

/// Counts the elements of `out` (starting at element `first` of the
/// expected sequence) that differ from `expect(i)` beyond its tolerance.
pub fn count_wrong(
    out: &[u8],
    dtype: DataType,
    first: usize,
    expect: impl Fn(usize) -> (f64, f64),
) -> u64 {
    let mut wrong = 0;
    for k in 0..out.len() / dtype.size() {
        let got = load_f64(dtype, out, k);
        let (want, tol) = expect(first + k);
        // NaN (a poisoned element left unwritten) must count as wrong.
        let within = (got - want).abs() <= tol;
        if !within {
            wrong += 1;
        }
    }
    wrong
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
}
