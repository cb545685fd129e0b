// The training config: the "train" section's fields, with the model's and
// the parallel layout's sections. The config file is
// {"model": {...}, "train": {...}, "parallel": {...}} (train fields may also
// stand at the top level); one field table makes JSON, flags, diffs and checks.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "coremesh/core/fields.hpp"
#include "coremesh/model/config.hpp"
#include "coremesh/parallel/config.hpp"
#include "coremesh/parallel/plan.hpp"
#include "coremesh/train/optimizer.hpp"

namespace coremesh::train {

struct TrainConfig {
  model::ModelConfig model;
  parallel::ParallelConfig parallel;
  std::vector<std::string> data;  // text files
  std::string tokenizer;          // a SentencePiece .model file; "": bytes (vocab 256)
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
  // A sample at each validation: `coremesh generate`'s seeded temperature
  // sampling (its defaults), seed = seed + steps done, so
  // `generate --seed <that> --temperature .. --top-k ..` on that step's checkpoint repeats it.
  int sample_tokens = 64;             // tokens sampled (0: none)
  std::string sample_prompt = "And "; // its prompt
  double sample_temperature = 0.8;    // 0: greedy (a small model's greedy text repeats "the the")
  int sample_top_k = 40;              // among the k most likely tokens (0: all)
  bool graph = false;    // capture one step and replay it (see Trainer::queue_step)
  bool progress = true;  // not a config field: the command line's --no-progress

  // Every problem at once, each with what to change; need_data false: all
  // but the data (a dry run sizes a config before its data exists).
  void validate(bool need_data = true) const;
  int64_t tokens_per_step() const { return int64_t(batch_size) * seq_len * grad_accum; }
  // A validation samples text where each PE holds a whole model (its layers, heads and sequence).
  bool samples_at_validation() const {
    return sample_tokens > 0 && parallel.pp == 1 && parallel.cp == 1 && parallel.tp == 1;
  }
};

// The "train" section's field table; the config file is
// {"model": {...}, "train": {...}, "parallel": {...}} (train fields may also
// stand at the top level).
const FieldTable<TrainConfig>& train_fields();
TrainConfig train_config_from_json(const nlohmann::json& j, TrainConfig base = {});
// The text of a config file; `source` names it in errors. Bad JSON is an
// InvalidArgument like every other refusal (the parser's message, the hint).
TrainConfig train_config_from_text(std::string_view text, const std::string& source);
nlohmann::json to_json(const TrainConfig& c);
// Every difference between two configs, "section.field: a vs b".
std::vector<std::string> config_differences(const TrainConfig& a, const TrainConfig& b);

// The parallel plan's config of a training config (its model's layout and
// one micro-batch's sizes).
parallel::PlanConfig plan_config(const TrainConfig& config);

// Host memory one rank's step holds beyond what the trainer built (its
// parameters and optimizer state, the data): its micro-batches in flight at
// their peak (a pipeline rank holds several; CP ranks their chunks), the
// largest backward's workspace, bf16's weight copies, the expert exchange's
// sends, a pipeline rank's messages (kept until the step ends); a parallel
// rank twice that (its host runs ahead by a step: the exchanges are queued
// ahead of the compute). The dry run prints it per rank; the trainer holds
// the host to it.
int64_t rank_step_bytes(const TrainConfig& config, int rank);

// The host allocator's soft limit for a rank holding `built` bytes once
// built (Trainer::limit_run_ahead): that and its step, plus 5%.
int64_t run_ahead_limit(int64_t built, int64_t step);

// Host memory one rank's tensors reach in a step, the allocator's cache
// included: host_footprint_limit of its run-ahead limit, built counted as
// its parameters, gradients and AdamW state on one PE (a parallel rank's
// live in the symmetric heap, apart).
int64_t rank_host_bytes(const TrainConfig& config, int rank);

// Host memory a parallel run's leader (rank 0) holds while it saves a
// checkpoint, between steps: the whole model's weights, AdamW m and v
// assembled (f32), and the pages of the other PEs' symmetric heaps it reads
// them from (shared memory: counted again in its resident set). 0 for the
// other ranks and on one PE (its checkpoint is written from its tensors).
int64_t rank_checkpoint_bytes(const TrainConfig& config, int rank);

}  // namespace coremesh::train
