// `coremesh run -n N [--heap SIZE] [--tag-output] prog args...`: the SHMEM
// launcher (coremesh::shmem::launch).
#include <cstdio>
#include <cstdlib>

#include "commands.hpp"
#include "coremesh/core/env.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/shmem/launch.hpp"

namespace coremesh::cli {

void register_run_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Start N SHMEM processing elements (PEs) of a program");
  struct Args {
    int n_pes = 1;
    std::string heap;
    bool tag_output = false;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("-n,--np", args->n_pes, "number of PEs")->required()->check(CLI::Range(1, 256));
  cmd->add_option("--heap", args->heap, "symmetric heap size per PE, e.g. 1G (default: "
                                        "COREMESH_HEAP_SIZE, else SHMEM_SYMMETRIC_SIZE, "
                                        "else 512M)");
  cmd->add_flag("--tag-output", args->tag_output, "prefix every output line with [pe k]");
  cmd->footer(R"(Starts N copies of the program, the PEs of one OpenSHMEM job on this machine
(oshrun is another name for this command; under mpirun the PEs may span many
machines instead). Everything from the program name on is the program's.
If a PE dies, the job stops within seconds and names it; the command's status
is the job's: 0 when every PE exits with 0.)");
  // Everything from the program name on belongs to the program.
  cmd->prefix_command();
  cmd->callback([cmd, args] {
    shmem::LaunchOptions options;
    options.n_pes = args->n_pes;
    if (!args->heap.empty()) options.heap_bytes = static_cast<size_t>(env::parse_size(args->heap));
    options.tag_output = args->tag_output;
    options.argv = cmd->remaining();
    // A misspelled option would otherwise be taken for the program's name.
    CM_CHECK(options.argv.empty() || options.argv[0].empty() || options.argv[0][0] != '-',
             "see coremesh run --help (a program whose name starts with '-' goes as ./NAME)",
             "unknown option '{}' of coremesh run", options.argv.empty() ? "" : options.argv[0]);
    const int status = shmem::launch(options);
    std::fflush(stdout);
    std::exit(status);  // the job's status is the command's status
  });
}

}  // namespace coremesh::cli
