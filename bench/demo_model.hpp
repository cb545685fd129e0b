// The demo model's shapes (bench/train_demo_config.json) for the C++
// benchmarks that build a model themselves: d_model 256, 4 layers, 8 heads,
// 4 kv heads, 1 dense layer then MoE (8 routed experts, top-2, one shared),
// no balance loss, no capacity, tied embeddings; sequences of up to T tokens.
#pragma once

#include "coremesh/model/config.hpp"

namespace coremesh::bench {

inline model::ModelConfig demo_model(int T) {
  model::ModelConfig c;
  c.vocab_size = 256, c.d_model = 256, c.n_layers = 4, c.n_heads = 8, c.n_kv_heads = 4, c.max_seq_len = T;
  c.first_k_dense = 1, c.dense_hidden = 768, c.n_routed_experts = 8, c.n_shared_experts = 1, c.top_k = 2;
  c.expert_hidden = 384, c.gating = model::Gating::sigmoid, c.bias_update_rate = 0.003f;
  c.aux_loss_alpha = 0.0f, c.capacity_factor = 0.0f, c.tied_embeddings = true;
  return c;
}

}  // namespace coremesh::bench
