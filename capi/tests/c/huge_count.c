/* Counts far larger than the buffers behind them (int8 counts of 2^40 and
 * 2^62 on 256-byte host buffers, on the heap and on the stack) are refused
 * with ncclInvalidArgument naming the count, by every call that takes one,
 * and touch nothing; the communicator then still works. Before, they
 * passed validation and the ranks died of SIGSEGV. Run by
 * capi/tests/c_api.rs as OXCCL_TEST_NRANKS processes (rank in
 * OXCCL_TEST_RANK, rendezvous in NCCL_COMM_ID). Prints "PASS". */
#include "nccl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, nranks;

#define CHECK_WHO rank
#include "check.h"

/* `got` is ncclInvalidArgument and the last error names `count`. */
static void refused(ncclResult_t got, const char* what, size_t count) {
  char needle[64];
  snprintf(needle, sizeof needle, "count %zu", count);
  const char* msg = ncclGetLastError(NULL);
  EXPECT(got == ncclInvalidArgument, "%s of %zu returned %d (%s), expected ncclInvalidArgument", what, count, got,
         msg ? msg : "");
  EXPECT(msg && strstr(msg, needle), "%s: last error \"%s\" does not name \"%s\"", what, msg ? msg : "(null)",
         needle);
  if (rank == 0) printf("%s: %s\n", what, msg);
}

/* Every call taking a count, on `s` and `d` (256 bytes each), with `count`. */
static void every_call(ncclComm_t comm, char* s, char* d, size_t count) {
  refused(ncclAllReduce(s, d, count, ncclInt8, ncclSum, comm, NULL), "ncclAllReduce", count);
  refused(ncclAllReduce(d, d, count, ncclInt8, ncclSum, comm, NULL), "ncclAllReduce in place", count);
  refused(ncclBroadcast(s, d, count, ncclInt8, 0, comm, NULL), "ncclBroadcast", count);
  refused(ncclReduce(s, d, count, ncclInt8, ncclSum, 0, comm, NULL), "ncclReduce", count);
  refused(ncclAllGather(s, d, count, ncclInt8, comm, NULL), "ncclAllGather", count);
  refused(ncclReduceScatter(s, d, count, ncclInt8, ncclSum, comm, NULL), "ncclReduceScatter", count);
  int peer = (rank + 1) % nranks;
  refused(ncclSend(s, count, ncclInt8, peer, comm, NULL), "ncclSend", count);
  refused(ncclRecv(d, count, ncclInt8, peer, comm, NULL), "ncclRecv", count);
}

int main(void) {
  const char* r = getenv("OXCCL_TEST_RANK");
  const char* n = getenv("OXCCL_TEST_NRANKS");
  if (!r || !n) {
    fprintf(stderr, "set OXCCL_TEST_RANK, OXCCL_TEST_NRANKS and NCCL_COMM_ID\n");
    return 2;
  }
  rank = atoi(r), nranks = atoi(n);
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));

  char* hs = malloc(256);
  char* hd = malloc(256);
  char ss[256], sd[256];
  memset(hs, 1, 256), memset(hd, 7, 256), memset(ss, 1, 256), memset(sd, 7, 256);
  const size_t counts[] = {(size_t)1 << 40, (size_t)1 << 62};
  for (int k = 0; k < 2; k++) {
    every_call(comm, hs, hd, counts[k]);
    every_call(comm, ss, sd, counts[k]);
  }
  for (int i = 0; i < 256; i++) EXPECT(hd[i] == 7 && sd[i] == 7, "a refused call wrote byte %d", i);

  /* The right count still works. */
  CHECK(ncclAllReduce(hs, hd, 256, ncclInt8, ncclSum, comm, NULL));
  for (int i = 0; i < 256; i++) EXPECT(hd[i] == nranks, "all_reduce byte %d = %d, want %d", i, hd[i], nranks);

  CHECK(ncclCommDestroy(comm));
  free(hs), free(hd);
  printf("rank %d of %d: PASS\n", rank, nranks);
  return 0;
}
