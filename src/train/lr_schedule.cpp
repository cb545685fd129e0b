#include "coremesh/train/lr_schedule.hpp"

#include <cmath>

#include "coremesh/core/error.hpp"

namespace coremesh::train {

void LrSchedule::validate() const {
  CM_CHECK(max_lr > 0 && std::isfinite(max_lr), "use a positive learning rate such as 1e-3",
           "lr = {} must be positive", max_lr);
  CM_CHECK(min_lr >= 0 && min_lr <= max_lr, "set min_lr between 0 and lr",
           "min_lr = {} must be in [0, lr = {}]", min_lr, max_lr);
  CM_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps,
           "use warmup_steps between 0 and steps", "warmup_steps = {} with steps = {}",
           warmup_steps, total_steps);
  CM_CHECK(total_steps > 0, "train at least one step", "steps = {} must be positive", total_steps);
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return max_lr * double(step + 1) / double(warmup_steps);
  if (step >= total_steps) return min_lr;
  const int64_t decay = total_steps - warmup_steps;
  if (decay <= 0) return min_lr;
  const double p = double(step - warmup_steps) / double(decay);
  return min_lr + (max_lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * p));
}

}  // namespace coremesh::train
