// AdamW with decoupled weight decay and bias correction, and gradient
// clipping by global norm from partial sums of squares.
//
// Clipping is split so that it can span PEs: grad_sq_sum() gives this PE's
// sum of squares (a (1) f32 tensor), the caller may all-reduce it, and
// clip_coefficient() turns the total into min(1, max_norm / (norm + 1e-6)),
// which adamw_step() multiplies into the gradients on the fly. Everything runs
// on the current stream without host synchronization.
//
// Flat variants: a model keeps all parameters in one flat arena and the
// parameters differ only in whether weight decay applies, so grad_sq_sum() and
// adamw_step() also take one flat tensor plus a list of ParamSegment and
// cover the whole arena in one launch. Work units are fixed chunks of
// kOptimizerChunk elements of the flat tensor, split evenly over the blocks;
// a chunk may span several segments.
//
//   flat tensor  |seg 0 (decay)|pad|seg 1 (no decay)|seg 2 (decay) ...|
//   chunks       |  chunk 0  |  chunk 1  |  chunk 2  |  chunk 3  | ..
//   blocks       |     block 0           |     block 1           |
#pragma once

#include <cstdint>
#include <vector>

#include "coremesh/core/tensor.hpp"

namespace coremesh::ops {

// Elements per work unit (and per partial sum of grad_sq_sum).
inline constexpr int64_t kOptimizerChunk = 4096;

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// The run [offset, offset + numel) of a flat tensor that holds one parameter.
// decay: adamw_step() applies config.weight_decay to it (else no decay).
struct ParamSegment {
  int64_t offset = 0;
  int64_t numel = 0;
  bool decay = false;
};

// sum_i sum_j grads[i][j]^2 as a (1) f32 tensor (deterministic: fixed chunks
// of each tensor, one launch per tensor, then a sum of the chunk partials in a
// fixed order).
Tensor grad_sq_sum(const std::vector<Tensor>& grads);
// The sum of squares of the elements of the contiguous f32 `grad` that lie in
// `segments`, in one launch over fixed chunks of the whole tensor (elements
// outside every segment are ignored). The result does not depend on the core
// limit. Segments must lie inside grad and must not overlap.
Tensor grad_sq_sum(const Tensor& grad, const std::vector<ParamSegment>& segments);
// The two passes of grad_sq_sum(grad, segments) apart, for a gradient held in
// pieces on several PEs: the per-chunk partials (ceil(numel / kOptimizerChunk)
// f32) of the elements in segments, and (1) their total in index order. Cut
// a gradient at multiples of kOptimizerChunk, sum the pieces' partials
// element-wise (each chunk's partial is non-zero on one PE) and the total is
// grad_sq_sum's of the whole, bit for bit.
Tensor grad_sq_partials(const Tensor& grad, const std::vector<ParamSegment>& segments);
Tensor sum_partials(const Tensor& partials);
// (1) tensor min(1, max_norm / (sqrt(sq_sum) + 1e-6)).
Tensor clip_coefficient(const Tensor& sq_sum, float max_norm);

// One fused AdamW update (step >= 1), in place on param, m, v:
//   g = grad * grad_scale[0] (if given)
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   param = param (1 - lr wd) - lr (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps)
// computed in f32 in PyTorch's arrangement, with the constants from double:
//   param = param (1 - lr wd) - (lr / (1-b1^step)) m / (sqrt(v) (1 / sqrt(1-b2^step)) + eps)
// (a few ulp of the update term away from the formula above; results are the
// same bits for every core limit). One launch: the flat variant below with one
// segment over the tensor.
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWConfig& config, int64_t step, const Tensor& grad_scale = {});
// One launch per parameter (for separate tensors).
void adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                const std::vector<Tensor>& m, const std::vector<Tensor>& v,
                const AdamWConfig& config, int64_t step, const Tensor& grad_scale = {});
// The same update in one launch over the `segments` of flat, same-shaped,
// contiguous f32 param/grad/m/v (an arena): segments with decay use
// config.weight_decay, the others none; elements outside every segment are
// left untouched. Segments must lie inside the tensors and must not overlap.
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const std::vector<ParamSegment>& segments, const AdamWConfig& config, int64_t step,
                const Tensor& grad_scale = {});

// The learning rate and step count of an update read when the kernel runs
// rather than when it is launched: a replayed graph reuses one launch for
// every step, and the host writes these before each replay. lr (1) f32,
// step (1) i64. The arithmetic is that of the overload above.
struct AdamWStepValues {
  Tensor lr;
  Tensor step;
};
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const std::vector<ParamSegment>& segments, const AdamWConfig& config,
                const AdamWStepValues& at, const Tensor& grad_scale = {});

namespace reference {
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWConfig& config, int64_t step, float grad_scale = 1.0f);
}  // namespace reference

}  // namespace coremesh::ops
