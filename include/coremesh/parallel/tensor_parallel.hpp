// Tensor parallelism over SHMEM (Megatron-LM, with or without sequence
// parallelism): the TensorParallel seam for the tp ranks of a TP group.
//
// Every rank of the group holds its own columns of the column-parallel
// weights (query / key / value heads, gate and up hidden units) and the
// matching rows of the row-parallel ones (wo, w2): a row-parallel product is
// a partial sum over the whole micro-batch (N,C).
//
// Without sequence parallelism every rank holds the whole residual stream
// (N,C) and one all-reduce completes each partial sum:
//   enter(x)          = x                enter_backward(dx) = all-reduce(dx)
//   exit(y)           = all-reduce(y)    exit_backward(dy)  = dy
// With sequence parallelism rank r holds rows [r*N/tp, (r+1)*N/tp) of the
// residual stream (RMSNorm and the residual adds run on them):
//   enter(x)          = all-gather(x)    enter_backward(dx) = reduce-scatter(dx)
//   exit(y)           = reduce-scatter(y) exit_backward(dy) = all-gather(dy)
// Either way two all-reduces' worth of data per half-block and pass.
//
// The all-reduce is a ShardedSum over the group (comm.hpp): each rank puts
// its copy of every other rank's shard into that rank's staging slot with a
// signal, the owner sums the copies in member order (the reduce-scatter),
// then puts its summed shard into every member (the all-gather). Every member
// thus holds the same bits (the replicated norms, router and embedding see
// the same inputs on every TP rank and stay equal without a reduction of
// their own). Sequence parallelism runs the two halves on their own; its
// shards are exactly the ranks' rows. Bytes put by a rank whose shard of n
// f32 holds s: reduce-scatter 4 * (n - s) (its copies of the others'
// shards), all-gather 4 * (tp - 1) * s (its shard to the others), i.e. 4 * n
// * (tp - 1) / tp each for even shards (bytes_per_half), 8 * n * (tp - 1) /
// tp per all-reduce (bytes_per_all_reduce); bytes_put() counts the puts as
// they are issued.
//
// enter_backward_async runs enter_backward on a communication stream of its
// own (one vector core for its copies and sums; its signal waits park without
// a core) after the current stream's work so far; join() makes the current
// stream wait for it. The arithmetic is the same; only the timing changes.
//
// With `fused_rows` > 0 the GEMMs at the regions' edges fuse with these
// exchanges (enter_matmul, matmul_exit over a FusedTensorComm sized for the
// residual stream, sizes[0] = fused_rows x C): allgather_matmul and
// matmul_reduce_scatter under sequence parallelism, matmul_allreduce without.
//
// A gather or scatter reuses the buffers of the previous one without a
// handshake: the peers' signals of one order the other (a scatter's puts
// land after every peer finished the previous gather, and vice versa), so
// sequence-parallel gathers and scatters of one size must alternate, as
// they do in a forward (exit ... enter ... exit) and a backward; a second
// gather in a row is refused.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "coremesh/parallel/comm.hpp"
#include "coremesh/parallel/fused_comm.hpp"
#include "coremesh/parallel/seams.hpp"

namespace coremesh::parallel {

class ShmemTensor final : public TensorParallel {
 public:
  // Collective over the job (symmetric allocation): `group` the TP ranks,
  // `sizes` the element counts of the tensors reduced (a micro-batch's
  // tokens x C; tokens x top-k for the routed experts' gate weights).
  // `sequence_parallel`: the ranks share the residual stream's rows;
  // `overlap`: enter_backward_async runs on the comm stream (else it is
  // enter_backward).
  ShmemTensor(Group group, std::vector<int64_t> sizes, bool sequence_parallel = false, bool overlap = true,
              int64_t fused_rows = 0);
  ~ShmemTensor() override;

  Tensor enter(const Tensor& x) override { return sequence_parallel_ ? all_gather(x) : x; }
  Tensor enter_backward(const Tensor& dx) override {
    return sequence_parallel_ ? reduce_scatter(dx) : all_reduce(dx);
  }
  Tensor exit(const Tensor& y) override { return sequence_parallel_ ? reduce_scatter(y) : all_reduce(y); }
  Tensor exit_backward(const Tensor& dy) override { return sequence_parallel_ ? all_gather(dy) : dy; }
  Tensor all_reduce(const Tensor& x) override;
  Tensor sequence_shard(const Tensor& x) override;
  Tensor enter_backward_async(const Tensor& dx) override;
  void join() override;
  bool fuses() const override { return fused_ != nullptr; }
  Entered enter_matmul(const Tensor& x, const Tensor& w) override;
  Tensor matmul_exit(const Tensor& h, const Tensor& w) override;
  EnteredFp8 enter_matmul(const ops::QuantizedTensor& x, const ops::QuantizedTensor& w) override;
  Tensor matmul_exit(const ops::QuantizedTensor& h, const ops::QuantizedTensor& w) override;

  // x (N/tp, ...) this rank's rows -> (N, ...) every rank's, in rank order.
  Tensor all_gather(const Tensor& x);
  // y (N, ...) this rank's part of a sum -> (N/tp, ...) its rows of the sum
  // (the members' parts added in member order).
  Tensor reduce_scatter(const Tensor& y);

  int tp() const { return group_.size(); }
  bool sequence_parallel() const { return sequence_parallel_; }
  int64_t all_reduces() const { return calls_; }
  int64_t bytes_put() const;  // by this rank since construction, counted as the puts are enqueued
  // The formula: bytes one rank puts per all-reduce of `elements` f32, and
  // per all-gather or reduce-scatter of a tensor of `elements` f32 (whole).
  static int64_t bytes_per_all_reduce(int tp, int64_t elements) { return 8 * elements * (tp - 1) / tp; }
  static int64_t bytes_per_half(int tp, int64_t elements) { return 4 * elements * (tp - 1) / tp; }
  // Symmetric bytes one PE allocates (to size the heap).
  static int64_t symmetric_bytes(int tp, const std::vector<int64_t>& sizes, int64_t fused_rows = 0);

 private:
  enum class Half { none, gather, scatter };
  int range_of(int64_t whole, const Tensor& x, const char* call) const;
  void fused_called();
  Group group_;
  bool sequence_parallel_ = false, overlap_ = true;
  std::vector<int64_t> sizes_;  // per range of the arena
  std::vector<Half> last_half_;  // per range: the sequence-parallel half it ran last
  Tensor arena_;
  std::unique_ptr<ShardedSum> sum_;
  std::unique_ptr<FusedTensorComm> fused_;
  int64_t calls_ = 0;
  std::optional<runtime::Stream> comm_;  // enter_backward_async's
  runtime::Event sent_;
  bool in_flight_ = false;
};

}  // namespace coremesh::parallel
