// One PE's share of a parallel training run (DESIGN.md §7): the mesh and
// this PE's place in it, the model stage it holds (its routed experts), the
// seams over SHMEM, and the gradient synchronization.
//
// Gradients (data and expert parallelism, ZeRO-1):
//   - the arena is cut into buckets, one per part region (and, with expert
//     parallelism, per run of parameters that share a reduction group):
//     dense parameters are summed over dp x cp x ep, routed experts over
//     dp x cp (mesh.hpp), each within one TP coordinate (a TP rank's
//     shards are its own); key/value heads that several TP ranks hold
//     (tp a multiple of the kv heads), and with sequence parallelism the
//     norms and routers (each TP rank sees its rows), over those ranks too;
//   - on the step's last micro-batch, as soon as the model reports a part's
//     gradients ready, its buckets are summed on the communication stream
//     (parallel::ShardedSum: a reduce-scatter in member order, which is the
//     order of the micro-batches: data parallelism is bit-identical to one
//     PE accumulating the same micro-batches), overlapping the rest of the
//     backward; without ZeRO an all-gather gives every member the sums;
//   - the global gradient norm sums per-chunk partials of every PE's shards
//     (exactly the 1-PE norm when no expert or tensor parallelism cuts the
//     arena); a parameter held by several TP ranks counts on the first only;
//   - ZeRO-1: each PE keeps AdamW state for its shards only, updates them and
//     all-gathers the parameters.
// Every call launches on the current stream (the trainer's); nothing waits
// on the host but the per-step statistics after the step's synchronization.
#pragma once

#include <memory>
#include <vector>

#include "coremesh/model/model.hpp"
#include "coremesh/parallel/comm.hpp"
#include "coremesh/parallel/context_parallel.hpp"
#include "coremesh/parallel/expert_parallel.hpp"
#include "coremesh/parallel/mesh.hpp"
#include "coremesh/parallel/tensor_parallel.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/train/checkpoint.hpp"
#include "coremesh/train/optimizer.hpp"

namespace coremesh::train {

struct TrainConfig;

// The expert dispatcher's sizes for a training config (its MoE layers, one
// micro-batch's routed rows, the capacity).
parallel::ShmemExperts::Shape expert_dispatch_shape(const TrainConfig& config);
// The sizes of the tensor-parallel all-reduces: a micro-batch's residual
// stream, the vocabulary-parallel cross entropy's stats ((tp + 1) x tokens)
// and the routed experts' gate weights (tokens x top-k).
std::vector<int64_t> tp_sizes(const TrainConfig& config);

class Distributed {
 public:
  // Collective over the job's PEs (SHMEM must be initialized): every PE
  // constructs it with the same config. Refuses a layout that does not fit.
  Distributed(const TrainConfig& config, runtime::Device& device);
  ~Distributed();

  const parallel::Mesh& mesh() const { return mesh_; }
  int rank() const { return rank_; }
  bool leader() const { return rank_ == 0; }
  // This PE reads micro-batches [data_index * a, (data_index + 1) * a) of
  // each step's data_ranks * a (a = grad_accum).
  int data_index() const { return mesh_.data_index(rank_); }
  int data_ranks() const { return mesh_.data_ranks(); }

  // What this PE's model is built with.
  model::StageLayout stage() const;
  parallel::Seams seams();
  model::Model::ArenaAllocator arena() const;

  // After the model exists (collective): buckets, their sums, ZeRO ranges.
  void attach(model::Model& model);
  // ZeRO-1: the arena ranges whose optimizer state this PE keeps; empty
  // without ZeRO (the whole arena).
  std::vector<AdamW::Range> owned_ranges() const;

  // ---- the step, on the current stream
  void arm();              // the next backward is the step's last: sum buckets as parts finish
  void finish_backward();  // every bucket sent; the stream waits for the sums
  Tensor grad_sq_sum();    // (1) over every PE
  void after_optimizer();  // ZeRO-1: all-gather the updated parameters
  void sum_expert_load();  // the router's load summed over the ranks that share it

  // The allocator of AdamW's m and v: symmetric (the leader reads every PE's
  // for checkpoints), the largest size of any PE (collective).
  model::Model::ArenaAllocator state_allocator() const;

  // ---- checkpoints hold the whole model as one PE's (names, shapes, values)
  // The leader assembles every PE's parameters and AdamW moments by
  // one-sided gets into `params`, `adam_m`, `adam_v` (whole-model tensors, in
  // the whole model's order); collective, the other PEs wait.
  void gather_state(model::Model& model, AdamW& opt, NamedTensors& params, NamedTensors& adam_m,
                    NamedTensors& adam_v);

  // Context parallelism: this PE's tokens of each of the B sequences of T
  // (the chunks of its CP rank); all of them without CP.
  std::vector<int32_t> my_tokens(const std::vector<int32_t>& tokens, int B, int T) const;
  int cp() const { return mesh_.degree(parallel::Dim::cp); }
  // Tensor parallelism: the seam over SHMEM (nullptr without TP).
  const parallel::ShmemTensor* tensor() const { return tensor_.get(); }

  // ---- host, after the step's synchronization
  // Every PE's `local` values, gathered; returns the sum over the PEs that
  // hold different tokens of the step (dp x cp x ep) in rank order.
  double sum_over_data_ranks(double local);
  // Every PE's bytes of symmetric memory, to size the heap.
  static int64_t symmetric_bytes(const TrainConfig& config, int world);

 private:
  void on_part_ready(int part);
  struct Piece {
    int pe;           // the PE that holds it
    int64_t offset;   // in that PE's arena (weights) or AdamW state
    int64_t length;
    int64_t at;       // where it goes, from the start of the requested range
  };
  // Where elements [b, e) of the arena of (ep, tp) index (ep_index, tp_index) live: in the
  // weights of one PE, or (state) the AdamW moments of their ZeRO owners.
  std::vector<Piece> locate(int ep_index, int tp_index, int64_t b, int64_t e, bool state) const;
  // The group of bucket r as the PE `pe` sees it, and pe's index in it.
  parallel::Group group_of(int r, int pe) const;
  // Where each of pe's ZeRO shards starts in its AdamW state.
  int64_t state_offset(int pe, int r) const;

  const TrainConfig& cfg_;
  parallel::Mesh mesh_;
  int rank_ = 0;
  // 0: dense gradients, 1: expert gradients, 2 + i: parameters whose
  // gradient tp_sharing_[i] TP ranks compute parts of
  std::vector<parallel::Group> groups_;
  std::vector<int> tp_sharing_;
  std::unique_ptr<parallel::ShmemExperts> experts_;
  std::unique_ptr<parallel::ShmemContext> context_;
  std::unique_ptr<parallel::ShmemTensor> tensor_;
  model::Model* model_ = nullptr;
  runtime::Stream comm_;
  std::unique_ptr<parallel::ShardedSum> grads_, partials_, load_;
  std::vector<int> ready_part_;  // per bucket: the part whose completion makes it final
  Tensor partial_arena_, load_arena_, host_values_;
  bool armed_ = false;
  bool exact_norm_ = false;  // buckets and shards cut at norm-chunk boundaries
};

}  // namespace coremesh::train
