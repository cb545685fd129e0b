// What the parallel engine knows of a model: which parts a PE holds, the
// sizes its exchanges are built for, its parameters as plain spans, and the
// stage interface the pipeline executor drives. The model (src/model)
// produces the spans and implements StageModel, as it implements the seams;
// nothing here knows a model type.
//
// Parts, in model order (L layers): 0 the embedding, 1 + 2l the attention
// half of layer l, 2 + 2l its FFN half, 2L + 1 the head.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "coremesh/core/tensor.hpp"
#include "coremesh/ops/moe_routing.hpp"

namespace coremesh::parallel {

struct PartRange {
  int begin = 0, end = 0;  // parts [begin, end)
  bool operator==(const PartRange&) const = default;
};

// What one PE holds: one or two chunks (contiguous runs of parts), a range
// of the routed experts, its tensor-parallel share.
struct StageLayout {
  std::vector<PartRange> chunks;   // empty: one chunk with every part
  int expert_begin = 0, expert_end = -1;  // routed experts held: [begin, end); end -1: all
  int tp = 1, tp_rank = 0;         // tensor parallelism: this stage's share of the split matrices
  bool sequence_parallel = false;  // tp > 1: the norms and routers compute on 1/tp of the tokens
  int expert_shadows = 0;          // shadow slots per MoE layer (expert_balance; 0: none)
  // ShmemExperts::Shape::fused: the experts' first GEMM per source as its rows
  // land, the forward's rows on the wire in the form that GEMM reads
  bool fused_experts = false;
  bool operator==(const StageLayout&) const = default;
};

inline bool holds_part(const StageLayout& stage, int part) {
  for (const PartRange& r : stage.chunks)
    if (part >= r.begin && part < r.end) return true;
  return false;
}

// The sizes of a model and of one micro-batch that the engine lays out its
// exchanges for.
struct ModelShape {
  int layers = 0;
  std::vector<int> moe_layers;     // the layers whose FFN is a MoE
  int experts = 0, top_k = 0;      // routed experts
  int64_t d_model = 0;
  int heads = 0, kv_heads = 0, head_dim = 0;
  int64_t tp_heads = 0, tp_kv_heads = 0;  // one TP rank's (all of them without TP)
  int64_t tp_expert_hidden = 0;           // a routed expert's hidden units on one TP rank
  DType expert_rows = DType::f32;         // what the experts' first GEMM reads: f32, bf16 or f8e4m3
  int batch = 0, seq_len = 0;      // one micro-batch: batch sequences of seq_len tokens
  int64_t expert_capacity = 0;     // per expert, of one micro-batch's batch x seq_len tokens
  bool balance_loss = false;       // a sequence-wise balance loss (needs whole sequences)
  bool selection_margins = false;  // the routers' statistics hold selection margins (BiasUpdate::margin)
  int parts() const { return 2 * layers + 2; }
  int64_t tokens() const { return int64_t(batch) * seq_len; }
  // i64 routing statistics per MoE layer (StageModel::expert_load()): the
  // selections per expert, the drops, then the selection margins if kept.
  int64_t routing_stats() const {
    return experts + 1 + (selection_margins ? int64_t(experts) * 2 * ops::kMarginBins : 0);
  }
};

// Which PEs sum a parameter's gradient (mesh.hpp's groups).
enum class ReduceGroup { dense, expert, tp_shared };

// One parameter of a stage as gradient sync sees it.
struct ParamSpan {
  int64_t offset = 0, numel = 0;  // floats, in the stage's arenas
  int part = 0;
  ReduceGroup group = ReduceGroup::dense;
  int tp_sharing = 1;             // tp_shared: the TP ranks that compute parts of its gradient
  bool tied_replica = false;      // the head's copy of a tied table held apart from the embedding
  bool counted = true;            // in the gradient norm (the first of TP ranks holding copies)
  bool weight_decay = false;
};

// A stage's parameters: spans in arena order, each part a region.
struct StageParams {
  std::vector<ParamSpan> params;
  std::vector<int64_t> region_offset, region_size;  // per part (size 0 when not held)
  int64_t arena_size = 0;
};
// The params of any stage layout (of any PE): the model's layout function.
using StageParamsOf = std::function<StageParams(const StageLayout&)>;

// A model stage as the pipeline executor drives it. Every call launches on
// the current stream and returns. Slots are micro-batches in flight.
class StageModel {
 public:
  virtual ~StageModel() = default;
  // Opens the slot of micro-batch `mb` of the step (the model knows its tokens).
  virtual void open_slot(int mb) = 0;
  virtual bool slot_open(int mb) const = 0;
  virtual void close_slot(int mb) = 0;
  // Chunk `chunk`'s forward from the previous stage's output (undefined for
  // the embedding's chunk); its output, undefined when it ends with the head.
  virtual Tensor forward_chunk(int mb, int chunk, const Tensor& input) = 0;
  // The input gradient from the output gradient (undefined for the head's
  // chunk); with defer the weight half waits for backward_weight().
  virtual Tensor backward_chunk(int mb, int chunk, const Tensor& grad_output, bool defer) = 0;
  virtual void backward_weight(int mb, int chunk) = 0;
  virtual Tensor token_losses(int mb) const = 0;             // of a slot that reached the head
  virtual int64_t saved_activation_bytes(int mb) const = 0;  // what the slot keeps for its backward

  virtual const Tensor& param_arena() const = 0;
  virtual const Tensor& grad_arena() const = 0;
  // `hook(part)` once a part's gradients of a micro-batch are in the arena.
  virtual void on_gradients_ready(std::function<void(int part)> hook) = 0;
  // The chunk's gradients already hold another PE's sum of earlier
  // micro-batches (DualPipe): the next weight halves add onto it.
  virtual void continue_gradient_sum(int chunk) = 0;
  // Per MoE layer held, in layer order: (E + 1) i64 selections and drops.
  virtual const std::vector<Tensor>& expert_load() const = 0;
};

}  // namespace coremesh::parallel
