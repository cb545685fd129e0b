// Tuning a training run's tilings (runtime/tuner.hpp on Trainer::tuning_workload):
// what `coremesh tune`, `train --tune` and coremesh.train.tune run.
#pragma once

#include <string>
#include <vector>

#include "coremesh/runtime/device.hpp"
#include "coremesh/runtime/tuner.hpp"
#include "coremesh/train/train_config.hpp"

namespace coremesh::train {

struct StepTuning {
  runtime::TuneReport report;
  int keys = 0, with_choice = 0, replaced = 0, rejected = 0;  // this PE's
  double heuristic_s = 0, tuned_s = 0;  // the keys' median launch times, summed
  std::vector<std::string> agreed;       // the agreed keys' picks (fused TP chunks), as text
  int pes = 1, pe = 0;  // the job's PEs, this one
  std::string summary() const;  // "tuned 65 op keys (56 with a choice) in 41 runs, ..."
};

// Tunes the step of `config` on a trainer of its own (dropped after) and adds
// this PE's keys to the cache at `cache_path` (its other entries stay; one PE
// writes at a time). Collective under a launched job.
StepTuning tune_step_tilings(const TrainConfig& config, runtime::Device& device, const runtime::TuneOptions& options,
                             const std::string& cache_path);

}  // namespace coremesh::train
