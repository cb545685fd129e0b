/* The point-to-point set waits and tests (OpenSHMEM 1.5, 9.10):
 * wait_until_{all,any,some}[_vector] and test_{all,any,some}[_vector],
 * with status masks, values put by the left neighbour, and the fairness
 * of `any` (a series of calls eventually returns every satisfied index). */
#include <stdint.h>
#include <shmem.h>

#include "check.h"

static long flags[4];
static int ints[4];

int main(void) {
  shmem_init();
  const int me = shmem_my_pe(), n = shmem_n_pes(), right = (me + 1) % n;
  const int none[4] = {0, 0, 0, 0}, odd_off[4] = {0, 1, 0, 1}, all_off[4] = {1, 1, 1, 1};
  size_t idx[4];

  /* all: the left neighbour sets 1..4, one put each */
  for (int i = 0; i < 4; i++) shmem_long_p(&flags[i], i + 1, right);
  shmem_long_wait_until_all(flags, 4, NULL, SHMEM_CMP_GE, 1);
  for (int i = 0; i < 4; i++) CHECK(flags[i] == i + 1);
  long want[4] = {1, 2, 3, 4};
  shmem_long_wait_until_all_vector(flags, 4, none, SHMEM_CMP_EQ, want);
  CHECK(shmem_long_test_all_vector(flags, 4, NULL, SHMEM_CMP_EQ, want) == 1);
  CHECK(shmem_long_test_all(flags, 4, NULL, SHMEM_CMP_EQ, 1) == 0);
  CHECK(shmem_long_test_all(flags, 4, all_off, SHMEM_CMP_EQ, 99) == 1); /* no active element */
  CHECK(shmem_long_test_all(flags, 4, odd_off, SHMEM_CMP_NE, 2) == 1);  /* 1 and 3 masked: 1, 3 != 2 */
  shmem_barrier_all();

  /* some: only elements 1 and 3 are set */
  for (int i = 0; i < 4; i++) flags[i] = 0;
  shmem_barrier_all();
  shmem_long_p(&flags[1], 7, right);
  shmem_long_p(&flags[3], 7, right);
  shmem_barrier_all();
  size_t got = shmem_long_wait_until_some(flags, 4, idx, NULL, SHMEM_CMP_EQ, 7);
  CHECK(got == 2 && idx[0] == 1 && idx[1] == 3);
  CHECK(shmem_long_test_some(flags, 4, idx, odd_off, SHMEM_CMP_EQ, 7) == 0);
  long sevens[4] = {0, 7, 5, 7};
  got = shmem_long_test_some_vector(flags, 4, idx, NULL, SHMEM_CMP_EQ, sevens);
  CHECK(got == 3 && idx[0] == 0 && idx[1] == 1 && idx[2] == 3);
  CHECK(shmem_long_test_any(flags, 4, odd_off, SHMEM_CMP_EQ, 7) == SIZE_MAX);
  CHECK(shmem_long_wait_until_any(flags, 4, all_off, SHMEM_CMP_EQ, 7) == SIZE_MAX);
  size_t one = shmem_long_wait_until_any(flags, 4, NULL, SHMEM_CMP_EQ, 7);
  CHECK(one == 1 || one == 3);
  one = shmem_long_wait_until_any_vector(flags, 4, NULL, SHMEM_CMP_GE, sevens); /* 0, 1 and 3 hold */
  CHECK(one == 0 || one == 1 || one == 3);
  shmem_barrier_all();

  /* any is fair: with every element satisfied, eight calls return every index */
  for (int i = 0; i < 4; i++) ints[i] = 1;
  int seen_wait[4] = {0}, seen_test[4] = {0}, seen_vector[4] = {0};
  int ones[4] = {1, 1, 1, 1};
  for (int r = 0; r < 8; r++) {
    seen_wait[shmem_int_wait_until_any(ints, 4, NULL, SHMEM_CMP_EQ, 1)]++;
    seen_test[shmem_int_test_any(ints, 4, NULL, SHMEM_CMP_EQ, 1)]++;
    seen_vector[shmem_int_test_any_vector(ints, 4, NULL, SHMEM_CMP_EQ, ones)]++;
  }
  for (int i = 0; i < 4; i++) CHECK(seen_wait[i] > 0 && seen_test[i] > 0 && seen_vector[i] > 0);
  DONE("wait_sets");
}
