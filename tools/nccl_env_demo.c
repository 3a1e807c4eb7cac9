/* What tools/env_plugin_nccl.sh runs on a given libnccl.so.2, for reading
 * NCCL's INFO log: ncclGetUniqueId (loads the env plugin and starts the
 * bootstrap network, which reads NCCL_SOCKET_IFNAME; no GPU needed), then,
 * when a CUDA runtime is given, one all-reduce on GPU 0, checked. No NCCL
 * or CUDA headers: the libraries are opened with dlopen and the few entry
 * points are declared here with their C types.
 *   nccl_env_demo LIBNCCL [LIBCUDART] */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef void *comm_t;
typedef void *stream_t;
#define N (1 << 20)

static void *sym(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (!p) { fprintf(stderr, "missing %s: %s\n", name, dlerror()); exit(2); }
  return p;
}

int main(int argc, char **argv) {
  if (argc != 2 && argc != 3) { fprintf(stderr, "usage: %s LIBNCCL [LIBCUDART]\n", argv[0]); return 2; }
  void *nccl = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
  if (!nccl) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
  const char *(*ncclGetErrorString)(int) = sym(nccl, "ncclGetErrorString");
  int (*ncclGetUniqueId)(char *) = sym(nccl, "ncclGetUniqueId");
  char id[128];
  int r = ncclGetUniqueId(id);
  printf("ncclGetUniqueId: %s\n", ncclGetErrorString(r));
  if (r || argc == 2) return r;
  void *cudart = dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL);
  if (!cudart) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
  int (*cudaMalloc)(void **, size_t) = sym(cudart, "cudaMalloc");
  int (*cudaMemcpy)(void *, const void *, size_t, int) = sym(cudart, "cudaMemcpy");
  int (*cudaStreamSynchronize)(stream_t) = sym(cudart, "cudaStreamSynchronize");
  int (*ncclCommInitAll)(comm_t *, int, const int *) = sym(nccl, "ncclCommInitAll");
  int (*ncclAllReduce)(const void *, void *, size_t, int, int, comm_t, stream_t) = sym(nccl, "ncclAllReduce");
  int (*ncclCommDestroy)(comm_t) = sym(nccl, "ncclCommDestroy");

  float *host = malloc(N * sizeof(float));
  for (int i = 0; i < N; i++) host[i] = (float)(i % 97);
  void *buf;
  int dev = 0;
  comm_t comm;
  if (cudaMalloc(&buf, N * sizeof(float))) { fprintf(stderr, "cudaMalloc failed\n"); return 1; }
  cudaMemcpy(buf, host, N * sizeof(float), 1 /* host to device */);
  if ((r = ncclCommInitAll(&comm, 1, &dev))) { fprintf(stderr, "ncclCommInitAll: %s\n", ncclGetErrorString(r)); return 1; }
  /* ncclFloat32 = 7, ncclSum = 0, the default stream. */
  if ((r = ncclAllReduce(buf, buf, N, 7, 0, comm, NULL))) { fprintf(stderr, "ncclAllReduce: %s\n", ncclGetErrorString(r)); return 1; }
  cudaStreamSynchronize(NULL);
  float *back = malloc(N * sizeof(float));
  cudaMemcpy(back, buf, N * sizeof(float), 2 /* device to host */);
  int wrong = 0;
  for (int i = 0; i < N; i++) wrong += back[i] != host[i];
  ncclCommDestroy(comm);
  printf("all_reduce of %d floats on 1 GPU: #wrong %d\n", N, wrong);
  return wrong != 0;
}
