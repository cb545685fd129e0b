// One training step of a layout on a cluster, simulated (docs/simulator.md).
//
// Every pipeline rank's chunks are priced from part_work(): their kernels on
// the cluster's device, their seams' exchanges on the link their group
// spans, a TP input-gradient sum hidden behind the weight gradients it
// overlaps. The layout's own schedule (the executor's actions) runs over
// those prices in the pipeline simulator, activations crossing on the
// pipeline's link; then the gradient sums (all-reduce, or ZeRO-1's
// reduce-scatter and all-gather), the optimizer and the norm's sum. A
// device that shares a CPU host's cores runs everything that much slower.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

#include "coremesh/parallel/schedule_simulator.hpp"
#include "coremesh/sim/cluster.hpp"
#include "coremesh/train/train_config.hpp"

namespace coremesh::sim {

struct SimInput {
  train::TrainConfig config;  // model, layout (config.parallel), micro-batch, sequence, grad_accum, cores
  double routing_skew = 1.0;  // EP: the busiest rank's routed rows over the mean
};

struct RankCost {  // one pipeline rank (every PE of it alike)
  double compute = 0;          // kernels of every micro-batch
  double exposed_exchange = 0; // seams' exchanges not hidden, of every micro-batch
  double gradient_sync = 0;    // exposed sums after the pipeline
  double optimizer = 0;
  int64_t peak_bytes = 0;      // the trainer's estimate (weights, gradients, AdamW, step)
};

struct SimResult {
  std::string layout;  // "dp 2 x ep 2", with the schedule under pp
  int pes = 1;
  double step_seconds = 0, tokens_per_second = 0, mfu = 0;
  double bubble_fraction = 0;        // of the pipeline ranks' time
  double exposed_comm_seconds = 0;   // the slowest rank's exchanges on its critical path
  int64_t peak_bytes = 0;            // the largest rank's
  double model_flops = 0;            // per step (6 N + attention, as the trainer counts)
  std::vector<RankCost> ranks;
  parallel::Simulation pipeline;     // the schedule's timeline (times in seconds)
  double pipeline_seconds = 0;
};

SimResult simulate_step(const SimInput& in, const Cluster& cluster);

// The simulated step as a Chrome/Perfetto trace: one process per pipeline
// rank, its actions, exchanges summed into them, the sums and the optimizer.
nlohmann::json simulated_trace(const SimResult& r);

}  // namespace coremesh::sim
