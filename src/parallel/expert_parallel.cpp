#include "coremesh/parallel/expert_parallel.hpp"

#include <algorithm>
#include <cstring>

#include "coremesh/core/error.hpp"
#include "coremesh/shmem/rma.hpp"
#include "coremesh/shmem/session.hpp"
#include "coremesh/shmem/stream_ops.hpp"

namespace coremesh::parallel {
namespace {

enum Signal { kInFwd = 0, kBackFwd = 1, kInBwd = 2, kBackBwd = 3, kSignals = 4 };

// Rows [row, row + n) of an (rows, C) f32 tensor.
float* rows_at(const Tensor& t, int64_t row) { return t.data<float>() + row * t.size(1); }

void copy_rows(const Tensor& to, int64_t to_row, const Tensor& from, int64_t from_row, int64_t n) {
  if (n > 0) std::memcpy(rows_at(to, to_row), rows_at(from, from_row), size_t(n * to.size(1)) * sizeof(float));
}

// Zeroes the rows [from, to) of `t`.
void zero_rows(const Tensor& t, int64_t from, int64_t to) {
  if (to > from) std::memset(rows_at(t, from), 0, size_t((to - from) * t.size(1)) * sizeof(float));
}

// Blocks for `items` independent pieces of a copy: as many as the stream's
// vector-core limit allows (one-sided communication runs on vector cores).
int comm_blocks(const runtime::Stream& stream, int64_t items) {
  const int limit = runtime::max_blocks(stream.effective_limits(), runtime::KernelKind::comm);
  return int(std::clamp<int64_t>(items, 1, limit));
}

// The members block `ctx` serves, starting after me so that the members do
// not all send to the same PE first; me last.
template <typename F>
void for_members(const Group& ep, const runtime::BlockContext& ctx, F&& f) {
  const int g = ep.size();
  for (int k = ctx.block_idx; k < g; k += ctx.block_dim) f((ep.me + 1 + k) % g);
}

// One sender's pieces to one receiver in one exchange add up to kSent on the
// receiver's signal, so a receiver that sees ep x kSent has every piece.
constexpr uint64_t kSent = uint64_t{1} << 32;
// A piece is one message on the network path: a non-blocking put of it does
// not hold the sending core for the transfer.
constexpr size_t kPieceBytes = size_t{64} << 10;

// Sends to one PE: non-blocking puts in pieces, each with its own signal add
// (put-with-signal: the add lands after the piece's data), then the rest of
// kSent. The sources must stay untouched until the transfer is done
// (ShmemExperts keeps them to the site's next exchange of the same kind).
class Sender {
 public:
  Sender(uint64_t* sig, int pe) : sig_(sig), pe_(pe) {}
  template <typename T>
  void put(T* dest, const T* src, size_t count) {
    auto* to = reinterpret_cast<std::byte*>(dest);
    const auto* from = reinterpret_cast<const std::byte*>(src);
    for (size_t at = 0, bytes = count * sizeof(T); at < bytes; at += kPieceBytes, --left_)
      shmem::detail::put_signal_bytes(to + at, from + at, std::min(kPieceBytes, bytes - at), sig_, 1,
                                      shmem::SignalOp::add, pe_, /*nbi=*/true);
  }
  void finish() { shmem::detail::put_signal_bytes(sig_, nullptr, 0, sig_, left_, shmem::SignalOp::add, pe_, true); }

 private:
  uint64_t* sig_;
  int pe_;
  uint64_t left_ = kSent;
};

}  // namespace

// What combine and the backward reuse. Source side: the xp offsets. Owner
// side: the counts of the exchange (copied on the stream) and the group
// lists derived from them.
struct ShmemExperts::Plan {
  Site site;
  int64_t rows = 0;        // rows of the source's xp
  uint64_t fwd_round = 0;  // of this site's forward exchanges
  mutable uint64_t bwd_round = 0;
  Tensor xp_offsets;       // (E + 1) i64: the source's xp grouped by global expert
  Tensor counts;           // (ep, E_local + 1) i64: per source, rows per local expert and its xp start
  Tensor offsets;          // (E_local + 1) i64 of the received rows
  Tensor source_offsets;   // (E_local * ep + 1) i64
};

namespace {
// Rows per source in an owner's receive buffer.
int64_t slot_rows(int local, const ShmemExperts::Shape& s) {
  return std::max<int64_t>(1, s.capacity >= 0 ? std::min(s.max_rows, local * s.capacity) : s.max_rows);
}
}  // namespace

int64_t ShmemExperts::symmetric_bytes(int ep, const Shape& s) {
  const int local = s.experts / ep;
  const int64_t recv = int64_t(ep) * slot_rows(local, s);
  const int64_t per_site = 8 * int64_t(ep) * (local + 1) + 4 * s.width * (2 * recv + 2 * s.max_rows) + 8 * kSignals;
  return int64_t(s.layers.size()) * s.slices * (per_site + 6 * 128);  // + the heap's alignment per block
}

ShmemExperts::ShmemExperts(Group ep, const Shape& s) : ep_(std::move(ep)), shape_(s) {
  const int g = ep_.size();
  CM_CHECK(s.experts > 0 && s.experts % g == 0, "choose ep among the divisors of the routed experts",
           "{} routed experts do not split over {} expert-parallel PEs", s.experts, g);
  CM_CHECK(s.width > 0 && s.max_rows > 0 && s.slices > 0, "give the buffers a width, a row count and a slice",
           "ShmemExperts shape");
  local_ = s.experts / g;
  slot_rows_ = slot_rows(local_, s);
  recv_rows_ = int64_t(g) * slot_rows_;
  for (int l : s.layers)  // the same order on every PE: the allocations are collective
    for (int slice = 0; slice < s.slices; ++slice) {
      SiteBuffers& b = sites_[{l, slice}];
      b.counts = symmetric_tensor({g, local_ + 1}, DType::i64);
      b.in_fwd = symmetric_tensor({recv_rows_, s.width});
      b.in_bwd = symmetric_tensor({recv_rows_, s.width});
      b.back_fwd = symmetric_tensor({s.max_rows, s.width});
      b.back_bwd = symmetric_tensor({s.max_rows, s.width});
      b.signals = symmetric_tensor({kSignals}, DType::i64);
      for (auto& sent : b.sent) sent = std::make_shared<std::vector<Tensor>>();
    }
}

ShmemExperts::SiteBuffers& ShmemExperts::buffers(Site site) {
  auto it = sites_.find({site.layer, site.slice});
  CM_CHECK(it != sites_.end(), "list every MoE layer in ShmemExperts::Shape::layers and give it moe_replicas slices",
           "no buffers for MoE layer {} slice {}", site.layer, site.slice);
  return it->second;
}

ExpertDispatcher::Dispatched ShmemExperts::dispatch(const Tensor& xp, const Tensor& offsets, Site site) {
  const int g = ep_.size(), E = shape_.experts, El = local_;
  SiteBuffers& b = buffers(site);
  CM_CHECK(xp.dim() == 2 && xp.size(1) == shape_.width && xp.size(0) <= shape_.max_rows && offsets.numel() == E + 1,
           "size the expert-parallel buffers for the largest micro-batch slice (tokens / moe_replicas x top_k rows)",
           "dispatch of {} rows of width {}; the buffers take {} rows of width {}", xp.size(0), xp.size(1),
           shape_.max_rows, shape_.width);
  CM_CHECK(!b.awaiting_combine, "combine each dispatch of a layer before dispatching the layer again",
           "dispatch of MoE layer {} slice {} while its previous dispatch was not combined", site.layer, site.slice);
  b.awaiting_combine = true;
  auto plan = std::make_shared<Plan>();
  plan->site = site, plan->rows = xp.size(0), plan->xp_offsets = offsets;
  plan->counts = Tensor::empty({g, El + 1}, DType::i64);
  plan->offsets = Tensor::empty({El + 1}, DType::i64);
  plan->source_offsets = Tensor::empty({int64_t(El) * g + 1}, DType::i64);
  plan->fwd_round = ++b.fwd_round;
  Dispatched d;
  d.sources = g;
  d.offsets = plan->offsets;
  d.source_offsets = plan->source_offsets;
  d.rows = to_owners(xp, *plan, /*forward=*/true);
  d.plan = plan;
  return d;
}

Tensor ShmemExperts::to_owners(const Tensor& rows, const Plan& p, bool forward) {
  const int g = ep_.size(), El = local_;
  SiteBuffers& b = buffers(p.site);
  runtime::Stream stream = runtime::current_stream();
  auto* sig = reinterpret_cast<uint64_t*>(b.signals.data<int64_t>()) + (forward ? kInFwd : kInBwd);
  const Group ep = ep_;
  const Tensor in = forward ? b.in_fwd : b.in_bwd, counts = b.counts, xp_off = p.xp_offsets;
  const int64_t slot = slot_rows_;
  // To every owner (me included): forward, its experts' counts and where
  // they start in my xp; the rows, one run of xp, into my slot.
  const Tensor message = Tensor::empty({g, El + 1}, DType::i64);
  const std::shared_ptr<std::vector<Tensor>> sent = b.sent[forward ? kInFwd : kInBwd];
  stream.launch(launch_info("ep_send", runtime::KernelKind::comm, comm_blocks(stream, g), {rows, xp_off}, {message}),
                [ep, rows, in, counts, xp_off, message, sent, sig, forward, slot, El](const runtime::BlockContext& ctx) {
                  const int64_t* off = xp_off.data<int64_t>();
                  for_members(ep, ctx, [&](int d) {
                    const int pe = ep.pes[size_t(d)];
                    const int64_t from = off[d * El], n = off[(d + 1) * El] - from;
                    CM_CHECK(n <= slot, "raise the expert capacity the buffers were sized for, or lower the batch",
                             "PE {} sends {} rows to the experts of PE {}, who take {} per source", ep.pes[size_t(ep.me)],
                             n, pe, slot);
                    Sender send(sig, pe);
                    if (forward) {
                      int64_t* m = message.data<int64_t>() + int64_t(d) * (El + 1);
                      for (int e = 0; e < El; ++e) m[e] = off[d * El + e + 1] - off[d * El + e];
                      m[El] = from;
                      send.put(counts.data<int64_t>() + int64_t(ep.me) * (El + 1), m, size_t(El) + 1);
                    }
                    send.put(rows_at(in, ep.me * slot), rows_at(rows, from), size_t(n * rows.size(1)));
                    send.finish();
                  });
                  if (ctx.block_idx == 0) *sent = {rows, message};
                });
  shmem::signal_wait_on_stream(stream, sig, shmem::Cmp::ge, uint64_t(g) * kSent,
                               fmt::format("waits for {} to send the rows of its experts (MoE layer {} slice {}, {} {})",
                                           others(ep_), p.site.layer, p.site.slice,
                                           forward ? "dispatch" : "combine backward", forward ? p.fwd_round : p.bwd_round),
                               "ep_wait");
  // My slots regrouped by local expert, then source. Forward: the plan from
  // the counts first (every block derives it; block 0 keeps it). It takes
  // the signals it waited for.
  const Received received = free_received(b, forward);
  const Tensor out = received.rows, filled = received.filled;
  const Tensor plan_counts = p.counts, local_off = p.offsets, source_off = p.source_offsets;
  // Every source sent these after it had my rows of its previous round back:
  // my sends of that round are applied, their sources free.
  const std::shared_ptr<std::vector<Tensor>> delivered = b.sent[forward ? kBackFwd : kBackBwd];
  std::vector<Tensor> writes{out, filled};
  if (forward) writes.insert(writes.end(), {plan_counts, local_off, source_off});
  stream.launch(launch_info("ep_regroup", runtime::KernelKind::comm, comm_blocks(stream, int64_t(El) * g),
                            {in, counts, plan_counts}, writes),
                [ep, sig, in, counts, plan_counts, local_off, source_off, out, filled, delivered, forward, slot, g, El](
                    const runtime::BlockContext& ctx) {
                  const int64_t* M = (forward ? counts : plan_counts).data<int64_t>();  // (g, El + 1)
                  std::vector<int64_t> so(size_t(El) * g + 1);
                  int64_t at = 0;
                  for (int e = 0; e < El; ++e)
                    for (int s = 0; s < g; ++s) so[size_t(e * g + s)] = at, at += M[s * (El + 1) + e];
                  so.back() = at;
                  for (int64_t i = ctx.block_idx; i < int64_t(El) * g; i += ctx.block_dim) {
                    const int e = int(i / g), s = int(i % g);
                    int64_t from = s * slot;
                    for (int f = 0; f < e; ++f) from += M[s * (El + 1) + f];
                    copy_rows(out, so[size_t(i)], in, from, M[s * (El + 1) + e]);
                  }
                  if (ctx.block_idx != 0) return;
                  shmem::atomic_add(sig, uint64_t(0) - uint64_t(g) * kSent, ep.pes[size_t(ep.me)]);
                  delivered->clear();
                  if (forward) {
                    std::memcpy(plan_counts.data<int64_t>(), M, sizeof(int64_t) * size_t(g) * size_t(El + 1));
                    std::copy(so.begin(), so.end(), source_off.data<int64_t>());
                    for (int e = 0; e <= El; ++e) local_off.data<int64_t>()[e] = so[size_t(e * g)];
                  }
                  int64_t& rows_filled = *filled.data<int64_t>();  // the tail past it is zero
                  zero_rows(out, at, rows_filled);
                  rows_filled = at;
                });
  return out;
}

Tensor ShmemExperts::to_sources(const Tensor& rows, const Plan& p, bool forward) {
  const int g = ep_.size(), E = shape_.experts, El = local_;
  SiteBuffers& b = buffers(p.site);
  runtime::Stream stream = runtime::current_stream();
  auto* sig = reinterpret_cast<uint64_t*>(b.signals.data<int64_t>()) + (forward ? kBackFwd : kBackBwd);
  const Group ep = ep_;
  const Tensor back = forward ? b.back_fwd : b.back_bwd, counts = p.counts, source_off = p.source_offsets;
  // To every source (me included): each run of its rows, one per local
  // expert, to where it goes in the source's xp.
  const std::shared_ptr<std::vector<Tensor>> sent = b.sent[forward ? kBackFwd : kBackBwd];
  stream.launch(launch_info("ep_send", runtime::KernelKind::comm, comm_blocks(stream, g), {rows, counts, source_off}, {}),
                [ep, rows, back, counts, source_off, sent, sig, g, El](const runtime::BlockContext& ctx) {
                  const int64_t* so = source_off.data<int64_t>();
                  for_members(ep, ctx, [&](int s) {
                    const int64_t* row = counts.data<int64_t>() + int64_t(s) * (El + 1);
                    Sender send(sig, ep.pes[size_t(s)]);
                    for (int64_t e = 0, at = row[El]; e < El; at += row[e++])
                      send.put(rows_at(back, at), rows_at(rows, so[e * g + s]), size_t(row[e] * rows.size(1)));
                    send.finish();
                  });
                  if (ctx.block_idx == 0) *sent = {rows};
                });
  shmem::signal_wait_on_stream(stream, sig, shmem::Cmp::ge, uint64_t(g) * kSent,
                               fmt::format("waits for {} to send its rows back from their experts (MoE layer {} slice {}, {} {})",
                                           others(ep_), p.site.layer, p.site.slice,
                                           forward ? "combine" : "dispatch backward", forward ? p.fwd_round : p.bwd_round),
                               "ep_wait");
  // My rows out of the return buffer (the next exchange rewrites it), the
  // dropped rows' tail zeroed. It takes the signals it waited for.
  Tensor out = Tensor::empty({p.rows, shape_.width});
  const Tensor xp_off = p.xp_offsets;
  // Every owner sent these after it had regrouped my rows: my sends to it
  // are applied, their sources free.
  const std::shared_ptr<std::vector<Tensor>> delivered = b.sent[forward ? kInFwd : kInBwd];
  const int64_t n_rows = p.rows;
  stream.launch(launch_info("ep_receive", runtime::KernelKind::comm, comm_blocks(stream, n_rows), {back, xp_off}, {out}),
                [ep, sig, back, out, xp_off, delivered, n_rows, g, E](const runtime::BlockContext& ctx) {
                  const int64_t routed = xp_off.data<int64_t>()[E];
                  const int64_t b = ctx.block_idx, n = ctx.block_dim;
                  const int64_t from = n_rows * b / n, to = n_rows * (b + 1) / n;
                  copy_rows(out, from, back, from, std::clamp(routed, from, to) - from);
                  zero_rows(out, std::clamp(routed, from, to), to);
                  if (b != 0) return;
                  shmem::atomic_add(sig, uint64_t(0) - uint64_t(g) * kSent, ep.pes[size_t(ep.me)]);
                  delivered->clear();
                });
  return out;
}

// A received-rows tensor no one holds any more (not the model's saved
// activations, not a queued kernel), or a new one: the tail past its fill
// level is zero, so the next exchange zeroes only what the last one wrote
// beyond its own rows. One per micro-batch in flight, reused after that.
ShmemExperts::Received ShmemExperts::free_received(SiteBuffers& b, bool forward) {
  std::vector<Received>& pool = forward ? b.received_fwd : b.received_bwd;
  for (const Received& r : pool)
    if (r.rows.storage().use_count() == 1 && r.filled.storage().use_count() == 1) return r;
  pool.push_back({Tensor::zeros({recv_rows_, shape_.width}), Tensor::zeros({1}, DType::i64)});
  return pool.back();
}

Tensor ShmemExperts::combine(const Tensor& y, const Dispatched& d) {
  const Plan& p = *static_cast<const Plan*>(d.plan.get());
  buffers(p.site).awaiting_combine = false;
  return to_sources(y, p, /*forward=*/true);
}

Tensor ShmemExperts::combine_backward(const Tensor& dy, const Dispatched& d) {
  const Plan& p = *static_cast<const Plan*>(d.plan.get());
  p.bwd_round = ++buffers(p.site).bwd_round;
  return to_owners(dy, p, /*forward=*/false);
}

Tensor ShmemExperts::dispatch_backward(const Tensor& drows, const Dispatched& d) {
  const Plan& p = *static_cast<const Plan*>(d.plan.get());
  CM_CHECK(p.bwd_round > 0, "run combine_backward before dispatch_backward", "dispatch_backward of MoE layer {} slice {}",
           p.site.layer, p.site.slice);
  return to_sources(drows, p, /*forward=*/false);
}

}  // namespace coremesh::parallel
