// coremesh.runtime (the RFC's ms.runtime) and coremesh.profiler.
//
// Everything runs on the process's default device (COREMESH_CORES workers);
// `device` arguments take runtime.current_device() or its id. Limits follow
// the RFC: -1 leaves a kind as it is; 0, values below -1 and values above
// the spec raise coremesh.InvalidArgument. get_*_limit return
// {'cube_core_num': c, 'vector_core_num': v}. Every wait releases the GIL.
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "common.hpp"
#include "coremesh/runtime/profiler.hpp"
#include "coremesh/runtime/stream.hpp"
#include "coremesh/runtime/tuning_cache.hpp"

namespace coremesh::python {
namespace {

using runtime::CoreLimits;
using runtime::Device;
using runtime::Event;
using runtime::Stream;

py::dict limits_dict(const CoreLimits& limits) {
  py::dict d;
  d["cube_core_num"] = limits.cube;
  d["vector_core_num"] = limits.vector;
  return d;
}

Device& device_arg(const py::object& device) {
  Device& dev = Device::default_device();
  if (device.is_none() || py::isinstance<Device>(device)) return dev;
  CM_CHECK(py::hasattr(device, "__index__"), "pass runtime.current_device(), its id or None",
           "{} is not a device", py::repr(device).cast<std::string>());
  const int64_t id = py::module_::import("operator").attr("index")(device).cast<int64_t>();
  CM_CHECK(id == dev.id(), "pass runtime.current_device() (or its id)",
           "device {} does not exist: this process has device {}", id, dev.id());
  return dev;
}

// `with StreamCtx(s):` and `with StreamLimitCtx(s, cube, vector):`. A context
// object may be entered again (nested or later); each entry has its guard.
template <typename Guard, typename... Args>
struct Scope {
  Stream stream;
  std::tuple<Args...> args;
  // The current stream is per thread: a context ends on the thread that entered it.
  std::vector<std::pair<std::unique_ptr<Guard>, std::thread::id>> active;

  void enter() {
    active.emplace_back(std::apply([&](auto... a) { return std::make_unique<Guard>(stream, a...); }, args),
                        std::this_thread::get_id());
  }
  void exit() {
    CM_CHECK(!active.empty(), "use the object in a with statement", "__exit__ without __enter__");
    CM_CHECK(active.back().second == std::this_thread::get_id(),
             "leave the with block on the thread that entered it",
             "__exit__ on another thread than the __enter__ (the current stream is per thread)");
    active.pop_back();
  }
};
using StreamScope = Scope<runtime::StreamGuard>;
using LimitScope = Scope<runtime::StreamLimitGuard, int, int>;

template <typename S>
void bind_scope_methods(py::class_<S>& cls) {
  cls.def("__enter__", [](S& s) { s.enter(); return s.stream; })
      .def("__exit__", [](S& s, const py::args&) { s.exit(); return false; })
      .def_property_readonly("stream", [](const S& s) { return s.stream; }, "The stream the context makes current.");
}

void bind_device(py::module_& m) {
  py::class_<Device>(m, "Device", "The device: worker cores shared by every stream on it.")
      .def_property_readonly("id", &Device::id, "The device's id.")
      .def_property_readonly("num_cores", &Device::num_cores, "Number of worker cores (threads).")
      .def_property_readonly("spec", [](const Device& d) { return limits_dict(d.spec()); },
                             "Cube and vector cores the device offers.")
      .def("default_stream", &Device::default_stream, py::return_value_policy::copy, "The device's default stream.")
      .def("synchronize", &Device::synchronize, py::call_guard<py::gil_scoped_release>(),
           "Blocks (GIL released) until every stream of the device is idle; raises the first KernelError.")
      .def("__repr__", [](const Device& d) {
        return fmt::format("coremesh.runtime.Device(id={}, cores={}, cube={}, vector={})", d.id(),
                           d.num_cores(), d.spec().cube, d.spec().vector);
      });
  m.def("current_device", &Device::default_device, py::return_value_policy::reference,
        "The process's device (COREMESH_CORES worker cores; default: the CPUs).");
  m.def("set_device_limit", [](const py::object& device, int cube_num, int vector_num) {
          runtime::set_device_limit(device_arg(device), cube_num, vector_num);
        }, py::arg("device"), py::arg("cube_num") = -1, py::arg("vector_num") = -1,
        "Process-level core limit (aclrtSetDeviceResLimit); -1 leaves a kind as it is.");
  m.def("get_device_limit", [](const py::object& device) {
          return limits_dict(runtime::get_device_limit(device_arg(device)));
        }, py::arg("device"), "{'cube_core_num': c, 'vector_core_num': v} in force for the device.");
  m.def("reset_device_limit", [](const py::object& device) {
          runtime::reset_device_limit(device_arg(device));
        }, py::arg("device"), "Back to the device spec.");
}

void bind_stream_and_event(py::module_& m) {
  py::class_<Event>(m, "Event", R"doc(
Event(enable_timing=False): marks a point in a stream. record() captures the
work queued so far; wait() makes later work on a stream wait for it.)doc")
      .def(py::init<bool>(), py::arg("enable_timing") = false,
           "A new event; enable_timing=True lets elapsed_time measure it.")
      .def_property_readonly("id", &Event::id, "The event's id.")
      .def("record", [](Event& e, std::optional<Stream> s) { s ? e.record(*s) : e.record(); },
           py::arg("stream") = py::none(), "Captures the work queued on `stream` (default: current).")
      .def("wait", [](Event& e, std::optional<Stream> s) { s ? e.wait(*s) : e.wait(); },
           py::arg("stream") = py::none(),
           "Work queued on `stream` (default: current) after this call waits for the last record().")
      .def("query", &Event::query, "True when the captured work is done.")
      .def("synchronize", &Event::synchronize, py::call_guard<py::gil_scoped_release>(),
           "Blocks (GIL released) until the captured work is done; raises its KernelError.")
      .def("elapsed_time", &Event::elapsed_time, py::arg("end_event"),
           "Milliseconds from this event to `end_event` (both enable_timing=True, both done).");

  py::class_<Stream>(m, "Stream", R"doc(
Stream(priority=0): an in-order queue of kernels on the device. Streams run
concurrently and share the device's cores; higher priority goes first.)doc")
      .def(py::init([](int priority) { return Stream(Device::default_device(), priority); }),
           py::arg("priority") = 0, "A new stream on the process's device; higher priority goes first.")
      .def_property_readonly("id", &Stream::id, "The stream's id.")
      .def_property_readonly("priority", &Stream::priority, "The priority it was made with.")
      .def("query", &Stream::query, "True when all queued work is done; raises a pending KernelError.")
      .def("synchronize", &Stream::synchronize, py::call_guard<py::gil_scoped_release>(),
           "Blocks (GIL released) until all queued work is done; raises a pending KernelError.")
      .def("record_event", [](Stream& s, std::optional<Event> e) {
             Event event = e.value_or(Event());
             event.record(s);
             return event;
           }, py::arg("event") = py::none(), "Records `event` (default: a new one) and returns it.")
      .def("wait_event", &Stream::wait_event, py::arg("event"),
           "Later work here waits for the event's last record() (none: no wait); does not block the host.")
      .def("wait_stream", &Stream::wait_stream, py::arg("stream"),
           "Later work here waits for everything queued on `stream` so far.")
      .def("__eq__", [](const Stream& a, const Stream& b) { return a == b; })
      .def("__hash__", [](const Stream& s) { return s.id(); })
      .def("__repr__", [](const Stream& s) {
        return fmt::format("coremesh.runtime.Stream(id={}, priority={})", s.id(), s.priority());
      });

  m.def("current_stream", &runtime::current_stream, "This thread's current stream.");
  m.def("default_stream", [] { return Device::default_device().default_stream(); },
        "The device's default stream.");
  m.def("set_cur_stream", &runtime::set_current_stream, py::arg("stream"),
        "Makes `stream` this thread's current stream (prefer `with StreamCtx(stream)`).");
  m.def("synchronize", [] { Device::default_device().synchronize(); },
        py::call_guard<py::gil_scoped_release>(),
        "Blocks (GIL released) until every stream is idle; raises the first KernelError.");

  py::class_<StreamScope> stream_ctx(m, "StreamCtx", "with StreamCtx(s): ops inside run on s.");
  stream_ctx.def(py::init([](const Stream& s) { return StreamScope{s, {}, {}}; }), py::arg("stream"),
                 "A context that makes `stream` this thread's current stream while entered.");
  bind_scope_methods(stream_ctx);
  py::class_<LimitScope> limit_ctx(m, "StreamLimitCtx", R"doc(
with StreamLimitCtx(stream, cube_num=-1, vector_num=-1): inside, `stream` is
current and has these core limits; both are restored on exit.)doc");
  limit_ctx.def(py::init([](const Stream& s, int cube, int vector) {
                  return LimitScope{s, {cube, vector}, {}};
                }), py::arg("stream"), py::arg("cube_num") = -1, py::arg("vector_num") = -1,
                "A context that makes `stream` current with these core limits while entered (-1: unchanged).");
  bind_scope_methods(limit_ctx);

  m.def("set_stream_limit", &runtime::set_stream_limit, py::arg("stream"),
        py::arg("cube_num") = -1, py::arg("vector_num") = -1,
        "Stream-level core limit (aclrtSetStreamResLimit); -1 leaves a kind as it is.");
  m.def("reset_stream_limit", &runtime::reset_stream_limit, py::arg("stream"),
        "Back to the device's limits.");
  m.def("get_stream_limit", [](const Stream& s) { return limits_dict(runtime::get_stream_limit(s)); },
        py::arg("stream"), "Limits in force for kernels launched on `stream` now.");
  m.def("load_tuning_cache", &runtime::load_tuning_cache, py::arg("path"),
        "Loads a tuning cache (coremesh.train.tune, `coremesh tune`): its tilings replace the ops' heuristics; "
        "a stale one (another coremesh or machine) is ignored with a warning. Returns the tilings loaded.");
  m.def("drop_tuned_tilings", [] {
          runtime::OpCache::global().set_tuned({});
          runtime::OpCache::global().clear();
        }, "Back to the ops' heuristic tilings (undoes load_tuning_cache).");
  m.def("set_wait_timeout", [](double seconds) {
          CM_CHECK(seconds >= 1e-3 && seconds <= 1e15, "give a number of seconds in [0.001, 1e15]", "wait timeout {} s",
                   seconds);
          runtime::set_wait_timeout(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1e3)));
        }, py::arg("seconds"), "Watchdog of host waits (default COREMESH_WAIT_TIMEOUT_S, 300).");
  m.def("get_wait_timeout", [] { return runtime::wait_timeout().count() / 1e3; },
        "Watchdog of host waits in seconds (set_wait_timeout).");
}

}  // namespace

void bind_runtime(py::module_& m) {
  bind_device(m);
  bind_stream_and_event(m);
}

void bind_profiler(py::module_& m) {
  using runtime::KernelRecord;
  py::class_<runtime::BlockRecord>(m, "BlockRecord", "One block of a recorded kernel (times since the profiler's epoch).")
      .def_readonly("block_idx", &runtime::BlockRecord::block_idx, "Index of the block in the kernel.")
      .def_readonly("core_id", &runtime::BlockRecord::core_id, "The worker core that ran it.")
      .def_readonly("start_ns", &runtime::BlockRecord::start_ns, "Start, ns since the profiler's epoch.")
      .def_readonly("end_ns", &runtime::BlockRecord::end_ns, "End, ns since the profiler's epoch.");
  py::class_<KernelRecord>(m, "KernelRecord", "One finished kernel (times since the profiler's epoch).")
      .def_readonly("pe", &KernelRecord::pe, "PE id of the process that ran it (-1: none).")
      .def_readonly("device", &KernelRecord::device, "Device id.")
      .def_readonly("stream", &KernelRecord::stream, "Stream id.")
      .def_readonly("name", &KernelRecord::name, "Kernel name.")
      .def_property_readonly("kind", [](const KernelRecord& r) {
        return std::string(runtime::kernel_kind_name(r.kind));
      }, "Kernel kind name (cube, vector, mixed or comm).")
      .def_readonly("start_ns", &KernelRecord::start_ns, "First block's start, ns since the profiler's epoch.")
      .def_readonly("end_ns", &KernelRecord::end_ns, "Last block's end, ns since the profiler's epoch.")
      .def_readonly("block_dim", &KernelRecord::block_dim, "Number of blocks.")
      .def_property_readonly("cube_num", [](const KernelRecord& r) { return r.limits.cube; },
                             "Cube-core limit in force at launch.")
      .def_property_readonly("vector_num", [](const KernelRecord& r) { return r.limits.vector; },
                             "Vector-core limit in force at launch.")
      .def_readonly("cache_id", &KernelRecord::cache_id, "The op-cache entry its tiling came from (0: none).")
      .def_readonly("blocks", &KernelRecord::blocks, "A list of BlockRecord, one per block.")
      .def("__repr__", [](const KernelRecord& r) {
        return fmt::format("KernelRecord('{}' stream={} block_dim={} {}..{} ns)", r.name, r.stream,
                           r.block_dim, r.start_ns, r.end_ns);
      });
  m.def("start", &runtime::profiler_start, "Record every kernel from now on.");
  m.def("stop", &runtime::profiler_stop, "Stop recording; the records so far are kept.");
  m.def("enabled", &runtime::profiler_enabled, "Whether the profiler is recording.");
  m.def("clear", &runtime::profiler_clear, "Drop the records collected so far.");
  m.def("records", &runtime::profiler_records, "The finished kernels recorded so far.");
  m.def("export", &runtime::profiler_export, py::arg("dir"),
        "Writes kernel_details.csv and trace.json (Perfetto) into `dir`; returns their paths.");
  m.def("write_kernel_details_csv", &runtime::write_kernel_details_csv, py::arg("path"),
        "Writes the records as kernel_details.csv (one row per kernel, with block_dim) to `path`.");
  m.def("write_chrome_trace", &runtime::write_chrome_trace, py::arg("path"),
        "Writes the records as a Chrome/Perfetto trace JSON to `path`.");
}

}  // namespace coremesh::python
