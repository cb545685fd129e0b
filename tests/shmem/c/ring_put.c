/* ring_put: every PE puts its id to its right neighbour with the C11
 * generic shmem_put / shmem_p, then signals; the neighbour waits. */
#include <shmem.h>
#include <stdio.h>

#define N 1024

int main(void) {
  shmem_init();
  const int me = shmem_my_pe(), npes = shmem_n_pes();
  const int right = (me + 1) % npes, left = (me + npes - 1) % npes;
  long* dest = shmem_malloc(N * sizeof(long));
  uint64_t* signal = shmem_calloc(1, sizeof(uint64_t));
  int* flag = shmem_calloc(1, sizeof(int));
  long src[N];
  for (int i = 0; i < N; ++i) src[i] = me * 10000L + i;

  shmem_put(dest, src, N, right);           /* generic -> shmem_long_put */
  shmem_barrier_all();
  int errors = 0;
  for (int i = 0; i < N; ++i) errors += dest[i] != left * 10000L + i;

  /* put with signal, then a token with wait_until */
  shmem_put_signal(dest, src, N, signal, 1, SHMEM_SIGNAL_SET, right);
  shmem_signal_wait_until(signal, SHMEM_CMP_EQ, 1);
  for (int i = 0; i < N; ++i) errors += dest[i] != left * 10000L + i;
  shmem_p(flag, me + 1, right);
  shmem_wait_until(flag, SHMEM_CMP_EQ, left + 1);

  shmem_barrier_all();
  printf("PE %d: ring %s (%d errors)\n", me, errors ? "FAILED" : "ok", errors);
  shmem_free(flag);
  shmem_free(signal);
  shmem_free(dest);
  shmem_finalize();
  return errors ? 1 : 0;
}
