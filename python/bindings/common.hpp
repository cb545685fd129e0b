// Shared pieces of the Python extension `coremesh._C`.
//
// Threads and the GIL: runtime workers never take the GIL. Memory that
// Python owns (a NumPy array, a DLPack capsule) is kept alive by a handle
// that drops its Python reference only on a thread holding the GIL: when the
// last C++ user of the memory is a worker (a kernel that captured the tensor
// finished), the release is queued and Python runs it soon after (a pending
// call, or the next wait). Every binding that may block releases the GIL; the
// runtime's host wait hook takes it back every 20 ms to run signal handlers,
// so Ctrl-C interrupts a wait with KeyboardInterrupt.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coremesh/core/tensor.hpp"

namespace coremesh::ops {
enum class WeightLayout;
}
namespace coremesh::parallel {
struct Group;
}

namespace coremesh::python {

namespace py = pybind11;

// A C++ owner of a new reference to `obj`, released with the GIL (above).
std::shared_ptr<void> python_owner(py::object obj);
// Runs the queued releases; needs the GIL.
void drain_python_releases();
// Installs the runtime's host wait hook and the interpreter-exit handling
// (wait for queued kernels, then stop touching Python from C++).
void install_python_hooks(py::module_& m);

// Sets the Python error for a C++ exception (for C slots pybind does not
// wrap); coremesh errors map as module.cpp describes.
void set_python_error(std::exception_ptr error);

// Releases the GIL around a blocking call.
template <typename Fn>
auto without_gil(Fn&& fn) {
  py::gil_scoped_release nogil;
  return fn();
}

// Waits for the default device's queued work with the GIL released (before
// Python reads or writes tensor memory on the host).
void wait_for_device();

// An optional tensor argument (None: an undefined tensor, "not given").
inline Tensor optional_tensor(const std::optional<Tensor>& t) { return t.value_or(Tensor{}); }

// The value named `name` in `table`, for string-valued options; an unknown
// name raises InvalidArgument that lists the names. `what` names the option.
template <typename T, size_t N>
T named_choice(const std::string& name, const std::pair<const char*, T> (&table)[N], const char* what) {
  std::string names;
  for (const auto& [n, value] : table) {
    if (name == n) return value;
    names += fmt::format("{}'{}'", names.empty() ? "" : ", ", n);
  }
  CM_THROW(InvalidArgument, fmt::format("pass one of {}", names), "unknown {} '{}'", what, name);
}

// The group of the world PEs `pes` (member order; None: the whole job) seen
// from this PE, which must be one of them.
parallel::Group group_of(std::optional<std::vector<int>> pes);
// "nk" (w (N, K), nn.Linear's) or "kn" (w (K, N)); anything else: a ValueError that lists them.
ops::WeightLayout layout_arg(const std::string& name);

// dtype from a name ("f32", "bf16", "f8e4m3", "f8e5m2", "i32", "i64"), a
// coremesh dtype or a NumPy/torch dtype-like object naming one of them.
DType dtype_arg(const py::handle& value);

// DLPack (dlpack.cpp): a "dltensor" capsule over `t`, and a tensor over an
// object with __dlpack__ (or a capsule) that takes over its deleter.
py::object tensor_to_dlpack(const Tensor& t, const py::object& stream);
Tensor tensor_from_dlpack(const py::object& obj, const py::object& dtype);

void bind_exceptions(py::module_& m);
void bind_tensor(py::module_& m);
void bind_runtime(py::module_& m);
void bind_profiler(py::module_& m);
void bind_ops(py::module_& m);
void bind_ops_moe(py::module_& m);
void bind_shmem(py::module_& m);
// At interpreter exit: a session the script did not finalize ends as a C
// program's does (collectively), unless the script died of an exception or
// called sys.exit with a failing status: then it is left to the launcher,
// which stops the other PEs.
void end_shmem_session_at_exit();
void bind_shmem_collectives(py::module_& m);
void bind_train(py::module_& m);
void bind_graph(py::module_& m);
void bind_parallel(py::module_& m);
void bind_parallel_experts(py::module_& m);

}  // namespace coremesh::python
