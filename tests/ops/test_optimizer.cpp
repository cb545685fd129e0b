// AdamW vs the double reference over several steps; clipping coefficient from
// partial sums; the clip factor flows into the update without host sync.
#include <cmath>

#include "coremesh/ops/optimizer.hpp"
#include "harness.hpp"

namespace coremesh::ops {
namespace {

using namespace testing;

TEST(OpsOptimizer, AdamWMatchesReference) {
  AdamWConfig cfg{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  for_each_limit([&](const LimitCase&) {
    Tensor p = randn({9001}, 1), m = Tensor::zeros({9001}), v = Tensor::zeros({9001});
    Tensor pr = p.clone(), mr = m.clone(), vr = v.clone();
    for (int64_t step = 1; step <= 3; ++step) {
      Tensor g = randn({9001}, 10 + step);
      adamw_step(p, g, m, v, cfg, step);
      test_stream().synchronize();
      reference::adamw_step(pr, g, mr, vr, cfg, step);
    }
    EXPECT_NMSE(p, pr, 1e-12);
    EXPECT_NMSE(m, mr, 1e-12);
    EXPECT_NMSE(v, vr, 1e-12);
  });
}

TEST(OpsOptimizer, ClipByGlobalNormFromPartials) {
  std::vector<Tensor> grads{randn({5000}, 2), randn({7, 3}, 3), Tensor::zeros({0}), randn({4097}, 4)};
  double want = 0;
  for (const Tensor& g : grads)
    for (float x : g.to_float_vector()) want += double(x) * x;
  for_each_limit([&](const LimitCase&) {
    Tensor s = grad_sq_sum(grads);
    // "All-reduce" over two PEs holding the same gradients: double the sum.
    Tensor s2 = grad_sq_sum({grads[0], grads[1], grads[2], grads[3], grads[0], grads[1], grads[3]});
    Tensor coef = clip_coefficient(s, 1.0f), none = clip_coefficient(s, 1e6f);
    test_stream().synchronize();
    EXPECT_NEAR(s.item({0}), want, want * 1e-6);
    EXPECT_NEAR(s2.item({0}), 2 * want - 0.0, want * 1e-5 + 1e-3);
    EXPECT_NEAR(coef.item({0}), 1.0 / (std::sqrt(want) + 1e-6), 1e-6);
    EXPECT_EQ(none.item({0}), 1.0f);
  });
  // Fused: the coefficient computed on the stream scales the update.
  AdamWConfig cfg{1e-2f, 0.9f, 0.99f, 1e-8f, 0.0f};
  Tensor p = randn({5000}, 5), m = Tensor::zeros({5000}), v = Tensor::zeros({5000});
  Tensor pr = p.clone(), mr = m.clone(), vr = v.clone();
  run_on_stream([&] { adamw_step(p, grads[0], m, v, cfg, 1, clip_coefficient(grad_sq_sum(grads), 1.0f)); });
  reference::adamw_step(pr, grads[0], mr, vr, cfg, 1, static_cast<float>(1.0 / (std::sqrt(want) + 1e-6)));
  EXPECT_NMSE(m, mr, 1e-10);
  EXPECT_NMSE(p, pr, 1e-10);
}

}  // namespace
}  // namespace coremesh::ops
