// Training metrics and how they reach a person: per-step records, expert
// balance, MFU, and a progress display (a bar with ETA on a terminal, plain
// log lines otherwise).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace coremesh::train {

struct StepRecord {
  int64_t step = 0;
  double loss = 0;        // training cross entropy (mean over the step's tokens)
  double aux_loss = 0;    // balance loss (0 when off)
  double lr = 0;
  double grad_norm = 0;   // before clipping
  double tokens_per_s = 0;
  double mfu = 0;         // model FLOPs / (time * peak), in [0, 1]
  double expert_balance = 0;  // max/mean tokens per expert, worst MoE layer (1 = perfect)
  double seconds = 0;     // wall time of the step
};

struct ValRecord {
  int64_t step = 0;
  double loss = 0;             // nats per token
  double bits_per_byte = -1;   // the same loss per byte of text (< 0: unknown)
};

// max / mean over experts of `counts` (tokens routed to each expert); 1 is
// perfectly balanced, E means everything went to one expert; 0 when empty.
double expert_balance(const std::vector<double>& counts);

// Measured fp32 GEMM peak of one core (512^3, the faster of OpenBLAS sgemm
// and coremesh's kernel, best over >= 0.3 s), FLOP/s, times `threads`;
// measured on first use and cached.
double measured_peak_flops(int threads);

// Measures again and keeps the higher peak: a shared core's speed drifts by
// 20% over seconds, so a run measures at its start and at its end.
double remeasure_peak_flops(int threads);

// Human-readable numbers: 1.23M, 4.5 GiB, 01:02:03.
std::string format_count(double n);
std::string format_bytes(double bytes);
std::string format_duration(double seconds);

// Prints progress. On a TTY: one redrawn line "[#####     ] 42% step 420/1000
// loss 1.234 ... ETA 00:03:12"; otherwise one log line every `log_every` steps.
class Progress {
 public:
  Progress(int64_t total_steps, int64_t first_step, int log_every, std::FILE* out = stderr,
           int force_tty = -1);
  void update(const StepRecord& r, double val_loss = -1);
  void message(const std::string& line);  // a line that does not break the bar
  void finish();
  bool is_tty() const { return tty_; }

 private:
  std::string line_for(const StepRecord& r, double val_loss) const;
  int64_t total_, first_;
  int log_every_;
  std::FILE* out_;
  bool tty_;
  double start_s_;
  double last_val_ = -1;
  bool bar_drawn_ = false;
};

double now_seconds();

}  // namespace coremesh::train
