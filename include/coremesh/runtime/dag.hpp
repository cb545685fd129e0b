// A graph of kernels that a stream runs as one item (graph replay): once
// the stream reaches it, every node whose dependencies are done goes to the
// device's workers with its own block_dim and core limits, so nodes with no
// path between them run concurrently, as the streams they were captured on
// did; the stream's later work waits for all nodes. Enqueueing it costs the
// host one launch whatever the number of nodes.
//
// Errors: a node that throws makes the stream errored (the rest of the
// graph is skipped), reported by the next synchronize() as a KernelError
// naming the kernel.
//
// Thread safety: launch() may be called from any thread; the runs of one
// KernelDag are serialized (a run waits for the previous one to finish).
#pragma once

#include <memory>
#include <vector>

#include "coremesh/runtime/stream.hpp"

namespace coremesh::runtime {

struct DagNode {
  Kernel kernel;
  CoreLimits limits;      // the kernel runs under these (block_dim <= max_blocks(limits, kind))
  int stream_id = -1;     // shown by the profiler; -1: the stream the graph runs on
  int priority = 0;       // scheduling priority of its blocks
  std::vector<int> deps;  // earlier nodes it waits for
};

struct DagRun;

class KernelDag {
 public:
  // Validates the nodes (deps point to earlier nodes, block_dim fits the limits).
  KernelDag(Device& device, std::vector<DagNode> nodes);
  ~KernelDag();
  KernelDag(const KernelDag&) = delete;
  KernelDag& operator=(const KernelDag&) = delete;

  // Enqueues one run of every node on `stream` (a stream of the same device).
  void launch(Stream& stream);
  size_t size() const;

 private:
  std::shared_ptr<DagRun> run_;
};

}  // namespace coremesh::runtime
