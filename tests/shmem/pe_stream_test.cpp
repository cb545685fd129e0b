// On-stream variants: comm kernels on runtime streams, with block_dim
// bounded by the stream's vector-core limit.
#include <gtest/gtest.h>

#include <algorithm>

#include <cstring>
#include <numeric>

#include "coremesh/runtime/profiler.hpp"
#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/shmem/shmem.hpp"

namespace shmem = coremesh::shmem;
namespace rt = coremesh::runtime;

namespace {
int me() { return shmem::my_pe(); }
int npes() { return shmem::n_pes(); }
}  // namespace

TEST(OnStream, PutSignalWaitQuietBarrierInStreamOrder) {
  constexpr size_t kCount = 1 << 20;  // 4 MiB: many blocks
  auto* data = static_cast<float*>(shmem::sym_malloc(kCount * sizeof(float)));
  auto* sig = static_cast<uint64_t*>(shmem::sym_calloc(1, sizeof(uint64_t)));
  std::vector<float> src(kCount);
  std::iota(src.begin(), src.end(), static_cast<float>(me()));
  const int right = (me() + 1) % npes(), left = (me() + npes() - 1) % npes();

  rt::Stream stream;
  rt::profiler_start();
  {
    // 1 or 2 vector cores (1 where the PE has one CPU, e.g. bound by mpirun)
    const int vector = std::min(1 + me() % 2, rt::Device::default_device().spec().vector);
    rt::StreamLimitGuard limit(stream, -1, vector);
    shmem::put_signal_on_stream(stream, data, src.data(), kCount, sig, 1, shmem::SignalOp::set, right);
    shmem::signal_wait_on_stream(stream, sig, shmem::Cmp::eq, 1);
    shmem::quiet_on_stream(stream);
    shmem::barrier_on_stream(stream);
  }
  stream.synchronize();
  rt::profiler_stop();
  size_t bad = 0;
  for (size_t i = 0; i < kCount; ++i) bad += data[i] != static_cast<float>(left) + static_cast<float>(i);
  EXPECT_EQ(bad, 0u);
  bool saw_put = false;
  for (const rt::KernelRecord& k : rt::profiler_records()) {
    if (k.name != "shmem_put_signal") continue;
    saw_put = true;
    EXPECT_EQ(k.kind, rt::KernelKind::comm);
    EXPECT_EQ(k.block_dim, std::min(1 + (me() % 2), rt::max_blocks(k.limits, rt::KernelKind::comm)));
    EXPECT_LE(k.block_dim, k.limits.vector);
  }
  EXPECT_TRUE(saw_put);
  rt::profiler_clear();
  shmem::barrier();
  shmem::sym_free(sig);
  shmem::sym_free(data);
}

TEST(OnStream, AllreduceAndAlltoallvMatchHostResults) {
  const size_t n = 100003;
  auto* src = static_cast<float*>(shmem::sym_malloc(n * sizeof(float)));
  auto* on_stream = static_cast<float*>(shmem::sym_malloc(n * sizeof(float)));
  auto* on_host = static_cast<float*>(shmem::sym_malloc(n * sizeof(float)));
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<float>((me() + 1) * 0.5 + i % 7);
  rt::Stream stream;
  shmem::allreduce_on_stream(stream, shmem::Team::world(), on_stream, src, n, shmem::ReduceOp::sum);
  stream.synchronize();
  shmem::allreduce(shmem::Team::world(), on_host, src, n, shmem::ReduceOp::sum);
  EXPECT_EQ(std::memcmp(on_stream, on_host, n * sizeof(float)), 0);

  // alltoallv: PE r sends r + 1 elements (value r * 100 + j) to every j.
  const int k = npes();
  std::vector<size_t> sc(k, me() + 1), so(k), rc(k), ro(k);
  for (int j = 0; j < k; ++j) so[j] = j * (me() + 1), rc[j] = j + 1, ro[j] = j * k;
  auto* a = static_cast<int32_t*>(shmem::sym_calloc(k * k, sizeof(int32_t)));
  auto* b = static_cast<int32_t*>(shmem::sym_calloc(k * k, sizeof(int32_t)));
  for (int j = 0; j < k; ++j)
    for (int e = 0; e <= me(); ++e) a[so[j] + e] = me() * 100 + j;
  shmem::alltoallv_on_stream<int32_t>(stream, shmem::Team::world(), b, rc, ro, a, sc, so);
  stream.synchronize();
  for (int j = 0; j < k; ++j)
    for (int e = 0; e <= j; ++e) EXPECT_EQ(b[ro[j] + e], j * 100 + me());
  shmem::barrier();
  shmem::sym_free(b);
  shmem::sym_free(a);
  shmem::sym_free(on_host);
  shmem::sym_free(on_stream);
  shmem::sym_free(src);
}
