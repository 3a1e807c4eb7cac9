/* ncclResetDebugInit re-reads NCCL_DEBUG, NCCL_DEBUG_SUBSYS and
 * NCCL_DEBUG_FILE: one process changes them between calls and creates a
 * one-rank communicator after each (its creation logs INFO lines under
 * INIT). Markers on stderr split the phases; capi/tests/c_api.rs checks
 * which phase shows INFO lines and what the file holds. Prints
 * "PASS reset" at the end. */
/* setenv, unsetenv (POSIX) under -std=c11. */
#define _POSIX_C_SOURCE 200112L
#include "nccl.h"

#include <stdio.h>
#include <stdlib.h>

#include "check.h"

static void one_comm(void) {
  ncclUniqueId id;
  ncclComm_t comm;
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclCommInitRank(&comm, 1, id, 0));
  CHECK(ncclCommDestroy(comm));
}

static void mark(const char* m) {
  fprintf(stderr, "%s\n", m);
  fflush(stderr);
}

int main(int argc, char** argv) {
  EXPECT(argc == 3, "usage: debug_reset reset FILE");
  setenv("NCCL_DEBUG", "WARN", 1);
  ncclResetDebugInit();
  mark("PHASE warn");
  one_comm();
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "INIT", 1);
  ncclResetDebugInit();
  mark("PHASE info");
  one_comm();
  setenv("NCCL_DEBUG_FILE", argv[2], 1);
  ncclResetDebugInit();
  mark("PHASE file");
  one_comm();
  unsetenv("NCCL_DEBUG_FILE");
  setenv("NCCL_DEBUG", "WARN", 1);
  ncclResetDebugInit();
  mark("PHASE warn again");
  one_comm();
  printf("PASS reset\n");
  return 0;
}
