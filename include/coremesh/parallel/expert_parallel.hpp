// Expert parallelism over SHMEM: the ExpertDispatcher seam for routed
// experts sharded over the PEs of an EP group (E / ep experts each).
//
// dispatch (per MoE layer, all on the stream, no host synchronization, no
// barrier; each PE waits only for the signals of the data it needs):
//   1. the model builds its rows (grouped by global expert) in this PE's
//      symmetric send buffer (send_buffer; rows passed from elsewhere are
//      copied there first); every PE puts its per-expert row counts (E) into
//      each other member's count matrix (ep x E) and signals it once: "my
//      rows are ready";
//   2. the owner waits for its ep - 1 signals and, in one kernel, derives the
//      plan from the counts and reads its experts' rows straight out of the
//      sources' send buffers (gets), grouped by local expert and, inside
//      one, by source (the order of one PE's micro-batches); its own rows it
//      takes from its own buffer. One copy per row, as a pull.
// combine puts the experts' outputs back to the sources' buffers, in each
// source's own row order (one signal per source); a source takes its own
// experts' outputs directly. The backward runs the mirror pair: combine's
// backward is a dispatch of dy (read from the sources' backward send
// buffers), dispatch's backward a combine of drows.
//
// Buffers are allocated once (collectively) per MoE layer and direction: a
// source sends at most max_rows rows (N x K of its largest micro-batch); an
// owner receives at most one slot of rows per source: max_rows, or, with an
// expert capacity, (E / ep) x capacity. A larger micro-batch than the
// buffers were sized for is refused with the fix. Forward and backward use
// their own buffers, so a PE ahead by one phase never writes into one still
// being read; within a direction, a layer's next dispatch must follow its
// combine (checked): a source rebuilds its send buffer for round n + 1 only
// after it has round n's rows back, so every owner has read round n by then.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "coremesh/parallel/comm.hpp"
#include "coremesh/parallel/seams.hpp"

namespace coremesh::parallel {

class ShmemExperts final : public ExpertDispatcher {
 public:
  struct Shape {
    int experts = 0;         // E (global)
    int64_t width = 0;       // C
    int64_t max_rows = 0;    // rows one PE sends per micro-batch at most (N x K)
    int64_t capacity = -1;   // rows per (source, expert) at most; -1: no capacity
    std::vector<int> layers; // the model's MoE layers
  };
  // Collective over the world (allocates the symmetric buffers).
  ShmemExperts(Group ep, const Shape& shape);

  int first_expert() const { return ep_.me * local_; }
  int local_experts() const { return local_; }
  int64_t receive_rows() const { return recv_rows_; }
  // Bytes of symmetric memory the buffers of `shape` take on each PE.
  static int64_t symmetric_bytes(int ep, const Shape& shape);

  Dispatched dispatch(const Tensor& xp, const Tensor& offsets, int layer) override;
  Tensor combine(const Tensor& y, const Dispatched& d) override;
  Tensor combine_backward(const Tensor& dy, const Dispatched& d) override;
  Tensor dispatch_backward(const Tensor& drows, const Dispatched& d) override;
  Tensor send_buffer(int layer, bool backward, int64_t rows, int64_t width) override;

 private:
  struct Layer {
    Tensor counts;                 // (ep, E) i64: row counts of every source
    Tensor send_fwd, send_bwd;     // (max_rows, C): rows the owners read from their source
    Tensor back_fwd, back_bwd;     // (max_rows, C): rows coming back to their source
    Tensor signals;                // u64: send_fwd, back_fwd, send_bwd, back_bwd ready
    uint64_t fwd_round = 0, bwd_round = 0;
    bool awaiting_combine = false;  // dispatched, not yet combined
  };
  struct Plan;
  Layer& layer(int index);
  // Rows of xp order, in this PE's `send` buffer -> the owners, who read
  // them from there once signalled (`sig`); returns the rows this PE's
  // experts compute (dispatch: the plan first, from every source's counts;
  // mine from `offsets`).
  Tensor to_owners(const Tensor& rows, const Plan& plan, Tensor Layer::*send, int sig, uint64_t round,
                   const Tensor& offsets = Tensor());
  // Rows of this PE's experts -> the sources' `back` buffers, then this PE's
  // rows copied out in xp order.
  Tensor to_sources(const Tensor& rows, const Plan& plan, Tensor Layer::*back, int sig, uint64_t round);

  Group ep_;
  Shape shape_;
  int local_ = 0;
  int64_t slot_rows_ = 0;  // rows of one source's slot in a receive buffer
  int64_t recv_rows_ = 0;
  std::map<int, Layer> layers_;
};

}  // namespace coremesh::parallel
