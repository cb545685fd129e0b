// MoE routing: gating scores, (group-limited) top-k with aux-loss-free bias,
// switch auxiliary loss, capacity with drop policies, permutation of tokens
// into expert-contiguous order and the weighted combine back.
//
// Notation: T tokens, E experts, k experts per token, C hidden size,
// G expert groups (E % G == 0). indices (T,k) i32 hold expert ids, -1 for a
// dropped assignment (weight 0). Every kernel runs on the current stream;
// nothing here synchronizes with the host (counts and offsets stay tensors).
#pragma once

#include <cstdint>

#include <vector>

#include "coremesh/core/tensor.hpp"

namespace coremesh::ops {

enum class ScoreFunc { softmax, sigmoid };

// logits (T,E) -> scores (T,E): softmax over experts, or sigmoid per expert.
Tensor router_scores(const Tensor& logits, ScoreFunc func);
Tensor router_scores_backward(const Tensor& dscores, const Tensor& scores, ScoreFunc func);

struct TopKConfig {
  int k = 2;
  int n_groups = 1;     // G; 1 disables group-limited routing
  int topk_groups = 1;  // groups kept per token (DeepSeek-V3: a group scores the sum of its top-2)
  bool renorm = false;  // weights / sum of the k selected scores
  float route_scale = 1.0f;
};

struct Routing {
  Tensor indices;  // (T,k) i32, -1 = dropped
  Tensor weights;  // (T,k) f32
};

// Selects by scores + bias (bias (E) optional: aux-loss-free balancing, used
// for selection only); weights are the unbiased scores of the selected
// experts (renormalized if asked) times route_scale. Ties go to the lower id.
Routing topk_route(const Tensor& scores, const Tensor& bias, const TopKConfig& config);
// dweights (T,k) -> dscores (T,E) (zero for unselected experts).
Tensor topk_route_backward(const Tensor& dweights, const Tensor& scores, const Routing& routing,
                           const TopKConfig& config);

// counts (E) i64: assignments per expert (dropped ones not counted).
Tensor expert_counts(const Tensor& indices, int64_t num_experts);
// Aux-loss-free bias update, in place, with m = mean(counts):
//   sign          bias[e] += rate * sign(m - counts[e])          (DeepSeek-V3)
//   proportional  bias[e] += rate * (m - counts[e]) / m
//   margin        bias[e] += rate * d_e, d_e the shift that alone would have
//                 given expert e m of the step's selections, read off `margins`
//                 (accumulate_selection_margins; linear within a bin)
// The sign step moves every expert by the full rate however small its error,
// so a rate fast enough to undo an early collapse keeps flipping the balance
// once it is reached; the proportional step shrinks with the error, but its
// effect still depends on how close the scores lie (a young router's sigmoid
// scores all sit near 0.5, a trained one's spread out). The margin step is
// measured in the scores' own units: rate (0, 1] is the fraction of the
// balancing shift taken per step.
enum class BiasUpdate { sign, proportional, margin };
void update_expert_bias(const Tensor& bias, const Tensor& counts, float rate, BiasUpdate mode = BiasUpdate::sign,
                        const Tensor& margins = {});

// Selection margins, what BiasUpdate::margin reads. For a token with adjusted
// scores a_e = scores[t,e] + bias[e] and selected experts S (its top-k): an
// expert outside S would enter if its bias rose by more than min_S a - a_e, one
// in S would leave if its bias fell by more than a_e - max_{not S} a. Adds one
// count per (token, expert) to margins (E, 2, kMarginBins) i64, [e][0] the
// distances to leave and [e][1] to enter, in the distance's bin
// (margin_bin_edge). Counts add exactly, so sums over micro-batches and PEs do
// not depend on their order. Under group-limited routing the distances are the
// token's within-expert ones (the group choice is not modelled).
inline constexpr int kMarginBins = 48;
// The lower edge of a margin bin: 0, then 1e-6 * 2^((bin - 1) / 2) (the last bin is open).
double margin_bin_edge(int bin);
void accumulate_selection_margins(const Tensor& scores, const Tensor& bias, const Tensor& selected,
                                  const Tensor& margins);

// Switch-Transformer auxiliary loss: loss = alpha E sum_e f_e P_e, with
// f_e = counts_e / (T k) (no gradient) and P_e = mean_t scores[t,e].
// dscores[t,e] = alpha E f_e / T (to be chained into router_scores_backward).
struct AuxLoss {
  Tensor loss;     // (1)
  Tensor dscores;  // (T,E)
};
AuxLoss switch_aux_loss(const Tensor& scores, const Tensor& indices, int64_t num_experts, float alpha);

// DeepSeek-V3's sequence-wise balance loss over B sequences of T tokens:
// scores (N,E), N = B*T, the router's affinities; selected (N,k) the top-k
// before capacity.
//   loss = alpha/B sum_b sum_e f_be P_be,   f_be = E/(k T) #{t in b : e selected for t},
//   P_be = 1/T sum_{t in b} s_te / sum_j s_tj   (affinities normalized per token)
// f carries no gradient. The loss is a (1) f32 tensor, summed in double in
// (sequence, expert) order.
Tensor sequence_balance_loss(const Tensor& scores, const Tensor& selected, int64_t sequences,
                             float alpha);
// dscores (N,E) = d(scale * loss)/dscores.
Tensor sequence_balance_loss_backward(const Tensor& scores, const Tensor& selected,
                                      int64_t sequences, float alpha, float scale);
// Routing statistics kept on the stream: adds the selections per expert of
// `selected` (N,k) to load[0..E) and the dropped assignments (-1) of `kept`
// (N,k) to load[E]; load is (E+1) i64.
void accumulate_expert_load(const Tensor& selected, const Tensor& kept, const Tensor& load);

// capacity = ceil(factor * T * k / E)
int64_t expert_capacity(int64_t tokens, int64_t k, int64_t num_experts, float factor);
enum class DropPolicy {
  probability,  // keep each expert's `capacity` highest-weight assignments
  position,     // keep each expert's first `capacity` assignments in token order
};
// Returns a copy of routing with assignments beyond capacity dropped (-1, 0).
Routing apply_capacity(const Routing& routing, int64_t num_experts, int64_t capacity,
                       DropPolicy policy);

// Expert-contiguous permutation (stable: token order inside an expert).
struct Permutation {
  Tensor x;        // (T*k, C): rows [offsets[e], offsets[e+1]) belong to expert e;
                   // rows from offsets[E] on (dropped slots) are zero
  Tensor offsets;  // (E+1) i64, the group list of grouped_matmul
  Tensor row_of;   // (T,k) i64: row of x holding assignment (t,j), -1 if dropped
};
// out: where to build x ((T*k, C) f32, contiguous; e.g. a send buffer of the
// expert exchange); default a new tensor.
Permutation permute(const Tensor& x, const Tensor& indices, int64_t num_experts, const Tensor& out = {});
// dxp (T*k, C) -> dx (T,C) = sum_j dxp[row_of[t,j]], written into `out`
// when given ((T,C) f32, contiguous; e.g. a token slice's rows of a larger dx).
Tensor permute_backward(const Tensor& dxp, const Tensor& row_of, const Tensor& out = {});
// Combine: y (T,C) = sum_j weights[t,j] * yp[row_of[t,j]], into `out` as above.
Tensor unpermute(const Tensor& yp, const Tensor& row_of, const Tensor& weights, const Tensor& out = {});
struct UnpermuteGrads {
  Tensor dyp;       // (T*k, C)
  Tensor dweights;  // (T,k)
};
// dyp_out, dweights_out: where to build dyp (yp's shape) and dweights ((T,k));
// f32, contiguous; default new tensors.
UnpermuteGrads unpermute_backward(const Tensor& dy, const Tensor& yp, const Tensor& row_of,
                                  const Tensor& weights, const Tensor& dyp_out = {},
                                  const Tensor& dweights_out = {});

// Row sets grouped the same way, joined group by group: group g of the
// result is group g of parts[0], then of parts[1], ... parts[p] (M_p, W) of
// one dtype and width, contiguous; offsets[p] (G+1) i64 its group list (read
// on the stream). Rows past the groups are zero. A token-sliced MoE layer
// joins its slices' routed rows so that the experts' weight gradients see
// them in the order one unsliced exchange delivers.
struct GroupedRows {
  Tensor rows;     // (sum M_p, W)
  Tensor offsets;  // (G+1) i64
};
GroupedRows concat_groups(const std::vector<Tensor>& parts, const std::vector<Tensor>& offsets);

namespace reference {
Routing topk_route(const Tensor& scores, const Tensor& bias, const TopKConfig& config);
Routing apply_capacity(const Routing& routing, int64_t num_experts, int64_t capacity,
                       DropPolicy policy);
AuxLoss switch_aux_loss(const Tensor& scores, const Tensor& indices, int64_t num_experts, float alpha);
Tensor sequence_balance_loss(const Tensor& scores, const Tensor& selected, int64_t sequences,
                             float alpha);
Tensor sequence_balance_loss_backward(const Tensor& scores, const Tensor& selected,
                                      int64_t sequences, float alpha, float scale);
}  // namespace reference

}  // namespace coremesh::ops
