#include "coremesh/model/config.hpp"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "coremesh/core/error.hpp"

namespace coremesh::model {

std::string gating_name(Gating g) { return g == Gating::softmax ? "softmax" : "sigmoid"; }
std::string drop_policy_name(DropPolicy p) {
  return p == DropPolicy::token_order ? "token_order" : "low_score";
}
std::string precision_name(Precision p) {
  switch (p) {
    case Precision::f32: return "f32";
    case Precision::bf16: return "bf16";
    case Precision::fp8: return "fp8";
  }
  return "?";
}
Precision parse_precision(const std::string& name) {
  if (name == "f32" || name == "fp32") return Precision::f32;
  if (name == "bf16") return Precision::bf16;
  if (name == "fp8") return Precision::fp8;
  CM_THROW(InvalidArgument, "use one of f32, bf16, fp8", "unknown precision '{}'", name);
}

int ModelConfig::n_moe_layers() const {
  int n = 0;
  for (int l = 0; l < n_layers; ++l) n += is_moe_layer(l) ? 1 : 0;
  return n;
}

int64_t ModelConfig::expert_capacity(int64_t tokens) const {
  if (capacity_factor <= 0.0f || n_routed_experts == 0) return -1;
  double c = std::ceil(double(capacity_factor) * double(tokens) * top_k / n_routed_experts);
  return std::max<int64_t>(1, int64_t(c));
}

std::vector<std::string> ModelConfig::problems() const {
  std::vector<std::string> p;
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) p.push_back(fmt::format("{} = {} must be positive", name, v));
  };
  positive("vocab_size", vocab_size);
  positive("d_model", d_model);
  positive("n_layers", n_layers);
  positive("n_heads", n_heads);
  positive("n_kv_heads", n_kv_heads);
  positive("max_seq_len", max_seq_len);
  if (n_heads > 0 && d_model > 0 && d_model % n_heads != 0)
    p.push_back(fmt::format(
        "n_heads = {} does not divide d_model = {}; choose n_heads among the divisors of d_model "
        "or set d_model to a multiple of n_heads (e.g. {})",
        n_heads, d_model, (d_model / n_heads + 1) * n_heads));
  if (n_heads > 0 && d_model > 0 && d_model % n_heads == 0 && (d_model / n_heads) % 2 != 0)
    p.push_back(fmt::format("head dim d_model / n_heads = {} is odd; RoPE rotates pairs, so "
                            "make d_model / n_heads even",
                            d_model / n_heads));
  if (n_kv_heads > 0 && n_heads > 0 && n_heads % n_kv_heads != 0)
    p.push_back(fmt::format("n_kv_heads = {} does not divide n_heads = {}; each key/value head "
                            "serves n_heads / n_kv_heads query heads",
                            n_kv_heads, n_heads));
  if (first_k_dense < 0 || first_k_dense > n_layers)
    p.push_back(fmt::format("first_k_dense = {} must be in [0, n_layers = {}]", first_k_dense,
                            n_layers));
  bool has_dense = first_k_dense > 0 || n_routed_experts == 0;
  if (has_dense && dense_hidden <= 0)
    p.push_back(fmt::format("dense_hidden = {} must be positive (dense FFN layers exist)",
                            dense_hidden));
  if (n_routed_experts < 0)
    p.push_back(fmt::format("n_routed_experts = {} must be >= 0", n_routed_experts));
  if (n_shared_experts < 0)
    p.push_back(fmt::format("n_shared_experts = {} must be >= 0", n_shared_experts));
  if (n_routed_experts > 0) {
    if (top_k <= 0) p.push_back(fmt::format("top_k = {} must be positive", top_k));
    if (top_k > n_routed_experts)
      p.push_back(fmt::format("top_k = {} is above n_routed_experts = {}; lower top_k or add "
                              "experts",
                              top_k, n_routed_experts));
    positive("expert_hidden", expert_hidden);
    if (n_groups <= 0 || n_routed_experts % n_groups != 0) {
      p.push_back(fmt::format("n_groups = {} must be positive and divide n_routed_experts = {}",
                              n_groups, n_routed_experts));
    } else {
      if (topk_groups <= 0 || topk_groups > n_groups)
        p.push_back(fmt::format("topk_groups = {} must be in [1, n_groups = {}]", topk_groups,
                                n_groups));
      else if (topk_groups * (n_routed_experts / n_groups) < top_k)
        p.push_back(fmt::format("topk_groups = {} groups of {} experts hold fewer than top_k = {} "
                                "experts; raise topk_groups or lower top_k",
                                topk_groups, n_routed_experts / n_groups, top_k));
    }
  }
  if (!(bias_update_rate >= 0.0f))
    p.push_back(fmt::format("bias_update_rate = {} must be >= 0", bias_update_rate));
  if (!(aux_loss_alpha >= 0.0f))
    p.push_back(fmt::format("aux_loss_alpha = {} must be >= 0", aux_loss_alpha));
  if (!(rope_theta > 0.0f)) p.push_back(fmt::format("rope_theta = {} must be > 0", rope_theta));
  if (!(norm_eps > 0.0f)) p.push_back(fmt::format("norm_eps = {} must be > 0", norm_eps));
  if (!(init_std > 0.0f)) p.push_back(fmt::format("init_std = {} must be > 0", init_std));
  if (!std::isfinite(capacity_factor))
    p.push_back("capacity_factor must be finite (<= 0 means unlimited)");
  return p;
}

void ModelConfig::validate() const {
  auto p = problems();
  if (p.empty()) return;
  std::string text = "invalid model config:";
  for (const auto& s : p) text += "\n  - " + s;
  CM_THROW(InvalidArgument, "fix the fields listed above in the config file or with flags", "{}",
           text);
}

namespace {

template <typename T>
void read_field(const nlohmann::json& j, const char* key, T& out) {
  if (!j.contains(key)) return;
  try {
    out = j.at(key).get<T>();
  } catch (const nlohmann::json::exception& e) {
    CM_THROW(InvalidArgument, "give the field a value of the documented type",
             "model config field '{}' has the wrong type: {}", key, e.what());
  }
}

const char* const kKeys[] = {
    "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "max_seq_len",
    "first_k_dense", "dense_hidden", "n_routed_experts", "n_shared_experts", "top_k",
    "expert_hidden", "gating", "n_groups", "topk_groups", "bias_update_rate", "aux_loss_alpha",
    "capacity_factor", "drop_policy", "rope_theta", "norm_eps", "init_std", "tied_embeddings",
    "precision"};

}  // namespace

ModelConfig model_config_from_json(const nlohmann::json& j) {
  CM_CHECK(j.is_object(), "write the model config as a JSON object", "model config is not an object");
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (const char* k : kKeys) known = known || key == k;
    CM_CHECK(known, fmt::format("known fields: {}", fmt::join(kKeys, ", ")),
             "unknown model config field '{}'", key);
  }
  ModelConfig c;
  read_field(j, "vocab_size", c.vocab_size);
  read_field(j, "d_model", c.d_model);
  read_field(j, "n_layers", c.n_layers);
  read_field(j, "n_heads", c.n_heads);
  c.n_kv_heads = c.n_heads;
  read_field(j, "n_kv_heads", c.n_kv_heads);
  read_field(j, "max_seq_len", c.max_seq_len);
  read_field(j, "first_k_dense", c.first_k_dense);
  read_field(j, "dense_hidden", c.dense_hidden);
  read_field(j, "n_routed_experts", c.n_routed_experts);
  read_field(j, "n_shared_experts", c.n_shared_experts);
  read_field(j, "top_k", c.top_k);
  read_field(j, "expert_hidden", c.expert_hidden);
  std::string s;
  if (j.contains("gating")) {
    read_field(j, "gating", s);
    CM_CHECK(s == "softmax" || s == "sigmoid", "use \"softmax\" or \"sigmoid\"",
             "unknown gating '{}'", s);
    c.gating = s == "softmax" ? Gating::softmax : Gating::sigmoid;
  }
  read_field(j, "n_groups", c.n_groups);
  read_field(j, "topk_groups", c.topk_groups);
  read_field(j, "bias_update_rate", c.bias_update_rate);
  read_field(j, "aux_loss_alpha", c.aux_loss_alpha);
  read_field(j, "capacity_factor", c.capacity_factor);
  if (j.contains("drop_policy")) {
    read_field(j, "drop_policy", s);
    CM_CHECK(s == "token_order" || s == "low_score", "use \"token_order\" or \"low_score\"",
             "unknown drop_policy '{}'", s);
    c.drop_policy = s == "token_order" ? DropPolicy::token_order : DropPolicy::low_score;
  }
  read_field(j, "rope_theta", c.rope_theta);
  read_field(j, "norm_eps", c.norm_eps);
  read_field(j, "init_std", c.init_std);
  read_field(j, "tied_embeddings", c.tied_embeddings);
  if (j.contains("precision")) {
    read_field(j, "precision", s);
    c.precision = parse_precision(s);
  }
  return c;
}

nlohmann::json to_json(const ModelConfig& c) {
  return nlohmann::json{{"vocab_size", c.vocab_size},
                        {"d_model", c.d_model},
                        {"n_layers", c.n_layers},
                        {"n_heads", c.n_heads},
                        {"n_kv_heads", c.n_kv_heads},
                        {"max_seq_len", c.max_seq_len},
                        {"first_k_dense", c.first_k_dense},
                        {"dense_hidden", c.dense_hidden},
                        {"n_routed_experts", c.n_routed_experts},
                        {"n_shared_experts", c.n_shared_experts},
                        {"top_k", c.top_k},
                        {"expert_hidden", c.expert_hidden},
                        {"gating", gating_name(c.gating)},
                        {"n_groups", c.n_groups},
                        {"topk_groups", c.topk_groups},
                        {"bias_update_rate", c.bias_update_rate},
                        {"aux_loss_alpha", c.aux_loss_alpha},
                        {"capacity_factor", c.capacity_factor},
                        {"drop_policy", drop_policy_name(c.drop_policy)},
                        {"rope_theta", c.rope_theta},
                        {"norm_eps", c.norm_eps},
                        {"init_std", c.init_std},
                        {"tied_embeddings", c.tied_embeddings},
                        {"precision", precision_name(c.precision)}};
}

ModelConfig load_model_config(const std::string& path) {
  std::ifstream in(path);
  CM_CHECK(in.good(), "check the path", "cannot open model config '{}'", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    CM_THROW(InvalidArgument, "fix the JSON syntax", "cannot parse '{}': {}", path, e.what());
  }
  return model_config_from_json(j.contains("model") ? j.at("model") : j);
}

std::vector<std::string> config_differences(const ModelConfig& a, const ModelConfig& b) {
  std::vector<std::string> out;
  auto ja = to_json(a), jb = to_json(b);
  for (const auto& [key, value] : ja.items())
    if (value != jb.at(key)) out.push_back(fmt::format("{}: {} vs {}", key, value.dump(), jb.at(key).dump()));
  return out;
}

ParamCount count_params(const ModelConfig& c) {
  const int64_t C = c.d_model, D = c.head_dim(), V = c.vocab_size;
  const int64_t attn = C * (c.n_heads * D) + 2 * C * (c.n_kv_heads * D) + (c.n_heads * D) * C;
  const int64_t norms = 2 * C;
  const int64_t dense_ffn = 3 * C * c.dense_hidden;
  const int64_t expert = 3 * C * c.expert_hidden;
  const int64_t shared = c.n_shared_experts * expert;
  const int64_t router = int64_t(c.n_routed_experts) * C;
  ParamCount p;
  p.embedding = V * C * (c.tied_embeddings ? 1 : 2);
  p.total = p.active = p.embedding + C;  // + final norm
  for (int l = 0; l < c.n_layers; ++l) {
    int64_t common = attn + norms;
    if (c.is_moe_layer(l)) {
      p.total += common + shared + router + c.n_routed_experts * expert;
      p.active += common + shared + router + c.top_k * expert;
      p.expert += c.n_routed_experts * expert;
    } else {
      p.total += common + dense_ffn;
      p.active += common + dense_ffn;
    }
  }
  return p;
}

double flops_per_token(const ModelConfig& c, int seq_len) {
  ParamCount p = count_params(c);
  // The embedding lookup is not a matmul; the LM head is (tied or not).
  double matmul_params = double(p.active) - double(c.vocab_size) * c.d_model * (c.tied_embeddings ? 0 : 1);
  double attn = 6.0 * c.n_layers * double(seq_len) * c.n_heads * c.head_dim();
  return 6.0 * matmul_params + attn;
}

MemoryEstimate estimate_memory(const ModelConfig& c, int micro_batch, int seq_len) {
  ParamCount p = count_params(c);
  MemoryEstimate m;
  m.weights = p.total * 4;
  m.gradients = p.total * 4;
  m.optimizer = p.total * 8;
  const int64_t N = int64_t(micro_batch) * seq_len, C = c.d_model, D = c.head_dim(),
                H = c.n_heads, Hkv = c.n_kv_heads, V = c.vocab_size, E = c.n_routed_experts,
                K = c.top_k, F = c.expert_hidden, SF = int64_t(c.n_shared_experts) * F,
                Fd = c.dense_hidden;
  // One saved row of `width` elements that only a block GEMM reads (its
  // input, kept for the wgrad): f32, bf16, or fp8 codes + one f32 scale per 128.
  auto gemm_row = [&](int64_t width) -> int64_t {
    switch (c.precision) {
      case Precision::f32: return 4 * width;
      case Precision::bf16: return 2 * width;
      case Precision::fp8: return width + 4 * ((width + 127) / 128);
    }
    return 4 * width;
  };
  // Per token and layer, f32: residual x and h, q k v after RoPE, the
  // attention output (its backward reads it) and log-sum-exp, two rstd;
  // as a GEMM input: RMSNorm(x) for qkv (wo casts the f32 attention output again).
  const int64_t attn = 4 * (2 * C + (H + 2 * Hkv) * D + H * D + H + 2) + gemm_row(C);
  // Dense FFN: gu = [a1 | a3] f32 (the swiglu backward); RMSNorm(h) and g as GEMM inputs.
  const int64_t dense = 4 * 2 * Fd + gemm_row(C) + gemm_row(Fd);
  // MoE: RMSNorm(h) f32 (the router is f32; the shared experts cast it again),
  // scores (E), the (N,K) routing: selections (i32 + f32), after capacity a
  // second pair when a capacity applies, row_of (i64); per routed row (K per
  // token) gu and ye f32, xp and g as GEMM inputs; shared experts gu f32, g.
  const bool capacity = c.expert_capacity(N) >= 0;
  const int64_t routing = K * (8 + (capacity ? 8 : 0) + 8);
  const int64_t moe = 4 * (C + E) + routing + K * (4 * (2 * F + C) + gemm_row(C) + gemm_row(F)) +
                      (SF > 0 ? 4 * 2 * SF + gemm_row(SF) : 0);
  int64_t per_token = 0, per_batch = 8 * int64_t(seq_len);  // RoPE positions (i64)
  for (int l = 0; l < c.n_layers; ++l) {
    per_token += attn + (c.is_moe_layer(l) ? moe : dense);
    if (c.is_moe_layer(l)) per_batch += 8 * (2 * E + 1);  // counts, group offsets (i64)
  }
  // Final residual and RMSNorm (C each) and rstd, logits and their gradient
  // (V each), log-sum-exp; token ids and targets (i32).
  per_token += 4 * (2 * C + 1 + 2 * V + 1) + 8;
  m.activations = per_token * N + per_batch;
  // bf16 keeps each block-GEMM weight's bf16 copy from the forward to the
  // backward (the forward and the dgrad read it); fp8 quantizes W in the
  // forward and W^T in the backward where they are used.
  if (c.precision == Precision::bf16) {
    const int64_t attn_w = C * (H * D) + 2 * C * (Hkv * D) + (H * D) * C;
    for (int l = 0; l < c.n_layers; ++l)
      m.weight_copies += 2 * (attn_w + (c.is_moe_layer(l) ? 3 * C * (SF + E * F) : 3 * C * Fd));
  }
  return m;
}

}  // namespace coremesh::model
