// The parallel plan of a training run (DESIGN.md §7): built once from the
// config, it holds the validated mesh and this PE's place in it, the stage
// this PE's model holds, the seams over SHMEM, the one driver (the pipeline
// executor; a layout without pipeline parallelism is a one-stage schedule)
// and gradient sync. The trainer holds a plan and knows no layout.
//
//   construction   ParallelPlan(config, device), then the model from
//                  stage(), seams() and arena(), then attach(model)
//   a step         run_step(model)          the schedule's actions; sums
//                                           start as parts finish
//                  finish_gradients()       remaining sums, expert loads
//                  grad_sq_sum()            the global norm's square
//                  (the optimizer)
//                  after_optimizer(model)   ZeRO-1's gather, the tied table
//   host, after the step's synchronization: statistics over the PEs, the
//   executed schedule, what a checkpoint gathers.
// A layout of one PE makes no symmetric allocation and no collective call.
// Every call but the host ones launches on the current stream.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "coremesh/parallel/comm.hpp"
#include "coremesh/parallel/config.hpp"
#include "coremesh/parallel/gradient_sync.hpp"
#include "coremesh/parallel/mesh.hpp"
#include "coremesh/parallel/pipeline_executor.hpp"
#include "coremesh/parallel/schedule.hpp"
#include "coremesh/parallel/seams.hpp"
#include "coremesh/parallel/stage.hpp"
#include "coremesh/runtime/device.hpp"

namespace coremesh::parallel {

class ShmemExperts;
class ShmemTensor;
class ShmemContext;

struct PlanConfig {
  ParallelConfig parallel;
  ModelShape shape;          // whole sequences (seq_len before the CP split)
  int micro_batches = 1;     // per step and data-parallel rank (the trainer's grad_accum)
  bool graph = false;        // the step is captured into a graph and replayed
  bool report = false;       // the pipeline's actions are timed for the report
  StageParamsOf params_of;   // the model's layout
};

// Every reason `config` cannot run on `world` PEs, each saying what to
// change: the mesh's degrees, and what combines with what. The one place of
// the layout's compatibility rules.
std::vector<std::string> layout_problems(const PlanConfig& config, int world);

// Parts [0, parts) cut into `stages` contiguous, balanced runs.
std::vector<PartRange> stage_parts(int parts, int stages);
// The schedule a layout runs, in its executed form: the configured one
// (validated) under pp > 1, else 1F1B of one rank (F0 B0 F1 B1 ...).
Schedule plan_schedule(const ParallelConfig& parallel, int micro_batches);

// What a model of this shape lets each dimension split.
SplitSizes split_sizes(const ModelShape& shape);

// What PE `pe` of `config` on `world` PEs holds (its chunks, experts, TP share).
StageLayout stage_of_pe(const PlanConfig& config, int world, int pe);

class ParallelPlan {
 public:
  // Collective over the job's PEs when the layout has several (SHMEM
  // initialized, every PE with the same config).
  ParallelPlan(const PlanConfig& config, runtime::Device& device);
  ~ParallelPlan();

  const Mesh& mesh() const { return mesh_; }
  const Schedule& schedule() const { return executor_->schedule(); }
  int pe() const { return pe_; }
  bool leader() const { return pe_ == 0; }
  int world() const { return mesh_.world(); }
  // This PE reads micro-batches [data_index * a, (data_index + 1) * a) of a
  // step's data_ranks * a (a = micro-batches per rank).
  int data_index() const { return mesh_.data_index(pe_); }
  int data_ranks() const { return mesh_.data_ranks(); }
  int cp() const { return mesh_.degree(Dim::cp); }
  int executor_rank() const { return executor_->rank(); }  // this PE's pipeline rank

  // ---- what the model is built with
  StageLayout stage() const { return stage_of(pe_); }
  StageLayout stage_of(int pe) const;
  Seams seams();
  std::function<Tensor(int64_t)> arena() const;  // zeroed f32 arenas (symmetric on several PEs)
  // After the model exists (collective): gradient sync.
  void attach(StageModel& model);
  // The arena ranges whose AdamW state this PE keeps (empty: all), and the
  // allocator of that state (symmetric: a checkpoint reads it).
  std::vector<GradientSync::Range> owned_ranges() const { return sync_->owned_ranges(); }
  std::function<Tensor(int64_t)> state_allocator() const;
  // Context parallelism: this PE's tokens of each of the B sequences of T.
  std::vector<int32_t> my_tokens(const std::vector<int32_t>& tokens, int B, int T) const;

  // ---- the step, on the current stream
  void run_step(StageModel& model);
  void finish_gradients();
  Tensor grad_sq_sum() { return sync_->grad_sq_sum(); }
  void after_optimizer(StageModel& model);
  void sync_tied_table(StageModel& model) { executor_->sync_tied_table(model); }  // (also after init)
  // One micro-batch (slot 0, opened by the model) forward through every
  // stage: the last stage's token losses (N), undefined elsewhere.
  Tensor forward_only(StageModel& model) { return executor_->forward_only(model); }
  int parts_summed_early() const { return sync_->parts_summed_early(); }

  // ---- host, after the step's synchronization (collective)
  // Element-wise sums over the PEs in PE order.
  std::vector<double> sum_over_world(const std::vector<double>& mine);
  // Every PE's `mine`: per value the sum in PE order and the largest.
  struct Totals {
    double sum = 0, max = 0;
  };
  std::vector<Totals> over_world(const std::vector<double>& mine);
  // Whether this PE reports part `part`'s replicated values (its layer's
  // loads, router bias): the one holder of replica 0, TP rank 0, copy 0.
  bool reports(int part) const;
  // Whether this PE's loss counts (TP ranks hold the same: the first does).
  bool counts_loss() const { return mesh_.coords(pe_)[Dim::tp] == 0; }
  // Every pipeline rank's actions of the last step with their times (ms
  // from the earliest), data replica 0's; empty unless timed.
  struct Executed {
    int rank = 0;
    std::string action, cat;
    double start_ms = 0, end_ms = 0;
  };
  std::vector<Executed> gather_executed();
  const PipelineExecutor::Memory& memory() const { return executor_->memory(); }

  // ---- checkpoints: where the whole model's pieces lie
  // The PE holding pipeline rank `rank`'s stage of ep index `ep`, tp index
  // `tp` in data replica 0; and that stage.
  int holder(int rank, int ep, int tp) const;
  StageLayout holder_stage(int rank, int ep, int tp) const { return stage_of(holder(rank, ep, tp)); }
  // The pipeline rank whose copy-0 chunk holds `part`.
  int rank_of_part(int part) const;
  std::vector<GradientSync::StatePiece> locate_state(int holder, ReduceGroup group, int tp_sharing, int64_t b,
                                                     int64_t e) const {
    return sync_->locate_state(holder, group, tp_sharing, b, e);
  }
  // Blocking read of [at, at + n) of PE pe's symmetric tensor (this PE's).
  void fetch(void* dst, const Tensor& src, int64_t at, int64_t n, int pe) const;
  void barrier() const;  // every PE of the job (no-op on one)

  // Symmetric bytes one PE of `config` needs: the arenas, gradient sync,
  // the executor's layout and the seams, plus kHeapSlack for what others
  // (the job's own collectives) keep there.
  static int64_t symmetric_bytes(const PlanConfig& config, int world);
  static constexpr int64_t kHeapSlack = 16 << 20;

 private:
  std::vector<PartRange> counted_chunks(int pe) const;  // DualPipe: copy 0's

  PlanConfig cfg_;
  Mesh mesh_;
  int pe_ = 0;
  Schedule schedule_;
  runtime::Device& device_;
  std::unique_ptr<ShmemExperts> experts_;
  std::unique_ptr<ShmemTensor> tensor_;
  std::unique_ptr<ShmemContext> context_;
  std::unique_ptr<PipelineExecutor> executor_;
  std::unique_ptr<GradientSync> sync_;
  std::unique_ptr<WorldGather> gather_;
};

}  // namespace coremesh::parallel
