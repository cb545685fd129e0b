#include "coremesh/parallel/expert_parallel.hpp"

#include "coremesh/core/log.hpp"
#include "expert_exchange.hpp"

namespace coremesh::parallel {

using namespace expert_exchange;

int ShmemExperts::shadow_slots(const Shape& s) {
  return s.balance == ExpertBalance::none ? 0 : std::clamp(s.experts / 2, 1, 8);
}

int64_t ShmemExperts::symmetric_bytes(int ep, const Shape& s) {
  const int local = s.experts / ep, S = shadow_slots(s);
  const int64_t recv = int64_t(ep) * slot_rows(local, s), params = 3 * s.hidden * s.width;
  const int64_t wire_row = s.width * int64_t(dtype_size(s.wire)) + (s.wire == DType::f8e4m3 ? 4 * scale_cols(s.width) : 0);
  int64_t per_site = 8 * int64_t(ep) * 2 * local + recv * wire_row + 4 * s.width * (recv + 2 * s.max_rows) +
                     8 * (kSignals + ep) + (s.wire == DType::f8e4m3 ? 128 : 0);
  if (S > 0) per_site += 8 * int64_t(ep) * s.experts + 4 * int64_t(S) * params * (1 + ep) + 5 * 128;
  return int64_t(s.layers.size()) * s.slices * (per_site + 6 * 128);  // + the heap's alignment per block
}

ShmemExperts::ShmemExperts(Group ep, const Shape& s) : ep_(std::move(ep)), shape_(s) {
  std::vector<int64_t> args = {s.experts, s.width, s.max_rows, s.capacity, s.slices, s.hidden, int64_t(s.balance),
                               s.balance_window, int64_t(s.shadow_cost * 1024), s.fused, int64_t(s.wire)};
  args.insert(args.end(), s.layers.begin(), s.layers.end());
  check_members_agree(ep_, args, "an expert-parallel group");
  const int g = ep_.size();
  CM_CHECK(s.experts > 0 && s.experts % g == 0, "choose ep among the divisors of the routed experts",
           "{} routed experts do not split over {} expert-parallel PEs", s.experts, g);
  CM_CHECK(s.width > 0 && s.max_rows > 0 && s.slices > 0, "give the buffers a width, a row count and a slice",
           "ShmemExperts shape");
  CM_CHECK(s.wire == DType::f32 || s.wire == DType::bf16 || s.wire == DType::f8e4m3,
           "send the rows as f32, bf16 or f8e4m3", "ShmemExperts shape with rows of {}", dtype_name(s.wire));
  local_ = s.experts / g;
  shadows_ = shadow_slots(s);
  CM_CHECK(shadows_ == 0 || (s.slices == 1 && s.hidden > 0), "balance experts with moe_replicas 1 and give the hidden size",
           "ShmemExperts shape for shadowed experts");
  slot_rows_ = slot_rows(local_, s);
  // With shadows, a PE keeps its own rows of its experts and of the shadowed
  // ones, at most all its rows: past the other sources' slots, max_rows.
  recv_rows_ = int64_t(g - 1) * slot_rows_ + (shadows_ > 0 ? s.max_rows : slot_rows_);
  const int64_t F = s.hidden, C = s.width;
  for (int l : s.layers)  // the same order on every PE: the allocations are collective
    for (int slice = 0; slice < s.slices; ++slice) {
      SiteBuffers& b = sites_[{l, slice}];
      b.counts = symmetric_tensor({g, 2 * local_}, DType::i64);
      b.in_fwd = symmetric_tensor({int64_t(g) * slot_rows_, s.width}, s.wire);
      if (s.wire == DType::f8e4m3) b.in_scale = symmetric_tensor({int64_t(g) * slot_rows_, scale_cols(s.width)});
      b.in_bwd = symmetric_tensor({int64_t(g) * slot_rows_, s.width});
      b.back_fwd = symmetric_tensor({s.max_rows, s.width});
      b.back_bwd = symmetric_tensor({s.max_rows, s.width});
      b.signals = symmetric_tensor({kSignals + g}, DType::i64);
      if (shadows_ > 0) {
        b.loads = symmetric_tensor({g, s.experts}, DType::i64);
        b.shadow_w = symmetric_tensor({shadows_, 3 * F * C});
        b.grads = {symmetric_tensor({g, shadows_, 2 * F * C}), symmetric_tensor({g, shadows_, C * F})};
        b.window = Tensor::zeros({int64_t(g) * s.experts + 1 + shadows_}, DType::i64);
        int64_t* sig = b.signals.data<int64_t>();
        sig[kAck] = sig[kAck + 1] = g;  // round 0's parts are taken
        std::fill_n(b.window.data<int64_t>() + int64_t(g) * s.experts + 1, shadows_, -1);
      }
      for (auto& sent : b.sent) sent = std::make_shared<std::vector<Tensor>>();
    }
}

ShmemExperts::~ShmemExperts() {
  // A site keeps a send's sources until a later arrival proves them applied,
  // which the last round of each site never gets: the transport may still be
  // reading them (or a queued kernel be about to send them). Complete every
  // send of this PE before its sources go.
  try {
    runtime::current_stream().device().synchronize();
    shmem::quiet();
  } catch (const std::exception& e) {
    CM_LOG_WARN("expert parallel: work still queued failed at teardown: {}", e.what());
  }
}

ShmemExperts::SiteBuffers& ShmemExperts::buffers(Site site) {
  auto it = sites_.find({site.layer, site.slice});
  CM_CHECK(it != sites_.end(), "list every MoE layer in ShmemExperts::Shape::layers and give it moe_replicas slices",
           "no buffers for MoE layer {} slice {}", site.layer, site.slice);
  return it->second;
}

ExpertDispatcher::Dispatched ShmemExperts::dispatch(const Tensor& xp, const Tensor& offsets, Site site,
                                                    const Weights& weights, const FirstGemm& first) {
  const int E = shape_.experts, El = local_, S = shadows_;
  SiteBuffers& b = buffers(site);
  CM_CHECK(xp.dim() == 2 && xp.size(1) == shape_.width && xp.size(0) <= shape_.max_rows && offsets.numel() == E + 1,
           "size the expert-parallel buffers for the largest micro-batch slice (tokens / moe_replicas x top_k rows)",
           "dispatch of {} rows of width {}; the buffers take {} rows of width {}", xp.size(0), xp.size(1),
           shape_.max_rows, shape_.width);
  // the rows go out as raw bytes of f32 rows (converted to the wire's dtype on the stream)
  CM_CHECK(xp.dtype() == DType::f32 && xp.is_contiguous() && offsets.dtype() == DType::i64 && offsets.dim() == 1 &&
               offsets.is_contiguous(),
           "pass contiguous f32 rows and (experts + 1) contiguous i64 offsets", "dispatch of {} with offsets {}",
           xp.describe(), offsets.describe());
  CM_CHECK(S == 0 || (weights.w13.defined() && weights.w2.defined() && weights.w13.size(0) == El &&
                      weights.w2.size(0) == El && weights.w13.numel() + weights.w2.numel() == int64_t(El) * b.shadow_w.size(1)),
           "pass the layer's routed-expert weights of this PE to dispatch", "dispatch with shadowed experts");
  CM_CHECK(b.failed.empty(),
           "construct a new expert-parallel group on every PE (this one's exchange stopped part way, so its "
           "members no longer agree on where they are)",
           "dispatch of MoE layer {} slice {} after the previous one failed: {}", site.layer, site.slice, b.failed);
  CM_CHECK(!b.awaiting_combine, "combine each dispatch of a layer before dispatching the layer again",
           "dispatch of MoE layer {} slice {} while its previous dispatch was not combined", site.layer, site.slice);
  b.awaiting_combine = true;
  try {
    return dispatch_planned(xp, offsets, site, weights, first);
  } catch (const std::exception& e) {
    b.failed = e.what();
    throw;
  } catch (...) {
    b.failed = "an exception that is not a std::exception";
    throw;
  }
}

ExpertDispatcher::Dispatched ShmemExperts::dispatch_planned(const Tensor& xp, const Tensor& offsets, Site site,
                                                            const Weights& weights, const FirstGemm& first) {
  const int g = ep_.size(), El = local_, S = shadows_;
  SiteBuffers& b = buffers(site);
  auto plan = std::make_shared<Plan>();
  plan->site = site, plan->rows = xp.size(0), plan->xp_offsets = offsets;
  plan->counts = Tensor::empty({g, 2 * El}, DType::i64);
  plan->offsets = Tensor::empty({El + S + 1}, DType::i64);
  plan->source_offsets = Tensor::empty({int64_t(El) * g + S + 1}, DType::i64);
  plan->shadows = Tensor::empty({std::max(S, 1)}, DType::i64);
  std::fill_n(plan->shadows.data<int64_t>(), std::max(S, 1), -1);
  plan->fwd_round = ++b.fwd_round;
  if (S > 0) plan_shadows_on_stream(offsets, *plan);
  Dispatched d;
  d.sources = g;
  d.offsets = plan->offsets;
  d.source_offsets = plan->source_offsets;
  const bool fuse = shape_.fused && first.run && S == 0;
  const Received arrived = to_owners(xp, *plan, /*forward=*/true, weights, fuse ? &first : nullptr, &d.first);
  d.rows = arrived.rows, d.scale = arrived.scale;
  if (S > 0) {
    std::tie(d.w13, d.w2) = group_weights(weights, *plan);
    d.exchange_parts = [this, plan](const Tensor& parts, int weight) { exchange_parts(parts, weight, *plan); };
  }
  d.plan = plan;
  return d;
}

ShmemExperts::Received ShmemExperts::to_owners(const Tensor& xp, const Plan& p, bool forward, const Weights& weights,
                                               const FirstGemm* first, Tensor* first_out) {
  const int g = ep_.size(), El = local_, S = shadows_;
  SiteBuffers& b = buffers(p.site);
  runtime::Stream stream = runtime::current_stream();
  auto* sig = reinterpret_cast<uint64_t*>(b.signals.data<int64_t>()) + (forward ? kInFwd : kInBwd);
  // fused: a word per source, so that each source's rows are taken as they land
  auto* source_sig = reinterpret_cast<uint64_t*>(b.signals.data<int64_t>()) + kSignals;
  const bool fused = first != nullptr;
  const Group ep = ep_;
  const Tensor in = forward ? b.in_fwd : b.in_bwd, counts = b.counts, xp_off = p.xp_offsets, shadows = p.shadows;
  // The rows as the wire carries them (forward: Shape::wire), converted here
  // on the stream; fp8: with their scales, which travel the same way.
  Tensor rows = xp, scale;
  if (forward && shape_.wire == DType::bf16) rows = ops::cast(xp, DType::bf16);
  if (forward && shape_.wire == DType::f8e4m3) {
    const ops::QuantizedTensor q = ops::quantize_fp8_act(xp);
    rows = q.data, scale = q.scale;
  }
  const Tensor in_scale = scale.defined() ? b.in_scale : Tensor();
  const Tensor shadow_w = b.shadow_w, w13 = weights.w13, w2 = weights.w2;
  const int64_t slot = slot_rows_;
  // To every owner (me included): forward, per expert of its its count and
  // where it starts in my xp; the rows of its experts that it computes (not
  // those of its shadowed experts, which I compute), packed into my slot.
  // Forward, as the owner of shadowed experts: their weights to every other PE.
  const Tensor message = Tensor::empty({g, 2 * El}, DType::i64);
  const std::shared_ptr<std::vector<Tensor>> sent = b.sent[forward ? kInFwd : kInBwd];
  std::vector<Tensor> reads{rows, xp_off, shadows};
  if (scale.defined()) reads.push_back(scale);
  if (forward && S > 0) reads.insert(reads.end(), {w13, w2});
  stream.launch(launch_info("ep_send", runtime::KernelKind::comm, comm_blocks(stream, g), reads, {message}),
                [ep, rows, scale, in, in_scale, counts, xp_off, shadows, shadow_w, w13, w2, message, sent, sig,
                 source_sig, fused, forward, slot, El, S](const runtime::BlockContext& ctx) {
                  const int64_t* off = xp_off.data<int64_t>();
                  // computed on the stream: checked here, before a row leaves (a bad list sent heap bytes as rows)
                  const int64_t E = xp_off.numel() - 1;
                  CM_CHECK(off[0] == 0 && off[E] <= rows.size(0), "offsets must start at 0 and end at most at the rows",
                           "expert offsets [0]={} [E]={} for {} rows", off[0], off[E], rows.size(0));
                  for (int64_t e = 0; e < E; ++e)
                    CM_CHECK(off[e] <= off[e + 1], "offsets must be non-decreasing",
                             "expert offsets decrease at expert {}: {} > {}", e, off[e], off[e + 1]);
                  auto shadowed = [&](int64_t e) {
                    for (int k = 0; k < S; ++k)
                      if (shadow_at(shadows, k) == e) return true;
                    return false;
                  };
                  for_members(ep, ctx, [&](int d) {
                    const int pe = ep.pes[size_t(d)];
                    int64_t* m = message.data<int64_t>() + int64_t(d) * 2 * El;
                    int64_t n = 0;
                    for (int e = 0; e < El; ++e) {
                      const int64_t x = int64_t(d) * El + e;
                      m[e] = d != ep.me && shadowed(x) ? 0 : off[x + 1] - off[x];
                      m[El + e] = off[x];
                      n += m[e];
                    }
                    CM_CHECK(n <= slot, "raise the expert capacity the buffers were sized for, or lower the batch",
                             "PE {} sends {} rows to the experts of PE {}, who take {} per source", ep.pes[size_t(ep.me)],
                             n, pe, slot);
                    Sender send(fused ? source_sig + ep.me : sig, pe);
                    if (forward) send.put(counts.data<int64_t>() + int64_t(ep.me) * 2 * El, m, size_t(2 * El));
                    for (const auto& [to, from] : {std::pair{in, rows}, std::pair{in_scale, scale}})
                      for (int e = 0, at = 0; from.defined() && e < El; at += int(m[e++]))
                        if (m[e] > 0) send.put_rows(to, ep.me * slot + at, from, m[El + e], m[e]);
                    if (forward && d != ep.me)
                      for (int k = 0; k < S; ++k) {
                        const int64_t e = shadow_at(shadows, k) - int64_t(ep.me) * El;  // my expert?
                        if (e < 0 || e >= El) continue;
                        float* to = shadow_w.data<float>() + k * shadow_w.size(1);
                        const int64_t n13 = w13.numel() / El, n2 = w2.numel() / El;
                        send.put(to, w13.data<float>() + e * n13, size_t(n13));
                        send.put(to + n13, w2.data<float>() + e * n2, size_t(n2));
                      }
                    send.finish();
                  });
                  if (ctx.block_idx == 0) *sent = {rows, scale, message};
                });
  const Tensor first_in = fused ? Tensor::empty({in.size(0), first->width}) : Tensor();
  if (fused) {
    // Each source's slot as it lands, mine first: its group list from its
    // counts, then the GEMM, while the later sources' rows travel.
    for (int i = 0; i < g; ++i) {
      const int src = (ep_.me + i) % g;
      shmem::signal_wait_on_stream(stream, source_sig + src, shmem::Cmp::ge, kSent,
                                   fmt::format("waits for PE {} to send the rows of its experts (MoE layer {} slice {}, "
                                               "dispatch {})",
                                               ep_.pes[size_t(src)], p.site.layer, p.site.slice, p.fwd_round),
                                   "ep_wait");
      const Tensor groups = Tensor::empty({El + 1}, DType::i64);
      stream.launch(launch_info("ep_slot_groups", runtime::KernelKind::vector, 1, {counts}, {groups}),
                    [counts, groups, src, El](const runtime::BlockContext&) {
                      const int64_t* m = counts.data<int64_t>() + int64_t(src) * 2 * El;
                      int64_t* o = groups.data<int64_t>();
                      o[0] = 0;
                      for (int e = 0; e < El; ++e) o[e + 1] = o[e] + m[e];
                    });
      auto slot_of = [&](const Tensor& t) { return t.defined() ? t.slice(0, src * slot, (src + 1) * slot) : t; };
      first->run(slot_of(in), slot_of(in_scale), groups, slot_of(first_in));
    }
  } else {
    shmem::signal_wait_on_stream(stream, sig, shmem::Cmp::ge, uint64_t(g) * kSent,
                                 fmt::format("waits for {} to send the rows of its experts (MoE layer {} slice {}, {} {})",
                                             others(ep_), p.site.layer, p.site.slice,
                                             forward ? "dispatch" : "combine backward",
                                             forward ? p.fwd_round : p.bwd_round),
                                 "ep_wait");
  }
  // My slots regrouped by local expert, then source, then my own rows of
  // the shadowed experts, one group per slot. Forward: the plan from the
  // counts first (every block derives it; block 0 keeps it). It takes the
  // signals it waited for.
  const Received received = free_received(b, forward);
  const Tensor out = received.rows, out_scale = received.scale, filled = received.filled;
  const Tensor first_grouped = fused ? Tensor::zeros({out.size(0), first->width}) : Tensor();
  if (fused) *first_out = first_grouped;
  const Tensor plan_counts = p.counts, local_off = p.offsets, source_off = p.source_offsets;
  // Every source sent these after it had my rows of its previous round back:
  // my sends of that round are applied, their sources free (and every PE
  // planned from my loads before it sent).
  const std::shared_ptr<std::vector<Tensor>> delivered = b.sent[forward ? kBackFwd : kBackBwd];
  const std::shared_ptr<std::vector<Tensor>> loads_sent = b.sent[kLoads];
  std::vector<Tensor> writes{out, filled};
  if (forward) writes.insert(writes.end(), {plan_counts, local_off, source_off});
  std::vector<Tensor> regroup_reads{in, counts, plan_counts, rows, xp_off, shadows};
  if (fused) writes.push_back(first_grouped), regroup_reads.push_back(first_in);
  if (scale.defined()) writes.push_back(out_scale), regroup_reads.insert(regroup_reads.end(), {in_scale, scale});
  stream.launch(launch_info("ep_regroup", runtime::KernelKind::comm, comm_blocks(stream, int64_t(El) * g + S),
                            regroup_reads, writes),
                [ep, sig, source_sig, fused, in, in_scale, counts, plan_counts, local_off, source_off, out, out_scale,
                 filled, first_in, first_grouped, delivered, loads_sent, rows, scale, xp_off, shadows, forward, slot,
                 g, El, S](const runtime::BlockContext& ctx) {
                  const int64_t* M = (forward ? counts : plan_counts).data<int64_t>();  // (g, 2 El)
                  const int64_t* off = xp_off.data<int64_t>();
                  // rows of my shadow slot k: my rows of its expert, unless I own it
                  auto shadow_rows = [&](int k) {
                    const int64_t e = shadow_at(shadows, k);
                    return e < 0 || e / El == ep.me ? 0 : off[e + 1] - off[e];
                  };
                  std::vector<int64_t> so(size_t(El) * g + S + 1);
                  int64_t at = 0;
                  for (int e = 0; e < El; ++e)
                    for (int s = 0; s < g; ++s) so[size_t(e * g + s)] = at, at += M[s * 2 * El + e];
                  for (int k = 0; k < S; ++k) so[size_t(El * g + k)] = at, at += shadow_rows(k);
                  so.back() = at;
                  // the rows and, fp8, their scales: from my slots / my own rows
                  const std::array<std::array<Tensor, 3>, 2> planes{{{out, in, rows}, {out_scale, in_scale, scale}}};
                  for (int64_t i = ctx.block_idx; i < int64_t(El) * g + S; i += ctx.block_dim) {
                    if (i >= int64_t(El) * g) {
                      const int k = int(i - int64_t(El) * g);
                      const int64_t n = shadow_rows(k);
                      if (n == 0) continue;  // an empty slot: its expert is -1, off[-1] is not a row
                      for (const auto& [to, slots, mine] : planes)
                        if (to.defined()) copy_rows(to, so[size_t(i)], mine, off[shadow_at(shadows, k)], n);
                      continue;
                    }
                    const int e = int(i / g), s = int(i % g);
                    int64_t from = s * slot;
                    for (int f = 0; f < e; ++f) from += M[s * 2 * El + f];
                    for (const auto& [to, slots, mine] : planes)
                      if (to.defined()) copy_rows(to, so[size_t(i)], slots, from, M[s * 2 * El + e]);
                    if (fused) copy_rows(first_grouped, so[size_t(i)], first_in, from, M[s * 2 * El + e]);
                  }
                  if (ctx.block_idx != 0) return;
                  if (fused)
                    for (int s = 0; s < g; ++s) shmem::atomic_add(source_sig + s, uint64_t(0) - kSent, ep.pes[size_t(ep.me)]);
                  else
                    shmem::atomic_add(sig, uint64_t(0) - uint64_t(g) * kSent, ep.pes[size_t(ep.me)]);
                  delivered->clear();
                  if (forward) {
                    loads_sent->clear();
                    std::memcpy(plan_counts.data<int64_t>(), M, sizeof(int64_t) * size_t(g) * size_t(2 * El));
                    std::copy(so.begin(), so.end(), source_off.data<int64_t>());
                    for (int e = 0; e <= El; ++e) local_off.data<int64_t>()[e] = so[size_t(e * g)];
                    for (int k = 1; k <= S; ++k) local_off.data<int64_t>()[El + k] = so[size_t(El * g + k)];
                  }
                  int64_t& rows_filled = *filled.data<int64_t>();  // the tail past it is zero
                  zero_rows(out, at, rows_filled);
                  if (out_scale.defined()) zero_rows(out_scale, at, rows_filled, /*scales=*/true);
                  rows_filled = at;
                });
  return received;
}

Tensor ShmemExperts::to_sources(const Tensor& rows, const Plan& p, bool forward, const GroupsGemm* gemm) {
  const int g = ep_.size(), E = shape_.experts, El = local_, S = shadows_;
  SiteBuffers& b = buffers(p.site);
  runtime::Stream stream = runtime::current_stream();
  auto* sig = reinterpret_cast<uint64_t*>(b.signals.data<int64_t>()) + (forward ? kBackFwd : kBackBwd);
  const Group ep = ep_;
  const Tensor back = forward ? b.back_fwd : b.back_bwd, counts = p.counts, source_off = p.source_offsets;
  // To every source (me included): each run of its rows, one per local
  // expert, to where it starts in the source's xp. Fused: expert by expert,
  // each after the GEMM wrote its rows; one sender per source across the
  // kernels (the stream runs them in order), so its adds still sum to kSent;
  // made anew by the first kernel (a replayed graph runs the kernels again).
  const std::shared_ptr<std::vector<Tensor>> sent = b.sent[forward ? kBackFwd : kBackBwd];
  auto senders = std::make_shared<std::vector<Sender>>(size_t(g), Sender(sig, 0));
  const int steps = gemm ? El : 1;
  for (int step = 0; step < steps; ++step) {
    const int64_t e0 = gemm ? step : 0, e1 = gemm ? step + 1 : El;
    if (gemm) (*gemm)(rows, e0, e1 == El ? -1 : e1);
    stream.launch(
        launch_info("ep_send", runtime::KernelKind::comm, comm_blocks(stream, g), {rows, counts, source_off}, {}),
        [ep, rows, back, counts, source_off, sent, senders, sig, g, El, e0, e1](const runtime::BlockContext& ctx) {
          const int64_t* so = source_off.data<int64_t>();
          for_members(ep, ctx, [&](int s) {
            const int64_t* row = counts.data<int64_t>() + int64_t(s) * 2 * El;
            Sender& send = (*senders)[size_t(s)];
            if (e0 == 0) send = Sender(sig, ep.pes[size_t(s)]);
            for (int64_t e = e0; e < e1; ++e)
              if (row[e] > 0)
                send.put_rows(back, row[El + e], rows, so[e * g + s], row[e]);
            if (e1 == El) send.finish();
          });
          if (ctx.block_idx == 0 && e1 == El) *sent = {rows};
        });
  }
  shmem::signal_wait_on_stream(stream, sig, shmem::Cmp::ge, uint64_t(g) * kSent,
                               fmt::format("waits for {} to send its rows back from their experts (MoE layer {} slice {}, {} {})",
                                           others(ep_), p.site.layer, p.site.slice,
                                           forward ? "combine" : "dispatch backward", forward ? p.fwd_round : p.bwd_round),
                               "ep_wait");
  // My rows out of the return buffer (the next exchange rewrites it), my
  // shadow groups' rows from `rows`, the dropped rows' tail zeroed. It takes
  // the signals it waited for.
  Tensor out = Tensor::empty({p.rows, shape_.width});
  const Tensor xp_off = p.xp_offsets, shadows = p.shadows;
  // Every owner sent these after it had regrouped my rows: my sends to it
  // are applied, their sources free.
  const std::shared_ptr<std::vector<Tensor>> delivered = b.sent[forward ? kInFwd : kInBwd];
  const int64_t n_rows = p.rows;
  stream.launch(launch_info("ep_receive", runtime::KernelKind::comm, comm_blocks(stream, n_rows),
                            {back, xp_off, rows, source_off, shadows}, {out}),
                [ep, sig, back, out, xp_off, rows, source_off, shadows, delivered, n_rows, g, E, El, S](
                    const runtime::BlockContext& ctx) {
                  const int64_t* off = xp_off.data<int64_t>();
                  const int64_t routed = off[E];
                  const int64_t b = ctx.block_idx, n = ctx.block_dim;
                  const int64_t from = n_rows * b / n, to = n_rows * (b + 1) / n;
                  copy_rows(out, from, back, from, std::clamp(routed, from, to) - from);
                  zero_rows(out, std::clamp(routed, from, to), to);
                  for (int k = 0; k < S; ++k) {  // my shadow rows of this block's range
                    const int64_t e = shadow_at(shadows, k);
                    if (e < 0 || e / El == ep.me) continue;
                    const int64_t lo = std::clamp(off[e], from, to), hi = std::clamp(off[e + 1], from, to);
                    copy_rows(out, lo, rows, source_off.data<int64_t>()[int64_t(El) * g + k] + lo - off[e], hi - lo);
                  }
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
    if (r.rows.storage().use_count() == 1 && r.filled.storage().use_count() == 1 &&
        (!r.scale.defined() || r.scale.storage().use_count() == 1))
      return r;
  Received r{Tensor::zeros({recv_rows_, shape_.width}, forward ? shape_.wire : DType::f32), Tensor(),
             Tensor::zeros({1}, DType::i64)};
  if (forward && shape_.wire == DType::f8e4m3) {
    r.scale = Tensor::empty({recv_rows_, scale_cols(shape_.width)});
    zero_rows(r.scale, 0, recv_rows_, /*scales=*/true);
  }
  pool.push_back(r);
  return r;
}

namespace {
// What the experts hand back for the rows `d` delivered: one f32 row each.
// (A fused dispatch hands its rows to the first GEMM: then only the width.)
void check_expert_rows(const Tensor& y, const ExpertDispatcher::Dispatched& d, int64_t width, const char* what) {
  const int64_t rows = d.rows.defined() ? d.rows.size(0) : -1;
  CM_CHECK(y.dim() == 2 && (rows < 0 || y.size(0) == rows) && y.size(1) == width && y.dtype() == DType::f32 &&
               y.is_contiguous(),
           "pass one contiguous f32 row per delivered row (the dispatch's rows), of the group's width",
           "{} of {}; the dispatch delivered {} rows of width {}", what, y.describe(), rows, width);
}
}  // namespace

Tensor ShmemExperts::combine(const Tensor& y, const Dispatched& d) {
  check_expert_rows(y, d, shape_.width, "combine");
  const Plan& p = *static_cast<const Plan*>(d.plan.get());
  buffers(p.site).awaiting_combine = false;
  return to_sources(y, p, /*forward=*/true);
}

Tensor ShmemExperts::matmul_combine(const Tensor& y, const GroupsGemm& gemm, const Dispatched& d) {
  if (!shape_.fused || shadows_ > 0) return ExpertDispatcher::matmul_combine(y, gemm, d);
  const Plan& p = *static_cast<const Plan*>(d.plan.get());
  SiteBuffers& b = buffers(p.site);
  b.awaiting_combine = false;
  try {
    return to_sources(y, p, /*forward=*/true, &gemm);
  } catch (const std::exception& e) {  // the exchange stopped part way, as a failed dispatch's
    b.failed = e.what();
    throw;
  }
}

Tensor ShmemExperts::combine_backward(const Tensor& dy, const Dispatched& d) {
  const Plan& p = *static_cast<const Plan*>(d.plan.get());
  CM_CHECK(dy.dim() == 2 && dy.size(0) == p.rows && dy.size(1) == shape_.width && dy.dtype() == DType::f32 &&
               dy.is_contiguous(),
           "pass the gradient of combine's output: one contiguous f32 row per dispatched row",
           "combine_backward of {}; the dispatch sent {} rows of width {}", dy.describe(), p.rows, shape_.width);
  p.bwd_round = ++buffers(p.site).bwd_round;
  return to_owners(dy, p, /*forward=*/false, {}).rows;
}

Tensor ShmemExperts::dispatch_backward(const Tensor& drows, const Dispatched& d) {
  const Plan& p = *static_cast<const Plan*>(d.plan.get());
  CM_CHECK(p.bwd_round > 0, "run combine_backward before dispatch_backward", "dispatch_backward of MoE layer {} slice {}",
           p.site.layer, p.site.slice);
  check_expert_rows(drows, d, shape_.width, "dispatch_backward");
  return to_sources(drows, p, /*forward=*/false);
}

}  // namespace coremesh::parallel
