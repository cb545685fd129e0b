// One PE's stage of a pipeline-parallel run (issue 16): the executor that
// walks this rank's actions of any valid schedule (schedule.hpp) over the
// model's chunks, and what keeps the run the 1-PE run bit for bit.
//
//   stages      the model's parts cut into schedule.num_stages() contiguous
//               runs (stage_parts); rank r holds the stages its placement
//               gives its chunks, as a StageLayout of one or two chunks
//   messages    F's output and B's (or I's) input gradient cross ranks by a
//               one-sided put with a signal into the receiver's symmetric
//               buffer for (kind, chunk, micro-batch); RECV waits for the
//               signal on the stream and copies the data out. No barrier.
//               Stages on one rank (the tip of a V) hand over directly.
//   tied table  the head's stage puts the head's gradient of the table for
//               each micro-batch to the embedding's stage, which adds its
//               rows onto it (the TiedEmbedding seam): one PE's arithmetic.
//               After the optimizer the embedding's stage puts the table
//               into the head's replica.
//   norm        the 1-PE norm is a sum of per-chunk partials over the whole
//               model's arena (ops::grad_sq_partials, kOptimizerChunk). Each
//               chunk has one owner, the PE holding its first element: a chunk
//               inside one stage's run is computed where it lies; one that
//               straddles stages is assembled on its owner (puts with
//               signals) and computed there. The partials are summed over the
//               pipeline's PEs (each non-zero on one) and totalled in chunk
//               order.
//   statistics  the loss lives on the last stage, each MoE layer's load on
//               its stage; after the step's synchronization they are
//               gathered on the host (every PE gets them).
//   checkpoints the leader gets every parameter, AdamW moment and router
//               bias from its stage under the 1-PE names.
//   dp, ep      replicas of the pipeline (mesh rank order [DP][PP][EP])
//               read consecutive runs of the step's micro-batches (data
//               index dp·ep + ep); under ep a stage's MoE layers send their
//               tokens to the experts on the stage's ep peers. After the
//               backward each stage's dense gradients are summed over
//               dp x ep, its experts' over dp, in member order (bit-identical
//               to one PE when each replica runs one micro-batch and ep is 1).
//   ZeRO-1      each PE keeps AdamW's m and v for its shards of those sums
//               only, updates them and all-gathers the parameters.
//   tp          each stage is split over its TP group (mesh rank order
//               [DP][PP][EP][TP]) as tensor parallelism splits the whole
//               model; every TP rank of a stage holds the same residual
//               stream, so TP rank t of stage s exchanges activations and
//               gradients with TP rank t of the stages around (the pipeline
//               is one per TP index). Replicated statistics count on TP
//               rank 0.
//
// Gradients of a stage are summed in micro-batch order by the model, which
// holds for a schedule that runs each chunk's backwards (or W) in
// micro-batch order. DualPipe runs its executed form (executed_form():
// copy 1's weight halves after the schedule's 1RECV_SUM of the partner's
// copy-0 sums, send_sums / receive_sums): one PE's sums bit for bit.
// DualPipe's F&B pairs run their halves on two streams (run_pair).
// Thread safety: one thread (the trainer's) drives a Pipeline; every call
// but the host ones launches on the current stream and returns.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "coremesh/model/model.hpp"
#include "coremesh/parallel/comm.hpp"
#include "coremesh/parallel/expert_parallel.hpp"
#include "coremesh/parallel/mesh.hpp"
#include "coremesh/parallel/schedule.hpp"
#include "coremesh/parallel/tensor_parallel.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/train/checkpoint.hpp"
#include "coremesh/train/optimizer.hpp"
#include "coremesh/train/report.hpp"

namespace coremesh::train {

struct TrainConfig;

// Parts [0, num_parts) cut into `stages` contiguous, balanced runs.
std::vector<model::PartRange> stage_parts(const model::ModelConfig& config, int stages);
// The schedule a training config runs (pp, schedule, grad_accum, virtual_stages),
// in its executed form (executed_form(): DualPipe with its gradient sums).
parallel::Schedule pipeline_schedule(const TrainConfig& config);
// What pipeline rank `rank` holds: one chunk per stage its placement gives it.
model::StageLayout pipeline_stage(const model::ModelConfig& config, const parallel::Schedule& schedule, int rank);

// An action's kind as the trace and the report name it: F, B, I, W, F&B, p2p.
std::string action_category(parallel::ActionKind kind);

class Pipeline {
 public:
  // Collective over the job's PEs (SHMEM initialized, dp x pp x ep of them):
  // checks the layout and the schedule, allocates the symmetric buffers.
  // `device` runs the data-parallel sums' communication stream.
  Pipeline(const TrainConfig& config, runtime::Device& device);
  ~Pipeline();

  const parallel::Schedule& schedule() const { return schedule_; }
  int rank() const { return rank_; }  // in the pipeline
  // Reports the statistics every TP rank of a stage holds (TP rank 0's).
  bool first_tp_rank() const { return mesh_.coords(pe(rank_))[parallel::Dim::tp] == 0; }
  bool leader() const;                // PE 0: logs, checkpoints
  // This PE's replica of the pipeline reads micro-batches [data_index * a,
  // (data_index + 1) * a) of each step's data_ranks * a (a = grad_accum);
  // replicas differ in dp and ep.
  int data_index() const { return mesh_.data_index(pe(rank_)); }
  int data_ranks() const { return mesh_.data_ranks(); }
  // What this PE's model is built with.
  model::StageLayout stage() const { return stage_of(rank_); }
  parallel::Seams seams();
  model::Model::ArenaAllocator arena() const;  // symmetric, the largest stage's size
  // After the model exists (collective): the gradient sums over the replicas.
  void attach(model::Model& model);
  // The arena without the head's replica of a tied table (it follows the
  // embedding); under ZeRO-1 this PE's shards of it.
  std::vector<AdamW::Range> owned_ranges() const;
  model::Model::ArenaAllocator state_allocator() const;

  // ---- the step, on the current stream
  // This rank's actions; micro-batch i is batches[i] (tokens and targets).
  void run(const std::vector<model::MicroBatch>& batches);
  // dp x ep > 1: the stage's gradients and the routers' loads summed over
  // the replicas of the stage, in replica order (and key/value heads that
  // several TP ranks share over them; nothing to do for neither). Each part's sum starts on
  // the communication stream once the part's last backward (B or W) of the
  // step has been launched, overlapping the rest of the schedule (DualPipe:
  // after the copies' sum); this call makes the stream wait for them.
  void sum_over_data_ranks();
  // The parts whose sum the last step started from the model's hook, before
  // the end of the schedule (the rest wait for sum_over_data_ranks).
  int parts_summed_early() const { return parts_summed_early_; }
  Tensor grad_sq_sum();    // (1): the 1-PE sum of squares, on every PE (within rounding under ep)
  void sync_tied_table();  // the embedding's table into the head's replica
  // After AdamW: ZeRO-1's all-gather of the parameters, then the tied table.
  void after_optimizer();

  // ---- host
  // Forward only, one batch at a time (validation): the last stage's token
  // losses (N), undefined elsewhere. Synchronizes.
  Tensor forward_only(const model::MicroBatch& batch);
  // Every PE's `local` (at most 4 values), gathered: sum in PE order, and max.
  struct Totals {
    double sum = 0, max = 0;
  };
  std::vector<Totals> over_world(const std::vector<double>& local);
  // Collective, after the step's synchronization: every pipeline rank's
  // actions of the step with their times on the stream (data replica 0), for
  // the report; kept while a report (on any PE) or a profile is asked for.
  void gather_executed();
  const std::vector<ExecutedAction>& executed() const { return executed_; }
  // This PE's last step, measured while its actions are timed: the peak of
  // the activations its open micro-batches keep for their backwards
  // (Model::saved_bytes), and the peak of chunk slots (the simulator's: one
  // chunk's activations of one micro-batch, from its F to its B or W).
  struct Memory {
    int64_t peak_activation_bytes = 0;
    int peak_slots = 0;
  };
  const Memory& memory() const { return memory_; }
  // Every MoE layer's expert load (in layer order) from this stage's
  // (`mine`, the layers it holds, after the step's sums).
  std::vector<std::vector<double>> every_expert_load(const std::vector<std::vector<double>>& mine);
  // Collective: the leader assembles the whole model's tensors.
  void gather_state(model::Model& model, AdamW& opt, NamedTensors& params, NamedTensors& adam_m,
                    NamedTensors& adam_v, NamedTensors& buffers);
  // Symmetric bytes one PE needs (weights, gradients, AdamW, buffers).
  static int64_t symmetric_bytes(const TrainConfig& config);

 private:
  class Tied;
  struct NormPlan;
  model::StageLayout stage_of(int rank) const;  // this PE's ep and tp index
  model::StageLayout stage_of(int rank, int ep_index, int tp_index) const;
  // The chunks whose parts `rank` holds for the whole model (DualPipe: copy 0's).
  std::vector<model::PartRange> canonical_chunks(int rank) const;
  // DualPipe's cSEND_SUM / cRECV_SUM: a chunk's gradient sums and loads to
  // or from the partner (copy 1 continues them, copy 0 takes the total).
  void send_sums(int chunk);
  void receive_sums(int chunk);
  int sum_signal(int chunk) const;
  std::vector<std::pair<int, int>> chunk_layers(int chunk) const;  // MoE (load index, layer)
  std::pair<int64_t, int64_t> chunk_range(int chunk) const;  // of the gradient arena
  // F&B's halves on two streams
  void run_pair(const parallel::Action& fb, bool traced, const std::function<void()>& forward,
                const std::function<void()>& backward);
  void on_part_ready(int part);  // the model's hook: a part's gradients of a micro-batch are in
  void sum_range(int range, runtime::Stream& stream);
  Tensor grad_sq_sum_cut();  // under ep or tp: every PE's partials of what it alone holds, summed
  // The arena ranges whose AdamW state the PE keeps, in arena order.
  std::vector<AdamW::Range> owned_by(int pe) const;
  int pe(int rank) const { return pes_[size_t(rank)]; }  // the PE of a pipeline rank (this replica's)
  void plan_norm(int signal_base);
  int buffer(bool grad, int chunk, int micro_batch) const;  // index of a receive buffer (and its signal)
  uint64_t* signal(int index) const { return static_cast<uint64_t*>(signals_.raw_data()) + index; }
  void wait(int index, std::string what);  // the stream waits for the signal's next round
  Tensor receive(bool grad, int chunk, int micro_batch);
  void send(const Tensor& data, const parallel::Action& a);

  const TrainConfig& cfg_;
  parallel::Schedule schedule_;
  parallel::Mesh mesh_;
  int rank_ = 0;
  std::vector<int> pes_;  // this replica's PEs, by pipeline rank
  int64_t rows_ = 0;  // tokens per micro-batch (N)
  model::Model* model_ = nullptr;
  std::unique_ptr<Tied> tied_;
  std::unique_ptr<parallel::ShmemExperts> experts_;
  std::unique_ptr<parallel::ShmemTensor> tensor_;
  std::unique_ptr<NormPlan> norm_;
  // over the replicas of the stage: ranges of dense (group 0: dp x ep) and
  // expert (group 1: dp) parameters; the routers' loads (dp x ep)
  std::unique_ptr<parallel::ShardedSum> grad_sum_, load_sum_;
  std::unique_ptr<parallel::ShardedSum> cut_sum_;  // the norm's partials under ep, over the world
  int replica_range_ = -1;  // the range of the head's replica of the tied table
  std::vector<int> range_part_;  // per range of grad_sum_: its part (-1: padding)
  std::vector<int> part_backwards_;  // per part: backwards of the step so far
  bool overlap_ = false;  // sums start as parts finish (not DualPipe)
  int parts_summed_early_ = 0;
  runtime::Stream comm_;
  runtime::Stream pair_;  // the backward half of F&B
  bool pair_streams_ = false;
  Tensor cut_partials_, owned_table_;  // owned_table_: this PE's owned ranges and state offsets (checkpoints)
  Tensor load_arena_, copy_grads_, copy_loads_;  // copy_*: DualPipe's partner's
  Tensor recv_, signals_, host_values_, buffers_, load_values_;
  // the step in flight: outputs to send or hand over, received inputs, kept sources of puts
  std::map<std::pair<int, int>, Tensor> outputs_, grads_, inputs_, grad_inputs_;
  std::vector<Tensor> keep_;
  // the step's action times (steady clock ns, written by the stream), all PEs' gathered
  bool timed_ = false;
  std::vector<std::pair<int64_t, int64_t>> times_;
  Tensor times_buffer_;
  std::vector<ExecutedAction> executed_;
  Memory memory_;
};

}  // namespace coremesh::train
