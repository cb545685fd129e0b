/* misuse: commits one misuse of the OpenSHMEM C API, chosen by argv[1].
 *
 * OpenSHMEM 1.5 leaves most misuse undefined; coremesh answers each with a
 * message that names the call, the PE and what to change, and ends the job
 * with a nonzero status (c_misuse_test.sh checks both), never with a write
 * to memory it does not own. Reaching the end of main is itself a failure:
 * the program prints "misuse not caught" and exits 0, which the test refuses. */
#include <shmem.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long global_word; /* symmetric: a global */

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "before_init")) {
    shmem_long_p(&global_word, 1, 0);
    printf("misuse not caught\n");
    return 0;
  }
  shmem_init();
  const int me = shmem_my_pe(), npes = shmem_n_pes();
  long* heap = shmem_malloc(4 * sizeof(long));
  long source[4] = {1, 2, 3, 4};
  shmem_barrier_all();
  if (!strcmp(mode, "put_pe_range") && me == 0) shmem_long_put(heap, source, 4, npes);
  if (!strcmp(mode, "get_pe_range") && me == 0) (void)shmem_long_g(heap, -1);
  if (!strcmp(mode, "atomic_pe_range") && me == 0) (void)shmem_long_atomic_fetch_add(heap, 1, npes + 3);
  if (!strcmp(mode, "put_stack_address") && me == 0) {
    long on_stack[4];
    shmem_long_put(on_stack, source, 4, 1 % npes);
  }
  if (!strcmp(mode, "put_malloc_address") && me == 0) {
    long* private_block = malloc(4 * sizeof(long));
    shmem_long_put(private_block, source, 4, 1 % npes);
    free(private_block);
  }
  if (!strcmp(mode, "get_past_heap_end") && me == 0) {
    /* starts in the heap, runs past its end */
    static char sink[16];
    shmem_getmem(sink, heap, (size_t)1 << 40, 1 % npes);
  }
  if (!strcmp(mode, "malloc_size_mismatch")) (void)shmem_malloc(me == 0 ? 64 : 128);
  if (!strcmp(mode, "free_foreign") && me == 0) shmem_free(source);
  if (!strcmp(mode, "free_interior")) shmem_free(heap + 1);
  if (!strcmp(mode, "broadcast_bad_root"))
    shmem_long_broadcast(SHMEM_TEAM_WORLD, heap, heap + 2, 2, npes);
  if (!strcmp(mode, "wait_bad_cmp") && me == 0) shmem_long_wait_until(heap, 99, 0);
  if (!strcmp(mode, "destroyed_team")) {
    shmem_team_t team;
    if (shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, npes, NULL, 0, &team) != 0) return 2;
    shmem_team_destroy(team);
    shmem_team_sync(team);
  }
  if (!strcmp(mode, "destroyed_context") && me == 0) {
    shmem_ctx_t ctx;
    if (shmem_ctx_create(0, &ctx) != 0) return 2;
    shmem_ctx_destroy(ctx);
    shmem_ctx_long_p(ctx, heap, 7, 1);
  }
  if (!strcmp(mode, "context_destroyed_twice")) {
    shmem_ctx_t ctx;
    if (shmem_ctx_create(SHMEM_CTX_PRIVATE, &ctx) != 0) return 2;
    shmem_ctx_destroy(ctx);
    shmem_ctx_destroy(ctx);
  }
  if (!strcmp(mode, "made_up_context") && me == 0) shmem_ctx_long_p((shmem_ctx_t)(uintptr_t)0x5000, heap, 1, 0);
  if (!strcmp(mode, "context_of_destroyed_team")) {
    shmem_team_t team;
    shmem_ctx_t ctx;
    if (shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, npes, NULL, 0, &team) != 0) return 2;
    if (shmem_team_create_ctx(team, 0, &ctx) != 0) return 2;
    shmem_team_destroy(team);
    shmem_ctx_long_p(ctx, heap, 7, 0);
  }
  if (!strcmp(mode, "skipped_barrier")) {
    if (me == 1) return 0; /* its implicit shmem_finalize at exit meets PE 0's barrier */
    shmem_barrier_all();
    shmem_finalize(); /* waits for PE 1, which finalized: refused at once, not at the watchdog */
    printf("PE %d: misuse not caught (%s)\n", me, mode);
    return 0;
  }
  if (!strcmp(mode, "after_finalize")) {
    shmem_finalize();
    shmem_long_p(heap, 1, 0);
    printf("PE %d: misuse not caught (%s)\n", me, mode);
    return 0;
  }
  if (!strcmp(mode, "count_wraps") && me == 0) shmem_long_put(heap, source, ((size_t)1 << 61) + 2, 1);
  if (!strcmp(mode, "stride_wraps") && me == 0) shmem_long_iput(heap, source, (ptrdiff_t)1 << 60, 1, 3, 1);
  if (!strcmp(mode, "alltoalls_stride_wraps")) shmem_long_alltoalls(SHMEM_TEAM_WORLD, heap, heap, (ptrdiff_t)1 << 61, 1, 1);
  if (!strcmp(mode, "get_into_null") && me == 0) shmem_long_get(NULL, heap, 4, 1);
  if (!strcmp(mode, "split_into_null")) shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, npes, NULL, 0, NULL);
  if (!strcmp(mode, "wait_some_null_indices") && me == 0) (void)shmem_long_wait_until_some(heap, 4, NULL, NULL, SHMEM_CMP_EQ, 0);
  if (!strcmp(mode, "fetch_into_null") && me == 0) shmem_long_atomic_fetch_inc_nbi(NULL, heap, 1);
  if (!strcmp(mode, "made_up_team") && me == 0) {
    shmem_team_t team = (shmem_team_t)(uintptr_t)0x5000;
    (void)shmem_team_n_pes(team);
  }
  shmem_barrier_all();
  printf("PE %d: misuse not caught (%s)\n", me, mode);
  shmem_finalize();
  return 0;
}
