/* The peer figure for docs/performance.md: MPI_Allreduce of float sums over
 * OpenMPI's TCP transport, timed as oxccl perf times (warm-up, then the mean
 * of timed iterations, averaged over ranks), busbw = bytes/time * 2(n-1)/n.
 * Buffers of 2 MiB and more are on transparent huge pages, as oxccl perf's
 * are (MPI_HUGEPAGES=0: malloc's). Build and run: tools/mpi_compare.sh */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static float *buffer(size_t bytes) {
  const size_t huge = 2u << 20;
  const char *env = getenv("MPI_HUGEPAGES");
  void *p = NULL;
  if (bytes >= huge && !(env && strcmp(env, "0") == 0) &&
      posix_memalign(&p, huge, (bytes + huge - 1) / huge * huge) == 0) {
    madvise(p, (bytes + huge - 1) / huge * huge, MADV_HUGEPAGE);
    return p;
  }
  return malloc(bytes);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 10) : (64u << 20);
  int iters = argc > 2 ? atoi(argv[2]) : 20, warm = argc > 3 ? atoi(argv[3]) : 5;
  size_t count = bytes / sizeof(float);
  float *in = buffer(count * sizeof(float) + 4), *out = buffer(count * sizeof(float) + 4);
  for (size_t i = 0; i < count; i++) in[i] = (float)(rank + i % 7);
  for (int i = 0; i < warm; i++) MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  for (int i = 0; i < iters; i++) MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double us = (MPI_Wtime() - t0) * 1e6 / iters, sum;
  MPI_Allreduce(&us, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  long wrong = 0;
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (int r = 0; r < n; r++) want += (float)(r + i % 7);
    if (out[i] != want) wrong++;
  }
  if (rank == 0) {
    double t = sum / n, algbw = bytes / t / 1e3;
    printf("MPI_Allreduce %zu bytes, %d ranks: time %.2f us, algbw %.3f GB/s, busbw %.3f GB/s, #wrong %ld\n", bytes, n, t,
           algbw, algbw * 2.0 * (n - 1) / n, wrong);
  }
  MPI_Finalize();
  return 0;
}
