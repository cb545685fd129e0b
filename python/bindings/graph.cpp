// coremesh.graph: capture the work launched on a stream, instantiate it
// (passes, kernels built once) and replay it (include/coremesh/graph/).
#include "common.hpp"
#include "coremesh/graph/exec.hpp"
#include "coremesh/graph/graph.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::python {

void bind_graph(py::module_& m) {
  py::class_<graph::Graph>(m, "Graph", "Captured work: nodes (ops with their stream and core limits) and edges.")
      .def("__len__", [](const graph::Graph& g) { return g.nodes().size(); })
      .def("dump", &graph::Graph::dump, "Text form, one line per node: op, tensors, stream, limits, deps.");

  py::class_<graph::PassResult>(m, "PassResult", "What one pass of instantiate did (Exec.pass_results).")
      .def_readonly("name", &graph::PassResult::name, "the pass's name")
      .def_readonly("matches", &graph::PassResult::matches, "patterns rewritten")
      .def_readonly("removed", &graph::PassResult::removed, "nodes fewer than before")
      .def("__repr__", [](const graph::PassResult& r) {
        return fmt::format("PassResult(name='{}', matches={}, removed={})", r.name, r.matches, r.removed);
      });

  py::class_<graph::Exec>(m, "Exec", "An instantiated graph, ready to replay.")
      .def("replay", [](graph::Exec& e, runtime::Stream& s) { without_gil([&] { e.replay(s); }); }, py::arg("stream"),
           "Runs every node on `stream`'s device under the limits it was captured with; asynchronous.")
      .def_property_readonly("captured_nodes", &graph::Exec::captured_nodes, "nodes before the passes")
      .def_property_readonly("nodes", &graph::Exec::nodes, "nodes after the passes")
      .def_property_readonly("pass_results", &graph::Exec::pass_results, "a PassResult per pass, in order")
      .def("dump", [](const graph::Exec& e) { return e.graph().dump(); }, "the graph after the passes")
      .def("dump_before_passes", &graph::Exec::dump_before_passes, "the graph as captured, before the passes");

  m.def("begin_capture", &graph::begin_capture, py::arg("stream"),
        "Records, instead of running, the work launched on `stream` (and on streams that join it through events).");
  m.def("end_capture", &graph::end_capture,
        "Ends this thread's capture and returns the Graph; raises if a forked stream was not joined back.");
  m.def(
      "instantiate",
      [](graph::Graph& g, bool passes) {
        CM_CHECK(!g.nodes().empty(),
                 "capture work first (with graph.capture(stream): ops launched in the block), and instantiate each "
                 "captured Graph once",
                 "graph.instantiate: the graph has no nodes (an earlier instantiate consumed it, or nothing was "
                 "launched on the captured stream)");
        return graph::instantiate(std::move(g), {.passes = passes});
      },
      py::arg("graph"), py::arg("passes") = true,
      "Runs the passes (fusions that respect streams and core limits, dead nodes) and builds every kernel. "
      "Consumes `graph` (it is empty afterwards).");
}

}  // namespace coremesh::python
