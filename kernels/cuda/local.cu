// Kernels on one GPU's memory: element-wise reduction of two buffers, a
// byte copy, and a fill with a pattern the host can recompute (tests and
// benchmarks write their inputs with it, on the stream, at memory speed).

#define OXCCL_LOCAL_MAX 8

// out[0..nout] = post(pre(in[0]) op pre(in[1]) op ...): which pre and post
// steps apply is given by flags as for one step of a chain (OXCCL_F_PRE_S
// for in[0], OXCCL_F_PRE_R for every later input, OXCCL_F_POST at the
// end). With one input it is a copy to every output.
struct ReduceArgs {
  u64 in[OXCCL_LOCAL_MAX];
  u64 out[OXCCL_LOCAL_MAX];
  u64 count;
  Scalars sc;
  u32 flags;
  u32 nin;
  u32 nout;
  u32 pad;
};

struct CopyArgs {
  u64 dst;
  u64 src;
  u64 bytes;
};

struct FillArgs {
  u64 dst;
  u64 count;
  u64 seed;
  u64 modulus;  // values are ((i * 2654435761 + seed) mod modulus) + offset
  i64 offset;
};

// Each block takes an equal, 16-byte aligned share: the blocks then run the
// same loop as a collective's channel.
__device__ __forceinline__ void oxccl_block_share(u64 count, u64 align, u64* lo, u64* hi) {
  u64 per = (count + gridDim.x - 1) / gridDim.x;
  per = (per + align - 1) / align * align;
  *lo = min((u64)blockIdx.x * per, count);
  *hi = min(*lo + per, count);
}

// The flags of reduce step k (1 to nin - 1): the first step scales both of
// its operands, later ones only the new input (the running value is scaled
// already), and the last one applies the post step.
__device__ __forceinline__ u32 oxccl_step_flags(u32 flags, u32 k, u32 nin) {
  const u32 pre = k == 1 ? flags & (OXCCL_F_PRE_S | OXCCL_F_PRE_R) : flags & OXCCL_F_PRE_R;
  return pre | (k + 1 == nin ? flags & OXCCL_F_POST : 0);
}

// One pass over the block's range: each thread reads every input's element
// (16 bytes at a time, OXCCL_UNROLL in flight per input), reduces them in
// order, rounding to T after each step exactly as a chain of two-input steps
// would, and writes the result to every output. An element is read and
// written by one thread only, so any output may also be an input (a rank in
// place) as long as they alias at the same offset.
//
// Why one pass: memory traffic is then (nin + nout) x the bytes of one
// buffer, the least a reduce can move. Reducing input by input through
// out[0] (each pass re-reading it: at 256 MiB it does not stay in L2) and
// then copying out[0] to the other outputs two at a time moved 3 + 3 + 4 + 3
// = 13 buffers for 4 inputs into 4 outputs where 8 suffice. At the H100's 3.35 TB/s the 4-rank all-reduce of 256 MiB is
// bounded by 8 x 256 MiB / 3.35 TB/s = 0.64 ms (busbw 629 GB/s); measured
// before this kernel: 284.5 GB/s, i.e. 1.52 TB/s of useful traffic but
// 2.47 TB/s of actual traffic, the same rate as the 2-rank one-pass case.
template <typename T, typename Op>
__global__ void __launch_bounds__(1024, 1) oxccl_reduce(const __grid_constant__ ReduceArgs r) {
  u64 lo, hi;
  oxccl_block_share(r.count, 16 / sizeof(T), &lo, &hi);
  if (lo >= hi || r.nout == 0 || r.nin == 0) return;
  const u64 n = hi - lo;
  const u64 V = 16 / sizeof(T);
  u64 addr_or = 0;
  for (u32 k = 0; k < r.nin; k++) addr_or |= r.in[k];
  for (u32 j = 0; j < r.nout; j++) addr_or |= r.out[j];
  const u64 nv = (addr_or & 15) == 0 ? n / V : 0;
  const u64 stride = blockDim.x;
  u64 i = threadIdx.x;
  for (; i + (OXCCL_UNROLL - 1) * stride < nv; i += OXCCL_UNROLL * stride) {
    uint4 acc[OXCCL_UNROLL];
    const uint4* in0 = (const uint4*)((const T*)r.in[0] + lo);
#pragma unroll
    for (int u = 0; u < OXCCL_UNROLL; u++) acc[u] = in0[i + u * stride];
    for (u32 k = 1; k < r.nin; k++) {
      const uint4* in = (const uint4*)((const T*)r.in[k] + lo);
      const u32 f = oxccl_step_flags(r.flags, k, r.nin);
      uint4 b[OXCCL_UNROLL];
#pragma unroll
      for (int u = 0; u < OXCCL_UNROLL; u++) b[u] = in[i + u * stride];
#pragma unroll
      for (int u = 0; u < OXCCL_UNROLL; u++) acc[u] = oxccl_pack<T, Op, true, true>(acc[u], b[u], f, r.sc);
    }
    for (u32 j = 0; j < r.nout; j++) {
      uint4* out = (uint4*)((T*)r.out[j] + lo);
#pragma unroll
      for (int u = 0; u < OXCCL_UNROLL; u++) out[i + u * stride] = acc[u];
    }
  }
  for (; i < nv; i += stride) {
    uint4 acc = ((const uint4*)((const T*)r.in[0] + lo))[i];
    for (u32 k = 1; k < r.nin; k++) {
      const uint4 b = ((const uint4*)((const T*)r.in[k] + lo))[i];
      acc = oxccl_pack<T, Op, true, true>(acc, b, oxccl_step_flags(r.flags, k, r.nin), r.sc);
    }
    for (u32 j = 0; j < r.nout; j++) ((uint4*)((T*)r.out[j] + lo))[i] = acc;
  }
  for (u64 e = nv * V + threadIdx.x; e < n; e += stride) {
    T acc = ((const T*)r.in[0])[lo + e];
    for (u32 k = 1; k < r.nin; k++) {
      const T b = ((const T*)r.in[k])[lo + e];
      acc = oxccl_elem<T, Op, true, true>(acc, b, oxccl_step_flags(r.flags, k, r.nin), r.sc);
    }
    for (u32 j = 0; j < r.nout; j++) ((T*)r.out[j])[lo + e] = acc;
  }
}

extern "C" __global__ void __launch_bounds__(1024, 1) oxccl_copy(const __grid_constant__ CopyArgs c) {
  u64 lo, hi;
  oxccl_block_share(c.bytes, 16, &lo, &hi);
  if (lo >= hi) return;
  oxccl_copy_loop<false>((const u8*)c.src + lo, (u8*)c.dst + lo, 0, hi - lo, threadIdx.x, blockDim.x);
}

template <typename A> __device__ __forceinline__ A oxccl_from_i64(i64 v) { return (A)v; }

template <typename T> __global__ void __launch_bounds__(1024, 1) oxccl_fill(const __grid_constant__ FillArgs f) {
  typedef typename Elem<T>::Acc A;
  T* dst = (T*)f.dst;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < f.count; i += (u64)gridDim.x * blockDim.x) {
    const i64 v = (i64)((i * 2654435761ull + f.seed) % f.modulus) + f.offset;
    dst[i] = Elem<T>::store(oxccl_from_i64<A>(v));
  }
}
