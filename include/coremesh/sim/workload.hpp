// What one micro-batch asks of one PE, part by part: the kernels the model
// runs (shapes and FLOP / byte counts from the model's own dimensions, as
// src/model/parts.cpp and moe.cpp run them) and the exchanges its seams make
// (TP enter/exit, CP ring or Ulysses, EP dispatch/combine), per phase:
// forward, input gradient, weight gradient. The simulator prices them on a
// cluster; `coremesh calibrate` measures the shapes listed here.
#pragma once

#include <string>
#include <vector>

#include "coremesh/sim/cluster.hpp"
#include "coremesh/train/train_config.hpp"

namespace coremesh::sim {

// The PEs an exchange spans: the mesh's groups of this PE.
enum class Group { tp, cp, ep, pp, dense_grad, expert_grad };

struct Exchange {
  std::string name;
  Collective collective = Collective::put;
  Group group = Group::tp;
  double bytes = 0;       // as collective_volume() reads it
  bool hidden_by_weight_grad = false;  // TP: leaves while the part's weight gradients compute
  // The share of the bytes that crosses hosts when the group spans them: EP
  // under node-limited routing (n_groups > 1: a token reaches at most
  // topk_groups groups, sent once per group and forwarded inside it)
  double across_hosts = 1.0;
};

struct PartWork {
  std::vector<Op> forward, input_grad, weight_grad;
  std::vector<Exchange> forward_exchanges, backward_exchanges;
  double flops() const;  // every op's, all phases
};

struct WorkloadShape {
  train::TrainConfig config;  // model, parallel layout, micro-batch and sequence length
  // The busiest EP rank's routed rows over the mean (1: perfectly balanced
  // routing). Capacity (capacity_factor > 0) caps it.
  double routing_skew = 1.0;
};

// One micro-batch of `part` on a PE of the layout (every PE of a part does
// the same work but for EP's skew, which is priced at the busiest).
PartWork part_work(const WorkloadShape& w, int part);
// Every GEMM, grouped GEMM and attention kernel of a micro-batch on any PE
// of the layout (what `coremesh calibrate` measures).
std::vector<Op> kernels_of(const WorkloadShape& w);
// The optimizer step's element-wise bytes for `params` f32 parameters
// (AdamW: read weight, gradient, m, v; write weight, m, v; the norm's
// read of the gradient, the gradients' zeroing).
Op optimizer_op(double params);

}  // namespace coremesh::sim
