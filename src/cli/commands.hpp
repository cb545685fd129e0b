// Subcommands of the coremesh executable; each lives in its own file.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace coremesh::cli {

// The command line as main() received it (a parallel `coremesh train`
// starts its PEs with it).
const std::vector<std::string>& command_line();

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
