// oxccl's P2P FIFO protocol alone, without the rest of its kernel: GPU 0's
// blocks push 1 GiB, each its share, into a ring of 8 slots a block on GPU 1,
// with a fence and a tail flag a slice; GPU 1's blocks wait for each slot,
// copy it out and hand it back (head). What a collective kernel built on the
// protocol can move over NVLink at NCCL's CTA count.
//
//   nvcc -O3 -arch=sm_90 -o nvlink_fifo_probe tools/nvlink_fifo_probe.cu && ./nvlink_fifo_probe
//
// Variants: fence-all (thread 0 fences and posts after the block's barrier,
// every thread waits for it, as oxccl_slice), apart (the last warp fences and
// posts while the others move the next slice, as NCCL's extra warp),
// ack-only (the receiver hands slots back without copying them), volatile
// polls instead of acquire loads, 512 threads a sending block. GB/s one way,
// best of 3 runs after one.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
typedef unsigned long long u64;
__device__ __forceinline__ void st_rel(volatile u64* p, u64 v) { asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); }
__device__ __forceinline__ u64 ld_acq(volatile u64* p) { u64 v; asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ u64 ld_vol(volatile u64* p) { u64 v; asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ uint4 ldcg(const uint4* p) { uint4 v; asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p)); return v; }

template <bool CG>
__device__ __forceinline__ void copy(const uint4* s, uint4* d, size_t n, int tid, int nthr) {
  size_t i = tid;
  for (; i + 3 * nthr < n; i += 4 * nthr) {
    uint4 a[4];
#pragma unroll
    for (int u = 0; u < 4; u++) a[u] = CG ? ldcg(s + i + u * nthr) : s[i + u * nthr];
#pragma unroll
    for (int u = 0; u < 4; u++) d[i + u * nthr] = a[u];
  }
  for (; i < n; i += nthr) d[i] = CG ? ldcg(s + i) : s[i];
}

struct Ctl { u64 tail; u64 pad[7]; u64 head; u64 pad2[7]; };
__shared__ u64 sh_head;

// APART: last warp fences/posts; ACQ: acquire loads for polling (else volatile)
template <bool APART, bool ACQ>
__global__ void __launch_bounds__(1024, 1) sender(const uint4* src, uint4* ring, Ctl* remote, Ctl* mine, size_t per, size_t slice, int nslots, u64 base) {
  const uint4* s = src + blockIdx.x * per;
  uint4* r = ring + (size_t)blockIdx.x * nslots * slice;
  volatile u64* tail = &remote[blockIdx.x].tail;
  volatile u64* head = &mine[blockIdx.x].head;
  const int nw = APART ? blockDim.x - 32 : blockDim.x;
  u64 k = base;
  if (threadIdx.x == 0) sh_head = ACQ ? ld_acq(head) : ld_vol(head);
  __syncthreads();
  for (size_t off = 0; off < per; off += slice, k++) {
    const size_t n = per - off < slice ? per - off : slice;
    if (threadIdx.x < nw) {
      if (threadIdx.x == 0) { while (k + 1 > sh_head + nslots) sh_head = ACQ ? ld_acq(head) : ld_vol(head); }
      asm volatile("bar.sync 1, %0;" ::"r"(nw) : "memory");
      copy<false>(s + off, r + (k % nslots) * slice, n, threadIdx.x, nw);
    }
    __syncthreads();
    if (threadIdx.x == (APART ? nw : 0)) { asm volatile("fence.acq_rel.sys;" ::: "memory"); st_rel(tail, k + 1); }
  }
}

template <bool TOUCH, bool ACQ>
__global__ void __launch_bounds__(1024, 1) receiver(const uint4* ring, uint4* out, Ctl* mine, Ctl* remote, size_t per, size_t slice, int nslots, u64 base) {
  const uint4* r = ring + (size_t)blockIdx.x * nslots * slice;
  uint4* o = out + blockIdx.x * per;
  volatile u64* tail = &mine[blockIdx.x].tail;
  volatile u64* head = &remote[blockIdx.x].head;
  u64 k = base;
  for (size_t off = 0; off < per; off += slice, k++) {
    const size_t n = per - off < slice ? per - off : slice;
    if (threadIdx.x == 0) { while ((ACQ ? ld_acq(tail) : ld_vol(tail)) < k + 1) {} }
    __syncthreads();
    if (TOUCH) copy<true>(r + (k % nslots) * slice, o + off, n, threadIdx.x, blockDim.x);
    __syncthreads();
    if (threadIdx.x == 0) st_rel(head, k + 1);
  }
}

int main() {
  int nd = 0; CK(cudaGetDeviceCount(&nd)); if (nd < 2) return printf("2 GPUs needed\n"), 0;
  const size_t bytes = 1ull << 30;
  uint4 *src, *ring, *out; Ctl *c0, *c1;
  CK(cudaSetDevice(1)); CK(cudaDeviceEnablePeerAccess(0, 0)); CK(cudaMalloc(&ring, 256ull << 20)); CK(cudaMalloc(&out, bytes)); CK(cudaMalloc(&c1, 64 * sizeof(Ctl))); CK(cudaMemset(c1, 0, 64 * sizeof(Ctl)));
  cudaStream_t s1; CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaSetDevice(0)); CK(cudaDeviceEnablePeerAccess(1, 0)); CK(cudaMalloc(&src, bytes)); CK(cudaMalloc(&c0, 64 * sizeof(Ctl))); CK(cudaMemset(c0, 0, 64 * sizeof(Ctl)));
  CK(cudaMemset(src, 1, bytes));
  cudaStream_t s0; CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  const int blocks[] = {24, 32};
  const size_t slices[] = {256 << 10, 512 << 10, 1 << 20};
  for (int bi = 0; bi < 2; bi++) for (int si = 0; si < 3; si++) for (int m = 0; m < 6; m++) {
    const int B = blocks[bi]; const size_t per = bytes / 16 / B / 16 * 16, sl = slices[si] / 16;
    const u64 nsl = (per + sl - 1) / sl;
    float best = 1e30f;
    for (int rep = 0; rep < 4; rep++) {
      // all blocks start from one common base: counters restart per config
      CK(cudaSetDevice(1)); CK(cudaMemset(c1, 0, 64 * sizeof(Ctl))); CK(cudaDeviceSynchronize());
      CK(cudaSetDevice(0)); CK(cudaMemset(c0, 0, 64 * sizeof(Ctl))); CK(cudaDeviceSynchronize());
      CK(cudaSetDevice(1));
      switch (m) {
        case 0: case 1: case 4: receiver<true, true><<<B, 1024, 0, s1>>>(ring, out, c1, c0, per, sl, 8, 0); break;
        case 2: receiver<false, true><<<B, 1024, 0, s1>>>(ring, out, c1, c0, per, sl, 8, 0); break;
        case 3: case 5: receiver<true, false><<<B, 1024, 0, s1>>>(ring, out, c1, c0, per, sl, 8, 0); break;
      }
      CK(cudaSetDevice(0));
      CK(cudaEventRecord(a, s0));
      switch (m) {
        case 0: case 2: sender<false, true><<<B, 1024, 0, s0>>>(src, ring, c1, c0, per, sl, 8, 0); break;
        case 1: sender<true, true><<<B, 1024, 0, s0>>>(src, ring, c1, c0, per, sl, 8, 0); break;
        case 3: sender<false, false><<<B, 1024, 0, s0>>>(src, ring, c1, c0, per, sl, 8, 0); break;
        case 4: sender<false, true><<<B, 512, 0, s0>>>(src, ring, c1, c0, per, sl, 8, 0); break;
        case 5: sender<true, false><<<B, 1024, 0, s0>>>(src, ring, c1, c0, per, sl, 8, 0); break;
      }
      CK(cudaEventRecord(b, s0)); CK(cudaEventSynchronize(b)); CK(cudaGetLastError());
      CK(cudaSetDevice(1)); CK(cudaStreamSynchronize(s1)); CK(cudaGetLastError()); CK(cudaSetDevice(0));
      float ms; CK(cudaEventElapsedTime(&ms, a, b)); if (rep && ms < best) best = ms;
    }
    const char* names[] = {"fence-all+recv", "apart+recv", "fence-all+ack-only", "fence-all+recv,volatile-poll", "fence-all,512thr+recv", "apart+recv,volatile"};
    printf("blocks %2d slice %4zuK %-30s %7.1f GB/s (%llu slices a block)\n", B, slices[si] >> 10, names[m], per * 16.0 * B / best / 1e6, nsl);
  }
  return 0;
}
