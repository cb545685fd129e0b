// Model: the DeepSeek-V3-style decoder of DESIGN.md §6 on one PE, with a
// manual forward and backward (llm.c style).
//
//   x = wte[tokens]                                        (N, C), N = B*T
//   for each layer l:
//     h = x + Wo . Attention(RoPE(Wq an), RoPE(Wk an), Wv an),  an = RMSNorm(x)
//     x = h + FFN(RMSNorm(h))   FFN = SwiGLU (l < first_k_dense) or MoE
//   logits = RMSNorm(x) head^T, head = wte (tied) or lm_head  (N, V)
//   loss = mean cross entropy + balance loss
//
// Parameters live in one fp32 arena, gradients in a second arena with the
// same layout (one contiguous buffer for the optimizer and for reductions).
// Gradients accumulate over micro-batches until zero_grad().
//
// config.precision (f32, bf16, fp8) sets the inputs of the transformer
// blocks' GEMMs (qkv, wo, dense and shared SwiGLU, routed experts) in the
// forward, dgrad and wgrad; the embedding, the LM head, the router, norms,
// attention and the loss stay f32, and so do the arenas and the optimizer
// state. See docs/architecture.md, "Precision".
//
// Every layer runs on the kernel library (include/coremesh/ops) on the
// calling thread's current stream; forward() and backward() synchronize that
// stream before returning, so the arenas are host-readable afterwards.
// Thread safety: one thread drives a Model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coremesh/core/tensor.hpp"
#include "coremesh/model/config.hpp"

namespace coremesh::model {
namespace detail {
struct MoeParams;
}

struct ParamInfo {
  std::string name;
  Shape shape;
  int64_t offset = 0;   // in floats, into the arenas (64-byte aligned)
  int64_t numel = 0;
  bool weight_decay = false;  // matrices decay; norms do not
  bool expert = false;        // routed expert weights (sharded by EP later)
};

class Model {
 public:
  explicit Model(const ModelConfig& config);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }

  // Deterministic initialization from `seed`: matrices ~ N(0, init_std)
  // (output projections / sqrt(2 * n_layers)), norms 1, router biases 0.
  void init_weights(uint64_t seed);

  // Parameter arena.
  const std::vector<ParamInfo>& params() const { return params_; }
  int64_t num_params() const { return arena_size_; }
  float* param_data() { return weights_.data<float>(); }
  float* grad_data() { return grads_.data<float>(); }
  const Tensor& param_arena() const { return weights_; }  // (num_params) f32
  const Tensor& grad_arena() const { return grads_; }
  Tensor param(const std::string& name) const;  // views into the arena
  Tensor grad(const std::string& name) const;
  std::vector<std::pair<std::string, Tensor>> named_params() const;
  std::vector<std::pair<std::string, Tensor>> named_grads() const;
  // Non-trained state: "layers.<l>.router_bias" (E) per MoE layer.
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;

  // One micro-batch: tokens and targets are (B, T). Returns the mean cross
  // entropy; the balance loss of this micro-batch is aux_loss().
  double forward(const int32_t* tokens, const int32_t* targets, int B, int T);
  double aux_loss() const { return aux_loss_; }
  // A host copy of the last forward's logits (N, V), kept only when
  // keep_logits(true).
  void keep_logits(bool keep) { keep_logits_ = keep; }
  const std::vector<float>& logits() const { return logits_copy_; }
  // Adds the gradient of loss_scale * (cross entropy + aux loss) of the last
  // forward to the gradient arena, or with accumulate = false writes it there
  // (the first micro-batch of a step: no zero_grad() needed, nor its memset).
  void backward(float loss_scale, bool accumulate = true);
  void zero_grad();

  // Bytes of the storages the last forward keeps for the backward: the
  // saved activations, and the bf16 copies of the block-GEMM weights (0 for
  // f32 and fp8). The measured side of estimate_memory().
  struct SavedBytes {
    int64_t activations = 0;
    int64_t weight_copies = 0;
  };
  SavedBytes saved_bytes() const;

  // Routed selections per MoE layer and expert since reset_expert_counts().
  const std::vector<std::vector<double>>& expert_counts() const { return expert_counts_; }
  int64_t dropped_assignments() const { return dropped_; }
  void reset_expert_counts();
  // Aux-loss-free balancing: bias_e += rate * sign(mean load - load_e), from
  // expert_counts(). Call once per optimizer step.
  void update_router_bias();

 private:
  struct Layer;
  struct Acts;
  int64_t add_param(const std::string& name, const Shape& shape, bool decay, bool expert,
                    bool pad = true);
  // Views of one parameter (weights / gradients) with the given shape.
  Tensor pw(int64_t offset, const Shape& shape) const;
  Tensor gw(int64_t offset, const Shape& shape) const;
  detail::MoeParams moe_params(int64_t layer, bool grads) const;

  ModelConfig config_;
  std::vector<ParamInfo> params_;
  int64_t arena_size_ = 0;
  Tensor weights_, grads_;
  std::vector<Layer> layers_;
  int64_t wte_ = 0, final_norm_ = 0, lm_head_ = -1;
  std::vector<Tensor> router_bias_;  // per layer (undefined for dense layers)
  std::unique_ptr<Acts> acts_;
  double aux_loss_ = 0;
  bool keep_logits_ = false;
  std::vector<float> logits_copy_;
  std::vector<std::vector<double>> expert_counts_;
  int64_t dropped_ = 0;
};

}  // namespace coremesh::model
