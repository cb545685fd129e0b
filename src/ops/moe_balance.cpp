// MoE balance statistics on the stream: DeepSeek-V3's sequence-wise balance
// loss and its backward, and the per-expert load the router-bias update and
// the metrics read after the step. Notation: B sequences of T tokens, N = B*T,
// E experts, k selections per token.
#include <algorithm>
#include <cmath>
#include <vector>

#include "coremesh/ops/moe_routing.hpp"
#include "detail/checks.hpp"
#include "detail/launch.hpp"

namespace coremesh::ops {
namespace {

constexpr auto kVector = detail::KernelKind::vector;

struct BalanceShape {
  int64_t B, T, E, k;
};

BalanceShape check_balance_args(const Tensor& scores, const Tensor& selected, int64_t B) {
  detail::check_contiguous(scores, "scores");
  detail::check_dtype(scores, DType::f32, "scores");
  detail::check_contiguous(selected, "selected");
  detail::check_dtype(selected, DType::i32, "selected");
  CM_CHECK(scores.dim() == 2 && selected.dim() == 2 && scores.size(0) == selected.size(0),
           "pass scores (N,E) and selected (N,k) over the same tokens",
           "scores {} and selected {} do not match", scores.describe(), selected.describe());
  const int64_t N = scores.size(0);
  CM_CHECK(B > 0 && N % B == 0, "pass the number of sequences the N tokens hold",
           "{} tokens do not split into {} sequences", N, B);
  return {B, N / B, scores.size(1), selected.size(1)};
}

// f_e = E/(k T) * selections of e in sequence b (double).
void sequence_load(const int32_t* sel, const BalanceShape& s, int64_t b, std::vector<double>& f) {
  f.assign(static_cast<size_t>(s.E), 0.0);
  const double unit = double(s.E) / double(s.k * s.T);
  for (int64_t i = b * s.T * s.k; i < (b + 1) * s.T * s.k; ++i) {
    const int32_t e = sel[i];
    CM_CHECK(e >= 0 && e < s.E, "selected experts must be in [0, E)", "expert id {} for E={}", e, s.E);
    f[static_cast<size_t>(e)] += unit;
  }
}

}  // namespace

Tensor sequence_balance_loss(const Tensor& scores, const Tensor& selected, int64_t B, float alpha) {
  const BalanceShape s = check_balance_args(scores, selected, B);
  Tensor loss = Tensor::empty({1});
  detail::Plan plan = detail::plan("sequence_balance_loss", kVector, {scores.shape(), selected.shape()},
                                   {DType::f32, DType::i32}, fmt::format("B={}", B),
                                   [](int) { return detail::Tiling{}; });  // one block: N*E work
  detail::launch(std::move(plan), {{scores, selected}, {loss}}, [scores, selected, loss, s, alpha](const detail::BlockContext&) {
    const float* p = scores.data<float>();
    std::vector<double> f, P;
    double total = 0;
    for (int64_t b = 0; b < s.B; ++b) {
      sequence_load(selected.data<int32_t>(), s, b, f);
      P.assign(static_cast<size_t>(s.E), 0.0);
      for (int64_t n = b * s.T; n < (b + 1) * s.T; ++n) {
        double sum = 0;
        for (int64_t e = 0; e < s.E; ++e) sum += p[n * s.E + e];
        for (int64_t e = 0; e < s.E; ++e) P[size_t(e)] += p[n * s.E + e] / sum / double(s.T);
      }
      for (int64_t e = 0; e < s.E; ++e) total += double(alpha) * f[size_t(e)] * P[size_t(e)] / double(s.B);
    }
    loss.data<float>()[0] = static_cast<float>(total);
  });
  return loss;
}

// loss_b = c sum_e f_e P_e with P_e = 1/T sum_t pn_te, pn_t = p_t / sum_j p_tj, c = alpha/B:
//   dpn_te = scale c f_e / T;   pn = p / sum  =>  dp_te = (dpn_te - sum_j dpn_tj pn_tj) / sum_t
Tensor sequence_balance_loss_backward(const Tensor& scores, const Tensor& selected, int64_t B,
                                      float alpha, float scale) {
  const BalanceShape s = check_balance_args(scores, selected, B);
  Tensor dp = Tensor::empty(scores.shape());
  detail::launch_rows("sequence_balance_loss_backward", kVector, {scores.shape(), selected.shape()},
                      {DType::f32, DType::i32}, fmt::format("B={}", B), {{scores, selected}, {dp}}, s.B, s.T * s.E,
                      [scores, selected, dp, s, alpha, scale](int64_t b0, int64_t b1) {
                        const float* p = scores.data<float>();
                        float* out = dp.data<float>();
                        std::vector<double> f, dpn(static_cast<size_t>(s.E));
                        for (int64_t b = b0; b < b1; ++b) {
                          sequence_load(selected.data<int32_t>(), s, b, f);
                          for (int64_t n = b * s.T; n < (b + 1) * s.T; ++n) {
                            double sum = 0, dot = 0;
                            for (int64_t e = 0; e < s.E; ++e) sum += p[n * s.E + e];
                            for (int64_t e = 0; e < s.E; ++e) {
                              dpn[size_t(e)] = double(scale * alpha) * f[size_t(e)] / double(s.T * s.B);  // (scale alpha) in f32, as the model always did
                              dot += dpn[size_t(e)] * p[n * s.E + e] / sum;
                            }
                            for (int64_t e = 0; e < s.E; ++e)
                              out[n * s.E + e] = static_cast<float>((dpn[size_t(e)] - dot) / sum);
                          }
                        }
                      });
  return dp;
}

double margin_bin_edge(int bin) {
  CM_CHECK(bin >= 0 && bin < kMarginBins, "margin bins are 0..kMarginBins-1", "bin {}", bin);
  return bin == 0 ? 0.0 : 1e-6 * std::exp2(double(bin - 1) / 2);
}

void accumulate_selection_margins(const Tensor& scores, const Tensor& bias, const Tensor& selected,
                                  const Tensor& margins) {
  check_balance_args(scores, selected, 1);
  const int64_t T = scores.size(0), E = scores.size(1), k = selected.size(1);
  if (bias.defined()) {
    detail::check_shape(bias, {E}, "bias");
    detail::check_dtype(bias, DType::f32, "bias");
  }
  detail::check_contiguous(margins, "margins");
  detail::check_dtype(margins, DType::i64, "margins");
  detail::check_shape(margins, {E, 2, kMarginBins}, "margins");
  std::vector<Tensor> inputs{scores, selected, margins};
  if (bias.defined()) inputs.push_back(bias);
  detail::Plan plan = detail::plan("accumulate_selection_margins", kVector, {scores.shape()}, {DType::f32},
                                   fmt::format("k={};bias={}", k, bias.defined()), [](int) { return detail::Tiling{}; });
  detail::launch(std::move(plan), {inputs, {margins}}, [scores, bias, selected, margins, T, E, k](const detail::BlockContext&) {
    std::vector<double> edges(kMarginBins);
    for (int b = 0; b < kMarginBins; ++b) edges[size_t(b)] = margin_bin_edge(b);
    std::vector<float> a(static_cast<size_t>(E));
    std::vector<char> in(static_cast<size_t>(E));
    int64_t* hist = margins.data<int64_t>();
    for (int64_t t = 0; t < T; ++t) {
      const float* s = scores.data<float>() + t * E;
      for (int64_t e = 0; e < E; ++e) a[e] = s[e] + (bias.defined() ? bias.data<float>()[e] : 0.0f), in[e] = 0;
      float lowest_in = INFINITY, highest_out = -INFINITY;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = selected.data<int32_t>()[t * k + j];
        CM_CHECK(e >= 0 && e < E, "selected experts must be in [0, E)", "expert id {} for E={}", e, E);
        in[e] = 1, lowest_in = std::min(lowest_in, a[e]);
      }
      for (int64_t e = 0; e < E; ++e)
        if (!in[e]) highest_out = std::max(highest_out, a[e]);
      for (int64_t e = 0; e < E; ++e) {
        const double d = in[e] ? double(a[e] - highest_out) : double(lowest_in - a[e]);
        const int bin = int(std::upper_bound(edges.begin(), edges.end(), d) - edges.begin()) - 1;
        ++hist[(e * 2 + (in[e] ? 0 : 1)) * kMarginBins + std::max(bin, 0)];
      }
    }
  });
}

void accumulate_expert_load(const Tensor& selected, const Tensor& kept, const Tensor& load) {
  for (const Tensor* t : {&selected, &kept}) {
    detail::check_contiguous(*t, "selected/kept");
    detail::check_dtype(*t, DType::i32, "selected/kept");
  }
  detail::check_shape(kept, selected.shape(), "kept");
  detail::check_contiguous(load, "load");
  detail::check_dtype(load, DType::i64, "load");
  CM_CHECK(load.dim() == 1 && load.size(0) >= 1, "pass load as an (E+1) i64 tensor",
           "load is {}", load.describe());
  const int64_t E = load.size(0) - 1;
  detail::Plan plan = detail::plan("accumulate_expert_load", kVector, {selected.shape()}, {DType::i32},
                                   fmt::format("E={}", E), [](int) { return detail::Tiling{}; });
  detail::launch(std::move(plan), {{selected, kept, load}, {load}}, [selected, kept, load, E](const detail::BlockContext&) {
    const int32_t* sel = selected.data<int32_t>();
    const int32_t* kp = kept.data<int32_t>();
    int64_t* out = load.data<int64_t>();
    for (int64_t i = 0; i < selected.numel(); ++i) {
      CM_CHECK(sel[i] >= 0 && sel[i] < E, "selected experts must be in [0, E)", "expert id {} for E={}",
               sel[i], E);
      ++out[sel[i]];
      out[E] += kp[i] < 0;
    }
  });
}

}  // namespace coremesh::ops
