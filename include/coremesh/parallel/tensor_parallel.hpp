// Tensor parallelism over SHMEM (Megatron-LM, without sequence parallelism):
// the TensorParallel seam for the tp ranks of a TP group.
//
// Every rank of the group holds the whole residual stream (N,C) and its own
// columns of the column-parallel weights (query / key / value heads, gate
// and up hidden units) and the matching rows of the row-parallel ones (wo,
// w2): a row-parallel product is a partial sum, completed by one all-reduce.
//   enter(x)          = x                enter_backward(dx) = all-reduce(dx)
//   exit(y)           = all-reduce(y)    exit_backward(dy)  = dy
// One all-reduce per half-block in the forward and one in the backward.
//
// The all-reduce is a ShardedSum over the group (comm.hpp): each rank puts
// its copy of every other rank's shard into that rank's staging slot with a
// signal, the owner sums the copies in member order, then puts its summed
// shard into every member. Every member thus holds the same bits (the
// replicated norms, router and embedding see the same inputs on every TP
// rank and stay equal without a reduction of their own). Bytes put per
// all-reduce of n f32 by a rank whose shard holds s: 4 * (n - s) (its copies
// of the others' shards) + 4 * (tp - 1) * s (its sum to the others), i.e.
// 8 * n * (tp - 1) / tp for even shards (bytes_per_all_reduce); bytes_put()
// counts the puts as they are issued.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "coremesh/parallel/comm.hpp"
#include "coremesh/parallel/seams.hpp"

namespace coremesh::parallel {

class ShmemTensor final : public TensorParallel {
 public:
  // Collective over the job (symmetric allocation): `group` the TP ranks,
  // `sizes` the element counts of the tensors reduced (a micro-batch's
  // tokens x C; tokens x top-k for the routed experts' gate weights).
  ShmemTensor(Group group, std::vector<int64_t> sizes);
  ~ShmemTensor() override;

  Tensor enter(const Tensor& x) override { return x; }
  Tensor enter_backward(const Tensor& dx) override { return all_reduce(dx); }
  Tensor exit(const Tensor& y) override { return all_reduce(y); }
  Tensor exit_backward(const Tensor& dy) override { return dy; }
  Tensor all_reduce(const Tensor& x) override;

  int tp() const { return group_.size(); }
  int64_t all_reduces() const { return calls_; }
  int64_t bytes_put() const;  // by this rank since construction, counted as the puts are enqueued
  // The formula: bytes one rank puts per all-reduce of `elements` f32.
  static int64_t bytes_per_all_reduce(int tp, int64_t elements) { return 8 * elements * (tp - 1) / tp; }
  // Symmetric bytes one PE allocates (to size the heap).
  static int64_t symmetric_bytes(int tp, const std::vector<int64_t>& sizes);

 private:
  Group group_;
  std::vector<int64_t> sizes_;  // per range of the arena
  Tensor arena_;
  std::unique_ptr<ShardedSum> sum_;
  int64_t calls_ = 0;
};

}  // namespace coremesh::parallel
