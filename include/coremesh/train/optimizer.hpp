// AdamW over the model's parameter arena (PyTorch semantics, fp32 state):
//   p <- p * (1 - lr * wd)                      (matrices only)
//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// plus global-norm gradient clipping (torch.nn.utils.clip_grad_norm_).
// Runs on the kernel library (ops::grad_sq_sum, clip_coefficient, adamw_step)
// on the current stream, one launch each over the arena (a segment per
// parameter); the clip coefficient is folded into the update. Nothing here
// waits for the stream: the caller reads the gradient norm after the step.
//
// ZeRO-1: constructed with the ranges of the arena this PE owns, it keeps
// m and v for those ranges only (packed one after the other) and updates
// only them; a parallel layout gathers the parameters afterwards.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "coremesh/core/tensor.hpp"
#include "coremesh/model/model.hpp"
#include "coremesh/ops/optimizer.hpp"

namespace coremesh::train {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  double grad_clip = 1.0;  // <= 0: no clipping
};

class AdamW {
 public:
  using Range = std::pair<int64_t, int64_t>;  // [begin, end) of the arena
  // `owned` empty: the whole arena. `alloc` makes the (zeroed) m and v arenas.
  AdamW(model::Model& model, const AdamWConfig& config, std::vector<Range> owned = {},
        const model::Model::ArenaAllocator& alloc = {});

  // Launches the sum of squares of the gradients and the clip coefficient
  // that the next step() applies to them. Returns the sum of squares, a (1)
  // f32 tensor on the stream: grad_norm() of it once the stream reached it.
  Tensor clip_gradients();
  // The same from a sum of squares computed elsewhere (over several PEs).
  void clip_gradients(const Tensor& sq_sum);
  static double grad_norm(const Tensor& sq_sum) { return std::sqrt(double(sq_sum.data<float>()[0])); }
  // One update with learning rate `lr` (increments the step count). It clips
  // only by what clip_gradients() launched before it: without that call,
  // grad_clip does nothing.
  void step(double lr);
  // Graph mode: from now on step() launches an update that reads the lr and
  // the step count from two small tensors as it runs, and writes them from
  // the host when it launches (so the stream must not be running an earlier
  // step). A replayed step calls advance(lr) instead of step(lr).
  void read_step_values_when_run();
  void advance(double lr);

  int64_t steps() const { return t_; }
  void set_steps(int64_t t) { t_ = t; }
  // The owned ranges and where each starts in m and v.
  const std::vector<Range>& owned() const { return owned_; }
  int64_t state_offset(size_t range) const { return state_offset_[range]; }
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }
  // Bytes of m and v this PE holds (its shards under ZeRO-1).
  int64_t state_bytes() const { return m_.nbytes() + v_.nbytes(); }
  // The arena-laid-out views of one parameter's state (whole-arena AdamW only).
  Tensor m_of(const model::ParamInfo& p) const;
  Tensor v_of(const model::ParamInfo& p) const;

 private:
  model::Model& model_;
  AdamWConfig cfg_;
  std::vector<Range> owned_;
  std::vector<int64_t> state_offset_;
  Tensor m_, v_;
  std::vector<std::vector<ops::ParamSegment>> segments_;  // per owned range, relative to it
  Tensor clip_scale_;  // (1) from clip_gradients(), consumed by step()
  ops::AdamWStepValues step_values_;  // graph mode: lr and t as the kernel reads them
  int64_t t_ = 0;
};

}  // namespace coremesh::train
