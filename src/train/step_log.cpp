#include "coremesh/train/step_log.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "coremesh/core/error.hpp"
#include "coremesh/train/safetensors.hpp"

namespace coremesh::train {

StepLog::StepLog(const std::string& path, int64_t first_step) {
  std::string kept;
  if (first_step > 0) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      const bool whole = j.is_object() && j.contains("step") && j["step"].is_number_integer();
      if (whole && j["step"].get<int64_t>() <= first_step) kept += line + "\n";
    }
  }
  write_file_atomic(path, kept);
  out_ = std::fopen(path.c_str(), "a");
  CM_CHECK(out_ != nullptr, "check that the run's --out directory is writable", "cannot open '{}': {}", path,
           std::strerror(errno));
}

StepLog::~StepLog() {
  if (out_) std::fclose(out_);
}

void StepLog::append(const StepRecord& r, double val_loss) {
  std::string line = fmt::format(
      "{{\"step\": {}, \"loss\": {:.17g}, \"aux_loss\": {:.17g}, \"lr\": {:.17g}, \"grad_norm\": {:.17g}, "
      "\"expert_balance\": {:.17g}, \"tokens_per_s\": {:.6g}, \"seconds\": {:.6g}",
      r.step + 1, r.loss, r.aux_loss, r.lr, r.grad_norm, r.expert_balance, r.tokens_per_s, r.seconds);
  if (val_loss >= 0) line += fmt::format(", \"val_loss\": {:.17g}", val_loss);
  line += "}\n";
  // a full disk loses log lines, not the run: checkpoints report their own failures
  if (std::fputs(line.c_str(), out_) >= 0) std::fflush(out_);
}

}  // namespace coremesh::train
