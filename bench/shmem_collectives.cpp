// bench_shmem_collectives: coremesh::shmem allreduce (f32 sum), alltoall and
// alltoallv (equal counts) at 1 MiB and 64 MiB per PE, timed like the MPI
// side (bench/shmem_mpi_bench.c): barrier, one call, the slowest PE's time;
// the median call. Run under the launcher: coremesh run -n 4 --heap 512M bench_shmem_collectives
//   COLL_BENCH_KIB="4 64 1024"  the sizes per PE in KiB (default "1024 65536")
//   COLL_BENCH_ALLREDUCE_ONLY=1 time allreduce alone
// (the same variables as bench/shmem_mpi_bench.c). Output lines:
// "cm_<collective>_np<N> <bytes> <ms>".
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

#include "coremesh/shmem/shmem.hpp"

namespace shmem = coremesh::shmem;

int main() {
  shmem::Session session;
  const int n = shmem::n_pes();
  shmem::Team world = shmem::Team::world();
  auto* worst = static_cast<double*>(shmem::sym_malloc(sizeof(double)));
  auto* worst_out = static_cast<double*>(shmem::sym_malloc(sizeof(double)));
  const char* kib_env = std::getenv("COLL_BENCH_KIB");
  std::istringstream kib_list(kib_env ? kib_env : "1024 65536");
  const char* only_env = std::getenv("COLL_BENCH_ALLREDUCE_ONLY");
  const int collectives = only_env && std::atoi(only_env) == 1 ? 1 : 3;
  for (size_t kib; kib_list >> kib;) {
    const size_t bytes = kib << 10;
    auto* a = static_cast<float*>(shmem::sym_malloc(bytes));
    auto* b = static_cast<float*>(shmem::sym_malloc(bytes));
    std::memset(a, 1, bytes);
    std::memset(b, 0, bytes);
    const size_t per = bytes / n;
    std::vector<size_t> counts(n, per), offsets(n);
    for (int i = 0; i < n; ++i) offsets[i] = i * per;
    const int reps = bytes > (8u << 20) ? 5 : 50;
    const char* names[3] = {"cm_allreduce", "cm_alltoall", "cm_alltoallv"};
    for (int which = 0; which < collectives; ++which) {
      std::vector<double> times;
      for (int r = -1; r < reps; ++r) {
        shmem::barrier();
        const auto t = std::chrono::steady_clock::now();
        if (which == 0) shmem::allreduce(world, b, a, bytes / 4, shmem::ReduceOp::sum);
        if (which == 1)
          shmem::alltoall(world, reinterpret_cast<char*>(b), reinterpret_cast<const char*>(a), per);
        if (which == 2)
          shmem::alltoallv<char>(world, reinterpret_cast<char*>(b), counts, offsets,
                                 reinterpret_cast<const char*>(a), counts, offsets);
        *worst = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
        shmem::allreduce(world, reinterpret_cast<int64_t*>(worst_out),
                         reinterpret_cast<const int64_t*>(worst), 1, shmem::ReduceOp::max);
        if (r >= 0) times.push_back(*worst_out);  // positive doubles order like their bits
      }
      std::nth_element(times.begin(), times.begin() + reps / 2, times.end());
      if (shmem::my_pe() == 0)
        std::printf("%s_np%d %zu %.3f\n", names[which], n, bytes, times[reps / 2] * 1e3);
    }
    shmem::sym_free(b);
    shmem::sym_free(a);
  }
  std::fflush(stdout);
  return 0;
}
