// MoE routing vs the references; group-limited selection; capacity drops;
// permute -> grouped GEMM -> combine without a host synchronization, checked
// against a per-token dense computation; gradients by finite differences.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "coremesh/ops/activation.hpp"
#include "coremesh/ops/quant.hpp"
#include "coremesh/ops/grouped_gemm.hpp"
#include "coremesh/ops/moe_routing.hpp"
#include "harness.hpp"

namespace coremesh::ops {
namespace {

using namespace testing;

TEST(OpsMoE, ScoresForwardBackward) {
  Tensor logits = randn({21, 10}, 1), ds = randn({21, 10}, 2);
  for (ScoreFunc f : {ScoreFunc::softmax, ScoreFunc::sigmoid}) {
    Tensor s, g;
    run_on_stream([&] {
      s = router_scores(logits, f);
      g = router_scores_backward(ds, s, f);
    });
    if (f == ScoreFunc::softmax) EXPECT_NMSE(s, reference::softmax(logits), 1e-12);
    else EXPECT_NEAR(s.item({3, 4}), 1.0 / (1.0 + std::exp(-logits.item({3, 4}))), 1e-6);
    EXPECT_LT(grad_check(logits, g, [&] {
                Tensor y;
                run_on_stream([&] { y = router_scores(logits, f); });
                return dot(y, ds);
              }), 1e-2);
  }
}

TEST(OpsMoE, TopKPlainGroupLimitedAndBiased) {
  const int64_t T = 37, E = 16;
  Tensor scores = uniform({T, E}, 3, 0.0f, 1.0f), bias = randn({E}, 4, 0.1f);
  const TopKConfig configs[] = {{2, 1, 1, false, 1.0f}, {4, 4, 2, true, 2.5f}, {3, 8, 3, true, 1.0f}};
  for (const TopKConfig& cfg : configs) {
    SCOPED_TRACE(::testing::Message() << "k=" << cfg.k << " groups=" << cfg.n_groups);
    for (const Tensor& b : {Tensor(), bias}) {
      Routing ref = reference::topk_route(scores, b, cfg);
      for_each_limit([&](const LimitCase&) {
        Routing r = topk_route(scores, b, cfg);
        test_stream().synchronize();
        EXPECT_TRUE(bitwise_equal(r.indices, ref.indices));
        EXPECT_NMSE(r.weights, ref.weights, 1e-12);
      });
      for (int64_t t = 0; t < T; ++t) {  // at most topk_groups distinct groups per token
        std::set<int> groups;
        for (int j = 0; j < cfg.k; ++j) groups.insert(ref.indices.data<int32_t>()[t * cfg.k + j] / (E / cfg.n_groups));
        EXPECT_LE(static_cast<int>(groups.size()), cfg.topk_groups);
      }
    }
  }
  // Bias changes the selection but not the weights' source: weights are unbiased scores.
  Tensor huge = Tensor::zeros({E});
  huge.data<float>()[7] = 100.0f;
  Routing r = reference::topk_route(scores, huge, {1, 1, 1, false, 1.0f});
  EXPECT_EQ(r.indices.data<int32_t>()[0], 7);
  EXPECT_EQ(r.weights.item({0, 0}), scores.item({0, 7}));
}

TEST(OpsMoE, TopKBackward) {
  Tensor scores = uniform({6, 8}, 5, 0.1f, 1.0f), dw = randn({6, 3}, 6);
  for (bool renorm : {false, true}) {
    TopKConfig cfg{3, 2, 1, renorm, 1.5f};
    Tensor g;
    Routing r;
    run_on_stream([&] {
      r = topk_route(scores, {}, cfg);
      g = topk_route_backward(dw, scores, r, cfg);
    });
    EXPECT_LT(grad_check(scores, g, [&] {
                Routing rr;
                run_on_stream([&] { rr = topk_route(scores, {}, cfg); });
                EXPECT_TRUE(bitwise_equal(rr.indices, r.indices)) << "selection moved under FD";
                return dot(rr.weights, dw);
              }, 1e-3f, 48), 1e-2);
  }
}

TEST(OpsMoE, CountsBiasUpdateAndAuxLoss) {
  const int64_t T = 50, E = 6;
  Tensor scores = reference::softmax(randn({T, E}, 7));
  Routing r = reference::topk_route(scores, {}, {2, 1, 1, false, 1.0f});
  r.indices.data<int32_t>()[3] = -1;  // a dropped assignment is not counted
  std::vector<int64_t> want(E, 0);
  for (int64_t i = 0; i < T * 2; ++i)
    if (r.indices.data<int32_t>()[i] >= 0) ++want[r.indices.data<int32_t>()[i]];
  AuxLoss ref = reference::switch_aux_loss(scores, r.indices, E, 0.01f);
  for_each_limit([&](const LimitCase&) {
    Tensor counts = expert_counts(r.indices, E);
    Tensor bias = Tensor::zeros({E});
    update_expert_bias(bias, counts, 0.001f);
    Tensor proportional = Tensor::zeros({E});
    update_expert_bias(proportional, counts, 0.01f, BiasUpdate::proportional);
    AuxLoss aux = switch_aux_loss(scores, r.indices, E, 0.01f);
    test_stream().synchronize();
    double mean = 0;
    for (int64_t e = 0; e < E; ++e) {
      EXPECT_EQ(counts.data<int64_t>()[e], want[e]);
      mean += want[e] / double(E);
    }
    for (int64_t e = 0; e < E; ++e) {
      EXPECT_EQ(bias.item({e}), want[e] < mean ? 0.001f : (want[e] > mean ? -0.001f : 0.0f));
      // proportional: the step is the relative error, so twice the miss moves twice as far
      EXPECT_NEAR(proportional.item({e}), 0.01 * (mean - want[e]) / mean, 1e-8);
    }
    EXPECT_NMSE(aux.loss, ref.loss, 1e-12);
    EXPECT_NMSE(aux.dscores, ref.dscores, 1e-12);
  });
  AuxLoss aux;
  run_on_stream([&] { aux = switch_aux_loss(scores, r.indices, E, 0.01f); });
  Tensor ones = Tensor::full({1}, 1.0f);
  EXPECT_LT(grad_check(scores, aux.dscores, [&] {
              AuxLoss a;
              run_on_stream([&] { a = switch_aux_loss(scores, r.indices, E, 0.01f); });
              return dot(a.loss, ones);
            }), 1e-2);
}

// DeepSeek-V3's sequence-wise balance loss (per sequence, affinities
// normalized per token) against the formula, its gradient by finite
// differences, and the load statistics kept on the stream.
TEST(OpsMoE, SequenceBalanceLossAndLoad) {
  const int64_t B = 3, T = 17, E = 6, k = 2;
  Tensor scores = uniform({B * T, E}, 21, 0.05f, 1.0f);  // sigmoid-like, not normalized
  Routing r = reference::topk_route(scores, {}, {int(k), 1, 1, false, 1.0f});
  Routing kept = reference::apply_capacity(r, E, 9, DropPolicy::position);
  const Tensor ref = reference::sequence_balance_loss(scores, r.indices, B, 0.03f);
  const Tensor ref_d = reference::sequence_balance_loss_backward(scores, r.indices, B, 0.03f, 0.5f);
  std::vector<int64_t> want(E + 1, 0);
  for (int64_t i = 0; i < B * T * k; ++i) {
    ++want[size_t(r.indices.data<int32_t>()[i])];
    want[E] += kept.indices.data<int32_t>()[i] < 0;
  }
  EXPECT_GT(want[E], 0) << "the capacity should drop some assignments";
  for_each_limit([&](const LimitCase&) {
    Tensor loss = sequence_balance_loss(scores, r.indices, B, 0.03f);
    Tensor d = sequence_balance_loss_backward(scores, r.indices, B, 0.03f, 0.5f);
    Tensor load = Tensor::zeros({E + 1}, DType::i64);
    accumulate_expert_load(r.indices, kept.indices, load);
    accumulate_expert_load(r.indices, kept.indices, load);  // adds: two micro-batches
    test_stream().synchronize();
    EXPECT_NMSE(loss, ref, 1e-12);
    EXPECT_NMSE(d, ref_d, 1e-12);
    for (int64_t e = 0; e <= E; ++e) EXPECT_EQ(load.data<int64_t>()[e], 2 * want[size_t(e)]) << e;
  });
  Tensor d;
  run_on_stream([&] { d = sequence_balance_loss_backward(scores, r.indices, B, 0.03f, 1.0f); });
  EXPECT_LT(grad_check(scores, d, [&] {
              Tensor l;
              run_on_stream([&] { l = sequence_balance_loss(scores, r.indices, B, 0.03f); });
              return double(l.item({0}));
            }, 1e-3f), 1e-2);
  EXPECT_THROW(sequence_balance_loss(scores, r.indices, 4, 0.03f), InvalidArgument);  // 51 % 4
}

// Selection margins against their definition: moving an expert's bias a
// little past its distance flips the token's choice, a little short of it
// does not; binned as margin_bin_edge says, added per micro-batch. Then the
// margin bias step: one step at rate 1 balances a skewed young router (sigmoid
// scores close together), each expert's shift within a bin of the exact one.
TEST(OpsMoE, SelectionMarginsAndTheMarginBiasStep) {
  const int64_t T = 600, E = 8, k = 2, NB = kMarginBins;
  const Tensor scores = uniform({T, E}, 31, 0.45f, 0.55f);
  Tensor bias = Tensor::zeros({E});
  for (int64_t e = 0; e < E; ++e) bias.data<float>()[e] = 0.004f * float(E / 2 - e);  // expert 0 hot
  const TopKConfig cfg{int(k), 1, 1, false, 1.0f};
  const Routing r = reference::topk_route(scores, bias, cfg);
  auto selects = [&](const Routing& route, int64_t t, int64_t e) {
    for (int64_t j = 0; j < k; ++j)
      if (route.indices.data<int32_t>()[t * k + j] == e) return true;
    return false;
  };
  auto bin_of = [&](double d) {
    int b = 0;
    while (b + 1 < NB && margin_bin_edge(b + 1) <= d) ++b;
    return b;
  };
  std::vector<int64_t> want(size_t(E * 2 * NB), 0), counts(E, 0);
  std::vector<std::vector<double>> enter(E), leave(E);  // per expert, the distances by side
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> a(E);
    double lowest_in = 1e30, highest_out = -1e30;
    for (int64_t e = 0; e < E; ++e) {
      a[e] = double(scores.item({t, e}) + bias.item({e}));
      if (selects(r, t, e)) lowest_in = std::min(lowest_in, a[e]), ++counts[e];
      else highest_out = std::max(highest_out, a[e]);
    }
    for (int64_t e = 0; e < E; ++e) {
      const bool in = selects(r, t, e);
      const double d = in ? a[e] - highest_out : lowest_in - a[e];
      (in ? leave : enter)[e].push_back(d);
      ++want[size_t((e * 2 + (in ? 0 : 1)) * NB + bin_of(d))];
      if (t >= 40) continue;
      for (double f : {0.99, 1.01}) {  // the definition, on this token alone
        Tensor moved = bias.clone();
        moved.data<float>()[e] += float((in ? -1 : 1) * (d * f + (f > 1 ? 1e-6 : -1e-6)));
        const Routing one = reference::topk_route(scores.slice(0, t, t + 1).clone(), moved, cfg);
        EXPECT_EQ(selects(one, 0, e), f > 1 ? !in : in) << "token " << t << " expert " << e << " distance " << d;
      }
    }
  }
  for (int64_t e = 1; e < E; ++e) ASSERT_GT(counts[0], counts[e]);
  const double mean = double(T * k) / double(E);
  ASSERT_GT(double(counts[0]) / mean, 1.5) << "the skew this test balances";
  for_each_limit([&](const LimitCase&) {
    Tensor margins = Tensor::zeros({E, 2, NB}, DType::i64);
    accumulate_selection_margins(scores, bias, r.indices, margins);
    accumulate_selection_margins(scores, bias, r.indices, margins);  // adds: two micro-batches
    Tensor once = Tensor::zeros({E, 2, NB}, DType::i64);
    accumulate_selection_margins(scores, bias, r.indices, once);
    Tensor stepped = bias.clone();
    update_expert_bias(stepped, expert_counts(r.indices, E), 1.0f, BiasUpdate::margin, once);
    test_stream().synchronize();
    for (int64_t i = 0; i < E * 2 * NB; ++i) ASSERT_EQ(margins.data<int64_t>()[i], 2 * want[size_t(i)]) << i;
    const Routing after = reference::topk_route(scores, stepped, cfg);
    std::vector<int64_t> now(E, 0);
    for (int64_t i = 0; i < T * k; ++i) ++now[size_t(after.indices.data<int32_t>()[i])];
    EXPECT_LT(double(*std::max_element(now.begin(), now.end())) / mean, 1.15);
    for (int64_t e = 0; e < E; ++e) {  // alone, e needs its |mean - count|-th nearest token across the edge
      std::vector<double>& side = double(counts[e]) < mean ? enter[e] : leave[e];
      std::sort(side.begin(), side.end());
      const double need = std::abs(mean - double(counts[e]));
      const double exact = need == 0 ? 0.0 : side[size_t(std::ceil(need)) - 1];
      const double shift = double(stepped.item({e}) - bias.item({e}));
      EXPECT_NEAR(std::abs(shift), exact, exact * (std::sqrt(2.0) - 1) + 1e-6) << "expert " << e;
      EXPECT_EQ(shift > 0, double(counts[e]) < mean) << "expert " << e;
    }
  });
  EXPECT_THROW(update_expert_bias(bias, expert_counts(r.indices, E), 0.5f, BiasUpdate::margin), InvalidArgument);
}

TEST(OpsMoE, CapacityDropPolicies) {
  const int64_t T = 40, E = 4;
  Tensor scores = reference::softmax(randn({T, E}, 8, 2.0f));
  Routing r = reference::topk_route(scores, {}, {2, 1, 1, false, 1.0f});
  const int64_t cap = expert_capacity(T, 2, E, 0.75f);
  EXPECT_EQ(cap, 15);
  for (DropPolicy policy : {DropPolicy::position, DropPolicy::probability}) {
    Routing ref = reference::apply_capacity(r, E, cap, policy);
    for_each_limit([&](const LimitCase&) {
      Routing c = apply_capacity(r, E, cap, policy);
      Tensor counts = expert_counts(c.indices, E);
      test_stream().synchronize();
      EXPECT_TRUE(bitwise_equal(c.indices, ref.indices));
      EXPECT_TRUE(bitwise_equal(c.weights, ref.weights));
      for (int64_t e = 0; e < E; ++e) EXPECT_LE(counts.data<int64_t>()[e], cap);
    });
  }
}

TEST(OpsMoE, PermuteGroupedGemmCombineWithoutHostSync) {
  const int64_t T = 29, E = 5, C = 12, N = 7, k = 2;
  Tensor x = randn({T, C}, 9), w = randn({E, N, C}, 10);
  Tensor scores = reference::softmax(randn({T, E}, 11));
  for_each_limit([&](const LimitCase&) {
    Routing r = topk_route(scores, {}, {k, 1, 1, true, 1.0f});
    Routing kept = apply_capacity(r, E, 10, DropPolicy::probability);  // some drops, maybe empty experts
    Permutation p = permute(x, kept.indices, E);
    Tensor yp = grouped_matmul(p.x, w, p.offsets);  // offsets produced on the stream
    Tensor y = unpermute(yp, p.row_of, kept.weights);
    test_stream().synchronize();
    // Dense per-token reference: y[t] = sum_j w_j x[t] W_{e_j}^T.
    Tensor want = Tensor::zeros({T, N});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int e = kept.indices.data<int32_t>()[t * k + j];
        if (e < 0) continue;
        for (int64_t n = 0; n < N; ++n) {
          double acc = 0;
          for (int64_t c = 0; c < C; ++c) acc += double(x.item({t, c})) * w.item({e, n, c});
          want.data<float>()[t * N + n] += static_cast<float>(kept.weights.item({t, j}) * acc);
        }
      }
    EXPECT_NMSE(y, want, 1e-11);
    // Expert-contiguous and stable.
    const int64_t* off = p.offsets.data<int64_t>();
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int64_t row = p.row_of.data<int64_t>()[t * k + j];
        const int e = kept.indices.data<int32_t>()[t * k + j];
        if (e < 0) {
          EXPECT_EQ(row, -1);
          continue;
        }
        EXPECT_TRUE(row >= off[e] && row < off[e + 1]);
        EXPECT_EQ(p.x.item({row, 3}), x.item({t, 3}));
      }
    for (int64_t row = off[E]; row < T * k; ++row) EXPECT_EQ(p.x.item({row, 0}), 0.0f);
  });
}

TEST(OpsMoE, PermuteAndCombineGradients) {
  const int64_t T = 6, E = 3, C = 4, k = 2;
  Tensor x = randn({T, C}, 12), dy = randn({T, C}, 13);
  Routing r = reference::topk_route(reference::softmax(randn({T, E}, 14)), {}, {k, 1, 1, false, 1.0f});
  r.indices.data<int32_t>()[5] = -1;
  Permutation p;
  run_on_stream([&] { p = permute(x, r.indices, E); });
  Tensor yp = randn({T * k, C}, 15), dxp = randn({T * k, C}, 16);
  Tensor w = r.weights;
  UnpermuteGrads g;
  Tensor dx;
  run_on_stream([&] {
    g = unpermute_backward(dy, yp, p.row_of, w);
    dx = permute_backward(dxp, p.row_of);
  });
  auto combine_loss = [&] {
    Tensor y;
    run_on_stream([&] { y = unpermute(yp, p.row_of, w); });
    return dot(y, dy);
  };
  EXPECT_LT(grad_check(yp, g.dyp, combine_loss), 1e-2);
  EXPECT_LT(grad_check(w, g.dweights, combine_loss), 1e-2);
  EXPECT_LT(grad_check(x, dx, [&] {
              Permutation q;
              run_on_stream([&] { q = permute(x, r.indices, E); });
              return dot(q.x, dxp);
            }), 1e-2);
}

// Routing tensors that do not belong together are refused: sizes at the
// call, ids and rows out of range by the kernel (they used to be read and
// written past the ends of the tensors).
TEST(OpsMoE, MismatchedRoutingTensorsAreRefused) {
  const int64_t T = 4, E = 8, C = 8, k = 2;
  Tensor scores = reference::softmax(randn({T, E}, 40)), x = randn({T, C}, 41);
  Routing r = reference::topk_route(scores, {}, {k, 1, 1, false, 1.0f});
  Permutation p;
  run_on_stream([&] { p = permute(x, r.indices, E); });
  Tensor dw = randn({T, k}, 42), dy = randn({T, C}, 43);
  EXPECT_THROW(topk_route_backward(randn({1, k}, 44), randn({3000, E}, 45), Routing{r.indices.slice(0, 0, 1), dw.slice(0, 0, 1)}, {k, 1, 1, false, 1.0f}),
               InvalidArgument);  // 1 row of indices for 3000 of scores
  EXPECT_THROW(permute_backward(randn({2, C}, 46), p.row_of.to(DType::i32)), InvalidArgument);
  EXPECT_THROW(unpermute_backward(dy, p.x, p.row_of, randn({1}, 47)), InvalidArgument);
  EXPECT_THROW(permute(x, r.indices, -1), InvalidArgument);
  EXPECT_THROW(apply_capacity(r, 0, 1, DropPolicy::position), InvalidArgument);
  runtime::StreamGuard guard(test_stream());
  Tensor bad_ids = r.indices.clone();  // clone: contiguous() of a contiguous tensor shares its storage
  bad_ids.data<int32_t>()[1] = 1000000;
  topk_route_backward(dw, scores, Routing{bad_ids, r.weights}, {k, 1, 1, false, 1.0f});
  EXPECT_THROW(test_stream().synchronize(), Error);
  Tensor bad_rows = p.row_of.clone();
  bad_rows.data<int64_t>()[1] = int64_t{1} << 40;
  permute_backward(p.x, bad_rows);
  EXPECT_THROW(test_stream().synchronize(), Error);
  unpermute(p.x, bad_rows, r.weights);
  EXPECT_THROW(test_stream().synchronize(), Error);
  unpermute_backward(dy, p.x, bad_rows, r.weights);
  EXPECT_THROW(test_stream().synchronize(), Error);
  permute_backward(randn({2, C}, 48), p.row_of);  // rows 2.. of dxp missing
  EXPECT_THROW(test_stream().synchronize(), Error);
}

TEST(OpsMoE, PermuteAndItsGradientBuildInAGivenTensor) {
  const int64_t T = 9, E = 3, C = 5, k = 2;
  Tensor x = randn({T, C}, 17), dy = randn({T, C}, 18), yp = randn({T * k, C}, 19);
  Routing r = reference::topk_route(reference::softmax(randn({T, E}, 20)), {}, {k, 1, 1, false, 1.0f});
  r.indices.data<int32_t>()[3] = -1;  // a dropped slot: its row is zeroed in the given tensor too
  // stale values in the given tensors: every row must be written
  Tensor out = Tensor::full({T * k + 4, C}, 7.0f).slice(0, 2, 2 + T * k), dyp_out = Tensor::full({T * k, C}, -3.0f);
  Permutation fresh, given;
  UnpermuteGrads g_fresh, g_given;
  run_on_stream([&] {
    fresh = permute(x, r.indices, E);
    given = permute(x, r.indices, E, out);
    g_fresh = unpermute_backward(dy, yp, fresh.row_of, r.weights);
    g_given = unpermute_backward(dy, yp, fresh.row_of, r.weights, dyp_out);
  });
  EXPECT_EQ(given.x.data<float>(), out.data<float>());
  EXPECT_TRUE(bitwise_equal(given.x, fresh.x));
  EXPECT_EQ(g_given.dyp.data<float>(), dyp_out.data<float>());
  EXPECT_TRUE(bitwise_equal(g_given.dyp, g_fresh.dyp));
  // the wrong shape, dtype or layout: refused with what to pass
  EXPECT_THROW(permute(x, r.indices, E, Tensor::empty({T * k - 1, C})), InvalidArgument);
  EXPECT_THROW(permute(x, r.indices, E, Tensor::empty({T * k, C}, DType::i64)), InvalidArgument);
  EXPECT_THROW(unpermute_backward(dy, yp, fresh.row_of, r.weights, Tensor::empty({C, T * k}).transpose(0, 1)),
               InvalidArgument);
}

// Token slices: unpermute, permute_backward and unpermute_backward write a
// slice's rows of a larger tensor, bit-identical to the whole-batch result.
TEST(OpsMoE, SlicesWriteTheirRowsOfTheWholeBatch) {
  const int64_t T = 10, E = 4, C = 6, k = 2;
  Tensor x = randn({T, C}, 21), dy = randn({T, C}, 22);
  Routing r = reference::topk_route(reference::softmax(randn({T, E}, 23)), {}, {k, 1, 1, false, 1.0f});
  Tensor y = Tensor::full({T, C}, 9.0f), dx = Tensor::full({T, C}, 9.0f), dw = Tensor::full({T, k}, 9.0f);
  Tensor y_ref, dx_ref, dw_ref;
  run_on_stream([&] {
    const Permutation whole = permute(x, r.indices, E);
    y_ref = unpermute(whole.x, whole.row_of, r.weights);
    const UnpermuteGrads g = unpermute_backward(dy, whole.x, whole.row_of, r.weights);
    dx_ref = permute_backward(g.dyp, whole.row_of), dw_ref = g.dweights;
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 4}, {4, T}}) {  // two slices
      const Permutation p = permute(x.slice(0, b, e), r.indices.slice(0, b, e), E);
      unpermute(p.x, p.row_of, r.weights.slice(0, b, e), y.slice(0, b, e));
      const UnpermuteGrads gs = unpermute_backward(dy.slice(0, b, e), p.x, p.row_of, r.weights.slice(0, b, e), {},
                                                   dw.slice(0, b, e));
      permute_backward(gs.dyp, p.row_of, dx.slice(0, b, e));
    }
  });
  EXPECT_TRUE(bitwise_equal(y, y_ref));
  EXPECT_TRUE(bitwise_equal(dx, dx_ref));
  EXPECT_TRUE(bitwise_equal(dw, dw_ref));
}

// concat_groups against a host loop: group g of the result is group g of
// every part in part order; the tail past the groups is zero; any dtype.
TEST(OpsMoE, ConcatGroupsJoinsGroupByGroup) {
  const int64_t G = 3, W = 5;
  const std::vector<std::vector<int64_t>> lists{{0, 2, 2, 5}, {0, 1, 4, 4}, {0, 0, 0, 3}};
  const std::vector<int64_t> rows{7, 4, 3};  // past each list's end: padding the result must not copy
  for (DType dtype : {DType::f32, DType::bf16}) {
    std::vector<Tensor> parts, offsets;
    for (size_t p = 0; p < lists.size(); ++p) {
      parts.push_back(ops::cast(randn({rows[p], W}, 30 + int(p)), dtype));
      offsets.push_back(Tensor::from_vector(lists[p], {G + 1}));
    }
    runtime::synchronize();  // the casts, read below on the host and by the op on another stream
    GroupedRows joined;
    run_on_stream([&] { joined = concat_groups(parts, offsets); });
    ASSERT_EQ(joined.rows.size(0), 14);
    const size_t row_bytes = size_t(W) * dtype_size(dtype);
    std::vector<std::byte> want(size_t(14) * row_bytes, std::byte{0});
    std::vector<int64_t> want_offsets{0};
    size_t at = 0;
    for (int64_t g = 0; g < G; ++g) {
      for (size_t p = 0; p < parts.size(); ++p)
        for (int64_t i = lists[p][size_t(g)]; i < lists[p][size_t(g) + 1]; ++i, ++at)
          std::memcpy(want.data() + at * row_bytes, static_cast<const std::byte*>(parts[p].raw_data()) + size_t(i) * row_bytes,
                      row_bytes);
      want_offsets.push_back(int64_t(at));
    }
    EXPECT_EQ(0, std::memcmp(joined.rows.raw_data(), want.data(), want.size())) << dtype_name(dtype);
    EXPECT_EQ(std::vector<int64_t>(joined.offsets.data<int64_t>(), joined.offsets.data<int64_t>() + G + 1),
              want_offsets);
  }
  EXPECT_THROW(concat_groups({randn({2, 3}, 1)}, {}), InvalidArgument);
}

}  // namespace
}  // namespace coremesh::ops
