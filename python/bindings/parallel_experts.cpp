// coremesh.parallel.ExpertParallelGroup: the expert-parallel exchange
// (parallel/expert_parallel.hpp) over a group of PEs, with its fused forms:
// the experts' first GEMM run per source as its rows land
// (alltoallv_grouped_matmul), the rows on the wire in that GEMM's form (the
// FP8 AlltoAllvQuantGroupedMatMul) and the second GEMM expert by expert
// before combine (grouped_matmul_alltoallv). The GEMMs are Python callables
// that launch ops on the stream; the dispatcher calls them while it enqueues.
#include "common.hpp"
#include "coremesh/parallel/expert_parallel.hpp"

namespace coremesh::python {
namespace {

using parallel::ExpertDispatcher;
using parallel::ShmemExperts;

py::object tensor_or_none(const Tensor& t) { return t.defined() ? py::cast(t) : py::none(); }

}  // namespace

void bind_parallel_experts(py::module_& m) {
  py::class_<ExpertDispatcher::Dispatched>(m, "Dispatched", R"doc(
What a dispatch delivered to this PE (its experts' rows) and what combine and
the backward reuse. rows (R_local, C) grouped by local expert, then by source:
f32, or in the wire's form (bf16; f8e4m3 with scale (R_local, ceil(C/128))
f32); offsets (E_local + 1) i64 its group list; source_offsets (E_local x
sources + 1) i64 the (expert, source) runs; first: the first GEMM's output
where the dispatch ran it (else None).)doc")
      .def_property_readonly("rows", [](const ExpertDispatcher::Dispatched& d) { return d.rows; },
                             "(R_local, C) this PE's experts' rows, grouped by local expert, then by source.")
      .def_property_readonly("scale", [](const ExpertDispatcher::Dispatched& d) { return tensor_or_none(d.scale); },
                             "(R_local, ceil(C/128)) f32 scales of f8e4m3 rows, else None.")
      .def_property_readonly("offsets", [](const ExpertDispatcher::Dispatched& d) { return d.offsets; },
                             "(E_local + 1) i64: the group list of rows.")
      .def_property_readonly("source_offsets", [](const ExpertDispatcher::Dispatched& d) { return d.source_offsets; },
                             "(E_local x sources + 1) i64: the (expert, source) runs of rows.")
      .def_property_readonly("sources", [](const ExpertDispatcher::Dispatched& d) { return d.sources; },
                             "Number of sources (PEs) per local expert in rows.")
      .def_property_readonly("first", [](const ExpertDispatcher::Dispatched& d) { return tensor_or_none(d.first); },
                             "(R_local, first_width) f32: the first GEMM's output where the dispatch ran it, else None.");

  py::class_<ShmemExperts>(m, "ExpertParallelGroup", R"doc(
E routed experts sharded over a group of PEs (pes: world PE numbers in member
order; None: the whole job), E / size on each; rows of width C. Collective:
every member constructs it, and dispatches each (layer, slice) site, in the
same order. max_rows: the most rows a member sends per dispatch; capacity:
rows per (source, expert) at most (-1: none); layers: the sites' layers, each
with `slices` sites.
  dispatch(xp, offsets, layer=0, slice=0, first=None, first_width=0) -> Dispatched
      xp (R, C) f32 grouped by global expert, offsets (E + 1) i64. With
      fused=True and first(rows, scale, offsets, out), a callable that launches
      the experts' first GEMM of `rows` (the form of Dispatched.rows, scale
      where fp8) grouped by `offsets` into out (rows, first_width) f32, the
      dispatch runs it on each source's rows as they land.
  combine(y, d) -> (R, C) f32 in xp's order        y (R_local, C) f32
  matmul_combine(y, gemm, d)   gemm(y, begin, end) launches the experts [begin,
      end) of y's rows; fused, each expert's rows leave as soon as it is done
  combine_backward(dy, d), dispatch_backward(drows, d): the mirrors (f32)
wire: "f32", "bf16" or "f8e4m3": the forward rows as they travel, converted at
the source (the bits of converting them at the owner).)doc")
      .def(py::init([](int experts, int64_t width, int64_t max_rows, std::vector<int> layers, int slices,
                       int64_t capacity, bool fused, const py::object& wire, std::optional<std::vector<int>> pes) {
             ShmemExperts::Shape shape{experts, width, max_rows, capacity, std::move(layers), slices};
             shape.fused = fused;
             shape.wire = dtype_arg(wire);
             parallel::Group group = group_of(std::move(pes));
             return without_gil([&] { return std::make_unique<ShmemExperts>(std::move(group), shape); });
           }),
           py::arg("experts"), py::arg("width"), py::arg("max_rows"), py::arg("layers") = std::vector<int>{0},
           py::arg("slices") = 1, py::arg("capacity") = -1, py::arg("fused") = false, py::arg("wire") = "f32",
           py::arg("pes") = py::none(),
           "Allocates the symmetric buffers; collective over every PE of the job (see the class docstring).")
      .def_property_readonly("first_expert", &ShmemExperts::first_expert, "Global id of this PE's first expert.")
      .def_property_readonly("local_experts", &ShmemExperts::local_experts, "E_local: experts on each PE.")
      .def_property_readonly("receive_rows", &ShmemExperts::receive_rows,
                             "Rows this PE can receive per dispatch (R_local of Dispatched.rows).")
      .def(
          "dispatch",
          [](ShmemExperts& ep, const Tensor& xp, const Tensor& offsets, int layer, int slice, py::object first,
             int64_t first_width) {
            ExpertDispatcher::FirstGemm gemm;
            if (!first.is_none()) {
              CM_CHECK(first_width > 0, "give first_width, the columns of the first GEMM's output",
                       "dispatch with a first GEMM of width {}", first_width);
              gemm = {first_width, [first](const Tensor& rows, const Tensor& scale, const Tensor& offs,
                                           const Tensor& out) { first(rows, tensor_or_none(scale), offs, out); }};
            }
            return ep.dispatch(xp, offsets, {layer, slice}, {}, gemm);
          },
          py::arg("xp"), py::arg("offsets"), py::arg("layer") = 0, py::arg("slice") = 0, py::arg("first") = py::none(),
          py::arg("first_width") = 0,
          "xp (R, C) f32 grouped by global expert, offsets (E + 1) i64 -> Dispatched: the rows of this PE's experts "
          "(optional first GEMM: see the class docstring). Collective over the group, asynchronous.")
      .def("combine", &ShmemExperts::combine, py::arg("y"), py::arg("d"),
           "y (R_local, C) f32 the experts' outputs for d -> (R, C) f32 in xp's row order; collective, asynchronous.")
      .def(
          "matmul_combine",
          [](ShmemExperts& ep, const Tensor& y, py::function gemm, const ExpertDispatcher::Dispatched& d) {
            return ep.matmul_combine(y, [gemm](const Tensor& out, int64_t b, int64_t e) { gemm(out, b, e); }, d);
          },
          py::arg("y"), py::arg("gemm"), py::arg("d"),
          "combine with the second GEMM: gemm(y, begin, end) launches the rows of local experts [begin, end) into y "
          "(R_local, C) f32; fused, each expert's rows leave when done. -> (R, C); collective.")
      .def("combine_backward", &ShmemExperts::combine_backward, py::arg("dy"), py::arg("d"),
           "dy (R, C) f32 -> (R_local, C): a dispatch of dy with d's plan; collective, asynchronous.")
      .def("dispatch_backward", &ShmemExperts::dispatch_backward, py::arg("drows"), py::arg("d"),
           "drows (R_local, C) f32 -> (R, C) in xp's order: a combine with d's plan; collective, asynchronous.");
}

}  // namespace coremesh::python
