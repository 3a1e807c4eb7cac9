/* NCCL 2.31's per-call collectives (nccl*Config) as a C program calls
 * them: each of the eight with an ncclCollConfig_t on host buffers,
 * checked against a reference computed here, then the configs oxccl must
 * refuse or fall back from. Run by capi/tests/c_api.rs as
 * OXCCL_TEST_NRANKS processes (rank in OXCCL_TEST_RANK, rendezvous in
 * NCCL_COMM_ID). Prints "PASS" at the end. */
#include "nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, nranks;

#define CHECK_WHO rank
#include "check.h"

/* Rank r's element i: small integers, so float sums are exact. */
static float val(int r, size_t i) { return (float)((int)((r * 31u + i * 7u) % 13u) - 6); }

static float* fvec(size_t n) { return (float*)calloc(n + 1, sizeof(float)); }

static void expect_error(ncclResult_t got, ncclResult_t want, const char* what, const char* needle) {
  EXPECT(got == want, "%s returned %d, expected %d", what, got, want);
  const char* msg = ncclGetLastError(NULL);
  EXPECT(msg && strstr(msg, needle), "%s: last error \"%s\" does not mention \"%s\"", what, msg ? msg : "(null)", needle);
}

/* Every per-call function once with `cfg`, results against the reference. */
static void run_all(ncclComm_t comm, const ncclCollConfig_t* cfg, size_t n, const char* label) {
  size_t N = n * (size_t)nranks;
  float* s = fvec(N);
  float* d = fvec(N);
  for (size_t i = 0; i < N; i++) s[i] = val(rank, i);

  CHECK(ncclAllReduceConfig(s, d, n, ncclFloat32, ncclSum, comm, NULL, cfg));
  for (size_t i = 0; i < n; i++) {
    float want = 0;
    for (int r = 0; r < nranks; r++) want += val(r, i);
    EXPECT(d[i] == want, "%s: AllReduceConfig [%zu] = %f, want %f", label, i, d[i], want);
  }

  int root = nranks - 1;
  memset(d, 0, N * sizeof(float));
  CHECK(ncclBroadcastConfig(s, d, n, ncclFloat32, root, comm, NULL, cfg));
  for (size_t i = 0; i < n; i++) EXPECT(d[i] == val(root, i), "%s: BroadcastConfig [%zu]", label, i);

  memset(d, 0, N * sizeof(float));
  CHECK(ncclReduceConfig(s, d, n, ncclFloat32, ncclMax, 0, comm, NULL, cfg));
  if (rank == 0) {
    for (size_t i = 0; i < n; i++) {
      float want = val(0, i);
      for (int r = 1; r < nranks; r++) want = val(r, i) > want ? val(r, i) : want;
      EXPECT(d[i] == want, "%s: ReduceConfig max [%zu] = %f, want %f", label, i, d[i], want);
    }
  }

  memset(d, 0, N * sizeof(float));
  CHECK(ncclAllGatherConfig(s, d, n, ncclFloat32, comm, NULL, cfg));
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < n; i++)
      EXPECT(d[r * n + i] == val(r, i), "%s: AllGatherConfig block %d [%zu]", label, r, i);

  memset(d, 0, N * sizeof(float));
  CHECK(ncclReduceScatterConfig(s, d, n, ncclFloat32, ncclSum, comm, NULL, cfg));
  for (size_t i = 0; i < n; i++) {
    float want = 0;
    for (int r = 0; r < nranks; r++) want += val(r, rank * n + i);
    EXPECT(d[i] == want, "%s: ReduceScatterConfig [%zu] = %f, want %f", label, i, d[i], want);
  }

  memset(d, 0, N * sizeof(float));
  CHECK(ncclAlltoAllConfig(s, d, n, ncclFloat32, comm, NULL, cfg));
  for (int r = 0; r < nranks; r++)
    for (size_t i = 0; i < n; i++)
      EXPECT(d[r * n + i] == val(r, rank * n + i), "%s: AlltoAllConfig block %d [%zu]", label, r, i);

  memset(d, 0, N * sizeof(float));
  CHECK(ncclGatherConfig(s, d, n, ncclFloat32, 0, comm, NULL, cfg));
  if (rank == 0)
    for (int r = 0; r < nranks; r++)
      for (size_t i = 0; i < n; i++)
        EXPECT(d[r * n + i] == val(r, i), "%s: GatherConfig block %d [%zu]", label, r, i);

  memset(d, 0, N * sizeof(float));
  CHECK(ncclScatterConfig(s, d, n, ncclFloat32, root, comm, NULL, cfg));
  for (size_t i = 0; i < n; i++) EXPECT(d[i] == val(root, rank * n + i), "%s: ScatterConfig [%zu]", label, i);

  free(s), free(d);
}

int main(void) {
  rank = atoi(getenv("OXCCL_TEST_RANK"));
  nranks = atoi(getenv("OXCCL_TEST_NRANKS"));
  int v = 0;
  CHECK(ncclGetVersion(&v));
  EXPECT(v == 23102 && v == NCCL_VERSION_CODE, "ncclGetVersion %d, header %d: want 23102 (2.31.2)", v, NCCL_VERSION_CODE);
  /* With NCCL_COMM_ID set, every rank's id names the same root. */
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  ncclComm_t comm;
  /* The communicator's own bounds, which a call may only narrow. */
  ncclConfig_t cc = NCCL_CONFIG_INITIALIZER;
  cc.maxCTAs = 16;
  CHECK(ncclCommInitRankConfig(&comm, nranks, id, rank, &cc));

  /* NULL is the plain call. */
  run_all(comm, NULL, 1000, "NULL config");
  ncclCollConfig_t def = NCCL_COLLCONFIG_INITIALIZER;
  EXPECT(def.size == sizeof(ncclCollConfig_t) && def.forceAlgSelection == 1 && def.userProfilerTag == 0,
         "NCCL_COLLCONFIG_INITIALIZER");
  run_all(comm, &def, 1000, "initializer");

  /* Every field set. */
  ncclConfigExt_t ext;
  memset(&ext, 0, sizeof(ext));
  ext.key.vendorId = 0x123456;
  ext.val.i = 7;
  ncclCollConfig_t all = NCCL_COLLCONFIG_INITIALIZER;
  all.ext = &ext;
  all.minCTAs = 2;
  all.maxCTAs = 4;
  all.nvlsCTAs = 8;
  all.cgaClusterSize = 2;
  all.algSelection = "RING";
  /* All-to-all, gather and scatter have no ring (in NCCL neither): they fall back. */
  all.forceAlgSelection = 0;
  all.CTAPolicy = NCCL_CTA_POLICY_DEFAULT;
  all.userProfilerTag = 0x1234;
  run_all(comm, &all, 4096, "every field");

  /* A maxCTAs above the communicator's runs within the communicator's. */
  ncclCollConfig_t wide = NCCL_COLLCONFIG_INITIALIZER;
  wide.minCTAs = 64;
  wide.maxCTAs = 128;
  run_all(comm, &wide, 4096, "maxCTAs above the communicator's");

  /* The tree, where the all-reduce has it; a both-rows selection is automatic. */
  ncclCollConfig_t tree = NCCL_COLLCONFIG_INITIALIZER;
  tree.algSelection = "tree";
  float* s = fvec(300);
  float* d = fvec(300);
  for (size_t i = 0; i < 300; i++) s[i] = val(rank, i);
  CHECK(ncclAllReduceConfig(s, d, 300, ncclFloat32, ncclSum, comm, NULL, &tree));
  for (size_t i = 0; i < 300; i++) {
    float want = 0;
    for (int r = 0; r < nranks; r++) want += val(r, i);
    EXPECT(d[i] == want, "tree AllReduceConfig [%zu]", i);
  }
  tree.algSelection = "ring, tree_simple";
  CHECK(ncclAllReduceConfig(s, d, 300, ncclFloat32, ncclSum, comm, NULL, &tree));

  /* Refused: an uninitialised config, a bad flag, a bad policy, and a
   * forced selection oxccl cannot run (named in the error). */
  ncclCollConfig_t junk;
  memset(&junk, 0, sizeof(junk));
  expect_error(ncclAllReduceConfig(s, d, 300, ncclFloat32, ncclSum, comm, NULL, &junk), ncclInvalidArgument,
               "uninitialised config", "NCCL_COLLCONFIG_INITIALIZER");
  ncclCollConfig_t bad = NCCL_COLLCONFIG_INITIALIZER;
  bad.magic = 0x1234;
  expect_error(ncclBroadcastConfig(s, d, 300, ncclFloat32, 0, comm, NULL, &bad), ncclInvalidArgument, "bad magic",
               "magic");
  bad = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER;
  bad.forceAlgSelection = 2;
  expect_error(ncclAllGatherConfig(s, d, 10, ncclFloat32, comm, NULL, &bad), ncclInvalidArgument,
               "forceAlgSelection 2", "forceAlgSelection");
  bad = (ncclCollConfig_t)NCCL_COLLCONFIG_INITIALIZER;
  bad.CTAPolicy = 9;
  expect_error(ncclReduceConfig(s, d, 10, ncclFloat32, ncclSum, 0, comm, NULL, &bad), ncclInvalidArgument,
               "CTAPolicy 9", "CTAPolicy");
  ncclCollConfig_t nvls = NCCL_COLLCONFIG_INITIALIZER;
  nvls.algSelection = "NVLS";
  expect_error(ncclAllReduceConfig(s, d, 300, ncclFloat32, ncclSum, comm, NULL, &nvls), ncclInvalidArgument,
               "forced NVLS", "NVLS_SIMPLE");
  nvls.algSelection = "tree";
  expect_error(ncclBroadcastConfig(s, d, 300, ncclFloat32, 0, comm, NULL, &nvls), ncclInvalidArgument,
               "forced tree broadcast", "Broadcast");
  nvls.algSelection = "ring";
  expect_error(ncclAlltoAllConfig(s, d, 10, ncclFloat32, comm, NULL, &nvls), ncclInvalidArgument,
               "forced ring all-to-all", "AlltoAll");
  nvls.algSelection = "bogus";
  expect_error(ncclReduceScatterConfig(s, d, 10, ncclFloat32, ncclSum, comm, NULL, &nvls), ncclInvalidArgument,
               "unknown name", "bogus");
  /* The protocol is the entries' suffix: LL128 alone is not oxccl's. */
  nvls.algSelection = "RING_LL128";
  expect_error(ncclAllGatherConfig(s, d, 10, ncclFloat32, comm, NULL, &nvls), ncclInvalidArgument,
               "forced LL128", "LL128");
  /* Not forced: the call falls back to the automatic choice. */
  nvls.forceAlgSelection = 0;
  run_all(comm, &nvls, 300, "RING_LL128, not forced");
  nvls.algSelection = "NVLS";
  run_all(comm, &nvls, 300, "NVLS, not forced");
  /* One protocol oxccl has: honoured (on host memory, one protocol runs). */
  ncclCollConfig_t ll = NCCL_COLLCONFIG_INITIALIZER;
  ll.algSelection = "ring_ll,tree_ll";
  ll.forceAlgSelection = 0; /* all-to-all, gather and scatter have neither */
  run_all(comm, &ll, 300, "RING_LL and TREE_LL");
  free(s), free(d);

  CHECK(ncclCommDestroy(comm));
  printf("rank %d: PASS\n", rank);
  return 0;
}
