/* Failing fast in the one-rank C tests: CHECK for a call that must succeed
 * (prints the result, its string and ncclGetLastError), EXPECT for any
 * other condition (prints a message); both exit(1). */
#ifndef OXCCL_TEST_CHECK_H
#define OXCCL_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cmd)                                                              \
  do {                                                                          \
    ncclResult_t r_ = (cmd);                                                    \
    if (r_ != ncclSuccess) {                                                    \
      fprintf(stderr, "%s:%d: %s = %d (%s): %s\n", __FILE__, __LINE__, #cmd, r_, \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                  \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

#define EXPECT(cond, ...)                                        \
  do {                                                           \
    if (!(cond)) {                                               \
      fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                              \
      fprintf(stderr, "\n");                                     \
      exit(1);                                                   \
    }                                                            \
  } while (0)

#endif
