// coremesh.parallel: the fused TP comm+GEMM operators (parallel/fused_comm.hpp)
// and the unfused sequences they equal, over a group of PEs (default: every
// PE of the job). Collective: every PE of the group constructs and calls the
// same objects in the same order. Results are valid once the stream gets
// there (runtime.synchronize() before reading them on the host).
#include "common.hpp"
#include "coremesh/parallel/fused_comm.hpp"
#include "coremesh/parallel/tensor_parallel.hpp"
#include "coremesh/shmem/shmem.hpp"

namespace coremesh::python {

parallel::Group group_of(std::optional<std::vector<int>> pes) {
  if (!pes) {
    pes.emplace();
    for (int p = 0; p < shmem::n_pes(); ++p) pes->push_back(p);
  }
  return parallel::Group::of(*pes, shmem::my_pe());
}

namespace {

py::tuple norm_out(const ops::RMSNormResidualOut& o) { return py::make_tuple(o.h, o.y, o.rstd); }
py::tuple grads_out(const parallel::FusedTensorComm::Grads& g) { return py::make_tuple(g.dx, g.dw); }

}  // namespace

void bind_parallel(py::module_& m) {
  py::class_<parallel::FusedTensorComm>(m, "FusedTensorComm", R"doc(
Fused TP operators over a group of PEs (pes: world PE numbers in member order;
None: the whole job). capacity: elements of the largest whole tensor a call
moves (N x K gathered, N x C summed); max_rows: the most rows N.
  allgather_matmul(x, w) -> (y, gathered)   y = all_gather(x) w^T
  matmul_reduce_scatter(h, w) -> y           this member's rows of sum(h w^T)
  matmul_allreduce(h, w) -> y                sum(h w^T) on every member
  grouped_matmul_allreduce(h, w, offsets) -> y  sum(grouped_matmul(h, w, offsets)), w (G, C, F)
  add_rmsnorm_allreduce(x, y, w, eps) -> (h, y, rstd)  rmsnorm_residual(x, sum(y), w)
The first three take layout="kn" for w (K, O) (y = x w). Their backward halves
(f32, w (O, K)) return (dx, dw): allgather_matmul_backward(dy, gathered, w)
(dx = this member's rows of sum(dy w), a matmul_reduce_scatter with kn),
matmul_reduce_scatter_backward(dy, h, w) (dh = all_gather(dy) w, an
allgather_matmul with kn) and the static matmul_allreduce_backward(dy, h, w).
All but the last take fp8 too (ops.QuantizedTensor: x, h from quantize_fp8_act,
w from quantize_fp8_weight; the gathered input comes back quantized).
Each equals its unfused sequence (reference_* with a TensorParallelGroup) bit for bit.)doc")
      .def(py::init([](int64_t capacity, int64_t max_rows, std::optional<std::vector<int>> pes, int chunks,
                       int comm_cores) {
             return std::make_unique<parallel::FusedTensorComm>(group_of(std::move(pes)), capacity, max_rows,
                                                                parallel::FusedCommOptions{chunks, comm_cores});
           }),
           py::arg("capacity"), py::arg("max_rows"), py::arg("pes") = py::none(), py::arg("chunks") = 0,
           py::arg("comm_cores") = 0,
           "Allocates the symmetric buffers (collective). chunks (1..8), comm_cores: matmul_allreduce's row "
           "chunks and the comm stream's vector cores (0: the op cache's tiling).")
      .def("allgather_matmul",
           [](parallel::FusedTensorComm& f, const Tensor& x, const Tensor& w, bool keep_input,
              const std::string& layout) {
             auto g = f.allgather_matmul(x, w, keep_input, layout_arg(layout));
             return py::make_tuple(g.y, g.gathered.defined() ? py::cast(g.gathered) : py::none());
           },
           py::arg("x"), py::arg("w"), py::arg("keep_input") = true, py::arg("layout") = "nk",
           "x (n,K) this member's rows, w (O,K) ['kn': (K,O)] -> (y (tp n, O) f32, gathered (tp n, K) in "
           "member order, None without keep_input); collective, asynchronous.")
      .def("allgather_matmul",
           [](parallel::FusedTensorComm& f, const ops::QuantizedTensor& x, const ops::QuantizedTensor& w) {
             auto g = f.allgather_matmul(x, w);
             return py::make_tuple(g.y, g.gathered);
           },
           py::arg("x"), py::arg("w"), "fp8: x, w QuantizedTensor -> (y f32, gathered QuantizedTensor).")
      .def("matmul_reduce_scatter",
           [](parallel::FusedTensorComm& f, const Tensor& h, const Tensor& w, const std::string& layout) {
             return f.matmul_reduce_scatter(h, w, layout_arg(layout));
           },
           py::arg("h"), py::arg("w"), py::arg("layout") = "nk",
           "h (N,F), w (C,F) ['kn': (F,C)] -> this member's N/tp rows of the members' h w^T summed in member "
           "order (N % tp == 0); collective, asynchronous.")
      .def("matmul_reduce_scatter",
           py::overload_cast<const ops::QuantizedTensor&, const ops::QuantizedTensor&>(
               &parallel::FusedTensorComm::matmul_reduce_scatter),
           py::arg("h"), py::arg("w"), "fp8: h, w QuantizedTensor -> f32 rows.")
      .def("matmul_allreduce",
           [](parallel::FusedTensorComm& f, const Tensor& h, const Tensor& w, const std::string& layout) {
             return f.matmul_allreduce(h, w, layout_arg(layout));
           },
           py::arg("h"), py::arg("w"), py::arg("layout") = "nk",
           "h (N,F), w (C,F) ['kn': (F,C)] -> (N,C): the members' h w^T summed in member order, on every "
           "member; collective, asynchronous.")
      .def("matmul_allreduce",
           py::overload_cast<const ops::QuantizedTensor&, const ops::QuantizedTensor&>(
               &parallel::FusedTensorComm::matmul_allreduce),
           py::arg("h"), py::arg("w"), "fp8: h, w QuantizedTensor -> (N,C) f32.")
      .def("grouped_matmul_allreduce",
           py::overload_cast<const Tensor&, const Tensor&, const Tensor&>(
               &parallel::FusedTensorComm::grouped_matmul_allreduce),
           py::arg("h"), py::arg("w"), py::arg("offsets"),
           "h (N,F) grouped by offsets (G+1) i64, w (G,C,F) -> (N,C): the members' grouped_matmul summed in "
           "member order, on every member; collective, asynchronous.")
      .def("grouped_matmul_allreduce",
           py::overload_cast<const ops::QuantizedTensor&, const ops::QuantizedTensor&, const Tensor&>(
               &parallel::FusedTensorComm::grouped_matmul_allreduce),
           py::arg("h"), py::arg("w"), py::arg("offsets"), "fp8: h, w QuantizedTensor -> (N,C) f32.")
      .def("add_rmsnorm_allreduce",
           [](parallel::FusedTensorComm& f, const Tensor& x, const Tensor& y, const Tensor& w, float eps) {
             return norm_out(f.add_rmsnorm_allreduce(x, y, w, eps));
           },
           py::arg("x"), py::arg("y"), py::arg("w"), py::arg("eps") = 1e-6f,
           "x (N,C) the residual (same on every member), y (N,C) this member's part, w (C) -> (h, y, rstd): "
           "h = x + sum(y), y = rmsnorm(h) w; collective, asynchronous.")
      .def("allgather_matmul_backward",
           [](parallel::FusedTensorComm& f, const Tensor& dy, const Tensor& gathered, const Tensor& w) {
             return grads_out(f.allgather_matmul_backward(dy, gathered, w));
           },
           py::arg("dy"), py::arg("gathered"), py::arg("w"),
           "dy (tp n, O), gathered (tp n, K), w (O,K) -> (dx (n,K) = this member's rows of sum(dy w), dw (O,K)); "
           "collective, asynchronous.")
      .def("matmul_reduce_scatter_backward",
           [](parallel::FusedTensorComm& f, const Tensor& dy, const Tensor& h, const Tensor& w) {
             return grads_out(f.matmul_reduce_scatter_backward(dy, h, w));
           },
           py::arg("dy"), py::arg("h"), py::arg("w"),
           "dy (N/tp, C), h (N,F), w (C,F) -> (dh (N,F) = all_gather(dy) w, dw (C,F)); collective, asynchronous.")
      .def("allgather_matmul_backward",
           [](parallel::FusedTensorComm& f, const Tensor& dy, const ops::QuantizedTensor& gathered, const Tensor& w) {
             return grads_out(f.allgather_matmul_backward(dy, gathered, w));
           },
           py::arg("dy"), py::arg("gathered"), py::arg("w"),
           "fp8: gathered the forward's QuantizedTensor, dy f32, w the f32 master (O,K) -> (dx, dw).")
      .def("matmul_reduce_scatter_backward",
           [](parallel::FusedTensorComm& f, const Tensor& dy, const ops::QuantizedTensor& h, const Tensor& w) {
             return grads_out(f.matmul_reduce_scatter_backward(dy, h, w));
           },
           py::arg("dy"), py::arg("h"), py::arg("w"),
           "fp8: h the forward's QuantizedTensor, dy f32, w the f32 master (C,F) -> (dh, dw).")
      .def_static(
          "matmul_allreduce_backward",
          [](const Tensor& dy, const Tensor& h, const Tensor& w) {
            return grads_out(parallel::FusedTensorComm::matmul_allreduce_backward(dy, h, w));
          },
          py::arg("dy"), py::arg("h"), py::arg("w"),
          "dy (N,C) (the same on every member), h (N,F), w (C,F) -> (dh = dy w, dw = dy^T h); local, no exchange.")
      .def_property_readonly("bytes_put", &parallel::FusedTensorComm::bytes_put,
                             "Bytes this PE has put (data, not signals) since construction.");

  py::class_<parallel::ShmemTensor>(m, "TensorParallelGroup", R"doc(
The unfused TP exchanges over a group (parallel::ShmemTensor): sizes, the
element counts of the tensors it sums (an all-gather's whole result counts);
sequence_parallel: all_gather / reduce_scatter of rows, else all_reduce.)doc")
      .def(py::init([](std::vector<int64_t> sizes, bool sequence_parallel, std::optional<std::vector<int>> pes) {
             return std::make_unique<parallel::ShmemTensor>(group_of(std::move(pes)), std::move(sizes),
                                                            sequence_parallel, /*overlap=*/false);
           }),
           py::arg("sizes"), py::arg("sequence_parallel") = false, py::arg("pes") = py::none(),
           "Allocates the symmetric buffers (collective over the job); pes: world PEs in member order (None: all).")
      .def("all_gather", &parallel::ShmemTensor::all_gather, py::arg("x"),
           "x (N/tp, ...) this member's rows -> (N, ...) every member's, in member order; collective.")
      .def("reduce_scatter", &parallel::ShmemTensor::reduce_scatter, py::arg("y"),
           "y (N, ...) this member's part of a sum -> (N/tp, ...) its rows of the sum (member order); collective.")
      .def("all_reduce", &parallel::ShmemTensor::all_reduce, py::arg("x"),
           "x this member's part -> the members' parts summed in member order, the same bits on every member; "
           "collective.");

  m.def(
      "reference_allgather_matmul",
      [](parallel::ShmemTensor& tp, const Tensor& x, const Tensor& w, const std::string& layout) {
        auto g = parallel::reference::allgather_matmul(tp, x, w, layout_arg(layout));
        return py::make_tuple(g.y, g.gathered);
      },
      py::arg("tp"), py::arg("x"), py::arg("w"), py::arg("layout") = "nk",
      "The unfused FusedTensorComm.allgather_matmul over TensorParallelGroup tp (all_gather, then matmul).");
  m.def("reference_allgather_matmul", [](parallel::ShmemTensor& tp, const Tensor& x, const ops::QuantizedTensor& w) {
    auto g = parallel::reference::allgather_matmul(tp, x, w);
    return py::make_tuple(g.y, g.gathered);
  }, "fp8: x (n,K) f32 is gathered, then quantized; w QuantizedTensor.");
  m.def(
      "reference_matmul_reduce_scatter",
      [](parallel::ShmemTensor& tp, const Tensor& h, const Tensor& w, const std::string& layout) {
        return parallel::reference::matmul_reduce_scatter(tp, h, w, layout_arg(layout));
      },
      py::arg("tp"), py::arg("h"), py::arg("w"), py::arg("layout") = "nk",
      "The unfused FusedTensorComm.matmul_reduce_scatter over TensorParallelGroup tp.");
  m.def("reference_matmul_reduce_scatter",
        py::overload_cast<parallel::ShmemTensor&, const ops::QuantizedTensor&, const ops::QuantizedTensor&>(
            &parallel::reference::matmul_reduce_scatter),
        "fp8: h, w QuantizedTensor.");
  m.def(
      "reference_matmul_allreduce",
      [](parallel::ShmemTensor& tp, const Tensor& h, const Tensor& w, const std::string& layout) {
        return parallel::reference::matmul_allreduce(tp, h, w, layout_arg(layout));
      },
      py::arg("tp"), py::arg("h"), py::arg("w"), py::arg("layout") = "nk",
      "The unfused FusedTensorComm.matmul_allreduce over TensorParallelGroup tp.");
  m.def("reference_allgather_matmul_backward",
        [](parallel::ShmemTensor& tp, const Tensor& dy, const Tensor& gathered, const Tensor& w) {
          return grads_out(parallel::reference::allgather_matmul_backward(tp, dy, gathered, w));
        }, "The unfused FusedTensorComm.allgather_matmul_backward over TensorParallelGroup tp -> (dx, dw).");
  m.def("reference_matmul_reduce_scatter_backward",
        [](parallel::ShmemTensor& tp, const Tensor& dy, const Tensor& h, const Tensor& w) {
          return grads_out(parallel::reference::matmul_reduce_scatter_backward(tp, dy, h, w));
        }, "The unfused FusedTensorComm.matmul_reduce_scatter_backward over TensorParallelGroup tp -> (dh, dw).");
  m.def("reference_allgather_matmul_backward",
        [](parallel::ShmemTensor& tp, const Tensor& dy, const ops::QuantizedTensor& gathered, const Tensor& w) {
          return grads_out(parallel::reference::allgather_matmul_backward(tp, dy, gathered, w));
        }, "fp8: gathered QuantizedTensor.");
  m.def("reference_matmul_reduce_scatter_backward",
        [](parallel::ShmemTensor& tp, const Tensor& dy, const ops::QuantizedTensor& h, const Tensor& w) {
          return grads_out(parallel::reference::matmul_reduce_scatter_backward(tp, dy, h, w));
        }, "fp8: h QuantizedTensor.");
  m.def("reference_matmul_allreduce",
        py::overload_cast<parallel::ShmemTensor&, const ops::QuantizedTensor&, const ops::QuantizedTensor&>(
            &parallel::reference::matmul_allreduce),
        "fp8: h, w QuantizedTensor.");
  m.def("reference_grouped_matmul_allreduce",
        py::overload_cast<parallel::ShmemTensor&, const Tensor&, const Tensor&, const Tensor&>(
            &parallel::reference::grouped_matmul_allreduce),
        "The unfused FusedTensorComm.grouped_matmul_allreduce over TensorParallelGroup tp (tp, h, w, offsets).");
  m.def("reference_grouped_matmul_allreduce",
        py::overload_cast<parallel::ShmemTensor&, const ops::QuantizedTensor&, const ops::QuantizedTensor&,
                          const Tensor&>(&parallel::reference::grouped_matmul_allreduce),
        "fp8: h, w QuantizedTensor.");
  m.def("reference_add_rmsnorm_allreduce",
        [](parallel::ShmemTensor& tp, const Tensor& x, const Tensor& y, const Tensor& w, float eps) {
          return norm_out(parallel::reference::add_rmsnorm_allreduce(tp, x, y, w, eps));
        }, "The unfused FusedTensorComm.add_rmsnorm_allreduce over TensorParallelGroup tp (tp, x, y, w, eps) -> "
           "(h, y, rstd).");
}

}  // namespace coremesh::python
