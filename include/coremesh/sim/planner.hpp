// Every layout of a model on a cluster, ranked by simulated step time
// (`coremesh plan`).
#pragma once

#include <string>
#include <vector>

#include "coremesh/sim/simulator.hpp"

namespace coremesh::sim {

struct PlanRequest {
  train::TrainConfig config;   // the model, micro-batch size, sequence length, precision
  int pes = 1;                 // devices the layout uses
  int global_batch = 0;        // sequences per step (kept by every layout); 0: config's per 1 PE
  double memory_limit = 0;     // bytes per device (0: the cluster's device memory, else none)
  double routing_skew = 1.0;
};

struct PlannedLayout {
  train::TrainConfig config;   // with the layout and its grad_accum
  SimResult result;
  bool fits = true;            // peak memory within the limit
  std::string why;             // what dominates: bubble, exposed exchange, memory
};

// Every valid layout's config (degrees whose product is `pes`, ...; see
// plan_layouts), the global batch kept through grad_accum.
std::vector<train::TrainConfig> valid_layouts(const PlanRequest& request);

// Every valid layout (degrees whose product is `pes`, each pipeline schedule,
// SP on or off under TP, ring or Ulysses under CP, ZeRO-1 under data
// parallelism), fastest first; those over the memory limit last.
std::vector<PlannedLayout> plan_layouts(const PlanRequest& request, const Cluster& cluster);

}  // namespace coremesh::sim
