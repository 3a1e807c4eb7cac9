// Kernels on one GPU's memory: element-wise reduction of two buffers, a
// byte copy, and a fill with a pattern the host can recompute (tests and
// benchmarks write their inputs with it, on the stream, at memory speed).

struct ReduceArgs {
  u64 dst;
  u64 a;
  u64 b;
  u64 count;
  Scalars sc;
  u32 flags;  // OXCCL_F_PRE_S (scale a), OXCCL_F_PRE_R (scale b), OXCCL_F_POST
  u32 pad;
  u64 dst2;   // 0, or a second output: a copy of dst
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
  if (lo >= hi) return;
  oxccl_rc_loop<T, Op, true, true>((const T*)r.a + lo, (const T*)r.b + lo, (T*)r.dst + lo, 0, hi - lo, r.flags, r.sc,
                                   threadIdx.x, blockDim.x);
  // The block copies only the range it reduced, after all of it is written:
  // dst2 may be b (a peer's in-place buffer), which no other block reads here.
  if (r.dst2) {
    __syncthreads();
    oxccl_copy_loop<false>((const u8*)((const T*)r.dst + lo), (u8*)((T*)r.dst2 + lo), 0, (hi - lo) * sizeof(T),
                           threadIdx.x, blockDim.x);
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
