// begin_capture/end_capture: the runtime records, this turns the record into
// a Graph and finds which storages the graph alone holds.
#include <unordered_map>

#include "coremesh/core/log.hpp"
#include "coremesh/graph/graph.hpp"
#include "coremesh/runtime/capture.hpp"

namespace coremesh::graph {
namespace {

// This thread's capture. A thread that ends while capturing (it raised
// before end_capture) drops its capture: its streams run their launches
// again (they stayed capturing, and every later synchronize refused).
struct ThreadCapture {
  std::shared_ptr<runtime::CaptureSession> session;
  ~ThreadCapture() {
    if (!session) return;
    CM_LOG_WARN("a thread ended while capturing: its capture is dropped (end_capture() on the thread that began it)");
    try {
      runtime::end_stream_capture(session);
    } catch (const std::exception&) {  // an invalid or unjoined capture: dropped all the same
    }
  }
};
thread_local ThreadCapture t_capture;

// Storages of the nodes' tensors that something outside the graph holds (and
// every wrap: its memory is the caller's, whoever holds the handle): a
// storage's use count minus the references the graph holds. The graph's
// references are one per tensor of each descriptor plus those inside the
// kernel closures, counted by copying every closure once (a copy adds one
// reference per Tensor the closure captured by value).
std::unordered_set<const Storage*> external_storages(const std::vector<Node>& nodes) {
  std::unordered_map<const Storage*, long> held;
  std::unordered_map<const Storage*, std::shared_ptr<Storage>> storages;
  std::unordered_set<const runtime::OpDesc*> seen;
  for (const Node& n : nodes) {
    if (!seen.insert(n.op.get()).second) continue;
    for (const auto* list : {&n.op->inputs, &n.op->outputs})
      for (const Tensor& t : *list) {
        ++held[t.storage().get()];
        storages.emplace(t.storage().get(), t.storage());
      }
  }
  for (auto& [s, count] : held) count += 1;  // the `storages` map's own reference
  std::unordered_map<const Storage*, long> before;
  for (auto& [s, ptr] : storages) before[s] = ptr.use_count();
  {
    std::vector<runtime::KernelBody> copies;
    for (const Node& n : nodes)
      if (n.kernel) copies.push_back(n.kernel->body);
    for (auto& [s, ptr] : storages) held[s] += ptr.use_count() - before[s];
  }
  std::unordered_set<const Storage*> external;
  for (auto& [s, ptr] : storages)
    if (ptr.use_count() > held[s] || s->wraps()) external.insert(s);  // a wrap's memory is seen elsewhere
  return external;
}

}  // namespace

void begin_capture(runtime::Stream& stream) {
  CM_CHECK(t_capture.session == nullptr, "call end_capture() for the capture this thread began first",
           "this thread is already capturing");
  t_capture.session = runtime::begin_stream_capture(stream);
}

Graph end_capture() {
  CM_CHECK(t_capture.session != nullptr, "call begin_capture(stream) first", "this thread is not capturing");
  auto session = std::move(t_capture.session);
  runtime::Captured captured = runtime::end_stream_capture(session);
  std::vector<Node> nodes;
  nodes.reserve(captured.kernels.size());
  for (size_t i = 0; i < captured.kernels.size(); ++i) {
    runtime::CapturedKernel& k = captured.kernels[i];
    Node n;
    n.id = static_cast<int>(i);
    n.op = k.kernel.info.op;
    n.kind = k.kernel.info.kind;
    n.stream_id = k.stream_id;
    n.priority = k.priority;
    n.limits = k.limits;
    n.stream_limit = k.stream_limit;
    n.kernel = std::move(k.kernel);
    n.deps = std::move(k.deps);
    nodes.push_back(std::move(n));
  }
  captured.kernels.clear();
  std::unordered_set<const Storage*> external = external_storages(nodes);
  return Graph(captured.device, captured.origin_stream, std::move(nodes), std::move(external));
}

}  // namespace coremesh::graph
