// Trainer: the training loop.
//
//   for step in [start, steps):
//     zero grads; for each of grad_accum micro-batches: forward, backward (loss scale 1/accum)
//     clip (global norm), AdamW with lr = schedule(step), router-bias update
//     -- all of it queued on the trainer's stream; one host synchronization
//        at the end of the step reads the loss, the norm and the expert load
//     every val_every steps: validation loss over val_batches fixed batches
//       and a short greedy sample
//     every ckpt_every steps: atomic checkpoint
//
// The trainer runs on the device it is given, on a stream of its own whose
// core limit is `cores`; the device's own limits are left alone.
//
// Everything that influences later steps (weights, AdamW moments and step
// count, router biases, data position, RNG) is in the checkpoint, so a
// resumed run continues bit-exactly.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coremesh/graph/exec.hpp"
#include "coremesh/model/config.hpp"
#include "coremesh/model/model.hpp"
#include "coremesh/model/rng.hpp"
#include "coremesh/parallel/config.hpp"
#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/train/checkpoint.hpp"
#include "coremesh/train/data.hpp"
#include "coremesh/train/distributed.hpp"
#include "coremesh/train/metrics.hpp"
#include "coremesh/train/optimizer.hpp"
#include "coremesh/train/pipeline.hpp"
#include "coremesh/train/report.hpp"
#include "coremesh/train/schedule.hpp"

namespace coremesh::train {

struct TrainConfig {
  model::ModelConfig model;
  parallel::ParallelConfig parallel;
  std::vector<std::string> data;  // text files
  double val_fraction = 0.05;
  int batch_size = 8;   // sequences per micro-batch
  int seq_len = 128;
  int grad_accum = 1;   // micro-batches per step (per data-parallel rank)
  int64_t steps = 100;
  double lr = 1e-3, min_lr = 1e-4;
  int64_t warmup_steps = 10;
  AdamWConfig adam;
  uint64_t seed = 1;
  int val_every = 50;   // 0: only at the end
  int val_batches = 8;
  int log_every = 10;
  std::string out_dir = "runs/coremesh";
  int ckpt_every = 0;   // 0: only at the end
  int keep_checkpoints = 3;
  int cores = 0;        // compute cores this PE's kernels may use (its stream's limit); 0: all of the device
  bool report = true;
  int sample_tokens = 64;             // bytes of greedy sample at each validation (0: none)
  std::string sample_prompt = "And "; // its prompt
  bool graph = false;    // capture one step and replay it (see Trainer::queue_step)
  bool progress = true;  // not a config field: the command line's --no-progress

  void validate() const;
  int64_t tokens_per_step() const { return int64_t(batch_size) * seq_len * grad_accum; }
};

// The "train" section's field table; the config file is
// {"model": {...}, "train": {...}, "parallel": {...}} (train fields may also
// stand at the top level).
const FieldTable<TrainConfig>& train_fields();
TrainConfig train_config_from_json(const nlohmann::json& j, TrainConfig base = {});
nlohmann::json to_json(const TrainConfig& c);
// Every difference between two configs, "section.field: a vs b".
std::vector<std::string> config_differences(const TrainConfig& a, const TrainConfig& b);

struct TrainResult {
  int64_t steps_done = 0;
  double final_loss = 0, final_val_loss = -1;
  double mean_tokens_per_s = 0, mean_mfu = 0;
  std::vector<double> final_balance;  // per MoE layer at the last step: busiest expert / mean
  std::string checkpoint, report;
  std::string graph;  // graph mode: describe(graph_summary()), else empty
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

  // Loads a checkpoint (a file, or a directory: its latest), refusing a
  // corrupt or mismatched one.
  void resume(const std::string& path);
  // Trains until `until_step` (default: config steps); saves a checkpoint at
  // the end when save_at_end.
  TrainResult run(int64_t until_step = -1, bool save_at_end = true);
  // One optimizer step in two halves: queue_step() launches all of it on the
  // trainer's stream and returns without waiting; finish_step() waits for
  // it, records its numbers (the MFU is left to run()) and advances step().
  void queue_step();
  StepRecord& finish_step();
  double validate();
  // A greedy continuation of cfg.sample_prompt (cfg.sample_tokens bytes).
  std::string sample();
  std::string save_checkpoint_now();

  int64_t step() const { return step_; }
  // Tokens of one optimizer step over every data-parallel rank.
  int64_t tokens_per_step() const;
  int cores() const { return cores_; }
  int64_t optimizer_state_bytes() const { return opt_->state_bytes(); }
  runtime::Stream& stream() { return stream_; }
  model::Model& model() { return *model_; }
  // The parallel run this PE is part of; nullptr on one PE (and under pp > 1).
  Distributed* distributed() { return dist_.get(); }
  // The pipeline stage this PE runs; nullptr unless pp > 1.
  Pipeline* pipeline() { return pipe_.get(); }
  bool leader() const { return dist_ ? dist_->leader() : !pipe_ || pipe_->leader(); }
  const std::vector<StepRecord>& records() const { return records_; }
  const std::vector<ValRecord>& validation() const { return val_records_; }
  ReportData report_data() const;
  GraphSummary graph_summary() const;

 private:
  CheckpointState checkpoint_state();
  void launch_step();    // the whole step, on the stream
  void capture_step();   // launch_step() captured into step_graph_, and replayed
  void read_step_batches();  // the next step's batches into the graph's inputs
  // micro-batch m of x_, y_ (graph mode: copied into the graph's inputs)
  model::MicroBatch micro_batch(int m, float scale);

  TrainConfig cfg_;
  int cores_ = 1;
  runtime::Stream stream_;
  std::unique_ptr<TextDataset> data_;
  std::unique_ptr<DataLoader> train_loader_, val_loader_;
  std::unique_ptr<Distributed> dist_;
  std::unique_ptr<Pipeline> pipe_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<AdamW> opt_;
  LrSchedule schedule_;
  model::Rng rng_;
  int64_t step_ = 0;
  std::vector<StepRecord> records_;
  std::vector<ValRecord> val_records_;
  std::vector<ExpertLoadRecord> expert_load_;
  std::vector<SampleRecord> samples_;
  // the step in flight between queue_step() and finish_step()
  bool step_queued_ = false;
  double step_start_ = 0;
  Tensor grad_sq_;
  std::vector<int32_t> x_, y_;
  std::vector<std::vector<int32_t>> xs_, ys_;  // pipeline: the step's micro-batches
  ExpertLoadRecord last_load_;
  // graph mode
  int64_t eager_steps_ = 0, graph_step_ = 0;
  std::optional<graph::Exec> step_graph_;
  std::vector<std::pair<Tensor, Tensor>> graph_inputs_;  // per micro-batch: tokens, targets
};

}  // namespace coremesh::train
