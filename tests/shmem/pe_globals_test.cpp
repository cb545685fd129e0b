// Global and static variables are symmetric (data_segment.cpp): RMA, nbi,
// signals, strided puts and collectives on them; fork privatises them;
// stack memory is still refused with a message saying what is symmetric.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "coremesh/core/error.hpp"
#include "coremesh/shmem/shmem.hpp"
#include "shmem.h"

namespace shmem = coremesh::shmem;

namespace {
int me() { return shmem::my_pe(); }
int npes() { return shmem::n_pes(); }

constexpr size_t kCount = 4096;
int32_t g_ring[kCount];                      // .bss
double g_initialised[3] = {1.5, 2.5, 3.5};  // .data
uint64_t g_signal;
int64_t g_strided[2 * 16];
float g_reduce_src[1000], g_reduce_dst[1000];
long g_private_after_fork = 42;
}  // namespace

TEST(Globals, InitialisedDataSurvivesInitAndIsReadable) {
  const int right = (me() + 1) % npes();
  EXPECT_EQ(g_initialised[1], 2.5);
  double got[3] = {};
  shmem::get(got, g_initialised, 3, right);
  EXPECT_EQ(got[0], 1.5);
  EXPECT_EQ(got[2], 3.5);
  shmem::barrier();
}

TEST(Globals, NbiPutAndGetInARing) {
  const int right = (me() + 1) % npes(), left = (me() + npes() - 1) % npes();
  std::vector<int32_t> src(kCount), back(kCount);
  for (size_t i = 0; i < kCount; ++i) src[i] = static_cast<int32_t>(me() * 100000 + i);
  shmem::put_nbi(g_ring, src.data(), kCount, right);
  shmem::quiet();
  shmem::barrier();
  size_t bad = 0;
  for (size_t i = 0; i < kCount; ++i) bad += g_ring[i] != static_cast<int32_t>(left * 100000 + i);
  EXPECT_EQ(bad, 0u);
  shmem::get_nbi(back.data(), g_ring, kCount, right);  // right holds what we put
  shmem::quiet();
  EXPECT_EQ(back, src);
  shmem::barrier();
}

TEST(Globals, PutSignalOnGlobalSignal) {
  const int right = (me() + 1) % npes(), left = (me() + npes() - 1) % npes();
  const int32_t value = 7000 + me();
  shmem::put_signal(&g_ring[1], &value, 1, &g_signal, 5, shmem::SignalOp::set, right);
  EXPECT_EQ(shmem::signal_wait_until(&g_signal, shmem::Cmp::eq, uint64_t(5)), uint64_t(5));
  EXPECT_EQ(g_ring[1], 7000 + left);
  shmem::barrier();
}

TEST(Globals, StridedPut) {
  const int right = (me() + 1) % npes(), left = (me() + npes() - 1) % npes();
  int64_t src[16];
  for (int i = 0; i < 16; ++i) src[i] = me() * 100 + i;
  shmem_int64_iput(g_strided, src, 2, 1, 16, right);  // the C API's strided put
  shmem::barrier();
  for (int i = 0; i < 16; ++i) EXPECT_EQ(g_strided[2 * i], left * 100 + i);
  shmem::barrier();
}

TEST(Globals, AllreduceOnGlobalArrays) {
  for (int i = 0; i < 1000; ++i) g_reduce_src[i] = static_cast<float>(me() + i);
  shmem::barrier();
  shmem::allreduce(shmem::Team::world(), g_reduce_dst, g_reduce_src, 1000, shmem::ReduceOp::sum);
  const float base = static_cast<float>(npes() * (npes() - 1) / 2);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(g_reduce_dst[i], base + float(npes()) * i) << i;
  shmem::barrier();
}

// A forked child gets private globals: its writes never reach the parent.
TEST(Globals, ForkedChildWritesStayInTheChild) {
  const pid_t child = fork();
  if (child == 0) {
    g_private_after_fork = 1000;
    _exit(g_private_after_fork == 1000 ? 0 : 1);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(g_private_after_fork, 42);
  shmem::barrier();
}

TEST(Globals, StackAndMallocAreRefusedWithAClearMessage) {
  long on_stack = 0;
  try {
    shmem::put(&on_stack, &on_stack, 1, 0);
    ADD_FAILURE() << "a put to a stack variable succeeded";
  } catch (const coremesh::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("is not symmetric on PE"), std::string::npos) << what;
    EXPECT_NE(what.find("global and static variables"), std::string::npos) << what;
  }
  EXPECT_THROW(shmem::sym_free(&g_signal), coremesh::Error);  // symmetric, yet not the heap's
  shmem::barrier();
}
