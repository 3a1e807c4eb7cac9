/* One thread creating every rank of a communicator inside a group, then
 * driving them together, as nccl-tests -g N does: creation completes at
 * ncclGroupEnd, and each grouped collective spans the ranks. Host memory. */
#include "nccl.h"

#include <stdio.h>
#include <stdlib.h>

#define N 3
#define COUNT 4099

#define CHECK(cmd)                                                                                  \
  do {                                                                                              \
    ncclResult_t r_ = (cmd);                                                                        \
    if (r_ != ncclSuccess) {                                                                        \
      fprintf(stderr, "%s:%d: %s = %d: %s\n", __FILE__, __LINE__, #cmd, r_, ncclGetLastError(NULL)); \
      return 1;                                                                                     \
    }                                                                                               \
  } while (0)

int main(void) {
  ncclUniqueId id;
  ncclComm_t comms[N];
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++) CHECK(ncclCommInitRank(&comms[r], N, id, r));
  CHECK(ncclGroupEnd());

  static float buf[N][COUNT];
  for (int r = 0; r < N; r++)
    for (int i = 0; i < COUNT; i++) buf[r][i] = (float)(r + 1) * (float)(i % 7);
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++) CHECK(ncclAllReduce(buf[r], buf[r], COUNT, ncclFloat, ncclSum, comms[r], NULL));
  CHECK(ncclGroupEnd());
  for (int r = 0; r < N; r++)
    for (int i = 0; i < COUNT; i++) {
      float want = (float)(N * (N + 1) / 2) * (float)(i % 7);
      if (buf[r][i] != want) {
        fprintf(stderr, "rank %d [%d] = %f, want %f\n", r, i, buf[r][i], want);
        return 1;
      }
    }
  ncclComm_t all[N];
  int devs[N] = {0, 1, 2};
  (void)devs;
  CHECK(ncclCommInitAll(all, N, NULL));
  for (int r = 0; r < N; r++) CHECK(ncclCommDestroy(all[r]));
  for (int r = 0; r < N; r++) CHECK(ncclCommDestroy(comms[r]));
  printf("PASS\n");
  return 0;
}
