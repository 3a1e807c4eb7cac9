/* ncclCommGrow through NCCL's C API, on host memory, in one process: a
 * one-rank communicator makes a grow id; a thread joins as the new rank 1
 * (comm NULL, the id, rank 1) while the main thread grows (comm, the id,
 * rank -1); both check an all-reduce on the two; the spent id is refused;
 * then the main thread shrinks rank 1 away again and checks the one left.
 * Run by capi/tests/c_api.rs with OXCCL_HOST_MEMORY=1; prints "PASS grow". */
#include "nccl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define N 1031

static ncclUniqueId id;

/* Rank r's element i: small integers, so float sums are exact. */
static float val(int r, size_t i) { return (float)((int)((r * 7919u + i * 104729u) % 17u) - 8); }

/* An in-place all-reduce on `comm` as rank `r` of `n`, checked. */
static void all_reduce(ncclComm_t comm, int r, int n) {
  float* b = malloc(sizeof(float) * N);
  for (size_t i = 0; i < N; i++) b[i] = val(r, i);
  CHECK(ncclAllReduce(b, b, N, ncclFloat32, ncclSum, comm, NULL));
  for (size_t i = 0; i < N; i++) {
    float want = 0;
    for (int p = 0; p < n; p++) want += val(p, i);
    EXPECT(b[i] == want, "rank %d of %d: [%zu] = %f, want %f", r, n, i, b[i], want);
  }
  free(b);
}

static void* new_rank(void* arg) {
  (void)arg;
  ncclComm_t c = NULL;
  CHECK(ncclCommGrow(NULL, 2, &id, 1, &c, NULL));
  int n = 0, r = -1;
  CHECK(ncclCommCount(c, &n));
  CHECK(ncclCommUserRank(c, &r));
  EXPECT(n == 2 && r == 1, "new rank: rank %d of %d", r, n);
  all_reduce(c, 1, 2);
  /* Rank 0 shrinks this rank away: it takes no part, and leaves. */
  CHECK(ncclCommDestroy(c));
  return NULL;
}

int main(void) {
  ncclUniqueId first;
  ncclComm_t comm;
  CHECK(ncclGetUniqueId(&first));
  CHECK(ncclCommInitRank(&comm, 1, first, 0));
  CHECK(ncclCommGetUniqueId(comm, &id));

  pthread_t t;
  EXPECT(pthread_create(&t, NULL, new_rank, NULL) == 0, "pthread_create");
  ncclComm_t grown = NULL;
  CHECK(ncclCommGrow(comm, 2, &id, -1, &grown, NULL));
  int n = 0, r = -1;
  CHECK(ncclCommCount(grown, &n));
  CHECK(ncclCommUserRank(grown, &r));
  EXPECT(n == 2 && r == 0, "existing rank: rank %d of %d", r, n);
  all_reduce(grown, 0, 2);
  EXPECT(pthread_join(t, NULL) == 0, "pthread_join");

  ncclComm_t again = NULL;
  ncclResult_t res = ncclCommGrow(comm, 2, &id, -1, &again, NULL);
  EXPECT(res == ncclInvalidArgument && again == NULL, "the spent id was accepted (%d)", res);
  EXPECT(strstr(ncclGetLastError(NULL), "used by an earlier grow"), "%s", ncclGetLastError(NULL));

  int exclude[1] = {1};
  ncclComm_t back = NULL;
  CHECK(ncclCommShrink(grown, exclude, 1, &back, NULL, NCCL_SHRINK_DEFAULT));
  CHECK(ncclCommCount(back, &n));
  EXPECT(n == 1, "shrunk back to %d ranks", n);
  all_reduce(back, 0, 1);
  CHECK(ncclCommDestroy(back));
  CHECK(ncclCommDestroy(grown));
  CHECK(ncclCommDestroy(comm));
  printf("PASS grow\n");
  return 0;
}
