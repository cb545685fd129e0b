/* heap: two 64 MiB symmetric buffers (the heap is sized by the standard
 * SHMEM_SYMMETRIC_SIZE, or the default), written everywhere and read back
 * from a neighbour; then freed and allocated again. */
#include <shmem.h>
#include <string.h>
#include "check.h"

#define MIB (1L << 20)

int main(void) {
  shmem_init();
  const int me = shmem_my_pe(), npes = shmem_n_pes();
  for (int round = 0; round < 2; ++round) {
    char* a = shmem_malloc(64 * MIB);
    char* b = shmem_malloc(64 * MIB);
    CHECK(a != NULL && b != NULL);
    memset(a, me + 1, 64 * MIB);
    memset(b, me + 2, 64 * MIB);
    shmem_barrier_all();
    const int right = (me + 1) % npes;
    CHECK(shmem_char_g(a + 64 * MIB - 1, right) == (char)(right + 1));
    CHECK(shmem_char_g(b + 12345, right) == (char)(right + 2));
    shmem_free(b);
    shmem_free(a);
  }
  DONE("heap");
}
