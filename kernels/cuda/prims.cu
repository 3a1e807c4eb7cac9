// The data path of every kernel: one thread block reads up to two sources
// (a user buffer, a FIFO slot), combines them element-wise, and writes up to
// two destinations (a user buffer, a peer's FIFO slot), 16 bytes per access
// with several loads in flight per thread.
//
// FIFO slots are written by another GPU, so they are read with ld.global.cg:
// the data goes through L2 (where the peer's stores land) and never through
// L1, which is not coherent and could hold the slot's previous contents.

#define OXCCL_F_PRE_S 1   // scale the source operand (a rank's own input)
#define OXCCL_F_PRE_R 2   // scale the received operand (local reduce only)
#define OXCCL_F_POST 4    // divide the result (final step of an integer average)
#define OXCCL_F_ROUND 8   // round the scaled source to T first, as a peer received it

#define OXCCL_UNROLL 4

__device__ __forceinline__ uint4 oxccl_ldcg_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <int S> struct OxRaw;
template <> struct OxRaw<1> {
  static __device__ __forceinline__ u8 ldcg(const void* p) {
    u16 v;
    asm volatile("ld.global.cg.u8 %0, [%1];" : "=h"(v) : "l"(p));
    return (u8)v;
  }
  typedef u8 T;
};
template <> struct OxRaw<2> {
  static __device__ __forceinline__ u16 ldcg(const void* p) {
    u16 v;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
  }
  typedef u16 T;
};
template <> struct OxRaw<4> {
  static __device__ __forceinline__ u32 ldcg(const void* p) {
    u32 v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
  }
  typedef u32 T;
};
template <> struct OxRaw<8> {
  static __device__ __forceinline__ u64 ldcg(const void* p) {
    u64 v;
    asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(p));
    return v;
  }
  typedef u64 T;
};

template <typename T> __device__ __forceinline__ T oxccl_ldcg(const T* p) {
  union {
    typename OxRaw<sizeof(T)>::T r;
    T t;
  } u;
  u.r = OxRaw<sizeof(T)>::ldcg(p);
  return u.t;
}

template <typename T> union OxPack {
  uint4 u;
  T e[16 / sizeof(T)];
};

// One element: the source (scaled on entry, possibly rounded to T as the
// peer saw it) combined with the received value, then the final division.
template <typename T, typename Op, bool SRC, bool RCV>
__device__ __forceinline__ T oxccl_elem(T s, T r, u32 flags, const Scalars& sc) {
  typedef typename Elem<T>::Acc A;
  A local = A(), res;
  if (SRC) {
    local = Elem<T>::load(s);
    if (Op::PRE && (flags & OXCCL_F_PRE_S)) {
      local = Arith<A>::scale(local, sc);
      if (flags & OXCCL_F_ROUND) local = Elem<T>::load(Elem<T>::store(local));
    }
  }
  if (RCV) {
    A rv = Elem<T>::load(r);
    if (Op::PRE && (flags & OXCCL_F_PRE_R)) rv = Arith<A>::scale(rv, sc);
    res = SRC ? Op::apply(local, rv) : rv;
  } else {
    res = local;
  }
  if (Op::POST && (flags & OXCCL_F_POST)) res = Arith<A>::div(res, sc);
  return Elem<T>::store(res);
}

template <typename T, typename Op, bool SRC, bool RCV>
__device__ __forceinline__ uint4 oxccl_pack(uint4 s, uint4 r, u32 flags, const Scalars& sc) {
  OxPack<T> a, b, c;
  a.u = s;
  b.u = r;
#pragma unroll
  for (int k = 0; k < (int)(16 / sizeof(T)); k++) c.e[k] = oxccl_elem<T, Op, SRC, RCV>(a.e[k], b.e[k], flags, sc);
  return c.u;
}

// `n` elements by the whole block: src (user memory) and rcv (a FIFO slot)
// in, dst (user memory) and snd (a peer's FIFO slot) out; null pointers are
// absent operands. Falls back to one element per access when any pointer is
// not 16-byte aligned.
template <typename T, typename Op, bool SRC, bool RCV>
__device__ __forceinline__ void oxccl_rc_loop(const T* src, const T* rcv, T* dst, T* snd, u64 n, u32 flags,
                                              const Scalars& sc, u32 tid, u32 nthr) {
  const u64 V = 16 / sizeof(T);
  const u64 stride = nthr;
  const u64 addr_or = (SRC ? (u64)src : 0) | (RCV ? (u64)rcv : 0) | (u64)dst | (u64)snd;
  const u64 nv = (addr_or & 15) == 0 ? n / V : 0;
  u64 i = tid;
  for (; i + (OXCCL_UNROLL - 1) * stride < nv; i += OXCCL_UNROLL * stride) {
    uint4 a[OXCCL_UNROLL], b[OXCCL_UNROLL];
#pragma unroll
    for (int u = 0; u < OXCCL_UNROLL; u++) {
      if (SRC) a[u] = ((const uint4*)src)[i + u * stride];
      else a[u] = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < OXCCL_UNROLL; u++) {
      if (RCV) b[u] = oxccl_ldcg_v4((const uint4*)rcv + i + u * stride);
      else b[u] = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < OXCCL_UNROLL; u++) {
      const uint4 c = oxccl_pack<T, Op, SRC, RCV>(a[u], b[u], flags, sc);
      if (dst) ((uint4*)dst)[i + u * stride] = c;
      if (snd) ((uint4*)snd)[i + u * stride] = c;
    }
  }
  for (; i < nv; i += stride) {
    const uint4 a = SRC ? ((const uint4*)src)[i] : make_uint4(0, 0, 0, 0);
    const uint4 b = RCV ? oxccl_ldcg_v4((const uint4*)rcv + i) : make_uint4(0, 0, 0, 0);
    const uint4 c = oxccl_pack<T, Op, SRC, RCV>(a, b, flags, sc);
    if (dst) ((uint4*)dst)[i] = c;
    if (snd) ((uint4*)snd)[i] = c;
  }
  for (u64 e = nv * V + tid; e < n; e += stride) {
    T a, b;
    if (SRC) a = src[e];
    if (RCV) b = oxccl_ldcg(rcv + e);
    const T c = oxccl_elem<T, Op, SRC, RCV>(a, b, flags, sc);
    if (dst) dst[e] = c;
    if (snd) snd[e] = c;
  }
}

// Plain copies skip the conversions: bit-exact, and no arithmetic per byte.
template <bool FROM_FIFO>
__device__ __forceinline__ void oxccl_copy_loop(const u8* src, u8* dst, u8* snd, u64 bytes, u32 tid, u32 nthr) {
  const u64 stride = nthr;
  const u64 addr_or = (u64)src | (u64)dst | (u64)snd;
  const u64 nv = (addr_or & 15) == 0 ? bytes / 16 : 0;
  u64 i = tid;
  for (; i + (OXCCL_UNROLL - 1) * stride < nv; i += OXCCL_UNROLL * stride) {
    uint4 a[OXCCL_UNROLL];
#pragma unroll
    for (int u = 0; u < OXCCL_UNROLL; u++)
      a[u] = FROM_FIFO ? oxccl_ldcg_v4((const uint4*)src + i + u * stride) : ((const uint4*)src)[i + u * stride];
#pragma unroll
    for (int u = 0; u < OXCCL_UNROLL; u++) {
      if (dst) ((uint4*)dst)[i + u * stride] = a[u];
      if (snd) ((uint4*)snd)[i + u * stride] = a[u];
    }
  }
  for (; i < nv; i += stride) {
    const uint4 a = FROM_FIFO ? oxccl_ldcg_v4((const uint4*)src + i) : ((const uint4*)src)[i];
    if (dst) ((uint4*)dst)[i] = a;
    if (snd) ((uint4*)snd)[i] = a;
  }
  for (u64 e = nv * 16 + tid; e < bytes; e += stride) {
    const u8 a = FROM_FIFO ? oxccl_ldcg(src + e) : src[e];
    if (dst) dst[e] = a;
    if (snd) snd[e] = a;
  }
}

// Dispatch on which operands are present; a step with one source and no
// transformation is a copy. Threads tid of nthr (a block, or a group of its
// warps) share the work.
template <typename T, typename Op>
__device__ __forceinline__ void oxccl_reduce_copy(const T* src, const T* rcv, T* dst, T* snd, u64 n, u32 flags,
                                                  const Scalars& sc, u32 tid, u32 nthr) {
  const bool transform = (Op::PRE && (flags & (OXCCL_F_PRE_S | OXCCL_F_PRE_R))) || (Op::POST && (flags & OXCCL_F_POST));
  if (src && rcv) {
    oxccl_rc_loop<T, Op, true, true>(src, rcv, dst, snd, n, flags, sc, tid, nthr);
  } else if (src) {
    if (transform) oxccl_rc_loop<T, Op, true, false>(src, 0, dst, snd, n, flags, sc, tid, nthr);
    else oxccl_copy_loop<false>((const u8*)src, (u8*)dst, (u8*)snd, n * sizeof(T), tid, nthr);
  } else if (rcv) {
    if (transform) oxccl_rc_loop<T, Op, false, true>(0, rcv, dst, snd, n, flags, sc, tid, nthr);
    else oxccl_copy_loop<true>((const u8*)rcv, (u8*)dst, (u8*)snd, n * sizeof(T), tid, nthr);
  }
}
