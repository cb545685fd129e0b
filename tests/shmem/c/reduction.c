/* reduction: team reductions (1.5) and the deprecated active-set
 * *_to_all form, plus atomics and a lock, all checked. */
#include <shmem.h>
#include <stdio.h>

#define N 1000

int main(void) {
  shmem_init();
  const int me = shmem_my_pe(), npes = shmem_n_pes();
  int errors = 0;

  double* src = shmem_malloc(N * sizeof(double));
  double* dst = shmem_malloc(N * sizeof(double));
  for (int i = 0; i < N; ++i) src[i] = me + i;
  shmem_double_sum_reduce(SHMEM_TEAM_WORLD, dst, src, N);
  for (int i = 0; i < N; ++i) errors += dst[i] != npes * (npes - 1) / 2.0 + (double)npes * i;
  shmem_max_reduce(SHMEM_TEAM_WORLD, dst, src, N); /* generic -> shmem_double_max_reduce */
  for (int i = 0; i < N; ++i) errors += dst[i] != npes - 1 + i;

  /* deprecated active set over all PEs */
  long* psync = shmem_malloc(SHMEM_REDUCE_SYNC_SIZE * sizeof(long));
  for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; ++i) psync[i] = SHMEM_SYNC_VALUE;
  int* isrc = shmem_malloc(N * sizeof(int));
  int* idst = shmem_malloc(N * sizeof(int));
  static int pwrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE];
  for (int i = 0; i < N; ++i) isrc[i] = 1 << (me % 30);
  shmem_barrier_all();
  shmem_int_or_to_all(idst, isrc, N, 0, 0, npes, pwrk, psync);
  int want = 0;
  for (int pe = 0; pe < npes; ++pe) want |= 1 << (pe % 30);
  for (int i = 0; i < N; ++i) errors += idst[i] != want;

  /* atomics under contention and a lock */
  long* counter = shmem_calloc(2, sizeof(long));
  long* lock = shmem_calloc(1, sizeof(long));
  for (int i = 0; i < 500; ++i) shmem_atomic_inc(&counter[0], 0);
  for (int i = 0; i < 50; ++i) {
    shmem_set_lock(lock);
    long v = shmem_long_g(&counter[1], 0);
    shmem_long_p(&counter[1], v + 1, 0);
    shmem_clear_lock(lock);
  }
  shmem_barrier_all();
  errors += shmem_atomic_fetch(&counter[0], 0) != 500L * npes;
  errors += shmem_long_atomic_fetch(&counter[1], 0) != 50L * npes;

  shmem_barrier_all();
  printf("PE %d: reduction %s (%d errors)\n", me, errors ? "FAILED" : "ok", errors);
  shmem_finalize();
  return errors ? 1 : 0;
}
