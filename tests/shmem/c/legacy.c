/* legacy: the pre-1.4 names older OpenSHMEM programs use (start_pes,
 * shmalloc/shfree, shmem_TYPE_fadd/finc/cswap/swap/fetch/set/add/inc,
 * shmem_TYPE_wait, cache management no-ops) and shmem_team_ptr. */
#include <shmem.h>
#include "check.h"

int main(void) {
  start_pes(0);
  const int me = shmem_my_pe(), npes = shmem_n_pes();
  const int right = (me + 1) % npes;
  long* c = shmalloc(4 * sizeof(long));
  int* flag = shmalloc(sizeof(int));
  c[0] = c[1] = c[2] = c[3] = 0;
  *flag = 0;
  shmem_barrier_all();
  shmem_long_add(&c[0], 2, 0);
  shmem_long_inc(&c[0], 0);
  (void)shmem_long_fadd(&c[1], 1, 0);
  (void)shmem_long_finc(&c[1], 0);
  (void)shmem_long_cswap(&c[2], 0, me + 1, 0);
  shmem_int_set(flag, me + 1, right);
  shmem_int_wait(flag, 0); /* until *flag != 0 */
  CHECK(*flag == (me + npes - 1) % npes + 1);
  shmem_barrier_all();
  CHECK(shmem_long_fetch(&c[0], 0) == 3L * npes);
  CHECK(shmem_long_fetch(&c[1], 0) == 2L * npes);
  const long winner = shmem_long_swap(&c[2], 0, 0);
  CHECK(winner == 0 || (winner >= 1 && winner <= npes));
  shmem_double_set((double*)&c[3], 0.5, me);
  CHECK(shmem_double_fetch((double*)&c[3], me) == 0.5);
  shmem_clear_cache_inv();
  shmem_set_cache_inv();
  shmem_udcflush();
  /* shmem_team_ptr: this PE's own memory always; peers' where load/store reaches */
  CHECK(shmem_team_ptr(SHMEM_TEAM_WORLD, c, me) == (void*)c);
  void* peer = shmem_team_ptr(SHMEM_TEAM_WORLD, c, right);
  CHECK(peer == shmem_ptr(c, right));
  CHECK(shmem_team_ptr(SHMEM_TEAM_INVALID, c, 0) == NULL);
  shmem_barrier_all();
  shfree(flag);
  shfree(c);
  DONE("legacy");
}
