#include "coremesh/train/optimizer.hpp"

#include "coremesh/core/error.hpp"
#include "coremesh/ops/optimizer.hpp"

namespace coremesh::train {

AdamW::AdamW(model::Model& model, const AdamWConfig& config, std::vector<Range> owned,
             const model::Model::ArenaAllocator& alloc)
    : model_(model), cfg_(config), owned_(std::move(owned)) {
  if (owned_.empty()) owned_.push_back({0, model.num_params()});
  int64_t size = 0;
  for (const auto& [b, e] : owned_) {
    CM_CHECK(0 <= b && b <= e && e <= model.num_params(), "own ranges inside the arena", "range [{}, {})", b, e);
    for (const auto& [ob, oe] : owned_)  // an element in two ranges would be updated twice per step
      CM_CHECK(&ob == &b || b == e || ob == oe || e <= ob || oe <= b, "own each element once: make the ranges disjoint",
               "owned ranges [{}, {}) and [{}, {}) overlap", b, e, ob, oe);
    state_offset_.push_back(size);
    size += e - b;
    // each parameter's piece inside the range, relative to its start
    std::vector<ops::ParamSegment> seg;
    for (const auto& p : model.params()) {
      const int64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.numel);
      if (lo < hi) seg.push_back({lo - b, hi - lo, p.weight_decay});
    }
    segments_.push_back(std::move(seg));
  }
  const auto make = alloc ? alloc : [](int64_t n) { return Tensor::zeros({n}); };
  m_ = make(std::max<int64_t>(size, 1));
  v_ = make(std::max<int64_t>(size, 1));
}

Tensor AdamW::m_of(const model::ParamInfo& p) const {
  CM_CHECK(owned_.size() == 1 && owned_[0].first == 0, "read whole-arena state", "sharded optimizer state");
  return m_.slice(0, p.offset, p.offset + p.numel).view(p.shape);
}

Tensor AdamW::v_of(const model::ParamInfo& p) const {
  CM_CHECK(owned_.size() == 1 && owned_[0].first == 0, "read whole-arena state", "sharded optimizer state");
  return v_.slice(0, p.offset, p.offset + p.numel).view(p.shape);
}

Tensor AdamW::clip_gradients() {
  // sum of squares on the stream: one ops::grad_sq_sum launch over the arena
  std::vector<ops::ParamSegment> all;
  for (const auto& p : model_.params()) all.push_back({p.offset, p.numel, p.weight_decay});
  const Tensor sq = ops::grad_sq_sum(model_.grad_arena(), all);
  clip_gradients(sq);
  return sq;
}

void AdamW::clip_gradients(const Tensor& sq) {
  // min(1, clip / (norm + 1e-6)), applied to the gradients inside step()
  clip_scale_ = cfg_.grad_clip > 0 ? ops::clip_coefficient(sq, float(cfg_.grad_clip)) : Tensor();
}

void AdamW::read_step_values_when_run() {
  if (!step_values_.lr.defined()) step_values_ = {Tensor::zeros({1}), Tensor::zeros({1}, DType::i64)};
}

void AdamW::advance(double lr) {
  CM_CHECK(step_values_.lr.defined(), "call read_step_values_when_run() before a graph replays the update",
           "advance() without step tensors");
  ++t_;
  step_values_.lr.data<float>()[0] = float(lr);
  step_values_.step.data<int64_t>()[0] = t_;
}

void AdamW::step(double lr) {
  if (step_values_.lr.defined()) advance(lr);
  else ++t_;
  // One fused ops::adamw_step launch per owned range: matrices decay, norms do not.
  ops::AdamWConfig c;
  c.lr = float(lr), c.beta1 = float(cfg_.beta1), c.beta2 = float(cfg_.beta2), c.eps = float(cfg_.eps);
  c.weight_decay = float(cfg_.weight_decay);
  for (size_t i = 0; i < owned_.size(); ++i) {
    const auto [b, e] = owned_[i];
    if (b == e) continue;
    const int64_t s = state_offset_[i];
    const Tensor p = model_.param_arena().slice(0, b, e), g = model_.grad_arena().slice(0, b, e);
    const Tensor m = m_.slice(0, s, s + e - b), v = v_.slice(0, s, s + e - b);
    if (step_values_.lr.defined()) ops::adamw_step(p, g, m, v, segments_[i], c, step_values_, clip_scale_);
    else ops::adamw_step(p, g, m, v, segments_[i], c, t_, clip_scale_);
  }
  clip_scale_ = Tensor();
}

}  // namespace coremesh::train
