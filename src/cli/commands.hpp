// Subcommands of the coremesh executable; each lives in its own file.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

namespace coremesh::cli {

// The command line as main() received it (a parallel `coremesh train`
// starts its PEs with it).
const std::vector<std::string>& command_line();

// The finite number `text` spells, all of it ("1e-3", not "1x", "nan" or "inf").
inline std::optional<double> finite_number(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// A number option's check: finite and within [lo, hi]. CLI::Range and
// CLI::PositiveNumber let nan through (every comparison with NaN is false).
inline CLI::Validator finite_in(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        const std::optional<double> v = finite_number(text);
        if (!v) return fmt::format("'{}' is not a finite number", text);
        if (*v < lo || *v > hi) return fmt::format("{} is not in [{}, {}]", text, lo, hi);
        return {};
      },
      fmt::format("NUMBER in [{}, {}]", lo, hi));
}

void register_info_command(CLI::App& app);  // info.cpp
void register_demo_command(CLI::App& app);  // demo.cpp
void register_run_command(CLI::App& app);   // run.cpp (SHMEM launcher)
void register_train_command(CLI::App& app); // train.cpp (MoE training)
void register_tune_command(CLI::App& app);  // train.cpp (the tiling tuner)
void register_generate_command(CLI::App& app);  // generate.cpp
void register_eval_command(CLI::App& app);      // generate.cpp
void register_schedule_command(CLI::App& app);
void register_tokenizer_command(CLI::App& app);
void register_simulate_commands(CLI::App& app);  // simulate.cpp (simulate, plan)
void register_calibrate_command(CLI::App& app);  // calibrate.cpp  // tokenizer.cpp (SentencePiece models)  // schedule.cpp (pipeline schedules, no training)

}  // namespace coremesh::cli
