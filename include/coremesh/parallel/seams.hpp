// The seams where parallelism enters the model. The model (src/model) calls
// these at the places where data would cross PEs and knows nothing of
// communication; src/parallel implements them over SHMEM, and the local
// implementations below (one PE) move nothing: with them the model computes
// exactly what it computed before the seams existed.
//
// Each seam is a forward/backward mirror pair, as in Megatron-Core:
//   ExpertDispatcher  dispatch <-> combine (the backward of dispatch is a
//                     combine, that of combine a dispatch)
//   ContextParallel   RoPE positions of this PE's tokens; attention over keys
//                     and values that may live on other PEs (ring / Ulysses)
//   TensorParallel    enter (copy, or all-gather with sequence parallel) <->
//                     its mirror (all-reduce, or reduce-scatter); exit
//                     (all-reduce, or reduce-scatter) <-> its mirror
// Every call launches on the current stream and returns at once (no host
// synchronization); tensors are f32.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "coremesh/core/tensor.hpp"
#include "coremesh/ops/attention.hpp"
#include "coremesh/ops/quant.hpp"

namespace coremesh::parallel {

// Routed rows to the PEs that hold their experts, and back.
// Notation: R routed rows on this PE (N tokens x K), C width, E experts,
// E_local the experts this PE holds, R_local the rows they compute.
class ExpertDispatcher {
 public:
  struct Dispatched {
    // (R_local, C) grouped by local expert; rows past offsets[E_local] are
    // padding. f32, or in the form the wire carried them (ShmemExperts::
    // Shape::wire): bf16, or f8e4m3 with `scale` (R_local, C / 128) f32,
    // the 1x128 tiles of ops::quantize_fp8_act.
    Tensor rows;
    Tensor scale;
    Tensor offsets;  // (E_local + 1) i64: the group list of `rows`
    // Within each local expert, the rows of source s (another PE's tokens)
    // follow those of source s - 1: (local expert e, source s) owns rows
    // [source_offsets[e * sources + s], source_offsets[e * sources + s + 1]).
    // The experts' weight gradients are summed per source in source order,
    // the order of one PE's micro-batches.
    int sources = 1;
    Tensor source_offsets;
    std::shared_ptr<const void> plan;  // what combine and the backward reuse
    // Shadowed experts (parallel::ExpertBalance): past its experts' groups,
    // `rows` holds one group per shadow slot, this PE's own rows of a hot
    // expert it computes in the owner's place (offsets and source_offsets
    // list them last, one source each), and w13 / w2 hold the weights of
    // every group: this PE's experts', then the shadows'. Undefined: no
    // shadows, the groups are this PE's experts and use the layer's weights.
    Tensor w13, w2;
    // With shadows, the weight gradient's parts (E_local x sources + shadow
    // slots, out, in), one per group: sends the shadow groups' parts to their
    // owners and puts the parts the other sources computed of this PE's
    // shadowed experts into their (expert, source) places, on the stream.
    // `weight` 0: w13, 1: w2. Every PE of the group calls it in the same order.
    std::function<void(const Tensor& parts, int weight)> exchange_parts;
    // The experts' first GEMM of `rows` (FirstGemm below) where the dispatch
    // ran it (R_local, width), grouped as `rows`, zeros past offsets[E_local];
    // undefined: the caller runs it.
    Tensor first;
  };
  // The experts' first GEMM ([w1; w3] of every local expert) that a dispatch
  // may run on each source's rows as they land (alltoallv_grouped_matmul):
  // run(rows, scale, offsets, out) multiplies `rows` (in the form of
  // Dispatched::rows, with `scale` where fp8) grouped by `offsets` (E_local
  // + 1 i64, read on the stream) into out (rows, width) f32 on the current
  // stream, rows past the last group zero. A GEMM's rows do not depend on
  // the rows beside them: the same bits as one GEMM over the grouped rows
  // where the engine is row-exact.
  struct FirstGemm {
    int64_t width = 0;
    std::function<void(const Tensor& rows, const Tensor& scale, const Tensor& offsets, const Tensor& out)> run;
  };
  struct Weights {  // the layer's routed experts on this PE
    Tensor w13, w2;
  };
  // Where an exchange happens: a MoE layer's token slice (moe_replicas
  // slices per layer, each with its own buffers; slice 0 when unsliced).
  struct Site {
    int layer = 0;
    int slice = 0;
  };
  virtual ~ExpertDispatcher() = default;
  // xp (R, C) grouped by global expert: rows [offsets[e], offsets[e+1]) go to
  // expert e; offsets (E + 1) i64 (read on the stream).
  // `weights`: what a shadow of one of this PE's experts computes with.
  // `first`: see FirstGemm (none with shadows: FirstGemm{}).
  virtual Dispatched dispatch(const Tensor& xp, const Tensor& offsets, Site site, const Weights& weights,
                              const FirstGemm& first) = 0;
  // Whether dispatch may return shadow groups (Dispatched::w13 defined).
  virtual bool shadows() const { return false; }
  // y (R_local, C), the experts' outputs -> (R, C) in xp's row order.
  virtual Tensor combine(const Tensor& y, const Dispatched& d) = 0;
  // The experts' second GEMM (w2) fused with combine (grouped_matmul_alltoallv):
  // run(y, begin, end) writes the rows of local experts [begin, end) of y
  // (R_local, C) f32 on the current stream (ops::GroupRange: the other rows
  // untouched, the tail past the last group zeroed by a range ending at
  // E_local). A dispatcher may run it expert by expert, each expert's rows
  // leaving as soon as they are done. By default: all of it, then combine.
  using GroupsGemm = std::function<void(const Tensor& y, int64_t begin, int64_t end)>;
  virtual Tensor matmul_combine(const Tensor& y, const GroupsGemm& gemm, const Dispatched& d) {
    gemm(y, 0, d.offsets.numel() - 1);
    return combine(y, d);
  }
  // Mirrors: d(combine) is a dispatch of dy (R, C) -> (R_local, C); d(dispatch)
  // is a combine of drows (R_local, C) -> (R, C).
  virtual Tensor combine_backward(const Tensor& dy, const Dispatched& d) = 0;
  virtual Tensor dispatch_backward(const Tensor& drows, const Dispatched& d) = 0;

  static ExpertDispatcher& local();  // every expert on this PE: nothing moves
};

// Attention over a sequence that may be split across PEs.
// q (B,T,H,D), k and v (B,T,Hkv,D) of this PE's T tokens; causal.
class ContextParallel {
 public:
  virtual ~ContextParallel() = default;
  // RoPE positions (T) i64 of this PE's tokens of each sequence (zig-zag
  // chunks under ring attention; 0..T-1 on one PE).
  virtual Tensor positions(int64_t T) const = 0;
  virtual ops::AttentionOut attention(const Tensor& q, const Tensor& k, const Tensor& v) = 0;
  virtual ops::AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                 const Tensor& v, const ops::AttentionOut& fwd) = 0;

  static ContextParallel& local();  // the whole sequence on this PE
};

// The input and output of a tensor-parallel region: a column-parallel linear
// reads enter(x), a row-parallel linear's result leaves through exit(y).
class TensorParallel {
 public:
  virtual ~TensorParallel() = default;
  virtual Tensor enter(const Tensor& x) = 0;                // copy | all-gather (SP)
  virtual Tensor enter_backward(const Tensor& dx) = 0;      // all-reduce | reduce-scatter (SP)
  virtual Tensor exit(const Tensor& y) = 0;                 // all-reduce | reduce-scatter (SP)
  virtual Tensor exit_backward(const Tensor& dy) = 0;       // copy | all-gather (SP)
  // The sum over the TP ranks of a quantity each computed a part of, other
  // than the residual stream (e.g. the gate-weight gradient of split experts).
  virtual Tensor all_reduce(const Tensor& x) = 0;
  // This rank's rows of an (N, ...) tensor that every rank computed whole
  // inside a region (e.g. from the router's scores): its rows of the
  // residual stream under sequence parallelism, all of x otherwise.
  virtual Tensor sequence_shard(const Tensor& x) = 0;
  // enter_backward(dx) started on a communication stream: the current stream
  // goes on (with the same linear's weight gradient) and reads the result
  // only after join(). By default (one PE) enter_backward at once.
  virtual Tensor enter_backward_async(const Tensor& dx) { return enter_backward(dx); }
  // The current stream waits for the communication started so far.
  virtual void join() {}
  // The GEMMs at a region's edges fused with its exchanges (fused_comm.hpp,
  // ParallelConfig::fused_comm): where fuses() the model calls these instead
  // of enter / exit around its own GEMMs. The same bits either way.
  virtual bool fuses() const { return false; }
  struct Entered {
    Tensor y;  // enter(x) w^T (N, out) f32
    Tensor x;  // enter(x) (N, in), in x's dtype
  };
  virtual Entered enter_matmul(const Tensor& x, const Tensor& w);  // w (out, in)
  virtual Tensor matmul_exit(const Tensor& h, const Tensor& w);     // exit(h w^T)
  // fp8: x this rank's rows and h quantized (ops::quantize_fp8_act), w by
  // ops::quantize_fp8_weight; the bits of quantizing enter(x) unfused. By
  // default enter(x) is x (one PE; tensor parallelism without SP).
  struct EnteredFp8 {
    Tensor y;                // enter(x) w^T (N, out) f32
    ops::QuantizedTensor x;  // enter(x) quantized (N, in)
  };
  virtual EnteredFp8 enter_matmul(const ops::QuantizedTensor& x, const ops::QuantizedTensor& w);
  virtual Tensor matmul_exit(const ops::QuantizedTensor& h, const ops::QuantizedTensor& w);

  static TensorParallel& local();  // one PE: every call returns its argument
};

// A tied embedding table whose head lies in another chunk or stage
// (pipeline parallelism). One PE computes each micro-batch's gradient of the
// table as the head's product, onto which the embedding adds its rows; with
// this seam the head's stage hands its product over per micro-batch (slot)
// and the embedding's stage starts from it, so the arithmetic stays the same.
// Without it (nullptr) the head's replica keeps a gradient of its own.
class TiedEmbedding {
 public:
  virtual ~TiedEmbedding() = default;
  // Head side: `grad` (V, C) is the head's product for the slot's
  // micro-batch once the stream reaches this point.
  virtual void head_gradient(int slot, const Tensor& grad) = 0;
  // Embedding side: the head's product for the slot's micro-batch, valid on
  // the stream from here on.
  virtual Tensor take_head_gradient(int slot) = 0;
};

// The seams one model stage uses (not owned; they outlive the model).
struct Seams {
  ExpertDispatcher* experts = &ExpertDispatcher::local();
  ContextParallel* context = &ContextParallel::local();
  TensorParallel* tensor = &TensorParallel::local();
  TiedEmbedding* tied = nullptr;  // only where the head holds a replica of the table
  // MoE layers: token slices per micro-batch, each with its own exchange
  // site, and the vector cores of their exchanges' comm stream (0: no
  // limit); ParallelConfig::moe_replicas and comm_cores.
  int moe_replicas = 1;
  int comm_cores = 0;
};

}  // namespace coremesh::parallel
