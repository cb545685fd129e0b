/* check.h: the tiny harness of the conformance programs: CHECK counts
 * failures with file:line, DONE prints "<name>: ok (0 errors)" per PE. */
#ifndef CHECK_H
#define CHECK_H
#include <stdio.h>

static int check_errors;
#define CHECK(cond)                                                                \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      if (check_errors++ < 10)                                                     \
        fprintf(stderr, "PE %d: %s:%d: check failed: %s\n", shmem_my_pe(), __FILE__, \
                __LINE__, #cond);                                                  \
    }                                                                              \
  } while (0)
#define DONE(name)                                                                       \
  do {                                                                                   \
    shmem_barrier_all();                                                                 \
    printf("PE %d: %s %s (%d errors)\n", shmem_my_pe(), name, check_errors ? "FAILED" : "ok", \
           check_errors);                                                                \
    shmem_finalize();                                                                    \
    return check_errors ? 1 : 0;                                                         \
  } while (0)
#endif
