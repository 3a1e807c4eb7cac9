// Two ranks of one process through oxccl's (or NCCL's) C API, made by
// ncclCommInitAll on the GPUs given: the copy engine's device-to-device
// speed on cudaMalloc and ncclMemAlloc memory, then all_to_all, sendrecv
// and reduce on each kind of memory (1, 16, 256 MiB), and a reduce of
// 256 MiB alone and after a sweep of smaller ones. With "0 0" both ranks
// share GPU 0 (NCCL refuses that).
//
//   nvcc -O2 -arch=sm_90 -I capi/include -o capi_probe tools/capi_probe.cu \
//       -L <dir with libnccl.so> -lnccl
//   LD_LIBRARY_PATH=<dir> ./capi_probe 0 1            # everything
//   LD_LIBRARY_PATH=<dir> ./capi_probe 0 0 OP MEM STREAMS CALLS
//       # OP (Allreduce, a2a, sendrecv, reduce) of 1 MiB, CALLS timed calls
//       # after 2; MEM 0 cudaMalloc, 1 ncclMemAlloc; STREAMS 0 non-blocking,
//       # 1 blocking, 2 the null stream. CALLS 0: one all_reduce, then each
//       # rank's stream is polled for 5 s (what does not complete).
//   PROBE_NO_MEMALLOC=1: no ncclMemAlloc; its rows reuse the cudaMalloc buffers.
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <cuda_runtime.h>
#include <nccl.h>
#define CK(x) do { cudaError_t ck_e_ = (x); if (ck_e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(ck_e_)); exit(1); } } while (0)
#define NK(x) do { ncclResult_t nk_r_ = (x); if (nk_r_ != ncclSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, ncclGetErrorString(nk_r_)); exit(1); } } while (0)
int devs[2];
ncclComm_t comms[2];
cudaStream_t st[2];
void* sb[2][2]; void* rb[2][2];  // [kind][rank]: kind 0 cudaMalloc, 1 ncclMemAlloc
const size_t MAXB = 512ull << 20;
double timed(int kind, const char* op, size_t bytes, int iters) {
  cudaEvent_t a, b; CK(cudaSetDevice(devs[0])); CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int it = -2; it < iters; it++) {
    if (it == 0) CK(cudaEventRecord(a, st[0]));
    NK(ncclGroupStart());
    for (int r = 0; r < 2; r++) {
      CK(cudaSetDevice(devs[r]));
      if (op[0] == 'a') NK(ncclAlltoAll(sb[kind][r], rb[kind][r], bytes / 8, ncclFloat, comms[r], st[r]));
      else if (op[0] == 'r') NK(ncclReduce(sb[kind][r], rb[kind][r], bytes / 4, ncclFloat, ncclSum, 0, comms[r], st[r]));
      else if (op[0] == 'A') NK(ncclAllReduce(sb[kind][r], rb[kind][r], bytes / 4, ncclFloat, ncclSum, comms[r], st[r]));
      else if (op[0] == 's') { NK(ncclSend(sb[kind][r], bytes / 4, ncclFloat, 1 - r, comms[r], st[r])); NK(ncclRecv(rb[kind][r], bytes / 4, ncclFloat, 1 - r, comms[r], st[r])); }
    }
    NK(ncclGroupEnd());
  }
  CK(cudaSetDevice(devs[0])); CK(cudaEventRecord(b, st[0]));
  for (int r = 0; r < 2; r++) { CK(cudaSetDevice(devs[r])); CK(cudaStreamSynchronize(st[r])); }
  float ms; CK(cudaEventElapsedTime(&ms, a, b));
  return ms * 1e3 / iters;
}
int main(int argc, char** argv) {
  devs[0] = argc > 2 ? atoi(argv[1]) : 0; devs[1] = argc > 2 ? atoi(argv[2]) : 1;
  NK(ncclCommInitAll(comms, 2, devs));
  for (int r = 0; r < 2; r++) {
    CK(cudaSetDevice(devs[r]));
    int sk = argc > 5 ? atoi(argv[5]) : 0;
    if (sk == 0) CK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
    else if (sk == 1) CK(cudaStreamCreate(&st[r]));
    else st[r] = 0;
    CK(cudaMalloc(&sb[0][r], MAXB)); CK(cudaMalloc(&rb[0][r], MAXB));
    if (getenv("PROBE_NO_MEMALLOC")) { sb[1][r] = sb[0][r]; rb[1][r] = rb[0][r]; }
    else { ncclResult_t a = ncclMemAlloc(&sb[1][r], MAXB), b = ncclMemAlloc(&rb[1][r], MAXB);
      int cur = -1; cudaGetDevice(&cur);
      printf("ncclMemAlloc rank %d (device %d, current %d): %d %p, %d %p\n", r, devs[r], cur, (int)a, sb[1][r], (int)b, rb[1][r]); fflush(stdout); }
    for (int k = 0; k < 2; k++) {
      cudaError_t e1 = cudaMemset(sb[k][r], 1, MAXB), e2 = cudaMemset(rb[k][r], 0, MAXB);
      if (e1 || e2) printf("memset rank %d kind %d (%p %p): %s / %s\n", r, k, sb[k][r], rb[k][r], cudaGetErrorString(e1), cudaGetErrorString(e2));
      cudaGetLastError();
    }
  }
  CK(cudaSetDevice(devs[0]));
  const char* kn[2] = {"cudaMalloc", "ncclMemAlloc"};
  if (argc > 4) {  // one op, one kind, 1 MiB: which hangs
    int k = atoi(argv[4]);
    printf("%s %s 1 MiB starting\n", argv[3], kn[k]); fflush(stdout);
    int its = argc > 6 ? atoi(argv[6]) : 3;
    if (its == 0) {  // one call, then wait on each stream with a bound
      NK(ncclGroupStart());
      for (int r = 0; r < 2; r++) { CK(cudaSetDevice(devs[r])); NK(ncclAllReduce(sb[k][r], rb[k][r], (1 << 20) / 4, ncclFloat, ncclSum, comms[r], st[r])); }
      NK(ncclGroupEnd());
      printf("enqueued\n"); fflush(stdout);
      for (int t = 0; t < 50; t++) {
        cudaError_t q0 = cudaStreamQuery(st[0]), q1 = cudaStreamQuery(st[1]);
        if (t % 10 == 0 || (q0 == cudaSuccess && q1 == cudaSuccess)) { printf("t=%d00ms stream0 %s stream1 %s\n", t, cudaGetErrorName(q0), cudaGetErrorName(q1)); fflush(stdout); }
        if (q0 == cudaSuccess && q1 == cudaSuccess) break;
        usleep(100000);
      }
      return 0;
    }
    double t = timed(k, argv[3], 1 << 20, its);
    printf("%s %s 1 MiB: %.1f us\n", argv[3], kn[k], t); fflush(stdout);
    return 0;
  }
  for (int k = 0; k < 2; k++) {
    cudaEvent_t a, b; CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
    CK(cudaMemcpyAsync(rb[k][0], sb[k][0], 128 << 20, cudaMemcpyDeviceToDevice, st[0]));
    CK(cudaEventRecord(a, st[0]));
    for (int i = 0; i < 10; i++) CK(cudaMemcpyAsync(rb[k][0], sb[k][0], 128 << 20, cudaMemcpyDeviceToDevice, st[0]));
    CK(cudaEventRecord(b, st[0])); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b));
    printf("copy engine D2D 128 MiB, %s: %.1f us, %.1f GB/s\n", kn[k], ms * 100, 10.0 * (128 << 20) / (ms * 1e-3) / 1e9);
  }
  size_t sizes[] = {1 << 20, 16 << 20, 256 << 20};
  for (int k = 0; k < 2; k++) for (size_t s : sizes) {
    printf("all_to_all %s %zu B starting\n", kn[k], s); fflush(stdout);
    double t = timed(k, "a2a", s, 10);
    printf("all_to_all %s %zu B: %.1f us, busbw %.1f\n", kn[k], s, t, s / 2.0 / (t * 1e-6) / 1e9);
    t = timed(k, "sendrecv", s, 10);
    printf("sendrecv   %s %zu B: %.1f us, busbw %.1f\n", kn[k], s, t, s / (t * 1e-6) / 1e9);
  }
  for (int k = 0; k < 2; k++) {
    double alone = timed(k, "reduce", 256 << 20, 10);
    for (size_t s = 8; s < (256 << 20); s *= 4) timed(k, "reduce", s, 5);
    double after = timed(k, "reduce", 256 << 20, 10);
    printf("reduce %s 256 MiB: alone %.1f us (%.1f GB/s), after a sweep from 8 B %.1f us (%.1f GB/s)\n", kn[k], alone, (256 << 20) / (alone * 1e-6) / 1e9, after, (256 << 20) / (after * 1e-6) / 1e9);
  }
  return 0;
}
