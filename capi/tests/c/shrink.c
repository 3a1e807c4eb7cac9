/* Recovery from a dead rank through NCCL's C API, on host memory: ranks run
 * all-reduces; rank 1 SIGKILLs itself at the start of the 20th; the others
 * get an error, see it in ncclCommGetAsyncError, drop rank 1 with
 * ncclCommShrink and check 100 all-reduces and the other collectives on
 * the survivors against a reference. Run by capi/tests/c_api.rs as 4
 * processes (rank in OXCCL_TEST_RANK, rendezvous in NCCL_COMM_ID); prints
 * "PASS" at the end. argv[1]:
 *   "revoke":      blocking communicator; ncclCommRevoke (which returns once
 *                  quiescent), then NCCL_SHRINK_DEFAULT;
 *   "nonblocking": non-blocking communicator; ncclCommRevoke polled through
 *                  ncclCommGetAsyncError until ncclSuccess, then
 *                  NCCL_SHRINK_ABORT with a NULL config (non-blocking, as
 *                  the parent), polled the same way. */
#define _POSIX_C_SOURCE 200809L /* nanosleep, raise under -std=c11 */
#include "nccl.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CHECK and EXPECT exit(1) with a message; the harness prints each rank's
 * output under its number. */
#include "check.h"

static int rank, nranks;

#define VICTIM 1
#define N 4099

/* Rank r's element i of round k: small integers, so float sums are exact. */
static float val(int r, int k, size_t i) { return (float)((int)((r * 7919u + i * 104729u + k * 31u) % 17u) - 8); }

/* Polls ncclCommGetAsyncError until it leaves ncclInProgress (10 s at most). */
static ncclResult_t settle(ncclComm_t comm) {
  ncclResult_t st = ncclInProgress;
  struct timespec ms = {0, 1000000};
  for (int i = 0; i < 10000 && st == ncclInProgress; i++) {
    CHECK(ncclCommGetAsyncError(comm, &st));
    if (st == ncclInProgress) nanosleep(&ms, NULL);
  }
  return st;
}

/* One all-reduce of round k on `comm` (rank `me` of `n`, whose old ranks
 * are `old`): whether it succeeded, and checks the result. */
static ncclResult_t all_reduce(ncclComm_t comm, int me, int n, const int* old, int k, float* buf) {
  for (size_t i = 0; i < N; i++) buf[i] = val(old[me], k, i);
  ncclResult_t r = ncclAllReduce(buf, buf, N, ncclFloat32, ncclSum, comm, NULL);
  if (r != ncclSuccess) return r;
  for (size_t i = 0; i < N; i++) {
    float want = 0;
    for (int p = 0; p < n; p++) want += val(old[p], k, i);
    EXPECT(buf[i] == want, "round %d: all_reduce [%zu] = %f, want %f", k, i, buf[i], want);
  }
  return ncclSuccess;
}

/* Broadcast, reduce, all-gather, reduce-scatter and a send/recv ring. */
static void others(ncclComm_t comm, int me, int n, const int* old) {
  float* s = malloc(sizeof(float) * N * n);
  float* d = malloc(sizeof(float) * N * n);
  int root = n - 1;
  for (size_t i = 0; i < N; i++) s[i] = val(old[me], 50, i);
  CHECK(ncclBroadcast(s, d, N, ncclFloat32, root, comm, NULL));
  for (size_t i = 0; i < N; i++) EXPECT(d[i] == val(old[root], 50, i), "broadcast [%zu]", i);
  memset(d, 0xff, sizeof(float) * N);
  CHECK(ncclReduce(s, d, N, ncclFloat32, ncclSum, root, comm, NULL));
  if (me == root)
    for (size_t i = 0; i < N; i++) {
      float want = 0;
      for (int p = 0; p < n; p++) want += val(old[p], 50, i);
      EXPECT(d[i] == want, "reduce [%zu] = %f, want %f", i, d[i], want);
    }
  CHECK(ncclAllGather(s, d, N, ncclFloat32, comm, NULL));
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < N; i++) EXPECT(d[p * N + i] == val(old[p], 50, i), "all_gather [%d][%zu]", p, i);
  for (size_t i = 0; i < (size_t)N * n; i++) s[i] = val(old[me], 51, i);
  CHECK(ncclReduceScatter(s, d, N, ncclFloat32, ncclSum, comm, NULL));
  for (size_t i = 0; i < N; i++) {
    float want = 0;
    for (int p = 0; p < n; p++) want += val(old[p], 51, me * N + i);
    EXPECT(d[i] == want, "reduce_scatter [%zu] = %f, want %f", i, d[i], want);
  }
  CHECK(ncclGroupStart());
  CHECK(ncclSend(s, N, ncclFloat32, (me + 1) % n, comm, NULL));
  CHECK(ncclRecv(d, N, ncclFloat32, (me + n - 1) % n, comm, NULL));
  CHECK(ncclGroupEnd());
  for (size_t i = 0; i < N; i++) EXPECT(d[i] == val(old[(me + n - 1) % n], 51, i), "recv [%zu]", i);
  free(s);
  free(d);
}

int main(int argc, char** argv) {
  EXPECT(argc == 2 && (!strcmp(argv[1], "revoke") || !strcmp(argv[1], "nonblocking")), "mode: revoke|nonblocking");
  int blocking = !strcmp(argv[1], "revoke");
  rank = atoi(getenv("OXCCL_TEST_RANK"));
  nranks = atoi(getenv("OXCCL_TEST_NRANKS"));
  EXPECT(nranks == 4, "4 ranks, not %d", nranks);
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id)); /* NCCL_COMM_ID: every rank gets the same */
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = blocking;
  ncclComm_t comm;
  ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &cfg);
  EXPECT(r == ncclSuccess || (!blocking && r == ncclInProgress), "init returned %d", r);
  EXPECT(settle(comm) == ncclSuccess, "init failed: %s", ncclGetLastError(NULL));

  int all[4] = {0, 1, 2, 3};
  float* buf = malloc(sizeof(float) * N);
  int k = 0;
  for (;; k++) {
    if (rank == VICTIM && k == 20) raise(SIGKILL);
    r = all_reduce(comm, rank, nranks, all, k, buf);
    if (r != ncclSuccess) break;
    EXPECT(k < 1000, "rank %d never died", VICTIM);
  }
  printf("rank %d: all_reduce %d returned %d: %s\n", rank, k, r, ncclGetLastError(NULL));
  EXPECT(r == ncclRemoteError || r == ncclSystemError, "all_reduce %d returned %d", k, r);
  ncclResult_t st;
  CHECK(ncclCommGetAsyncError(comm, &st));
  EXPECT(st == r, "ncclCommGetAsyncError reports %d after the failure, the operation %d", st, r);
  /* The exclude list, from the error text alone: oxccl ends it with
   * "[oxccl failure: ranks=1 seq=N op=all_reduce]". */
  const char* rec = strstr(ncclGetLastError(NULL), "[oxccl failure: ranks=");
  int failed = -1;
  unsigned long long seq = 0;
  char op[32] = "";
  EXPECT(rec && sscanf(rec, "[oxccl failure: ranks=%d seq=%llu op=%31[^]]]", &failed, &seq, op) == 3,
         "no failure record in: %s", ncclGetLastError(NULL));
  EXPECT(failed == VICTIM && strcmp(op, "all_reduce") == 0, "the record names rank %d, op %s", failed, op);

  EXPECT(ncclCommRevoke(comm, 1) == ncclInvalidArgument, "revokeFlags 1 accepted");
  r = ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
  EXPECT(r == ncclSuccess || (!blocking && r == ncclInProgress), "ncclCommRevoke returned %d", r);
  EXPECT(settle(comm) == ncclSuccess, "the revoked communicator is not quiescent");
  EXPECT(ncclCommFinalize(comm) == ncclInvalidUsage, "finalize after revoke accepted");
  EXPECT(ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, comm, NULL) == ncclInvalidUsage,
         "an operation on a revoked communicator accepted");
  EXPECT(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT) == ncclInvalidUsage, "a second revoke accepted");

  int exclude[1] = {failed};
  ncclComm_t kid = NULL;
  EXPECT(ncclCommShrink(comm, exclude, 0, &kid, NULL, NCCL_SHRINK_DEFAULT) == ncclInvalidArgument,
         "an empty exclude list accepted");
  EXPECT(ncclCommShrink(comm, exclude, 1, &kid, NULL, 7) == ncclInvalidArgument, "shrinkFlags 7 accepted");
  r = ncclCommShrink(comm, exclude, 1, &kid, NULL, blocking ? NCCL_SHRINK_DEFAULT : NCCL_SHRINK_ABORT);
  EXPECT(r == ncclSuccess || (!blocking && r == ncclInProgress), "ncclCommShrink returned %d: %s", r,
         ncclGetLastError(NULL));
  EXPECT(kid != NULL, "no shrunk communicator");
  EXPECT(settle(kid) == ncclSuccess, "the shrunk communicator failed: %s", ncclGetLastError(NULL));
  int n = 0, me = -1;
  CHECK(ncclCommCount(kid, &n));
  CHECK(ncclCommUserRank(kid, &me));
  EXPECT(n == 3 && me == (rank < VICTIM ? rank : rank - 1), "shrunk: rank %d of %d", me, n);
  int old[3] = {0, 2, 3};
  for (int i = 0; i < 100; i++) CHECK(all_reduce(kid, me, n, old, 100 + i, buf));
  others(kid, me, n, old);
  CHECK(ncclCommDestroy(kid));
  CHECK(ncclCommDestroy(comm));
  free(buf);
  printf("rank %d: PASS %s\n", rank, argv[1]);
  return 0;
}
