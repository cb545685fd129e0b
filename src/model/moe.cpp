#include "moe.hpp"

#include "coremesh/ops/activation.hpp"
#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/moe_routing.hpp"

namespace coremesh::model::detail {
namespace {

ops::ScoreFunc score_func(const ModelConfig& cfg) {
  return cfg.gating == Gating::softmax ? ops::ScoreFunc::softmax : ops::ScoreFunc::sigmoid;
}

ops::TopKConfig topk_config(const ModelConfig& cfg) {
  ops::TopKConfig t;
  t.k = cfg.top_k;
  t.n_groups = cfg.n_groups;
  t.topk_groups = cfg.topk_groups;
  t.renorm = cfg.gating == Gating::sigmoid;  // sigmoid gates are renormalized over the k
  return t;
}

// Grouped SwiGLU experts on permuted rows: y (R,C) from x (R,C) and offsets (E+1).
// Each expert's gate and up weights are one (2F,C) matrix [w1_e; w3_e], so the
// gate/up product is one grouped GEMM and silu(a1) * a3 one fused swiglu.
Tensor experts_forward(MoeActs& a) {
  a.gu = grouped_linear(a.xp, a.w13, a.offsets);             // [a1 | a3] (R,2F)
  a.g = gemm_input(ops::swiglu(a.gu), a.xp.precision);       // silu(a1) * a3 (R,F)
  return grouped_linear(a.g, a.w2, a.offsets);               // (R,C)
}

// Weight gradients go into the arena inside the grouped GEMMs.
Tensor experts_backward(const Tensor& dy, const MoeParams& g, float dw_beta, const MoeActs& a) {
  const Tensor dg = grouped_linear_backward(dy, a.g, a.w2, a.offsets, g.w2, dw_beta);
  const Tensor dgu = ops::swiglu_backward(dg, a.gu);
  return grouped_linear_backward(dgu, a.xp, a.w13, a.offsets, g.w13, dw_beta);
}

}  // namespace

Tensor moe_forward(const Tensor& x, const MoeParams& w, const Tensor& bias, const ModelConfig& cfg,
                   int64_t B, int64_t T, MoeActs& a) {
  const int64_t N = B * T, E = cfg.n_routed_experts;
  // --- routing: s = x R^T (N,E) -> p -> top-k with bias (selection only)
  a.scores = ops::router_scores(linear(x, w.router), score_func(cfg));
  const ops::Routing sel = ops::topk_route(a.scores, bias, topk_config(cfg));
  a.sel_idx = sel.indices, a.sel_w = sel.weights;
  a.counts = ops::expert_counts(sel.indices, E);
  // --- capacity: per expert keep `cap` assignments (token order or highest weight)
  ops::Routing kept = sel;
  const int64_t cap = cfg.expert_capacity(N);
  if (cap >= 0)
    kept = ops::apply_capacity(sel, E, cap,
                               cfg.drop_policy == DropPolicy::low_score ? ops::DropPolicy::probability
                                                                        : ops::DropPolicy::position);
  a.idx = kept.indices, a.w = kept.weights;
  // --- permute rows by expert, grouped-GEMM experts, weighted combine
  const ops::Permutation perm = ops::permute(x, a.idx, E);  // xp (N*K, C)
  a.xp = gemm_input(perm.x, cfg.precision), a.offsets = perm.offsets, a.row_of = perm.row_of;
  a.w13 = gemm_weight(w.w13, cfg.precision), a.w2 = gemm_weight(w.w2, cfg.precision);
  a.ye = experts_forward(a);
  Tensor y = ops::unpermute(a.ye, a.row_of, a.w);  // (N,C) = sum_k w_k ye[row(n,k)]
  // --- shared experts: y += SwiGLU_shared(x); their input is cast again in the
  // backward rather than kept next to the f32 x
  if (w.sw13.defined())
    y = ops::add(y, mlp_forward(gemm_input(x, cfg.precision), w.sw13, w.sw2, a.shared));
  return y;
}

// The sequence-wise balance loss stays a small private host piece: the
// library's switch_aux_loss is batch-wise over unnormalized scores, while the
// model (DeepSeek-V3) normalizes p per token and averages per sequence:
//   aux = alpha/B sum_b sum_i f_i P_i,  f_i = E/(K T) #sel_i in b,  P_i = mean_t p_ti / sum_e p_te
void moe_finish_forward(const ModelConfig& cfg, int64_t B, int64_t T, MoeActs& a) {
  const int64_t E = cfg.n_routed_experts, K = cfg.top_k;
  a.host_counts.assign(size_t(E), 0.0);
  for (int64_t e = 0; e < E; ++e) a.host_counts[size_t(e)] = double(a.counts.data<int64_t>()[e]);
  a.dropped = 0;
  const int32_t* idx = a.idx.data<int32_t>();
  for (int64_t i = 0; i < a.idx.numel(); ++i) a.dropped += idx[i] < 0;
  a.aux = 0;
  if (cfg.aux_loss_alpha <= 0) return;
  const int32_t* sel = a.sel_idx.data<int32_t>();
  const float* p = a.scores.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> f(size_t(E), 0.0), P(size_t(E), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t n = b * T + t;
      for (int64_t k = 0; k < K; ++k) f[size_t(sel[n * K + k])] += double(E) / double(K * T);
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += p[n * E + e];
      for (int64_t e = 0; e < E; ++e) P[size_t(e)] += p[n * E + e] / sum / double(T);
    }
    for (int64_t e = 0; e < E; ++e) a.aux += cfg.aux_loss_alpha * f[size_t(e)] * P[size_t(e)] / double(B);
  }
}

namespace {
// d(aux_scale * aux)/dp (N,E) on the host from the forward's (synchronized) data.
Tensor aux_loss_backward(const ModelConfig& cfg, int64_t B, int64_t T, const MoeActs& a,
                         float aux_scale) {
  const int64_t E = cfg.n_routed_experts, K = cfg.top_k, N = B * T;
  Tensor dp = Tensor::zeros({N, E});
  float* out = dp.data<float>();
  const int32_t* sel = a.sel_idx.data<int32_t>();
  const float* p = a.scores.data<float>();
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> f(size_t(E), 0.0), dpn(static_cast<size_t>(E));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) f[size_t(sel[(b * T + t) * K + k])] += double(E) / double(K * T);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t n = b * T + t;
      double sum = 0, dot = 0;
      for (int64_t e = 0; e < E; ++e) sum += p[n * E + e];
      for (int64_t e = 0; e < E; ++e) {
        dpn[size_t(e)] = aux_scale * cfg.aux_loss_alpha * f[size_t(e)] / double(T * B);
        dot += dpn[size_t(e)] * p[n * E + e] / sum;
      }
      // pn = p / sum p  =>  dp_e = (dpn_e - sum_j dpn_j pn_j) / sum
      for (int64_t e = 0; e < E; ++e) out[n * E + e] = float((dpn[size_t(e)] - dot) / sum);
    }
  }
  return dp;
}
}  // namespace

Tensor moe_backward(const Tensor& dy, const Tensor& x, const MoeParams& w, const MoeParams& g,
                    float dw_beta, const ModelConfig& cfg, int64_t B, int64_t T,
                    const MoeActs& a, float aux_scale) {
  // --- shared experts
  Tensor dx;
  if (w.sw13.defined())
    dx = mlp_backward(dy, gemm_input(x, cfg.precision), a.shared, g.sw13, g.sw2, dw_beta);
  // --- combine: y_n += w_k ye_r  =>  dye_r = w_k dy_n,  dw_k = dy_n . ye_r
  const ops::UnpermuteGrads ug = ops::unpermute_backward(dy, a.ye, a.row_of, a.w);
  // --- experts, then xp_r = x_n  =>  dx_n += dxp_r
  const Tensor dxp = experts_backward(ug.dyp, g, dw_beta, a);
  const Tensor dx_routed = ops::permute_backward(dxp, a.row_of);
  dx = dx.defined() ? ops::add(dx, dx_routed) : dx_routed;
  // --- gate weights -> affinities (through the pre-capacity selection: the
  // sigmoid renormalization also sees dropped experts) (+ balance loss)
  const ops::Routing sel{a.sel_idx, a.sel_w};
  Tensor dscores = ops::topk_route_backward(ug.dweights, a.scores, sel, topk_config(cfg));
  if (cfg.aux_loss_alpha > 0) dscores = ops::add(dscores, aux_loss_backward(cfg, B, T, a, aux_scale));
  // --- affinities -> router logits;  s = x R^T  =>  dx += ds R,  dR += ds^T x
  const Tensor ds = ops::router_scores_backward(dscores, a.scores, score_func(cfg));
  return linear_backward(ds, x, w.router, g.router, dw_beta, &dx);
}

}  // namespace coremesh::model::detail
