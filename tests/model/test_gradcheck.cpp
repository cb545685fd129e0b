// Finite-difference gradient checks of whole layers: for every parameter
// tensor of a small model (dense layer, MoE layer with shared expert, both
// gatings, untied head), the backward's gradient at its largest-magnitude
// coordinates must match a central difference of the loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "coremesh/model/model.hpp"
#include "coremesh/model/rng.hpp"
#include "reference_fixture.hpp"

using namespace coremesh;
using namespace coremesh::model;

static void grad_check(ModelConfig c) {
  Model m(c);
  m.init_weights(7);
  const int B = 2, T = 8;
  Rng rng(3);
  std::vector<int32_t> x(B * T), y(B * T);
  for (auto& v : x) v = int32_t(rng.below(uint64_t(c.vocab_size)));
  for (auto& v : y) v = int32_t(rng.below(uint64_t(c.vocab_size)));
  auto loss = [&] {
    const xcheck::Forward f = xcheck::forward_sync(m, 0, x.data(), y.data(), B, T);
    m.close_slot(0);
    return f.ce + f.aux;
  };
  m.zero_grad();
  xcheck::forward_sync(m, 0, x.data(), y.data(), B, T);
  m.backward(0);
  runtime::current_stream().synchronize();
  std::vector<float> g(m.grad_data(), m.grad_data() + m.num_params());
  const float eps = 1e-3f;
  int checked = 0;
  for (const auto& p : m.params()) {
    std::vector<int64_t> order(size_t(p.numel));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + std::min<int64_t>(3, p.numel), order.end(),
                      [&](int64_t a, int64_t b) { return std::fabs(g[size_t(p.offset + a)]) > std::fabs(g[size_t(p.offset + b)]); });
    for (int i = 0; i < std::min<int64_t>(3, p.numel); ++i) {
      float* w = m.param_data() + p.offset + order[size_t(i)];
      const float saved = *w;
      *w = saved + eps;
      const double lp = loss();
      *w = saved - eps;
      const double lm = loss();
      *w = saved;
      const double fd = (lp - lm) / (2.0 * eps);
      const double an = g[size_t(p.offset + order[size_t(i)])];
      EXPECT_NEAR(fd, an, 2e-3 + 3e-2 * std::fabs(an)) << p.name << "[" << order[size_t(i)] << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 30);
}

static ModelConfig tiny() {
  ModelConfig c;
  c.vocab_size = 40, c.d_model = 16, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2;
  c.max_seq_len = 8, c.first_k_dense = 1, c.dense_hidden = 24, c.n_routed_experts = 4;
  c.n_shared_experts = 1, c.top_k = 2, c.expert_hidden = 12, c.init_std = 0.3f;
  return c;
}

TEST(GradCheck, DenseAndSoftmaxMoeLayersWithAuxLoss) {
  ModelConfig c = tiny();
  c.aux_loss_alpha = 0.1f;
  grad_check(c);
}

TEST(GradCheck, SigmoidMoeUntiedHeadMha) {
  ModelConfig c = tiny();
  c.gating = Gating::sigmoid;
  c.n_kv_heads = 4;
  c.tied_embeddings = false;
  c.aux_loss_alpha = 0.1f;
  grad_check(c);
}
