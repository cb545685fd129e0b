// KernelDag (dag.hpp): a stream item that runs a graph of kernels. Data flow
// of one run:
//
//   stream reaches the item ──> start(): reset every node, submit the roots
//   worker finishes a node's last block ──> node_done(): each successor whose
//       last dependency this was goes to the device's ready list (skipped,
//       like a kernel on an errored stream, once a node failed)
//   last node done ──> finish(): the stream's item_done(first error)
//
// The KernelRun of every node is made once and reset by each run, so a
// replay allocates nothing per kernel.
#include "coremesh/runtime/dag.hpp"

#include "coremesh/runtime/capture.hpp"
#include "internal.hpp"

namespace coremesh::runtime {

bool DagRun::start(std::shared_ptr<StreamImpl> s) {
  if (runs.empty()) return true;
  const bool profiled = profiler_enabled();
  for (size_t i = 0; i < runs.size(); ++i) {
    KernelRun& r = *runs[i];
    r.next_block = 0;
    r.blocks_left.store(r.info.block_dim, std::memory_order_relaxed);
    r.start_ns.store(INT64_MAX, std::memory_order_relaxed);
    r.end_ns.store(0, std::memory_order_relaxed);
    r.error = nullptr;
    r.profiled = profiled;
    if (profiled) r.blocks.assign(static_cast<size_t>(r.info.block_dim), BlockRecord{});
    r.stream_id = stream_ids[i] < 0 ? s->id : stream_ids[i];
    if (stream_ids[i] < 0) r.priority = s->priority;
    waiting[i].store(static_cast<int>(deps_of[i]), std::memory_order_relaxed);
  }
  left.store(static_cast<int>(runs.size()), std::memory_order_relaxed);
  error = nullptr;
  stream = std::move(s);
  for (size_t i = 0; i < runs.size(); ++i)
    if (deps_of[i] == 0) device->submit(runs[i]);
  return false;
}

void DagRun::node_done(int node, std::exception_ptr node_error) {
  bool failed;
  {
    std::lock_guard lock(mutex);
    if (node_error && !error) error = node_error;
    failed = error != nullptr;
  }
  std::vector<int> done{node};
  while (!done.empty()) {
    const int n = done.back();
    done.pop_back();
    for (int next : successors[size_t(n)]) {
      if (waiting[size_t(next)].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
      if (failed) done.push_back(next);  // skipped: its inputs may be bad
      else device->submit(runs[size_t(next)]);
    }
    if (left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::exception_ptr e;
      {
        std::lock_guard lock(mutex);
        e = error;
      }
      auto s = std::move(stream);  // the next run may start inside item_done
      s->item_done(e);
      return;
    }
  }
}

std::string DagRun::describe() const {
  return fmt::format("a graph replay ({} kernels, {} not done)", runs.size(), left.load());
}

KernelDag::KernelDag(Device& device, std::vector<DagNode> nodes) : run_(std::make_shared<DagRun>()) {
  DagRun& d = *run_;
  d.device = &device.impl();
  d.successors.resize(nodes.size());
  d.deps_of.resize(nodes.size());
  d.waiting = std::make_unique<std::atomic<int>[]>(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    DagNode& n = nodes[i];
    const LaunchInfo& info = n.kernel.info;
    const int allowed = max_blocks(n.limits, info.kind);
    CM_CHECK(info.block_dim >= 1 && info.block_dim <= allowed && n.kernel.body != nullptr,
             "tile the kernel within the node's limits and give it a body",
             "graph node {} ('{}') has block_dim {} but its limits allow {}", i, info.name, info.block_dim, allowed);
    for (int dep : n.deps) {
      CM_CHECK(dep >= 0 && static_cast<size_t>(dep) < i, "list nodes in an order their dependencies allow",
               "graph node {} depends on node {}", i, dep);
      d.successors[size_t(dep)].push_back(static_cast<int>(i));
    }
    d.deps_of[i] = n.deps.size();
    auto run = std::make_shared<KernelRun>();
    run->info = std::move(n.kernel.info);
    run->body = std::move(n.kernel.body);
    run->limits = n.limits;
    run->dag = &d;
    run->dag_node = static_cast<int>(i);
    run->priority = n.priority;
    d.runs.push_back(std::move(run));
    d.stream_ids.push_back(n.stream_id);
  }
}

KernelDag::~KernelDag() = default;

size_t KernelDag::size() const { return run_->runs.size(); }

void KernelDag::launch(Stream& stream) {
  StreamImpl& s = *stream.impl();
  CM_CHECK(s.device == run_->device, "replay a graph on a stream of the device it was captured on",
           "stream {} belongs to device {}, the graph to device {}", s.id, s.device->id, run_->device->id);
  if (s.capturing.load(std::memory_order_acquire))
    throw CaptureError(fmt::format("a graph replay on capturing stream {}", s.id),
                       "replay it before begin_capture() or after end_capture()", __FILE__, __LINE__);
  std::lock_guard lock(run_->launch_mutex);
  // Runs of one graph share its nodes' state: wait for the previous one
  // (free when it was enqueued on this same stream, which keeps order anyway).
  if (run_->last_done && run_->last_stream.lock().get() != &s)
    s.enqueue(WorkItem{WorkItem::Type::wait, nullptr, run_->last_done, nullptr});
  s.enqueue(WorkItem{WorkItem::Type::dag, nullptr, nullptr, run_});
  auto done = std::make_shared<Recording>();
  done->stream_id = s.id;
  s.enqueue(WorkItem{WorkItem::Type::record, nullptr, done, nullptr});
  run_->last_done = std::move(done);
  run_->last_stream = stream.impl();
}

}  // namespace coremesh::runtime
