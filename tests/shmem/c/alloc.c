/* alloc: the edge cases of the memory management routines.
 *
 * OpenSHMEM 1.5, 9.3.1 (shmem_malloc, shmem_free, shmem_realloc,
 * shmem_align): shmem_align returns a block "aligned on an alignment
 * boundary", where alignment is a power of two (a multiple of
 * sizeof(void *)); page sizes do not limit it. A request that cannot be
 * met returns a null pointer; size 0 returns a null pointer; shmem_free
 * of NULL does nothing; shmem_realloc(NULL, n) is shmem_malloc(n) and
 * shmem_realloc(p, 0) frees p. 9.3.3 (shmem_calloc): count or size 0
 * returns NULL; count * size that overflows size_t cannot be allocated.
 * A heap too full for a request returns a null pointer too (9.3.1, Return
 * Values), and shmem_realloc then leaves the block unchanged.
 * Every PE passes the same arguments, so every PE sees the same result. */
#include <shmem.h>
#include <stdint.h>
#include <string.h>
#include "check.h"

static int aligned(const void* p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

int main(void) {
  shmem_init();
  const int me = shmem_my_pe(), npes = shmem_n_pes();

  /* alignments from a cache line to 1 MiB, each after an odd-sized block
   * so that the next free offset is not already aligned */
  const size_t alignments[] = {8, 64, 256, 4096, 8192, 16384, 65536, 1 << 20};
  for (size_t k = 0; k < sizeof alignments / sizeof alignments[0]; ++k) {
    const size_t a = alignments[k];
    char* pad = shmem_malloc(200 + 128 * k);
    long* p = shmem_align(a, 3 * sizeof(long));
    CHECK(p != NULL);
    CHECK(aligned(p, a));
    if (p) {
      /* symmetric: a put into it reaches the same block on the next PE */
      p[0] = -1;
      shmem_barrier_all();
      shmem_long_p(p, me, (me + 1) % npes);
      shmem_barrier_all();
      CHECK(p[0] == (me + npes - 1) % npes);
    }
    shmem_free(p);
    shmem_free(pad);
  }
  /* the legacy name */
  void* q = shmemalign(8192, 100);
  CHECK(q != NULL && aligned(q, 8192));
  shfree(q);

  /* invalid alignments: not a power of two, or 0: NULL on every PE, no error */
  CHECK(shmem_align(3, 64) == NULL);
  CHECK(shmem_align(24, 64) == NULL);
  CHECK(shmem_align(4097, 64) == NULL);
  CHECK(shmem_align(0, 64) == NULL);
  /* an alignment no heap can hold */
  CHECK(shmem_align((size_t)1 << 62, 64) == NULL);

  /* size 0 */
  CHECK(shmem_malloc(0) == NULL);
  CHECK(shmem_align(4096, 0) == NULL);
  CHECK(shmem_calloc(0, 8) == NULL);
  CHECK(shmem_calloc(8, 0) == NULL);
  CHECK(shmem_malloc_with_hints(0, SHMEM_MALLOC_ATOMICS_REMOTE) == NULL);
  /* count * size overflows */
  CHECK(shmem_calloc(SIZE_MAX / 2, 4) == NULL);
  CHECK(shmem_calloc((size_t)1 << 33, (size_t)1 << 33) == NULL);
  shmem_free(NULL);
  /* sizes near SIZE_MAX (a negative count times a size): NULL, and the heap
   * stays whole (they used to wrap around to a block inside another) */
  void* before = shmem_malloc(64);
  CHECK(shmem_malloc((size_t)-1 * sizeof(long)) == NULL);
  CHECK(shmem_malloc(SIZE_MAX - 1000) == NULL);
  CHECK(shmem_align(4096, SIZE_MAX - 1000) == NULL);
  CHECK(shmem_calloc(1, SIZE_MAX - 1000) == NULL);
  CHECK(shmem_realloc(NULL, SIZE_MAX - 1000) == NULL);
  CHECK(shmem_realloc(NULL, (size_t)1 << 40) == NULL); /* as shmem_malloc: NULL, the job goes on */
  long* after = shmem_malloc(64);
  CHECK(after != NULL && ((char*)after >= (char*)before + 64 || (char*)after + 64 <= (char*)before));
  shmem_long_p(after, me, (me + 1) % npes); /* symmetric (the wrapped size left one below the heap) */
  shmem_barrier_all();
  CHECK(after[0] == (me + npes - 1) % npes);
  shmem_free(after);
  shmem_free(before);
  /* a context with options nobody defined: nonzero, SHMEM_CTX_INVALID */
  shmem_ctx_t bad_ctx;
  CHECK(shmem_ctx_create(0x7fff0000L, &bad_ctx) != 0 && bad_ctx == SHMEM_CTX_INVALID);

  /* realloc: NULL -> malloc; keeps the contents; 0 -> free */
  long* r = shmem_realloc(NULL, 4 * sizeof(long));
  CHECK(r != NULL);
  if (r) {
    for (int i = 0; i < 4; ++i) r[i] = 10 * me + i;
    r = shmem_realloc(r, 1000 * sizeof(long));
    CHECK(r != NULL);
    for (int i = 0; r && i < 4; ++i) CHECK(r[i] == 10 * me + i);
    CHECK(shmem_realloc(r, 0) == NULL);
  }
  /* realloc where the block lies: a shrink always (9.3.1 fails a realloc only
   * when the space cannot be had), a growth into the free space after it */
  long* g = shmem_malloc(1000 * sizeof(long));
  CHECK(g != NULL);
  if (g) {
    for (int i = 0; i < 10; ++i) g[i] = 10 * me + i;
    long* same = shmem_realloc(g, 10 * sizeof(long));
    CHECK(same == g);
    same = shmem_realloc(g, 2000 * sizeof(long));
    CHECK(same == g);
    for (int i = 0; same && i < 10; ++i) CHECK(same[i] == 10 * me + i);
    shmem_free(same ? same : g);
  }

  /* calloc zeroes, also a reused block */
  unsigned char* d = shmem_malloc(4096);
  memset(d, 0xab, 4096);
  shmem_free(d);
  unsigned char* z = shmem_calloc(512, 8);
  CHECK(z != NULL);
  for (int i = 0; z && i < 4096; ++i) CHECK(z[i] == 0);
  shmem_free(z);

  /* 9.3: the allocation routines' implicit barrier quiets the default
   * context: a put still in flight when they are called has landed when they
   * return (a large non-blocking put keeps the copy engine busy), also in a
   * block that realloc moves, whose old place the next malloc hands out */
  {
    const size_t big = (size_t)24 << 20;
    unsigned char* busy = shmem_malloc(big);
    long* blk = shmem_calloc(8, sizeof(long));
    static unsigned char big_src[(size_t)24 << 20];
    static long sevens[8] = {7, 7, 7, 7, 7, 7, 7, 7};
    memset(big_src, 0xab, big);
    shmem_barrier_all();
    if (me == 0) {
      shmem_putmem_nbi(busy, big_src, big, 1 % npes);
      shmem_long_put_nbi(blk, sevens, 8, 1 % npes);
    }
    long* moved = shmem_realloc(blk, 4096 * sizeof(long));
    long* fresh = shmem_calloc(8, sizeof(long));
    if (me == 1 % npes) {
      CHECK(busy[big - 1] == 0xab);
      for (int i = 0; moved && i < 8; ++i) CHECK(moved[i] == 7);
    }
    shmem_barrier_all();
    for (int i = 0; fresh && i < 8; ++i) CHECK(fresh[i] == 0);
    shmem_free(fresh);
    shmem_free(moved);
    shmem_free(busy);
  }

  /* a full heap: a null pointer on every PE, not the end of the job (the
   * library says why on stderr); the heap stays usable, and a realloc that
   * cannot grow leaves its block as it was */
  const size_t too_much = (size_t)1 << 42;
  CHECK(shmem_malloc(too_much) == NULL);
  CHECK(shmem_calloc(too_much / 8, 8) == NULL);
  CHECK(shmem_align(4096, too_much) == NULL);
  long* keep = shmem_malloc(4 * sizeof(long));
  CHECK(keep != NULL);
  if (keep) {
    for (int i = 0; i < 4; ++i) keep[i] = 100 * me + i;
    CHECK(shmem_realloc(keep, too_much) == NULL);
    for (int i = 0; i < 4; ++i) CHECK(keep[i] == 100 * me + i);
    shmem_free(keep);
  }
  DONE("alloc");
}
