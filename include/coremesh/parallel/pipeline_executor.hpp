// The pipeline executor: walks one rank's actions of any valid schedule
// (schedule.hpp) over a model stage (stage.hpp). A layout without pipeline
// parallelism is a one-stage schedule (F0 B0 F1 B1 ...): one driver for
// every layout.
//
//   messages    F's output and B's (or I's) input gradient cross ranks by a
//               one-sided put with a signal into the receiver's buffer for
//               (kind, chunk, micro-batch); RECV waits for the signal on the
//               stream and copies the data out. No barrier. Stages on one
//               rank (the tip of a V) hand over directly.
//   tied table  the head's stage puts the head's gradient of the table for
//               each micro-batch to the embedding's stage, which adds its
//               rows onto it (the TiedEmbedding seam): one PE's arithmetic.
//               After the optimizer the embedding's stage puts the table
//               into the head's replica.
//   DualPipe    its executed form's SEND_SUM / RECV_SUM carry a chunk's
//               gradient sums and MoE loads to the partner rank (copy 1
//               continues copy 0's sums; copy 0 takes the total); its F&B
//               pairs run their halves on two streams, each with half of the
//               stage's cores.
//   timing      with `timed`, every action is a span on the stream (its
//               start and end, steady clock): the report's executed
//               schedule, and with profiling a named interval on the stage's
//               track of the trace.
// Gradients of a stage are summed in micro-batch order by the model, which
// holds for a schedule that runs each chunk's backwards (or W) in
// micro-batch order. One thread drives an executor; every call launches on
// the current stream.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "coremesh/parallel/schedule.hpp"
#include "coremesh/parallel/seams.hpp"
#include "coremesh/parallel/stage.hpp"
#include "coremesh/parallel/symmetric_layout.hpp"
#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::parallel {

// An action as the trace and the report name it: F, B, I, W, F&B, p2p, grad sum.
std::string action_category(ActionKind kind);

class PipelineExecutor {
 public:
  struct Setup {
    Schedule schedule;                               // valid, in its executed form
    int rank = 0;                                    // this PE's pipeline rank
    std::vector<int> pes;                            // the pipeline's PEs by rank (this replica's)
    ModelShape shape;
    std::function<StageLayout(int rank)> stage_of;   // what each pipeline rank holds
    StageParamsOf params_of;
    bool tied_embeddings = false;
    bool pair_streams = false;  // F&B halves on two streams
    bool timed = false;         // every action's times (the report's executed schedule)
  };
  // The symmetric buffers and signals of `setup` (none for one stage).
  static SymmetricLayout symmetric_layout(const Setup& setup);
  // Collective over the world when the schedule has several ranks.
  PipelineExecutor(Setup setup, runtime::Device& device);
  ~PipelineExecutor();

  const Schedule& schedule() const { return s_.schedule; }
  int rank() const { return s_.rank; }
  // The tied table's seam (nullptr unless the table and the head's replica lie on different ranks).
  TiedEmbedding* tied_seam();

  // This rank's actions of the step over `stage` (micro-batches opened by it).
  void run(StageModel& stage);
  // One micro-batch's forward through every stage (validation, slot 0):
  // the last stage's token losses (N), undefined elsewhere.
  Tensor forward_only(StageModel& stage);
  // After the optimizer: the embedding's table into the head's replica.
  void sync_tied_table(StageModel& stage);

  // The last step's actions (start, end) in steady-clock ns, when timed.
  const std::vector<std::pair<int64_t, int64_t>>& action_times() const { return times_; }
  // This PE's last step, measured while timed: the peak of the activations
  // its open micro-batches keep, and the peak of chunk slots (the
  // simulator's: one chunk's activations of one micro-batch, F to B or W).
  struct Memory {
    int64_t peak_activation_bytes = 0;
    int peak_slots = 0;
  };
  const Memory& memory() const { return memory_; }

 private:
  class Tied;
  enum Region { kRecv, kSignals, kTied, kCopyGrads, kCopyLoads, kLoads, kRegions };
  int pe(int rank) const { return s_.pes[size_t(rank)]; }
  int buffer(bool grad, int chunk, int micro_batch) const;  // a receive buffer's index (and its signal's)
  uint64_t* signal(int index) const;
  void wait(int index, std::string what);
  Tensor receive(bool grad, int chunk, int micro_batch);
  void send(const Tensor& data, const Action& a);
  void run_pair(const Action& fb, const std::function<void()>& forward, const std::function<void()>& backward);
  std::pair<int64_t, int64_t> chunk_range(int chunk) const;
  std::vector<std::pair<int, int>> chunk_layers(int chunk) const;  // (index in expert_load(), layer)
  int sum_signal(int chunk) const;
  void send_sums(StageModel& stage, int chunk);
  void receive_sums(StageModel& stage, int chunk);

  Setup s_;
  StageLayout stage_;
  StageParams params_;
  int64_t rows_ = 0;
  std::vector<Tensor> buf_;  // by Region
  std::unique_ptr<Tied> tied_;
  runtime::Stream pair_;
  // the step in flight: outputs to send or hand over, received inputs, kept sources of puts
  std::map<std::pair<int, int>, Tensor> outputs_, grads_, inputs_, grad_inputs_;
  std::vector<Tensor> keep_;
  std::vector<std::pair<int64_t, int64_t>> times_;
  Memory memory_;
};

}  // namespace coremesh::parallel
