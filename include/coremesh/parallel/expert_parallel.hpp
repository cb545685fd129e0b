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
// combine is the same pull the other way: the owner's experts write their
// outputs into its symmetric return buffer and it signals every source,
// which reads its rows back into its own row order (its own experts' rows
// from its own buffer, while the others' signals are on their way). The
// backward runs the mirror pair: combine's backward is a dispatch of dy
// (from the sources' backward send buffers), dispatch's backward a combine
// of drows (from the owners' backward return buffers).
//
// Buffers are allocated once (collectively) per MoE layer and exchange: a
// source sends at most max_rows rows (N x K of its largest micro-batch); an
// owner receives at most one slot of rows per source: max_rows, or, with an
// expert capacity, (E / ep) x capacity. A larger micro-batch than the
// buffers were sized for is refused with the fix. Forward and backward use
// their own buffers, so a PE ahead by one phase never writes into one still
// being read. Within a direction, a layer's next dispatch must follow its
// combine (checked); a buffer is rewritten only after its readers are done:
// a source rebuilds its send buffer for round n + 1 after it has read round
// n's rows back (so every owner has read round n), and an owner rewrites its
// return buffer after round n + 1's rows have arrived, which every source
// signals after reading round n.
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
  Tensor send_buffer(int layer, Exchange which, int64_t rows, int64_t width) override;

 private:
  struct Received {
    Tensor rows;    // (recv_rows, C): the rows of this PE's experts, grouped
    Tensor filled;  // (1) i64: rows from here on are zero (set on the stream)
  };
  struct Layer {
    Tensor counts;                 // (ep, E) i64: row counts of every source
    Tensor send_fwd, send_bwd;     // (max_rows, C): rows the owners read from their source
    Tensor ret_fwd, ret_bwd;       // (recv_rows, C): rows the sources read back from their owner
    Tensor signals;                // u64: send_fwd, ret_fwd, send_bwd, ret_bwd ready
    std::vector<Received> received_fwd, received_bwd;
    uint64_t fwd_round = 0, bwd_round = 0;
    bool awaiting_combine = false;  // dispatched, not yet combined
  };
  struct Plan;
  Layer& layer(int index);
  Received free_received(Layer& L, bool forward);
  // Rows of xp order, in this PE's `send` buffer -> the owners, who read
  // them from there once signalled (`sig`); returns the rows this PE's
  // experts compute (dispatch: the plan first, from every source's counts;
  // mine from `offsets`).
  Tensor to_owners(const Tensor& rows, const Plan& plan, Tensor Layer::*send, int sig, uint64_t round,
                   const Tensor& offsets = Tensor());
  // Rows of this PE's experts, in its `ret` buffer -> the sources, who read
  // them from there once signalled (`sig`); returns this PE's rows in xp
  // order.
  Tensor to_sources(const Tensor& rows, const Plan& plan, Tensor Layer::*ret, int sig, uint64_t round);

  Group ep_;
  Shape shape_;
  int local_ = 0;
  int64_t slot_rows_ = 0;  // rows of one source's slot in a receive buffer
  int64_t recv_rows_ = 0;
  std::map<int, Layer> layers_;
};

}  // namespace coremesh::parallel
