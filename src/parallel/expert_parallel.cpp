#include "coremesh/parallel/expert_parallel.hpp"

#include <algorithm>
#include <cstring>

#include "coremesh/core/error.hpp"
#include "coremesh/shmem/rma.hpp"
#include "coremesh/shmem/session.hpp"
#include "coremesh/shmem/stream_ops.hpp"

namespace coremesh::parallel {
namespace {

enum Signal { kCounts = 0, kRecvFwd = 1, kBackFwd = 2, kRecvBwd = 3, kBackBwd = 4, kSignals = 5 };


// Rows [row, row + n) of an (rows, C) f32 tensor.
float* rows_at(const Tensor& t, int64_t row) { return t.data<float>() + row * t.size(1); }

}  // namespace

// What combine and the backward reuse: the count matrix of the exchange
// (filled on the stream) and the group lists derived from it.
struct ShmemExperts::Plan {
  int layer = 0;
  int64_t rows = 0;       // rows of the source's xp
  uint64_t fwd_round = 0;  // of this exchange's buffers' signals
  mutable uint64_t bwd_round = 0;
  Tensor matrix;          // (ep, E) i64: rows source s sends to global expert e
  Tensor offsets;         // (E_local + 1) i64 of the received rows
  Tensor source_offsets;  // (E_local * ep + 1) i64
};

int64_t ShmemExperts::symmetric_bytes(int ep, const Shape& s) {
  const int64_t local = s.experts / ep;
  int64_t recv = int64_t(ep) * s.max_rows;
  if (s.capacity >= 0) recv = std::min(recv, int64_t(ep) * local * s.capacity);
  const int64_t per_layer = 8 * int64_t(ep) * s.experts + 4 * s.width * (2 * recv + 2 * s.max_rows) + 8 * kSignals;
  return int64_t(s.layers.size()) * (per_layer + 5 * 128);  // + the heap's alignment per block
}

ShmemExperts::ShmemExperts(Group ep, const Shape& s) : ep_(std::move(ep)), shape_(s) {
  const int g = ep_.size();
  CM_CHECK(s.experts > 0 && s.experts % g == 0, "choose ep among the divisors of the routed experts",
           "{} routed experts do not split over {} expert-parallel PEs", s.experts, g);
  CM_CHECK(s.width > 0 && s.max_rows > 0, "give the buffers a width and a row count", "ShmemExperts shape");
  local_ = s.experts / g;
  recv_rows_ = int64_t(g) * s.max_rows;
  if (s.capacity >= 0) recv_rows_ = std::min(recv_rows_, int64_t(g) * local_ * s.capacity);
  recv_rows_ = std::max<int64_t>(recv_rows_, 1);
  for (int l : s.layers) {  // the same order on every PE: the allocations are collective
    Layer& L = layers_[l];
    L.counts = symmetric_tensor({g, s.experts}, DType::i64);
    L.recv_fwd = symmetric_tensor({recv_rows_, s.width});
    L.recv_bwd = symmetric_tensor({recv_rows_, s.width});
    L.back_fwd = symmetric_tensor({s.max_rows, s.width});
    L.back_bwd = symmetric_tensor({s.max_rows, s.width});
    L.signals = symmetric_tensor({kSignals}, DType::i64);
  }
}

ShmemExperts::Layer& ShmemExperts::layer(int index) {
  auto it = layers_.find(index);
  CM_CHECK(it != layers_.end(), "list every MoE layer in ShmemExperts::Shape::layers", "no buffers for layer {}",
           index);
  return it->second;
}

ExpertDispatcher::Dispatched ShmemExperts::dispatch(const Tensor& xp, const Tensor& offsets, int index) {
  const int g = ep_.size(), E = shape_.experts, El = local_;
  Layer& L = layer(index);
  CM_CHECK(xp.dim() == 2 && xp.size(1) == shape_.width && xp.size(0) <= shape_.max_rows && offsets.numel() == E + 1,
           "size the expert-parallel buffers for the largest micro-batch (batch_size x seq_len x top_k rows)",
           "dispatch of {} rows of width {}; the buffers take {} rows of width {}", xp.size(0), xp.size(1),
           shape_.max_rows, shape_.width);
  auto plan = std::make_shared<Plan>();
  plan->layer = index, plan->rows = xp.size(0);
  plan->matrix = Tensor::empty({g, E}, DType::i64);
  plan->offsets = Tensor::empty({El + 1}, DType::i64);
  plan->source_offsets = Tensor::empty({int64_t(El) * g + 1}, DType::i64);
  const uint64_t round = plan->fwd_round = ++L.fwd_round;
  runtime::Stream stream = runtime::current_stream();
  auto* sig = reinterpret_cast<uint64_t*>(L.signals.data<int64_t>());
  // 1. my row counts per expert -> row `me` of every member's count matrix
  const Group ep = ep_;
  const Tensor counts = L.counts;
  stream.launch(launch_info("ep_counts", runtime::KernelKind::comm, 1, {offsets}, {counts}), [ep, offsets, counts, sig, E](const runtime::BlockContext&) {
    std::vector<int64_t> mine(static_cast<size_t>(E));
    const int64_t* off = offsets.data<int64_t>();
    for (int e = 0; e < E; ++e) mine[size_t(e)] = off[e + 1] - off[e];
    int64_t* row = counts.data<int64_t>() + int64_t(ep.me) * E;
    for (int pe : ep.pes) {
      shmem::put(row, mine.data(), size_t(E), pe);
      shmem::fence();
      shmem::atomic_add(sig + kCounts, uint64_t{1}, pe);
    }
  });
  wait_signal_on_stream(stream, sig + kCounts, uint64_t(g),
                        fmt::format("waits for the row counts of {} (MoE layer {}, dispatch {})", others(ep_), index,
                                    round));
  // 2. the plan: a copy of the matrix and the group lists of the rows I receive
  const Plan& p = *plan;
  const Tensor matrix = p.matrix, local_off = p.offsets, source_off = p.source_offsets;
  const int me = ep_.me;
  stream.launch(launch_info("ep_plan", runtime::KernelKind::vector, 1, {counts}, {matrix, local_off, source_off}),
                [counts, matrix, local_off, source_off, g, E, El, me](const runtime::BlockContext&) {
                  std::memcpy(matrix.raw_data(), counts.raw_data(), matrix.nbytes());
                  const int64_t* M = matrix.data<int64_t>();
                  int64_t* lo = local_off.data<int64_t>();
                  int64_t* so = source_off.data<int64_t>();
                  int64_t at = 0;
                  for (int e = 0; e < El; ++e) {
                    lo[e] = at;
                    for (int s = 0; s < g; ++s) {
                      so[e * g + s] = at;
                      at += M[int64_t(s) * E + me * El + e];
                    }
                  }
                  lo[El] = so[int64_t(El) * g] = at;
                });
  Dispatched d;
  d.sources = g;
  d.offsets = p.offsets;
  d.source_offsets = p.source_offsets;
  d.rows = to_owners(xp, p, &Layer::recv_fwd, kRecvFwd, round);
  d.plan = plan;
  return d;
}

Tensor ShmemExperts::to_owners(const Tensor& rows, const Plan& p, Tensor Layer::*recv, int which, uint64_t round) {
  const int g = ep_.size(), E = shape_.experts, El = local_;
  Layer& L = layer(p.layer);
  runtime::Stream stream = runtime::current_stream();
  auto* sig = reinterpret_cast<uint64_t*>(L.signals.data<int64_t>()) + which;
  const Group ep = ep_;
  const Tensor matrix = p.matrix, buffer = L.*recv;
  const int64_t C = shape_.width;
  // my rows of each destination's expert e -> its buffer after the rows of
  // (e, earlier sources) and of (earlier experts, every source)
  stream.launch(launch_info("ep_to_owners", runtime::KernelKind::comm, 1, {matrix, rows}, {buffer}), [ep, matrix, rows, buffer, sig, g, E, El, C](const runtime::BlockContext&) {
    const int64_t* M = matrix.data<int64_t>();
    int64_t src = 0;  // my rows are grouped by global expert, destinations in order
    for (int d = 0; d < g; ++d) {
      int64_t at = 0;
      for (int e = 0; e < El; ++e) {
        const int global = d * El + e;
        for (int s = 0; s < ep.me; ++s) at += M[int64_t(s) * E + global];
        const int64_t n = M[int64_t(ep.me) * E + global];
        if (n > 0) shmem::put(rows_at(buffer, at), rows_at(rows, src), size_t(n * C), ep.pes[size_t(d)]);
        src += n;
        for (int s = ep.me; s < g; ++s) at += M[int64_t(s) * E + global];
      }
      shmem::fence();
      shmem::atomic_add(sig, uint64_t{1}, ep.pes[size_t(d)]);
    }
  });
  wait_signal_on_stream(stream, sig, uint64_t(g),
                        fmt::format("waits for the rows {} send to its experts (MoE layer {}, {} {})", others(ep_),
                                    p.layer, which == kRecvFwd ? "dispatch" : "combine backward", round));
  // the received rows out of the buffer (it is reused by the next round)
  Tensor out = Tensor::empty({recv_rows_, C});
  const Tensor total = p.offsets;
  stream.launch(launch_info("ep_receive", runtime::KernelKind::vector, 1, {buffer, total}, {out}), [buffer, out, total, El, C](const runtime::BlockContext&) {
    const int64_t n = total.data<int64_t>()[El];
    std::memcpy(out.raw_data(), buffer.raw_data(), size_t(n * C) * sizeof(float));
    std::memset(rows_at(out, n), 0, size_t((out.size(0) - n) * C) * sizeof(float));
  });
  return out;
}

Tensor ShmemExperts::to_sources(const Tensor& rows, const Plan& p, Tensor Layer::*back, int which, uint64_t round) {
  const int g = ep_.size(), E = shape_.experts, El = local_;
  Layer& L = layer(p.layer);
  runtime::Stream stream = runtime::current_stream();
  auto* sig = reinterpret_cast<uint64_t*>(L.signals.data<int64_t>()) + which;
  const Group ep = ep_;
  const Tensor matrix = p.matrix, buffer = L.*back, source_off = p.source_offsets;
  const int64_t C = shape_.width;
  // rows of (my expert e, source s) -> source s's buffer where its rows of
  // global expert (me, e) were
  stream.launch(launch_info("ep_to_sources", runtime::KernelKind::comm, 1, {matrix, rows, source_off}, {buffer}), [ep, matrix, rows, buffer, source_off, sig, g, E, El, C](const runtime::BlockContext&) {
    const int64_t* M = matrix.data<int64_t>();
    const int64_t* so = source_off.data<int64_t>();
    for (int s = 0; s < g; ++s) {
      const int64_t* row = M + int64_t(s) * E;
      int64_t at = 0;
      for (int j = 0; j < ep.me * El; ++j) at += row[j];
      for (int e = 0; e < El; ++e) {
        const int64_t n = row[ep.me * El + e];
        if (n > 0) shmem::put(rows_at(buffer, at), rows_at(rows, so[e * g + s]), size_t(n * C), ep.pes[size_t(s)]);
        at += n;
      }
      shmem::fence();
      shmem::atomic_add(sig, uint64_t{1}, ep.pes[size_t(s)]);
    }
  });
  wait_signal_on_stream(stream, sig, uint64_t(g),
                        fmt::format("waits for its rows back from the experts of {} (MoE layer {}, {} {})",
                                    others(ep_), p.layer, which == kBackFwd ? "combine" : "dispatch backward", round));
  Tensor out = Tensor::empty({p.rows, C});
  const int me = ep_.me;
  stream.launch(launch_info("ep_return", runtime::KernelKind::vector, 1, {buffer, matrix}, {out}), [buffer, out, matrix, me, E, C](const runtime::BlockContext&) {
    int64_t n = 0;
    for (int j = 0; j < E; ++j) n += matrix.data<int64_t>()[int64_t(me) * E + j];
    std::memcpy(out.raw_data(), buffer.raw_data(), size_t(n * C) * sizeof(float));
    std::memset(rows_at(out, n), 0, size_t((out.size(0) - n) * C) * sizeof(float));
  });
  return out;
}

Tensor ShmemExperts::combine(const Tensor& y, const Dispatched& d) {
  const Plan& p = *static_cast<const Plan*>(d.plan.get());
  return to_sources(y, p, &Layer::back_fwd, kBackFwd, p.fwd_round);
}

Tensor ShmemExperts::combine_backward(const Tensor& dy, const Dispatched& d) {
  const Plan& p = *static_cast<const Plan*>(d.plan.get());
  p.bwd_round = ++layer(p.layer).bwd_round;
  return to_owners(dy, p, &Layer::recv_bwd, kRecvBwd, p.bwd_round);
}

Tensor ShmemExperts::dispatch_backward(const Tensor& drows, const Dispatched& d) {
  const Plan& p = *static_cast<const Plan*>(d.plan.get());
  CM_CHECK(p.bwd_round > 0, "run combine_backward before dispatch_backward", "dispatch_backward of layer {}",
           p.layer);
  return to_sources(drows, p, &Layer::back_bwd, kBackBwd, p.bwd_round);
}

}  // namespace coremesh::parallel
