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

namespace coremesh::model {

enum class PartKind { embedding, attention, ffn, head };
struct Part {
  PartKind kind;
  int layer = -1;  // attention and ffn parts
};
int num_parts(const ModelConfig& config);  // 2 * n_layers + 2
Part part_at(const ModelConfig& config, int index);
std::string part_name(const ModelConfig& config, int index);  // "embedding", "layers.2.attention", ...

struct PartRange {
  int begin = 0, end = 0;  // parts [begin, end)
  bool operator==(const PartRange&) const = default;
};

struct StageLayout {
  std::vector<PartRange> chunks;   // empty: one chunk with every part
  int expert_begin = 0, expert_end = -1;  // routed experts held: [begin, end); end -1: all
  bool operator==(const StageLayout&) const = default;
};
// Fills the defaults and checks the layout against the config: chunks in
// range, non-empty, non-overlapping; an expert range inside [0, E).
StageLayout resolve_stage(const ModelConfig& config, StageLayout stage);
bool holds_part(const StageLayout& stage, int part);

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
  int64_t total() const { return weights + gradients + optimizer + weight_copies + activations; }
};
MemoryEstimate estimate_memory(const ModelConfig& config, int micro_batch, int seq_len,
                               const StageLayout& stage = {});

}  // namespace coremesh::model
