// Expert parallelism over SHMEM: the ExpertDispatcher seam for routed
// experts sharded over the PEs of an EP group (E / ep experts each).
//
// Every exchange is a push with a signal (all on the stream, no host
// synchronization, no barrier; each PE waits only for the signals of the
// rows it needs):
//   dispatch  every source puts, to every owner (itself included), the row
//             counts of the owner's experts and the rows themselves (one
//             contiguous run of its xp, which is grouped by global expert)
//             into the owner's receive slot for that source: non-blocking
//             puts in pieces, each with a signal add, the adds of one send
//             summing to a fixed total. The owner waits for ep totals and, in one
//             kernel, derives the plan from the counts and regroups its slots
//             by local expert and, inside one, by source (the order of one
//             PE's micro-batches) for the grouped GEMM.
//   combine   every owner puts each (local expert, source) run of its
//             experts' outputs straight to its place in the source's return
//             buffer (in the source's xp order) and signals the source,
//             which copies its rows out once all ep owners have signalled.
//   fused     (Shape::fused, a dispatch's FirstGemm; alltoallv_grouped_matmul)
//             every source signals its own word, and the owner multiplies
//             each source's slot (grouped by local expert) as soon as that
//             word says it has landed, its own first, while the later
//             slots travel; the regroup then moves the GEMM's rows with the
//             input rows. The same bits as one GEMM after the regroup.
//             matmul_combine (grouped_matmul_alltoallv) is the mirror: the
//             second GEMM expert by expert, each expert's (expert, source)
//             runs put as soon as they are done, while the next computes.
//   wire      (Shape::wire) the forward dispatch moves its rows as the first
//             GEMM reads them, bf16 or fp8 with 1x128 scales, converted by
//             the source before they leave; combine and the backward move f32.
// The backward runs the mirror pair: combine's backward is a dispatch of dy
// (with the forward's plan), dispatch's backward a combine of drows. The
// data moves while the PEs' cores compute: a piece is one message on the
// network path, which the transport's threads carry while the sending core
// goes on, and the waits park their stream without holding a core. A send's
// sources are kept until an arrival that every receiver sends only after
// applying them (the way back, or the next round). The copies of one call split over as many blocks
// as the stream's vector-core limit allows (`--comm-cores`).
//
// Sites. Every MoE layer has `slices` exchange sites (token-sliced replicas,
// `moe_replicas`), each with its own buffers and signals, so the slices of a
// layer exchange independently: slice i's rows travel while slice i-1's
// experts compute.
//
// Shadowed experts (Shape::balance, expert_balance.hpp). Before the rows,
// every source sends its per-expert counts to every PE; each PE plans the
// same shadows from them on the stream (plan_shadows; static: from the
// counts summed over a window), so no host waits and graph capture keeps it.
// A source leaves its rows of another PE's shadowed experts out of the send
// (count 0) and keeps them as its own groups, after its experts' ones; the
// owner of a shadowed expert sends its weights along with its rows to every
// other PE. Every count travels with the row's start in the source's xp, so
// a return lands where it belongs whatever was left out. The weight
// gradients' parts of the shadow groups go back to the owners
// (Dispatched::exchange_parts), who sum them in source order with theirs.
//
// Buffers are allocated once (collectively) per site: a source sends at most
// max_rows rows; an owner receives at most one slot of rows per source:
// max_rows, or, with an expert capacity, (E / ep) x capacity. More rows are
// refused with the fix. Forward and backward use their own buffers, so a PE
// ahead by one phase never writes into one still being read. Within a
// direction, a site's next dispatch must follow its combine (checked); a
// buffer is rewritten only after its readers are done: a source sends round
// n + 1 after it has its rows of round n back, which every owner sends after
// it has regrouped round n, and an owner sends round n + 1's outputs after
// round n + 1's rows have arrived, which every source sends after copying
// out round n.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <memory>
#include <utility>
#include <vector>

#include "coremesh/parallel/comm.hpp"
#include "coremesh/parallel/expert_balance.hpp"
#include "coremesh/parallel/seams.hpp"

namespace coremesh::parallel {

class ShmemExperts final : public ExpertDispatcher {
 public:
  struct Shape {
    int experts = 0;         // E (global)
    int64_t width = 0;       // C
    int64_t max_rows = 0;    // rows one PE sends per micro-batch and slice at most (slice tokens x K)
    int64_t capacity = -1;   // rows per (source, expert) at most; -1: no capacity
    std::vector<int> layers; // the model's MoE layers
    int slices = 1;          // exchange sites per layer (token-sliced replicas)
    int64_t hidden = 0;      // F of one expert on this PE (its TP share): the weights a shadow moves
    ExpertBalance balance = ExpertBalance::none;
    int balance_window = 10; // static: forward rounds of a site between plans
    double shadow_cost = 16; // the planner's price of a shadow on a PE, in rows
    bool fused = false;      // run a dispatch's FirstGemm per source as its rows land
    // The forward dispatch's rows as they travel and arrive: f32, bf16, or
    // f8e4m3 with their 1x128 scales (AlltoAllvQuantGroupedMatMul), the
    // form the experts' first GEMM reads. The source converts them, so a
    // quarter (a half) of the bytes move, with the bits of a conversion at
    // the owner: a row's form depends on that row alone.
    DType wire = DType::f32;
  };
  // Collective over the world (allocates the symmetric buffers).
  ShmemExperts(Group ep, const Shape& shape);
  ~ShmemExperts() override;

  int first_expert() const { return ep_.me * local_; }
  int local_experts() const { return local_; }
  int64_t receive_rows() const { return recv_rows_; }
  // Bytes of symmetric memory the buffers of `shape` take on each PE.
  static int64_t symmetric_bytes(int ep, const Shape& shape);

  // Shadow slots per site: experts a step may shadow (0: no balancing).
  int shadow_slots() const { return shadows_; }
  static int shadow_slots(const Shape& shape);

  // With Shape::fused and no shadow slots, `first` runs on each source's
  // rows as soon as they have landed (this PE's own first, then the others
  // in the order they are due), while the rest are still in flight.
  Dispatched dispatch(const Tensor& xp, const Tensor& offsets, Site site, const Weights& weights,
                      const FirstGemm& first = {}) override;
  bool shadows() const override { return shadows_ > 0; }
  Tensor combine(const Tensor& y, const Dispatched& d) override;
  // With Shape::fused and no shadow slots: expert by expert, each expert's
  // runs put to their sources as soon as its rows are done.
  Tensor matmul_combine(const Tensor& y, const GroupsGemm& gemm, const Dispatched& d) override;
  Tensor combine_backward(const Tensor& dy, const Dispatched& d) override;
  Tensor dispatch_backward(const Tensor& drows, const Dispatched& d) override;

 private:
  struct Received {
    Tensor rows;    // (recv_rows, C): the rows of this PE's experts, grouped (forward: Shape::wire)
    Tensor scale;   // forward, f8e4m3 rows: (recv_rows, C / 128) f32 (the tail's: 1)
    Tensor filled;  // (1) i64: rows from here on are zero (set on the stream)
  };
  struct SiteBuffers {
    Tensor counts;               // (ep, 2 E_local) i64: per source, its rows per local expert, then where each starts in its xp
    Tensor in_fwd, in_bwd;       // (ep x slot, C): the sources' rows, slot s from source s (forward: Shape::wire)
    Tensor in_scale;             // f8e4m3 rows: (ep x slot, C / 128) f32, their scales
    Tensor back_fwd, back_bwd;   // (max_rows, C): this PE's rows back from the owners, in xp order
    Tensor signals;              // u64, one per Signal (expert_parallel.cpp)
    // With shadow slots:
    Tensor loads;                // (ep, E) i64: every source's rows per expert, this forward round
    Tensor shadow_w;             // (S, 3 F C): the shadowed experts' [w13; w2] from their owners
    std::array<Tensor, 2> grads; // (ep, S, 2 F C) / (ep, S, C F): the sources' parts of my shadowed experts
    Tensor window;               // (ep x E + 1 + S) i64, static: the loads since the last plan, rounds, the plan
    // Per signal, the sources of the non-blocking sends in flight: kept
    // until a later arrival proves the receivers applied them (the way
    // back's, or the next round's).
    std::array<std::shared_ptr<std::vector<Tensor>>, 9> sent;
    std::vector<Received> received_fwd, received_bwd;
    std::vector<std::pair<Tensor, Tensor>> group_weights;  // Dispatched::w13, w2 per micro-batch in flight
    uint64_t fwd_round = 0, bwd_round = 0;
    bool awaiting_combine = false;  // dispatched, not yet combined
    std::string failed;             // why a dispatch stopped part way (its exchange is incomplete)
  };
  struct Plan;
  SiteBuffers& buffers(Site site);
  // dispatch() once its checks passed (a failure part way marks the site failed).
  Dispatched dispatch_planned(const Tensor& xp, const Tensor& offsets, Site site, const Weights& weights,
                              const FirstGemm& first);
  Received free_received(SiteBuffers& b, bool forward);
  // Forward, with shadow slots: every source's counts to every PE, then the
  // plan into p.shadows (the same on every PE).
  void plan_shadows_on_stream(const Tensor& xp_offsets, const Plan& p);
  // This PE's experts' weights, then the shadows' (from their owners).
  std::pair<Tensor, Tensor> group_weights(const Weights& own, const Plan& p);
  void exchange_parts(const Tensor& parts, int weight, const Plan& p);
  // Source side: rows (xp order) to every owner's slot, then the owners
  // regroup what they received; returns this PE's received rows (forward:
  // in Shape::wire's form).
  // Forward: `weights` are this PE's experts' (a shadow's weights leave with the rows).
  // Forward, fused: `first` per source slot; its output regrouped into *first_out.
  Received to_owners(const Tensor& xp, const Plan& plan, bool forward, const Weights& weights,
                     const FirstGemm* first = nullptr, Tensor* first_out = nullptr);
  // Owner side: rows of this PE's experts to their sources' return buffers;
  // returns this PE's rows back in xp order.
  // Forward, fused: `gemm` writes `rows` expert by expert before each one's runs leave.
  Tensor to_sources(const Tensor& rows, const Plan& plan, bool forward, const GroupsGemm* gemm = nullptr);

  Group ep_;
  Shape shape_;
  int local_ = 0;
  int shadows_ = 0;        // shadow slots per site
  int64_t slot_rows_ = 0;  // rows of one source's slot in a receive buffer
  int64_t recv_rows_ = 0;
  std::map<std::pair<int, int>, SiteBuffers> sites_;
};

}  // namespace coremesh::parallel
