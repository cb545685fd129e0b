// coremesh.shmem collectives, blocking and on-stream.
//
// Blocking collectives release the GIL and return when dest is complete.
// The *_on_stream variants enqueue comm kernels on a runtime stream (default:
// the current one) under its vector-core limit and return at once; errors
// surface at the stream's synchronize(). The arrays they use stay alive
// until the stream has passed them (an event per call, checked on later
// calls and at finalize).
#include <pybind11/numpy.h>

#include <utility>
#include <vector>

#include "coremesh/runtime/stream.hpp"
#include "shmem_buffers.hpp"

namespace coremesh::python {
namespace {

using runtime::Stream;

// Arrays in use by on-stream work, released once its event has completed.
// Never destroyed: at process exit Python is gone and must not be touched.
std::vector<std::pair<runtime::Event, py::object>>& in_flight() {
  static auto* arrays = new std::vector<std::pair<runtime::Event, py::object>>;
  return *arrays;
}

void keep_until_done(Stream& stream, py::object arrays) {
  std::erase_if(in_flight(), [](const auto& item) { return item.first.query(); });
  in_flight().emplace_back(stream.record_event(), std::move(arrays));
}

Stream stream_arg(const std::optional<Stream>& stream) {
  return stream ? *stream : runtime::current_stream();
}

size_t element_count(const Buffer& b) { return b.bytes / b.itemsize; }

// Every (offset, count) of an alltoallv stays inside its array (in elements).
void check_within(const std::vector<size_t>& counts, const std::vector<size_t>& offsets, size_t elements,
                  const char* side, const char* array) {
  CM_CHECK(counts.size() == offsets.size(), "give one count and one offset per member",
           "alltoallv: {} {}_counts but {} {}_offsets", counts.size(), side, offsets.size(), side);
  for (size_t i = 0; i < counts.size(); ++i)
    CM_CHECK(offsets[i] <= elements && counts[i] <= elements - offsets[i],
             fmt::format("make {} larger or the {} counts and offsets smaller", array, side),
             "alltoallv: member {}: {}_offsets {} + {}_counts {} passes the end of {} ({} elements)", i, side,
             offsets[i], side, counts[i], array, elements);
}

void check_same_type(const Buffer& a, const Buffer& b, const char* api) {
  CM_CHECK(a.code == b.code && a.itemsize == b.itemsize, "use arrays of the same dtype",
           "{}: element types differ ('{}' vs '{}')", api, a.code, b.code);
}

// Calls fn(T{}) for a reduction's element type; dtype='bf16' reads uint16
// codes as bf16.
template <bool Double, typename Fn>
void dispatch_reduce(const Buffer& b, const py::object& dtype, const char* api, Fn&& fn) {
  if (!dtype.is_none()) {
    CM_CHECK(dtype_arg(dtype) == DType::bf16 && b.itemsize == 2,
             "pass dtype='bf16' with uint16 codes, or leave dtype out", "{}: unsupported dtype", api);
    return fn(bf16{});
  }
  if (b.code == 'f' && b.itemsize == 4) return fn(float{});
  if (b.code == 'i' && b.itemsize == 4) return fn(int32_t{});
  if ((b.code == 'l' || b.code == 'q') && b.itemsize == 8) return fn(int64_t{});
  if constexpr (Double) {
    if (b.code == 'd' && b.itemsize == 8) return fn(double{});
  }
  CM_THROW(InvalidArgument,
           Double ? "use float32, float64, int32 or int64 (or uint16 codes with dtype='bf16')"
                  : "use float32, int32 or int64 (or uint16 codes with dtype='bf16')",
           "{}: unsupported element type '{}'", api, b.code);
}

// Every member passes the same number of bytes (one small exchange): a
// collective of mismatched sizes gave wrong results silently.
void check_same_bytes(const shmem::Team& team, const Buffer& src, const char* api) {
  py::gil_scoped_release nogil;
  shmem::check_agreement(team, int64_t(src.bytes), api, "source sizes (bytes)");
}

void bind_blocking(py::module_& m) {
  using namespace shmem::detail;
  m.def("broadcast", [](const py::handle& dest, const py::handle& src, int root,
                        const std::optional<shmem::Team>& team) {
          const Buffer d = buffer_arg(dest, "dest", true), s = buffer_arg(src, "src", false);
          check_same_type(d, s, "broadcast");
          CM_CHECK(d.bytes >= s.bytes, "make dest as large as src", "broadcast: dest is too small");
          check_same_bytes(team_arg(team), s, "broadcast");
          py::gil_scoped_release nogil;
          broadcast_bytes(team_arg(team), d.ptr, s.ptr, s.bytes, root);
        }, py::arg("dest"), py::arg("src"), py::arg("root"), py::arg("team") = py::none(),
        "dest (symmetric) on every member = the root's src.");
  m.def("allgather", [](const py::handle& dest, const py::handle& src, const std::optional<shmem::Team>& team) {
          const Buffer d = buffer_arg(dest, "dest", true), s = buffer_arg(src, "src", false);
          const shmem::Team t = team_arg(team);
          check_same_type(d, s, "allgather");
          CM_CHECK(d.bytes >= s.bytes * static_cast<size_t>(t.n_pes()),
                   "make dest n_pes times as large as src", "allgather: dest is too small");
          check_same_bytes(t, s, "allgather");
          py::gil_scoped_release nogil;
          allgather_bytes(t, d.ptr, s.ptr, s.bytes);
        }, py::arg("dest"), py::arg("src"), py::arg("team") = py::none(),
        "dest[k*len(src):...] = member k's src (fcollect).");
  m.def("alltoall", [](const py::handle& dest, const py::handle& src, const std::optional<shmem::Team>& team) {
          const Buffer d = buffer_arg(dest, "dest", true), s = buffer_arg(src, "src", false);
          const shmem::Team t = team_arg(team);
          const auto n = static_cast<size_t>(t.n_pes());
          check_same_type(d, s, "alltoall");
          CM_CHECK(element_count(s) % n == 0 && d.bytes >= s.bytes,
                   "src holds n_pes equal chunks; dest is as large as src",
                   "alltoall: {} elements do not split over {} PEs", element_count(s), n);
          check_same_bytes(t, s, "alltoall");
          py::gil_scoped_release nogil;
          alltoall_bytes(t, d.ptr, s.ptr, s.bytes / n);
        }, py::arg("dest"), py::arg("src"), py::arg("team") = py::none(),
        "Chunk k of dest = member k's chunk my_pe of src.");
  m.def("alltoallv", [](const py::handle& dest, std::vector<size_t> recv_counts,
                        std::vector<size_t> recv_offsets, const py::handle& src,
                        std::vector<size_t> send_counts, std::vector<size_t> send_offsets,
                        const std::optional<shmem::Team>& team) {
          const Buffer d = buffer_arg(dest, "dest", true), s = buffer_arg(src, "src", false);
          check_same_type(d, s, "alltoallv");
          check_within(recv_counts, recv_offsets, element_count(d), "recv", "dest");
          check_within(send_counts, send_offsets, element_count(s), "send", "src");
          py::gil_scoped_release nogil;
          alltoallv_bytes(team_arg(team), d.ptr, recv_counts, recv_offsets, s.ptr, send_counts,
                          send_offsets, s.itemsize);
        }, py::arg("dest"), py::arg("recv_counts"), py::arg("recv_offsets"), py::arg("src"),
        py::arg("send_counts"), py::arg("send_offsets"), py::arg("team") = py::none(), R"doc(
Member i sends src[send_offsets[j]:][:send_counts[j]] to member j, which
stores it at dest[recv_offsets[i]:]; counts and offsets in elements, one per
member (MoE token dispatch). Both arrays symmetric.)doc");
  m.def("allreduce", [](const py::handle& dest, const py::handle& src, const std::string& op,
                        const std::optional<shmem::Team>& team, const py::object& dtype) {
          const Buffer d = buffer_arg(dest, "dest", true), s = buffer_arg(src, "src", false);
          check_same_type(d, s, "allreduce");
          CM_CHECK(d.bytes >= s.bytes, "make dest as large as src", "allreduce: dest is too small");
          check_same_bytes(team_arg(team), s, "allreduce");
          dispatch_reduce<true>(s, dtype, "allreduce", [&](auto zero) {
            using T = decltype(zero);
            py::gil_scoped_release nogil;
            shmem::allreduce<T>(team_arg(team), static_cast<T*>(d.ptr), static_cast<const T*>(s.ptr),
                                element_count(s), reduce_op_arg(op));
          });
        }, py::arg("dest"), py::arg("src"), py::arg("op") = "sum", py::arg("team") = py::none(),
        py::arg("dtype") = py::none(), "Element-wise 'sum', 'max', 'min' or 'prod' over the members.");
  m.def("reduce_scatter", [](const py::handle& dest, const py::handle& src, const std::string& op,
                             const std::optional<shmem::Team>& team, const py::object& dtype) {
          const Buffer d = buffer_arg(dest, "dest", true), s = buffer_arg(src, "src", false);
          const shmem::Team t = team_arg(team);
          check_same_type(d, s, "reduce_scatter");
          CM_CHECK(s.bytes == d.bytes * static_cast<size_t>(t.n_pes()), "src holds n_pes chunks of dest's size",
                   "reduce_scatter: {} source bytes for {} PEs x {} bytes", s.bytes, t.n_pes(), d.bytes);
          check_same_bytes(t, s, "reduce_scatter");
          dispatch_reduce<true>(s, dtype, "reduce_scatter", [&](auto zero) {
            using T = decltype(zero);
            py::gil_scoped_release nogil;
            shmem::reduce_scatter<T>(t, static_cast<T*>(d.ptr), static_cast<const T*>(s.ptr),
                                     element_count(d), reduce_op_arg(op));
          });
        }, py::arg("dest"), py::arg("src"), py::arg("op") = "sum", py::arg("team") = py::none(),
        py::arg("dtype") = py::none(), "dest = this member's chunk of the reduction of src.");
}

void bind_on_stream(py::module_& m) {
  m.def("put_on_stream", [](const py::handle& dest, const py::handle& src, int pe, const std::optional<Stream>& stream) {
          const Buffer d = buffer_arg(dest, "dest", true), s = buffer_arg(src, "src", false);
          check_same_type(d, s, "put_on_stream");
          CM_CHECK(d.bytes >= s.bytes, "make dest as large as src", "put_on_stream: dest is too small");
          Stream st = stream_arg(stream);
          shmem::detail::put_on_stream_bytes(st, d.ptr, s.ptr, s.bytes, pe, nullptr, 0, shmem::SignalOp::set);
          keep_until_done(st, py::make_tuple(d.view, s.view));
        }, py::arg("dest"), py::arg("src"), py::arg("pe"), py::arg("stream") = py::none(),
        "put as comm kernels on `stream` (default: current).");
  m.def("put_signal_on_stream", [](const py::handle& dest, const py::handle& src, const py::handle& signal,
                                   uint64_t value, int pe, const std::string& op,
                                   const std::optional<Stream>& stream) {
          const Buffer d = buffer_arg(dest, "dest", true), s = buffer_arg(src, "src", false);
          check_same_type(d, s, "put_signal_on_stream");
          CM_CHECK(d.bytes >= s.bytes, "make dest as large as src", "put_signal_on_stream: dest is too small");
          Stream st = stream_arg(stream);
          shmem::detail::put_on_stream_bytes(st, d.ptr, s.ptr, s.bytes, pe, signal_arg(signal), value,
                                             signal_op_arg(op));
          keep_until_done(st, py::make_tuple(d.view, s.view, py::reinterpret_borrow<py::object>(signal)));
        }, py::arg("dest"), py::arg("src"), py::arg("signal"), py::arg("value"), py::arg("pe"),
        py::arg("op") = "set", py::arg("stream") = py::none(),
        "put, then the signal on `pe` once every block of the copy is done.");
  m.def("signal_wait_on_stream", [](const py::handle& signal, const std::string& cmp, uint64_t value,
                                    const std::optional<Stream>& stream) {
          Stream st = stream_arg(stream);
          shmem::signal_wait_on_stream(st, signal_arg(signal), cmp_arg(cmp), value);
          keep_until_done(st, py::reinterpret_borrow<py::object>(signal));
        }, py::arg("signal"), py::arg("cmp"), py::arg("value"), py::arg("stream") = py::none(),
        "Later work on `stream` waits until signal[0] <cmp> value on this PE.");
  m.def("quiet_on_stream", [](const std::optional<Stream>& stream) {
          Stream st = stream_arg(stream);
          shmem::quiet_on_stream(st);
        }, py::arg("stream") = py::none(),
        "quiet as a comm kernel on `stream` (default: current): completes this PE's puts; asynchronous.");
  m.def("barrier_on_stream", [](const std::optional<shmem::Team>& team, const std::optional<Stream>& stream) {
          Stream st = stream_arg(stream);
          shmem::barrier_on_stream(st, team_arg(team));
        }, py::arg("team") = py::none(), py::arg("stream") = py::none(),
        "quiet + sync of team (default: world) as a comm kernel on `stream`; asynchronous, collective.");
  m.def("allreduce_on_stream", [](const py::handle& dest, const py::handle& src, const std::string& op,
                                  const std::optional<shmem::Team>& team, const std::optional<Stream>& stream,
                                  const py::object& dtype) {
          const Buffer d = buffer_arg(dest, "dest", true), s = buffer_arg(src, "src", false);
          check_same_type(d, s, "allreduce_on_stream");
          CM_CHECK(d.bytes >= s.bytes, "make dest as large as src", "allreduce_on_stream: dest is too small");
          Stream st = stream_arg(stream);
          dispatch_reduce<true>(s, dtype, "allreduce_on_stream", [&](auto zero) {
            using T = decltype(zero);
            shmem::allreduce_on_stream<T>(st, team_arg(team), static_cast<T*>(d.ptr),
                                          static_cast<const T*>(s.ptr), element_count(s), reduce_op_arg(op));
          });
          keep_until_done(st, py::make_tuple(d.view, s.view));
        }, py::arg("dest"), py::arg("src"), py::arg("op") = "sum", py::arg("team") = py::none(),
        py::arg("stream") = py::none(), py::arg("dtype") = py::none(),
        "'sum', 'max', 'min' or 'prod' on the stream, rank-ordered (the same bits on every member).");
  m.def("reduce_scatter_on_stream", [](const py::handle& dest, const py::handle& src, const std::string& op,
                                       const std::optional<shmem::Team>& team, const std::optional<Stream>& stream,
                                       const py::object& dtype) {
          const Buffer d = buffer_arg(dest, "dest", true), s = buffer_arg(src, "src", false);
          const shmem::Team t = team_arg(team);
          check_same_type(d, s, "reduce_scatter_on_stream");
          CM_CHECK(s.bytes == d.bytes * static_cast<size_t>(t.n_pes()), "src holds n_pes chunks of dest's size",
                   "reduce_scatter_on_stream: {} source bytes for {} PEs x {} bytes", s.bytes, t.n_pes(), d.bytes);
          Stream st = stream_arg(stream);
          dispatch_reduce<true>(s, dtype, "reduce_scatter_on_stream", [&](auto zero) {
            using T = decltype(zero);
            shmem::reduce_scatter_on_stream<T>(st, t, static_cast<T*>(d.ptr), static_cast<const T*>(s.ptr),
                                               element_count(d), reduce_op_arg(op));
          });
          keep_until_done(st, py::make_tuple(d.view, s.view));
        }, py::arg("dest"), py::arg("src"), py::arg("op") = "sum", py::arg("team") = py::none(),
        py::arg("stream") = py::none(), py::arg("dtype") = py::none(),
        "ZeRO-1's gradient reduction: dest = this member's chunk of the rank-ordered reduction of src.");
  m.def("allgather_on_stream", [](const py::handle& dest, const py::handle& src,
                                  const std::optional<shmem::Team>& team, const std::optional<Stream>& stream) {
          const Buffer d = buffer_arg(dest, "dest", true), s = buffer_arg(src, "src", false);
          const shmem::Team t = team_arg(team);
          check_same_type(d, s, "allgather_on_stream");
          CM_CHECK(d.bytes >= s.bytes * static_cast<size_t>(t.n_pes()), "make dest n_pes times as large as src",
                   "allgather_on_stream: dest is too small");
          Stream st = stream_arg(stream);
          shmem::detail::allgather_on_stream_bytes(st, t, d.ptr, s.ptr, s.bytes);
          keep_until_done(st, py::make_tuple(d.view, s.view));
        }, py::arg("dest"), py::arg("src"), py::arg("team") = py::none(), py::arg("stream") = py::none(),
        "ZeRO-1's parameter gather on the stream: dest[k*len(src):...] = member k's src.");
  m.def("broadcast_on_stream", [](const py::handle& dest, const py::handle& src, int root,
                                  const std::optional<shmem::Team>& team, const std::optional<Stream>& stream) {
          const Buffer d = buffer_arg(dest, "dest", true), s = buffer_arg(src, "src", false);
          check_same_type(d, s, "broadcast_on_stream");
          CM_CHECK(d.bytes >= s.bytes, "make dest as large as src", "broadcast_on_stream: dest is too small");
          Stream st = stream_arg(stream);
          shmem::detail::broadcast_on_stream_bytes(st, team_arg(team), d.ptr, s.ptr, s.bytes, root);
          keep_until_done(st, py::make_tuple(d.view, s.view));
        }, py::arg("dest"), py::arg("src"), py::arg("root"), py::arg("team") = py::none(),
        py::arg("stream") = py::none(), "dest on every member = the root's src, on the stream.");
  m.def("alltoallv_on_stream", [](const py::handle& dest, std::vector<size_t> recv_counts,
                                  std::vector<size_t> recv_offsets, const py::handle& src,
                                  std::vector<size_t> send_counts, std::vector<size_t> send_offsets,
                                  const std::optional<shmem::Team>& team, const std::optional<Stream>& stream) {
          const Buffer d = buffer_arg(dest, "dest", true), s = buffer_arg(src, "src", false);
          check_same_type(d, s, "alltoallv_on_stream");
          Stream st = stream_arg(stream);
          const auto run = [&](auto zero) {
            using T = decltype(zero);
            shmem::alltoallv_on_stream<T>(st, team_arg(team), static_cast<T*>(d.ptr), recv_counts,
                                          recv_offsets, static_cast<const T*>(s.ptr), send_counts,
                                          send_offsets);
          };
          // The copy moves elements as bytes: any dtype of 2, 4 or 8 bytes.
          if (s.itemsize == 2) run(bf16{});
          else if (s.itemsize == 4) run(int32_t{});
          else if (s.itemsize == 8) run(int64_t{});
          else CM_THROW(InvalidArgument, "use elements of 2, 4 or 8 bytes", "alltoallv_on_stream: {}-byte elements", s.itemsize);
          keep_until_done(st, py::make_tuple(d.view, s.view));
        }, py::arg("dest"), py::arg("recv_counts"), py::arg("recv_offsets"), py::arg("src"),
        py::arg("send_counts"), py::arg("send_offsets"), py::arg("team") = py::none(),
        py::arg("stream") = py::none(), "alltoallv as comm kernels on the stream.");
}

}  // namespace

void release_on_stream_arrays() {
  std::erase_if(in_flight(), [](const auto& item) { return item.first.query(); });
}

void bind_shmem_collectives(py::module_& m) {
  bind_blocking(m);
  bind_on_stream(m);
}

}  // namespace coremesh::python
