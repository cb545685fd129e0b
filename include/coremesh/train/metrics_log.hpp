// metrics.jsonl: the run's numbers for programs (as torchtitan's and
// nanoGPT's logs are read), one JSON object per optimizer step, in the run
// directory. The leader (PE 0) writes it; the HTML report is drawn from it.
//
// A line (keys in this order; "val_loss" and "sample" only on the steps that
// validated and sampled; "expert_*" empty without MoE layers):
//
//   {"step": 12,               optimizer steps done: 1-based, checkpoint step_12 is after it
//    "loss": 2.91,             training cross entropy, nats per token (mean over the step)
//    "aux_loss": 0.0012,       balance loss (0 when off)
//    "val_loss": 2.95,         validation cross entropy, nats per token (steps that validated)
//    "val_bits_per_byte": 1.9, the same loss in bits per byte of the scored text
//    "lr": 0.003,              learning rate of the step
//    "grad_norm": 0.84,        global gradient norm before clipping
//    "tokens": 98304,          tokens trained on so far (every data-parallel rank)
//    "tokens_per_s": 41234.5,  "step_seconds": 0.099,
//    "mfu": 0.21,              model FLOPs / (time x measured GEMM peak), in [0, 1]
//    "expert_balance": [1.12, 1.08],        per MoE layer: busiest expert's tokens / mean
//    "expert_load": [[0.13, 0.12, ...], ...], per MoE layer: each routed expert's share of its tokens
//    "memory": {"tensor_bytes": ..., "cached_bytes": ..., "optimizer_state_bytes": ...,
//               "peak_rss_bytes": ...},               the leader process (MemoryRecord)
//    "sample": {"prompt": "...", "text": "..."},  sampled continuation (steps that sampled)
//    "time": 1718000000.123}   Unix time the line was written
//
// Safety: each line goes out in one write(2) as soon as the step is done (no
// user-space buffer), so a crash loses at most the line being written; a
// reader skips a last line without its newline. On --resume from a
// checkpoint of step N the file keeps the resumed run's lines of steps <= N
// (byte for byte) and drops later ones before appending: no step is listed
// twice, none is lost. Non-ASCII sample bytes that are not UTF-8 are
// replaced by U+FFFD.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "coremesh/train/metrics.hpp"
#include "coremesh/train/report.hpp"

namespace coremesh::train {

// Memory of this process when the line was written.
struct MemoryRecord {
  int64_t tensor_bytes = 0;  // live tensors of the host allocator (rounded sizes); a parallel
                             // run's parameter and gradient arenas live in the symmetric heap
  int64_t cached_bytes = 0;  // freed blocks the host allocator keeps for reuse
  int64_t optimizer_state_bytes = 0;  // this PE's AdamW m and v (ZeRO-1: its shards)
  int64_t peak_rss_bytes = 0;         // high-water mark of the resident set (getrusage)
};
// The allocator's and getrusage's numbers (optimizer_state_bytes is the caller's).
MemoryRecord memory_now();

// One line of metrics.jsonl. `record.step` counts from 0 as everywhere in
// the trainer; the file's "step" is record.step + 1.
struct MetricsLine {
  StepRecord record;  // loss, aux_loss, lr, grad_norm, tokens/s, mfu, worst balance, seconds
  double val_loss = -1;  // < 0: no validation at this step
  int64_t tokens = 0;
  std::vector<std::vector<double>> expert_load;  // [moe layer][expert] share of the layer's tokens
  MemoryRecord memory;
  std::optional<SampleRecord> sample;
  double time = 0;  // Unix seconds (MetricsLog::append stamps it)
  double val_bits_per_byte = -1;  // val_loss per byte of the scored text, in bits (< 0: unknown)
};

nlohmann::ordered_json to_json(const MetricsLine& line);
// Throws InvalidArgument naming the missing or mistyped key.
MetricsLine metrics_line_from_json(const nlohmann::json& j);

// The lines of a metrics.jsonl; a last line without its newline (cut by a
// crash) is skipped, any other malformed line is refused with its number.
std::vector<MetricsLine> read_metrics(const std::string& path);

// The metrics.jsonl of the run a checkpoint belongs to: <run>/metrics.jsonl
// for <run>/checkpoints/step_N.safetensors.
std::string metrics_path_of_checkpoint(const std::string& checkpoint);

// The report's series (steps, validation, expert load every `heat_every`
// steps, samples) from the lines.
void fill_report(ReportData& d, const std::vector<MetricsLine>& lines, int64_t heat_every);

// The writer. Not thread-safe: one trainer thread appends.
class MetricsLog {
 public:
  // Starts `path` for a run whose next step is `steps_done` + 1: the lines of
  // steps <= steps_done of `history` (a metrics.jsonl, possibly `path`
  // itself; "" or a missing file: none) are kept, every other line of `path`
  // goes. A fresh run (steps_done 0) starts an empty file.
  MetricsLog(std::string path, int64_t steps_done, const std::string& history = "");
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Writes one line, stamped with the time now (one write(2); throws if the
  // disk refuses it).
  void append(const MetricsLine& line);
  const std::string& path() const { return path_; }
  // Whether the kept line of step steps_done lacks a val_loss.
  bool validation_missing() const { return !kept_last_.empty() && !last_validated_; }
  // Adds a validation (and its sample) to the kept line of step steps_done
  // (a run stopped during or just before it validates on resume); rewrites the file.
  void add_validation(double val_loss, double val_bits_per_byte, const std::optional<SampleRecord>& sample = {});

 private:
  std::string path_;
  int fd_ = -1;
  std::string kept_last_;  // the kept line of step steps_done, or ""
  bool last_validated_ = false;
};

}  // namespace coremesh::train
