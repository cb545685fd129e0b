#include "coremesh/graph/exec.hpp"

#include <unordered_map>

#include "coremesh/runtime/dag.hpp"
#include "coremesh/runtime/op_registry.hpp"

namespace coremesh::graph {

Exec instantiate(Graph graph, const InstantiateOptions& options) {
  CM_CHECK(graph.device() != nullptr, "instantiate a graph that end_capture() returned", "graph without a device");
  Exec exec;
  exec.captured_nodes_ = graph.nodes().size();
  exec.before_ = graph.dump();
  if (options.passes) exec.passes_ = run_passes(graph);
  std::unordered_map<int, int> index;
  std::vector<runtime::DagNode> nodes;
  for (Node& n : graph.nodes()) {
    runtime::DagNode d;
    d.kernel = n.kernel ? std::move(*n.kernel) : runtime::build_kernel(*n.op);  // fused nodes: built here, once
    n.kernel.reset();
    d.limits = n.limits;
    d.stream_id = n.stream_id == graph.origin_stream() ? -1 : n.stream_id;
    d.priority = n.priority;
    for (int dep : n.deps) d.deps.push_back(index.at(dep));
    index[n.id] = static_cast<int>(nodes.size());
    nodes.push_back(std::move(d));
  }
  exec.dag_ = std::make_shared<runtime::KernelDag>(*graph.device(), std::move(nodes));
  exec.graph_ = std::move(graph);
  return exec;
}

void Exec::replay(runtime::Stream& stream) {
  CM_CHECK(dag_ != nullptr, "replay a graph that instantiate() returned", "empty graph executable");
  dag_->launch(stream);
}

}  // namespace coremesh::graph
