// Graph mode: capture the work launched on a stream into a graph, rewrite
// it with passes, instantiate it once and replay it.
//
//   graph::begin_capture(stream);
//   ... ops on `stream`, and on streams forked from it through events ...
//   graph::Graph g = graph::end_capture();        // nodes + edges, nothing ran
//   graph::Exec exec = graph::instantiate(std::move(g));   // passes, kernels
//   exec.replay(stream);                          // as often as wanted
//
// Capture follows CUDA's model (runtime/capture.hpp): a stream joins by
// waiting on an event recorded on a capturing stream and must be joined
// back before end_capture(); edges come from stream order and event
// record/wait pairs, never from a manual dependency. Each node keeps its op
// descriptor, its stream and the core limits in force when it was launched,
// and replays under those limits.
//
// Which tensors may a pass drop or stop writing? Those nobody outside the
// graph can read: end_capture() counts the references to each storage held
// by the graph (descriptors and kernel closures) and treats a storage with
// any other reference (a tensor the caller kept, a model's weights, an
// arena) as external. A temporary created inside the captured ops and not
// returned is internal.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "coremesh/runtime/stream.hpp"

namespace coremesh::graph {

// One op of the graph.
struct Node {
  int id = 0;                                 // its name in dumps (n<id>), stable through passes
  std::shared_ptr<const runtime::OpDesc> op;  // what it computes; never null
  runtime::KernelKind kind = runtime::KernelKind::vector;
  int stream_id = 0;
  int priority = 0;
  runtime::CoreLimits limits;        // in force at capture (stream > device > spec); replayed under them
  runtime::CoreLimits stream_limit;  // the stream's own limit at capture, 0 = unset (the RFC's core_num attribute)
  std::optional<runtime::Kernel> kernel;  // as captured; empty for a node a pass made (built at instantiate)
  std::vector<int> deps;                  // ids of the nodes it waits for
  std::vector<int> fused_from;            // ids of the captured nodes a fusion replaced by it
};

class Graph {
 public:
  Graph() = default;
  // Nodes in an order their deps allow; `external` as end_capture() computes it.
  Graph(runtime::Device* device, int origin_stream, std::vector<Node> nodes,
        std::unordered_set<const Storage*> external);

  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& nodes() { return nodes_; }
  runtime::Device* device() const { return device_; }
  int origin_stream() const { return origin_stream_; }
  Node* find(int id);
  const Node* find(int id) const;
  // Ids of the nodes that depend on each node, by node id.
  std::vector<std::vector<int>> successors() const;

  // True when nobody outside the graph holds the tensor's storage.
  bool internal(const Tensor& t) const { return !external_.contains(t.storage().get()); }

  // Replaces the nodes `ids` by `node` (placed where the last of them was):
  // it waits for what they waited for, and their dependents wait for it.
  void replace(const std::vector<int>& ids, Node node);
  // Removes node `id`; its dependents wait for what it waited for.
  void remove(int id);
  int new_id() { return next_id_++; }

  // Text form, one line per node in order, tensors named by storage
  // (t<k>, + element offset for a view; internal ones listed at the end):
  //   n1 = add(t2[64,16]f32, t3[64,16]f32) -> t2[64,16]f32  @s0 cores=cube:4,vector:4 limit=- after n0
  std::string dump() const;

 private:
  runtime::Device* device_ = nullptr;
  int origin_stream_ = 0;
  std::vector<Node> nodes_;
  std::unordered_set<const Storage*> external_;
  int next_id_ = 0;
};

// Starts capturing the work launched on `stream` (this thread's capture).
void begin_capture(runtime::Stream& stream);
// Ends this thread's capture; throws runtime::CaptureError if it was refused
// something or a forked stream was not joined back.
Graph end_capture();

}  // namespace coremesh::graph
