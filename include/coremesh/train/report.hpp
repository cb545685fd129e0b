// A self-contained HTML training report: inline SVG plots (no script, no
// network), readable offline and by headless browsers.
//   - training and validation loss over steps
//   - tokens/s over steps
//   - expert load heatmap: rows are (MoE layer, expert), columns are logged
//     steps, colour is the expert's share of its layer's tokens
//   - a summary table (config, final numbers)
//   - the greedy samples written at each validation
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

struct ReportData {
  std::string title = "coremesh training report";
  std::vector<std::pair<std::string, std::string>> summary;  // key, value rows
  std::vector<StepRecord> steps;
  std::vector<ValRecord> validation;
  std::vector<ExpertLoadRecord> expert_load;
  std::vector<SampleRecord> samples;  // greedy samples at each validation
};

std::string render_report_html(const ReportData& data);
// Writes the HTML atomically and returns the path.
std::string write_report(const std::string& path, const ReportData& data);

}  // namespace coremesh::train
