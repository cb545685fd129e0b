// coremesh._C: the extension behind the `coremesh` package.
//
//   coremesh.Tensor, empty/zeros/full/from_numpy/from_dlpack   tensor.cpp, dlpack.cpp
//   coremesh.runtime    streams, events, core limits            runtime.cpp
//   coremesh.profiler   kernel records, csv and Perfetto trace  runtime.cpp
//   coremesh.ops        the kernel library                      ops.cpp, ops_moe.cpp
//   coremesh.shmem      OpenSHMEM from Python                   shmem.cpp, shmem_collectives.cpp
//   coremesh.train      the trainer through its JSON config     train.cpp
//   coremesh.graph      capture, instantiate, replay             graph.cpp
//   coremesh.parallel   fused TP comm+GEMM operators             parallel.cpp
//
// Errors: coremesh::Error and its kinds become Python exceptions that keep
// their message and HINT:
//   coremesh.Error(RuntimeError)
//     InvalidArgument(Error, ValueError)   bad argument, bad limit, bad shape
//     TimeoutError(Error, TimeoutError)    a watchdog expired
//     KernelError(Error)                   a kernel failed; names the kernel
#include "common.hpp"
#include "coremesh/core/error.hpp"

namespace coremesh::python {
namespace {

PyObject* g_error = nullptr;
PyObject* g_invalid_argument = nullptr;
PyObject* g_timeout = nullptr;
PyObject* g_kernel_error = nullptr;

// Sets the Python error for a coremesh error; rethrows anything else (a
// pybind11 exception translator).
void translate_coremesh_error(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (const KernelError& e) {
    PyErr_SetString(g_kernel_error, e.what());
  } catch (const TimeoutError& e) {
    PyErr_SetString(g_timeout, e.what());
  } catch (const InvalidArgument& e) {
    PyErr_SetString(g_invalid_argument, e.what());
  } catch (const Error& e) {
    PyErr_SetString(g_error, e.what());
  }
}

PyObject* new_exception(const char* name, const char* doc, py::tuple bases) {
  PyObject* type = PyErr_NewExceptionWithDoc(name, doc, bases.ptr(), nullptr);
  if (type == nullptr) throw py::error_already_set();
  return type;
}

}  // namespace

void bind_exceptions(py::module_& m) {
  g_error = new_exception("coremesh.Error", "A coremesh error (message, file:line and a HINT).",
                          py::make_tuple(py::handle(PyExc_RuntimeError)));
  g_invalid_argument = new_exception(
      "coremesh.InvalidArgument", "An argument the caller can change (shape, dtype, limit, ...).",
      py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError)));
  g_timeout = new_exception("coremesh.TimeoutError",
                            "A wait exceeded its watchdog (COREMESH_WAIT_TIMEOUT_S).",
                            py::make_tuple(py::handle(g_error), py::handle(PyExc_TimeoutError)));
  g_kernel_error = new_exception("coremesh.KernelError",
                                 "Work that ran asynchronously failed; the message names the kernel.",
                                 py::make_tuple(py::handle(g_error)));
  m.attr("Error") = py::handle(g_error);
  m.attr("InvalidArgument") = py::handle(g_invalid_argument);
  m.attr("TimeoutError") = py::handle(g_timeout);
  m.attr("KernelError") = py::handle(g_kernel_error);
  py::register_exception_translator(translate_coremesh_error);
}

// For C slots that pybind does not wrap (the buffer protocol): sets the
// Python error for the exception in flight.
void set_python_error(std::exception_ptr p) {
  try {
    translate_coremesh_error(p);
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
  }
}

}  // namespace coremesh::python

PYBIND11_MODULE(_C, m) {
  using namespace coremesh::python;
  m.doc() = "coremesh's C++ core; import `coremesh`, not this module.";
  bind_exceptions(m);
  bind_tensor(m);
  auto runtime = m.def_submodule("runtime", "Streams, events and core limits (the RFC's runtime API).");
  bind_runtime(runtime);
  auto profiler = m.def_submodule("profiler", "Kernel records, kernel_details.csv and Perfetto traces.");
  bind_profiler(profiler);
  auto ops = m.def_submodule("ops", "The kernel library, launched asynchronously on the current stream.");
  bind_ops(ops);
  bind_ops_moe(ops);
  auto shmem = m.def_submodule("shmem", "OpenSHMEM from Python (run under `coremesh run -n N`).");
  bind_shmem(shmem);
  bind_shmem_collectives(shmem);
  auto train = m.def_submodule("train", "The C++ trainer from Python (configs as `coremesh train` reads them).");
  bind_train(train);
  auto graph = m.def_submodule("graph", "Graph mode: capture stream work, instantiate it once, replay it.");
  bind_graph(graph);
  auto parallel = m.def_submodule("parallel", "Fused TP comm+GEMM operators over SHMEM (under `coremesh run -n N`).");
  bind_parallel(parallel);
  bind_parallel_experts(parallel);
  install_python_hooks(m);
}
