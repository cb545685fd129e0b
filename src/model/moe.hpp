// MoE FFN layer (private to src/model): router, group-limited top-k gating,
// capacity with drop policy, routed SwiGLU experts + shared experts, the
// sequence-wise balance loss. Forward and backward side by side.
// Semantics are spelled out in tests/reference/moe_model.py.
#pragma once

#include <cstdint>
#include <vector>

#include "coremesh/model/config.hpp"

namespace coremesh::model::detail {

struct MoeWeights {
  const float* router;  // (E, C)
  const float* w1;      // (E, F, C)  gate
  const float* w3;      // (E, F, C)  up
  const float* w2;      // (E, C, F)  down
  const float* sw1;     // (S*F, C)   shared (null when S = 0)
  const float* sw3;     // (S*F, C)
  const float* sw2;     // (C, S*F)
  const float* bias;    // (E) aux-free balancing bias (selection only)
};
struct MoeGrads {
  float *router, *w1, *w3, *w2, *sw1, *sw3, *sw2;
};

// Everything the backward needs from one micro-batch's forward.
struct MoeActs {
  std::vector<float> probs;             // (N, E) affinities p
  std::vector<int32_t> idx;             // (N, K) selected experts
  std::vector<float> w;                 // (N, K) gate weights
  std::vector<uint8_t> keep;            // (N, K) 0 = dropped over capacity
  std::vector<int64_t> offsets;         // (E+1) rows of each expert in the permuted order
  std::vector<int32_t> row_token;       // (R) token of each permuted row
  std::vector<int32_t> row_slot;        // (R) slot k of each permuted row
  std::vector<float> xe, a1, a3, g, ye; // (R,C) (R,F) (R,F) (R,F) (R,C)
  std::vector<float> sa1, sa3, sg;      // (N, S*F)
  std::vector<double> counts;           // (E) selections (before drops) in this micro-batch
  int64_t dropped = 0;
  double aux = 0;                       // balance loss (already times alpha)
};

// y (N,C) = MoE(x (N,C)); x holds B sequences of T tokens.
void moe_forward(float* y, const float* x, const MoeWeights& w, const ModelConfig& cfg, int64_t B,
                 int64_t T, MoeActs& acts);
// dx (N,C) += d/dx of (dy . y + aux_scale * aux); weight grads accumulate.
void moe_backward(float* dx, const float* dy, const float* x, const MoeWeights& w, MoeGrads& g,
                  const ModelConfig& cfg, int64_t B, int64_t T, MoeActs& acts, float aux_scale);

}  // namespace coremesh::model::detail
