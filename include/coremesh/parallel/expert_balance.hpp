// Balancing hot experts over the PEs of an expert-parallel group (RFC §2.2).
//
// Under skewed routing the PE that owns the hot experts computes most rows
// and sets the step time. A *shadowed* expert (FasterMoE's shadow experts) is
// computed by every source on its own rows, with a copy of the owner's
// weights, instead of by its owner on everyone's rows; each source returns
// its part of the weight gradient, which the owner adds in source order, as
// it adds its own per-source parts (so the sums do not change order).
//
// Policies (`--expert-balance`):
//   none    every expert on its owner
//   shadow  planned every step from the step's own loads, exchanged before
//           the rows (FasterMoE)
//   static  re-planned every `balance_window` steps from the loads of the
//           steps since the last plan, as DeepSeek's EPLB places redundant experts
// Both plan with plan_shadows below: the same answer on every PE, since every
// PE plans from the same all-gathered loads (ShmemExperts, on the stream).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace coremesh::parallel {

enum class ExpertBalance { none, shadow, static_window };
const std::vector<std::pair<ExpertBalance, std::string>>& expert_balances();  // with their names

struct ShadowPlan {
  std::vector<int> shadowed;   // global expert ids, ascending
  std::vector<double> work;    // rows each PE computes under the plan (+ weight_rows per shadow it takes)
  double max_work() const;
  double mean_work() const;
};

// The rows each PE computes with no shadows: counts (sources x E), rows of
// source s for expert e; expert e lives on PE e / (E / sources).
std::vector<double> owner_work(const std::vector<std::vector<int64_t>>& counts);

// The rows each PE computes when `shadowed` are shadowed (a plan made from
// other counts, e.g. the last step's, applied to these).
std::vector<double> shadow_work(const std::vector<std::vector<int64_t>>& counts, const std::vector<int>& shadowed,
                                double weight_rows);

// Greedy: while the plan has fewer than max_shadows experts, shadow the
// expert that lowers the busiest PE's work the most (ties: the sum of
// squared work, then the lowest id); stop when none does; then swaps of one
// shadow for another while one helps; the best of starting from no shadow
// and from each single one. A PE that takes on a shadow pays weight_rows
// (moving the weights there and the gradient back, in rows of expert work).
// Deterministic. Cost: E starts x (max_shadows + swaps) x E x ep.
ShadowPlan plan_shadows(const std::vector<std::vector<int64_t>>& counts, int max_shadows, double weight_rows);

}  // namespace coremesh::parallel
