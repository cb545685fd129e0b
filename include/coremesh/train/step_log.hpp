// <out_dir>/metrics.jsonl: one JSON line per step at full precision, written
// by the PE that reports, so that runs can be compared number for number
// (a resumed run against an uninterrupted one, a layout against another):
//   {"step": 7, "loss": 5.1234567890123456, "aux_loss": 0, "lr": ..., "grad_norm": ...,
//    "expert_balance": ..., "tokens_per_s": ..., "seconds": ..., "val_loss": ...}
// "step" counts completed steps, as checkpoint names do. Opening the log for
// a run that starts at step s keeps the lines of steps <= s (a resumed run
// replaces what the stopped one logged after its checkpoint) and drops a
// line a kill cut short.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "coremesh/train/metrics.hpp"

namespace coremesh::train {

class StepLog {
 public:
  StepLog(const std::string& path, int64_t first_step);
  ~StepLog();
  StepLog(const StepLog&) = delete;
  StepLog& operator=(const StepLog&) = delete;
  // val_loss < 0: no validation at this step.
  void append(const StepRecord& r, double val_loss);

 private:
  std::FILE* out_ = nullptr;
};

}  // namespace coremesh::train
