// An instantiated graph: passes run, every kernel built (tiling resolved
// from the op cache once), ready to replay on a stream as one launch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "coremesh/graph/graph.hpp"
#include "coremesh/graph/passes.hpp"

namespace coremesh::runtime {
class KernelDag;
}

namespace coremesh::graph {

struct InstantiateOptions {
  bool passes = true;  // run_passes before building the kernels
};

class Exec {
 public:
  // Runs every node on `stream` (a stream of the capture's device) with the
  // core limits it was captured under; nodes run in an order the edges
  // allow, those captured on other streams concurrently as they did there.
  // The stream's later work waits for the whole graph. Asynchronous.
  void replay(runtime::Stream& stream);

  const Graph& graph() const { return graph_; }  // after the passes
  const std::vector<PassResult>& pass_results() const { return passes_; }
  size_t captured_nodes() const { return captured_nodes_; }
  size_t nodes() const { return graph_.nodes().size(); }
  const std::string& dump_before_passes() const { return before_; }

 private:
  friend Exec instantiate(Graph graph, const InstantiateOptions& options);
  Graph graph_;
  std::vector<PassResult> passes_;
  size_t captured_nodes_ = 0;
  std::string before_;
  std::shared_ptr<runtime::KernelDag> dag_;
};

Exec instantiate(Graph graph, const InstantiateOptions& options = {});

}  // namespace coremesh::graph
