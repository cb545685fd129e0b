/* globals: RMA, atomics, waits and a reduction on global and static
 * variables (symmetric data objects), with no shmem_malloc at all. */
#include <shmem.h>
#include <stdio.h>

#define N 64

long ring_array[N];                /* .bss */
long initialised[4] = {7, 8, 9, 10}; /* .data: its contents survive shmem_init */
long counter;
int flag;
static long ring_slot;
static long sum_src[N], sum_dst[N];
static long psync[SHMEM_REDUCE_SYNC_SIZE];
static long pwrk[SHMEM_REDUCE_MIN_WRKDATA_SIZE > N / 2 + 1 ? SHMEM_REDUCE_MIN_WRKDATA_SIZE
                                                           : N / 2 + 1];

int main(void) {
  for (int i = 0; i < SHMEM_REDUCE_SYNC_SIZE; ++i) psync[i] = SHMEM_SYNC_VALUE;
  shmem_init();
  const int me = shmem_my_pe(), npes = shmem_n_pes();
  const int right = (me + 1) % npes, left = (me + npes - 1) % npes;
  int errors = 0;
  for (int i = 0; i < 4; ++i) errors += initialised[i] != 7 + i;

  /* ring: a put into a static long and into a global array */
  long src[N];
  for (int i = 0; i < N; ++i) src[i] = me * 1000L + i;
  shmem_long_p(&ring_slot, me + 1, right);
  shmem_long_put(ring_array, src, N, right);
  shmem_barrier_all();
  errors += ring_slot != left + 1;
  for (int i = 0; i < N; ++i) errors += ring_array[i] != left * 1000L + i;
  errors += shmem_long_g(&initialised[2], right) != 9;

  /* atomics on a global counter at PE 0 from every PE */
  for (int i = 0; i < 100; ++i) shmem_long_atomic_fetch_add(&counter, 2, 0);
  shmem_barrier_all();
  errors += shmem_long_atomic_fetch(&counter, 0) != 200L * npes;

  /* wait_until on a global flag set by the left neighbour */
  shmem_int_p(&flag, me + 1, right);
  shmem_int_wait_until(&flag, SHMEM_CMP_EQ, left + 1);

  /* the classic active-set reduction with static pSync / pWrk */
  for (int i = 0; i < N; ++i) sum_src[i] = me + i;
  shmem_barrier_all();
  shmem_long_sum_to_all(sum_dst, sum_src, N, 0, 0, npes, pwrk, psync);
  for (int i = 0; i < N; ++i) errors += sum_dst[i] != (long)npes * (npes - 1) / 2 + (long)npes * i;

  /* globals are accessible, stack variables are not */
  long local = 0;
  errors += !shmem_addr_accessible(&counter, right);
  errors += shmem_addr_accessible(&local, right);
  long* peer = shmem_ptr(ring_array, right); /* NULL is allowed: no load/store path */
  if (peer != NULL) errors += peer[0] != me * 1000L;

  shmem_barrier_all();
  printf("PE %d: globals %s (%d errors)\n", me, errors ? "FAILED" : "ok", errors);
  shmem_finalize();
  return errors ? 1 : 0;
}
