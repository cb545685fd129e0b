#include "coremesh/model/config.hpp"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "coremesh/core/error.hpp"
#include "coremesh/core/fields.hpp"
#include "coremesh/core/json.hpp"

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

int ModelConfig::n_moe_layers() const {
  int n = 0;
  for (int l = 0; l < n_layers; ++l) n += is_moe_layer(l) ? 1 : 0;
  return n;
}

int64_t ModelConfig::expert_capacity(int64_t tokens) const {
  if (capacity_factor <= 0.0f || n_routed_experts == 0) return -1;
  // at most every routed row: a huge factor means no drops (its cast overflowed to a capacity of 1)
  const double rows = double(tokens) * top_k;
  const double c = std::min(rows, std::ceil(double(capacity_factor) * rows / n_routed_experts));
  return std::max<int64_t>(1, int64_t(c));
}

std::vector<std::string> ModelConfig::problems() const {
  // per field (the table's checks), then across fields
  std::vector<std::string> p = model_fields().problems(*this);
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) p.push_back(fmt::format("{} = {} must be positive", name, v));
  };
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
  if (bias_update == BiasUpdate::margin && bias_update_rate > 1.0f)
    p.push_back(fmt::format("bias_update_rate = {} is above 1; with bias_update = margin the rate is the fraction "
                            "of the balancing shift taken per step: use (0, 1], e.g. 0.5",
                            bias_update_rate));
  if (!(rope_theta > 0.0f)) p.push_back(fmt::format("rope_theta = {} must be > 0", rope_theta));
  if (!(norm_eps > 0.0f)) p.push_back(fmt::format("norm_eps = {} must be > 0", norm_eps));
  // typical values are 0.006-0.02; past 1 the first steps' activations overflow (a NaN loss whose hint
  // would blame the learning rate)
  if (!(init_std > 0.0f && init_std <= 1.0f))
    p.push_back(fmt::format("init_std = {:g} must be in (0, 1] (typical: 0.02)", init_std));
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

const FieldTable<ModelConfig>& model_fields() {
  using C = ModelConfig;
  static const FieldTable<C> t =
      FieldTable<C>("model")
          .add("vocab_size", [](C& c) -> auto& { return c.vocab_size; }, "vocabulary size V (256: bytes)", positive<int>())
          .add("d_model", [](C& c) -> auto& { return c.d_model; }, "model width C", positive<int>())
          .add("n_layers", [](C& c) -> auto& { return c.n_layers; }, "decoder layers", positive<int>()).flag("layers")
          .add("n_heads", [](C& c) -> auto& { return c.n_heads; }, "attention heads H", positive<int>()).flag("heads")
          .add("n_kv_heads", [](C& c) -> auto& { return c.n_kv_heads; },
               "key/value heads (GQA; default n_heads)", positive<int>())
          .flag("kv-heads").when_absent([](C& c) { c.n_kv_heads = c.n_heads; })
          .add("max_seq_len", [](C& c) -> auto& { return c.max_seq_len; }, "longest sequence the model accepts",
               in_range<int>(1, 1 << 24))  // windows of seq_len + 1 tokens stay in an int
          .add("first_k_dense", [](C& c) -> auto& { return c.first_k_dense; }, "leading dense layers")
          .add("dense_hidden", [](C& c) -> auto& { return c.dense_hidden; }, "dense SwiGLU hidden size")
          .add("n_routed_experts", [](C& c) -> auto& { return c.n_routed_experts; },
               "routed experts E (0: every layer dense)", non_negative<int>())
          .flag("experts")
          .add("n_shared_experts", [](C& c) -> auto& { return c.n_shared_experts; }, "shared experts",
               non_negative<int>())
          .flag("shared-experts")
          .add("top_k", [](C& c) -> auto& { return c.top_k; }, "experts per token K")
          .add("expert_hidden", [](C& c) -> auto& { return c.expert_hidden; }, "expert SwiGLU hidden size F")
          .add_enum("gating", [](C& c) -> auto& { return c.gating; },
                    {{Gating::softmax, "softmax"}, {Gating::sigmoid, "sigmoid"}}, "router score function")
          .add("n_groups", [](C& c) -> auto& { return c.n_groups; }, "expert groups (group-limited routing)")
          .flag("groups")
          .add("topk_groups", [](C& c) -> auto& { return c.topk_groups; }, "groups kept per token")
          .add("bias_update_rate", [](C& c) -> auto& { return c.bias_update_rate; },
               "aux-loss-free balancing: router bias step per optimizer step (0: off)", non_negative<float>())
          .flag("bias-rate")
          .add_enum("bias_update", [](C& c) -> auto& { return c.bias_update; },
                    {{BiasUpdate::sign, "sign"}, {BiasUpdate::proportional, "proportional"},
                     {BiasUpdate::margin, "margin"}},
                    "bias step per expert: rate x the sign of its load error (DeepSeek-V3), rate x the "
                    "error over the mean load, or rate (0..1] x the shift that would have balanced the step "
                    "(from its selection margins)")
          .add("aux_loss_alpha", [](C& c) -> auto& { return c.aux_loss_alpha; },
               "sequence-wise balance loss weight (0: off)", non_negative<float>())
          .flag("aux-alpha")
          .add("capacity_factor", [](C& c) -> auto& { return c.capacity_factor; },
               "expert capacity factor (<= 0: no capacity, no drops)")
          .add_enum("drop_policy", [](C& c) -> auto& { return c.drop_policy; },
                    {{DropPolicy::token_order, "token_order"}, {DropPolicy::low_score, "low_score"}},
                    "which assignments over capacity are dropped")
          .add("rope_theta", [](C& c) -> auto& { return c.rope_theta; }, "RoPE base")
          .add("norm_eps", [](C& c) -> auto& { return c.norm_eps; }, "RMSNorm epsilon")
          .add("init_std", [](C& c) -> auto& { return c.init_std; }, "standard deviation of the initial weights")
          .add("tied_embeddings", [](C& c) -> auto& { return c.tied_embeddings; },
               "the LM head is the embedding table")
          .add_enum("precision", [](C& c) -> auto& { return c.precision; },
                    {{Precision::f32, "f32"}, {Precision::bf16, "bf16"}, {Precision::fp8, "fp8"}},
                    "inputs of the transformer blocks' GEMMs: f32, bf16 or fp8 (DeepSeek-V3 block "
                    "scaling); master weights stay f32");
  return t;
}

ModelConfig model_config_from_json(const nlohmann::json& j) { return model_fields().from_json(j); }

nlohmann::json to_json(const ModelConfig& c) { return model_fields().to_json(c); }

ModelConfig load_model_config(const std::string& path) {
  const nlohmann::json j = load_user_json(path, "model config", "check the path");
  return model_config_from_json(j.contains("model") ? j.at("model") : j);
}

std::vector<std::string> config_differences(const ModelConfig& a, const ModelConfig& b) {
  return model_fields().differences(a, b);
}

}  // namespace coremesh::model
