// What one CTA can move over NVLink with nothing but loads and stores: the
// ceiling a collective kernel's copy loop works under. GPU 0 copies 1 GiB,
// each block its 1/N, into GPU 1's memory (push) or from it (pull).
//
//   nvcc -O3 -arch=sm_90 -o nvlink_probe tools/nvlink_probe.cu && ./nvlink_probe
//
// Columns: how (push: warps store contiguous runs of 8 x 32 16-byte packs;
// strided: thread t stores packs t, t + T, ... 4 at a time; pull: loads
// from the peer, stores locally), blocks, threads per block, ring (KiB per
// block the pushed stores wrap within, as step slots do; 0: the whole
// destination), local (1: a local copy is stored too, as a broadcast's
// root does out of place); GB/s one way and per block (best of 3 runs).
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t ck_e_ = (x); if (ck_e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(ck_e_)); exit(1); } } while (0)

template <int U, bool WARP>
__global__ void push(const uint4* __restrict__ src, uint4* ldst, uint4* rdst, size_t per, size_t ring) {
  const uint4* s = src + blockIdx.x * per;
  uint4* r = rdst + blockIdx.x * ring;
  uint4* l = ldst ? ldst + blockIdx.x * per : 0;
  const size_t lane = WARP ? threadIdx.x & 31 : threadIdx.x, T = WARP ? 32 : blockDim.x;
  const size_t first = WARP ? (threadIdx.x >> 5) * U * 32 : 0, step = WARP ? (blockDim.x >> 5) * U * 32 : U * T;
  for (size_t c = first; c + U * T <= per; c += step) {
    uint4 a[U];
#pragma unroll
    for (int u = 0; u < U; u++) a[u] = s[c + u * T + lane];
    const size_t rc = c % ring;
#pragma unroll
    for (int u = 0; u < U; u++) {
      r[rc + u * T + lane] = a[u];
      if (l) l[c + u * T + lane] = a[u];
    }
  }
}

__global__ void pull(const uint4* rsrc, uint4* ldst, size_t per) {
  const uint4* s = rsrc + blockIdx.x * per;
  uint4* l = ldst + blockIdx.x * per;
  const size_t lane = threadIdx.x & 31;
  for (size_t c = (threadIdx.x >> 5) * 256; c + 256 <= per; c += (blockDim.x >> 5) * 256) {
    uint4 a[8];
#pragma unroll
    for (int u = 0; u < 8; u++) a[u] = __ldcg(s + c + u * 32 + lane);
#pragma unroll
    for (int u = 0; u < 8; u++) l[c + u * 32 + lane] = a[u];
  }
}

int main() {
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) return printf("skipped: %d GPU(s), 2 needed\n", n), 0;
  const size_t bytes = 1ull << 30, packs = bytes / 16;
  uint4 *src[2], *loc[2], *rem[2];
  for (int d = 0; d < 2; d++) {
    CK(cudaSetDevice(d));
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaMalloc(&src[d], bytes));
    CK(cudaMalloc(&loc[d], bytes));
    CK(cudaMalloc(&rem[d], bytes));
    CK(cudaMemset(src[d], 1, bytes));
  }
  CK(cudaSetDevice(0));
  cudaStream_t st;
  cudaEvent_t e0, e1;
  CK(cudaStreamCreate(&st));
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  printf("%-8s %6s %7s %6s %5s  %8s %8s\n", "how", "blocks", "threads", "ring", "local", "GB/s", "per CTA");
  const char* how[] = {"push", "strided", "pull"};
  for (int b : {16, 24, 32})
    for (int t : {512, 1024})
      for (int m = 0; m < 3; m++)
        for (size_t rk : {(size_t)0, (size_t)4096, (size_t)256})
          for (int local = 0; local < 2; local++) {
            if (m == 2 && (rk || local)) continue;
            const size_t per = packs / b, ring = rk ? rk * 1024 / 16 : per;
            float best = 1e9;
            for (int rep = 0; rep < 4; rep++) {
              CK(cudaEventRecord(e0, st));
              if (m == 0) push<8, true><<<b, t, 0, st>>>(src[0], local ? loc[0] : 0, rem[1], per, ring);
              else if (m == 1) push<4, false><<<b, t, 0, st>>>(src[0], local ? loc[0] : 0, rem[1], per, ring);
              else pull<<<b, t, 0, st>>>(src[1], loc[0], per);
              CK(cudaEventRecord(e1, st));
              CK(cudaEventSynchronize(e1));
              float ms;
              CK(cudaEventElapsedTime(&ms, e0, e1));
              if (rep && ms < best) best = ms;  // the first run warms up
            }
            const double gbs = bytes / (best * 1e-3) / 1e9;
            printf("%-8s %6d %7d %6zu %5d  %8.1f %8.2f\n", how[m], b, t, rk, local, gbs, gbs / b);
          }
  return 0;
}
