/* profiling: the OpenSHMEM profiling interface (OpenSHMEM 1.5, section 10.1,
 * "Profiling Interface"): every routine is also callable as pshmem_*, and a
 * tool may define the shmem_* name itself and call the pshmem_* one, as TAU
 * and Score-P do. This program is such a tool: it wraps a few routines,
 * counts the calls that reach its wrappers (also through the C11 generic
 * shmem_put and the typed and context forms), and checks that the library's
 * own pshmem_* routines behave as the shmem_* ones. */
#include <pshmem.h>
#include <shmem.h>
#include "check.h"

static int barriers, long_puts, ctx_long_puts, my_pes, mallocs;

void shmem_barrier_all(void) {
  ++barriers;
  pshmem_barrier_all();
}
void shmem_long_put(long* dest, const long* source, size_t nelems, int pe) {
  ++long_puts;
  pshmem_long_put(dest, source, nelems, pe);
}
void shmem_ctx_long_put(shmem_ctx_t ctx, long* dest, const long* source, size_t nelems, int pe) {
  ++ctx_long_puts;
  pshmem_ctx_long_put(ctx, dest, source, nelems, pe);
}
int shmem_my_pe(void) {
  ++my_pes;
  return pshmem_my_pe();
}
void* shmem_malloc(size_t size) {
  ++mallocs;
  return pshmem_malloc(size);
}

static long target[4];

int main(void) {
  shmem_init();
  const int me = pshmem_my_pe(), n = pshmem_n_pes(), next = (me + 1) % n;
  CHECK(my_pes == 0);  /* pshmem_ calls bypass the wrappers */
  CHECK(shmem_my_pe() == me && my_pes == 1);
  const long mine[4] = {me, me + 1, me + 2, me + 3};
  shmem_put(target, mine, 4, next); /* C11 generic -> shmem_long_put -> the wrapper */
  shmem_long_put(target, mine, 2, next);
  shmem_ctx_long_put(SHMEM_CTX_DEFAULT, target, mine, 4, next);
  CHECK(long_puts == 2 && ctx_long_puts == 1);
  shmem_barrier_all();
  CHECK(barriers == 1);
  const int prev = (me + n - 1) % n;
  for (int i = 0; i < 4; ++i) CHECK(target[i] == prev + i);
  long* heap = shmem_malloc(4 * sizeof(long));
  CHECK(heap != NULL && mallocs == 1);
  pshmem_long_p(heap, 42, next); /* the library's routines, called by their pshmem_ names */
  pshmem_barrier_all();
  CHECK(barriers == 1 && heap[0] == 42);
  CHECK(pshmem_long_g(heap, next) == 42);
  pshmem_free(heap);
  DONE("profiling");
}
