// The model in parts, and the one function that lays out their parameters.
//
// Parts, in model order (L layers):
//   0          embedding            x = wte[tokens]
//   1 + 2l     attention half of l  x + Wo Attention(RoPE(Wqkv RMSNorm(x)))
//   2 + 2l     FFN half of l        h + FFN(RMSNorm(h)): dense SwiGLU or MoE
//   2L + 1     head                 cross entropy(RMSNorm(x) head^T)
// A stage holds one or two chunks, each a contiguous range of parts
// (interleaved and V-shaped pipeline schedules give one rank two chunks),
// and optionally only a range of the routed experts (expert parallelism).
//
// layout_params() is the only place that decides which parameters exist,
// their shapes and where they sit in a stage's arena; count_params() and
// estimate_memory() are computed from it. Each part's parameters form one
// region of the arena, so a stage allocates only what it holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coremesh/core/tensor.hpp"
#include "coremesh/model/config.hpp"
#include "coremesh/parallel/stage.hpp"

namespace coremesh::model {

enum class PartKind { embedding, attention, ffn, head };
struct Part {
  PartKind kind;
  int layer = -1;  // attention and ffn parts
};
int num_parts(const ModelConfig& config);  // 2 * n_layers + 2
Part part_at(const ModelConfig& config, int index);
std::string part_name(const ModelConfig& config, int index);  // "embedding", "layers.2.attention", ...

// What a stage holds (chunks of parts, experts, TP share) is the parallel
// layer's StageLayout.
using parallel::holds_part;
using parallel::PartRange;
using parallel::StageLayout;

// Fills the defaults and checks the layout against the config: chunks in
// range, non-empty, non-overlapping; an expert range inside [0, E); the
// sizes tensor parallelism splits divisible by tp.
StageLayout resolve_stage(const ModelConfig& config, StageLayout stage);

// What one tensor-parallel rank holds of the split dimensions (Megatron,
// without sequence parallelism): query heads, dense and shared-expert hidden
// units are split by tp. Key/value heads are split when tp divides them;
// when they divide tp instead, each rank holds the one kv head its query
// heads read, shared by kv_sharing ranks (whose gradients of it add up).
// Routed experts are split in their hidden units too (expert-TP). The
// embedding / LM head, norms and routers are not split (every rank of the
// TP group holds them and computes the same gradients).
struct TpShape {
  int64_t heads = 0, kv_heads = 0, dense_hidden = 0, shared_hidden = 0, expert_hidden = 0;
  int64_t kv_head_begin = 0;  // the first kv head held
  int64_t vocab = 0, vocab_begin = 0;  // the rows of the embedding and LM head held (vocabulary parallel)
  int kv_sharing = 1;         // TP ranks that hold the same kv heads
};
TpShape tp_shape(const ModelConfig& config, const StageLayout& stage);
// What is wrong with splitting the model over tp ranks (empty: nothing).
std::vector<std::string> tp_problems(const ModelConfig& config, int tp);

// What parallelism needs to know about a parameter, without the model
// knowing about communication.
enum class ParamGroup { embedding, dense, router, expert, norm };
// The dimension a tensor-parallel split would cut: column (output features,
// dim 0 of an (out,in) weight; dim 1 of a stacked expert weight), row (input
// features), vocab (rows of the embedding / LM head), none (replicated).
enum class TpAxis { none, column, row, vocab };
std::string param_group_name(ParamGroup group);
std::string tp_axis_name(TpAxis axis);

struct ParamInfo {
  std::string name;    // as in the 1-PE checkpoint, e.g. "layers.1.experts.w13"
  Shape shape;         // as held by this stage (experts: E_local x ...)
  int64_t offset = 0;  // in floats, into the stage's arenas (64-byte aligned unless fused)
  int64_t numel = 0;
  int part = 0;        // owning part
  ParamGroup group = ParamGroup::dense;
  TpAxis tp_axis = TpAxis::none;
  bool weight_decay = false;        // matrices decay; norms do not
  int64_t expert_begin = 0;         // routed experts: the first expert held (dim 0)
  // The head's copy of a tied embedding table held in another chunk or
  // stage: whoever holds both sums their gradients (and so keeps them equal).
  bool tied_replica = false;
  // Tensor parallelism: the stage holds, of the whole model's tensor of
  // shape whole_shape seen as tp_view, the slice [tp_begin, tp_begin +
  // tp_size) of dimension tp_dim (tp_dim -1: all of it, or its experts'
  // rows); e.g. experts.w13 (E, 2F, C) seen as (E, 2, F, C), sliced in F.
  // tp_copies TP ranks hold the same values (1: a shard of its own), this
  // rank being the first of them when tp_first; with tp_partial_grad each
  // copy's gradient is a part of the gradient (kv heads read by several
  // ranks' query heads; norms and routers under sequence parallelism).
  Shape whole_shape, tp_view;
  int tp_dim = -1;
  int64_t tp_begin = 0, tp_size = 0;
  int tp_copies = 1;
  bool tp_first = true;
  bool tp_partial_grad = false;
  bool expert() const { return group == ParamGroup::expert; }
};

struct ParamLayout {
  std::vector<ParamInfo> params;
  std::vector<PartRange> regions;  // per part: [begin, end) of params (empty for parts not held)
  std::vector<int64_t> region_offset, region_size;  // per part, in floats of the arena
  int64_t arena_size = 0;          // floats
  int index_of(const std::string& name) const;  // -1 when absent
};
ParamLayout layout_params(const ModelConfig& config, const StageLayout& stage = {});
// The same layout as the parallel engine sees it (parallel/stage.hpp).
parallel::StageParams stage_params(const ModelConfig& config, const StageLayout& stage);
// The sizes the engine lays out its exchanges for: micro-batches of `batch`
// sequences of `seq_len` tokens (one CP rank's), split over tp ranks.
parallel::ModelShape model_shape(const ModelConfig& config, int batch, int seq_len, int tp = 1);

// The part of a whole-model tensor (whole_shape) that the stage holds as p:
// its experts' rows, its tensor-parallel slice (contiguous, p.shape).
Tensor held_part(const ParamInfo& p, const Tensor& whole);
// The inverse: writes `part` (p.shape) into its place in `whole`.
void place_part(const ParamInfo& p, const Tensor& part, Tensor& whole);

struct ParamCount {
  int64_t total = 0;      // every trained parameter
  int64_t active = 0;     // used per token (top-k of the routed experts)
  int64_t embedding = 0;  // token embedding (+ untied head)
  int64_t expert = 0;     // routed expert weights
};
ParamCount count_params(const ModelConfig& config, const StageLayout& stage = {});

// Training FLOPs per token (forward + backward = 3x forward) for sequences of
// length T: 6 * active matmul params + attention scores/values
// (6 * n_layers * T * C, the causal half of 12*L*T*C), as in PaLM/Chinchilla.
double flops_per_token(const ModelConfig& config, int seq_len);

// Bytes of one training micro-batch on the stage. Precision changes the
// saved inputs of the block GEMMs (bf16: 2 bytes, fp8: 1 byte + an f32 scale
// per 128) and, for bf16, adds the weights' bf16 copies; everything else is
// f32. Model::saved_bytes() measures the same storages after a forward.
struct MemoryEstimate {
  int64_t weights = 0;        // fp32 master weights
  int64_t gradients = 0;      // fp32
  int64_t optimizer = 0;      // AdamW m and v, fp32
  int64_t weight_copies = 0;  // bf16 copies of the block-GEMM weights, kept from forward to backward
  int64_t activations = 0;    // saved for backward, one micro-batch, + the logits' gradient
  int64_t workspace = 0;      // transient: the largest part's backward (its gradients beside its saved tensors)
  int64_t exchange = 0;       // expert parallelism: the sends the exchange keeps until delivered
  // What the host allocator holds besides the parameters' state: one micro-batch's step.
  int64_t step() const { return weight_copies + activations + workspace + exchange; }
  int64_t total() const { return weights + gradients + optimizer + step(); }
};
MemoryEstimate estimate_memory(const ModelConfig& config, int micro_batch, int seq_len,
                               const StageLayout& stage = {});

}  // namespace coremesh::model
