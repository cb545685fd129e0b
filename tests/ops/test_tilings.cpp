// Every tiling the tuner may try (OpTraits::tilings) computes the op
// correctly: each candidate of each key, forced through the op cache, against
// the naive reference, with the output's guard bytes intact.
#include <functional>

#include "coremesh/ops/gemm.hpp"
#include "coremesh/ops/grouped_gemm.hpp"
#include "coremesh/runtime/op_registry.hpp"
#include "harness.hpp"

namespace coremesh::ops {
namespace {

using namespace testing;

// Runs `op` under every candidate tiling of its key `name`; check() after each.
int for_each_candidate(const std::string& name, const std::function<void()>& op, const std::function<void()>& check) {
  runtime::OpCache& cache = runtime::OpCache::global();
  cache.clear();
  op();
  test_stream().synchronize();
  std::vector<runtime::OpCache::Entry> entries;
  for (auto& e : cache.entries())
    if (e.key.op == name) entries.push_back(e);
  EXPECT_EQ(entries.size(), 1u) << name;
  int tried = 0;
  for (const auto& e : entries)
    for (const runtime::Tiling& t : runtime::candidate_tilings(e.key, e.heuristic, e.max_blocks)) {
      SCOPED_TRACE(name + " " + runtime::describe(t));
      cache.force(e.key.text(), t);
      op();
      test_stream().synchronize();
      check();
      ++tried;
    }
  cache.unforce_all();
  cache.clear();
  return tried;
}

Tensor offsets_of(const std::vector<int64_t>& v) { return Tensor::from_vector(v, {int64_t(v.size())}); }

TEST(OpsTilings, EveryMatmulCandidateComputesTheProduct) {
  runtime::StreamGuard on(test_stream());
  for (const auto& [ta, tb] : {std::pair{false, false}, {true, false}, {false, true}}) {
    const int64_t M = 150, K = 70, N = 130;
    const Tensor a = ta ? randn({K, M}, 1) : randn({M, K}, 1), b = tb ? randn({N, K}, 2) : randn({K, N}, 2);
    const Tensor ref = reference::matmul(a, b, ta, tb);
    Guarded c({M, N});
    const int tried = for_each_candidate("matmul", [&] { matmul_out(a, b, c.tensor, ta, tb); }, [&] {
      EXPECT_NMSE(c.tensor, ref, 1e-12);
      EXPECT_TRUE(c.intact());
    });
    EXPECT_GT(tried, 8);
  }
}

TEST(OpsTilings, EveryGroupedMatmulCandidateComputesTheProducts) {
  runtime::StreamGuard on(test_stream());
  const int64_t M = 300, K = 48, N = 80;
  const std::vector<int64_t> off{0, 100, 100, 250, 290};  // an empty group, tail rows
  for (WeightLayout layout : {WeightLayout::nk, WeightLayout::kn}) {
    const Tensor x = randn({M, K}, 3), dy = randn({M, N}, 5);
    const Tensor w = layout == WeightLayout::nk ? randn({4, N, K}, 4) : randn({4, K, N}, 4);
    const Tensor ref = reference::grouped_matmul(x, w, offsets_of(off), layout);
    Guarded y({M, N});
    EXPECT_GT(for_each_candidate("grouped_matmul", [&] { grouped_matmul_out(x, w, offsets_of(off), y.tensor, layout); },
                                 [&] {
                                   EXPECT_NMSE(y.tensor, ref, 1e-12);
                                   EXPECT_TRUE(y.intact());
                                 }),
              10);
    const Tensor dw_ref = reference::grouped_matmul_backward(dy, x, w, offsets_of(off), layout).dw;
    Guarded dw(w.shape());
    EXPECT_GT(for_each_candidate("grouped_matmul_dw", [&] { grouped_matmul_dw(dy, x, offsets_of(off), dw.tensor, layout); },
                                 [&] {
                                   EXPECT_NMSE(dw.tensor, dw_ref, 1e-12);
                                   EXPECT_TRUE(dw.intact());
                                 }),
              2);
  }
}

}  // namespace
}  // namespace coremesh::ops
