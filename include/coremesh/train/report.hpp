// A self-contained HTML training report: inline SVG plots (no script, no
// network), readable offline and by headless browsers.
//   - training and validation loss over steps
//   - tokens/s over steps
//   - expert load heatmap: rows are (MoE layer, expert), columns are logged
//     steps, colour is the expert's share of its layer's tokens
//   - a pipeline's executed schedule: per rank, its actions over the last
//     step's time (F, B, I, W, F&B, P2P), coloured by kind
//   - a summary table (config, final numbers)
//   - the samples written at each validation
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "coremesh/train/metrics.hpp"

namespace coremesh::train {

struct ExpertLoadRecord {
  int64_t step = 0;
  // [moe layer][expert] fraction of that layer's routed assignments.
  std::vector<std::vector<double>> load;
};

struct SampleRecord {
  int64_t step = 0;
  std::string prompt, text;  // text: the continuation
};

// One action of a pipeline rank as it ran on the stream (ms from the step's start).
struct ExecutedAction {
  int rank = 0;
  std::string action, cat;  // "0F3", "F" (F, B, I, W, F&B, p2p, grad sum)
  double start_ms = 0, end_ms = 0;
};

struct ReportData {
  std::string title = "coremesh training report";
  std::vector<std::pair<std::string, std::string>> summary;  // key, value rows
  std::vector<StepRecord> steps;
  std::vector<ValRecord> validation;
  std::vector<ExpertLoadRecord> expert_load;
  std::vector<SampleRecord> samples;  // samples at each validation
  std::string sampling;                // how they were drawn, e.g. "temperature 0.8, top-k 40"
  std::string schedule;                // the pipeline's schedule, e.g. "1f1b pp 2, 4 micro-batches"
  std::vector<ExecutedAction> executed;  // its last step; empty without a pipeline
};

std::string render_report_html(const ReportData& data);
// Writes the HTML atomically and returns the path.
std::string write_report(const std::string& path, const ReportData& data);

}  // namespace coremesh::train
