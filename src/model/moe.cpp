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

using Exchange = parallel::ExpertDispatcher::Exchange;

// Grouped SwiGLU experts on the routed rows: y (R,C) from a.xp and the group
// list, built where combine sends it from. Each expert's gate and up weights
// are one (2F,C) matrix [w1_e; w3_e], so the gate/up product is one grouped
// GEMM and silu(a1) * a3 one fused swiglu.
Tensor experts_forward(MoeActs& a, parallel::ExpertDispatcher& experts, int64_t C) {
  const Tensor& offsets = a.routed.offsets;
  a.gu = grouped_linear(a.xp, a.w13, offsets);               // [a1 | a3] (R,2F)
  a.g = gemm_input(ops::swiglu(a.gu), a.xp.precision);       // silu(a1) * a3 (R,F)
  const int64_t R = a.gu.size(0);
  return grouped_linear(a.g, a.w2, offsets, experts.send_buffer(a.layer, Exchange::combine, R, C));  // (R,C)
}

Tensor experts_backward(const Tensor& dy, const MoeGrads& g, const MoeActs& a, parallel::ExpertDispatcher& experts,
                        WgradSink& sink) {
  const Tensor& offsets = a.routed.offsets;
  const RowSources src{a.routed.sources, a.routed.source_offsets};
  const Tensor dg = grouped_linear_backward(dy, a.g, a.w2, offsets, g.w2, sink, src);
  const Tensor dgu = ops::swiglu_backward(dg, a.gu);
  const Tensor dx_out = experts.send_buffer(a.layer, Exchange::dispatch_backward, dy.size(0), dy.size(1));
  return grouped_linear_backward(dgu, a.xp, a.w13, offsets, g.w13, sink, src, dx_out);
}

}  // namespace

Tensor moe_forward(const Tensor& x_in, const MoeParams& w, const Tensor& bias, const ModelConfig& cfg,
                   int64_t B, int layer, parallel::ExpertDispatcher& experts, parallel::TensorParallel& tp,
                   const Tensor& load, MoeActs& a) {
  // The router, the experts and the shared experts are one tensor-parallel
  // region: under sequence parallelism it gathers the tokens first, so the
  // router sees every token of the micro-batch as on one PE.
  a.x = tp.enter(x_in);
  const Tensor& x = a.x;
  const int64_t N = x.size(0), E = cfg.n_routed_experts;
  a.layer = layer;
  // --- routing: s = x R^T (N,E) -> p -> top-k with bias (selection only)
  a.scores = ops::router_scores(linear(x, w.router), score_func(cfg));
  const ops::Routing sel = ops::topk_route(a.scores, bias, topk_config(cfg));
  a.sel_idx = sel.indices, a.sel_w = sel.weights;
  // --- capacity: per expert keep `cap` assignments (token order or highest weight)
  ops::Routing kept = sel;
  const int64_t cap = cfg.expert_capacity(N);
  if (cap >= 0)
    kept = ops::apply_capacity(sel, E, cap,
                               cfg.drop_policy == DropPolicy::low_score ? ops::DropPolicy::probability
                                                                        : ops::DropPolicy::position);
  a.idx = kept.indices, a.w = kept.weights;
  ops::accumulate_expert_load(sel.indices, kept.indices, load);
  if (cfg.aux_loss_alpha > 0) a.aux = ops::sequence_balance_loss(a.scores, sel.indices, B, cfg.aux_loss_alpha);
  // --- permute rows by expert, send them to their experts' PEs, grouped-GEMM
  // experts, bring the outputs back, weighted combine
  // xp (N*K, C), built where the exchange sends it from
  const ops::Permutation perm = ops::permute(x, a.idx, E, experts.send_buffer(layer, Exchange::dispatch, a.idx.numel(), x.size(1)));
  a.offsets = perm.offsets, a.row_of = perm.row_of;
  a.routed = experts.dispatch(perm.x, perm.offsets, layer);
  a.xp = gemm_input(a.routed.rows, cfg.precision);
  a.routed.rows = Tensor();  // kept as the GEMM read it (a.xp), not also in f32
  a.w13 = gemm_weight(w.w13, cfg.precision), a.w2 = gemm_weight(w.w2, cfg.precision);
  a.ye = experts.combine(experts_forward(a, experts, x.size(1)), a.routed);
  Tensor y = ops::unpermute(a.ye, a.row_of, a.w);  // (N,C) = sum_k w_k ye[row(n,k)]
  // --- shared experts: y += SwiGLU_shared(x); their input is cast again in the
  // backward rather than kept next to the f32 x
  if (w.sw13.defined()) y = ops::add(y, mlp_forward(gemm_input(x, cfg.precision), w.sw13, w.sw2, a.shared));
  // Under tensor parallelism the experts (routed and shared) are one region:
  // each rank's hidden units give a part of y, summed on exit.
  return tp.exit(y);
}

Tensor moe_backward(const Tensor& dy, const Tensor& x_in, const MoeParams& w, const MoeGrads& g,
                    const ModelConfig& cfg, int64_t B, parallel::ExpertDispatcher& experts,
                    parallel::TensorParallel& tp, const MoeActs& a, float aux_scale, WgradSink& sink) {
  const Tensor dyr = tp.exit_backward(dy);  // the experts' region (tensor parallelism)
  // the experts' weight gradients are held until dx's sum over the TP ranks
  // has left on the communication stream, and run while it is in flight
  HeldJobs held(sink);
  // --- shared experts
  Tensor dx;
  if (w.sw13.defined()) dx = mlp_backward(dyr, gemm_input(a.x, cfg.precision), a.shared, g.sw13, g.sw2, held);
  // --- combine: y_n += w_k ye_r  =>  dye_r = w_k dy_n,  dw_k = dy_n . ye_r
  const ops::UnpermuteGrads ug = ops::unpermute_backward(
      dyr, a.ye, a.row_of, a.w, experts.send_buffer(a.layer, Exchange::combine_backward, a.ye.size(0), a.ye.size(1)));
  // --- back to the experts' PEs, experts, return; then xp_r = x_n  =>  dx_n += dxp_r
  const Tensor dye = experts.combine_backward(ug.dyp, a.routed);
  const Tensor dxp = experts.dispatch_backward(experts_backward(dye, g, a, experts, held), a.routed);
  const Tensor dx_routed = ops::permute_backward(dxp, a.row_of);
  dx = tp.enter_backward_async(dx.defined() ? ops::add(dx, dx_routed) : dx_routed);
  held.release();
  // --- gate weights -> affinities (through the pre-capacity selection: the
  // sigmoid renormalization also sees dropped experts) (+ balance loss);
  // under tensor parallelism ye, and so dw_k, is this rank's part
  const ops::Routing sel{a.sel_idx, a.sel_w};
  Tensor dscores = ops::topk_route_backward(tp.all_reduce(ug.dweights), a.scores, sel, topk_config(cfg));
  if (cfg.aux_loss_alpha > 0)
    dscores = ops::add(dscores, ops::sequence_balance_loss_backward(a.scores, a.sel_idx, B,
                                                                    cfg.aux_loss_alpha, aux_scale));
  // --- affinities -> router logits;  s = x R^T  =>  dx += ds R,  dR = ds^T x
  // (every rank computed ds whole; under sequence parallelism each takes its
  // rows, and its dR is a part of the sum over the TP ranks)
  const Tensor ds = ops::router_scores_backward(dscores, a.scores, score_func(cfg));
  tp.join();  // dx is summed
  return linear_backward(tp.sequence_shard(ds), x_in, w.router, g.router, sink, &dx);
}

}  // namespace coremesh::model::detail
