// ModelConfig: the hyper-parameters of the DeepSeek-V3-style decoder
// (DESIGN.md §6), loaded from JSON and validated with messages that say what
// to change, plus the size arithmetic `coremesh train --dry-run` prints.
//
// Notation used across src/model: B batch, T sequence length, C d_model,
// H query heads, Hkv key/value heads, D head dim (C/H), V vocab, E routed
// experts, K top-k, F expert hidden size, Fd dense hidden size.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "coremesh/core/fields.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace coremesh::model {

enum class Gating { softmax, sigmoid };
// What happens to a (token, expert) assignment over an expert's capacity:
// token_order drops the latest tokens of the micro-batch; low_score drops the
// assignments with the lowest gate weights.
enum class DropPolicy { token_order, low_score };
// The aux-loss-free router-bias step (ops::update_expert_bias).
enum class BiasUpdate { sign, proportional, margin };
// Inputs of the transformer blocks' GEMMs (forward, dgrad and wgrad) and the
// form their saved inputs take: f32, bf16, or fp8 e4m3 with DeepSeek-V3
// fine-grained scales. Master weights, gradients, optimizer state, the
// embedding, LM head, router, norms, attention and loss stay f32
// (docs/architecture.md, "Precision").
enum class Precision { f32, bf16, fp8 };

struct ModelConfig {
  int vocab_size = 256;      // V (byte-level)
  int d_model = 256;         // C
  int n_layers = 4;
  int n_heads = 4;           // H
  int n_kv_heads = 4;        // Hkv; H % Hkv == 0 (GQA), == H (MHA)
  int max_seq_len = 256;     // longest T the model is used with
  int first_k_dense = 1;     // layers [0, first_k_dense) use the dense FFN
  int dense_hidden = 1024;   // Fd
  int n_routed_experts = 8;  // E; 0 makes every layer dense
  int n_shared_experts = 1;  // one SwiGLU of hidden n_shared * F
  int top_k = 2;             // K
  int expert_hidden = 256;   // F
  Gating gating = Gating::softmax;
  int n_groups = 1;          // expert groups for group-limited routing
  int topk_groups = 1;       // groups kept per token
  float bias_update_rate = 0.0f;  // aux-loss-free balancing step (0: off)
  BiasUpdate bias_update = BiasUpdate::sign;
  float aux_loss_alpha = 0.0f;    // sequence-wise balance loss weight (0: off)
  float capacity_factor = 0.0f;   // <= 0: no capacity limit (no drops)
  DropPolicy drop_policy = DropPolicy::token_order;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  float init_std = 0.02f;
  bool tied_embeddings = true;
  Precision precision = Precision::f32;

  int head_dim() const { return d_model / n_heads; }
  bool is_moe_layer(int layer) const { return n_routed_experts > 0 && layer >= first_k_dense; }
  // The margin bias update reads the selection margins the forward counts.
  bool keeps_selection_margins() const { return bias_update == BiasUpdate::margin && bias_update_rate > 0; }
  int n_moe_layers() const;
  // Tokens one expert may take in a micro-batch of `tokens` tokens
  // (ceil(capacity_factor * tokens * K / E)); -1 when unlimited.
  int64_t expert_capacity(int64_t tokens) const;

  // Throws InvalidArgument naming the field, the offending value and what to
  // change. Reports every problem found, not only the first.
  void validate() const;
  // Problems as sentences (empty when valid).
  std::vector<std::string> problems() const;

  bool operator==(const ModelConfig&) const = default;
};

// The field table (name, type, default, help, checks) that JSON, flags and
// config_differences are generated from.
const FieldTable<ModelConfig>& model_fields();
ModelConfig model_config_from_json(const nlohmann::json& j);
nlohmann::json to_json(const ModelConfig& config);
ModelConfig load_model_config(const std::string& path);
// Field-by-field differences "name: a vs b" (used to explain a mismatched
// checkpoint).
std::vector<std::string> config_differences(const ModelConfig& a, const ModelConfig& b);

std::string gating_name(Gating g);
std::string drop_policy_name(DropPolicy p);
std::string precision_name(Precision p);

}  // namespace coremesh::model
