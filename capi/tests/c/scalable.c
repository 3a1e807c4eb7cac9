/* ncclCommInitRankScalable through several roots: rank 0 makes NID ids
 * (each starts a root in its process) and writes them to FILE; every
 * rank reads them and joins, each through its own block's root. The
 * communicator must be the one a single root makes: ranks and size, an
 * all-reduce and an all-gather against a reference, the same commHash on
 * every rank (printed for capi/tests/c_api.rs to compare). A bad nId (0,
 * above nranks) is refused first. Run as OXCCL_TEST_NRANKS processes
 * (rank in OXCCL_TEST_RANK) with arguments NID FILE. Prints "PASS". */
#define _POSIX_C_SOURCE 200809L
#include "nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int rank, nranks;

#define CHECK_WHO rank
#include "check.h"

static void expect_error(ncclResult_t got, const char* what, const char* needle) {
  EXPECT(got == ncclInvalidArgument, "%s returned %d, expected ncclInvalidArgument", what, got);
  const char* msg = ncclGetLastError(NULL);
  EXPECT(msg && strstr(msg, needle), "%s: last error \"%s\" does not mention \"%s\"", what, msg ? msg : "(null)", needle);
}

int main(int argc, char** argv) {
  EXPECT(argc == 3, "usage: scalable NID FILE");
  rank = atoi(getenv("OXCCL_TEST_RANK"));
  nranks = atoi(getenv("OXCCL_TEST_NRANKS"));
  int nid = atoi(argv[1]);
  const char* path = argv[2];
  /* Each id its own root, made here: not NCCL_COMM_ID's one. */
  unsetenv("NCCL_COMM_ID");

  ncclUniqueId* ids = (ncclUniqueId*)calloc((size_t)nranks + 1, sizeof(ncclUniqueId));
  ncclComm_t comm = NULL;
  expect_error(ncclCommInitRankScalable(&comm, nranks, rank, 0, ids, NULL), "nId 0", "nId is 0");
  expect_error(ncclCommInitRankScalable(&comm, nranks, rank, nranks + 1, ids, NULL), "nId above nranks",
               "nId must be 1 to nranks");

  if (rank == 0) {
    for (int i = 0; i < nid; i++) CHECK(ncclGetUniqueId(&ids[i]));
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    EXPECT(f && fwrite(ids, sizeof(ncclUniqueId), (size_t)nid, f) == (size_t)nid && fclose(f) == 0, "write %s", tmp);
    EXPECT(rename(tmp, path) == 0, "rename to %s", path);
  } else {
    FILE* f = NULL;
    for (int tries = 0; tries < 3000 && !(f = fopen(path, "rb")); tries++) {
      struct timespec ts = {0, 10 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    EXPECT(f, "no ids in %s after 30 s", path);
    EXPECT(fread(ids, sizeof(ncclUniqueId), (size_t)nid, f) == (size_t)nid, "read %d ids", nid);
    fclose(f);
  }

  CHECK(ncclCommInitRankScalable(&comm, nranks, rank, nid, ids, NULL));
  int n = -1, r = -1;
  CHECK(ncclCommCount(comm, &n));
  CHECK(ncclCommUserRank(comm, &r));
  EXPECT(n == nranks && r == rank, "rank %d of %d, want %d of %d", r, n, rank, nranks);

  const size_t count = 1000;
  float* s = (float*)malloc(count * sizeof(float));
  float* d = (float*)malloc(count * nranks * sizeof(float));
  for (size_t i = 0; i < count; i++) s[i] = (float)(rank + 1) * (float)(i % 7);
  CHECK(ncclAllReduce(s, d, count, ncclFloat32, ncclSum, comm, NULL));
  float ranks_sum = (float)nranks * (nranks + 1) / 2;
  for (size_t i = 0; i < count; i++)
    EXPECT(d[i] == ranks_sum * (float)(i % 7), "all_reduce [%zu] = %f", i, d[i]);
  CHECK(ncclAllGather(s, d, count, ncclFloat32, comm, NULL));
  for (int p = 0; p < nranks; p++)
    for (size_t i = 0; i < count; i++)
      EXPECT(d[p * count + i] == (float)(p + 1) * (float)(i % 7), "all_gather block %d [%zu]", p, i);

  ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;
  CHECK(ncclCommQueryProperties(comm, &props));
  printf("rank %d: commHash %llx\n", rank, (unsigned long long)props.commHash);
  CHECK(ncclCommDestroy(comm));
  free(s), free(d), free(ids);
  printf("rank %d: PASS\n", rank);
  return 0;
}
