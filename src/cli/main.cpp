// The coremesh executable: one CLI11 app, one file per subcommand.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

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
  // The manual: `coremesh --help` is the man page (the installed package has no other).
  app.footer(R"(EXAMPLES
  coremesh info                                 the device, its cores, the libraries
  coremesh train --config cfg.json --steps 500  train; --dry-run: size, FLOPs, memory
  coremesh run -n 4 ./prog                      an OpenSHMEM program on 4 PEs
                                                (= oshrun -n 4 ./prog; build it with
                                                oshcc prog.c -o prog, or oshc++)
  coremesh COMMAND --help                       every option of a command

ENVIRONMENT
  COREMESH_CORES           worker cores of the device (default: the CPUs)
  COREMESH_PIN             0: leave thread placement to the OS
  COREMESH_SPIN_US         microseconds workers spin before sleeping (default 50)
  COREMESH_WAIT_TIMEOUT_S  a longer wait reports what it waits on (default 300; 0: never)
  COREMESH_ALLOC_CACHE_MB  cached host memory cap (default 1024; 0: no cache)
  COREMESH_PROFILE=DIR     write kernel_details.csv and trace.json (Perfetto) at exit
  COREMESH_LOG_LEVEL       trace, debug, info, warn, error or off
  COREMESH_HEAP_SIZE       symmetric heap per PE (run --heap; else SHMEM_SYMMETRIC_SIZE,
                           else 512M)
  COREMESH_TRANSPORT       how PEs reach each other: shm, shm-rma, ucx, mpi
  COREMESH_PES_PER_HOST    under mpirun: PEs [0,k), [k,2k)... form a host (simulated
                           hosts on one machine; 1: the network between all PEs)
  COREMESH_HOST_SOFT_LIMIT_MB
                           soft cap on a PE's host memory in MiB: past it, allocations
                           wait for queued work (default: train's, from its estimate;
                           0: none)
  COREMESH_SYMMETRIC_DATA  0: global variables are not symmetric
  SHMEM_VERSION, SHMEM_INFO, SHMEM_DEBUG  the OpenSHMEM variables

EXIT STATUS
  0: success; 1: an error, with a message that says what to change; train stopped
  by SIGINT/SIGTERM: 130/143 after a checkpoint; run: the status of the job.

SEE ALSO
  oshcc, oshc++, oshrun; find_package(coremesh) or pkg-config coremesh for C++;
  import coremesh (Python); README.md and docs/ of the source tree.)");
  coremesh::cli::register_info_command(app);
  coremesh::cli::register_demo_command(app);
  coremesh::cli::register_run_command(app);
  coremesh::cli::register_train_command(app);
  coremesh::cli::register_tune_command(app);
  coremesh::cli::register_generate_command(app);
  coremesh::cli::register_eval_command(app);
  coremesh::cli::register_schedule_command(app);
  coremesh::cli::register_tokenizer_command(app);
  coremesh::cli::register_simulate_commands(app);
  coremesh::cli::register_calibrate_command(app);
  // `coremesh run -n 2 -- prog args`: the "--" that ends run's own options
  // goes (CLI11's prefix command takes the program's name as that end).
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "run")
    for (size_t i = 1; i < args.size() && args[i].rfind('-', 0) == 0; i += args[i] == "-n" || args[i] == "--np" || args[i] == "--heap" ? 2 : 1)
      if (args[i] == "--") {
        args.erase(args.begin() + std::ptrdiff_t(i));
        break;
      }
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  app.name(argv[0]);  // as parse(argc, argv) would: "Usage: coremesh ..."
  try {
    app.parse(args);
  } catch (const CLI::ExtrasError& e) {
    // CLI11 (2.x) joins the extras in reverse (rjoin): say them as they were typed
    std::vector<std::string> extras;
    for (const CLI::App* a = &app; a != nullptr;) {
      const auto left = a->remaining(false);
      extras.insert(extras.end(), left.begin(), left.end());
      const auto subs = a->get_subcommands();
      a = subs.empty() ? nullptr : subs.front();
    }
    std::fprintf(stderr, "The following argument%s not expected: %s\nRun with --help for more information.\n",
                 extras.size() == 1 ? " was" : "s were", fmt::format("{}", fmt::join(extras, " ")).c_str());
    return 1;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;  // --help: 0; a bad option: 1, as documented (CLI11 has its own codes)
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coremesh: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
