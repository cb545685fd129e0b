// The 5D device mesh (DESIGN.md §7, torchtitan's ParallelDims): which rank
// holds which coordinates, and who is in each group. Pure functions of the
// degrees; nothing here communicates.
//
// Rank order, outermost to innermost: [DP][CP][PP][EP][TP]
//   rank = (((dp * CP + cp) * PP + pp) * EP + ep) * TP + tp
// Worked example, dp 2 x ep 2 (4 PEs): rank 0 = (dp 0, ep 0), 1 = (0, 1),
// 2 = (1, 0), 3 = (1, 1); the EP group of rank 2 is {2, 3}, its DP group
// {0, 2}.
//
// Groups (members in increasing rank order):
//   dim(d)        the ranks that differ from this one only in coordinate d
//   dense_grads   dp x cp x ep at this rank's pp, tp: the ranks that replicate a
//                 dense (non-expert) parameter and average its gradient
//   expert_grads  dp x cp at this rank's pp, ep, tp: the ranks that hold the
//                 same routed experts and average their gradients
//   tp_shared_grads  dense_grads and the TP ranks that hold the same copy of
//                 a parameter as this one (tp ranks t with t / sharing equal)
//                 and compute parts of its gradient: key/value heads shared
//                 by several ranks' query heads; with sequence parallelism
//                 the norms and routers (sharing = tp)
//   data          dp x ep at this rank's cp, pp, tp: the ranks that read
//                 different micro-batches; data_index() numbers them
#pragma once

#include <array>
#include <string>
#include <vector>

#include "coremesh/parallel/config.hpp"

namespace coremesh::parallel {

enum class Dim { dp = 0, cp = 1, pp = 2, ep = 3, tp = 4 };
inline constexpr std::array<Dim, 5> kDims{Dim::dp, Dim::cp, Dim::pp, Dim::ep, Dim::tp};
const char* dim_name(Dim d);

struct Coords {
  std::array<int, 5> c{};  // indexed by Dim
  int& operator[](Dim d) { return c[size_t(d)]; }
  int operator[](Dim d) const { return c[size_t(d)]; }
  bool operator==(const Coords&) const = default;
};

// The sizes a layout splits, to check that every degree divides what it
// cuts; -1: not checked.
struct SplitSizes {
  int experts = -1;  // routed experts (split by ep)
  int heads = -1;    // query heads (split by tp; by cp x tp under Ulysses)
  int layers = -1;   // decoder layers (split into pp stages)
  int seq_len = -1;  // tokens per sequence (split by cp)
  int kv_heads = -1; // key/value heads (split by cp x tp under Ulysses)
};

class Mesh {
 public:
  // Throws InvalidArgument listing every problem and what to change.
  Mesh(const ParallelConfig& degrees, int world, const SplitSizes& sizes = {});
  static std::vector<std::string> problems(const ParallelConfig& degrees, int world, const SplitSizes& sizes);

  int world() const { return world_; }
  int degree(Dim d) const { return degree_[size_t(d)]; }
  const ParallelConfig& config() const { return config_; }

  Coords coords(int rank) const;
  int rank(const Coords& c) const;

  std::vector<int> group(Dim d, int rank) const;
  std::vector<int> dense_grad_group(int rank) const;
  std::vector<int> expert_grad_group(int rank) const;
  std::vector<int> tp_shared_grad_group(int rank, int sharing) const;
  std::vector<int> data_group(int rank) const;
  // Position of `rank` among the ranks that read different micro-batches:
  // dp_index * ep + ep_index, in [0, dp * ep).
  int data_index(int rank) const;
  int data_ranks() const { return degree(Dim::dp) * degree(Dim::ep); }

  std::string describe() const;  // "dp 2 x cp 1 x pp 1 x ep 2 x tp 1 = 4 PEs"

 private:
  // The ranks that share every coordinate of `rank` except those in `vary`.
  std::vector<int> members(int rank, std::initializer_list<Dim> vary) const;

  ParallelConfig config_;
  std::array<int, 5> degree_{};
  int world_ = 1;
};

}  // namespace coremesh::parallel
