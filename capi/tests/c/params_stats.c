/* NCCL 2.30's newer calls as oxccl answers them, driven from C: the
 * parameter API over oxccl's settings, ncclCommMemStats on a host-memory
 * communicator, and the calls oxccl refuses. Run by capi/tests/c_api.rs as
 * one rank with OXCCL_HOST_MEMORY=1, NCCL_CHUNK_SIZE=123456 and
 * NCCL_SOCKET_IFNAME=lo in the environment. Prints "PASS params" at the
 * end; ncclParamDumpAll's listing comes before it. */
#include "nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* The call returned `want` and the last error mentions every needle. */
static void refused(ncclResult_t got, ncclResult_t want, const char* what, const char* n1, const char* n2) {
  const char* msg = ncclGetLastError(NULL);
  EXPECT(got == want, "%s returned %d (%s), expected %d: %s", what, got, ncclGetErrorString(got), want, msg);
  EXPECT(strstr(msg, n1) != NULL, "%s: last error \"%s\" does not mention \"%s\"", what, msg, n1);
  EXPECT(n2 == NULL || strstr(msg, n2) != NULL, "%s: last error \"%s\" does not mention \"%s\"", what, msg, n2);
  printf("refused as expected: %s\n", msg);
}

static void params(void) {
  ncclParamHandle_t chunk = NULL, ifname = NULL, missing = (ncclParamHandle_t)0;
  CHECK(ncclParamBind(&chunk, "NCCL_CHUNK_SIZE"));
  EXPECT(chunk != NULL, "no handle");

  /* The value set through the environment, at every width it fits. */
  int32_t i32 = 0;
  int64_t i64 = 0;
  uint32_t u32 = 0;
  uint64_t u64 = 0;
  CHECK(ncclParamGetI32(chunk, &i32));
  CHECK(ncclParamGetI64(chunk, &i64));
  CHECK(ncclParamGetU32(chunk, &u32));
  CHECK(ncclParamGetU64(chunk, &u64));
  EXPECT(i32 == 123456 && i64 == 123456 && u32 == 123456u && u64 == 123456u, "read %d %lld %u %llu", i32,
         (long long)i64, u32, (unsigned long long)u64);
  int8_t i8 = 7;
  int16_t i16 = 7;
  uint8_t u8 = 7;
  refused(ncclParamGetI8(chunk, &i8), ncclInvalidArgument, "GetI8 of 123456", "NCCL_CHUNK_SIZE", "int8_t");
  refused(ncclParamGetI16(chunk, &i16), ncclInvalidArgument, "GetI16 of 123456", "NCCL_CHUNK_SIZE", "int16_t");
  refused(ncclParamGetU8(chunk, &u8), ncclInvalidArgument, "GetU8 of 123456", "NCCL_CHUNK_SIZE", "uint8_t");
  EXPECT(i8 == 7 && i16 == 7 && u8 == 7, "a refused getter wrote its output");

  /* Text is no integer. */
  CHECK(ncclParamBind(&ifname, "NCCL_SOCKET_IFNAME"));
  refused(ncclParamGetI32(ifname, &i32), ncclInvalidArgument, "GetI32 of \"lo\"", "NCCL_SOCKET_IFNAME",
          "not an integer");

  /* Unknown keys, and the bare name NCCL does not accept either. */
  refused(ncclParamBind(&missing, "NCCL_NO_SUCH_PARAM"), ncclInvalidArgument, "unknown key",
          "NCCL_NO_SUCH_PARAM", "oxccl info");
  refused(ncclParamBind(&missing, "CHUNK_SIZE"), ncclInvalidArgument, "bare key", "CHUNK_SIZE",
          "NCCL_CHUNK_SIZE");

  /* The string stays valid across binds, other getters and the key-based
   * calls: only the next ncclParamGetStr on this thread replaces it. */
  const char* s = NULL;
  CHECK(ncclParamGetStr(chunk, &s));
  EXPECT(s && strcmp(s, "123456") == 0, "GetStr gave \"%s\"", s ? s : "(null)");
  const char** keys = NULL;
  int nkeys = 0;
  CHECK(ncclParamGetAllParameterKeys(&keys, &nkeys));
  int seen = 0;
  for (int i = 0; i < nkeys; i++) {
    ncclParamHandle_t h;
    CHECK(ncclParamBind(&h, keys[i]));
    const char* v = NULL;
    int vlen = -1;
    CHECK(ncclParamGetParameter(keys[i], &v, &vlen));
    EXPECT(v && (int)strlen(v) == vlen, "%s: value length %d", keys[i], vlen);
    if (strcmp(keys[i], "NCCL_CHUNK_SIZE") == 0) {
      seen = 1;
      EXPECT(strcmp(v, "123456") == 0, "GetParameter gave \"%s\"", v);
    }
  }
  EXPECT(seen, "NCCL_CHUNK_SIZE is not among the %d keys", nkeys);
  EXPECT(strcmp(s, "123456") == 0, "the GetStr string changed to \"%s\"", s);

  const char* v = (const char*)1;
  int vlen = 5;
  refused(ncclParamGetParameter("NCCL_NO_SUCH_PARAM", &v, &vlen), ncclInvalidArgument, "unknown key by name",
          "NCCL_NO_SUCH_PARAM", NULL);
  EXPECT(v == NULL && vlen == 0, "unknown key: value %p, length %d", (const void*)v, vlen);

  /* Raw copy: the text with its NUL; too small a buffer copies nothing. */
  char buf[16];
  int len = -1;
  CHECK(ncclParamGet(chunk, buf, (int)sizeof buf, &len));
  EXPECT(len == 7 && strcmp(buf, "123456") == 0, "ncclParamGet: %d bytes \"%s\"", len, buf);
  refused(ncclParamGet(chunk, buf, 4, &len), ncclInvalidArgument, "ncclParamGet into 4 bytes", "NCCL_CHUNK_SIZE",
          "maxLen");
  EXPECT(len == 0, "a refused ncclParamGet reports %d bytes", len);

  ncclParamDumpAll();
}

static void mem_stats(ncclComm_t comm) {
  const ncclCommMemStat_t stats[] = {ncclStatGpuMemSuspend, ncclStatGpuMemSuspended, ncclStatGpuMemPersist,
                                     ncclStatGpuMemTotal};
  for (int i = 0; i < 4; i++) {
    uint64_t v = 99;
    CHECK(ncclCommMemStats(comm, stats[i], &v));
    EXPECT(v == 0, "host communicator: stat %d is %llu", stats[i], (unsigned long long)v);
  }
  uint64_t v = 0;
  refused(ncclCommMemStats(comm, (ncclCommMemStat_t)7, &v), ncclInvalidArgument, "stat 7", "ncclCommMemStats",
          "stat 7");
  refused(ncclCommMemStats(comm, ncclStatGpuMemTotal, NULL), ncclInvalidArgument, "NULL value", "ncclCommMemStats",
          "value");
}

/* Suspend and resume on one rank: the state in ncclCommMemStats (no GPU
 * memory on host memory), operations refused while suspended, double calls
 * refused, an all-reduce right after resume. */
static void suspend_resume(ncclComm_t comm) {
  uint64_t v = 9;
  CHECK(ncclCommSuspend(comm, 0)); /* no flag: nothing happens, as in NCCL */
  CHECK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &v));
  EXPECT(v == 0, "suspended by flags 0");
  CHECK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  CHECK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &v));
  EXPECT(v == 1, "ncclStatGpuMemSuspended is %llu while suspended", (unsigned long long)v);
  CHECK(ncclCommMemStats(comm, ncclStatGpuMemTotal, &v));
  EXPECT(v == 0, "host communicator: %llu GPU bytes", (unsigned long long)v);
  float x[4] = {1, 2, 3, 4};
  refused(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, comm, NULL), ncclInvalidUsage, "all_reduce while suspended",
          "suspended", "ncclCommResume");
  refused(ncclCommSuspend(comm, NCCL_SUSPEND_MEM), ncclInvalidUsage, "a second suspend", "ncclCommSuspend",
          "already suspended");
  CHECK(ncclCommResume(comm));
  CHECK(ncclCommMemStats(comm, ncclStatGpuMemSuspended, &v));
  EXPECT(v == 0, "ncclStatGpuMemSuspended is %llu after resume", (unsigned long long)v);
  refused(ncclCommResume(comm), ncclInvalidUsage, "a second resume", "ncclCommResume", "not suspended");
  CHECK(ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, comm, NULL));
  EXPECT(x[0] == 1 && x[3] == 4, "one-rank all_reduce after resume: %f %f", x[0], x[3]);
}

static void refusals(ncclComm_t comm) {
  ncclUniqueId id;
  ncclComm_t grown = NULL;
  int x = 0;
  void* p = NULL;
  ncclWaitSignalDesc_t desc = {1, 0, 0, 0};
  /* Grow's rules (tests/c/grow.c grows for real): one id at a time, each
   * argument in its place. The id made here stays unused. */
  CHECK(ncclCommGetUniqueId(comm, &id));
  refused(ncclCommGetUniqueId(comm, &id), ncclInvalidUsage, "a second id", "ncclCommGetUniqueId", "not used yet");
  refused(ncclCommGrow(comm, 1, &id, -1, &grown, NULL), ncclInvalidArgument, "nRanks 1", "ncclCommGrow",
          "does not grow");
  refused(ncclCommGrow(comm, 2, &id, 0, &grown, NULL), ncclInvalidArgument, "rank 0", "ncclCommGrow", "-1");
  refused(ncclCommGrow(NULL, 2, NULL, 1, &grown, NULL), ncclInvalidArgument, "no id", "ncclCommGrow", "uniqueId");
  refused(ncclCommGrow(NULL, 2, &id, 2, &grown, NULL), ncclInvalidArgument, "rank 2 of 2", "ncclCommGrow", "0..2");
  EXPECT(grown == NULL, "a refused grow left %p", (void*)grown);
  /* One-sided calls on a communicator without windows (tests/c/windows.c
   * registers windows on GPUs). */
  refused(ncclPutSignal(&x, 1, ncclInt32, 0, NULL, 0, 0, 0, 0, comm, NULL), ncclInvalidArgument, "ncclPutSignal",
          "ncclPutSignal", "peerWin is NULL");
  refused(ncclSignal(0, 0, 0, 0, comm, NULL), ncclInvalidUsage, "ncclSignal", "ncclSignal", "ncclCommWindowRegister");
  refused(ncclSignal(0, 1, 0, 0, comm, NULL), ncclInvalidArgument, "signal index 1", "ncclSignal", "signal index 1");
  refused(ncclWaitSignal(1, &desc, comm, NULL), ncclInvalidUsage, "ncclWaitSignal", "ncclWaitSignal",
          "ncclCommWindowRegister");
  refused(ncclWaitSignal(0, NULL, comm, NULL), ncclInvalidArgument, "no descriptors", "ncclWaitSignal", "nDesc");
  refused(ncclWinGetUserPtr(comm, NULL, &p), ncclInvalidArgument, "ncclWinGetUserPtr", "ncclWinGetUserPtr",
          "not a window");
  /* Registration: a host-memory communicator has nothing to register; an
   * unknown handle is refused; NULL (NCCL_LOCAL_REGISTER=0's) is fine. */
  void* reg = NULL;
  refused(ncclCommRegister(comm, &x, sizeof x, &reg), ncclInvalidUsage, "ncclCommRegister on host memory",
          "ncclCommRegister", "moves host memory");
  EXPECT(reg == NULL, "a refused registration wrote handle %p", reg);
  refused(ncclCommDeregister(comm, (void*)0x1234), ncclInvalidArgument, "an unknown handle", "ncclCommDeregister",
          "no registration");
  CHECK(ncclCommDeregister(comm, NULL));
}

/* ncclCommQueryProperties on a one-rank host communicator: what is true. */
static void properties(ncclComm_t comm) {
  ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;
  CHECK(ncclCommQueryProperties(comm, &props));
  EXPECT(props.rank == 0 && props.nRanks == 1, "rank %d of %d", props.rank, props.nRanks);
  EXPECT(props.cudaDev == -1 && props.nvmlDev == -1, "host memory: devices %d/%d", props.cudaDev, props.nvmlDev);
  EXPECT(props.commHash != 0, "commHash 0");
  EXPECT(!props.deviceApiSupport && !props.multimemSupport && !props.hostRmaSupport, "no device API");
  EXPECT(props.ginType == NCCL_GIN_TYPE_NONE && props.nLsaTeams == 0 && props.devCommRuntimeVersionSize == 0,
         "no GIN, no teams");
  for (int i = 0; i < 64; i++) EXPECT(!props.ginSupport[i], "ginSupport[%d]", i);
  ncclCommProperties_t junk;
  memset(&junk, 0, sizeof(junk));
  refused(ncclCommQueryProperties(comm, &junk), ncclInvalidUsage, "uninitialised properties",
          "NCCL_COMM_PROPERTIES_INITIALIZER", NULL);
  void* ptr = NULL;
  refused(ncclGetPeerDevicePointer(NULL, 0, 0, &ptr), ncclInvalidArgument, "ncclGetPeerDevicePointer",
          "not a window", NULL);
  refused(ncclGetLsaMultimemDevicePointer(NULL, 0, &ptr), ncclInvalidUsage, "ncclGetLsaMultimemDevicePointer",
          "multicast", NULL);
  refused(ncclDevCommCreate(comm, NULL, NULL), ncclInvalidUsage, "ncclDevCommCreate", "ncclCommWindowRegister",
          NULL);
}

int main(void) {
  int version = 0;
  CHECK(ncclGetVersion(&version));
  EXPECT(version == NCCL_VERSION_CODE && version == NCCL_VERSION(2, 31, 2), "version %d", version);
  EXPECT(version >= NCCL_VERSION(2, 28, 9), "version %d is older than 2.28.9", version);
  EXPECT(strcmp(ncclGetErrorString(ncclTimeout), "timeout") == 0, "ncclTimeout: %s",
         ncclGetErrorString(ncclTimeout));
  EXPECT(sizeof(ncclConfig_t) == 112, "sizeof(ncclConfig_t) is %zu", sizeof(ncclConfig_t));
  EXPECT(sizeof(ncclCollConfig_t) == 64, "sizeof(ncclCollConfig_t) is %zu", sizeof(ncclCollConfig_t));
  EXPECT(sizeof(ncclCommProperties_t) == 144, "sizeof(ncclCommProperties_t) is %zu", sizeof(ncclCommProperties_t));

  params();

  ncclUniqueId id;
  ncclComm_t comm;
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclCommInitRank(&comm, 1, id, 0));
  mem_stats(comm);
  suspend_resume(comm);
  refusals(comm);
  properties(comm);

  /* A caller built against NCCL 2.28 passes its shorter config: 80 bytes. */
  ncclConfig_t old = NCCL_CONFIG_INITIALIZER;
  old.size = 80;
  old.graphStreamOrdering = 12345; /* past its size: never read */
  ncclComm_t child = NULL;
  CHECK(ncclCommSplit(comm, 0, 0, &child, &old));
  EXPECT(child != NULL, "no child");
  uint64_t v = 1;
  CHECK(ncclCommMemStats(child, ncclStatGpuMemTotal, &v));
  EXPECT(v == 0, "host child: %llu GPU bytes", (unsigned long long)v);
  CHECK(ncclCommDestroy(child));

  ncclResetDebugInit();
  CHECK(ncclCommDestroy(comm));
  printf("PASS params\n");
  return 0;
}
