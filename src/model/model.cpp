#include "coremesh/model/model.hpp"

#include <cmath>
#include <set>

#include "coremesh/core/error.hpp"
#include "coremesh/model/rng.hpp"
#include "coremesh/ops/attention.hpp"
#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/embedding.hpp"
#include "coremesh/ops/loss.hpp"
#include "coremesh/ops/norm.hpp"
#include "coremesh/ops/rope.hpp"
#include "coremesh/runtime/stream.hpp"
#include "layers.hpp"
#include "moe.hpp"

namespace coremesh::model {
using namespace detail;

// Offsets of one layer's parameters in the arena (-1: absent).
struct Model::Layer {
  bool moe = false;
  int64_t attn_norm, wq, wk, wv, wo, ffn_norm;
  int64_t w1 = -1, w3 = -1, w2 = -1;                       // dense SwiGLU
  int64_t router = -1, ew13 = -1, ew2 = -1;                 // routed experts
  int64_t sw1 = -1, sw3 = -1, sw2 = -1;                    // shared experts
};

// Activations of one micro-batch (tensors held by value: kernels are async).
struct Model::Acts {
  int64_t B = 0, T = 0;
  Tensor ids, targets, positions;  // (N) i32, (N) i32, (T) i64
  struct PerLayer {
    Tensor x;                  // (N,C) layer input (the residual stream)
    Tensor arstd;              // (N) attention RMSNorm
    GemmInput an;              // (N,C) RMSNorm(x) as the qkv GEMM read it
    GemmWeight wqkv, wo;       // this pass's casts of [wq; wk; wv] and wo
    Tensor q, k, v;            // (B,T,H,D), (B,T,Hkv,D) after RoPE
    Tensor ao, lse;            // attention out (B,T,H,D) f32 (its backward reads it), (B,H,T)
    Tensor h, frstd;           // h = x + ao Wo^T (N,C); FFN RMSNorm (N)
    GemmInput ffn_in;          // dense layers: fn = RMSNorm(h) (N,C) as the MLP read it
    Tensor fn;                 // MoE layers: fn (N,C) f32 (the router is f32)
    MlpActs mlp;               // dense layers
    MoeActs moe;               // MoE layers
  };
  std::vector<PerLayer> layer;
  Tensor xL, xf, frstd;        // last residual (N,C), final norm (N,C), (N)
  Tensor logits, lse;          // (N,V), (N)
};

int64_t Model::add_param(const std::string& name, const Shape& shape, bool decay, bool expert,
                         bool pad) {
  ParamInfo p;
  p.name = name;
  p.shape = shape;
  p.numel = shape_numel(shape);
  p.offset = arena_size_;
  p.weight_decay = decay;
  p.expert = expert;
  // keep parameters 64-byte aligned, except that w1 is directly followed by w3
  // (and wq by wk by wv) so that [w1; w3] is one (2F, C) view: one fused GEMM
  arena_size_ += pad ? (p.numel + 15) / 16 * 16 : p.numel;
  params_.push_back(p);
  return p.offset;
}

Model::Model(const ModelConfig& config) : config_(config), acts_(std::make_unique<Acts>()) {
  config_.validate();
  const ModelConfig& c = config_;
  const int64_t C = c.d_model, D = c.head_dim(), V = c.vocab_size, E = c.n_routed_experts,
                F = c.expert_hidden, SF = int64_t(c.n_shared_experts) * F;
  wte_ = add_param("wte", {V, C}, true, false);
  layers_.resize(size_t(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    Layer& L = layers_[size_t(l)];
    const std::string p = "layers." + std::to_string(l) + ".";
    L.attn_norm = add_param(p + "attn_norm", {C}, false, false);
    // wq, wk, wv adjacent: one (QKV, C) projection
    L.wq = add_param(p + "wq", {c.n_heads * D, C}, true, false, /*pad=*/false);
    L.wk = add_param(p + "wk", {c.n_kv_heads * D, C}, true, false, /*pad=*/false);
    L.wv = add_param(p + "wv", {c.n_kv_heads * D, C}, true, false);
    L.wo = add_param(p + "wo", {C, c.n_heads * D}, true, false);
    L.ffn_norm = add_param(p + "ffn_norm", {C}, false, false);
    L.moe = c.is_moe_layer(l);
    if (!L.moe) {
      L.w1 = add_param(p + "w1", {c.dense_hidden, C}, true, false, /*pad=*/false);
      L.w3 = add_param(p + "w3", {c.dense_hidden, C}, true, false);
      L.w2 = add_param(p + "w2", {C, c.dense_hidden}, true, false);
    } else {
      L.router = add_param(p + "router", {E, C}, true, false);
      L.ew13 = add_param(p + "experts.w13", {E, 2 * F, C}, true, true);  // [w1_e; w3_e]
      L.ew2 = add_param(p + "experts.w2", {E, C, F}, true, true);
      if (SF > 0) {
        L.sw1 = add_param(p + "shared.w1", {SF, C}, true, false, /*pad=*/false);
        L.sw3 = add_param(p + "shared.w3", {SF, C}, true, false);
        L.sw2 = add_param(p + "shared.w2", {C, SF}, true, false);
      }
    }
  }
  final_norm_ = add_param("final_norm", {C}, false, false);
  if (!c.tied_embeddings) lm_head_ = add_param("lm_head", {V, C}, true, false);
  weights_ = Tensor::zeros({arena_size_});
  grads_ = Tensor::zeros({arena_size_});
  router_bias_.resize(size_t(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l)
    if (layers_[size_t(l)].moe) router_bias_[size_t(l)] = Tensor::zeros({E});
  reset_expert_counts();
}

Model::~Model() = default;

void Model::init_weights(uint64_t seed) {
  Rng rng(seed);
  const float out_std = config_.init_std / std::sqrt(2.0f * float(config_.n_layers));
  for (const auto& p : params_) {
    float* w = param_data() + p.offset;
    const bool is_norm = p.shape.size() == 1;
    const std::string& n = p.name;
    const bool out_proj = n.ends_with(".wo") || n.ends_with(".w2");
    const float std = out_proj ? out_std : config_.init_std;
    for (int64_t i = 0; i < p.numel; ++i) w[i] = is_norm ? 1.0f : std * rng.normal();
  }
  for (auto& b : router_bias_)
    if (b.defined()) b.fill(0.0f);
}

Tensor Model::param(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return weights_.slice(0, p.offset, p.offset + p.numel).view(p.shape);
  CM_THROW(InvalidArgument, "see Model::params() for the names", "no parameter '{}'", name);
}

Tensor Model::grad(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return grads_.slice(0, p.offset, p.offset + p.numel).view(p.shape);
  CM_THROW(InvalidArgument, "see Model::params() for the names", "no parameter '{}'", name);
}

std::vector<std::pair<std::string, Tensor>> Model::named_params() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& p : params_) out.emplace_back(p.name, param(p.name));
  return out;
}

std::vector<std::pair<std::string, Tensor>> Model::named_grads() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& p : params_) out.emplace_back(p.name, grad(p.name));
  return out;
}

std::vector<std::pair<std::string, Tensor>> Model::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t l = 0; l < router_bias_.size(); ++l)
    if (router_bias_[l].defined())
      out.emplace_back("layers." + std::to_string(l) + ".router_bias", router_bias_[l]);
  return out;
}

void Model::zero_grad() { grads_.fill(0.0f); }

void Model::reset_expert_counts() {
  expert_counts_.assign(size_t(config_.n_moe_layers()),
                        std::vector<double>(size_t(config_.n_routed_experts), 0.0));
  dropped_ = 0;
}

void Model::update_router_bias() {
  if (config_.bias_update_rate <= 0) return;
  size_t m = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (!layers_[l].moe) continue;
    const auto& load = expert_counts_[m++];
    double mean = 0;
    for (double x : load) mean += x / double(load.size());
    float* b = router_bias_[l].data<float>();
    for (size_t e = 0; e < load.size(); ++e) {
      const double d = mean - load[e];
      b[e] += config_.bias_update_rate * float((d > 0) - (d < 0));
    }
  }
}

Tensor Model::pw(int64_t offset, const Shape& shape) const {
  return weights_.slice(0, offset, offset + shape_numel(shape)).view(shape);
}
Tensor Model::gw(int64_t offset, const Shape& shape) const {
  return grads_.slice(0, offset, offset + shape_numel(shape)).view(shape);
}

MoeParams Model::moe_params(int64_t l, bool grads) const {
  const ModelConfig& c = config_;
  const Layer& Ly = layers_[size_t(l)];
  const int64_t C = c.d_model, E = c.n_routed_experts, F = c.expert_hidden,
                SF = int64_t(c.n_shared_experts) * F;
  auto v = [&](int64_t off, const Shape& s) { return grads ? gw(off, s) : pw(off, s); };
  MoeParams m{v(Ly.router, {E, C}), v(Ly.ew13, {E, 2 * F, C}), v(Ly.ew2, {E, C, F}), {}, {}};
  if (SF > 0) m.sw13 = v(Ly.sw1, {2 * SF, C}), m.sw2 = v(Ly.sw2, {C, SF});  // sw3 follows sw1
  return m;
}

double Model::forward(const int32_t* tokens, const int32_t* targets, int Bi, int Ti) {
  const ModelConfig& c = config_;
  CM_CHECK(Ti <= c.max_seq_len, "lower seq_len or raise max_seq_len in the model config",
           "sequence length {} exceeds max_seq_len {}", Ti, c.max_seq_len);
  const int64_t B = Bi, T = Ti, N = B * T, C = c.d_model, D = c.head_dim(), H = c.n_heads,
                Hkv = c.n_kv_heads, V = c.vocab_size, L = c.n_layers, Fd = c.dense_hidden,
                QKV = (H + 2 * Hkv) * D;
  for (int64_t n = 0; n < N; ++n)
    CM_CHECK(tokens[n] >= 0 && tokens[n] < V && targets[n] >= 0 && targets[n] < V,
             "tokens must lie in [0, vocab_size)", "token {} at position {} is out of range", tokens[n], n);
  Acts& A = *acts_;
  A.B = B, A.T = T;
  A.ids = Tensor::from_vector(std::vector<int32_t>(tokens, tokens + N), {N});
  A.targets = Tensor::from_vector(std::vector<int32_t>(targets, targets + N), {N});
  A.positions = ops::rope_positions(T);
  A.layer.assign(size_t(L), {});
  const ops::RopeConfig rope{c.rope_theta, /*interleaved=*/false};  // rotate-half pairs (i, i+D/2)
  // x = wte[tokens]  (N,C). The residual stream is x + delta: each residual
  // add is fused into the RMSNorm that reads its result.
  Tensor x = ops::embedding(pw(wte_, {V, C}), A.ids), delta;
  auto add_norm = [&](const Tensor& base, const Tensor& add, int64_t w) {
    if (!add.defined()) {
      auto n = ops::rmsnorm(base, pw(w, {C}), c.norm_eps);
      return ops::RMSNormResidualOut{base, n.y, n.rstd};
    }
    return ops::rmsnorm_residual(add, base, pw(w, {C}), c.norm_eps);
  };
  for (int64_t l = 0; l < L; ++l) {
    const Layer& Ly = layers_[size_t(l)];
    auto& a = A.layer[size_t(l)];
    // x = x + delta; an = RMSNorm(x); q, k, v projections (N,H*D) = (B,T,H,D); RoPE on q, k
    auto an = add_norm(x, delta, Ly.attn_norm);
    a.x = an.h;
    a.an = gemm_input(an.y, c.precision), a.arstd = an.rstd;
    // [wq; wk; wv] is one (QKV, C) view: one GEMM, then RoPE and the head split in one pass
    a.wqkv = gemm_weight(pw(Ly.wq, {QKV, C}), c.precision);
    const auto heads = ops::rope_qkv(linear(a.an, a.wqkv).view({B, T, QKV}), H, Hkv, A.positions, rope);
    a.q = heads.q, a.k = heads.k, a.v = heads.v;
    // ao = softmax(q k^T / sqrt(D)) v (causal, GQA: head h reads kv head h/(H/Hkv));  h = x + ao Wo^T
    auto at = ops::flash_attention(a.q, a.k, a.v, /*causal=*/true);
    a.ao = at.out, a.lse = at.lse;
    a.wo = gemm_weight(pw(Ly.wo, {C, H * D}), c.precision);
    // fn = RMSNorm(h), h = x + ao Wo^T;  x' = h + FFN(fn)
    auto fn = add_norm(a.x, linear(gemm_input(a.ao.view({N, H * D}), c.precision), a.wo), Ly.ffn_norm);
    a.h = fn.h, a.frstd = fn.rstd;
    if (!Ly.moe) {
      // [w1; w3] is one (2Fd, C) view (w3 follows w1 in the arena)
      a.ffn_in = gemm_input(fn.y, c.precision);
      delta = mlp_forward(a.ffn_in, pw(Ly.w1, {2 * Fd, C}), pw(Ly.w2, {C, Fd}), a.mlp);
    } else {
      a.fn = fn.y;
      delta = moe_forward(a.fn, moe_params(l, false), router_bias_[size_t(l)], c, B, T, a.moe);
    }
    x = a.h;
  }
  // logits = RMSNorm(x + delta) head^T (N,V); cross entropy per row
  auto xf = add_norm(x, delta, final_norm_);
  A.xL = xf.h, A.xf = xf.y, A.frstd = xf.rstd;
  A.logits = linear(A.xf, pw(lm_head_ >= 0 ? lm_head_ : wte_, {V, C}));
  auto ce = ops::cross_entropy(A.logits, A.targets);
  A.lse = ce.lse;
  runtime::current_stream().synchronize();  // the host reads the loss and the routing stats
  aux_loss_ = 0;
  size_t moe_index = 0;
  for (int64_t l = 0; l < L; ++l) {
    if (!layers_[size_t(l)].moe) continue;
    MoeActs& m = A.layer[size_t(l)].moe;
    moe_finish_forward(c, B, T, m);
    aux_loss_ += m.aux;
    auto& counts = expert_counts_[moe_index++];
    for (size_t e = 0; e < counts.size(); ++e) counts[e] += m.host_counts[e];
    dropped_ += m.dropped;
  }
  if (keep_logits_) logits_copy_ = A.logits.to_float_vector();
  double loss = 0;
  const float* lr = ce.loss.data<float>();
  for (int64_t n = 0; n < N; ++n) loss += lr[n];
  return loss / double(N);
}

Model::SavedBytes Model::saved_bytes() const {
  // Each storage once (views share storage, e.g. the next layer's x is this
  // layer's output); weight copies apart from the activations.
  std::set<const Storage*> seen;
  auto bytes = [&](const Tensor& t) -> int64_t {
    if (!t.defined() || !seen.insert(t.storage().get()).second) return 0;
    return int64_t(t.storage()->bytes());
  };
  auto input = [&](const GemmInput& in) { return bytes(in.x) + bytes(in.fp8.data) + bytes(in.fp8.scale); };
  auto mlp = [&](const MlpActs& m) { return bytes(m.gu) + input(m.g); };
  const Acts& A = *acts_;
  SavedBytes out;
  for (const auto& a : A.layer) {
    out.weight_copies += bytes(a.wqkv.bf16) + bytes(a.wo.bf16) + bytes(a.mlp.w13.bf16) +
                         bytes(a.mlp.w2.bf16) + bytes(a.moe.w13.bf16) + bytes(a.moe.w2.bf16) +
                         bytes(a.moe.shared.w13.bf16) + bytes(a.moe.shared.w2.bf16);
    out.activations += bytes(a.x) + bytes(a.arstd) + input(a.an) + bytes(a.q) + bytes(a.k) +
                       bytes(a.v) + bytes(a.ao) + bytes(a.lse) + bytes(a.h) + bytes(a.frstd) +
                       input(a.ffn_in) + bytes(a.fn) + mlp(a.mlp);
    const MoeActs& m = a.moe;
    out.activations += bytes(m.scores) + bytes(m.sel_idx) + bytes(m.sel_w) + bytes(m.idx) +
                       bytes(m.w) + bytes(m.offsets) + bytes(m.row_of) + input(m.xp) +
                       bytes(m.gu) + input(m.g) + bytes(m.ye) + mlp(m.shared) + bytes(m.counts);
  }
  out.activations += bytes(A.ids) + bytes(A.targets) + bytes(A.positions) + bytes(A.xL) +
                     bytes(A.xf) + bytes(A.frstd) + bytes(A.logits) + bytes(A.lse);
  return out;
}

void Model::backward(float loss_scale, bool accumulate) {
  const ModelConfig& c = config_;
  Acts& A = *acts_;
  CM_CHECK(A.B > 0, "call forward before backward", "backward without a forward");
  const int64_t B = A.B, T = A.T, N = B * T, C = c.d_model, D = c.head_dim(), H = c.n_heads,
                Hkv = c.n_kv_heads, V = c.vocab_size, L = c.n_layers, Fd = c.dense_hidden,
                QKV = (H + 2 * Hkv) * D;
  const ops::RopeConfig rope{c.rope_theta, false};
  // Every parameter's gradient is written exactly once below (the tied
  // embedding twice: head, then table), so beta 0 on that first write replaces
  // zeroing the arena beforehand (the padding between parameters stays zero).
  const float beta = accumulate ? 1.0f : 0.0f;
  // loss = mean_n CE_n  =>  dloss_n = scale / N
  const Tensor dloss = Tensor::full({N}, loss_scale / float(N));
  const Tensor dlogits = ops::cross_entropy_backward(dloss, A.logits, A.targets, A.lse);
  // logits = xf head^T  =>  dxf = dlogits head, dhead += dlogits^T xf
  const int64_t head = lm_head_ >= 0 ? lm_head_ : wte_;
  const Tensor dxf = linear_backward(dlogits, A.xf, pw(head, {V, C}), gw(head, {V, C}), beta);
  // xf = RMSNorm(xL); the norm weight gradient goes into the arena
  Tensor dres = ops::rmsnorm_backward(dxf, A.xL, pw(final_norm_, {C}), A.frstd, {},
                                      gw(final_norm_, {C}), beta).dx;  // d of the residual stream (N,C)
  for (int64_t l = L - 1; l >= 0; --l) {
    const Layer& Ly = layers_[size_t(l)];
    const auto& a = A.layer[size_t(l)];
    // x' = h + FFN(fn)  =>  dfn = FFN'(dres), dh = dres + RMSNorm'(dfn)
    Tensor dfn;
    if (!Ly.moe)
      dfn = mlp_backward(dres, a.ffn_in, a.mlp, gw(Ly.w1, {2 * Fd, C}), gw(Ly.w2, {C, Fd}), beta);
    else
      dfn = moe_backward(dres, a.fn, moe_params(l, false), moe_params(l, true), beta, c, B, T,
                         a.moe, loss_scale);
    const Tensor dh =
        ops::rmsnorm_backward(dfn, a.h, pw(Ly.ffn_norm, {C}), a.frstd, dres, gw(Ly.ffn_norm, {C}),
                              beta).dx;
    // h = x + ao Wo^T  =>  dao = dh Wo, dWo += dh^T ao (ao is cast again, as the forward did)
    const Tensor dao = linear_backward(dh, gemm_input(a.ao.view({N, H * D}), c.precision), a.wo,
                                       gw(Ly.wo, {C, H * D}), beta);
    auto ag = ops::flash_attention_backward(dao.view({B, T, H, D}), a.q, a.k, a.v, a.ao, a.lse, true);
    // [q|k|v] = RoPE(an Wqkv^T)  =>  d(an Wqkv^T) = [RoPE^-1(dq) | RoPE^-1(dk) | dv]
    const Tensor dqkv = ops::rope_qkv_backward(ag.dq, ag.dk, ag.dv, A.positions, rope).view({N, QKV});
    const Tensor dan = linear_backward(dqkv, a.an, a.wqkv, gw(Ly.wq, {QKV, C}), beta);
    // an = RMSNorm(x)  =>  dx = dh + RMSNorm'(dan)
    dres = ops::rmsnorm_backward(dan, a.x, pw(Ly.attn_norm, {C}), a.arstd, dh,
                                 gw(Ly.attn_norm, {C}), beta).dx;
  }
  // x = wte[tokens]  =>  dwte[token] += dx (onto the head's gradient when tied)
  ops::embedding_backward_into(dres, A.ids, gw(wte_, {V, C}), lm_head_ < 0 ? 1.0f : beta);
  runtime::current_stream().synchronize();  // gradients are read by the host (optimizer)
}

}  // namespace coremesh::model
