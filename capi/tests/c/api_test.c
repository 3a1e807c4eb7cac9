/* oxccl's C API, driven as a C program would drive NCCL: every collective
 * on host memory against a reference computed here, groups, split,
 * non-blocking creation, operators, and the error paths. Run by
 * capi/tests/c_api.rs as OXCCL_TEST_NRANKS processes (rank in
 * OXCCL_TEST_RANK, rendezvous in NCCL_COMM_ID). Prints "PASS" at the end. */
#include "nccl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, nranks;
static unsigned seed;

#define CHECK_WHO rank
#include "check.h"

/* Rank r's element i: small integers, so float sums are exact. */
static double val(int r, size_t i) { return (double)((int)((r * 7919u + i * 104729u + seed) % 17u) - 8); }

static float* fvec(size_t n) { return (float*)malloc(n * sizeof(float) + 1); }

static void fill(float* b, int r, size_t n, size_t off) {
  for (size_t i = 0; i < n; i++) b[i] = (float)val(r, off + i);
}

static void expect_error(ncclResult_t got, ncclResult_t want, const char* what, const char* needle) {
  EXPECT(got == want, "%s returned %d, expected %d", what, got, want);
  const char* msg = ncclGetLastError(NULL);
  EXPECT(msg && strstr(msg, needle), "%s: last error \"%s\" does not mention \"%s\"", what, msg ? msg : "(null)", needle);
}

static void test_all_reduce(ncclComm_t comm, size_t n) {
  float* s = fvec(n);
  float* d = fvec(n);
  fill(s, rank, n, 0);
  memset(d, 0xff, n * sizeof(float));
  CHECK(ncclAllReduce(s, d, n, ncclFloat32, ncclSum, comm, NULL));
  for (size_t i = 0; i < n; i++) {
    double want = 0;
    for (int r = 0; r < nranks; r++) want += val(r, i);
    EXPECT(d[i] == (float)want, "all_reduce sum [%zu] = %f, want %f", i, d[i], want);
  }
  /* In place, max, int32. */
  int* x = (int*)malloc(n * sizeof(int) + 1);
  for (size_t i = 0; i < n; i++) x[i] = (int)val(rank, i);
  CHECK(ncclAllReduce(x, x, n, ncclInt32, ncclMax, comm, NULL));
  for (size_t i = 0; i < n; i++) {
    int want = -100;
    for (int r = 0; r < nranks; r++) want = (int)fmax(want, val(r, i));
    EXPECT(x[i] == want, "all_reduce max in place [%zu] = %d, want %d", i, x[i], want);
  }
  /* Average, float64. */
  double* a = (double*)malloc(n * sizeof(double) + 1);
  for (size_t i = 0; i < n; i++) a[i] = val(rank, i);
  CHECK(ncclAllReduce(a, a, n, ncclFloat64, ncclAvg, comm, NULL));
  for (size_t i = 0; i < n; i++) {
    double want = 0;
    for (int r = 0; r < nranks; r++) want += val(r, i);
    want /= nranks;
    EXPECT(fabs(a[i] - want) < 1e-12, "all_reduce avg [%zu] = %f, want %f", i, a[i], want);
  }
  free(s), free(d), free(x), free(a);
}

static void test_rooted(ncclComm_t comm, size_t n) {
  int root = 1 % nranks;
  float* s = fvec(n);
  float* d = fvec(n);
  fill(s, rank, n, 0);
  memset(d, 0, n * sizeof(float));
  CHECK(ncclBroadcast(s, d, n, ncclFloat32, root, comm, NULL));
  for (size_t i = 0; i < n; i++) EXPECT(d[i] == (float)val(root, i), "broadcast [%zu]", i);
  fill(s, rank, n, 0);
  CHECK(ncclBcast(s, n, ncclFloat32, 0, comm, NULL));
  for (size_t i = 0; i < n; i++) EXPECT(s[i] == (float)val(0, i), "bcast in place [%zu]", i);

  root = nranks - 1;
  fill(s, rank, n, 0);
  for (size_t i = 0; i < n; i++) d[i] = -1234.0f;
  CHECK(ncclReduce(s, d, n, ncclFloat32, ncclMin, root, comm, NULL));
  for (size_t i = 0; i < n; i++) {
    double want = 100;
    for (int r = 0; r < nranks; r++) want = fmin(want, val(r, i));
    if (rank == root)
      EXPECT(d[i] == (float)want, "reduce min [%zu] = %f want %f", i, d[i], want);
    else
      EXPECT(d[i] == -1234.0f, "reduce wrote recvbuff on a non-root rank [%zu]", i);
  }
  free(s), free(d);
}

static void test_gather_scatter(ncclComm_t comm, size_t n) {
  size_t all = n * nranks;
  float* s = fvec(all);
  float* d = fvec(all);
  /* all_gather, out of place then in place (sendbuff = recvbuff + rank * n). */
  fill(s, rank, n, 0);
  CHECK(ncclAllGather(s, d, n, ncclFloat32, comm, NULL));
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < n; i++) EXPECT(d[r * n + i] == (float)val(r, i), "all_gather [%d][%zu]", r, i);
  memset(d, 0, all * sizeof(float));
  fill(d + rank * n, rank, n, 0);
  CHECK(ncclAllGather(d + rank * n, d, n, ncclFloat32, comm, NULL));
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < n; i++) EXPECT(d[r * n + i] == (float)val(r, i), "all_gather in place [%d][%zu]", r, i);

  /* reduce_scatter, out of place then in place (recvbuff = sendbuff + rank * n). */
  fill(s, rank, all, 0);
  CHECK(ncclReduceScatter(s, d, n, ncclFloat32, ncclSum, comm, NULL));
  for (size_t i = 0; i < n; i++) {
    double want = 0;
    for (int r = 0; r < nranks; r++) want += val(r, rank * n + i);
    EXPECT(d[i] == (float)want, "reduce_scatter [%zu] = %f want %f", i, d[i], want);
  }
  fill(s, rank, all, 0);
  CHECK(ncclReduceScatter(s, s + rank * n, n, ncclFloat32, ncclSum, comm, NULL));
  for (size_t i = 0; i < n; i++) {
    double want = 0;
    for (int r = 0; r < nranks; r++) want += val(r, rank * n + i);
    EXPECT(s[rank * n + i] == (float)want, "reduce_scatter in place [%zu]", i);
  }

  /* all_to_all: block p of rank r goes to block r of rank p. */
  for (int p = 0; p < nranks; p++) fill(s + p * n, rank * 100 + p, n, 0);
  CHECK(ncclAlltoAll(s, d, n, ncclFloat32, comm, NULL));
  for (int p = 0; p < nranks; p++)
    for (size_t i = 0; i < n; i++) EXPECT(d[p * n + i] == (float)val(p * 100 + rank, i), "alltoall [%d][%zu]", p, i);

  /* gather and scatter at root 0. */
  fill(s, rank, n, 0);
  memset(d, 0, all * sizeof(float));
  CHECK(ncclGather(s, d, n, ncclFloat32, 0, comm, NULL));
  if (rank == 0)
    for (int r = 0; r < nranks; r++)
      for (size_t i = 0; i < n; i++) EXPECT(d[r * n + i] == (float)val(r, i), "gather [%d][%zu]", r, i);
  for (int p = 0; p < nranks; p++) fill(s + p * n, 1000 + p, n, 0);
  CHECK(ncclScatter(s, d, n, ncclFloat32, 0, comm, NULL));
  for (size_t i = 0; i < n; i++) EXPECT(d[i] == (float)val(1000 + rank, i), "scatter [%zu]", i);
  free(s), free(d);
}

static void test_groups(ncclComm_t comm, size_t n) {
  /* A ring of sends and receives, receive posted first, in one group. */
  float* s = fvec(n);
  float* d = fvec(n);
  fill(s, rank, n, 0);
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  CHECK(ncclGroupStart());
  CHECK(ncclRecv(d, n, ncclFloat32, prev, comm, NULL));
  CHECK(ncclSend(s, n, ncclFloat32, next, comm, NULL));
  CHECK(ncclGroupEnd());
  for (size_t i = 0; i < n; i++) EXPECT(d[i] == (float)val(prev, i), "recv from %d [%zu]", prev, i);

  /* Nested groups holding two collectives. */
  float* e = fvec(n);
  fill(s, rank, n, 0);
  fill(e, rank, n, 0);
  CHECK(ncclGroupStart());
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(s, s, n, ncclFloat32, ncclSum, comm, NULL));
  CHECK(ncclGroupEnd());
  CHECK(ncclAllReduce(e, e, n, ncclFloat32, ncclMax, comm, NULL));
  CHECK(ncclGroupEnd());
  for (size_t i = 0; i < n; i++) {
    double sum = 0, mx = -100;
    for (int r = 0; r < nranks; r++) sum += val(r, i), mx = fmax(mx, val(r, i));
    EXPECT(s[i] == (float)sum && e[i] == (float)mx, "grouped all_reduces [%zu]", i);
  }

  /* ncclGroupSimulateEnd predicts and runs nothing. */
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  fill(s, rank, n, 0);
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(s, s, n, ncclFloat32, ncclSum, comm, NULL));
  CHECK(ncclGroupSimulateEnd(&sim));
  EXPECT(nranks == 1 || sim.estimatedTime > 0, "estimated time %f", sim.estimatedTime);
  for (size_t i = 0; i < n; i++) EXPECT(s[i] == (float)val(rank, i), "simulated group ran [%zu]", i);
  free(s), free(d), free(e);
}

static void test_premulsum(ncclComm_t comm, size_t n) {
  ncclRedOp_t op;
  float scalar = 2.0f;
  CHECK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, comm));
  EXPECT(op >= ncclNumOps, "created op %d", op);
  float* s = fvec(n);
  fill(s, rank, n, 0);
  CHECK(ncclAllReduce(s, s, n, ncclFloat32, op, comm, NULL));
  for (size_t i = 0; i < n; i++) {
    double want = 0;
    for (int r = 0; r < nranks; r++) want += 2 * val(r, i);
    EXPECT(s[i] == (float)want, "premulsum [%zu] = %f want %f", i, s[i], want);
  }
  CHECK(ncclRedOpDestroy(op, comm));
  expect_error(ncclAllReduce(s, s, n, ncclFloat32, op, comm, NULL), ncclInvalidArgument, "destroyed op", "ncclRedOpCreatePreMulSum");
  free(s);
}

static void test_split(ncclComm_t comm, size_t n) {
  /* Two colors, ranked in reverse; the child is created non-blocking. */
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t child = NULL;
  ncclResult_t r = ncclCommSplit(comm, rank % 2, -rank, &child, &cfg);
  EXPECT(r == ncclSuccess || r == ncclInProgress, "split returned %d", r);
  ncclResult_t state;
  do CHECK(ncclCommGetAsyncError(child, &state));
  while (state == ncclInProgress);
  EXPECT(state == ncclSuccess, "child state %d", state);
  int cn, cr;
  CHECK(ncclCommCount(child, &cn));
  CHECK(ncclCommUserRank(child, &cr));
  int want_n = (nranks + 1 - rank % 2) / 2;
  EXPECT(cn == want_n, "child has %d ranks, want %d", cn, want_n);
  /* Key -rank: the highest parent rank of the color is child rank 0. */
  int above = 0;
  for (int p = rank + 1; p < nranks; p++) above += (p % 2 == rank % 2);
  EXPECT(cr == above, "child rank %d, want %d", cr, above);
  float* s = fvec(n);
  fill(s, rank, n, 0);
  CHECK(ncclAllReduce(s, s, n, ncclFloat32, ncclSum, child, NULL));
  for (size_t i = 0; i < n; i++) {
    double want = 0;
    for (int p = rank % 2; p < nranks; p += 2) want += val(p, i);
    EXPECT(s[i] == (float)want, "child all_reduce [%zu]", i);
  }
  /* NOCOLOR: no communicator. */
  ncclComm_t none = (ncclComm_t)0x1;
  CHECK(ncclCommSplit(comm, rank == 0 ? NCCL_SPLIT_NOCOLOR : 0, 0, &none, NULL));
  if (rank == 0) EXPECT(none == NULL, "NOCOLOR gave a communicator");
  else CHECK(ncclCommDestroy(none));
  /* splitShare: a split of p shares p's network context (NULL config: it
   * takes p's config, splitShare included) and outlives p. */
  ncclConfig_t share = NCCL_CONFIG_INITIALIZER;
  share.splitShare = 1;
  ncclComm_t p = NULL, q = NULL;
  CHECK(ncclCommSplit(comm, 0, rank, &p, &share));
  CHECK(ncclCommSplit(p, 0, rank, &q, NULL));
  CHECK(ncclCommDestroy(p));
  fill(s, rank, n, 0);
  CHECK(ncclAllReduce(s, s, n, ncclFloat32, ncclSum, q, NULL));
  for (size_t i = 0; i < n; i++) {
    double want = 0;
    for (int r = 0; r < nranks; r++) want += val(r, i);
    EXPECT(s[i] == (float)want, "shared split all_reduce [%zu]", i);
  }
  CHECK(ncclCommDestroy(q));
  /* Abort always returns; the handle is gone after. */
  CHECK(ncclCommAbort(child));
  int dummy;
  expect_error(ncclCommCount(child, &dummy), ncclInvalidArgument, "count after abort", "not a live communicator");
  free(s);
}

static void test_errors(ncclComm_t comm) {
  float buf[8] = {0};
  int v = 0;
  CHECK(ncclGetVersion(&v));
  EXPECT(v == NCCL_VERSION_CODE, "version %d", v);
  expect_error(ncclAllReduce(NULL, buf, 8, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument, "null sendbuff", "sendbuff");
  expect_error(ncclAllReduce(buf, buf, 8, (ncclDataType_t)99, ncclSum, comm, NULL), ncclInvalidArgument, "bad datatype", "datatype 99");
  expect_error(ncclAllReduce(buf, buf, 8, ncclFloat32, (ncclRedOp_t)77, comm, NULL), ncclInvalidArgument, "bad op", "op 77");
  expect_error(ncclBroadcast(buf, buf, 8, ncclFloat32, nranks, comm, NULL), ncclInvalidArgument, "bad root", "root");
  expect_error(ncclSend(buf, 8, ncclFloat32, -1, comm, NULL), ncclInvalidArgument, "bad peer", "peer");
  expect_error(ncclAllReduce(buf, buf, (size_t)-1 / 2, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument, "overflowing count", "overflows");
  expect_error(ncclCommCount(NULL, &v), ncclInvalidArgument, "NULL comm", "comm is NULL");
  expect_error(ncclGroupEnd(), ncclInvalidUsage, "unmatched group end", "group_start");
  expect_error(ncclCommWindowRegister(comm, buf, sizeof buf, NULL, 0), ncclInvalidArgument, "window register without win", "win is NULL");
  ncclWindow_t win = NULL;
  expect_error(ncclCommWindowRegister(comm, buf, sizeof buf, &win, NCCL_WIN_COLL_SYMMETRIC), ncclInvalidUsage,
               "window on a host-memory communicator", "on a GPU");
  expect_error(ncclCommWindowRegister(comm, buf, sizeof buf, &win, 0x80), ncclInvalidArgument, "unknown window flags",
               "NCCL_WIN_COLL_SYMMETRIC");
  EXPECT(win == NULL, "a refused registration wrote a window");
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0;
  ncclComm_t c2;
  expect_error(ncclCommSplit(comm, 0, 0, &c2, &bad), ncclInvalidArgument, "uninitialised config", "NCCL_CONFIG_INITIALIZER");
  ncclConfig_t bad_share = NCCL_CONFIG_INITIALIZER;
  bad_share.splitShare = 2;
  expect_error(ncclCommSplit(comm, 0, 0, &c2, &bad_share), ncclInvalidArgument, "splitShare 2", "splitShare is 2");
  EXPECT(buf[0] == 0, "a refused call touched the buffer");
  /* Count 0 is legal and does nothing. */
  CHECK(ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, comm, NULL));
}

int main(void) {
  const char* r = getenv("OXCCL_TEST_RANK");
  const char* n = getenv("OXCCL_TEST_NRANKS");
  const char* s = getenv("OXCCL_TEST_SEED");
  if (!r || !n) {
    fprintf(stderr, "set OXCCL_TEST_RANK, OXCCL_TEST_NRANKS and NCCL_COMM_ID\n");
    return 2;
  }
  rank = atoi(r), nranks = atoi(n), seed = s ? (unsigned)atoi(s) : 1;
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));
  int c, me;
  CHECK(ncclCommCount(comm, &c));
  CHECK(ncclCommUserRank(comm, &me));
  EXPECT(c == nranks && me == rank, "count %d rank %d", c, me);

  const size_t sizes[] = {1, 1009, 300007};
  for (int k = 0; k < 3; k++) {
    test_all_reduce(comm, sizes[k]);
    test_rooted(comm, sizes[k]);
    test_gather_scatter(comm, sizes[k]);
    test_groups(comm, sizes[k]);
  }
  test_premulsum(comm, 1009);
  test_split(comm, 1009);
  test_errors(comm);

  CHECK(ncclCommFinalize(comm));
  CHECK(ncclCommDestroy(comm));
  int dummy;
  expect_error(ncclCommCount(comm, &dummy), ncclInvalidArgument, "use after destroy", "not a live communicator");
  printf("rank %d of %d: PASS\n", rank, nranks);
  return 0;
}
