// MoE FFN layer (private to src/model) on the kernel library: router scores,
// group-limited top-k with the aux-free bias, capacity with drop policy,
// permute -> grouped GEMM SwiGLU experts -> weighted unpermute, plus shared
// experts and the sequence-wise balance loss. Forward and backward side by side.
// Semantics are spelled out in tests/reference/moe_model.py.
#pragma once

#include <cstdint>
#include <vector>

#include "coremesh/core/tensor.hpp"
#include "coremesh/model/config.hpp"
#include "layers.hpp"

namespace coremesh::model::detail {

// Views into the weight (or gradient) arena.
struct MoeParams {
  Tensor router;       // (E, C)
  Tensor w13, w2;      // (E, 2F, C) = [w1_e; w3_e] per expert, (E, C, F)
  Tensor sw13, sw2;    // (2*S*F, C) = [shared.w1; shared.w3], (C, S*F); undefined when S = 0
};

// Everything the backward needs from one micro-batch's forward.
struct MoeActs {
  Tensor scores;                // (N, E) affinities p
  Tensor sel_idx, sel_w;        // (N, K) routing before capacity (selections)
  Tensor idx, w;                // (N, K) routing after capacity (-1/0 = dropped)
  Tensor offsets, row_of;       // (E+1), (N, K)
  GemmWeight w13, w2;           // this pass's casts of the expert weights
  GemmInput xp;                 // permuted rows (N*K, C) as the W13 GEMM read them
  Tensor gu;                    // experts: [W1 xp | W3 xp] (N*K, 2F) f32
  GemmInput g;                  // silu(a1) * a3 (N*K, F) as the W2 GEMM read it
  Tensor ye;                    // (N*K, C)
  MlpActs shared;               // (N, S*F)
  Tensor counts;                // (E) i64 selections before drops
  // Read on the host after the forward's synchronization (finish_forward):
  std::vector<double> host_counts;
  int64_t dropped = 0;
  double aux = 0;               // balance loss (already times alpha)
};

// y (N,C) = MoE(x (N,C)); x holds B sequences of T tokens. The router runs
// in f32, the shared and routed experts in cfg.precision. Launches only.
Tensor moe_forward(const Tensor& x, const MoeParams& w, const Tensor& bias, const ModelConfig& cfg,
                   int64_t B, int64_t T, MoeActs& acts);
// After the stream is synchronized: counts, drops and the balance loss.
void moe_finish_forward(const ModelConfig& cfg, int64_t B, int64_t T, MoeActs& acts);
// dy (N,C) -> dx (N,C) of (dy . y + aux_scale * aux); weight grads go into g
// (dw_beta 1 accumulates, 0 overwrites).
Tensor moe_backward(const Tensor& dy, const Tensor& x, const MoeParams& w, const MoeParams& g,
                    float dw_beta, const ModelConfig& cfg, int64_t B, int64_t T,
                    const MoeActs& acts, float aux_scale);

}  // namespace coremesh::model::detail
