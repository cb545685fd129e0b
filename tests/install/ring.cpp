// ring.cpp: an OpenSHMEM program in C++ (built with oshc++): every PE puts
// its id into its right neighbour's symmetric buffer; each checks its left's.
#include <shmem.h>

#include <cstdio>
#include <vector>

int main() {
  shmem_init();
  const int me = shmem_my_pe(), npes = shmem_n_pes();
  const int right = (me + 1) % npes, left = (me + npes - 1) % npes;
  constexpr size_t n = 256;
  auto* dest = static_cast<int*>(shmem_malloc(n * sizeof(int)));
  std::vector<int> src(n, me);
  shmem_int_put(dest, src.data(), n, right);
  shmem_barrier_all();
  int errors = 0;
  for (size_t i = 0; i < n; ++i) errors += dest[i] != left;
  std::printf("PE %d of %d: C++ ring %s (%d errors)\n", me, npes, errors ? "FAILED" : "ok", errors);
  shmem_free(dest);
  shmem_finalize();
  return errors ? 1 : 0;
}
