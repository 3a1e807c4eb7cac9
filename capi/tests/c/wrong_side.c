/* Which side of the PCIe bus a communicator made through the C API lives
 * on, and what it does with a buffer from the other side. Run by
 * capi/tests/c_api.rs as one rank, in one of three modes (argv[1]):
 *
 *   nogpu   no GPU on the machine: the communicator runs on host memory,
 *           ncclCommCuDevice refuses, a host all-reduce is exact, and
 *           ncclCommMemStats reports no GPU memory (also in host mode).
 *   host    a GPU exists but OXCCL_HOST_MEMORY=1: host communicator; GPU
 *           memory (ncclMemAlloc) as sendbuff or recvbuff is refused with
 *           ncclInvalidArgument naming the argument.
 *   device  a GPU exists and no CUDA context is current (nothing here calls
 *           CUDA): the communicator is on device 0, as NCCL's cudaGetDevice
 *           default; it holds GPU memory (its device window), which
 *           ncclCommMemStats reports; pageable host memory as sendbuff or
 *           recvbuff is refused with ncclInvalidArgument naming the argument.
 *
 * Prints "PASS" at the end. */
#include "nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* ncclCommMemStats: `total` GPU bytes, all of it persistent (oxccl cannot
 * suspend), none suspended. */
static void mem_stats(ncclComm_t comm, int on_gpu) {
  uint64_t total = 0, persist = 0, suspend = 1, suspended = 1;
  CHECK(ncclCommMemStats(comm, ncclStatGpuMemTotal, &total));
  CHECK(ncclCommMemStats(comm, ncclStatGpuMemPersist, &persist));
  CHECK(ncclCommMemStats(comm, ncclStatGpuMemSuspend, &suspend));
  CHECK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &suspended));
  EXPECT(on_gpu ? total > 0 : total == 0, "total %llu GPU bytes", (unsigned long long)total);
  EXPECT(persist == total && suspend == 0 && suspended == 0, "persist %llu, suspend %llu, suspended %llu",
         (unsigned long long)persist, (unsigned long long)suspend, (unsigned long long)suspended);
  printf("ncclCommMemStats: %llu GPU bytes\n", (unsigned long long)total);
}

/* The call must fail with ncclInvalidArgument, and the last error must name
 * `arg`; the communicator stays usable. */
static void refused(ncclComm_t comm, ncclResult_t r, const char* arg) {
  const char* msg = ncclGetLastError(comm);
  EXPECT(r == ncclInvalidArgument, "got %d (%s), wanted ncclInvalidArgument: %s", r,
         ncclGetErrorString(r), msg);
  EXPECT(strstr(msg, arg) != NULL, "the message does not name %s: %s", arg, msg);
  printf("refused as expected: %s\n", msg);
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "nogpu";
  enum { N = 1024 };
  ncclUniqueId id;
  ncclComm_t comm;
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclCommInitRank(&comm, 1, id, 0));
  int dev = -1;
  ncclResult_t r = ncclCommCuDevice(comm, &dev);
  float* host = malloc(N * sizeof(float));
  float* out = malloc(N * sizeof(float));
  for (int i = 0; i < N; i++) host[i] = (float)(i % 13);

  if (strcmp(mode, "nogpu") == 0 || strcmp(mode, "host") == 0) {
    EXPECT(r == ncclInvalidUsage, "ncclCommCuDevice on a host communicator gave %d, device %d", r, dev);
    mem_stats(comm, 0);
    CHECK(ncclAllReduce(host, out, N, ncclFloat, ncclSum, comm, NULL));
    for (int i = 0; i < N; i++) EXPECT(out[i] == host[i], "element %d: %g != %g", i, out[i], host[i]);
    if (strcmp(mode, "host") == 0) {
      void* gpu = NULL;
      CHECK(ncclMemAlloc(&gpu, N * sizeof(float)));
      refused(comm, ncclAllReduce(gpu, out, N, ncclFloat, ncclSum, comm, NULL), "sendbuff");
      refused(comm, ncclAllReduce(host, gpu, N, ncclFloat, ncclSum, comm, NULL), "recvbuff");
      refused(comm, ncclBroadcast(gpu, gpu, N, ncclFloat, 0, comm, NULL), "sendbuff");
      /* Still usable after the refusals. */
      CHECK(ncclAllReduce(host, out, N, ncclFloat, ncclSum, comm, NULL));
      CHECK(ncclMemFree(gpu));
    }
  } else if (strcmp(mode, "device") == 0) {
    EXPECT(r == ncclSuccess && dev == 0, "ncclCommCuDevice gave %d, device %d: %s", r, dev,
           ncclGetLastError(comm));
    mem_stats(comm, 1);
    void* gpu = NULL;
    CHECK(ncclMemAlloc(&gpu, N * sizeof(float)));
    refused(comm, ncclAllReduce(host, gpu, N, ncclFloat, ncclSum, comm, NULL), "sendbuff");
    refused(comm, ncclAllReduce(gpu, out, N, ncclFloat, ncclSum, comm, NULL), "recvbuff");
    CHECK(ncclAllReduce(gpu, gpu, N, ncclFloat, ncclSum, comm, NULL));
    CHECK(ncclMemFree(gpu));
  } else {
    EXPECT(0, "unknown mode %s", mode);
  }
  CHECK(ncclCommDestroy(comm));
  free(host);
  free(out);
  printf("PASS %s\n", mode);
  return 0;
}
