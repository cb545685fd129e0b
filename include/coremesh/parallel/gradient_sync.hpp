// Gradient synchronization of one PE's stage (DESIGN.md §7): from the
// model's parameter spans, the buckets and their sums over the PEs that
// share each parameter, the exact global norm, ZeRO-1's shards and the
// table that says where every shard of optimizer state lives.
//
//   buckets   a stage's arena cut into ranges: per part, runs of parameters
//             with one reduction group (dense over dp x cp x ep, routed
//             experts over dp x cp, parameters whose gradient several TP
//             ranks compute parts of over those ranks too; mesh.hpp); the
//             head's replica of a tied table a range of its own. With one
//             stage and one group, ranges are cut at norm-chunk boundaries
//             instead (each range then also holds the start of the next
//             part, which its backward finishes first).
//   sums      a range's sum starts on the communication stream as soon as
//             its part has seen the step's last backward (ShardedSum:
//             reduce-scatter in member order = micro-batch order, so data
//             parallelism is one PE's arithmetic bit for bit); without
//             ZeRO an all-gather gives every member the sums.
//   norm      every PE sums the squares of the shards it owns after the
//             reduce-scatter. Without expert or tensor parallelism this is
//             the 1-PE norm bit for bit: partials per kOptimizerChunk chunk
//             of the whole model's arena, a chunk that straddles PEs
//             assembled on its owner (the PE of its first element) by puts
//             with signals, the partials summed over the world (each chunk
//             non-zero on one PE) and totalled in chunk order. Otherwise
//             each PE's partials of what it alone counts, summed over the
//             world: within rounding of one PE.
//   ZeRO-1    AdamW keeps state for this PE's shards only; after the update
//             the shards' parameters are all-gathered (not the replica's:
//             the pipeline's tied seam refreshes it).
// Every call but the host ones launches on the current stream.
#pragma once

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "coremesh/parallel/comm.hpp"
#include "coremesh/parallel/mesh.hpp"
#include "coremesh/parallel/stage.hpp"
#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::parallel {

class GradientSync {
 public:
  using Range = std::pair<int64_t, int64_t>;  // [begin, end) of a stage's arena
  struct Setup {
    const Mesh* mesh = nullptr;
    int me = 0;                                          // this PE (its world number)
    std::function<StageLayout(int pe)> stage_of;         // every PE's stage
    std::function<std::vector<PartRange>(int pe)> counted_chunks;  // whose parts the PE counts in the norm
    StageParamsOf params_of;
    int zero = 0;
    bool overlap = true;        // sums start as parts finish (false: all at finish())
    int backwards_per_part = 1; // a part's backwards per step (its micro-batches)
  };
  // Collective over the world when it has several PEs (symmetric staging).
  GradientSync(const Setup& setup, StageModel& model, runtime::Device& device);
  ~GradientSync();
  // At most the symmetric bytes one PE's sync allocates for an arena of
  // `arena` floats and `loads` expert counters: the sums' staging (one
  // arena, its shards' alignment), the norm's partials and edge chunks.
  static int64_t symmetric_bytes_bound(int64_t arena, int64_t loads);

  // The arena ranges whose AdamW state PE `pe` keeps, sorted; empty: all of
  // its arena (no ZeRO and no tied replica).
  std::vector<Range> owned_ranges(int pe) const;
  std::vector<Range> owned_ranges() const { return owned_ranges(me_); }
  // Where AdamW state of [b, e) of the arena of `holder` lies: on the
  // PEs that own its shards (ZeRO-1) or on holder itself.
  struct StatePiece {
    int pe;
    int64_t offset;  // in that PE's packed state
    int64_t length;
    int64_t at;      // from b
  };
  std::vector<StatePiece> locate_state(int holder, ReduceGroup group, int tp_sharing, int64_t b, int64_t e) const;

  // ---- the step, on the current stream
  void begin_step();            // counts of the step's backwards start over
  void finish();                // sums not started yet; the stream waits for all of them
  Tensor grad_sq_sum();         // (1): the global sum of squares, on every PE
  void gather_parameters();     // ZeRO-1: the updated shards to every member
  void sum_expert_load();       // the routers' loads over the ranks that see other tokens
  int parts_summed_early() const { return parts_summed_early_; }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;
    int group = 0;   // 0 dense, 1 expert, 2 + i: tp_shared, sharing sharings_[i]
    int part = -1;   // the part whose last backward makes it final (-1: padding)
    bool replica = false;
  };
  struct NormPlan;
  std::vector<Bucket> buckets_of(int pe) const;
  int group_index(ReduceGroup group, int tp_sharing) const;
  std::vector<int> group_members(int pe, int group) const;
  int member_index(int pe, int group) const;
  std::pair<int64_t, int64_t> shard_of(int pe, const Bucket& b) const;
  void on_part_ready(int part);
  void sum_bucket(int index, runtime::Stream& stream);
  void plan_norm();

  Setup setup_;
  const Mesh& mesh_;
  int me_ = 0;
  StageModel& model_;
  bool exact_norm_ = false;     // no expert or tensor parallelism: the 1-PE norm's chunks
  bool norm_chunk_buckets_ = false;
  int64_t align_ = 16;
  std::vector<int> sharings_;   // tp_shared groups' sharing counts
  std::vector<Bucket> buckets_; // this PE's, padded to the world's most
  std::unique_ptr<ShardedSum> grads_, loads_;
  std::unique_ptr<NormPlan> norm_;
  runtime::Stream comm_;
  int parts_ = 0;
  std::vector<int> part_backwards_;
  std::vector<bool> summed_;
  int parts_summed_early_ = 0;
};

}  // namespace coremesh::parallel
