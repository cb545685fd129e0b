// `coremesh info`: what this machine offers coremesh.
#include <cblas.h>
#include <fmt/format.h>

#include "commands.hpp"
#include "coremesh/runtime/device.hpp"

namespace coremesh::cli {

void register_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Show the device, its cores and the libraries in use");
  cmd->callback([] {
    auto& device = runtime::Device::default_device();
    const auto spec = device.spec();
    const auto limit = device.limit();
    fmt::print("coremesh {}\n", "0.1.0");
    fmt::print("device {}: {} worker cores, spec cube {} / vector {}, limit cube {} / vector {}\n",
               device.id(), device.num_cores(), spec.cube, spec.vector, limit.cube, limit.vector);
    fmt::print("OpenBLAS: {}\n", openblas_get_config());
  });
}

}  // namespace coremesh::cli
