/* Failing fast in the one-rank C tests: CHECK for a call that must succeed
 * (prints the result, its string and ncclGetLastError), EXPECT for any
 * other condition (prints a message); both exit(1). */
#ifndef OXCCL_TEST_CHECK_H
#define OXCCL_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

/* A test of several ranks defines CHECK_WHO as its rank variable before
 * including this: its lines then start with "rank N: ". */
#ifdef CHECK_WHO
#define CHECK_WHO_() fprintf(stderr, "rank %d: ", CHECK_WHO)
#else
#define CHECK_WHO_() ((void)0)
#endif

#define CHECK(cmd)                                                              \
  do {                                                                          \
    ncclResult_t r_ = (cmd);                                                    \
    if (r_ != ncclSuccess) {                                                    \
      CHECK_WHO_();                                                             \
      fprintf(stderr, "%s:%d: %s = %d (%s): %s\n", __FILE__, __LINE__, #cmd, r_, \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                  \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

#define EXPECT(cond, ...)                                        \
  do {                                                           \
    if (!(cond)) {                                               \
      CHECK_WHO_();                                              \
      fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                              \
      fprintf(stderr, "\n");                                     \
      exit(1);                                                   \
    }                                                            \
  } while (0)

#endif
