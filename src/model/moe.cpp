#include "moe.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include "coremesh/ops/activation.hpp"
#include "coremesh/ops/elementwise.hpp"
#include "coremesh/ops/grouped_gemm.hpp"
#include "coremesh/ops/moe_routing.hpp"
#include "coremesh/runtime/profiler.hpp"

namespace coremesh::model::detail {
namespace {

ops::ScoreFunc score_func(const ModelConfig& cfg) {
  return cfg.gating == Gating::softmax ? ops::ScoreFunc::softmax : ops::ScoreFunc::sigmoid;
}

ops::TopKConfig topk_config(const ModelConfig& cfg) {
  ops::TopKConfig t;
  t.k = cfg.top_k;
  t.n_groups = cfg.n_groups;
  t.topk_groups = cfg.topk_groups;
  t.renorm = cfg.gating == Gating::sigmoid;  // sigmoid gates are renormalized over the k
  return t;
}

// N tokens in min(replicas, N) slices of balanced size, in token order.
std::vector<MoeSlice> token_slices(int64_t N, int replicas) {
  const int64_t R = std::clamp<int64_t>(replicas, 1, std::max<int64_t>(N, 1));
  std::vector<MoeSlice> slices(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) slices[size_t(r)].begin = N * r / R, slices[size_t(r)].end = N * (r + 1) / R;
  return slices;
}

// Runs the slices' steps: each slice's compute on its own stream, its
// exchanges on its comm stream, every step after the slice's previous one
// (events, no host waits). Forked from the calling stream when made, joined into it by
// join(). One slice: everything on the calling stream, in call order.
class SliceRun {
 public:
  SliceRun(MoeStreams& streams, size_t slices) : main_(runtime::current_stream()) {
    if (slices == 1) return;
    set_ = &streams.of(main_);
    const runtime::Event fork = main_.record_event();
    last_.assign(slices, fork);
  }
  template <typename F>
  void on_slice(size_t i, F&& f) {
    run(set_ ? &set_->slices[i] : nullptr, i, f);
  }
  template <typename F>
  void on_comm(size_t i, F&& f) {
    run(set_ ? &set_->comms[i] : nullptr, i, f);
  }
  // The calling stream waits for slice i's steps so far.
  void wait_for(size_t i) {
    if (set_) main_.wait_event(last_[i]);
  }
  void join() {
    for (size_t i = 0; i < last_.size(); ++i) wait_for(i);
    last_.clear();
  }

 private:
  template <typename F>
  void run(runtime::Stream* stream, size_t i, F& f) {
    if (!stream) return f();
    stream->wait_event(last_[i]);
    {
      runtime::StreamGuard on(*stream);
      f();
    }
    last_[i] = stream->record_event();
  }
  runtime::Stream main_;
  MoeStreams::Set* set_ = nullptr;
  std::vector<runtime::Event> last_;
};

// Every slice's `input` joined group by group (ops::concat_groups), as one
// unsliced exchange delivers the rows: expert, source, then tokens in order.
// The fp8 scales are per row (1x128 tiles along in), so they join the same.
GemmInput joined_input(const std::vector<MoeSlice>& slices, GemmInput MoeSlice::*input,
                       const std::vector<Tensor>& groups) {
  auto join = [&](auto part_of) {
    std::vector<Tensor> parts;
    for (const MoeSlice& s : slices) parts.push_back(part_of(s.*input));
    return ops::concat_groups(parts, groups).rows;
  };
  GemmInput in{(slices.front().*input).precision, {}, {}};
  if (in.precision == Precision::fp8) {
    in.fp8.data = join([](const GemmInput& g) { return g.fp8.data; });
    in.fp8.scale = join([](const GemmInput& g) { return g.fp8.scale; });
  } else {
    in.x = join([](const GemmInput& g) { return g.x; });
  }
  return in;
}

// The experts' GEMM input from rows as a dispatch delivered them: f32,
// converted here, or already in the GEMM's form (the wire's, ShmemExperts::
// Shape::wire, converted by their sources).
GemmInput arrived_input(const Tensor& rows, const Tensor& scale, Precision precision) {
  if (rows.dtype() == DType::f32) return gemm_input(rows, precision);
  const DType want = precision == Precision::fp8 ? DType::f8e4m3 : DType::bf16;
  CM_CHECK(precision != Precision::f32 && rows.dtype() == want,
           "send the experts' rows as f32 or in the form the model's precision multiplies",
           "rows of {} arrived for a {} model", dtype_name(rows.dtype()), precision_name(precision));
  GemmInput in{precision, {}, {}};
  if (precision == Precision::fp8) in.fp8 = {rows, scale};
  else in.x = rows;
  return in;
}

}  // namespace

MoeStreams::Set& MoeStreams::of(const runtime::Stream& parent) {
  auto it = sets_.find(parent.id());
  if (it != sets_.end()) return it->second;
  runtime::Device& device = parent.device();
  Set set;
  for (int r = 0; r < replicas_; ++r) {
    set.slices.emplace_back(device);
    set.comms.emplace_back(device, /*priority=*/1);
    if (comm_cores_ > 0) set.comms.back().set_limit(-1, std::min(comm_cores_, device.limit().vector));
    // the trace's track names (scripts/trace_overlap.py finds the exchanges by them)
    runtime::profiler_name_stream(device.id(), set.slices.back().id(),
                                  fmt::format("moe slice {} of stream {}", r, parent.id()));
    runtime::profiler_name_stream(device.id(), set.comms.back().id(),
                                  fmt::format("moe comm {} of stream {}", r, parent.id()));
  }
  return sets_.emplace(parent.id(), std::move(set)).first->second;
}

Tensor moe_forward(const Tensor& x_in, const MoeParams& w, const Tensor& bias, const ModelConfig& cfg,
                   int64_t B, int layer, parallel::ExpertDispatcher& experts, parallel::TensorParallel& tp,
                   MoeStreams& streams, const Tensor& load, MoeActs& a) {
  // The router, the experts and the shared experts are one tensor-parallel
  // region: under sequence parallelism it gathers the tokens first, so the
  // router sees every token of the micro-batch as on one PE.
  a.x = tp.enter(x_in);
  const Tensor& x = a.x;
  const int64_t N = x.size(0), C = x.size(1), E = cfg.n_routed_experts;
  a.layer = layer;
  // --- routing: s = x R^T (N,E) -> p -> top-k with bias (selection only)
  a.scores = ops::router_scores(linear(x, w.router), score_func(cfg));
  const ops::Routing sel = ops::topk_route(a.scores, bias, topk_config(cfg));
  a.sel_idx = sel.indices, a.sel_w = sel.weights;
  // --- capacity: per expert keep `cap` assignments (token order or highest weight)
  ops::Routing kept = sel;
  const int64_t cap = cfg.expert_capacity(N);
  if (cap >= 0)
    kept = ops::apply_capacity(sel, E, cap,
                               cfg.drop_policy == DropPolicy::low_score ? ops::DropPolicy::probability
                                                                        : ops::DropPolicy::position);
  a.idx = kept.indices, a.w = kept.weights;
  ops::accumulate_expert_load(sel.indices, kept.indices, load.slice(0, 0, E + 1));
  if (cfg.keeps_selection_margins())
    ops::accumulate_selection_margins(a.scores, bias, sel.indices,
                                      load.slice(0, E + 1, load.numel()).view({E, 2, ops::kMarginBins}));
  if (cfg.aux_loss_alpha > 0) a.aux = ops::sequence_balance_loss(a.scores, sel.indices, B, cfg.aux_loss_alpha);
  // with shadowed experts, the weights of the dispatch's groups (below)
  if (!experts.shadows()) a.w13 = gemm_weight(w.w13, cfg.precision), a.w2 = gemm_weight(w.w2, cfg.precision);
  // --- per token slice: permute rows by expert, send them to their experts'
  // PEs, grouped-GEMM SwiGLU experts (one GEMM for [w1_e; w3_e]), bring the
  // outputs back, weighted combine into the slice's rows of y. All slices
  // dispatch first, so that slice i's exchange runs while slice i-1 computes.
  a.slices = token_slices(N, streams.replicas());
  const Tensor routed_y = Tensor::empty({N, C});
  // The experts' GEMMs as a dispatcher may run them: [w1; w3] per source as
  // its rows land, w2 expert by expert as combine sends them. fp8: each
  // weight quantized once per forward, here, before the slices' streams fork
  // (with shadows: at first use, everything on this stream).
  std::optional<ops::QuantizedTensor> w13_fp8, w2_fp8;
  if (cfg.precision == Precision::fp8 && !experts.shadows())
    w13_fp8 = ops::quantize_fp8_weight(a.w13.master), w2_fp8 = ops::quantize_fp8_weight(a.w2.master);
  auto experts_gemm = [&](const GemmInput& x, const GemmWeight& w, std::optional<ops::QuantizedTensor>& w8,
                          const Tensor& offsets, const Tensor& out, ops::GroupRange groups) {
    if (cfg.precision != Precision::fp8) return void(grouped_linear(x, w, offsets, out, groups));
    if (!w8) w8 = ops::quantize_fp8_weight(w.master);
    ops::grouped_matmul_fp8(x.fp8, *w8, offsets, out, groups);
  };
  parallel::ExpertDispatcher::FirstGemm first;
  if (!experts.shadows())
    first = {a.w13.master.size(1),
             [&](const Tensor& rows, const Tensor& scale, const Tensor& offsets, const Tensor& out) {
               experts_gemm(arrived_input(rows, scale, cfg.precision), a.w13, w13_fp8, offsets, out, {});
             }};
  SliceRun run(streams, a.slices.size());
  for (size_t i = 0; i < a.slices.size(); ++i) {
    MoeSlice& s = a.slices[i];
    ops::Permutation perm;
    run.on_slice(i, [&] {
      perm = ops::permute(x.slice(0, s.begin, s.end), a.idx.slice(0, s.begin, s.end), E);
      s.offsets = perm.offsets, s.row_of = perm.row_of;
    });
    run.on_comm(i, [&] { s.routed = experts.dispatch(perm.x, perm.offsets, {layer, int(i)}, {w.w13, w.w2}, first); });
  }
  if (experts.shadows()) {  // one slice (the plan refuses more): all on this stream
    const MoeSlice& s = a.slices.front();
    a.w13 = gemm_weight(s.routed.w13, cfg.precision), a.w2 = gemm_weight(s.routed.w2, cfg.precision);
  }
  for (size_t i = 0; i < a.slices.size(); ++i) {
    MoeSlice& s = a.slices[i];
    Tensor y;
    run.on_slice(i, [&] {
      const int64_t R = s.routed.rows.size(0);
      s.xp = arrived_input(s.routed.rows, s.routed.scale, cfg.precision);
      s.routed.rows = s.routed.scale = Tensor();  // kept as the GEMM read it (s.xp), not also in f32
      s.gu = std::exchange(s.routed.first, Tensor());  // [a1 | a3] (R,2F)
      if (!s.gu.defined()) {
        s.gu = Tensor::empty({R, a.w13.master.size(1)});
        experts_gemm(s.xp, a.w13, w13_fp8, s.routed.offsets, s.gu, {});
      }
      s.g = gemm_input(ops::swiglu(s.gu), cfg.precision);  // silu(a1) * a3 (R,F)
      y = Tensor::empty({R, C});                           // w2's rows
    });
    run.on_comm(i, [&] {
      s.ye = experts.matmul_combine(y, [&](const Tensor& out, int64_t begin, int64_t end) {
        experts_gemm(s.g, a.w2, w2_fp8, s.routed.offsets, out, {begin, end});
      }, s.routed);
    });
    run.on_slice(i, [&] { ops::unpermute(s.ye, s.row_of, a.w.slice(0, s.begin, s.end), routed_y.slice(0, s.begin, s.end)); });
  }
  // --- shared experts: y += SwiGLU_shared(x), while the slices run; their
  // input is cast again in the backward rather than kept next to the f32 x
  Tensor shared;
  if (w.sw13.defined()) shared = mlp_forward(gemm_input(x, cfg.precision), w.sw13, w.sw2, a.shared);
  run.join();
  const Tensor y = shared.defined() ? ops::add(routed_y, shared) : routed_y;
  // Under tensor parallelism the experts (routed and shared) are one region:
  // each rank's hidden units give a part of y, summed on exit.
  return tp.exit(y);
}

Tensor moe_backward(const Tensor& dy, const Tensor& x_in, const MoeParams& w, const MoeGrads& g,
                    const ModelConfig& cfg, int64_t B, parallel::ExpertDispatcher& experts,
                    parallel::TensorParallel& tp, MoeStreams& streams, const MoeActs& a, float aux_scale,
                    WgradSink& sink) {
  const Tensor dyr = tp.exit_backward(dy);  // the experts' region (tensor parallelism)
  const int64_t N = dyr.size(0), C = dyr.size(1);
  // the experts' weight gradients are held until dx's sum over the TP ranks
  // has left on the communication stream, and run while it is in flight
  HeldJobs held(sink);
  // --- per token slice, the forward's mirror: combine (y_n += w_k ye_r  =>
  // dye_r = w_k dy_n, dw_k = dy_n . ye_r), back to the experts' PEs, the
  // experts' input gradients, return; then xp_r = x_n  =>  dx_n += dxp_r
  const Tensor dx_routed = Tensor::empty({N, C}), dweights = Tensor::empty(a.w.shape());
  std::vector<Tensor> dye(a.slices.size()), dgu(a.slices.size());
  SliceRun run(streams, a.slices.size());
  for (size_t i = 0; i < a.slices.size(); ++i) {
    const MoeSlice& s = a.slices[i];
    Tensor dyp;
    run.on_slice(i, [&] {
      dyp = ops::unpermute_backward(dyr.slice(0, s.begin, s.end), s.ye, s.row_of, a.w.slice(0, s.begin, s.end), {},
                                    dweights.slice(0, s.begin, s.end))
                .dyp;
    });
    run.on_comm(i, [&] { dye[i] = experts.combine_backward(dyp, s.routed); });
  }
  // --- shared experts, while the slices' exchanges run
  Tensor dx;
  if (w.sw13.defined()) dx = mlp_backward(dyr, gemm_input(a.x, cfg.precision), a.shared, g.sw13, g.sw2, held);
  for (size_t i = 0; i < a.slices.size(); ++i) {
    const MoeSlice& s = a.slices[i];
    Tensor drows, dxp;
    run.on_slice(i, [&] {
      const Tensor dg = grouped_linear_dgrad(dye[i], cfg.precision, a.w2, s.routed.offsets);
      dgu[i] = ops::swiglu_backward(dg, s.gu);
      drows = grouped_linear_dgrad(dgu[i], cfg.precision, a.w13, s.routed.offsets);
    });
    run.wait_for(i);  // the weight gradients below need the slice's dgu, not its exchange back
    run.on_comm(i, [&] { dxp = experts.dispatch_backward(drows, s.routed); });
    run.on_slice(i, [&] { ops::permute_backward(dxp, s.row_of, dx_routed.slice(0, s.begin, s.end)); });
  }
  // --- the experts' weight gradients, each over every slice's rows in the
  // order one unsliced exchange has them: the same sums as without slices.
  // Sliced, they run while the last exchanges are in flight; unsliced, they
  // are held, to run while dx's sum over the TP ranks is.
  const MoeSlice& s0 = a.slices.front();
  if (a.slices.size() == 1) {
    RowSources src13{s0.routed.sources, s0.routed.source_offsets, {}}, src2 = src13;
    if (s0.routed.exchange_parts) {  // shadowed experts: the parts go home
      src13.exchange = [d = s0.routed](const Tensor& parts) { d.exchange_parts(parts, 0); };
      src2.exchange = [d = s0.routed](const Tensor& parts) { d.exchange_parts(parts, 1); };
    }
    grouped_linear_wgrad(dye[0], s0.g, s0.routed.offsets, g.w2, held, src2);
    grouped_linear_wgrad(dgu[0], s0.xp, s0.routed.offsets, g.w13, held, src13);
  } else {
    std::vector<Tensor> groups;
    for (const MoeSlice& s : a.slices) groups.push_back(s.routed.source_offsets);
    auto join = [&](const std::vector<Tensor>& rows) { return ops::concat_groups(rows, groups); };
    const ops::GroupedRows dye_all = join(dye);
    const RowSources joined_src{s0.routed.sources, dye_all.offsets};
    grouped_linear_wgrad(dye_all.rows, joined_input(a.slices, &MoeSlice::g, groups), dye_all.offsets, g.w2, sink,
                         joined_src);
    grouped_linear_wgrad(join(dgu).rows, joined_input(a.slices, &MoeSlice::xp, groups), dye_all.offsets, g.w13,
                         sink, joined_src);
  }
  run.join();
  dx = tp.enter_backward_async(dx.defined() ? ops::add(dx, dx_routed) : dx_routed);
  held.release();
  // --- gate weights -> affinities (through the pre-capacity selection: the
  // sigmoid renormalization also sees dropped experts) (+ balance loss);
  // under tensor parallelism ye, and so dw_k, is this rank's part
  const ops::Routing sel{a.sel_idx, a.sel_w};
  Tensor dscores = ops::topk_route_backward(tp.all_reduce(dweights), a.scores, sel, topk_config(cfg));
  if (cfg.aux_loss_alpha > 0)
    dscores = ops::add(dscores, ops::sequence_balance_loss_backward(a.scores, a.sel_idx, B,
                                                                    cfg.aux_loss_alpha, aux_scale));
  // --- affinities -> router logits;  s = x R^T  =>  dx += ds R,  dR = ds^T x
  // (every rank computed ds whole; under sequence parallelism each takes its
  // rows, and its dR is a part of the sum over the TP ranks)
  const Tensor ds = ops::router_scores_backward(dscores, a.scores, score_func(cfg));
  tp.join();  // dx is summed
  return linear_backward(tp.sequence_shard(ds), x_in, w.router, g.router, sink, &dx);
}

}  // namespace coremesh::model::detail
