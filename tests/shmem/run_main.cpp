// cm_shmem_run: the `run` subcommand of the coremesh CLI (src/cli/run.cpp)
// in an executable of its own, so the shmem tests do not depend on the rest
// of the CLI. `cm_shmem_run run -n 4 prog` == `coremesh run -n 4 prog`.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "../../src/cli/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"coremesh SHMEM launcher (test build)"};
  app.require_subcommand(1);
  coremesh::cli::register_run_command(app);
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
