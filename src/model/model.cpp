#include "coremesh/model/model.hpp"

#include <cmath>
#include <cstring>

#include "coremesh/core/error.hpp"
#include "coremesh/model/rng.hpp"
#include "layers.hpp"
#include "moe.hpp"

namespace coremesh::model {
using namespace detail;

// Offsets of one layer's parameters in the arena (-1: absent).
struct Model::Layer {
  bool moe = false;
  int64_t attn_norm, wq, wk, wv, wo, ffn_norm;
  int64_t w1 = -1, w3 = -1, w2 = -1;                       // dense SwiGLU
  int64_t router = -1, ew1 = -1, ew3 = -1, ew2 = -1;       // routed experts
  int64_t sw1 = -1, sw3 = -1, sw2 = -1;                    // shared experts
};

// Activations of one micro-batch (sized for the last B, T).
struct Model::Acts {
  int64_t B = 0, T = 0;
  std::vector<int32_t> tokens, targets;
  struct PerLayer {
    std::vector<float> an, arstd, q, k, v, att, ao, h, fn, frstd, a1, a3, g;
    MoeActs moe;
  };
  std::vector<PerLayer> layer;
  std::vector<std::vector<float>> res;  // res[l] = input of layer l (N,C); res[L] = last output
  std::vector<float> xf, frstd, probs;  // final norm (N,C), (N); probabilities (N,V)
  // backward scratch
  std::vector<float> dres, dh, dfn, dan, dao, dq, dk, dv, dg, da1, da3, dlogits, dxf, att_scratch;
};

int64_t Model::add_param(const std::string& name, const Shape& shape, bool decay, bool expert) {
  ParamInfo p;
  p.name = name;
  p.shape = shape;
  p.numel = shape_numel(shape);
  p.offset = arena_size_;
  p.weight_decay = decay;
  p.expert = expert;
  arena_size_ += (p.numel + 15) / 16 * 16;  // keep every parameter 64-byte aligned
  params_.push_back(p);
  return p.offset;
}

Model::Model(const ModelConfig& config) : config_(config), acts_(std::make_unique<Acts>()) {
  config_.validate();
  CM_CHECK(config_.precision == Precision::f32,
           "use precision f32; bf16/fp8 GEMM inputs are not implemented in the model yet",
           "precision {} is not supported by the model", precision_name(config_.precision));
  const ModelConfig& c = config_;
  const int64_t C = c.d_model, D = c.head_dim(), V = c.vocab_size, E = c.n_routed_experts,
                F = c.expert_hidden, SF = int64_t(c.n_shared_experts) * F;
  wte_ = add_param("wte", {V, C}, true, false);
  layers_.resize(size_t(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    Layer& L = layers_[size_t(l)];
    const std::string p = "layers." + std::to_string(l) + ".";
    L.attn_norm = add_param(p + "attn_norm", {C}, false, false);
    L.wq = add_param(p + "wq", {c.n_heads * D, C}, true, false);
    L.wk = add_param(p + "wk", {c.n_kv_heads * D, C}, true, false);
    L.wv = add_param(p + "wv", {c.n_kv_heads * D, C}, true, false);
    L.wo = add_param(p + "wo", {C, c.n_heads * D}, true, false);
    L.ffn_norm = add_param(p + "ffn_norm", {C}, false, false);
    L.moe = c.is_moe_layer(l);
    if (!L.moe) {
      L.w1 = add_param(p + "w1", {c.dense_hidden, C}, true, false);
      L.w3 = add_param(p + "w3", {c.dense_hidden, C}, true, false);
      L.w2 = add_param(p + "w2", {C, c.dense_hidden}, true, false);
    } else {
      L.router = add_param(p + "router", {E, C}, true, false);
      L.ew1 = add_param(p + "experts.w1", {E, F, C}, true, true);
      L.ew3 = add_param(p + "experts.w3", {E, F, C}, true, true);
      L.ew2 = add_param(p + "experts.w2", {E, C, F}, true, true);
      if (SF > 0) {
        L.sw1 = add_param(p + "shared.w1", {SF, C}, true, false);
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

static void ensure(std::vector<float>& v, int64_t n) {
  if (int64_t(v.size()) != n) v.assign(size_t(n), 0.0f);
}

double Model::forward(const int32_t* tokens, const int32_t* targets, int Bi, int Ti) {
  const ModelConfig& c = config_;
  CM_CHECK(Ti <= c.max_seq_len, "lower seq_len or raise max_seq_len in the model config",
           "sequence length {} exceeds max_seq_len {}", Ti, c.max_seq_len);
  const int64_t B = Bi, T = Ti, N = B * T, C = c.d_model, D = c.head_dim(), H = c.n_heads,
                Hkv = c.n_kv_heads, V = c.vocab_size, L = c.n_layers;
  Acts& A = *acts_;
  A.B = B, A.T = T;
  A.tokens.assign(tokens, tokens + N);
  A.targets.assign(targets, targets + N);
  A.layer.resize(size_t(L));
  A.res.resize(size_t(L + 1));
  for (auto& r : A.res) ensure(r, N * C);
  // x = wte[tokens]
  for (int64_t n = 0; n < N; ++n) {
    CM_CHECK(tokens[n] >= 0 && tokens[n] < V && targets[n] >= 0 && targets[n] < V,
             "tokens must lie in [0, vocab_size)", "token {} at position {} is out of range", tokens[n], n);
    std::memcpy(&A.res[0][size_t(n * C)], P(wte_) + tokens[n] * C, sizeof(float) * size_t(C));
  }
  aux_loss_ = 0;
  size_t moe_index = 0;
  for (int64_t l = 0; l < L; ++l) {
    const Layer& Ly = layers_[size_t(l)];
    auto& a = A.layer[size_t(l)];
    const float* x = A.res[size_t(l)].data();
    ensure(a.an, N * C), ensure(a.arstd, N), ensure(a.q, N * H * D), ensure(a.k, N * Hkv * D);
    ensure(a.v, N * Hkv * D), ensure(a.att, B * H * T * T), ensure(a.ao, N * H * D);
    ensure(a.h, N * C), ensure(a.fn, N * C), ensure(a.frstd, N);
    // an = RMSNorm(x); q, k, v projections; RoPE on q, k
    rmsnorm_forward(a.an.data(), a.arstd.data(), x, P(Ly.attn_norm), N, C, c.norm_eps);
    linear_forward(a.q.data(), a.an.data(), P(Ly.wq), N, C, H * D);
    linear_forward(a.k.data(), a.an.data(), P(Ly.wk), N, C, Hkv * D);
    linear_forward(a.v.data(), a.an.data(), P(Ly.wv), N, C, Hkv * D);
    rope_apply(a.q.data(), B, T, H, D, c.rope_theta, false);
    rope_apply(a.k.data(), B, T, Hkv, D, c.rope_theta, false);
    // ao = softmax(q k^T / sqrt(D)) v;  h = x + ao Wo^T
    attention_forward(a.ao.data(), a.att.data(), a.q.data(), a.k.data(), a.v.data(), B, T, H, Hkv, D);
    std::memcpy(a.h.data(), x, sizeof(float) * size_t(N * C));
    linear_forward(a.h.data(), a.ao.data(), P(Ly.wo), N, H * D, C, 1.0f);
    // fn = RMSNorm(h);  out = h + FFN(fn)
    rmsnorm_forward(a.fn.data(), a.frstd.data(), a.h.data(), P(Ly.ffn_norm), N, C, c.norm_eps);
    float* out = A.res[size_t(l + 1)].data();
    if (!Ly.moe) {
      const int64_t Fd = c.dense_hidden;
      ensure(a.a1, N * Fd), ensure(a.a3, N * Fd), ensure(a.g, N * Fd);
      linear_forward(a.a1.data(), a.fn.data(), P(Ly.w1), N, C, Fd);
      linear_forward(a.a3.data(), a.fn.data(), P(Ly.w3), N, C, Fd);
      swiglu_forward(a.g.data(), a.a1.data(), a.a3.data(), N * Fd);
      std::memcpy(out, a.h.data(), sizeof(float) * size_t(N * C));
      linear_forward(out, a.g.data(), P(Ly.w2), N, Fd, C, 1.0f);
    } else {
      MoeWeights w{P(Ly.router), P(Ly.ew1), P(Ly.ew3), P(Ly.ew2),
                   Ly.sw1 >= 0 ? P(Ly.sw1) : nullptr, Ly.sw3 >= 0 ? P(Ly.sw3) : nullptr,
                   Ly.sw2 >= 0 ? P(Ly.sw2) : nullptr, router_bias_[size_t(l)].data<float>()};
      moe_forward(out, a.fn.data(), w, c, B, T, a.moe);
      for (int64_t i = 0; i < N * C; ++i) out[i] += a.h[size_t(i)];
      aux_loss_ += a.moe.aux;
      auto& counts = expert_counts_[moe_index++];
      for (size_t e = 0; e < counts.size(); ++e) counts[e] += a.moe.counts[e];
      dropped_ += a.moe.dropped;
    }
  }
  // logits = RMSNorm(x) head^T; cross entropy
  ensure(A.xf, N * C), ensure(A.frstd, N), ensure(A.probs, N * V);
  rmsnorm_forward(A.xf.data(), A.frstd.data(), A.res[size_t(L)].data(), P(final_norm_), N, C, c.norm_eps);
  const float* head = P(lm_head_ >= 0 ? lm_head_ : wte_);
  linear_forward(A.probs.data(), A.xf.data(), head, N, C, V);
  if (keep_logits_) logits_copy_ = A.probs;
  return softmax_cross_entropy_forward(A.probs.data(), targets, N, V);
}

void Model::backward(float loss_scale) {
  const ModelConfig& c = config_;
  Acts& A = *acts_;
  CM_CHECK(A.B > 0, "call forward before backward", "backward without a forward");
  const int64_t B = A.B, T = A.T, N = B * T, C = c.d_model, D = c.head_dim(), H = c.n_heads,
                Hkv = c.n_kv_heads, V = c.vocab_size, L = c.n_layers;
  const int64_t Fd = c.dense_hidden;
  ensure(A.dlogits, N * V), ensure(A.dxf, N * C), ensure(A.dres, N * C), ensure(A.dh, N * C);
  ensure(A.dfn, N * C), ensure(A.dan, N * C), ensure(A.dao, N * H * D), ensure(A.dq, N * H * D);
  ensure(A.dk, N * Hkv * D), ensure(A.dv, N * Hkv * D), ensure(A.att_scratch, T * T);
  // loss = mean_n CE(probs_n, target_n)  =>  dlogits = (probs - onehot) * scale / N
  softmax_cross_entropy_backward(A.dlogits.data(), A.probs.data(), A.targets.data(), N, V,
                                 loss_scale / float(N));
  // logits = xf head^T  =>  dxf = dlogits head, dhead += dlogits^T xf
  const int64_t head = lm_head_ >= 0 ? lm_head_ : wte_;
  linear_backward(A.dxf.data(), G(head), A.dlogits.data(), A.xf.data(), P(head), N, C, V, 0.0f);
  // xf = RMSNorm(res[L])
  rmsnorm_backward(A.dres.data(), G(final_norm_), A.dxf.data(), A.res[size_t(L)].data(),
                   P(final_norm_), A.frstd.data(), N, C, false);
  for (int64_t l = L - 1; l >= 0; --l) {
    const Layer& Ly = layers_[size_t(l)];
    auto& a = A.layer[size_t(l)];
    // out = h + FFN(fn)  =>  dh = dout + RMSNorm'(dfn), dfn = FFN'(dout)
    std::fill(A.dfn.begin(), A.dfn.end(), 0.0f);
    if (!Ly.moe) {
      ensure(A.dg, N * Fd), ensure(A.da1, N * Fd), ensure(A.da3, N * Fd);
      linear_backward(A.dg.data(), G(Ly.w2), A.dres.data(), a.g.data(), P(Ly.w2), N, Fd, C, 0.0f);
      swiglu_backward(A.da1.data(), A.da3.data(), A.dg.data(), a.a1.data(), a.a3.data(), N * Fd);
      linear_backward(A.dfn.data(), G(Ly.w1), A.da1.data(), a.fn.data(), P(Ly.w1), N, C, Fd, 0.0f);
      linear_backward(A.dfn.data(), G(Ly.w3), A.da3.data(), a.fn.data(), P(Ly.w3), N, C, Fd, 1.0f);
    } else {
      MoeWeights w{P(Ly.router), P(Ly.ew1), P(Ly.ew3), P(Ly.ew2),
                   Ly.sw1 >= 0 ? P(Ly.sw1) : nullptr, Ly.sw3 >= 0 ? P(Ly.sw3) : nullptr,
                   Ly.sw2 >= 0 ? P(Ly.sw2) : nullptr, router_bias_[size_t(l)].data<float>()};
      MoeGrads g{G(Ly.router), G(Ly.ew1), G(Ly.ew3), G(Ly.ew2), Ly.sw1 >= 0 ? G(Ly.sw1) : nullptr,
                 Ly.sw3 >= 0 ? G(Ly.sw3) : nullptr, Ly.sw2 >= 0 ? G(Ly.sw2) : nullptr};
      moe_backward(A.dfn.data(), A.dres.data(), a.fn.data(), w, g, c, B, T, a.moe, loss_scale);
    }
    A.dh = A.dres;
    rmsnorm_backward(A.dh.data(), G(Ly.ffn_norm), A.dfn.data(), a.h.data(), P(Ly.ffn_norm),
                     a.frstd.data(), N, C, true);
    // h = x + ao Wo^T  =>  dao = dh Wo, dWo += dh^T ao, dx = dh + ...
    linear_backward(A.dao.data(), G(Ly.wo), A.dh.data(), a.ao.data(), P(Ly.wo), N, H * D, C, 0.0f);
    attention_backward(A.dq.data(), A.dk.data(), A.dv.data(), A.att_scratch.data(), A.dao.data(),
                       a.att.data(), a.q.data(), a.k.data(), a.v.data(), B, T, H, Hkv, D);
    // q = RoPE(an Wq^T)  =>  d(an Wq^T) = RoPE^-1(dq)
    rope_apply(A.dq.data(), B, T, H, D, c.rope_theta, true);
    rope_apply(A.dk.data(), B, T, Hkv, D, c.rope_theta, true);
    linear_backward(A.dan.data(), G(Ly.wq), A.dq.data(), a.an.data(), P(Ly.wq), N, C, H * D, 0.0f);
    linear_backward(A.dan.data(), G(Ly.wk), A.dk.data(), a.an.data(), P(Ly.wk), N, C, Hkv * D, 1.0f);
    linear_backward(A.dan.data(), G(Ly.wv), A.dv.data(), a.an.data(), P(Ly.wv), N, C, Hkv * D, 1.0f);
    // an = RMSNorm(x)  =>  dx = dh + RMSNorm'(dan)
    A.dres = A.dh;
    rmsnorm_backward(A.dres.data(), G(Ly.attn_norm), A.dan.data(), A.res[size_t(l)].data(),
                     P(Ly.attn_norm), a.arstd.data(), N, C, true);
  }
  // x = wte[tokens]  =>  dwte[token] += dx
  float* dwte = G(wte_);
  for (int64_t n = 0; n < N; ++n) {
    float* row = dwte + A.tokens[size_t(n)] * C;
    const float* d = &A.dres[size_t(n * C)];
    for (int64_t i = 0; i < C; ++i) row[i] += d[i];
  }
}

}  // namespace coremesh::model
