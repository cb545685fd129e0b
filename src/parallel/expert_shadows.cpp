// ShmemExperts' shadowed experts (expert_balance): the loads every PE
// plans from, the groups' weights, the weight-gradient parts going home.
// The rows themselves travel with the dispatch (expert_parallel.cpp).
#include <vector>

#include "expert_exchange.hpp"

namespace coremesh::parallel {

using namespace expert_exchange;

void ShmemExperts::plan_shadows_on_stream(const Tensor& xp_offsets, const Plan& p) {
  const int g = ep_.size(), E = shape_.experts, S = shadows_;
  SiteBuffers& b = buffers(p.site);
  runtime::Stream stream = runtime::current_stream();
  auto* sig = reinterpret_cast<uint64_t*>(b.signals.data<int64_t>()) + kLoads;
  const Group ep = ep_;
  const Tensor loads = b.loads, message = Tensor::empty({E}, DType::i64);
  const std::shared_ptr<std::vector<Tensor>> sent = b.sent[kLoads];
  // One block: the message is E counts, and every send reads it.
  stream.launch(launch_info("ep_send_loads", runtime::KernelKind::comm, 1, {xp_offsets}, {message}),
                [ep, loads, message, xp_offsets, sent, sig, E](const runtime::BlockContext& ctx) {
                  const int64_t* off = xp_offsets.data<int64_t>();
                  int64_t* m = message.data<int64_t>();
                  for (int e = 0; e < E; ++e) m[e] = off[e + 1] - off[e];
                  for_members(ep, ctx, [&](int d) {
                    Sender send(sig, ep.pes[size_t(d)]);
                    send.put(loads.data<int64_t>() + int64_t(ep.me) * E, m, size_t(E));
                    send.finish();
                  });
                  *sent = {message};
                });
  wait_signal_on_stream(stream, sig, uint64_t(g) * kSent,
                        fmt::format("waits for {} to send their expert loads (MoE layer {} slice {}, dispatch {})",
                                    others(ep_), p.site.layer, p.site.slice, p.fwd_round));
  // Every PE plans from the same loads, so every PE gets the same plan.
  const Tensor window = b.window, shadows = p.shadows;
  const bool periodic = shape_.balance == ExpertBalance::static_window;
  const int period = shape_.balance_window;
  const double cost = shape_.shadow_cost;
  stream.launch(launch_info("ep_plan_shadows", runtime::KernelKind::vector, 1, {loads, window}, {window, shadows}),
                [loads, window, shadows, g, E, S, periodic, period, cost](const runtime::BlockContext&) {
                  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(g), std::vector<int64_t>(static_cast<size_t>(E)));
                  int64_t* w = window.data<int64_t>();  // sums, rounds, the plan
                  for (int s = 0; s < g; ++s)
                    for (int e = 0; e < E; ++e) {
                      counts[size_t(s)][size_t(e)] = loads.data<int64_t>()[s * E + e];
                      w[s * E + e] += counts[size_t(s)][size_t(e)];
                    }
                  int64_t* planned = w + int64_t(g) * E + 1;
                  if (!periodic || ++w[int64_t(g) * E] == period) {
                    double weight_rows = cost;
                    if (periodic) {
                      for (int s = 0; s < g; ++s)
                        for (int e = 0; e < E; ++e) counts[size_t(s)][size_t(e)] = w[s * E + e];
                      weight_rows *= period;
                    }
                    const std::vector<int> chosen = plan_shadows(counts, S, weight_rows).shadowed;
                    std::fill_n(planned, S, -1);
                    std::copy(chosen.begin(), chosen.end(), planned);
                    std::fill_n(w, int64_t(g) * E + 1, 0);
                  }
                  std::copy_n(planned, S, shadows.data<int64_t>());
                });
}

std::pair<Tensor, Tensor> ShmemExperts::group_weights(const Weights& own, const Plan& p) {
  const int El = local_, S = shadows_;
  SiteBuffers& b = buffers(p.site);
  runtime::Stream stream = runtime::current_stream();
  // One pair per micro-batch in flight, reused (fresh memory faults in page by page).
  std::pair<Tensor, Tensor>* pair = nullptr;
  for (auto& w : b.group_weights)
    if (w.first.storage().use_count() == 1 && w.second.storage().use_count() == 1) pair = &w;
  if (!pair) {
    coremesh::Shape s13 = own.w13.shape(), s2 = own.w2.shape();
    s13[0] = s2[0] = El + S;
    pair = &b.group_weights.emplace_back(Tensor::empty(s13), Tensor::empty(s2));
  }
  const Tensor w13 = pair->first, w2 = pair->second, shadow_w = b.shadow_w, shadows = p.shadows;
  const Tensor a13 = own.w13, a2 = own.w2;
  const int me = ep_.me;
  // After the regroup (the weights arrived with the rows), before this PE
  // returns the rows (after which their owners may send the next round's).
  stream.launch(launch_info("ep_shadow_weights", runtime::KernelKind::vector, 1, {a13, a2, shadow_w, shadows}, {w13, w2}),
                [a13, a2, w13, w2, shadow_w, shadows, me, El, S](const runtime::BlockContext&) {
                  const int64_t n13 = a13.numel() / El, n2 = a2.numel() / El;
                  std::memcpy(w13.data<float>(), a13.data<float>(), size_t(a13.numel()) * sizeof(float));
                  std::memcpy(w2.data<float>(), a2.data<float>(), size_t(a2.numel()) * sizeof(float));
                  for (int k = 0; k < S; ++k) {
                    float* t13 = w13.data<float>() + (El + k) * n13;
                    float* t2 = w2.data<float>() + (El + k) * n2;
                    const int64_t e = shadow_at(shadows, k);
                    if (e < 0 || e / El == me) {  // no rows: zeros, not stale memory
                      std::fill_n(t13, n13, 0.0f), std::fill_n(t2, n2, 0.0f);
                      continue;
                    }
                    const float* from = shadow_w.data<float>() + k * shadow_w.size(1);
                    std::memcpy(t13, from, size_t(n13) * sizeof(float));
                    std::memcpy(t2, from + n13, size_t(n2) * sizeof(float));
                  }
                });
  return {w13, w2};
}

void ShmemExperts::exchange_parts(const Tensor& parts, int weight, const Plan& p) {
  const int g = ep_.size(), El = local_, S = shadows_;
  SiteBuffers& b = buffers(p.site);
  const Tensor grads = b.grads[size_t(weight)];
  const int64_t n = grads.size(2);
  CM_CHECK(parts.dim() == 3 && parts.size(0) == int64_t(El) * g + S && parts.size(1) * parts.size(2) == n,
           "pass one weight-gradient part per group of the dispatch", "shadow parts of {} dimensions, {} groups", parts.dim(), parts.size(0));
  runtime::Stream stream = runtime::current_stream();
  auto* sig = reinterpret_cast<uint64_t*>(b.signals.data<int64_t>()) + kGrads + weight;
  auto* ack = reinterpret_cast<uint64_t*>(b.signals.data<int64_t>()) + kAck + weight;
  const Group ep = ep_;
  const Tensor shadows = p.shadows;
  // Every owner took my parts of the round before (the slots are free).
  wait_signal_on_stream(stream, ack, uint64_t(g),
                        fmt::format("waits for {} to take its shadow weight gradients (MoE layer {}, round before {})",
                                    others(ep_), p.site.layer, p.fwd_round));
  const std::shared_ptr<std::vector<Tensor>> sent = b.sent[size_t(kGrads + weight)];
  stream.launch(launch_info("ep_send_parts", runtime::KernelKind::comm, comm_blocks(stream, g), {parts, shadows}, {}),
                [ep, parts, grads, shadows, sent, sig, n, g, El, S](const runtime::BlockContext& ctx) {
                  for_members(ep, ctx, [&](int d) {
                    Sender send(sig, ep.pes[size_t(d)]);
                    for (int k = 0; k < S; ++k) {
                      const int64_t e = shadow_at(shadows, k);
                      if (d == ep.me || e < 0 || e / El != d) continue;
                      send.put(grads.data<float>() + (int64_t(ep.me) * S + k) * n,
                               parts.data<float>() + (int64_t(El) * g + k) * n, size_t(n));
                    }
                    send.finish();
                  });
                  if (ctx.block_idx == 0) *sent = {parts};
                });
  wait_signal_on_stream(stream, sig, uint64_t(g) * kSent,
                        fmt::format("waits for {} to send their weight gradients of its shadowed experts (MoE layer {})",
                                    others(ep_), p.site.layer));
  // The parts of my shadowed experts from the other sources into their
  // (expert, source) places (empty there: those rows never came), then
  // every source may send its next round's.
  stream.launch(launch_info("ep_take_parts", runtime::KernelKind::comm, 1, {grads, shadows}, {parts}),
                [ep, parts, grads, shadows, ack, n, g, El, S](const runtime::BlockContext&) {
                  for (int k = 0; k < S; ++k) {
                    const int64_t e = shadow_at(shadows, k) - int64_t(ep.me) * El;
                    if (e < 0 || e >= El) continue;
                    for (int s = 0; s < g; ++s)
                      if (s != ep.me)
                        std::memcpy(parts.data<float>() + (e * g + s) * n, grads.data<float>() + (int64_t(s) * S + k) * n,
                                    size_t(n) * sizeof(float));
                  }
                  for (int s = 0; s < g; ++s) shmem::atomic_add(ack, uint64_t{1}, ep.pes[size_t(s)]);
                });
}

}  // namespace coremesh::parallel
