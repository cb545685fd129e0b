// Naive MoE routing references: full sorts, one token / expert at a time.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "coremesh/ops/moe_routing.hpp"

namespace coremesh::ops::reference {

Routing topk_route(const Tensor& scores, const Tensor& bias, const TopKConfig& cfg) {
  const int64_t T = scores.size(0), E = scores.size(1), G = cfg.n_groups, per = E / G;
  Routing r{Tensor::empty({T, cfg.k}, DType::i32), Tensor::empty({T, cfg.k})};
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> sel(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) sel[e] = scores.item({t, e}) + (bias.defined() ? bias.item({e}) : 0.0f);
    std::vector<bool> allowed(static_cast<size_t>(E), true);
    if (G > 1) {
      std::vector<std::pair<double, int64_t>> groups;
      for (int64_t g = 0; g < G; ++g) {
        std::vector<double> v(sel.begin() + g * per, sel.begin() + (g + 1) * per);
        std::sort(v.rbegin(), v.rend());
        groups.push_back({per >= 2 ? v[0] + v[1] : v[0], g});
      }
      std::stable_sort(groups.begin(), groups.end(), [](auto& a, auto& b) { return a.first > b.first; });
      for (int64_t i = cfg.topk_groups; i < G; ++i)
        for (int64_t e = 0; e < per; ++e) allowed[groups[i].second * per + e] = false;
    }
    std::vector<int64_t> ids;
    for (int64_t e = 0; e < E; ++e)
      if (allowed[e]) ids.push_back(e);
    std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return sel[a] > sel[b]; });
    double sum = 0;
    for (int j = 0; j < cfg.k; ++j) sum += scores.item({t, ids[j]});
    for (int j = 0; j < cfg.k; ++j) {
      r.indices.data<int32_t>()[t * cfg.k + j] = static_cast<int32_t>(ids[j]);
      const double w = scores.item({t, ids[j]}) * (cfg.renorm ? 1.0 / sum : 1.0) * cfg.route_scale;
      r.weights.data<float>()[t * cfg.k + j] = static_cast<float>(w);
    }
  }
  return r;
}

Routing apply_capacity(const Routing& routing, int64_t E, int64_t capacity, DropPolicy policy) {
  Routing out{routing.indices.clone(), routing.weights.clone()};
  const int64_t n = routing.indices.numel();
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> slots;
    for (int64_t i = 0; i < n; ++i)
      if (out.indices.data<int32_t>()[i] == e) slots.push_back(i);
    if (policy == DropPolicy::probability)
      std::stable_sort(slots.begin(), slots.end(), [&](int64_t a, int64_t b) {
        return out.weights.data<float>()[a] > out.weights.data<float>()[b];
      });
    for (size_t j = static_cast<size_t>(capacity); j < slots.size(); ++j) {
      out.indices.data<int32_t>()[slots[j]] = -1;
      out.weights.data<float>()[slots[j]] = 0.0f;
    }
  }
  return out;
}

AuxLoss switch_aux_loss(const Tensor& scores, const Tensor& indices, int64_t E, float alpha) {
  const int64_t T = scores.size(0), k = indices.size(1);
  AuxLoss out{Tensor::empty({1}), Tensor::empty({T, E})};
  double loss = 0;
  for (int64_t e = 0; e < E; ++e) {
    double count = 0, P = 0;
    for (int64_t i = 0; i < T * k; ++i) count += indices.data<int32_t>()[i] == e;
    for (int64_t t = 0; t < T; ++t) P += scores.item({t, e});
    const double f = count / double(T * k);
    loss += f * P / double(T);
    for (int64_t t = 0; t < T; ++t) out.dscores.data<float>()[t * E + e] = static_cast<float>(alpha * E * f / T);
  }
  out.loss.data<float>()[0] = static_cast<float>(alpha * E * loss);
  return out;
}

}  // namespace coremesh::ops::reference

namespace coremesh::ops::reference {

// Straight from the formula: per sequence b, f_e and P_e, then the sum.
Tensor sequence_balance_loss(const Tensor& scores, const Tensor& selected, int64_t B, float alpha) {
  const int64_t N = scores.size(0), E = scores.size(1), k = selected.size(1), T = N / B;
  double loss = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t e = 0; e < E; ++e) {
      double count = 0, P = 0;
      for (int64_t t = b * T; t < (b + 1) * T; ++t) {
        for (int64_t j = 0; j < k; ++j) count += selected.data<int32_t>()[t * k + j] == e;
        double sum = 0;
        for (int64_t i = 0; i < E; ++i) sum += scores.item({t, i});
        P += scores.item({t, e}) / sum / double(T);
      }
      loss += alpha / double(B) * (double(E) / double(k * T) * count) * P;
    }
  Tensor out = Tensor::empty({1});
  out.data<float>()[0] = static_cast<float>(loss);
  return out;
}

// d/dp_te of c f_e' p_te' / sum_t over e': c (f_e - sum_e' f_e' pn_te') / (T sum_t).
Tensor sequence_balance_loss_backward(const Tensor& scores, const Tensor& selected, int64_t B,
                                      float alpha, float scale) {
  const int64_t N = scores.size(0), E = scores.size(1), k = selected.size(1), T = N / B;
  Tensor dp = Tensor::empty({N, E});
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> f(static_cast<size_t>(E), 0.0);
    for (int64_t t = b * T; t < (b + 1) * T; ++t)
      for (int64_t j = 0; j < k; ++j) f[size_t(selected.data<int32_t>()[t * k + j])] += double(E) / double(k * T);
    for (int64_t t = b * T; t < (b + 1) * T; ++t) {
      double sum = 0, weighted = 0;
      for (int64_t e = 0; e < E; ++e) sum += scores.item({t, e});
      for (int64_t e = 0; e < E; ++e) weighted += f[size_t(e)] * scores.item({t, e}) / sum;
      for (int64_t e = 0; e < E; ++e)
        dp.data<float>()[t * E + e] =
            static_cast<float>(scale * alpha / double(B * T) * (f[size_t(e)] - weighted) / sum);
    }
  }
  return dp;
}

}  // namespace coremesh::ops::reference
