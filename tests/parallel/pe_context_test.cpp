// Context-parallel attention at every PE count (cp = the PEs of the job)
// against full causal flash attention on one PE: ring (zig-zag and
// contiguous) and Ulysses, MHA and GQA, chunks of odd length. Every PE
// builds the same full q, k, v and dout, attends over its own tokens through
// the seam, and compares out, lse, dq, dk and dv at its tokens' true
// positions. Two rounds per layout reuse the ring slots and buffers.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "coremesh/parallel/context_parallel.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/shmem/shmem.hpp"

using namespace coremesh;
using namespace coremesh::parallel;

namespace {

constexpr int64_t B = 2, D = 8;

Tensor random(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor t = Tensor::empty(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
  return t;
}

// The local tokens of x (B,T,...) along `time` (1, or 2 for lse (B,H,T)).
Tensor local_tokens(const Tensor& x, const SequenceSplit& split, int64_t T_local, int time = 1) {
  Shape shape = x.shape();
  shape[size_t(time)] = T_local;
  Tensor out = Tensor::empty(shape);
  int64_t outer = 1, width = 1;
  for (int i = 0; i < time; ++i) outer *= x.size(i);
  for (int i = time + 1; i < x.dim(); ++i) width *= x.size(i);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t t = 0; t < T_local; ++t) {
      const int64_t g = split.global(split.rank, t, T_local);
      std::copy_n(x.data<float>() + (o * x.size(time) + g) * width, width,
                  out.data<float>() + (o * T_local + t) * width);
    }
  return out;
}

float max_error(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  float e = 0.0f;
  const auto a = got.to_float_vector(), b = want.to_float_vector();
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    e = std::max(e, std::isfinite(a[i]) ? std::fabs(a[i] - b[i]) : INFINITY);
  return e;
}

void check_layout(CpComm comm, bool zigzag, int64_t H, int64_t Hkv, int64_t chunk) {
  const int me = shmem::my_pe(), n = shmem::n_pes();
  std::vector<int> world;
  for (int p = 0; p < n; ++p) world.push_back(p);
  const int64_t chunks = zigzag ? 2 * n : n, T = chunks * chunk, Tl = T / n;
  ShmemContext cp(Group::of(world, me), comm, zigzag, {B, Tl, H, Hkv, D});
  runtime::Stream stream;
  runtime::StreamGuard on(stream);
  int64_t bytes = 0;
  for (uint32_t round = 0; round < 2; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    const Tensor q = random({B, T, H, D}, 11 + round), k = random({B, T, Hkv, D}, 23 + round),
                 v = random({B, T, Hkv, D}, 37 + round), dout = random({B, T, H, D}, 41 + round);
    const ops::AttentionOut full = ops::flash_attention(q, k, v, true);
    const ops::AttentionGrads grads = ops::flash_attention_backward(dout, q, k, v, full.out, full.lse, true);
    const SequenceSplit& split = cp.split();
    auto mine = [&](const Tensor& x, int time = 1) { return local_tokens(x, split, Tl, time); };
    const Tensor lq = mine(q), lk = mine(k), lv = mine(v);
    const ops::AttentionOut out = cp.attention(lq, lk, lv);
    const ops::AttentionGrads g = cp.attention_backward(mine(dout), lq, lk, lv, out);
    stream.synchronize();
    constexpr float tol = 2e-5f;
    EXPECT_LT(max_error(out.out, mine(full.out)), tol) << "out";
    EXPECT_LT(max_error(out.lse, mine(full.lse, 2)), tol) << "lse";
    EXPECT_LT(max_error(g.dq, mine(grads.dq)), tol) << "dq";
    EXPECT_LT(max_error(g.dk, mine(grads.dk)), tol) << "dk";
    EXPECT_LT(max_error(g.dv, mine(grads.dv)), tol) << "dv";
    const CpTraffic f = cp_bytes_per_call(comm, n, B, Tl, H, Hkv, D);
    bytes += f.forward + f.backward;
    EXPECT_EQ(cp.bytes_put(), bytes) << "bytes put against the formula";
  }
  // the positions are the tokens' true ones
  const Tensor pos = cp.positions(Tl);
  for (int64_t t = 0; t < Tl; ++t) EXPECT_EQ(pos.data<int64_t>()[t], cp.split().global(me, t, Tl));
  shmem::barrier();
}

}  // namespace

TEST(ContextParallel, RingZigzagEqualsFullAttention) {
  const int n = shmem::n_pes();
  check_layout(CpComm::ring, true, 4, 2, 3);       // GQA, odd chunks
  check_layout(CpComm::ring, true, 2 * n, 2 * n, 5);  // MHA
}

TEST(ContextParallel, RingContiguousEqualsFullAttention) {
  check_layout(CpComm::ring, false, 4, 1, 3);
  check_layout(CpComm::ring, false, 2, 2, 5);
}

TEST(ContextParallel, UlyssesEqualsFullAttention) {
  const int n = shmem::n_pes();
  check_layout(CpComm::ulysses, false, 2 * n, n, 3);  // GQA
  check_layout(CpComm::ulysses, true, n, n, 5);       // MHA, zig-zag tokens
}

TEST(ContextParallel, UlyssesRefusesHeadsThatDoNotSplit) {
  const int me = shmem::my_pe(), n = shmem::n_pes();
  if (n == 1) GTEST_SKIP() << "every head count splits over one PE";
  std::vector<int> world;
  for (int p = 0; p < n; ++p) world.push_back(p);
  try {
    ShmemContext cp(Group::of(world, me), CpComm::ulysses, false, {B, 6, 2 * n + 1, 1, D});
    ADD_FAILURE() << "accepted heads that do not split";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("Ulysses splits the {} query heads over cp = {}", 2 * n + 1, n)),
              std::string::npos)
        << e.what();
  }
  shmem::barrier();
}
