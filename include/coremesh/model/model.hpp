// Model: the DeepSeek-V3-style decoder of DESIGN.md §6 — or the stage of it
// that one PE holds — with a manual forward and backward (llm.c style).
//
//   x = wte[tokens]                                        (N, C), N = B*T
//   for each layer l:
//     h = x + Wo . Attention(RoPE(Wq an), RoPE(Wk an), Wv an),  an = RMSNorm(x)
//     x = h + FFN(RMSNorm(h))   FFN = SwiGLU (l < first_k_dense) or MoE
//   logits = RMSNorm(x) head^T, head = wte (tied) or lm_head  (N, V)
//   loss = mean cross entropy + balance loss
//
// The model is built from parts (layout.hpp): the embedding, the attention
// and FFN halves of each layer, the head. A Model holds the parts of one
// stage (by default all of them) in one or two chunks; the parameters of its
// parts live in one fp32 arena, their gradients in a second arena of the
// same layout (one buffer for the optimizer and for reductions).
//
// Micro-batches in flight live in slots: open a slot with its micro-batch,
// run the chunks' forwards, then their backwards (or the input-gradient half
// now and the weight-gradient half later); the slot's activations are freed
// when its last backward ends. Any number of slots may be open.
//
// Gradients: each micro-batch's gradients are computed on their own and
// summed in micro-batch order, ((g0 + g1) + g2)..., the first written
// straight into the gradient arena after zero_grad() (no memset; the first
// weight-gradient GEMM of a step does not read C), later ones into a scratch
// arena added in afterwards, part by part. A data-parallel sum in rank order
// is then the same arithmetic. seal_gradients() zero-fills the parts no
// backward wrote.
//
// Nothing here synchronizes with the host: every call launches kernels on
// the calling thread's current stream and returns. Losses, balance losses
// and expert loads are collected on the stream; read_stats() reads them once
// the stream has been synchronized (after the step).
//
// Communication enters only through the seams (coremesh/parallel/seams.hpp);
// the defaults move nothing.
//
// config.precision (f32, bf16, fp8) sets the inputs of the transformer
// blocks' GEMMs; see docs/architecture.md, "Precision".
// Thread safety: one thread drives a Model.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coremesh/core/tensor.hpp"
#include "coremesh/model/config.hpp"
#include "coremesh/model/layout.hpp"
#include "coremesh/parallel/seams.hpp"

namespace coremesh::model {
namespace detail {
struct GradRef;
struct MoeParams;
struct MoeGrads;
class WgradSink;
class MoeStreams;
}  // namespace detail

// One micro-batch as a stage sees it. tokens (B,T) are read by the stage that
// holds the embedding, targets (B,T) by the one that holds the head (host
// memory, copied at open_slot). loss_scale weighs this micro-batch's loss in
// the step's loss (1 / micro-batches per step).
//
// Instead of host pointers, token_ids and target_ids (B*T) i32 tensors may
// be given: the kernels then read them in place when they run, so their
// owner may refill them for the next run of the same launches (graph mode).
struct MicroBatch {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  int B = 0, T = 0;
  float loss_scale = 1.0f;
  Tensor token_ids, target_ids;
};

// What a step's forwards left on the stream, read after synchronization.
struct StepStats {
  double loss = 0;      // sum over forwards through the head of loss_scale * mean cross entropy
  double aux_loss = 0;  // the same for the balance loss of this stage's MoE layers
  int forwards = 0;     // forwards through the head
  std::vector<std::vector<double>> expert_load;  // per MoE layer held, per expert: selections
  int64_t dropped = 0;  // assignments over capacity
};

class Model final : public parallel::StageModel {
 public:
  // Allocates a zeroed f32 arena of n floats (a parallel layout puts the
  // arenas in symmetric memory); default Tensor::zeros.
  using ArenaAllocator = std::function<Tensor(int64_t n)>;
  explicit Model(const ModelConfig& config, const StageLayout& stage = {}, parallel::Seams seams = {},
                 const ArenaAllocator& arena = {});
  ~Model() override;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const StageLayout& stage() const { return stage_; }
  int num_chunks() const { return int(stage_.chunks.size()); }
  bool holds_embedding() const { return holds_part(stage_, 0); }
  bool holds_head() const { return holds_part(stage_, num_parts(config_) - 1); }

  // Deterministic initialization from `seed`: matrices ~ N(0, init_std)
  // (output projections / sqrt(2 * n_layers)), norms 1, router biases 0.
  // The values are drawn in the whole model's layout order and each stage
  // keeps what it holds, so every layout starts from the 1-PE weights.
  void init_weights(uint64_t seed);

  // ---- parameters
  const std::vector<ParamInfo>& params() const { return layout_.params; }
  const ParamLayout& layout() const { return layout_; }
  int64_t num_params() const { return layout_.arena_size; }  // arena floats (with padding)
  float* param_data() { return weights_.data<float>(); }
  float* grad_data() { return grads_.data<float>(); }
  const Tensor& param_arena() const override { return weights_; }  // (num_params) f32
  const Tensor& grad_arena() const override { return grads_; }
  Tensor param(const std::string& name) const;  // views into the arenas
  Tensor grad(const std::string& name) const;
  std::vector<std::pair<std::string, Tensor>> named_params() const;
  std::vector<std::pair<std::string, Tensor>> named_grads() const;
  // Non-trained state: "layers.<l>.router_bias" (E) per MoE layer held.
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;

  // ---- one stage-wide pass (every chunk; the stage must hold the embedding
  // and the head, i.e. be the whole model): forward() then backward(); the
  // backward frees the slot.
  void forward(int slot, const MicroBatch& batch);
  void backward(int slot);

  // ---- the pieces a pipeline executor drives
  void open_slot(int slot, const MicroBatch& batch);
  // The step's micro-batches, for open_slot(mb) (the pipeline executor's).
  void set_step_batches(std::vector<MicroBatch> batches) { step_batches_ = std::move(batches); }
  void open_slot(int mb) override;
  // Runs chunk `chunk` of the slot: input (N,C) is the previous stage's
  // output (undefined when the chunk starts with the embedding). Returns
  // the chunk's output (N,C), or undefined when it ends with the head.
  Tensor forward_chunk(int slot, int chunk, const Tensor& input = {}) override;
  // d(loss)/d(input) (N,C) of the chunk given d(loss)/d(output) (undefined
  // for the head chunk); undefined when the chunk starts with the embedding.
  // With defer_weight_grads the weight gradients wait for backward_weight().
  Tensor backward_chunk(int slot, int chunk, const Tensor& grad_output = {},
                        bool defer_weight_grads = false) override;
  void backward_weight(int slot, int chunk) override;
  // Drops a slot without a backward (evaluation, generation).
  void close_slot(int slot) override;
  bool slot_open(int slot) const override;
  int open_slots() const { return int(slots_.size()); }
  // Of an open slot whose forward reached the head: the logits (N,V; under
  // tensor parallelism this rank's vocabulary columns, N x V/tp) and the
  // cross entropy per token (N), valid once the stream reached them.
  Tensor logits(int slot) const;
  Tensor token_losses(int slot) const override;

  // ---- gradients
  void zero_grad();       // the next write of every gradient overwrites it
  // Called (on the host, while launching) when a part's gradients of a
  // micro-batch have been added into the arena: from then on the stream
  // holds the part's sum over the step's micro-batches so far. A parallel
  // layout starts reducing the part's gradients at its last micro-batch.
  void on_gradients_ready(std::function<void(int part)> hook) override { on_gradients_ = std::move(hook); }
  // Zero-fills the gradients nothing wrote since zero_grad() (a stage whose
  // parts saw no micro-batch); returns how many parameters that was.
  int seal_gradients();
  // The chunk's gradients in the arena already hold the step's sum over
  // earlier micro-batches that another PE computed (DualPipe's other copy of
  // the stage put it there): the chunk's next weight halves add onto it, as
  // onto a sum of this PE's own. Before any weight half of the chunk.
  void continue_gradient_sum(int chunk) override;

  // ---- statistics and the aux-loss-free balancing
  void reset_stats();
  StepStats read_stats() const;  // the stream must have been synchronized
  // Graph mode: a replayed step writes the statistics tensors that its
  // capture recorded. keep_stats() remembers them after the capture;
  // reuse_stats() makes them current again (dropping what later forwards,
  // e.g. validation, recorded) and zeroes the expert-load counters, which
  // the step adds into. The stream must not be running.
  void keep_stats();
  void reuse_stats();
  // Per MoE layer held: i64 on the stream, selections per expert (E) and
  // dropped assignments (1) since reset_stats(), then with bias_update =
  // margin the selection margins (E x 2 x ops::kMarginBins); a parallel
  // layout sums them over the ranks that share the router before
  // update_router_bias().
  const std::vector<Tensor>& expert_load() const override { return load_; }
  // The aux-loss-free step (ops::update_expert_bias) from expert_load(), on
  // the stream. Call once per optimizer step.
  void update_router_bias();

  // Bytes of the storages a slot keeps for its backward: the saved
  // activations, and the bf16 copies of the block-GEMM weights (0 for f32
  // and fp8). The measured side of estimate_memory().
  struct SavedBytes {
    int64_t activations = 0;
    int64_t weight_copies = 0;
  };
  SavedBytes saved_bytes(int slot) const;
  int64_t saved_activation_bytes(int slot) const override { return saved_bytes(slot).activations; }

  struct Slot;
  struct PartParams;
  struct Pending;

 private:
  friend struct Parts;
  // Beta of the next write of the gradients of params [first, first + count):
  // 0 unless written since zero_grad(); marks them written.
  float take_beta(int first, int count = 1);
  // Arena views of a parameter (its own shape, or `shape` over it and the
  // parameters fused after it).
  Tensor wview(int param, Shape shape = {}) const;
  Tensor gview(int param, Shape shape = {}) const;
  detail::MoeParams moe_params(const PartParams& p) const;
  detail::MoeGrads moe_grads(const PartParams& p) const;
  Slot& slot(int index, const char* what) const;
  const PartParams& part(int index) const;
  class WeightPhase;

  ModelConfig config_;
  StageLayout stage_;
  parallel::Seams seams_;
  std::unique_ptr<detail::MoeStreams> moe_streams_;  // the slices' streams (moe_replicas)
  ParamLayout layout_;
  TpShape tp_;  // this stage's heads and hidden units (all of them without TP)
  Tensor weights_, grads_, scratch_;              // scratch_: later micro-batches' gradients
  std::vector<uint8_t> written_;                    // per parameter: written in this weight phase
  std::vector<int> part_grads_;                     // per part: weight halves since zero_grad()
  std::function<void(int)> on_gradients_;
  std::vector<std::unique_ptr<PartParams>> parts_;  // per part (nullptr when not held)
  std::vector<Tensor> router_bias_;                 // per layer (undefined unless its MoE FFN is held)
  std::map<int, std::unique_ptr<Slot>> slots_;
  std::vector<MicroBatch> step_batches_;            // set_step_batches()
  std::map<std::pair<int, int>, std::unique_ptr<Pending>> pending_;  // deferred wgrads per (slot, chunk)
  // statistics since reset_stats()
  struct Recorded {
    Tensor values;  // (N) token losses or (1) balance loss
    float scale;
  };
  std::vector<Recorded> losses_, aux_losses_;
  int64_t routing_stats_size() const;  // one MoE layer's expert_load() entry
  std::vector<Tensor> load_;                        // per MoE layer held
  struct Kept {
    std::vector<Recorded> losses, aux_losses;
    std::vector<Tensor> load;
  } kept_;                                          // keep_stats()
};

}  // namespace coremesh::model
