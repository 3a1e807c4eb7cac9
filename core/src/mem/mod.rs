//! The one place the host executor touches raw memory: user buffers and
//! staging buffers by address, as the network plugin sees them, and their
//! registrations with network connections ([`reg`]). It sits below the
//! executors, the transports and the operations that all use these types.
#![allow(unsafe_code)]

pub mod reg;

use crate::algo::{Buf, Region};
use crate::error::{Error, Result};
use crate::reduce::{Reducer, Stage};

/// The user buffers of one operation. Sending and receiving go through the
/// network by address, and input and output may be the same memory (NCCL's
/// in-place operations), so they are kept as addresses, not slices. The
/// scratch is the executor's own, for schedules that keep partial results
/// ([`Buf::Scratch`]); null and 0 bytes for the others.
#[derive(Debug, Clone, Copy)]
pub struct OpBuffers {
    pub input: *const u8,
    pub in_bytes: usize,
    pub output: *mut u8,
    pub out_bytes: usize,
    pub scratch: *mut u8,
    pub scratch_bytes: usize,
}

// SAFETY: the addresses are only dereferenced by the executor while the
// operation runs, and the caller of `enqueue` promised they stay valid and
// untouched by others until the operation completes (NCCL's contract).
unsafe impl Send for OpBuffers {}
// SAFETY: as above; concurrent lanes touch disjoint regions by construction
// of the schedules.
unsafe impl Sync for OpBuffers {}

/// A span of memory by address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub ptr: *mut u8,
    pub len: usize,
}

impl Span {
    /// Whether `inner` lies entirely in this span.
    pub fn holds(&self, inner: Span) -> bool {
        let (lo, hi) = (self.ptr as usize, self.ptr as usize + self.len);
        lo <= inner.ptr as usize && inner.ptr as usize + inner.len <= hi
    }
}

impl OpBuffers {
    /// The buffers the caller passed that the operation touches, with the
    /// names NCCL's API gives them (for errors about the wrong kind of
    /// memory).
    pub fn used(&self) -> impl Iterator<Item = (&'static str, u64, usize)> {
        [
            ("sendbuff", self.input as u64, self.in_bytes),
            ("recvbuff", self.output as u64, self.out_bytes),
        ]
        .into_iter()
        .filter(|(_, _, len)| *len > 0)
    }

    /// `n` elements at element `off` of `region`, bounds-checked.
    pub fn span(&self, region: Region, off: usize, n: usize, esize: usize) -> Result<Span> {
        let (base, len) = match region.buf {
            Buf::Input => (self.input as *mut u8, self.in_bytes),
            Buf::Output => (self.output, self.out_bytes),
            Buf::Scratch => (self.scratch, self.scratch_bytes),
        };
        let start = (region.offset + off) * esize;
        let bytes = n * esize;
        if start + bytes > len || (bytes > 0 && base.is_null()) {
            return Err(Error::Internal(format!(
                "schedule addressed bytes {start}..{} of a {len}-byte {:?} buffer",
                start + bytes,
                region.buf
            )));
        }
        // `wrapping_add` keeps this free of unsafe; the bounds were checked above.
        Ok(Span {
            ptr: base.wrapping_add(start),
            len: bytes,
        })
    }
}

/// Staging memory owned by the executor.
pub fn staging(v: &mut [u8]) -> Span {
    Span {
        ptr: v.as_mut_ptr(),
        len: v.len(),
    }
}

/// `dst = local (op) received`, or a copy of whichever is present; handles
/// `dst` being the same memory as either operand.
pub fn produce(
    r: &Reducer,
    dst: Span,
    local: Option<(Span, bool)>,
    received: Option<Span>,
    post: bool,
) {
    let len = dst.len;
    // SAFETY: every span was bounds-checked against a live buffer (user
    // buffers by `OpBuffers::span`, staging by `staging`); spans either are
    // identical or do not overlap (schedules never address partial overlaps),
    // and the identical case is handled by building one mutable slice only.
    unsafe {
        match (local, received) {
            (Some((l, pre)), Some(m)) => {
                let st = Stage {
                    pre_a: pre,
                    pre_b: false,
                    post,
                };
                if l.ptr == dst.ptr {
                    let acc = std::slice::from_raw_parts_mut(dst.ptr, len);
                    r.combine_into(acc, std::slice::from_raw_parts(m.ptr, len), st);
                } else if m.ptr == dst.ptr {
                    let acc = std::slice::from_raw_parts_mut(dst.ptr, len);
                    let st = Stage {
                        pre_a: false,
                        pre_b: pre,
                        post,
                    };
                    r.combine_into(acc, std::slice::from_raw_parts(l.ptr, len), st);
                } else {
                    let d = std::slice::from_raw_parts_mut(dst.ptr, len);
                    r.combine(
                        d,
                        std::slice::from_raw_parts(l.ptr, len),
                        std::slice::from_raw_parts(m.ptr, len),
                        st,
                    );
                }
            }
            (Some((s, pre)), None) => transform(r, dst, s, pre, post),
            (None, Some(s)) => transform(r, dst, s, false, post),
            (None, None) => {}
        }
    }
}

/// `dst = post(pre(src))`, in place when they are the same memory.
///
/// # Safety
/// Both spans valid for `dst.len` bytes, identical or disjoint.
unsafe fn transform(r: &Reducer, dst: Span, src: Span, pre: bool, post: bool) {
    let len = dst.len;
    if src.ptr == dst.ptr {
        if !r.changes(pre, post) {
            return;
        }
        // SAFETY: per the function contract.
        let buf = unsafe { std::slice::from_raw_parts_mut(dst.ptr, len) };
        let copy = buf.to_vec();
        r.copy(buf, &copy, pre, post);
        return;
    }
    // SAFETY: per the function contract.
    let (d, s) = unsafe {
        (
            std::slice::from_raw_parts_mut(dst.ptr, len),
            std::slice::from_raw_parts(src.ptr, len),
        )
    };
    r.copy(d, s, pre, post);
}

/// Copies `out.len()` bytes at `ptr` (a span the executor owns or received
/// into) to `out`.
pub(crate) fn read_into(ptr: *const u8, out: &mut [u8]) {
    if out.is_empty() {
        return;
    }
    // SAFETY: callers pass spans of live staging or user buffers whose
    // receive or computation has completed, so nothing writes them now.
    out.copy_from_slice(unsafe { std::slice::from_raw_parts(ptr, out.len()) });
}

/// Writes `prefix` and then the bytes of `src` at the start of `dst`;
/// returns the span of both. `src` may lie in `dst` (a slot's own contents
/// moved up to make room).
pub(crate) fn prefix_into(dst: Span, prefix: &[u8], src: Span) -> Result<Span> {
    let len = prefix.len() + src.len;
    if len > dst.len {
        return Err(Error::Internal(format!(
            "a {len}-byte first message does not fit a {}-byte staging slot",
            dst.len
        )));
    }
    // SAFETY: `dst` is a staging slot valid for `dst.len` bytes that no
    // request uses (the sending task's own slot, before its send is
    // posted); `src` is a span whose data is computed and not being
    // written. `copy` is a memmove, so `src` may overlap `dst`; the prefix
    // is written after the move, when `src` is no longer read.
    unsafe {
        std::ptr::copy(src.ptr, dst.ptr.add(prefix.len()), src.len);
        std::ptr::copy_nonoverlapping(prefix.as_ptr(), dst.ptr, prefix.len());
    }
    Ok(Span { ptr: dst.ptr, len })
}

/// `dst = inputs[0] (op) inputs[1] (op) ...`, every input a rank's own
/// data (scaled on entry), the result final. `dst` must not be any input.
pub(crate) fn reduce_all(r: &Reducer, dst: Span, inputs: &[Span]) {
    let at = |s: &Span| operand(dst, *s);
    // SAFETY: `dst` is this rank's own output range (bounds-checked by
    // `OpBuffers::span`), which no other thread of the operation writes.
    let d = unsafe { std::slice::from_raw_parts_mut(dst.ptr, dst.len) };
    match inputs {
        [] => {}
        [only] => r.copy(d, at(only), true, true),
        [a, b, rest @ ..] => {
            let st = |pre_a, last| Stage {
                pre_a,
                pre_b: true,
                post: last,
            };
            r.combine(d, at(a), at(b), st(true, rest.is_empty()));
            for (i, x) in rest.iter().enumerate() {
                r.combine_into(d, at(x), st(false, i + 1 == rest.len()));
            }
        }
    }
}

/// The first `dst.len` bytes of input `s` of a reduction into `dst`, for
/// as long as the reduction runs.
fn operand<'a>(dst: Span, s: Span) -> &'a [u8] {
    assert!(
        s.len >= dst.len && s.ptr != dst.ptr,
        "an input aliases the output"
    );
    // SAFETY: every span was bounds-checked against a live buffer (user
    // buffers by `OpBuffers::span`, scratch by `staging`, slots of the
    // direct path's segment by `Area::at`, which their writers leave alone
    // until this rank's next meeting), and none is `dst` (asserted): peers'
    // data was copied into scratch first.
    unsafe { std::slice::from_raw_parts(s.ptr, dst.len) }
}

/// `dst = dst (op) inputs[0] (op) inputs[1] ...`, where `dst` holds this
/// rank's own data (scaled on entry) and every input a peer's; the result
/// final. No input may be `dst`.
pub(crate) fn reduce_into_own(r: &Reducer, dst: Span, inputs: &[Span]) {
    let len = dst.len;
    // SAFETY: `dst` is this rank's own output range (bounds-checked by
    // `OpBuffers::span`), which no other thread of the operation touches.
    let d = unsafe { std::slice::from_raw_parts_mut(dst.ptr, len) };
    if inputs.is_empty() {
        if r.changes(true, true) {
            let own = d.to_vec();
            r.copy(d, &own, true, true);
        }
        return;
    }
    for (i, x) in inputs.iter().enumerate() {
        let st = Stage {
            pre_a: i == 0,
            pre_b: true,
            post: i + 1 == inputs.len(),
        };
        r.combine_into(d, operand(dst, *x), st);
    }
}

/// Copies `src` into `dst` (same length); nothing when they are the same memory.
pub(crate) fn copy(dst: Span, src: Span) {
    if std::ptr::eq(dst.ptr, src.ptr) || dst.len == 0 {
        return;
    }
    assert_eq!(dst.len, src.len, "copy between spans of different lengths");
    // SAFETY: both spans were bounds-checked against live buffers (as in
    // `reduce_all`); the plans never copy between partly overlapping ranges.
    unsafe { std::ptr::copy(src.ptr, dst.ptr, dst.len) }
}

/// Copies `src` into `dst` (of the same length) with stores that bypass
/// the cache, where the target has them (SSE2's, part of every x86_64):
/// a destination written once and not read here soon (a peer's part of
/// an all-gather, pulled into scratch by the kernel first) is then not
/// read from memory for ownership before it is written. Ends with a
/// store fence, so that a flag stored after it is seen after the data.
pub(crate) fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy between slices of different lengths"
    );
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // The body whose destination is 16-byte aligned goes through the
        // stream; the bytes before and after it are copied plainly.
        let head = dst.as_ptr().align_offset(16).min(dst.len());
        let body = (dst.len() - head) / 16 * 16;
        let (d_head, d_rest) = dst.split_at_mut(head);
        let (s_head, s_rest) = src.split_at(head);
        d_head.copy_from_slice(s_head);
        let (d_body, d_tail) = d_rest.split_at_mut(body);
        let (s_body, s_tail) = s_rest.split_at(body);
        for (d, s) in d_body.chunks_exact_mut(16).zip(s_body.chunks_exact(16)) {
            // SAFETY: `s` and `d` are 16 readable / writable bytes of the
            // two slices; the load takes any alignment, and `d` starts at a
            // multiple of 16 (`head` above). SSE2 is baseline on x86_64.
            unsafe {
                let v = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
                _mm_stream_si128(d.as_mut_ptr().cast::<__m128i>(), v);
            }
        }
        d_tail.copy_from_slice(s_tail);
        // SAFETY: a fence has no operands; SSE is baseline on x86_64.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

/// Lets `fill` write the bytes of `dst` (a bounds-checked span of a live
/// buffer that only this thread writes now).
pub(crate) fn fill<T>(dst: Span, fill: impl FnOnce(&mut [u8]) -> T) -> T {
    if dst.len == 0 {
        return fill(&mut []);
    }
    // SAFETY: as the contract above says; the slice does not outlive the call.
    fill(unsafe { std::slice::from_raw_parts_mut(dst.ptr, dst.len) })
}

/// Lets `see` read the bytes of `src` (a bounds-checked span of a live
/// buffer that no thread writes now).
pub(crate) fn view<T>(src: Span, see: impl FnOnce(&[u8]) -> T) -> T {
    if src.len == 0 {
        return see(&[]);
    }
    // SAFETY: as the contract above says; the slice does not outlive the call.
    see(unsafe { std::slice::from_raw_parts(src.ptr, src.len) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DataType, RedOp};

    /// In place (the output holds this rank's own data) gives what the
    /// reduction into a separate output gives, bit for bit, with the own
    /// data first: random floats, every op, including the scaled ones.
    #[test]
    fn reducing_into_the_own_chunk_matches_reducing_into_another_buffer() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % 20_000) as f32 / 7.0 - 1000.0
        };
        let len = 1000;
        for n in [1usize, 2, 3, 8] {
            for op in [
                RedOp::Sum,
                RedOp::Prod,
                RedOp::Max,
                RedOp::Avg,
                RedOp::PreMulSum(0.37),
            ] {
                let r = Reducer::new(DataType::Float32, op, n);
                let mut data: Vec<Vec<u8>> = (0..n)
                    .map(|_| (0..len).flat_map(|_| next().to_ne_bytes()).collect())
                    .collect();
                let mut out = vec![0u8; len * 4];
                let all: Vec<Span> = data.iter_mut().map(|d| staging(d)).collect();
                reduce_all(&r, staging(&mut out), &all);
                let (own, peers) = data.split_first_mut().expect("n >= 1");
                let peers: Vec<Span> = peers.iter_mut().map(|d| staging(d)).collect();
                reduce_into_own(&r, staging(own), &peers);
                assert_eq!(*own, out, "{n} ranks, {op:?}");
            }
        }
    }

    #[test]
    fn a_streaming_copy_gives_the_bytes_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 131 % 251) as u8).collect();
        let mut dst = vec![0u8; 4200];
        for off in 0..17 {
            for len in [0, 1, 15, 16, 17, 63, 64, 65, 1000, 4000] {
                dst.fill(0);
                copy_streaming(&mut dst[off..off + len], &src[3..3 + len]);
                assert_eq!(&dst[off..off + len], &src[3..3 + len]);
                assert!(dst[..off].iter().all(|&b| b == 0));
                assert!(dst[off + len..].iter().all(|&b| b == 0));
            }
        }
    }
}
