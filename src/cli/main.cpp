// The coremesh executable: one CLI11 app, one file per subcommand.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "commands.hpp"

namespace coremesh::cli {
namespace {
std::vector<std::string> g_command_line;
}
const std::vector<std::string>& command_line() { return g_command_line; }
}  // namespace coremesh::cli

int main(int argc, char** argv) {
  coremesh::cli::g_command_line.assign(argv, argv + argc);
  CLI::App app{"coremesh: core-level and card-level parallel training of MoE transformers"};
  app.require_subcommand(1);
  coremesh::cli::register_info_command(app);
  coremesh::cli::register_demo_command(app);
  coremesh::cli::register_run_command(app);
  coremesh::cli::register_train_command(app);
  coremesh::cli::register_generate_command(app);
  coremesh::cli::register_eval_command(app);
  coremesh::cli::register_schedule_command(app);
  coremesh::cli::register_tokenizer_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coremesh: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
