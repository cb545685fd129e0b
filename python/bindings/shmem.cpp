// coremesh.shmem: session, teams, symmetric arrays, RMA, signals, atomics
// (in the spirit of mpi4py and nvshmem4py). Run a program on N PEs with
// `coremesh run -n N /usr/bin/python3 prog.py`; without the launcher the
// process is a single PE.
//
// Symmetric arrays are NumPy arrays over the symmetric heap. Allocation and
// free are collective (same calls, same order on every PE), so an array is
// freed by shmem.free(array), never by the garbage collector; finalize()
// unmaps the heap, after which such arrays must not be touched.
//
// Waits for a signal or a variable sleep in slices of 50 ms with the GIL
// released and run Python's signal handlers in between (Ctrl-C works).
// Barriers and collectives release the GIL but are not interruptible; under
// the launcher, Ctrl-C stops the whole job.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include <pybind11/numpy.h>

#include "coremesh/runtime/stream.hpp"
#include "shmem_buffers.hpp"

namespace coremesh::python {
namespace {

constexpr const char* kSymmetricCapsule = "coremesh.symmetric";
// Never destroyed: a session still open at exit is ended (or left) by
// end_session_at_process_exit before the runtime's static destructors; one
// of its own would run after them and crash.
std::optional<shmem::Session>& g_session = *new std::optional<shmem::Session>;

// Runs at exit(), after the interpreter ended, with the process's status: a
// PE that ends cleanly leaves the job as a C program does (quiet + barrier);
// one that fails (an uncaught exception, sys.exit(3), raise SystemExit(1))
// must not wait in a collective for peers that may be waiting for it: the
// launcher stops the job.
void end_session_at_process_exit(int status, void*) {
  if (!g_session || status != 0) return;
  try {
    g_session.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coremesh: at exit: %s\n", e.what());
  }
}

// Calls wait(slice_s) until it returns without a TimeoutError; between
// slices runs signal handlers and drops released objects. Gives up with a
// TimeoutError after the runtime's watchdog (COREMESH_WAIT_TIMEOUT_S).
template <typename Wait>
auto interruptible(Wait&& wait) {
  constexpr double kSliceS = 0.05;
  const double limit_s = runtime::wait_timeout().count() / 1e3;
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    try {
      return without_gil([&] { return wait(kSliceS); });
    } catch (const TimeoutError& e) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited >= limit_s)
        CM_THROW(TimeoutError, e.hint(), "{} (waited {:.1f} s in all)", e.message(), waited);
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    drain_python_releases();
  }
}

// A dimension: anything with __index__ (int, np.int64).
py::ssize_t dimension_arg(const py::handle& d) {
  CM_CHECK(py::hasattr(d, "__index__"), "give the shape as an int or a sequence of ints",
           "shmem: {} is not a dimension", py::repr(d).cast<std::string>());
  const py::object i = py::module_::import("operator").attr("index")(d);
  CM_CHECK(i.cast<py::int_>() >= py::int_(0) && i.cast<py::int_>() <= py::int_(PY_SSIZE_T_MAX),
           "pass non-negative dimensions", "shmem: dimension {} of a symmetric array is out of range",
           py::repr(i).cast<std::string>());
  return i.cast<py::ssize_t>();
}

py::array symmetric_array(const py::object& shape, const py::object& dtype, bool zero) {
  const py::dtype dt = py::dtype::from_args(dtype);
  // Numbers only: the heap outlives Python objects, and strings are not what SHMEM moves.
  CM_CHECK(std::string("biufc").find(dt.kind()) != std::string::npos,
           "use a numeric dtype (bool, int, uint, float or complex)",
           "shmem: a symmetric array cannot hold dtype {}", py::str(static_cast<py::object>(dt)).cast<std::string>());
  std::vector<py::ssize_t> dims;
  if (py::hasattr(shape, "__index__")) dims.push_back(dimension_arg(shape));
  else for (const py::handle d : py::iter(shape)) dims.push_back(dimension_arg(d));
  size_t bytes = static_cast<size_t>(dt.itemsize());
  for (auto d : dims)
    CM_CHECK(!__builtin_mul_overflow(bytes, static_cast<size_t>(d), &bytes), "use a smaller shape",
             "shmem: a symmetric array of shape {} needs more bytes than the address space holds",
             py::repr(shape).cast<std::string>());
  CM_CHECK(bytes > 0, "give every dimension at least one element (symmetric allocation of 0 bytes gives no memory)",
           "shmem: a symmetric array of shape {} is empty", py::repr(shape).cast<std::string>());
  void* ptr = without_gil([&] { return zero ? shmem::sym_calloc(1, bytes) : shmem::sym_malloc(bytes); });
  py::capsule owner(ptr, kSymmetricCapsule, nullptr);  // freed by shmem.free, not by Python
  return py::array(dt, dims, ptr, owner);
}

void free_symmetric(const py::array& array) {
  const py::object base = array.attr("base");
  CM_CHECK(!base.is_none() && PyCapsule_IsValid(base.ptr(), kSymmetricCapsule),
           "pass the array that shmem.empty/zeros returned (not a view or a copy)",
           "shmem.free: not a symmetric array");
  CM_CHECK(PyCapsule_GetContext(base.ptr()) == nullptr, "free each symmetric array once",
           "shmem.free: this array was already freed");
  void* ptr = PyCapsule_GetPointer(base.ptr(), kSymmetricCapsule);
  without_gil([] { runtime::synchronize(); });  // on-stream work queued on it lands first
  release_on_stream_arrays();
  without_gil([&] { shmem::sym_free(ptr); });
  PyCapsule_SetContext(base.ptr(), reinterpret_cast<void*>(1));
}

void end_session() {
  without_gil([] { runtime::synchronize(); });  // on-stream work may still use the heap
  release_on_stream_arrays();
  without_gil([] { g_session.reset(); });  // quiet + barrier, then unmap
}

void check_fits(const Buffer& into, const Buffer& from, const char* api) {
  CM_CHECK(into.code == from.code && into.itemsize == from.itemsize,
           "use arrays of the same dtype", "{}: element types differ ('{}' vs '{}')", api, into.code,
           from.code);
  CM_CHECK(into.bytes >= from.bytes, "make the destination at least as large as the source",
           "{}: {} bytes do not fit into {}", api, from.bytes, into.bytes);
}

void bind_session_and_teams(py::module_& m) {
  m.def("init", [](size_t heap_size) {
          if (g_session) return;
          // The interpreter's C globals are not the program's data: keep them
          // private (symmetric globals serve C programs; they also need a
          // single-threaded process, and OpenBLAS or torch start threads).
          setenv("COREMESH_SYMMETRIC_DATA", "0", /*overwrite=*/0);
          without_gil([&] { g_session.emplace(shmem::InitOptions{heap_size}); });
        }, py::arg("heap_size") = 0,
        "Joins the job (or starts a 1-PE one). heap_size: symmetric bytes per PE (0: "
        "COREMESH_HEAP_SIZE, else 128 MiB), the same on every PE.");
  m.def("finalize", [] {
          if (g_session) end_session();
        }, "Waits for queued work, then leaves the job (collective). Symmetric arrays die here.");
  m.def("initialized", &shmem::initialized,
        "Whether the SHMEM runtime is initialised in this process (init() and not yet finalize()).");
  m.def("my_pe", &shmem::my_pe, "This PE's index in the world team, 0 .. n_pes()-1.");
  m.def("n_pes", &shmem::n_pes, "Number of PEs in the job.");
  m.def("transport_name", &shmem::transport_name, "'shm' or 'shm-rma' (coremesh run), 'ucx' or 'mpi' (mpirun) (COREMESH_TRANSPORT).");
  m.def("global_exit", &shmem::global_exit, py::arg("status"), "Stops every PE with `status`.");
  m.def("fence", &shmem::fence, "Orders this PE's puts to each PE.");
  m.def("quiet", &shmem::quiet, py::call_guard<py::gil_scoped_release>(),
        "Completes this PE's puts, including the *_nbi ones.");
  m.def("barrier", [](const std::optional<shmem::Team>& t) { shmem::barrier(team_arg(t)); },
        py::arg("team") = py::none(), py::call_guard<py::gil_scoped_release>(), "quiet + sync.");
  m.def("sync", [](const std::optional<shmem::Team>& t) { shmem::sync(team_arg(t)); },
        py::arg("team") = py::none(), py::call_guard<py::gil_scoped_release>(),
        "Waits for every member of team (default: world), without quiet (collective).");

  py::class_<shmem::Team>(m, "Team", "A set of PEs; split_* are collective over the parent.")
      .def_static("world", &shmem::Team::world, "The team of every PE.")
      .def_static("shared", &shmem::Team::shared,
                  "PEs whose memory this one reaches by load/store (all on 'shm'; this PE alone on 'shm-rma', 'mpi').")
      .def_property_readonly("valid", &shmem::Team::valid,
                             "False for an invalid Team (what a split returns on PEs outside the new team).")
      .def("__bool__", &shmem::Team::valid)
      .def("my_pe", &shmem::Team::my_pe, "This PE's index in the team.")
      .def("n_pes", &shmem::Team::n_pes, "Number of PEs in the team.")
      .def("translate", &shmem::Team::translate, py::arg("pe"), py::arg("other"),
           "Index in team other of this team's PE pe, or -1 if it is not a member there.")
      .def("world_pe", &shmem::Team::world_pe, py::arg("pe"), "The world PE of team PE pe (-1 if out of range).")
      .def("world_pes", &shmem::Team::world_pes, "The world PE of every member, in team order.")
      .def_static("from_pes", &shmem::Team::from_pes, py::arg("parent"), py::arg("world_pes"),
                  py::call_guard<py::gil_scoped_release>(),
                  "The team of these world PEs in this order (collective over parent; same list everywhere).")
      .def("split", &shmem::Team::split, py::arg("color"), py::arg("key") = 0,
           py::call_guard<py::gil_scoped_release>(),
           "MPI_Comm_split: members with the same color form a team, ordered by (key, index).")
      .def("split_strided", &shmem::Team::split_strided, py::arg("start"), py::arg("stride"),
           py::arg("size"), py::call_guard<py::gil_scoped_release>(),
           "PEs start, start+stride, ...; an invalid Team on PEs outside it.")
      .def("split_2d", &shmem::Team::split_2d, py::arg("xrange"), py::call_guard<py::gil_scoped_release>(),
           "-> (row team of `xrange` consecutive PEs, column team).")
      .def("__eq__", [](const shmem::Team& a, const shmem::Team& b) { return a == b; });
}

void bind_memory_and_rma(py::module_& m) {
  m.def("empty", [](const py::object& shape, const py::object& dtype) { return symmetric_array(shape, dtype, false); },
        py::arg("shape"), py::arg("dtype") = "float32", "Symmetric array (collective), uninitialised.");
  m.def("zeros", [](const py::object& shape, const py::object& dtype) { return symmetric_array(shape, dtype, true); },
        py::arg("shape"), py::arg("dtype") = "float32", "Symmetric array (collective), zeroed.");
  m.def("free", &free_symmetric, py::arg("array"), "Frees a symmetric array (collective).");
  m.def("heap_stats", [] {
    const shmem::HeapStats s = shmem::SymmetricHeap::instance().stats();
    py::dict d;
    d["capacity"] = s.capacity;
    d["used"] = s.used;
    d["peak"] = s.peak;
    d["blocks"] = s.blocks;
    d["largest_free"] = s.largest_free;
    return d;
  }, "This PE's symmetric heap: dict of capacity, used, peak (bytes), blocks and largest_free (bytes).");

  const auto rma = [](bool is_put, bool nbi) {
    return [is_put, nbi](const py::handle& dest, const py::handle& src, int pe) {
      const Buffer d = buffer_arg(dest, "dest", true), s = buffer_arg(src, "src", false);
      const char* api = is_put ? "put" : "get";
      if (is_put) check_fits(d, s, api);
      else check_fits(s, d, api);  // a get fills dest from the symmetric src
      py::gil_scoped_release nogil;
      if (is_put) shmem::detail::put_bytes(d.ptr, s.ptr, s.bytes, pe, nbi);
      else shmem::detail::get_bytes(d.ptr, s.ptr, d.bytes, pe, nbi);
    };
  };
  m.def("put", rma(true, false), py::arg("dest"), py::arg("src"), py::arg("pe"),
        "Copies src (any array) into symmetric dest on `pe`; src's bytes.");
  m.def("get", rma(false, false), py::arg("dest"), py::arg("src"), py::arg("pe"),
        "Copies symmetric src on `pe` into dest (any array); dest's bytes.");
  m.def("put_nbi", rma(true, true), py::arg("dest"), py::arg("src"), py::arg("pe"),
        "put that completes at quiet(); keep src unchanged until then.");
  m.def("get_nbi", rma(false, true), py::arg("dest"), py::arg("src"), py::arg("pe"),
        "get that completes at quiet().");
  m.def("put_signal", [](const py::handle& dest, const py::handle& src, const py::handle& signal,
                         uint64_t value, int pe, const std::string& op) {
          const Buffer d = buffer_arg(dest, "dest", true), s = buffer_arg(src, "src", false);
          check_fits(d, s, "put_signal");
          uint64_t* sig = signal_arg(signal);
          py::gil_scoped_release nogil;
          shmem::detail::put_signal_bytes(d.ptr, s.ptr, s.bytes, sig, value, signal_op_arg(op), pe, false);
        }, py::arg("dest"), py::arg("src"), py::arg("signal"), py::arg("value"), py::arg("pe"),
        py::arg("op") = "set", "put, then signal[0] on `pe` = value ('set') or += value ('add').");
  m.def("signal_fetch", [](const py::handle& signal) { return shmem::signal_fetch(signal_arg(signal)); },
        py::arg("signal"), "Reads signal[0] (symmetric uint64) on this PE atomically, without waiting.");
  m.def("signal_wait_until", [](const py::handle& signal, const std::string& cmp, uint64_t value) {
          uint64_t* sig = signal_arg(signal);
          const shmem::Cmp c = cmp_arg(cmp);
          return interruptible([&](double slice) { return shmem::signal_wait_until(sig, c, value, slice); });
        }, py::arg("signal"), py::arg("cmp"), py::arg("value"),
        "Waits until signal[0] <cmp> value ('eq','ne','gt','ge','lt','le'); returns the signal.");
}

// A number for an element of type T: integers exactly and in T's range,
// floats for float elements; anything else names the argument and the range.
template <typename T>
T number_arg(const py::object& value, const char* what) {
  if constexpr (std::is_floating_point_v<T>) {
    CM_CHECK(py::hasattr(value, "__float__"), "pass a number", "shmem: {} {} is not a number", what,
             py::repr(value).cast<std::string>());
    const double d = PyFloat_AsDouble(value.ptr());
    if (d == -1.0 && PyErr_Occurred()) {  // OverflowError: an int past a double's range
      PyErr_Clear();
      CM_THROW(InvalidArgument, "pass a value a double holds", "shmem: {} {} is too large for a float", what,
               py::repr(value).cast<std::string>());
    }
    return static_cast<T>(d);
  } else {
    CM_CHECK(py::hasattr(value, "__index__"), "pass a whole number (the array holds integers)",
             "shmem: {} {} is not an integer", what, py::repr(value).cast<std::string>());
    const py::int_ i = py::module_::import("operator").attr("index")(value);
    const py::int_ low(std::numeric_limits<T>::min()), high(std::numeric_limits<T>::max());
    CM_CHECK(i >= low && i <= high, "pass a value the array's element type holds",
             "shmem: {} {} is outside [{}, {}]", what, py::repr(i).cast<std::string>(),
             std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
    return i.cast<T>();
  }
}

template <typename R>
py::object as_python(R&& value) {
  if constexpr (std::is_base_of_v<py::object, std::decay_t<R>>) return std::forward<R>(value);
  else return py::cast(std::forward<R>(value));
}

// Calls op(T* element0) for the element type of the symmetric array `dest`.
// An atomic, a wait or a test acts on element 0: the array needs one.
Buffer element_arg(const py::handle& obj, const char* what, const char* api) {
  Buffer b = buffer_arg(obj, what, true);
  CM_CHECK(b.bytes >= b.itemsize && b.bytes > 0, "pass a slice of at least one element, a[i:i+1] for element i",
           "shmem.{}: {} has no elements", api, what);
  return b;
}

template <bool Floats, typename Op>
py::object atomic_call(const py::handle& dest, const char* api, Op&& op) {
  const Buffer b = element_arg(dest, "dest", api);
  return dispatch_element<Floats>(b, api, [&](auto zero) -> py::object {
    return as_python(op(static_cast<decltype(zero)*>(b.ptr)));
  });
}

using shmem::AtomicOp;

// atomic_fetch_{add,and,or,xor}(dest, value, pe) -> old value; atomic_add -> None.
template <AtomicOp Op, bool Fetch>
void bind_integer_atomic(py::module_& m, const char* name, const char* doc) {
  m.def(name, [name](const py::handle& dest, const py::object& value, int pe) {
          return atomic_call<false>(dest, name, [&](auto* p) -> py::object {
            const auto old = shmem::atomic_fetch_op<Op>(p, number_arg<std::remove_pointer_t<decltype(p)>>(value, "value"), pe);
            return Fetch ? py::cast(old) : py::none();
          });
        }, py::arg("dest"), py::arg("value"), py::arg("pe"), doc);
}

void bind_waits_and_atomics(py::module_& m) {
  m.def("wait_until", [](const py::handle& ivar, const std::string& cmp, const py::object& value) {
          const Buffer b = element_arg(ivar, "ivar", "wait_until");
          const shmem::Cmp c = cmp_arg(cmp);
          dispatch_element<false>(b, "wait_until", [&](auto zero) {
            using T = decltype(zero);
            const T v = number_arg<T>(value, "value");
            interruptible([&](double slice) { shmem::wait_until(static_cast<T*>(b.ptr), c, v, slice); return 0; });
          });
        }, py::arg("ivar"), py::arg("cmp"), py::arg("value"),
        "Waits until ivar[0] (symmetric, integer) <cmp> value on this PE.");
  m.def("test", [](const py::handle& ivar, const std::string& cmp, const py::object& value) {
          const Buffer b = element_arg(ivar, "ivar", "test");
          return dispatch_element<false>(b, "test", [&](auto zero) {
            using T = decltype(zero);
            return shmem::test(static_cast<T*>(b.ptr), cmp_arg(cmp), number_arg<T>(value, "value"));
          });
        }, py::arg("ivar"), py::arg("cmp"), py::arg("value"),
        "Whether ivar[0] (symmetric, integer) <cmp> value holds on this PE now; does not wait.");

  // Atomics act on element 0 of a symmetric array on `pe` and return Python
  // numbers; fetch/set/swap/compare_swap also take float32 and float64.
  m.def("atomic_fetch", [](const py::handle& src, int pe) {
          return atomic_call<true>(src, "atomic_fetch", [&](auto* p) { return shmem::atomic_fetch(p, pe); });
        }, py::arg("src"), py::arg("pe"),
        "Atomically reads src[0] (symmetric, integer or float) on `pe` and returns it.");
  m.def("atomic_set", [](const py::handle& dest, const py::object& value, int pe) {
          atomic_call<true>(dest, "atomic_set", [&](auto* p) {
            shmem::atomic_set(p, number_arg<std::remove_pointer_t<decltype(p)>>(value, "value"), pe);
            return py::none();
          });
        }, py::arg("dest"), py::arg("value"), py::arg("pe"),
        "Atomically sets dest[0] (symmetric, integer or float) on `pe` to value.");
  m.def("atomic_swap", [](const py::handle& dest, const py::object& value, int pe) {
          return atomic_call<true>(dest, "atomic_swap", [&](auto* p) {
            return shmem::atomic_swap(p, number_arg<std::remove_pointer_t<decltype(p)>>(value, "value"), pe);
          });
        }, py::arg("dest"), py::arg("value"), py::arg("pe"), "Returns the old value.");
  m.def("atomic_compare_swap", [](const py::handle& dest, const py::object& cond, const py::object& value, int pe) {
          return atomic_call<true>(dest, "atomic_compare_swap", [&](auto* p) {
            using T = std::remove_pointer_t<decltype(p)>;
            return shmem::atomic_compare_swap(p, number_arg<T>(cond, "cond"), number_arg<T>(value, "value"), pe);
          });
        }, py::arg("dest"), py::arg("cond"), py::arg("value"), py::arg("pe"),
        "Sets dest[0] on `pe` to value if it equals cond; returns the old value.");
  bind_integer_atomic<AtomicOp::add, true>(m, "atomic_fetch_add",
                                           "dest[0] on `pe` += value (integers); returns the old value.");
  bind_integer_atomic<AtomicOp::add, false>(m, "atomic_add", "dest[0] on `pe` += value (integers); returns None.");
  bind_integer_atomic<AtomicOp::band, true>(m, "atomic_fetch_and",
                                            "dest[0] on `pe` &= value (integers); returns the old value.");
  bind_integer_atomic<AtomicOp::bor, true>(m, "atomic_fetch_or",
                                           "dest[0] on `pe` |= value (integers); returns the old value.");
  bind_integer_atomic<AtomicOp::bxor, true>(m, "atomic_fetch_xor",
                                            "dest[0] on `pe` ^= value (integers); returns the old value.");
  m.def("atomic_fetch_inc", [](const py::handle& dest, int pe) {
          return atomic_call<false>(dest, "atomic_fetch_inc", [&](auto* p) { return shmem::atomic_fetch_inc(p, pe); });
        }, py::arg("dest"), py::arg("pe"), "dest[0] on `pe` += 1 (integers); returns the old value.");
  m.def("atomic_inc", [](const py::handle& dest, int pe) {
          atomic_call<false>(dest, "atomic_inc", [&](auto* p) { shmem::atomic_inc(p, pe); return py::none(); });
        }, py::arg("dest"), py::arg("pe"), "dest[0] on `pe` += 1 (integers); returns None.");
}

}  // namespace

void end_shmem_session_at_exit() {
  if (!g_session) return;
  without_gil([] { runtime::synchronize(); });  // on-stream work may still use the heap
  release_on_stream_arrays();
  // The interpreter now destroys what it holds, symmetric objects too, in an
  // order each PE has its own: their frees must not be collective.
  shmem::keep_heap_until_exit();
  // Only exit() knows the status; registered now, the handler runs before
  // every exit handler registered earlier (static destructors included).
  static const bool registered = on_exit(end_session_at_process_exit, nullptr) == 0;
  if (!registered) end_session();
}

namespace {
// Whether `obj` is (a view of) a symmetric array that shmem.free freed.
bool freed_symmetric(const py::handle& obj) {
  py::handle h = obj;
  for (int depth = 0; depth < 64 && h && !h.is_none(); ++depth) {
    if (PyCapsule_IsValid(h.ptr(), kSymmetricCapsule)) return PyCapsule_GetContext(h.ptr()) != nullptr;
    if (!py::hasattr(h, "base")) return false;
    h = h.attr("base");
  }
  return false;
}
}  // namespace

Buffer buffer_arg(const py::handle& obj, const char* what, bool writable) {
  CM_CHECK(!freed_symmetric(obj), "allocate a new one with shmem.zeros/empty",
           "shmem: {} is a symmetric array that shmem.free freed (its memory may hold another array now)", what);
  PyObject* raw = PyMemoryView_FromObject(obj.ptr());
  if (raw == nullptr) throw py::error_already_set();
  Buffer b;
  b.view = py::reinterpret_steal<py::object>(raw);
  const Py_buffer& view = *PyMemoryView_GET_BUFFER(raw);
  CM_CHECK(PyBuffer_IsContiguous(&view, 'C'), "pass np.ascontiguousarray(...) or a symmetric array",
           "shmem: {} is not C-contiguous", what);
  CM_CHECK(!writable || !view.readonly, "pass a writable array", "shmem: {} is read-only", what);
  b.ptr = view.buf;
  b.bytes = static_cast<size_t>(view.len);
  b.itemsize = static_cast<size_t>(view.itemsize);
  const char* format = view.format ? view.format : "B";
  if (*format == '@' || *format == '=' || *format == '<') ++format;
  b.code = std::strlen(format) == 1 ? format[0] : '?';
  return b;
}

uint64_t* signal_arg(const py::handle& obj) {
  const Buffer b = buffer_arg(obj, "signal", true);
  CM_CHECK(b.itemsize == 8 && (b.code == 'Q' || b.code == 'L') && b.bytes >= 8,
           "use a symmetric uint64 array (shmem.zeros(n, 'uint64')); pass sig[i:i+1] for element i",
           "shmem: a signal must be a uint64 array");
  return static_cast<uint64_t*>(b.ptr);
}

shmem::Cmp cmp_arg(const std::string& name) {
  static const std::pair<const char*, shmem::Cmp> table[] = {
      {"eq", shmem::Cmp::eq}, {"ne", shmem::Cmp::ne}, {"gt", shmem::Cmp::gt},
      {"ge", shmem::Cmp::ge}, {"lt", shmem::Cmp::lt}, {"le", shmem::Cmp::le}};
  return named_choice(name, table, "comparison");
}

shmem::SignalOp signal_op_arg(const std::string& name) {
  static const std::pair<const char*, shmem::SignalOp> table[] = {
      {"set", shmem::SignalOp::set}, {"add", shmem::SignalOp::add}};
  return named_choice(name, table, "signal operation");
}

shmem::ReduceOp reduce_op_arg(const std::string& name) {
  static const std::pair<const char*, shmem::ReduceOp> table[] = {
      {"sum", shmem::ReduceOp::sum}, {"max", shmem::ReduceOp::max},
      {"min", shmem::ReduceOp::min}, {"prod", shmem::ReduceOp::prod}};
  return named_choice(name, table, "reduction");
}

void bind_shmem(py::module_& m) {
  bind_session_and_teams(m);
  bind_memory_and_rma(m);
  bind_waits_and_atomics(m);
}

}  // namespace coremesh::python
