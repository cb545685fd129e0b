#include "moe.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "layers.hpp"

namespace coremesh::model::detail {
namespace {

// Top-k of `v` (n values), highest first, ties to the lower index.
void top_indices(const float* v, int n, int k, int32_t* out) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
  });
  std::copy(order.begin(), order.begin() + k, out);
}

// Routing of one token: p (E) from router logits s, selection with bias and
// groups, top-k, gate weights.
void route_token(const float* s, const ModelConfig& cfg, const float* bias, float* p, int32_t* idx,
                 float* w) {
  const int E = cfg.n_routed_experts, K = cfg.top_k;
  if (cfg.gating == Gating::softmax) {
    float mx = -INFINITY;
    for (int e = 0; e < E; ++e) mx = std::max(mx, s[e]);
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(s[e] - mx));
    for (int e = 0; e < E; ++e) p[e] /= sum;
  } else {
    for (int e = 0; e < E; ++e) p[e] = 1.0f / (1.0f + std::exp(-s[e]));
  }
  std::vector<float> sel(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) sel[size_t(e)] = p[e] + bias[e];
  const int G = cfg.n_groups;
  if (G > 1) {
    // group score = sum of the group's top-2 selection scores; keep topk_groups groups
    const int gs = E / G, top = std::min(2, gs);
    std::vector<float> gscore(static_cast<size_t>(G));
    std::vector<int32_t> t(static_cast<size_t>(top));
    for (int g = 0; g < G; ++g) {
      top_indices(sel.data() + g * gs, gs, top, t.data());
      gscore[size_t(g)] = 0;
      for (int i = 0; i < top; ++i) gscore[size_t(g)] += sel[size_t(g * gs + t[size_t(i)])];
    }
    std::vector<int32_t> kept(static_cast<size_t>(cfg.topk_groups));
    top_indices(gscore.data(), G, cfg.topk_groups, kept.data());
    std::vector<uint8_t> on(static_cast<size_t>(G), 0);
    for (int32_t g : kept) on[size_t(g)] = 1;
    for (int e = 0; e < E; ++e)
      if (!on[size_t(e / gs)]) sel[size_t(e)] = -INFINITY;
  }
  top_indices(sel.data(), E, K, idx);
  float sum = 0;
  for (int k = 0; k < K; ++k) sum += (w[k] = p[idx[k]]);
  if (cfg.gating == Gating::sigmoid)
    for (int k = 0; k < K; ++k) w[k] /= sum;
}

void swiglu_mlp_forward(float* y, float* a1, float* a3, float* g, const float* x, const float* w1,
                        const float* w3, const float* w2, int64_t N, int64_t C, int64_t F,
                        float beta) {
  linear_forward(a1, x, w1, N, C, F);   // a1 = x W1^T   (N,F)
  linear_forward(a3, x, w3, N, C, F);   // a3 = x W3^T   (N,F)
  swiglu_forward(g, a1, a3, N * F);     // g = silu(a1) * a3
  linear_forward(y, g, w2, N, F, C, beta);  // y (+)= g W2^T (N,C)
}

// dx (+)= backward of y = W2(silu(W1 x) * W3 x); dg_scratch, da1, da3: (N,F).
void swiglu_mlp_backward(float* dx, float dx_beta, float* dw1, float* dw3, float* dw2,
                         const float* dy, const float* x, const float* a1, const float* a3,
                         const float* g, const float* w1, const float* w3, const float* w2,
                         int64_t N, int64_t C, int64_t F, float* dg, float* da1, float* da3) {
  linear_backward(dg, dw2, dy, g, w2, N, F, C, 0.0f);  // y = g W2^T
  swiglu_backward(da1, da3, dg, a1, a3, N * F);        // g = silu(a1) * a3
  linear_backward(dx, dw1, da1, x, w1, N, C, F, dx_beta);  // a1 = x W1^T
  linear_backward(dx, dw3, da3, x, w3, N, C, F, 1.0f);     // a3 = x W3^T
}

}  // namespace

void moe_forward(float* y, const float* x, const MoeWeights& w, const ModelConfig& cfg, int64_t B,
                 int64_t T, MoeActs& a) {
  const int64_t N = B * T, C = cfg.d_model, E = cfg.n_routed_experts, K = cfg.top_k,
                F = cfg.expert_hidden, SF = int64_t(cfg.n_shared_experts) * F;
  // --- routing: s = x R^T (N,E), p, top-k, gate weights
  std::vector<float> s(static_cast<size_t>(N * E));
  linear_forward(s.data(), x, w.router, N, C, E);
  a.probs.resize(size_t(N * E));
  a.idx.resize(size_t(N * K));
  a.w.resize(size_t(N * K));
  a.keep.assign(size_t(N * K), 1);
  for (int64_t n = 0; n < N; ++n)
    route_token(s.data() + n * E, cfg, w.bias, a.probs.data() + n * E, a.idx.data() + n * K,
                a.w.data() + n * K);
  a.counts.assign(size_t(E), 0.0);
  for (int32_t e : a.idx) a.counts[size_t(e)] += 1;
  // --- capacity: per expert, keep `cap` assignments (token order or highest weight)
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(E));  // slot ids n*K+k in token order
  for (int64_t i = 0; i < N * K; ++i) slots[size_t(a.idx[size_t(i)])].push_back(i);
  const int64_t cap = cfg.expert_capacity(N);
  a.dropped = 0;
  if (cap >= 0)
    for (auto& list : slots) {
      if (cfg.drop_policy == DropPolicy::low_score)
        std::stable_sort(list.begin(), list.end(),
                         [&](int64_t p, int64_t q) { return a.w[size_t(p)] > a.w[size_t(q)]; });
      for (size_t r = size_t(cap); r < list.size(); ++r) a.keep[size_t(list[r])] = 0, a.dropped++;
      if (int64_t(list.size()) > cap) list.resize(size_t(cap));
      std::sort(list.begin(), list.end());
    }
  // --- permute: rows grouped by expert
  a.offsets.assign(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) a.offsets[size_t(e + 1)] = a.offsets[size_t(e)] + int64_t(slots[size_t(e)].size());
  const int64_t R = a.offsets[size_t(E)];
  a.row_token.resize(size_t(R));
  a.row_slot.resize(size_t(R));
  for (int64_t e = 0, r = 0; e < E; ++e)
    for (int64_t id : slots[size_t(e)]) a.row_token[size_t(r)] = int32_t(id / K), a.row_slot[size_t(r++)] = int32_t(id % K);
  a.xe.resize(size_t(R * C));
  a.a1.resize(size_t(R * F));
  a.a3.resize(size_t(R * F));
  a.g.resize(size_t(R * F));
  a.ye.resize(size_t(R * C));
  for (int64_t r = 0; r < R; ++r)
    std::memcpy(&a.xe[size_t(r * C)], x + a.row_token[size_t(r)] * C, sizeof(float) * size_t(C));
  // --- experts: ye = W2_e(silu(W1_e xe) * W3_e xe) for each expert's rows
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[size_t(e)], M = a.offsets[size_t(e + 1)] - r0;
    if (M == 0) continue;
    swiglu_mlp_forward(&a.ye[size_t(r0 * C)], &a.a1[size_t(r0 * F)], &a.a3[size_t(r0 * F)],
                       &a.g[size_t(r0 * F)], &a.xe[size_t(r0 * C)], w.w1 + e * F * C,
                       w.w3 + e * F * C, w.w2 + e * C * F, M, C, F, 0.0f);
  }
  // --- combine: y = shared(x) + sum_k w_k ye
  if (SF > 0) {
    a.sa1.resize(size_t(N * SF));
    a.sa3.resize(size_t(N * SF));
    a.sg.resize(size_t(N * SF));
    swiglu_mlp_forward(y, a.sa1.data(), a.sa3.data(), a.sg.data(), x, w.sw1, w.sw3, w.sw2, N, C,
                       SF, 0.0f);
  } else {
    std::memset(y, 0, sizeof(float) * size_t(N * C));
  }
  for (int64_t r = 0; r < R; ++r) {
    const int64_t n = a.row_token[size_t(r)];
    const float gate = a.w[size_t(n * K + a.row_slot[size_t(r)])];
    const float* src = &a.ye[size_t(r * C)];
    float* dst = y + n * C;
    for (int64_t c = 0; c < C; ++c) dst[c] += gate * src[c];
  }
  // --- sequence-wise balance loss: alpha * mean_b sum_i f_i P_i
  a.aux = 0;
  if (cfg.aux_loss_alpha > 0) {
    for (int64_t b = 0; b < B; ++b) {
      std::vector<double> f(static_cast<size_t>(E), 0.0), P(static_cast<size_t>(E), 0.0);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t n = b * T + t;
        for (int64_t k = 0; k < K; ++k) f[size_t(a.idx[size_t(n * K + k)])] += double(E) / double(K * T);
        const float* p = &a.probs[size_t(n * E)];
        double sum = 0;
        for (int64_t e = 0; e < E; ++e) sum += p[e];
        for (int64_t e = 0; e < E; ++e) P[size_t(e)] += p[e] / sum / double(T);
      }
      for (int64_t e = 0; e < E; ++e) a.aux += cfg.aux_loss_alpha * f[size_t(e)] * P[size_t(e)] / double(B);
    }
  }
}

void moe_backward(float* dx, const float* dy, const float* x, const MoeWeights& w, MoeGrads& gr,
                  const ModelConfig& cfg, int64_t B, int64_t T, MoeActs& a, float aux_scale) {
  const int64_t N = B * T, C = cfg.d_model, E = cfg.n_routed_experts, K = cfg.top_k,
                F = cfg.expert_hidden, SF = int64_t(cfg.n_shared_experts) * F;
  const int64_t R = a.offsets[size_t(E)];
  const int64_t Fmax = std::max(F, SF);
  std::vector<float> dg(static_cast<size_t>(std::max(R, N) * Fmax)), da1(dg.size()), da3(dg.size());
  // --- shared experts
  if (SF > 0)
    swiglu_mlp_backward(dx, 1.0f, gr.sw1, gr.sw3, gr.sw2, dy, x, a.sa1.data(), a.sa3.data(),
                        a.sg.data(), w.sw1, w.sw3, w.sw2, N, C, SF, dg.data(), da1.data(), da3.data());
  // --- combine: y_n += w_k ye_r  =>  dye_r = w_k dy_n,  dw_k = dy_n . ye_r
  std::vector<float> dye(static_cast<size_t>(R * C)), dw(static_cast<size_t>(N * K), 0.0f), dxe(static_cast<size_t>(R * C));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t n = a.row_token[size_t(r)], slot = n * K + a.row_slot[size_t(r)];
    const float gate = a.w[size_t(slot)];
    float dot = 0;
    for (int64_t c = 0; c < C; ++c) {
      dye[size_t(r * C + c)] = gate * dy[n * C + c];
      dot += dy[n * C + c] * a.ye[size_t(r * C + c)];
    }
    dw[size_t(slot)] = dot;
  }
  // --- experts
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = a.offsets[size_t(e)], M = a.offsets[size_t(e + 1)] - r0;
    if (M == 0) continue;
    swiglu_mlp_backward(&dxe[size_t(r0 * C)], 0.0f, gr.w1 + e * F * C, gr.w3 + e * F * C,
                        gr.w2 + e * C * F, &dye[size_t(r0 * C)], &a.xe[size_t(r0 * C)],
                        &a.a1[size_t(r0 * F)], &a.a3[size_t(r0 * F)], &a.g[size_t(r0 * F)],
                        w.w1 + e * F * C, w.w3 + e * F * C, w.w2 + e * C * F, M, C, F, dg.data(),
                        da1.data(), da3.data());
  }
  // xe_r = x_n  =>  dx_n += dxe_r
  for (int64_t r = 0; r < R; ++r) {
    float* d = dx + a.row_token[size_t(r)] * C;
    const float* s = &dxe[size_t(r * C)];
    for (int64_t c = 0; c < C; ++c) d[c] += s[c];
  }
  // --- gate weights -> affinities p
  std::vector<float> dp(static_cast<size_t>(N * E), 0.0f);
  for (int64_t n = 0; n < N; ++n) {
    const int32_t* idx = &a.idx[size_t(n * K)];
    const float* wk = &a.w[size_t(n * K)];
    const float* dwk = &dw[size_t(n * K)];
    float* dpn = &dp[size_t(n * E)];
    if (cfg.gating == Gating::softmax) {
      for (int64_t k = 0; k < K; ++k) dpn[idx[k]] += dwk[k];  // w_k = p[e_k]
    } else {
      // w_k = p_k / S, S = sum_j p_j  =>  dp_k = (dw_k - sum_j dw_j w_j) / S
      float S = 0, dot = 0;
      for (int64_t k = 0; k < K; ++k) S += a.probs[size_t(n * E + idx[k])], dot += dwk[k] * wk[k];
      for (int64_t k = 0; k < K; ++k) dpn[idx[k]] += (dwk[k] - dot) / S;
    }
  }
  // --- balance loss: aux = alpha/B sum_b sum_i f_i (1/T) sum_t pn_ti, pn = p / sum p
  if (cfg.aux_loss_alpha > 0) {
    for (int64_t b = 0; b < B; ++b) {
      std::vector<double> f(static_cast<size_t>(E), 0.0);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < K; ++k) f[size_t(a.idx[size_t((b * T + t) * K + k)])] += double(E) / double(K * T);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t n = b * T + t;
        const float* p = &a.probs[size_t(n * E)];
        double sum = 0, dot = 0;
        for (int64_t e = 0; e < E; ++e) sum += p[e];
        std::vector<double> dpn(static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) {
          dpn[size_t(e)] = aux_scale * cfg.aux_loss_alpha * f[size_t(e)] / double(T * B);
          dot += dpn[size_t(e)] * p[e] / sum;
        }
        for (int64_t e = 0; e < E; ++e) dp[size_t(n * E + e)] += float((dpn[size_t(e)] - dot) / sum);
      }
    }
  }
  // --- affinities -> router logits: softmax ds = p (dp - sum dp p); sigmoid ds = dp p (1 - p)
  std::vector<float> ds(static_cast<size_t>(N * E));
  for (int64_t n = 0; n < N; ++n) {
    const float* p = &a.probs[size_t(n * E)];
    const float* d = &dp[size_t(n * E)];
    if (cfg.gating == Gating::softmax) {
      float dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += d[e] * p[e];
      for (int64_t e = 0; e < E; ++e) ds[size_t(n * E + e)] = p[e] * (d[e] - dot);
    } else {
      for (int64_t e = 0; e < E; ++e) ds[size_t(n * E + e)] = d[e] * p[e] * (1.0f - p[e]);
    }
  }
  // s = x R^T  =>  dx += ds R,  dR += ds^T x
  linear_backward(dx, gr.router, ds.data(), x, w.router, N, C, E, 1.0f);
}

}  // namespace coremesh::model::detail
