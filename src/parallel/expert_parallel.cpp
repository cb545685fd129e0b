#include "coremesh/parallel/expert_parallel.hpp"

#include <algorithm>
#include <cstring>

#include "coremesh/core/error.hpp"
#include "coremesh/shmem/rma.hpp"
#include "coremesh/shmem/session.hpp"
#include "coremesh/shmem/stream_ops.hpp"

namespace coremesh::parallel {
namespace {

enum Signal { kSendFwd = 0, kRetFwd = 1, kSendBwd = 2, kRetBwd = 3, kSignals = 4 };

// Rows [row, row + n) of an (rows, C) f32 tensor.
float* rows_at(const Tensor& t, int64_t row) { return t.data<float>() + row * t.size(1); }

void copy_rows(const Tensor& to, int64_t to_row, const Tensor& from, int64_t from_row, int64_t n) {
  if (n > 0) std::memcpy(rows_at(to, to_row), rows_at(from, from_row), size_t(n * to.size(1)) * sizeof(float));
}

// Zeroes the rows [from, to) of `t`.
void zero_rows(const Tensor& t, int64_t from, int64_t to) {
  if (to > from) std::memset(rows_at(t, from), 0, size_t((to - from) * t.size(1)) * sizeof(float));
}
void zero_from(const Tensor& t, int64_t row) { zero_rows(t, row, t.size(0)); }

// Sum of M[i] for i in [from, to).
int64_t sum(const int64_t* M, int64_t from, int64_t to) {
  int64_t n = 0;
  for (int64_t i = from; i < to; ++i) n += M[i];
  return n;
}

// Where owner d's grouped rows of (its local expert e, source s) start, from
// the count matrix M (g x E; El experts per member): grouped by local expert,
// then by source.
int64_t owner_row(const int64_t* M, int g, int E, int El, int d, int e, int s) {
  int64_t at = 0;
  for (int j = 0; j < g; ++j) at += sum(M + int64_t(j) * E, d * El, d * El + e);
  for (int j = 0; j < s; ++j) at += M[int64_t(j) * E + d * El + e];
  return at;
}

// One signal to every other member that this PE's rows are ready (after the
// puts before it). Member order starts after me, so that the members do not
// all signal the same PE first.
void signal_members(const Group& ep, uint64_t* sig) {
  shmem::fence();
  for (int k = 1; k < ep.size(); ++k) shmem::atomic_add(sig, uint64_t{1}, ep.pes[size_t((ep.me + k) % ep.size())]);
}

// n floats of PE pe's symmetric `src` into `dst`: a plain copy where the
// peer's heap is mapped here (same host), else a get that the caller's
// quiet completes. (The shm path's non-blocking get runs on a copy thread,
// which on a PE with one core only adds a hand-over.)
void read_rows(float* dst, const float* src, int64_t n, int pe) {
  if (const float* mapped = shmem::peer_ptr(src, pe)) std::memcpy(dst, mapped, size_t(n) * sizeof(float));
  else shmem::get_nbi(dst, src, size_t(n), pe);
}

// The rows into the head of `buffer`, unless they were built there.
void stage(runtime::Stream& stream, const Tensor& rows, const Tensor& buffer) {
  if (rows.data<float>() == buffer.data<float>()) return;
  stream.launch(launch_info("ep_stage", runtime::KernelKind::vector, 1, {rows}, {buffer}),
                [rows, buffer](const runtime::BlockContext&) { copy_rows(buffer, 0, rows, 0, rows.size(0)); });
}

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

namespace {
// Rows per source in an owner's receive buffer.
int64_t slot_rows(int local, const ShmemExperts::Shape& s) {
  return std::max<int64_t>(1, s.capacity >= 0 ? std::min(s.max_rows, local * s.capacity) : s.max_rows);
}
}  // namespace

int64_t ShmemExperts::symmetric_bytes(int ep, const Shape& s) {
  const int64_t recv = int64_t(ep) * slot_rows(s.experts / ep, s);
  const int64_t per_layer = 8 * int64_t(ep) * s.experts + 4 * s.width * (2 * s.max_rows + 2 * recv) + 8 * kSignals;
  return int64_t(s.layers.size()) * (per_layer + 5 * 128);  // + the heap's alignment per block
}

ShmemExperts::ShmemExperts(Group ep, const Shape& s) : ep_(std::move(ep)), shape_(s) {
  const int g = ep_.size();
  CM_CHECK(s.experts > 0 && s.experts % g == 0, "choose ep among the divisors of the routed experts",
           "{} routed experts do not split over {} expert-parallel PEs", s.experts, g);
  CM_CHECK(s.width > 0 && s.max_rows > 0, "give the buffers a width and a row count", "ShmemExperts shape");
  local_ = s.experts / g;
  slot_rows_ = slot_rows(local_, s);
  recv_rows_ = int64_t(g) * slot_rows_;
  for (int l : s.layers) {  // the same order on every PE: the allocations are collective
    Layer& L = layers_[l];
    L.counts = symmetric_tensor({g, s.experts}, DType::i64);
    L.send_fwd = symmetric_tensor({s.max_rows, s.width});
    L.send_bwd = symmetric_tensor({s.max_rows, s.width});
    L.ret_fwd = symmetric_tensor({recv_rows_, s.width});
    L.ret_bwd = symmetric_tensor({recv_rows_, s.width});
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
  // The owners' receive buffers are free again once this PE has its rows of
  // the previous round back (combine): the peers' sends of this round wait
  // for nothing else.
  CM_CHECK(!L.awaiting_combine, "combine each dispatch of a layer before dispatching the layer again",
           "dispatch of MoE layer {} while its previous dispatch was not combined", index);
  L.awaiting_combine = true;
  auto plan = std::make_shared<Plan>();
  plan->layer = index, plan->rows = xp.size(0);
  plan->matrix = Tensor::empty({g, E}, DType::i64);
  plan->offsets = Tensor::empty({El + 1}, DType::i64);
  plan->source_offsets = Tensor::empty({int64_t(El) * g + 1}, DType::i64);
  plan->fwd_round = ++L.fwd_round;
  Dispatched d;
  d.sources = g;
  d.offsets = plan->offsets;
  d.source_offsets = plan->source_offsets;
  d.rows = to_owners(xp, *plan, &Layer::send_fwd, kSendFwd, plan->fwd_round, offsets);
  d.plan = plan;
  return d;
}

Tensor ShmemExperts::to_owners(const Tensor& rows, const Plan& p, Tensor Layer::*send, int which, uint64_t round,
                               const Tensor& offsets) {
  const int g = ep_.size(), E = shape_.experts, El = local_;
  const bool forward = which == kSendFwd;  // the owners learn the counts with the signal
  Layer& L = layer(p.layer);
  runtime::Stream stream = runtime::current_stream();
  auto* sig = reinterpret_cast<uint64_t*>(L.signals.data<int64_t>()) + which;
  const Group ep = ep_;
  const Tensor matrix = p.matrix, buffer = (L.*send).slice(0, 0, rows.size(0)), counts = L.counts;
  const int64_t slot = slot_rows_;
  stage(stream, rows, buffer);
  // To every other member: forward, my count row (from the offsets, also
  // into row `me` of the plan's matrix); then the signal that my rows are
  // ready to be read.
  std::vector<Tensor> reads{buffer};
  if (forward) reads.push_back(offsets);
  stream.launch(launch_info("ep_rows_ready", runtime::KernelKind::comm, 1, reads, {matrix, counts}),
                [ep, matrix, counts, offsets, sig, forward, g, E](const runtime::BlockContext&) {
                  int64_t* mine = matrix.data<int64_t>() + int64_t(ep.me) * E;
                  if (forward)
                    for (int e = 0; e < E; ++e) mine[e] = offsets.data<int64_t>()[e + 1] - offsets.data<int64_t>()[e];
                  if (forward)
                    for (int k = 1; k < g; ++k)
                      shmem::put(counts.data<int64_t>() + int64_t(ep.me) * E, mine, size_t(E), ep.pes[size_t((ep.me + k) % g)]);
                  signal_members(ep, sig);
                });
  shmem::signal_wait_on_stream(stream, sig, shmem::Cmp::ge, uint64_t(g - 1),
                               fmt::format("waits for {} to have their rows for its experts ready (MoE layer {}, {} {})",
                                           others(ep_), p.layer, forward ? "dispatch" : "combine backward", round));
  // The rows of my experts, grouped by local expert and source, read from
  // the sources' send buffers (mine from my own). Forward: the plan from the
  // counts first. It takes the signals it waited for (as
  // wait_signal_on_stream does, without a kernel of its own).
  const Received received = free_received(L, forward);
  const Tensor out = received.rows, filled = received.filled;
  const Tensor local_off = p.offsets, source_off = p.source_offsets;
  std::vector<Tensor> writes{out, filled};
  if (forward) writes.insert(writes.end(), {matrix, local_off, source_off});
  stream.launch(launch_info("ep_gather", runtime::KernelKind::comm, 1, {counts, matrix, local_off, source_off, buffer},
                            writes),
                [ep, sig, counts, matrix, local_off, source_off, buffer, out, filled, forward, slot, g, E, El](
                    const runtime::BlockContext&) {
                  const int me = ep.me;
                  if (g > 1) shmem::atomic_add(sig, uint64_t(0) - uint64_t(g - 1), ep.pes[size_t(me)]);
                  int64_t* M = matrix.data<int64_t>();
                  int64_t* lo = local_off.data<int64_t>();
                  int64_t* so = source_off.data<int64_t>();
                  if (forward) {
                    for (int s = 0; s < g; ++s)
                      if (s != me)
                        std::memcpy(M + int64_t(s) * E, counts.data<int64_t>() + int64_t(s) * E, sizeof(int64_t) * size_t(E));
                    int64_t at = 0;
                    for (int e = 0; e < El; ++e) {
                      lo[e] = at;
                      for (int s = 0; s < g; ++s) so[e * g + s] = at, at += M[int64_t(s) * E + me * El + e];
                    }
                    lo[El] = so[int64_t(El) * g] = at;
                  }
                  for (int s = 0; s < g; ++s) {
                    const int64_t n = sum(M + int64_t(s) * E, me * El, (me + 1) * El);
                    CM_CHECK(n <= slot, "raise the expert capacity the buffers were sized for, or lower the batch",
                             "PE {} sends {} rows to the experts of PE {}, who take {} per source", ep.pes[size_t(s)],
                             n, ep.pes[size_t(me)], slot);
                  }
                  for (int e = 0; e < El; ++e)
                    for (int s = 0; s < g; ++s) {
                      const int64_t* row = M + int64_t(s) * E;
                      const int64_t n = row[me * El + e], from = sum(row, 0, me * El + e);
                      if (s == me) copy_rows(out, so[e * g + s], buffer, from, n);
                      else if (n > 0)
                        read_rows(rows_at(out, so[e * g + s]), rows_at(buffer, from), n * out.size(1), ep.pes[size_t(s)]);
                    }
                  int64_t& rows_filled = *filled.data<int64_t>();  // the tail past it is zero
                  zero_rows(out, lo[El], rows_filled);
                  rows_filled = lo[El];
                  shmem::quiet();
                });
  return out;
}

Tensor ShmemExperts::to_sources(const Tensor& rows, const Plan& p, Tensor Layer::*ret, int which, uint64_t round) {
  const int g = ep_.size(), E = shape_.experts, El = local_;
  Layer& L = layer(p.layer);
  runtime::Stream stream = runtime::current_stream();
  auto* sig = reinterpret_cast<uint64_t*>(L.signals.data<int64_t>()) + which;
  const Group ep = ep_;
  const Tensor matrix = p.matrix, buffer = (L.*ret).slice(0, 0, rows.size(0)), source_off = p.source_offsets;
  stage(stream, rows, buffer);
  // The signal that my experts' rows are ready; then my rows of my own
  // experts into xp order (and the dropped rows' tail zeroed) while the
  // others' signals are on their way.
  Tensor out = Tensor::empty({p.rows, shape_.width});
  stream.launch(launch_info("ep_rows_ready", runtime::KernelKind::comm, 1, {buffer, matrix, source_off}, {out}),
                [ep, sig, buffer, out, matrix, source_off, g, E, El](const runtime::BlockContext&) {
                  signal_members(ep, sig);
                  const int me = ep.me;
                  const int64_t* row = matrix.data<int64_t>() + int64_t(me) * E;
                  const int64_t* so = source_off.data<int64_t>();
                  int64_t at = sum(row, 0, me * El);
                  for (int e = 0; e < El; ++e)
                    copy_rows(out, at, buffer, so[e * g + me], row[me * El + e]), at += row[me * El + e];
                  zero_from(out, sum(row, 0, E));
                });
  if (g == 1) return out;
  shmem::signal_wait_on_stream(stream, sig, shmem::Cmp::ge, uint64_t(g - 1),
                               fmt::format("waits for {} to have its rows back from their experts ready (MoE layer {}, {} {})",
                                           others(ep_), p.layer, which == kRetFwd ? "combine" : "dispatch backward", round));
  // The others' experts' rows, read out of their return buffers (where owner
  // d holds them grouped by its local expert, then by source). It takes the
  // signals it waited for.
  stream.launch(launch_info("ep_gather", runtime::KernelKind::comm, 1, {buffer, matrix}, {out}),
                [ep, sig, buffer, out, matrix, g, E, El](const runtime::BlockContext&) {
                  const int me = ep.me;
                  shmem::atomic_add(sig, uint64_t(0) - uint64_t(g - 1), ep.pes[size_t(me)]);
                  const int64_t* M = matrix.data<int64_t>();
                  const int64_t* row = M + int64_t(me) * E;
                  for (int d = 0; d < g; ++d) {
                    if (d == me) continue;
                    int64_t at = sum(row, 0, d * El);
                    for (int e = 0; e < El; ++e) {
                      const int64_t n = row[d * El + e];
                      if (n > 0)
                        read_rows(rows_at(out, at), rows_at(buffer, owner_row(M, g, E, El, d, e, me)), n * out.size(1),
                                  ep.pes[size_t(d)]);
                      at += n;
                    }
                  }
                  shmem::quiet();
                });
  return out;
}

// A received-rows tensor no one holds any more (not the model's saved
// activations, not a queued kernel), or a new one: the tail past its fill
// level is zero, so the next exchange zeroes only what the last one wrote
// beyond its own rows. One per micro-batch in flight, reused after that.
ShmemExperts::Received ShmemExperts::free_received(Layer& L, bool forward) {
  std::vector<Received>& pool = forward ? L.received_fwd : L.received_bwd;
  for (const Received& r : pool)
    if (r.rows.storage().use_count() == 1 && r.filled.storage().use_count() == 1) return r;
  pool.push_back({Tensor::zeros({recv_rows_, shape_.width}), Tensor::zeros({1}, DType::i64)});
  return pool.back();
}

Tensor ShmemExperts::send_buffer(int index, Exchange which, int64_t rows, int64_t width) {
  Layer& L = layer(index);
  const Tensor* buffers[] = {&L.send_fwd, &L.ret_fwd, &L.send_bwd, &L.ret_bwd};
  const Tensor& buffer = *buffers[int(which)];
  // A forward buffer still being read (a dispatch not yet combined: refused
  // by dispatch with the fix), or rows that do not fit: a tensor of their own.
  const bool busy = L.awaiting_combine && which == Exchange::dispatch;
  if (busy || rows > buffer.size(0) || width != buffer.size(1))
    return ExpertDispatcher::send_buffer(index, which, rows, width);
  return buffer.slice(0, 0, rows);
}

Tensor ShmemExperts::combine(const Tensor& y, const Dispatched& d) {
  const Plan& p = *static_cast<const Plan*>(d.plan.get());
  layer(p.layer).awaiting_combine = false;
  return to_sources(y, p, &Layer::ret_fwd, kRetFwd, p.fwd_round);
}

Tensor ShmemExperts::combine_backward(const Tensor& dy, const Dispatched& d) {
  const Plan& p = *static_cast<const Plan*>(d.plan.get());
  p.bwd_round = ++layer(p.layer).bwd_round;
  return to_owners(dy, p, &Layer::send_bwd, kSendBwd, p.bwd_round);
}

Tensor ShmemExperts::dispatch_backward(const Tensor& drows, const Dispatched& d) {
  const Plan& p = *static_cast<const Plan*>(d.plan.get());
  CM_CHECK(p.bwd_round > 0, "run combine_backward before dispatch_backward", "dispatch_backward of layer {}",
           p.layer);
  return to_sources(drows, p, &Layer::ret_bwd, kRetBwd, p.bwd_round);
}

}  // namespace coremesh::parallel
