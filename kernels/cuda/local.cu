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

template <typename T, typename Op>
__global__ void __launch_bounds__(1024, 1) oxccl_reduce(const __grid_constant__ ReduceArgs r) {
  u64 lo, hi;
  oxccl_block_share(r.count, 16 / sizeof(T), &lo, &hi);
  if (lo >= hi || r.nout == 0) return;
  T* dst = (T*)r.out[0] + lo;
  T* dst2 = r.nout > 1 ? (T*)r.out[1] + lo : 0;
  const u64 n = hi - lo;
  // Each pass reads what the block wrote in the one before, in its own
  // range only: an output may be an input of this or an earlier pass (a
  // rank in place), never of a later one (the caller orders the inputs so).
  for (u32 k = 1; k < r.nin; k++) {
    const bool last = k + 1 == r.nin;
    const u32 pre = k == 1 ? r.flags & (OXCCL_F_PRE_S | OXCCL_F_PRE_R) : r.flags & OXCCL_F_PRE_R;
    const u32 f = pre | (last ? r.flags & OXCCL_F_POST : 0);
    if (k > 1) __syncthreads();
    const T* a = k == 1 ? (const T*)r.in[0] + lo : dst;
    oxccl_rc_loop<T, Op, true, true>(a, (const T*)r.in[k] + lo, dst, last ? dst2 : 0, n, f, r.sc, threadIdx.x,
                                     blockDim.x);
  }
  const u8* src = (const u8*)(r.nin > 1 ? dst : (const T*)r.in[0] + lo);
  u32 first = 2;
  if (r.nin <= 1) first = 0;
  else __syncthreads();
  for (u32 j = first; j < r.nout; j += 2) {
    u8* o2 = j + 1 < r.nout ? (u8*)((T*)r.out[j + 1] + lo) : 0;
    oxccl_copy_loop<false>(src, (u8*)((T*)r.out[j] + lo), o2, n * sizeof(T), threadIdx.x, blockDim.x);
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
