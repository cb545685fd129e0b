// MoE FFN layer (private to src/model) on the kernel library: router scores,
// group-limited top-k with the aux-free bias, capacity with drop policy,
// permute -> dispatch -> grouped GEMM SwiGLU experts -> combine -> weighted
// unpermute, plus shared experts and the sequence-wise balance loss. Forward
// and backward side by side. Semantics are spelled out in
// tests/reference/moe_model.py. Everything runs on the stream; the routing
// statistics go to a load tensor on the stream as well.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "coremesh/core/tensor.hpp"
#include "coremesh/model/config.hpp"
#include "coremesh/parallel/seams.hpp"
#include "coremesh/runtime/stream.hpp"
#include "layers.hpp"

namespace coremesh::model::detail {

// Views into the weight arena, and the gradients of the same parameters.
struct MoeParams {
  Tensor router;       // (E, C)
  Tensor w13, w2;      // (E_local, 2F, C) = [w1_e; w3_e] per expert, (E_local, C, F)
  Tensor sw13, sw2;    // (2*S*F, C) = [shared.w1; shared.w3], (C, S*F); undefined when S = 0
};
struct MoeGrads {
  GradRef router, w13, w2, sw13, sw2;
};

// One token slice's way through the routed experts: moe_replicas slices per
// micro-batch (one when unsliced), each with its own exchange site.
struct MoeSlice {
  int64_t begin = 0, end = 0;   // its tokens [begin, end) of the micro-batch
  Tensor offsets, row_of;       // (E+1), (n, K)
  parallel::ExpertDispatcher::Dispatched routed;  // the rows this PE's experts compute
  GemmInput xp;                 // routed rows (R_local, C) as the W13 GEMM read them
  Tensor gu;                    // experts: [W1 xp | W3 xp] (R_local, 2F) f32
  GemmInput g;                  // silu(a1) * a3 (R_local, F) as the W2 GEMM read it
  Tensor ye;                    // (n*K, C) the experts' outputs back in the permuted order
};

// Everything the backward needs from one micro-batch's forward.
struct MoeActs {
  int layer = 0;                // the model's layer index (names the exchange's sites)
  Tensor x;                     // (N, C) the region's input (gathered under sequence parallelism)
  Tensor scores;                // (N, E) affinities p
  Tensor sel_idx, sel_w;        // (N, K) routing before capacity (selections)
  Tensor idx, w;                // (N, K) routing after capacity (-1/0 = dropped)
  GemmWeight w13, w2;           // this pass's casts of the expert weights
  std::vector<MoeSlice> slices;
  MlpActs shared;               // (N, S*F)
  Tensor aux;                   // (1) balance loss (times alpha); undefined when alpha = 0
};

// The streams of token-sliced MoE layers. For each stream that runs a layer
// (the pipeline's, DualPipe's second), one compute stream per slice and one
// comm stream for the slices' exchanges, limited to comm_cores vector cores
// (0: the device's) and scheduled first. With one slice everything stays on
// the calling stream.
class MoeStreams {
 public:
  MoeStreams(int replicas, int comm_cores) : replicas_(replicas), comm_cores_(comm_cores) {}
  int replicas() const { return replicas_; }
  struct Set {
    std::vector<runtime::Stream> slices, comms;
  };
  Set& of(const runtime::Stream& parent);

 private:
  int replicas_, comm_cores_;
  std::map<int, Set> sets_;  // by the parent stream's id
};

// y (N,C) = MoE(x (N,C)); x holds B sequences of T tokens. The routed experts
// run per token slice on `streams` (the router, the shared experts and the
// balance statistics on the calling stream, for the whole micro-batch). The router runs
// in f32, the shared and routed experts in cfg.precision. Adds this
// micro-batch's selections and drops to load (E+1) i64. The experts (routed
// and shared) are a tensor-parallel region: w.w13, w.w2, w.sw13, w.sw2 hold
// this rank's hidden units (expert-TP); the router reads x whole. Under
// sequence parallelism x and y, dy and dx are this rank's rows (N/tp, C)
// and the region works on the gathered (N, C).
Tensor moe_forward(const Tensor& x, const MoeParams& w, const Tensor& bias, const ModelConfig& cfg,
                   int64_t B, int layer, parallel::ExpertDispatcher& experts, parallel::TensorParallel& tp,
                   MoeStreams& streams, const Tensor& load, MoeActs& acts);
// dy (N,C) -> dx (N,C) of (dy . y + aux_scale * aux), x the forward's input;
// weight gradients go to the sink.
Tensor moe_backward(const Tensor& dy, const Tensor& x, const MoeParams& w, const MoeGrads& g,
                    const ModelConfig& cfg, int64_t B, parallel::ExpertDispatcher& experts,
                    parallel::TensorParallel& tp, MoeStreams& streams, const MoeActs& acts, float aux_scale,
                    WgradSink& sink);

}  // namespace coremesh::model::detail
