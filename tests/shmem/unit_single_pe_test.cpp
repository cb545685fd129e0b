// Without a launcher the library runs as one PE on anonymous shared memory.
#include <gtest/gtest.h>

#include "coremesh/core/error.hpp"
#include "coremesh/shmem/shmem.hpp"

namespace shmem = coremesh::shmem;

TEST(SinglePe, SessionRunsAloneAndCleansUp) {
  EXPECT_THROW(shmem::my_pe(), coremesh::InvalidArgument);  // before init: clear error
  {
    shmem::Session session(shmem::InitOptions{8 << 20});
    EXPECT_EQ(shmem::my_pe(), 0);
    EXPECT_EQ(shmem::n_pes(), 1);
    auto* v = static_cast<float*>(shmem::sym_calloc(1024, sizeof(float)));
    float ones[1024];
    std::fill(ones, ones + 1024, 1.0f);
    shmem::put_nbi(v, ones, 1024, 0);
    shmem::quiet();
    shmem::allreduce(shmem::Team::world(), v, v, 1024, shmem::ReduceOp::sum);
    EXPECT_EQ(v[1023], 1.0f);
    EXPECT_THROW(shmem::sym_malloc(16 << 20), coremesh::InvalidArgument);  // heap is 8 MiB
    shmem::sym_free(v);
  }
  EXPECT_FALSE(shmem::initialized());
  shmem::Session again;  // init after finalize works
  EXPECT_EQ(shmem::n_pes(), 1);
}
