// Python references held by C++ (common.hpp explains the GIL rules), the
// runtime's host wait hook (Ctrl-C in waits) and the interpreter-exit steps.
#include <atomic>
#include <mutex>
#include <vector>

#include "common.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::python {
namespace {

std::mutex g_mutex;
std::vector<PyObject*> g_released;  // references to drop once the GIL is held
std::atomic<bool> g_drain_scheduled{false};
std::atomic<bool> g_python_gone{false};  // set at interpreter exit: leak, never touch Python

bool python_usable() {
  return !g_python_gone.load(std::memory_order_acquire) && Py_IsInitialized() &&
         !_Py_IsFinalizing();
}

int drain_pending_call(void*) {
  g_drain_scheduled = false;
  drain_python_releases();
  return 0;
}

void release_reference(PyObject* obj) {
  if (!python_usable()) return;
  if (PyGILState_Check()) {
    Py_DECREF(obj);
    return;
  }
  {
    std::lock_guard lock(g_mutex);
    g_released.push_back(obj);
  }
  // One pending call drains everything queued until it runs; if Python's
  // pending-call queue is full, the next wait or drain picks the reference up.
  if (!g_drain_scheduled.exchange(true) && Py_AddPendingCall(drain_pending_call, nullptr) != 0)
    g_drain_scheduled = false;
}

// Called by host waits every 20 ms on the waiting thread (GIL released).
void wait_hook() {
  if (!python_usable()) return;
  py::gil_scoped_acquire gil;
  drain_python_releases();
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

}  // namespace

std::shared_ptr<void> python_owner(py::object obj) {
  PyObject* raw = obj.release().ptr();
  return std::shared_ptr<void>(raw, [](void* p) { release_reference(static_cast<PyObject*>(p)); });
}

void drain_python_releases() {
  std::vector<PyObject*> batch;
  {
    std::lock_guard lock(g_mutex);
    batch.swap(g_released);
  }
  for (PyObject* obj : batch) Py_DECREF(obj);
}

void install_python_hooks(py::module_& m) {
  runtime::set_host_wait_hook(wait_hook);
  // At exit, before the interpreter tears down: let queued kernels finish
  // (they may use Python-owned memory), drop what they released, and from
  // then on leave Python alone (the C++ device outlives the interpreter).
  m.def("_at_exit", [] {
    try {
      without_gil([] { runtime::synchronize(); });
    } catch (const std::exception& e) {
      PySys_WriteStderr("coremesh: at exit: %s\n", e.what());
    }
    try {
      end_shmem_session_at_exit();
    } catch (const std::exception& e) {
      PySys_WriteStderr("coremesh: at exit: %s\n", e.what());
    }
    drain_python_releases();
    runtime::set_host_wait_hook(nullptr);
    g_python_gone = true;
  });
  py::module_::import("atexit").attr("register")(m.attr("_at_exit"));
}

}  // namespace coremesh::python
