// Fused communication-computation operators of tensor parallelism (the
// seed's MC2 family; FLUX's and TransformerEngine's split forms): the GEMM
// runs in one chunk per member, each chunk starting as soon as its rows have
// landed or leaving as soon as it is done, ordered by signals only.
//
//   allgather_matmul(x, w)       = all_gather(x) w^T         (SP: enter + column-parallel)
//   matmul_reduce_scatter(h, w)  = reduce_scatter(h w^T)     (SP: row-parallel + exit)
//   matmul_allreduce(h, w)       = all_reduce(h w^T)         (no SP: row-parallel + exit)
//   grouped_matmul_allreduce(h, w, offsets)
//                                = all_reduce(grouped_matmul(h, w, offsets))  (expert-TP: the experts' w2)
//   add_rmsnorm_allreduce(x,y,w) = rmsnorm_residual(x, all_reduce(y), w)
//
// The backward halves are the same operators with the weight read the other
// way (ops::WeightLayout::kn: y = x w): allgather_matmul's dx is
// matmul_reduce_scatter(dy, w, kn), matmul_reduce_scatter's dh is
// allgather_matmul(dy, w, kn) (its gathered dy feeds dw), matmul_allreduce's
// dh is local. The *_backward functions below give both gradients. The
// model's TP seams keep TransformerEngine's bulk form in their backward
// instead (the sum of dx leaves on the comm stream while the weight
// gradients compute, parts.cpp's enter_backward_overlapped), which hides the
// exchange behind the weight-gradient GEMM that a fused dgrad would leave to
// run after it.
//
// Each equals its unfused sequence over ShmemTensor (reference:: below) bit
// for bit: a GEMM's rows do not depend on the rows beside them, and every sum
// adds the members' parts in member order, as ShardedSum does.
//
// The split form. allgather_matmul puts this member's rows into every
// member's inbox on the comm stream and multiplies its own rows meanwhile,
// then each member's rows as their signal arrives (the member after this one
// first, as in a ring). matmul_reduce_scatter computes the rows each member
// owns, the next member's first, and hands each chunk to the comm stream as
// it is done; its own chunk is last, then the copies are summed in member
// order. matmul_allreduce (and its grouped form) cuts the rows into `chunks`; the comm stream
// reduce-scatters and all-gathers chunk c while the compute stream multiplies
// chunk c + 1. add_rmsnorm_allreduce sums only this member's rows, adds the
// residual and normalizes them (1/tp of the norm's work), then all-gathers
// h, y and rstd (packed: one put per peer). Why split rather than ring: on
// shared memory a put is a copy the sender makes, so a ring's tp - 1 hops
// cost the same bytes as direct puts but serialize them; direct puts let
// every member's copies run at once.
//
// Buffers are reused without a handshake: the inbox and the staging have two
// halves, and consecutive calls that put into one use alternate halves. A
// member's puts of a call leave after everything its stream did before (the
// comm stream waits for it), so a peer's call k + 2 -- which waited for this
// member's data of call k + 1 -- cannot overwrite a half this member is still
// reading for call k. Any sequence of calls is safe, not only the
// alternation of a forward and a backward, and no credit message is sent
// (each one a network round trip).
//
// The comm stream runs its copies and sums on `comm_cores` vector cores (the
// GEMMs keep the cube cores). The chunk count and the comm cores are a
// tiling of op "fused_tensor_comm" in the op cache (keyed by tp, capacity,
// rows, the calling stream's limits and whether the operator is a chunked
// all-reduce; heuristic 2 chunks on 1 core, or 1 core), read
// at every call, so the tuner can measure them and a tuning cache sets them.
// They are a protocol between the members (OpTraits::agreed): the tuner
// tries each on every PE at once, and construction refuses PEs whose op
// caches disagree (a tuning cache on some hosts only). FusedCommOptions
// fixes them instead. Inputs f32 (allgather_matmul: f32 or bf16, the
// weight's dtype free as in ops::matmul); outputs f32.
//
// FP8 forms (DeepSeek-V3's block scales: inputs in 1x128 tiles along a row,
// weights in 128x128 blocks): the same exchanges around ops::matmul_fp8 per
// chunk. allgather_matmul moves the rows as fp8 data + their scales (a
// quarter of f32's bytes, two puts per peer); a row's tiles lie in the row,
// so quantizing this member's rows before the gather gives the bits of
// quantizing the gathered rows after it, which is the unfused sequence.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "coremesh/ops/grouped_gemm.hpp"
#include "coremesh/ops/norm.hpp"
#include "coremesh/ops/quant.hpp"
#include "coremesh/parallel/comm.hpp"
#include "coremesh/runtime/op_cache.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::parallel {

class ShmemTensor;

struct FusedCommOptions {
  static constexpr int kMaxChunks = 8;
  int chunks = 0;      // matmul_allreduce's row chunks, 1..kMaxChunks (0: the op cache's)
  int comm_cores = 0;  // vector cores of the comm stream's copies and sums (0: the op cache's)
};

class FusedTensorComm {
 public:
  // Collective over the job (symmetric allocation). `capacity`: elements of
  // the largest whole tensor a call moves (N x K of a gathered input, N x C
  // of a partial output); `max_rows` the most rows N of one.
  FusedTensorComm(Group group, int64_t capacity, int64_t max_rows, FusedCommOptions options = {});
  ~FusedTensorComm();
  FusedTensorComm(const FusedTensorComm&) = delete;
  FusedTensorComm& operator=(const FusedTensorComm&) = delete;

  struct Gathered {
    Tensor y;         // (tp n, O) f32
    Tensor gathered;  // (tp n, K) in x's dtype, every member's rows in member order (keep_input)
  };
  // x (n, K) this member's rows, w (O, K): y = gather(x) w^T (kn: w (K, O), y = gather(x) w).
  Gathered allgather_matmul(const Tensor& x, const Tensor& w, bool keep_input = true,
                            ops::WeightLayout layout = ops::WeightLayout::nk);
  // h (N, F), w (C, F) (kn: (F, C)): this member's rows [me N / tp, (me + 1) N / tp) of
  // the members' h w^T summed in member order (N % tp == 0).
  Tensor matmul_reduce_scatter(const Tensor& h, const Tensor& w, ops::WeightLayout layout = ops::WeightLayout::nk);
  // h (N, F), w (C, F) (kn: (F, C)): the members' h w^T summed in member order, on every member.
  Tensor matmul_allreduce(const Tensor& h, const Tensor& w, ops::WeightLayout layout = ops::WeightLayout::nk);

  // The backward of the three (f32; nk weights): the gradients of the input
  // (this member's share, as the forward took it) and of w (this member's
  // part: the TP ranks hold different w). dy as the forward returned y.
  struct Grads {
    Tensor dx, dw;
  };
  // y = gather(x) w^T: dx = reduce_scatter(dy w) (n, K), dw = dy^T gather(x) (O, K).
  Grads allgather_matmul_backward(const Tensor& dy, const Tensor& gathered, const Tensor& w);
  // y = reduce_scatter(h w^T), dy (N / tp, C): dh = gather(dy) w (N, F), dw = gather(dy)^T h (C, F).
  Grads matmul_reduce_scatter_backward(const Tensor& dy, const Tensor& h, const Tensor& w);
  // y = all_reduce(h w^T), dy (N, C) the same on every member: dh = dy w, dw = dy^T h (no exchange).
  static Grads matmul_allreduce_backward(const Tensor& dy, const Tensor& h, const Tensor& w);
  // h (N, F) grouped by the group list offsets (G + 1) i64 (read on the
  // stream, as ops::grouped_matmul does), w (G, C, F): the members' grouped
  // products summed in member order, on every member. A group may straddle
  // a chunk: each chunk multiplies its rows of the groups it meets.
  Tensor grouped_matmul_allreduce(const Tensor& h, const Tensor& w, const Tensor& offsets);
  // x (N, C) the residual stream (the same on every member), y (N, C) this
  // member's part of its update, w (C): h = x + sum(y), y' = rmsnorm(h) w.
  ops::RMSNormResidualOut add_rmsnorm_allreduce(const Tensor& x, const Tensor& y, const Tensor& w, float eps);

  // The fp8 forms: x / h quantized activations (ops::quantize_fp8_act), w a
  // quantized weight (ops::quantize_fp8_weight).
  struct GatheredFp8 {
    Tensor y;                         // (tp n, O) f32
    ops::QuantizedTensor gathered;    // (tp n, K) data + (tp n, ceil(K/128)) scales, member order
  };
  GatheredFp8 allgather_matmul(const ops::QuantizedTensor& x, const ops::QuantizedTensor& w);
  Tensor matmul_reduce_scatter(const ops::QuantizedTensor& h, const ops::QuantizedTensor& w);
  Tensor matmul_allreduce(const ops::QuantizedTensor& h, const ops::QuantizedTensor& w);
  // w by ops::quantize_fp8_weight of the (G, C, F) experts' weights.
  Tensor grouped_matmul_allreduce(const ops::QuantizedTensor& h, const ops::QuantizedTensor& w, const Tensor& offsets);
  // Their backward halves (DeepSeek-V3's, docs/architecture.md "Precision"):
  // the dgrad with dy in 1x128 tiles along O and w^T in 128x128 blocks, the
  // exchange fused as in f32; the wgrad ops::matmul_fp8_wgrad (1x128 tiles
  // along the tokens) of dy and the forward's fp8 rows re-tiled. dy f32, w the
  // f32 master (O, K). matmul_reduce_scatter's wgrad reads the gathered dy's
  // fp8 values (gathered once, as fp8, for both products).
  Grads allgather_matmul_backward(const Tensor& dy, const ops::QuantizedTensor& gathered, const Tensor& w);
  Grads matmul_reduce_scatter_backward(const Tensor& dy, const ops::QuantizedTensor& h, const Tensor& w);

  // Symmetric bytes one PE allocates for these arguments (to size the heap).
  static int64_t symmetric_bytes(int tp, int64_t capacity, int64_t max_rows, FusedCommOptions options = {});

  const Group& group() const { return group_; }
  const FusedCommOptions& options() const { return options_; }  // as constructed
  // What the next call on the current stream uses (the options, else the op
  // cache's tiling): of the chunked all-reduces, or (chunked false) of the
  // operators that cut one chunk per member (only their comm cores count).
  FusedCommOptions resolved(bool chunked = true) const;
  // Bytes this PE has put (data, not signals), counted as the puts are enqueued.
  int64_t bytes_put() const { return bytes_put_; }

 private:
  enum Word : int;  // the signal words (fused_comm.cpp)
  // What the operators multiply: rows [r0, r1) of their input times w^T into
  // y (r1 - r0, O) f32, on the current stream.
  using RowsGemm = std::function<void(int64_t r0, int64_t r1, Tensor y)>;
  // Puts `parts` (this member's rows, each (n, ...)) into every member's
  // inbox, then calls each(m, member m's parts) for every member, this one
  // first and then as their rows land, on the current stream.
  void gather_rows(const std::vector<Tensor>& parts, const std::function<void(int, const std::vector<Tensor>&)>& each);
  Tensor reduce_scatter_rows(int64_t N, int64_t C, const RowsGemm& gemm);
  Tensor allreduce_rows(int64_t N, int64_t C, const RowsGemm& gemm);
  uint64_t* word(Word w, int index) const;
  // `bytes` from src into member's `dst` (symmetric) at byte `at`, then 1
  // added to its signal word (signal, index).
  void put(runtime::Stream& s, const Tensor& dst, int64_t at, const void* src, int64_t bytes, int member, Word signal,
           int index);
  void wait(runtime::Stream& s, Word w, int index, uint64_t count, const char* what);
  // The byte offset of the half of the inbox or staging a call uses (they alternate).
  int64_t next_half(int64_t& uses) const;
  // Member's slot of `buffer` in `half`, from byte `at`, as a tensor.
  Tensor slot(const Tensor& buffer, int64_t half, int member, int64_t at, Shape shape,
              DType dtype = DType::f32) const;
  std::pair<int64_t, int64_t> rows_of(int64_t n, int member) const;
  // The op cache's key of this comm's chunked all-reduces or other operators
  // on the current stream, their heuristic, and the options a tiling gives.
  runtime::OpKey key(bool chunked) const;
  static runtime::Tiling heuristic(bool chunked);
  FusedCommOptions options_from(const runtime::Tiling& t) const;
  // The comm stream, after `after`'s work so far, on `cores` vector cores.
  runtime::Stream& comm(const runtime::Stream& after, int cores);
  void check_rows(const Tensor& t, const char* call) const;
  void check_fp8(const ops::QuantizedTensor& h, const ops::QuantizedTensor& w, const char* call) const;
  void check_groups(int64_t N, const Tensor& offsets, int64_t groups, int64_t weight_elements, const char* call) const;

  Group group_;
  FusedCommOptions options_;
  int64_t slot_bytes_ = 0, capacity_ = 0, max_rows_ = 0;
  Tensor inbox_, staging_, arena_, signals_;  // symmetric
  std::optional<runtime::Stream> comm_;
  int64_t inbox_uses_ = 0, staging_uses_ = 0;  // calls that put into them so far
  int64_t bytes_put_ = 0;
};

// The unfused sequences the fused operators equal, over a ShmemTensor of the same group.
namespace reference {
FusedTensorComm::Gathered allgather_matmul(ShmemTensor& tp, const Tensor& x, const Tensor& w,
                                           ops::WeightLayout layout = ops::WeightLayout::nk);
Tensor matmul_reduce_scatter(ShmemTensor& tp, const Tensor& h, const Tensor& w,
                             ops::WeightLayout layout = ops::WeightLayout::nk);
Tensor matmul_allreduce(ShmemTensor& tp, const Tensor& h, const Tensor& w,
                        ops::WeightLayout layout = ops::WeightLayout::nk);
FusedTensorComm::Grads allgather_matmul_backward(ShmemTensor& tp, const Tensor& dy, const Tensor& gathered,
                                                 const Tensor& w);
FusedTensorComm::Grads matmul_reduce_scatter_backward(ShmemTensor& tp, const Tensor& dy, const Tensor& h,
                                                      const Tensor& w);
Tensor grouped_matmul_allreduce(ShmemTensor& tp, const Tensor& h, const Tensor& w, const Tensor& offsets);
ops::RMSNormResidualOut add_rmsnorm_allreduce(ShmemTensor& tp, const Tensor& x, const Tensor& y, const Tensor& w,
                                              float eps);
FusedTensorComm::Grads allgather_matmul_backward(ShmemTensor& tp, const Tensor& dy,
                                                 const ops::QuantizedTensor& gathered, const Tensor& w);
FusedTensorComm::Grads matmul_reduce_scatter_backward(ShmemTensor& tp, const Tensor& dy, const ops::QuantizedTensor& h,
                                                      const Tensor& w);
// fp8: x (n, K) f32 this member's rows, gathered and then quantized; h quantized.
FusedTensorComm::GatheredFp8 allgather_matmul(ShmemTensor& tp, const Tensor& x, const ops::QuantizedTensor& w);
Tensor matmul_reduce_scatter(ShmemTensor& tp, const ops::QuantizedTensor& h, const ops::QuantizedTensor& w);
Tensor matmul_allreduce(ShmemTensor& tp, const ops::QuantizedTensor& h, const ops::QuantizedTensor& w);
Tensor grouped_matmul_allreduce(ShmemTensor& tp, const ops::QuantizedTensor& h, const ops::QuantizedTensor& w,
                                const Tensor& offsets);
}  // namespace reference

}  // namespace coremesh::parallel
