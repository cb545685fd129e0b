// Trainer: the training loop.
//
//   for step in [start, steps):
//     zero grads; the parallel plan runs the step's schedule over this PE's
//     micro-batches (one PE: forward, backward of each, loss scale 1/accum)
//     and sums the gradients; clip (global norm), AdamW with lr = lr_.at(step),
//     the plan's after-optimizer work, router-bias update
//     -- all of it queued on the trainer's stream; one host synchronization
//        at the end of the step reads the loss, the norm and the expert load
//     every val_every steps: validation loss over val_batches fixed batches
//       and a short sample (seeded temperature sampling, as `coremesh generate`)
//     every ckpt_every steps: atomic checkpoint
//     the leader appends the step's line to <out_dir>/metrics.jsonl
//     a stop request (stop_when) on any PE: every PE stops after this same
//       step and saves a checkpoint
//   at the end: report.html, drawn from metrics.jsonl
//
// The trainer runs on the device it is given, on a stream of its own whose
// core limit is `cores`; the device's own limits are left alone.
//
// Everything that influences later steps (weights, AdamW moments and step
// count, router biases, data position, RNG) is in the checkpoint, so a
// resumed run continues bit-exactly.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "coremesh/core/file.hpp"
#include "coremesh/graph/exec.hpp"
#include "coremesh/model/config.hpp"
#include "coremesh/model/model.hpp"
#include "coremesh/model/rng.hpp"
#include "coremesh/parallel/plan.hpp"
#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/runtime/tuner.hpp"
#include "coremesh/train/checkpoint.hpp"
#include "coremesh/train/data.hpp"
#include "coremesh/train/metrics.hpp"
#include "coremesh/train/metrics_log.hpp"
#include "coremesh/train/optimizer.hpp"
#include "coremesh/train/report.hpp"
#include "coremesh/train/lr_schedule.hpp"
#include "coremesh/train/tokenizer.hpp"
#include "coremesh/train/train_config.hpp"

namespace coremesh::train {

struct TrainResult {
  int64_t steps_done = 0;
  double final_loss = 0, final_val_loss = -1;  // nats per token
  double final_val_bits_per_byte = -1;
  double mean_tokens_per_s = 0, mean_mfu = 0;
  std::vector<double> final_balance;  // per MoE layer at the last step: busiest expert / mean
  std::string checkpoint, report;
  std::string graph;  // graph mode: describe(graph_summary()), else empty
  bool stopped = false;  // ended early on a stop request, checkpoint saved
};

// What graph mode made of a step: kernels captured, kernels each replay
// runs, and what each pass did.
struct GraphSummary {
  int64_t step = 0;  // the step captured (from 1); 0: no graph (yet)
  int64_t captured_kernels = 0, replayed_kernels = 0;
  std::vector<graph::PassResult> passes;
};
// "graph: step 2 captured as 812 kernels, 790 per replay (matmul_add 8x, ...)"
std::string describe(const GraphSummary& g);

class Trainer {
 public:
  explicit Trainer(const TrainConfig& config, runtime::Device& device = runtime::Device::default_device());
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Loads a checkpoint (a file, or a directory: its latest), refusing a
  // corrupt or mismatched one. The next run() continues the metrics.jsonl
  // of the checkpoint's run (its lines up to the checkpoint's step).
  void resume(const std::string& path);
  // Trains until `until_step` (default: config steps); saves a checkpoint at
  // the end when save_at_end. On the leader, each step appends a line to
  // metrics_path() (the first run() of a trainer starts the file, see
  // MetricsLog) and report.html, when configured, is drawn from that file.
  TrainResult run(int64_t until_step = -1, bool save_at_end = true);
  // One optimizer step in two halves: queue_step() launches all of it on the
  // trainer's stream and returns without waiting; finish_step() waits for
  // it, records its numbers (the MFU is left to run()) and advances step().
  void queue_step();
  StepRecord& finish_step();
  // Asked at the end of every step on every PE. The answers ride on the
  // step's loss sum, so all PEs learn at the same step that one of them was
  // asked to stop (stop_agreed()); run() then saves and returns.
  void stop_when(std::function<bool()> requested) { stop_requested_ = std::move(requested); }
  bool stop_agreed() const { return stop_agreed_; }
  // Validation loss, nats per token; last_val_bits_per_byte() the same loss
  // per byte of the scored text, in bits.
  double validate();
  double last_val_bits_per_byte() const { return last_val_bpb_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // A continuation of cfg.sample_prompt (cfg.sample_tokens tokens) sampled
  // with cfg.sample_temperature and sample_top_k, seed cfg.seed + step().
  std::string sample();
  // Saves the step's checkpoint into out_dir/checkpoints (the newest
  // keep_checkpoints stay); claims out_dir first (below).
  std::string save_checkpoint_now();
  // A trainer writes into out_dir (checkpoints, metrics.jsonl) only once it
  // owns it: when it resumed from one of out_dir's own checkpoints (the
  // checkpoints past it, an abandoned branch, are set aside: set_aside_after),
  // or when the leader found no other run's checkpoints there (start_over:
  // deletes them first, on the leader). run() and save_checkpoint_now() claim
  // it; a caller with its own wording claims it before them. Throws
  // InvalidArgument with `ways_out` as the hint.
  void claim_out_dir(bool start_over = false, const std::string& ways_out = "");

  // The tiling tuner's workload (runtime/tuner.hpp): the whole step on the
  // next step's batches, read once, each run from the state it starts in
  // (put back before every run); its result is this PE's gradients, updated
  // weights and loss. Collective. The trainer is the tuner's: drop it after.
  runtime::TuneWorkload tuning_workload();

  int64_t step() const { return step_; }
  const TrainConfig& config() const { return cfg_; }
  // Tokens of one optimizer step over every data-parallel rank.
  int64_t tokens_per_step() const;
  int cores() const { return cores_; }
  int64_t optimizer_state_bytes() const { return opt_->state_bytes(); }
  runtime::Stream& stream() { return stream_; }
  model::Model& model() { return *model_; }
  // The parallel plan this PE runs (one PE's is a one-stage schedule).
  parallel::ParallelPlan& plan() { return *plan_; }
  bool leader() const { return plan_->leader(); }
  // Every pipeline rank's actions of the last step (pp > 1 with a report or a profile).
  const std::vector<ExecutedAction>& executed() const { return executed_; }
  const std::vector<StepRecord>& records() const { return records_; }
  const std::vector<ValRecord>& validation() const { return val_records_; }
  // <out_dir>/metrics.jsonl (written on the leader only).
  std::string metrics_path() const;
  // The report of the run so far, its series read from metrics_path().
  ReportData report_data() const;
  GraphSummary graph_summary() const;

 private:
  // One thread at a time (the stream, the model's slots and the files are
  // the trainer's own): the public calls enter through a Busy guard, which
  // refuses another thread; the same thread may nest (run() validates).
  class Busy;
  std::atomic<std::thread::id> busy_thread_{};
  int busy_depth_ = 0;
  void check_every_pe_has_this_run();
  void limit_run_ahead();
  void validate_if_missed(bool fresh_log, TrainResult& result);
  CheckpointState checkpoint_state();
  float loss_scale() const;
  void launch_gradients(std::vector<model::MicroBatch> batches);  // up to the summed gradients
  void launch_step();    // the whole step, on the stream
  void capture_step();   // launch_step() captured into step_graph_, and replayed
  std::vector<model::MicroBatch> read_step_batches(float scale);  // this PE's of the next step
  // micro-batch m from tokens x, y (CP: this PE's of them; graph mode:
  // copied into the graph's inputs)
  model::MicroBatch micro_batch(int m, std::vector<int32_t>& x, std::vector<int32_t>& y, float scale);
  // Every MoE layer's expert load, from the PEs that report it.
  std::vector<std::vector<double>> every_expert_load(const std::vector<std::vector<double>>& mine);

  TrainConfig cfg_;
  int cores_ = 1;
  int val_batches_ = 0;  // cfg.val_batches, at most the validation split's whole batches
  runtime::Stream stream_;
  std::unique_ptr<Tokenizer> tokenizer_;  // cfg.tokenizer's, or bytes
  std::unique_ptr<TextDataset> data_;
  std::unique_ptr<DataLoader> train_loader_, val_loader_;
  std::unique_ptr<parallel::ParallelPlan> plan_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<AdamW> opt_;
  LrSchedule lr_;
  model::Rng rng_;
  int64_t step_ = 0;
  int64_t tokens_done_ = 0;  // over every data-parallel rank, since the run began (across resumes)
  std::vector<StepRecord> records_;
  std::vector<ValRecord> val_records_;
  double last_val_bpb_ = -1;
  std::function<bool()> stop_requested_;
  bool stop_agreed_ = false;
  bool validation_stopped_ = false;  // the last validate() ended early on an agreed stop
  std::unique_ptr<MetricsLog> metrics_;  // the leader's, from the first run()
  std::string resumed_from_;             // the checkpoint resume() loaded
  bool owns_out_dir_ = false;            // see claim_out_dir()
  std::shared_ptr<FileLock> out_dir_lock_;  // the leader's, while this trainer may write out_dir
  void report_changed_settings(const nlohmann::json& saved, const std::string& path) const;
  // the step in flight between queue_step() and finish_step()
  bool step_queued_ = false;
  double step_start_ = 0;
  Tensor grad_sq_;
  std::vector<int32_t> x_, y_;                   // micro-batches of other PEs (read past)
  std::vector<std::vector<int32_t>> xs_, ys_;  // this PE's micro-batches of the step
  std::vector<ExecutedAction> executed_;
  ExpertLoadRecord last_load_;
  // graph mode
  int64_t eager_steps_ = 0, graph_step_ = 0;
  std::optional<graph::Exec> step_graph_;
  std::vector<std::pair<Tensor, Tensor>> graph_inputs_;  // per micro-batch: tokens, targets
  bool set_soft_limit_ = false;  // limit_run_ahead() set the host allocator's soft limit
};

}  // namespace coremesh::train
