//! Element-wise reduction of host buffers, for every datatype and op.
//!
//! Floating types narrower than 32 bits are widened to f32, combined, and
//! rounded back (to nearest even, fp8 saturating to the largest finite value
//! as NCCL's `__NV_SATFINITE` conversions do), so each step rounds once as
//! the GPU kernels do. The average divides integers after the sum and
//! pre-multiplies floats by 1/n, as NCCL does.

use crate::dtype::{DataType, RedOp};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Combine {
    Sum,
    Prod,
    Max,
    Min,
}

/// Applies one op on one datatype; built once per operation.
#[derive(Debug, Clone, Copy)]
pub struct Reducer {
    dtype: DataType,
    combine: Combine,
    /// Multiplier applied to each rank's own input where it enters the reduction.
    pre_scale: Option<f64>,
    /// Divisor applied once to the final result (integer average).
    post_div: Option<u64>,
}

trait Elem: Copy {
    const SIZE: usize;
    fn load(b: &[u8]) -> Self;
    fn store(self, b: &mut [u8]);
    fn combine(self, o: Self, c: Combine) -> Self;
    fn scale(self, s: f64) -> Self;
    fn div(self, n: u64) -> Self;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline(always)]
            fn load(b: &[u8]) -> Self { <$t>::from_ne_bytes(b.try_into().unwrap()) }
            #[inline(always)]
            fn store(self, b: &mut [u8]) { b.copy_from_slice(&self.to_ne_bytes()) }
            #[inline(always)]
            fn combine(self, o: Self, c: Combine) -> Self {
                match c {
                    Combine::Sum => self.wrapping_add(o),
                    Combine::Prod => self.wrapping_mul(o),
                    Combine::Max => self.max(o),
                    Combine::Min => self.min(o),
                }
            }
            #[inline(always)]
            fn scale(self, s: f64) -> Self { self.wrapping_mul(s as $t) }
            #[inline(always)]
            fn div(self, n: u64) -> Self { (self as i128 / n as i128) as $t }
        }
    )*};
}
int_elem!(i8, u8, i32, u32, i64, u64);

macro_rules! float_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline(always)]
            fn load(b: &[u8]) -> Self { <$t>::from_ne_bytes(b.try_into().unwrap()) }
            #[inline(always)]
            fn store(self, b: &mut [u8]) { b.copy_from_slice(&self.to_ne_bytes()) }
            #[inline(always)]
            fn combine(self, o: Self, c: Combine) -> Self {
                match c {
                    Combine::Sum => self + o,
                    Combine::Prod => self * o,
                    // NaN propagates, as on the GPU (fmaxf would drop it).
                    Combine::Max => if self.is_nan() || self > o { self } else { o },
                    Combine::Min => if self.is_nan() || self < o { self } else { o },
                }
            }
            #[inline(always)]
            fn scale(self, s: f64) -> Self { self * (s as $t) }
            #[inline(always)]
            fn div(self, n: u64) -> Self { self / (n as $t) }
        }
    )*};
}
float_elem!(f32, f64);

/// A narrow float carried as f32 between load and store.
macro_rules! narrow_elem {
    ($name:ident, $bytes:literal, $to:expr, $from:expr) => {
        #[derive(Clone, Copy)]
        struct $name(f32);
        impl Elem for $name {
            const SIZE: usize = $bytes;
            #[inline(always)]
            fn load(b: &[u8]) -> Self {
                $name(($to)(b))
            }
            #[inline(always)]
            fn store(self, b: &mut [u8]) {
                ($from)(self.0, b)
            }
            #[inline(always)]
            fn combine(self, o: Self, c: Combine) -> Self {
                $name(self.0.combine(o.0, c))
            }
            #[inline(always)]
            fn scale(self, s: f64) -> Self {
                $name(self.0 * s as f32)
            }
            #[inline(always)]
            fn div(self, n: u64) -> Self {
                $name(self.0 / n as f32)
            }
        }
    };
}
narrow_elem!(
    F16,
    2,
    |b: &[u8]| half::f16::from_ne_bytes([b[0], b[1]]).to_f32(),
    |v: f32, b: &mut [u8]| b.copy_from_slice(&half::f16::from_f32(v).to_ne_bytes())
);
narrow_elem!(
    Bf16,
    2,
    |b: &[u8]| half::bf16::from_ne_bytes([b[0], b[1]]).to_f32(),
    |v: f32, b: &mut [u8]| b.copy_from_slice(&half::bf16::from_f32(v).to_ne_bytes())
);
narrow_elem!(
    E4m3,
    1,
    |b: &[u8]| fp8::e4m3().decode(b[0]),
    |v: f32, b: &mut [u8]| b[0] = fp8::e4m3().encode(v)
);
narrow_elem!(
    E5m2,
    1,
    |b: &[u8]| fp8::e5m2().decode(b[0]),
    |v: f32, b: &mut [u8]| b[0] = fp8::e5m2().encode(v)
);

/// One combine operation as a type, so that each (type, op) pair gets its
/// own loop without a branch inside: the compiler vectorises those.
trait CombineOp {
    fn apply<T: Elem>(a: T, b: T) -> T;
}

macro_rules! combine_op {
    ($name:ident, $c:expr) => {
        struct $name;
        impl CombineOp for $name {
            #[inline(always)]
            fn apply<T: Elem>(a: T, b: T) -> T {
                a.combine(b, $c)
            }
        }
    };
}
combine_op!(OpSum, Combine::Sum);
combine_op!(OpProd, Combine::Prod);
combine_op!(OpMax, Combine::Max);
combine_op!(OpMin, Combine::Min);

/// Dispatches a generic function over the element type of a datatype.
macro_rules! with_elem {
    ($dtype:expr, $f:ident($($arg:expr),*)) => {
        match $dtype {
            DataType::Int8 => $f::<i8>($($arg),*),
            DataType::Uint8 => $f::<u8>($($arg),*),
            DataType::Int32 => $f::<i32>($($arg),*),
            DataType::Uint32 => $f::<u32>($($arg),*),
            DataType::Int64 => $f::<i64>($($arg),*),
            DataType::Uint64 => $f::<u64>($($arg),*),
            DataType::Float16 => $f::<F16>($($arg),*),
            DataType::Bfloat16 => $f::<Bf16>($($arg),*),
            DataType::Float32 => $f::<f32>($($arg),*),
            DataType::Float64 => $f::<f64>($($arg),*),
            DataType::Float8e4m3 => $f::<E4m3>($($arg),*),
            DataType::Float8e5m2 => $f::<E5m2>($($arg),*),
        }
    };
}

/// Which operands are a rank's own input (scaled on entry) and whether the
/// result is final (divided for an integer average).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stage {
    pub pre_a: bool,
    pub pre_b: bool,
    pub post: bool,
}

impl Reducer {
    pub fn new(dtype: DataType, op: RedOp, nranks: usize) -> Reducer {
        let (combine, pre_scale, post_div) = match op {
            RedOp::Sum => (Combine::Sum, None, None),
            RedOp::Prod => (Combine::Prod, None, None),
            RedOp::Max => (Combine::Max, None, None),
            RedOp::Min => (Combine::Min, None, None),
            RedOp::PreMulSum(s) => (Combine::Sum, Some(s), None),
            RedOp::Avg if dtype.is_float() => (Combine::Sum, Some(1.0 / nranks as f64), None),
            RedOp::Avg => (Combine::Sum, None, Some(nranks as u64)),
        };
        Reducer {
            dtype,
            combine,
            pre_scale,
            post_div,
        }
    }

    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Whether copying a rank's input verbatim would be wrong.
    pub fn has_pre(&self) -> bool {
        self.pre_scale.is_some()
    }

    pub fn has_post(&self) -> bool {
        self.post_div.is_some()
    }

    /// Whether copying with these stages alters the values.
    pub fn changes(&self, pre: bool, post: bool) -> bool {
        (pre && self.has_pre()) || (post && self.has_post())
    }

    /// `dst = a (op) b`, element-wise. `dst` may be the same memory as
    /// neither operand; use [`Reducer::combine_into`] for that.
    pub fn combine(&self, dst: &mut [u8], a: &[u8], b: &[u8], stage: Stage) {
        with_elem!(self.dtype, combine_impl(self, dst, a, b, stage))
    }

    /// `acc = acc (op) b`, element-wise; `acc` counts as operand a.
    pub fn combine_into(&self, acc: &mut [u8], b: &[u8], stage: Stage) {
        with_elem!(self.dtype, combine_into_impl(self, acc, b, stage))
    }

    /// `dst = src`, scaled if `pre`, divided if `post`.
    pub fn copy(&self, dst: &mut [u8], src: &[u8], pre: bool, post: bool) {
        if !self.changes(pre, post) {
            dst.copy_from_slice(src);
            return;
        }
        with_elem!(self.dtype, copy_impl(self, dst, src, pre, post))
    }

    /// Applies the final division in place (for a result assembled elsewhere).
    pub fn finish_in_place(&self, buf: &mut [u8]) {
        if let Some(n) = self.post_div {
            with_elem!(self.dtype, div_impl(buf, n))
        }
    }
}

#[inline(always)]
fn prep<T: Elem>(r: &Reducer, x: T, pre: bool) -> T {
    match (pre, r.pre_scale) {
        (true, Some(s)) => x.scale(s),
        _ => x,
    }
}

#[inline(always)]
fn fin<T: Elem>(r: &Reducer, x: T, post: bool) -> T {
    match (post, r.post_div) {
        (true, Some(n)) => x.div(n),
        _ => x,
    }
}

fn plain_combine<T: Elem, C: CombineOp>(dst: &mut [u8], a: &[u8], b: &[u8]) {
    for ((d, a), b) in dst
        .chunks_exact_mut(T::SIZE)
        .zip(a.chunks_exact(T::SIZE))
        .zip(b.chunks_exact(T::SIZE))
    {
        C::apply(T::load(a), T::load(b)).store(d);
    }
}

fn plain_combine_into<T: Elem, C: CombineOp>(acc: &mut [u8], b: &[u8]) {
    for (d, b) in acc.chunks_exact_mut(T::SIZE).zip(b.chunks_exact(T::SIZE)) {
        C::apply(T::load(d), T::load(b)).store(d);
    }
}

fn combine_impl<T: Elem>(r: &Reducer, dst: &mut [u8], a: &[u8], b: &[u8], st: Stage) {
    let c = r.combine;
    let plain = !(st.pre_a || st.pre_b) || r.pre_scale.is_none();
    let plain = plain && (!st.post || r.post_div.is_none());
    if plain {
        // The common case: one branch-free loop per (type, op).
        match c {
            Combine::Sum => plain_combine::<T, OpSum>(dst, a, b),
            Combine::Prod => plain_combine::<T, OpProd>(dst, a, b),
            Combine::Max => plain_combine::<T, OpMax>(dst, a, b),
            Combine::Min => plain_combine::<T, OpMin>(dst, a, b),
        }
        return;
    }
    let it = dst
        .chunks_exact_mut(T::SIZE)
        .zip(a.chunks_exact(T::SIZE))
        .zip(b.chunks_exact(T::SIZE));
    for ((d, a), b) in it {
        let v = prep(r, T::load(a), st.pre_a).combine(prep(r, T::load(b), st.pre_b), c);
        fin(r, v, st.post).store(d);
    }
}

fn combine_into_impl<T: Elem>(r: &Reducer, acc: &mut [u8], b: &[u8], st: Stage) {
    let c = r.combine;
    let plain =
        (!(st.pre_a || st.pre_b) || r.pre_scale.is_none()) && (!st.post || r.post_div.is_none());
    let it = acc.chunks_exact_mut(T::SIZE).zip(b.chunks_exact(T::SIZE));
    if plain {
        match c {
            Combine::Sum => plain_combine_into::<T, OpSum>(acc, b),
            Combine::Prod => plain_combine_into::<T, OpProd>(acc, b),
            Combine::Max => plain_combine_into::<T, OpMax>(acc, b),
            Combine::Min => plain_combine_into::<T, OpMin>(acc, b),
        }
    } else {
        for (d, b) in it {
            let v = prep(r, T::load(d), st.pre_a).combine(prep(r, T::load(b), st.pre_b), c);
            fin(r, v, st.post).store(d);
        }
    }
}

fn copy_impl<T: Elem>(r: &Reducer, dst: &mut [u8], src: &[u8], pre: bool, post: bool) {
    for (d, s) in dst.chunks_exact_mut(T::SIZE).zip(src.chunks_exact(T::SIZE)) {
        fin(r, prep(r, T::load(s), pre), post).store(d);
    }
}

fn div_impl<T: Elem>(buf: &mut [u8], n: u64) {
    for d in buf.chunks_exact_mut(T::SIZE) {
        T::load(d).div(n).store(d);
    }
}

/// 8-bit floats: OCP's E4M3 (finite only, NaN = all ones) and E5M2 (IEEE-like).
pub mod fp8 {
    /// One 8-bit float format.
    #[derive(Debug, Clone, Copy)]
    pub struct Format {
        pub exp_bits: u32,
        pub man_bits: u32,
        pub bias: i32,
        /// E5M2 reserves its top exponent for inf/NaN; E4M3 uses it for numbers.
        pub ieee_top: bool,
    }

    pub const E4M3: Format = Format {
        exp_bits: 4,
        man_bits: 3,
        bias: 7,
        ieee_top: false,
    };
    pub const E5M2: Format = Format {
        exp_bits: 5,
        man_bits: 2,
        bias: 15,
        ieee_top: true,
    };

    impl Format {
        fn max_code(&self) -> u8 {
            if self.ieee_top {
                // exponent all ones is inf/NaN: the largest finite is one below.
                (((1u32 << self.exp_bits) - 2) << self.man_bits | ((1 << self.man_bits) - 1)) as u8
            } else {
                // all ones is NaN: the largest finite has the last mantissa bit clear.
                (((1u32 << (self.exp_bits + self.man_bits)) - 1) - 1) as u8
            }
        }

        fn nan_code(&self) -> u8 {
            ((1u32 << (self.exp_bits + self.man_bits)) - 1) as u8
        }

        pub fn decode(&self, v: u8) -> f32 {
            let sign = if v & 0x80 != 0 { -1.0f64 } else { 1.0 };
            let mag = (v & 0x7f) as u32;
            let e = (mag >> self.man_bits) as i32;
            let m = mag & ((1 << self.man_bits) - 1);
            let top = (1i32 << self.exp_bits) - 1;
            if self.ieee_top && e == top {
                return if m == 0 {
                    (sign * f64::INFINITY) as f32
                } else {
                    f32::NAN
                };
            }
            if !self.ieee_top && mag == self.nan_code() as u32 {
                return f32::NAN;
            }
            let scale = (1u32 << self.man_bits) as f64;
            let x = if e == 0 {
                m as f64 / scale * 2f64.powi(1 - self.bias)
            } else {
                (1.0 + m as f64 / scale) * 2f64.powi(e - self.bias)
            };
            (sign * x) as f32
        }

        /// Rounds to nearest even, saturating to the largest finite value.
        pub fn encode(&self, x: f32) -> u8 {
            if x.is_nan() {
                return self.nan_code() | 0x80;
            }
            let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
            let a = (x as f64).abs();
            let max = self.decode(self.max_code()) as f64;
            if a >= max {
                return sign | self.max_code();
            }
            let min_normal_exp = 1 - self.bias;
            let scale = (1u64 << self.man_bits) as f64;
            let e = a.log2().floor() as i32;
            let code = if a == 0.0 {
                0
            } else if e < min_normal_exp {
                // Subnormal: the mantissa counts units of 2^(1-bias-man_bits).
                round_even(a / 2f64.powi(min_normal_exp) * scale) as u32
            } else {
                let mut q = round_even((a / 2f64.powi(e) - 1.0) * scale) as u32;
                let mut e = e;
                if q == 1 << self.man_bits {
                    q = 0;
                    e += 1;
                }
                (((e + self.bias) as u32) << self.man_bits) | q
            };
            sign | (code.min(self.max_code() as u32) as u8)
        }
    }

    /// A format's 256 values, for the data path: `Format`'s arithmetic
    /// costs about 100 ns an element (a GiB of fp8 took seconds to reduce);
    /// a table lookup and a 7-step search give the same bits.
    pub struct Table {
        dec: [f32; 256],
        max_code: u8,
        nan_code: u8,
    }

    impl Table {
        fn new(f: &Format) -> Table {
            let mut dec = [0f32; 256];
            for (c, d) in dec.iter_mut().enumerate() {
                *d = f.decode(c as u8);
            }
            Table {
                dec,
                max_code: f.max_code(),
                nan_code: f.nan_code(),
            }
        }

        pub fn decode(&self, v: u8) -> f32 {
            self.dec[v as usize]
        }

        /// As [`Format::encode`]: nearest, ties to the even code,
        /// saturating at the largest finite value.
        pub fn encode(&self, x: f32) -> u8 {
            if x.is_nan() {
                return self.nan_code | 0x80;
            }
            let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
            let a = x.abs();
            let top = self.max_code as usize;
            if a >= self.dec[top] {
                return sign | self.max_code;
            }
            // Positive codes 0..=top increase with their value: the last
            // code not above `a`, then the nearer of it and the next (the
            // midpoint of two fp8 values is exact in f32).
            let lo = self.dec[..=top].partition_point(|&v| v <= a) - 1;
            let mid = (self.dec[lo] + self.dec[lo + 1]) / 2.0;
            let c = if a > mid || (a == mid && lo % 2 == 1) {
                lo + 1
            } else {
                lo
            };
            sign | c as u8
        }
    }

    pub fn e4m3() -> &'static Table {
        static T: std::sync::OnceLock<Table> = std::sync::OnceLock::new();
        T.get_or_init(|| Table::new(&E4M3))
    }

    pub fn e5m2() -> &'static Table {
        static T: std::sync::OnceLock<Table> = std::sync::OnceLock::new();
        T.get_or_init(|| Table::new(&E5M2))
    }

    fn round_even(v: f64) -> f64 {
        let r = v.round();
        if (v - v.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
            r - v.signum()
        } else {
            r
        }
    }
}

/// Reads element `i` of a buffer of `dtype` as f64 (for references and checks).
pub fn load_f64(dtype: DataType, buf: &[u8], i: usize) -> f64 {
    let s = dtype.size();
    let b = &buf[i * s..(i + 1) * s];
    match dtype {
        DataType::Int8 => i8::load(b) as f64,
        DataType::Uint8 => u8::load(b) as f64,
        DataType::Int32 => i32::load(b) as f64,
        DataType::Uint32 => u32::load(b) as f64,
        DataType::Int64 => i64::load(b) as f64,
        DataType::Uint64 => u64::load(b) as f64,
        DataType::Float16 => F16::load(b).0 as f64,
        DataType::Bfloat16 => Bf16::load(b).0 as f64,
        DataType::Float32 => f32::load(b) as f64,
        DataType::Float64 => f64::load(b),
        DataType::Float8e4m3 => E4m3::load(b).0 as f64,
        DataType::Float8e5m2 => E5m2::load(b).0 as f64,
    }
}

/// Writes `v` (rounded to the type) as element `i`.
pub fn store_f64(dtype: DataType, buf: &mut [u8], i: usize, v: f64) {
    let s = dtype.size();
    let b = &mut buf[i * s..(i + 1) * s];
    match dtype {
        DataType::Int8 => (v as i8).store(b),
        DataType::Uint8 => (v as u8).store(b),
        DataType::Int32 => (v as i32).store(b),
        DataType::Uint32 => (v as u32).store(b),
        DataType::Int64 => (v as i64).store(b),
        DataType::Uint64 => (v as u64).store(b),
        DataType::Float16 => F16(v as f32).store(b),
        DataType::Bfloat16 => Bf16(v as f32).store(b),
        DataType::Float32 => (v as f32).store(b),
        DataType::Float64 => v.store(b),
        DataType::Float8e4m3 => E4m3(v as f32).store(b),
        DataType::Float8e5m2 => E5m2(v as f32).store(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_roundtrip_every_code() {
        for f in [fp8::E4M3, fp8::E5M2] {
            for c in 0..=255u8 {
                let x = f.decode(c);
                if x.is_nan() || x.is_infinite() {
                    continue;
                }
                let back = f.encode(x);
                assert_eq!(f.decode(back), x, "code {c:#x}");
            }
        }
        assert_eq!(fp8::E4M3.decode(fp8::E4M3.encode(1000.0)), 448.0);
        assert_eq!(fp8::E5M2.decode(fp8::E5M2.encode(1e9)), 57344.0);
        assert_eq!(fp8::E4M3.decode(fp8::E4M3.encode(1.0625)), 1.0); // tie to even
        assert_eq!(fp8::E4M3.decode(fp8::E4M3.encode(1.1875)), 1.25);
    }

    #[test]
    fn fp8_table_matches_the_arithmetic() {
        for (f, t) in [(fp8::E4M3, fp8::e4m3()), (fp8::E5M2, fp8::e5m2())] {
            let mut xs: Vec<f32> = Vec::new();
            for c in 0..=255u8 {
                let v = f.decode(c);
                let next = f.decode(c.wrapping_add(1));
                xs.extend([v, v.next_up(), v.next_down(), (v + next) / 2.0]);
            }
            let mut h = 0x9e37_79b9_u32;
            for _ in 0..200_000 {
                h ^= h << 13;
                h ^= h >> 17;
                h ^= h << 5;
                xs.push(f32::from_bits(h));
                xs.push((h as f32 / u32::MAX as f32 - 0.5) * 2.0);
            }
            xs.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 1e-30, -1e-30]);
            for x in xs {
                let (want, got) = (f.encode(x), t.encode(x));
                let same = want == got || (f.decode(want).is_nan() && t.decode(got).is_nan());
                assert!(
                    same,
                    "{x:e} ({:#x}): arithmetic {want:#x}, table {got:#x}",
                    x.to_bits()
                );
            }
            for c in 0..=255u8 {
                assert_eq!(f.decode(c).to_bits(), t.decode(c).to_bits());
            }
        }
    }

    fn bytes_f32(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    #[test]
    fn ops_on_f32_and_ints() {
        let a = bytes_f32(&[1.0, -2.0, 3.0]);
        let b = bytes_f32(&[4.0, 5.0, f32::NAN]);
        let mut d = vec![0u8; 12];
        Reducer::new(DataType::Float32, RedOp::Max, 2).combine(&mut d, &a, &b, Stage::default());
        assert_eq!(load_f64(DataType::Float32, &d, 0), 4.0);
        assert!(load_f64(DataType::Float32, &d, 2).is_nan());
        let r = Reducer::new(DataType::Int32, RedOp::Avg, 3);
        let a: Vec<u8> = [7i32, -9].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let mut acc = a.clone();
        r.combine_into(
            &mut acc,
            &a,
            Stage {
                post: true,
                ..Stage::default()
            },
        );
        assert_eq!(load_f64(DataType::Int32, &acc, 0), 4.0); // 14 / 3
        assert_eq!(load_f64(DataType::Int32, &acc, 1), -6.0);
        let r = Reducer::new(DataType::Float64, RedOp::PreMulSum(2.0), 2);
        let x: Vec<u8> = [1.5f64].iter().flat_map(|x| x.to_ne_bytes()).collect();
        let mut d = vec![0u8; 8];
        r.combine(
            &mut d,
            &x,
            &x,
            Stage {
                pre_a: true,
                pre_b: false,
                post: false,
            },
        );
        assert_eq!(load_f64(DataType::Float64, &d, 0), 4.5);
    }
}
