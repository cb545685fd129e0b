// Learning-rate schedule: linear warmup from 0 to max_lr over warmup_steps,
// then cosine decay to min_lr at total_steps, min_lr afterwards.
//   lr(s) = max_lr * (s+1) / warmup                                s < warmup
//   lr(s) = min_lr + (max_lr - min_lr) * 0.5 * (1 + cos(pi * p))  p = (s - warmup) / (total - warmup)
#pragma once

#include <cstdint>

namespace coremesh::train {

struct LrSchedule {
  double max_lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;

  void validate() const;
  double at(int64_t step) const;  // step counts from 0
};

}  // namespace coremesh::train
