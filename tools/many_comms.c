/* Many communicators (issue 43, item 4): each rank makes one communicator,
 * then COUNT (64) split from it (ncclCommSplit, one color, NULL config),
 * then runs one small all_reduce on each (a library that connects lazily
 * connects then), and reports, on rank 0:
 *   - the time of the COUNT splits, and of the COUNT first all_reduces;
 *   - the drop of the device's free memory (cudaMemGetInfo, the whole GPU:
 *     every rank's allocations when ranks share it) after the splits and
 *     after the all_reduces, in all and per communicator per rank;
 * and on every rank ncclCommMemStats(ncclStatGpuMemTotal) of the base
 * communicator and the mean of the split ones, where the library has the
 * call (looked up at run time: NCCL 2.28 has none).
 * Built against capi's nccl.h and linked with -lnccl: LD_LIBRARY_PATH picks
 * the libnccl.so.2 (oxccl's or NCCL's). tools/many_comms.sh runs it.
 *   many_comms RANK NRANKS IDFILE [COUNT]
 * Rank 0 writes the unique id to IDFILE; the others wait for it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

/* The CUDA runtime's few entry points, with their C types (no headers). */
extern int cudaSetDevice(int);
extern int cudaFree(void *);
extern int cudaMalloc(void **, size_t);
extern int cudaMemset(void *, int, size_t);
extern int cudaMemGetInfo(size_t *, size_t *);
extern int cudaStreamCreate(cudaStream_t *);
extern int cudaStreamSynchronize(cudaStream_t);
extern const char *cudaGetErrorString(int);

#define CUDA(x) do { int e_ = (x); if (e_) { fprintf(stderr, "rank %d: %s: %s\n", rank, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define NCCL(x) do { ncclResult_t r_ = (x); if (r_ != ncclSuccess) { fprintf(stderr, "rank %d: %s: %s (%s)\n", rank, #x, ncclGetErrorString(r_), ncclGetLastError(NULL)); exit(1); } } while (0)

static int rank;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void share_id(ncclUniqueId *id, const char *path) {
  if (rank == 0) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) || rename(tmp, path)) {
      perror(path);
      exit(1);
    }
    return;
  }
  for (int i = 0; i < 6000; i++) {
    FILE *f = fopen(path, "rb");
    if (f) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return;
    }
    usleep(10000);
  }
  fprintf(stderr, "rank %d: no unique id in %s after 60 s (is rank 0 running?)\n", rank, path);
  exit(1);
}

/* Every rank past this point, and the GPU idle: an all_reduce on `c`. */
static void barrier(ncclComm_t c, float *buf, cudaStream_t s) {
  NCCL(ncclAllReduce(buf, buf, 1, ncclFloat, ncclSum, c, s));
  CUDA(cudaStreamSynchronize(s));
}

static size_t free_bytes(void) {
  size_t f, t;
  CUDA(cudaMemGetInfo(&f, &t));
  return f;
}

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: %s RANK NRANKS IDFILE [COUNT]\n", argv[0]);
    return 2;
  }
  rank = atoi(argv[1]);
  int n = atoi(argv[2]);
  int count = argc == 5 ? atoi(argv[4]) : 64;
  typedef ncclResult_t (*memstats_t)(ncclComm_t, int, uint64_t *);
  memstats_t memstats = (memstats_t)dlsym(RTLD_DEFAULT, "ncclCommMemStats");
  int version = 0;
  NCCL(ncclGetVersion(&version));
  Dl_info where = {0};
  dladdr((void *)ncclGetVersion, &where);

  CUDA(cudaSetDevice(0));
  CUDA(cudaFree(NULL)); /* the context, before any count */
  cudaStream_t s;
  CUDA(cudaStreamCreate(&s));
  float *buf;
  CUDA(cudaMalloc((void **)&buf, 4096));
  CUDA(cudaMemset(buf, 0, 4096));

  ncclUniqueId id;
  if (rank == 0) NCCL(ncclGetUniqueId(&id));
  share_id(&id, argv[3]);
  ncclComm_t base;
  double t0 = now();
  NCCL(ncclCommInitRank(&base, n, id, rank));
  double t_init = now() - t0;
  barrier(base, buf, s);
  size_t free0 = free_bytes();
  barrier(base, buf, s);

  ncclComm_t *comms = calloc(count, sizeof *comms);
  t0 = now();
  for (int i = 0; i < count; i++) NCCL(ncclCommSplit(base, 0, rank, &comms[i], NULL));
  double t_split = now() - t0;
  barrier(base, buf, s);
  size_t free1 = free_bytes();
  barrier(base, buf, s);

  t0 = now();
  for (int i = 0; i < count; i++) {
    NCCL(ncclAllReduce(buf, buf, 1024, ncclFloat, ncclSum, comms[i], s));
    CUDA(cudaStreamSynchronize(s));
  }
  double t_first = now() - t0;
  barrier(base, buf, s);
  size_t free2 = free_bytes();

  const double mib = 1 << 20, per = (double)count * n;
  if (rank == 0) {
    printf("# library %d (%s), %d ranks on GPU 0, %d communicators split from one\n", version,
           where.dli_fname ? where.dli_fname : "?", n, count);
    printf("init_rank_ms %.1f\n", t_init * 1e3);
    printf("split_ms %.1f (%.2f per communicator)\n", t_split * 1e3, t_split * 1e3 / count);
    printf("first_all_reduce_ms %.1f (%.2f per communicator)\n", t_first * 1e3, t_first * 1e3 / count);
    printf("device_free_drop_after_split_MiB %.1f (%.2f per communicator per rank)\n",
           (double)(free0 - free1) / mib, (double)(free0 - free1) / mib / per);
    printf("device_free_drop_after_first_all_reduce_MiB %.1f (%.2f per communicator per rank)\n",
           (double)(free0 - free2) / mib, (double)(free0 - free2) / mib / per);
    fflush(stdout);
  }
  barrier(base, buf, s);
  for (int r = 0; r < n; r++) {
    if (r == rank) {
      if (!memstats) {
        printf("rank %d memstats n/a (no ncclCommMemStats in this library)\n", rank);
      } else {
        uint64_t b = 0, v = 0, sum = 0;
        NCCL(memstats(base, ncclStatGpuMemTotal, &b));
        for (int i = 0; i < count; i++) {
          NCCL(memstats(comms[i], ncclStatGpuMemTotal, &v));
          sum += v;
        }
        printf("rank %d memstats_total_MiB base %.2f split_mean %.2f split_sum %.1f\n", rank, b / mib,
               sum / mib / count, sum / mib);
      }
      fflush(stdout);
    }
    barrier(base, buf, s);
  }

  t0 = now();
  for (int i = 0; i < count; i++) NCCL(ncclCommDestroy(comms[i]));
  double t_destroy = now() - t0;
  NCCL(ncclCommDestroy(base));
  if (rank == 0) printf("destroy_ms %.1f\n", t_destroy * 1e3);
  free(comms);
  return 0;
}
