#include "parts.hpp"

#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/embedding.hpp"
#include "coremesh/ops/loss.hpp"
#include "coremesh/ops/norm.hpp"
#include "coremesh/ops/rope.hpp"

namespace coremesh::model {
using namespace detail;

namespace {

// The rows of the embedding table and LM head this stage holds: a slice of
// the vocabulary under tensor parallelism, else the whole.
ops::VocabSlice vocab_slice(const ModelConfig& c, const TpShape& t) { return {t.vocab_begin, c.vocab_size}; }

// rotate-half pairs (i, i + D/2)
ops::RopeConfig rope_config(const ModelConfig& c) { return {c.rope_theta, /*interleaved=*/false}; }

// RMSNorm(x + delta) with the add fused (or of x alone); h is x + delta.
ops::RMSNormResidualOut add_norm(const Residual& r, const Tensor& w, float eps) {
  if (!r.delta.defined()) {
    auto n = ops::rmsnorm(r.x, w, eps);
    return {r.x, n.y, n.rstd};
  }
  return ops::rmsnorm_residual(r.delta, r.x, w, eps);
}

// dx of RMSNorm (+ plus); the weight's gradient goes straight to the sink's
// target when it runs its jobs at once, else it is kept for the
// weight-gradient half (copied: x * 1 keeps every bit, -0 included).
Tensor norm_backward(WgradSink& sink, int param, const Tensor& dy, const Tensor& x, const Tensor& w,
                     const Tensor& rstd, const Tensor& plus) {
  const GradRef ref{param, 1, {}};
  if (sink.immediate()) return ops::rmsnorm_backward(dy, x, w, rstd, plus, sink.view(ref), sink.take_beta(ref)).dx;
  const ops::RMSNormGrads g = ops::rmsnorm_backward(dy, x, w, rstd, plus);
  const Tensor dw = g.dw;
  sink.add(ref, [dw](const Tensor& out, float beta) {
    Tensor o = out;
    if (beta == 0.0f) ops::mul_out(dw, Tensor::full(dw.shape(), 1.0f), o);
    else ops::add_out(o, dw, o);
  });
  return g.dx;
}

// tp.enter_backward(dx) of a column-parallel backward `dgrad` that returns dx:
// the sum over the TP ranks leaves on the communication stream as soon as dx
// is computed, and the weight gradients of `dgrad` (held until then) run on
// this stream meanwhile; then joined. The same products as in sequence.
Tensor enter_backward_overlapped(parallel::TensorParallel& tp, WgradSink& sink,
                                 const std::function<Tensor(WgradSink&)>& dgrad) {
  HeldJobs held(sink);
  const Tensor dx = tp.enter_backward_async(dgrad(held));
  held.release();
  tp.join();
  return dx;
}

}  // namespace

// ---- forward

Residual Parts::embedding_forward(Model& m, Model::Slot& s, const Model::PartParams& p) {
  // x = wte[tokens]  (N,C); under TP each rank looks up the rows of its
  // vocabulary slice (zero elsewhere) and the exit sums them: exactly wte's rows
  return {m.seams_.tensor->exit(ops::embedding(m.wview(p.table), s.ids, vocab_slice(m.config_, m.tp_))), {}};
}

Residual Parts::attention_forward(Model& m, Model::Slot& s, const Model::PartParams& p, const Residual& in) {
  const ModelConfig& c = m.config_;
  const int64_t B = s.B, T = s.T, N = B * T, C = c.d_model, H = m.tp_.heads, Hkv = m.tp_.kv_heads,
                D = c.head_dim(), QKV = (H + 2 * Hkv) * D;
  parallel::TensorParallel& tp = *m.seams_.tensor;
  AttentionActs& a = s.attention[size_t(p.part.layer)];
  // x = x + delta; an = RMSNorm(x); q, k, v projections (N,H*D) = (B,T,H,D); RoPE on q, k
  const auto an = add_norm(in, m.wview(p.norm), c.norm_eps);
  a.x = an.h, a.arstd = an.rstd;
  // [wq; wk; wv] is one (QKV, C) view: one GEMM, then RoPE and the head split in one pass
  a.wqkv = gemm_weight(m.wview(p.qkv, {QKV, C}), c.precision);
  const Tensor qkv = enter_linear(tp, an.y, a.wqkv, a.an);
  const auto heads = ops::rope_qkv(qkv.view({B, T, QKV}), H, Hkv, s.positions, rope_config(c));
  a.q = heads.q, a.k = heads.k, a.v = heads.v;
  // ao = softmax(q k^T / sqrt(D)) v (causal, GQA: head h reads kv head h/(H/Hkv));  h = x + ao Wo^T
  a.at = m.seams_.context->attention(a.q, a.k, a.v);
  a.wo = gemm_weight(m.wview(p.wo), c.precision);
  return {a.x, linear_exit(tp, gemm_input(a.at.out.view({N, H * D}), c.precision), a.wo)};
}

Residual Parts::ffn_forward(Model& m, Model::Slot& s, const Model::PartParams& p, const Residual& in) {
  const ModelConfig& c = m.config_;
  FfnActs& a = s.ffn[size_t(p.part.layer)];
  // fn = RMSNorm(h), h = x + delta;  x' = h + FFN(fn)
  const auto fn = add_norm(in, m.wview(p.norm), c.norm_eps);
  a.h = fn.h, a.frstd = fn.rstd;
  if (p.router < 0) {  // dense: [w1; w3] is one (2Fd, C) view (w3 follows w1 in the arena)
    parallel::TensorParallel& tp = *m.seams_.tensor;
    const int64_t C = c.d_model, Fd = m.tp_.dense_hidden;
    return {a.h, mlp_forward(tp, fn.y, c.precision, m.wview(p.w13, {2 * Fd, C}), m.wview(p.w2), a.mlp, a.ffn_in)};
  }
  a.fn = fn.y;
  const Tensor y = moe_forward(a.fn, m.moe_params(p), m.router_bias_[size_t(p.part.layer)], c, s.B,
                               p.part.layer, *m.seams_.experts, *m.seams_.tensor, *m.moe_streams_, m.load_[size_t(p.moe)], a.moe);
  if (a.moe.aux.defined()) m.aux_losses_.push_back({a.moe.aux, s.loss_scale});
  return {a.h, y};
}

void Parts::head_forward(Model& m, Model::Slot& s, const Model::PartParams& p, const Residual& in) {
  const ModelConfig& c = m.config_;
  HeadActs& a = s.head;
  // logits = RMSNorm(x + delta) head^T (N,V); cross entropy per row
  const auto xf = add_norm(in, m.wview(p.norm), c.norm_eps);
  a.xL = xf.h, a.frstd = xf.rstd;
  parallel::TensorParallel& tp = *m.seams_.tensor;
  // a.logits = enter(xf) head^T: under TP this rank's vocabulary columns (N, V/tp)
  const parallel::TensorParallel::Entered head = tp.enter_matmul(xf.y, m.wview(p.table));
  a.xf = head.x, a.logits = head.y;
  const ops::VocabSlice slice = vocab_slice(c, m.tp_);
  auto ce = m.tp_.vocab == c.vocab_size
                ? ops::cross_entropy(a.logits, s.targets)
                : ops::cross_entropy_from_slice_stats(tp.all_reduce(ops::cross_entropy_slice_stats(a.logits, s.targets, slice)),
                                                      s.targets);
  a.lse = ce.lse, a.loss = ce.loss;
  m.losses_.push_back({a.loss, s.loss_scale});
}

// ---- backward (each quotes the forward line it differentiates)

Tensor Parts::head_backward(Model& m, Model::Slot& s, const Model::PartParams& p, WgradSink& sink) {
  const HeadActs& a = s.head;
  const int64_t N = s.B * s.T;
  // loss = mean_n CE_n  =>  dloss_n = scale / N
  const Tensor dloss = Tensor::full({N}, s.loss_scale / float(N));
  const Tensor dlogits =
      ops::cross_entropy_backward(dloss, a.logits, s.targets, a.lse, -100, vocab_slice(m.config_, m.tp_));
  // logits = xf head^T  =>  dxf = dlogits head (summed over the vocabulary slices), dhead += dlogits^T xf
  // (the head's weight gradient runs while dxf's sum is in flight)
  const Tensor dxf = enter_backward_overlapped(*m.seams_.tensor, sink, [&](WgradSink& held) {
    return linear_backward(dlogits, a.xf, m.wview(p.table), {p.table}, held);
  });
  // xf = RMSNorm(xL)
  return norm_backward(sink, p.norm, dxf, a.xL, m.wview(p.norm), a.frstd, {});
}

Tensor Parts::ffn_backward(Model& m, Model::Slot& s, const Model::PartParams& p, const Tensor& dr,
                           WgradSink& sink) {
  const ModelConfig& c = m.config_;
  const FfnActs& a = s.ffn[size_t(p.part.layer)];
  // x' = h + FFN(fn)  =>  dfn = FFN'(dr), dh = dr + RMSNorm'(dfn)
  Tensor dfn;
  if (p.router < 0) {
    parallel::TensorParallel& tp = *m.seams_.tensor;
    const int64_t C = c.d_model, Fd = m.tp_.dense_hidden;
    const Tensor dy = tp.exit_backward(dr);
    dfn = enter_backward_overlapped(tp, sink, [&](WgradSink& held) {
      return mlp_backward(dy, a.ffn_in, a.mlp, {p.w13, 2, {2 * Fd, C}}, {p.w2}, held);
    });
  } else {
    dfn = moe_backward(dr, a.fn, m.moe_params(p), m.moe_grads(p), c, s.B, *m.seams_.experts, *m.seams_.tensor, *m.moe_streams_, a.moe,
                       s.loss_scale, sink);
  }
  return norm_backward(sink, p.norm, dfn, a.h, m.wview(p.norm), a.frstd, dr);
}

Tensor Parts::attention_backward(Model& m, Model::Slot& s, const Model::PartParams& p, const Tensor& dr,
                                 WgradSink& sink) {
  const ModelConfig& c = m.config_;
  const AttentionActs& a = s.attention[size_t(p.part.layer)];
  const int64_t B = s.B, T = s.T, N = B * T, C = c.d_model, H = m.tp_.heads, Hkv = m.tp_.kv_heads,
                D = c.head_dim(), QKV = (H + 2 * Hkv) * D;
  parallel::TensorParallel& tp = *m.seams_.tensor;
  // the weight gradients of wo and [wq; wk; wv] run while dan's sum is in flight
  const Tensor dan = enter_backward_overlapped(tp, sink, [&](WgradSink& held) {
    // h = x + ao Wo^T  =>  dao = dh Wo, dWo = dh^T ao (ao is cast again, as the forward did)
    const Tensor dao = linear_backward(tp.exit_backward(dr), gemm_input(a.at.out.view({N, H * D}), c.precision),
                                       a.wo, {p.wo}, held);
    auto ag = m.seams_.context->attention_backward(dao.view({B, T, H, D}), a.q, a.k, a.v, a.at);
    // [q|k|v] = RoPE(an Wqkv^T)  =>  d(an Wqkv^T) = [RoPE^-1(dq) | RoPE^-1(dk) | dv]
    const Tensor dqkv = ops::rope_qkv_backward(ag.dq, ag.dk, ag.dv, s.positions, rope_config(c)).view({N, QKV});
    return linear_backward(dqkv, a.an, a.wqkv, {p.qkv, 3, {QKV, C}}, held);
  });
  // an = RMSNorm(x)  =>  dx = dh + RMSNorm'(dan)
  return norm_backward(sink, p.norm, dan, a.x, m.wview(p.norm), a.arstd, dr);
}

void Parts::embedding_backward(Model& m, Model::Slot& s, const Model::PartParams& p, const Tensor& dr,
                               WgradSink& sink) {
  // x = wte[tokens]  =>  dwte[token] += dx (onto the head's gradient when tied;
  // under TP the rows of this rank's vocabulary slice)
  const Tensor ids = s.ids, dx = m.seams_.tensor->exit_backward(dr);
  const ops::VocabSlice slice = vocab_slice(m.config_, m.tp_);
  sink.add({p.table}, [dx, ids, slice](const Tensor& g, float beta) {
    ops::embedding_backward_into(dx, ids, g, beta, slice);
  });
}

}  // namespace coremesh::model
