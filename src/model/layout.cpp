// layout_params(): which parameters exist, their shapes and their place in a
// stage's arena; count_params() and estimate_memory() read it.
#include "coremesh/model/layout.hpp"

#include <fmt/format.h>

#include "coremesh/core/error.hpp"

namespace coremesh::model {

int num_parts(const ModelConfig& c) { return 2 * c.n_layers + 2; }

Part part_at(const ModelConfig& c, int index) {
  CM_CHECK(index >= 0 && index < num_parts(c), "parts are numbered 0 .. 2 * n_layers + 1",
           "no part {} in a model of {} layers", index, c.n_layers);
  if (index == 0) return {PartKind::embedding};
  if (index == num_parts(c) - 1) return {PartKind::head};
  return {index % 2 == 1 ? PartKind::attention : PartKind::ffn, (index - 1) / 2};
}

std::string part_name(const ModelConfig& c, int index) {
  const Part p = part_at(c, index);
  switch (p.kind) {
    case PartKind::embedding: return "embedding";
    case PartKind::head: return "head";
    case PartKind::attention: return fmt::format("layers.{}.attention", p.layer);
    case PartKind::ffn: return fmt::format("layers.{}.ffn", p.layer);
  }
  return "?";
}

StageLayout resolve_stage(const ModelConfig& c, StageLayout s) {
  const int P = num_parts(c), E = c.n_routed_experts;
  if (s.chunks.empty()) s.chunks.push_back({0, P});
  for (size_t i = 0; i < s.chunks.size(); ++i) {
    const PartRange& r = s.chunks[i];
    CM_CHECK(r.begin >= 0 && r.begin < r.end && r.end <= P,
             fmt::format("give each chunk a non-empty range of parts within [0, {}]", P),
             "stage chunk {} covers parts [{}, {})", i, r.begin, r.end);
    for (size_t j = 0; j < i; ++j)
      CM_CHECK(r.end <= s.chunks[j].begin || r.begin >= s.chunks[j].end,
               "chunks of one stage must not overlap", "stage chunks {} and {} overlap", j, i);
  }
  CM_CHECK(s.tp >= 1 && s.tp_rank >= 0 && s.tp_rank < s.tp, "give a tensor-parallel rank in [0, tp)",
           "tp rank {} of {}", s.tp_rank, s.tp);
  CM_CHECK(!s.sequence_parallel || s.tp > 1, "set tp to 2 or more, or drop sequence_parallel",
           "sequence parallelism over tp {}", s.tp);
  if (s.tp > 1) {
    const auto problems = tp_problems(c, s.tp);
    CM_CHECK(problems.empty(), problems.empty() ? "" : problems.front(), "the model cannot be split over tp {}", s.tp);
  }
  if (s.expert_end < 0) s.expert_end = E;
  CM_CHECK(s.expert_begin >= 0 && s.expert_begin <= s.expert_end && s.expert_end <= E,
           fmt::format("hold a range of experts inside [0, {}]", E),
           "expert range [{}, {}) of a model with {} routed experts", s.expert_begin, s.expert_end, E);
  return s;
}

std::vector<std::string> tp_problems(const ModelConfig& c, int tp) {
  std::vector<std::string> out;
  if (tp <= 1) return out;
  auto need = [&](int64_t size, const char* what) {
    if (size % tp != 0)
      out.push_back(fmt::format("choose tp dividing {} ({}), or change it to a multiple of tp {}", what, size, tp));
  };
  need(c.vocab_size, "model.vocab_size");
  need(c.n_heads, "model.n_heads");
  need(c.dense_hidden, "model.dense_hidden");
  need(int64_t(c.n_shared_experts) * c.expert_hidden, "model.n_shared_experts x model.expert_hidden");
  if (c.n_routed_experts > 0) need(c.expert_hidden, "model.expert_hidden");
  if (c.n_kv_heads % tp != 0 && tp % c.n_kv_heads != 0)
    out.push_back(fmt::format("choose tp dividing model.n_kv_heads ({}) or a multiple of it: key/value heads are "
                              "split or replicated whole", c.n_kv_heads));
  return out;
}

TpShape tp_shape(const ModelConfig& c, const StageLayout& s) {
  const int tp = s.tp;
  TpShape t;
  t.heads = c.n_heads / tp;
  t.dense_hidden = c.dense_hidden / tp;
  t.shared_hidden = int64_t(c.n_shared_experts) * c.expert_hidden / tp;
  t.expert_hidden = c.expert_hidden / tp;
  t.vocab = c.vocab_size / tp, t.vocab_begin = s.tp_rank * t.vocab;
  if (c.n_kv_heads % tp == 0) {
    t.kv_heads = c.n_kv_heads / tp, t.kv_head_begin = s.tp_rank * t.kv_heads;
  } else {  // tp a multiple of the kv heads: this rank's query heads all read one kv head
    t.kv_sharing = tp / c.n_kv_heads;
    t.kv_heads = 1, t.kv_head_begin = s.tp_rank / t.kv_sharing;
  }
  return t;
}

namespace {

// The view of `whole` that the stage's part of p is.
Tensor part_view(const ParamInfo& p, const Tensor& whole) {
  Tensor t = whole.view(p.tp_dim >= 0 ? p.tp_view : p.whole_shape);
  if (p.expert()) t = t.slice(0, p.expert_begin, p.expert_begin + p.shape[0]);
  if (p.tp_dim >= 0) t = t.slice(p.tp_dim, p.tp_begin, p.tp_begin + p.tp_size);
  return t;
}

}  // namespace

Tensor held_part(const ParamInfo& p, const Tensor& whole) { return part_view(p, whole).contiguous().view(p.shape); }

void place_part(const ParamInfo& p, const Tensor& part, Tensor& whole) {
  Tensor t = part_view(p, whole);
  t.copy_from(part.view(t.shape()));
}

std::string param_group_name(ParamGroup g) {
  switch (g) {
    case ParamGroup::embedding: return "embedding";
    case ParamGroup::dense: return "dense";
    case ParamGroup::router: return "router";
    case ParamGroup::expert: return "expert";
    case ParamGroup::norm: return "norm";
  }
  return "?";
}

std::string tp_axis_name(TpAxis a) {
  switch (a) {
    case TpAxis::none: return "none";
    case TpAxis::column: return "column";
    case TpAxis::row: return "row";
    case TpAxis::vocab: return "vocab";
  }
  return "?";
}

int ParamLayout::index_of(const std::string& name) const {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].name == name) return static_cast<int>(i);
  return -1;
}

namespace {

bool same_chunk(const StageLayout& s, int a, int b) {
  for (const PartRange& r : s.chunks)
    if (a >= r.begin && a < r.end) return b >= r.begin && b < r.end;
  return false;
}

// Appends parameters to the arena of one part region.
struct Builder {
  ParamLayout& out;
  int part = 0;
  int64_t expert_begin = 0, experts = 0;  // the first routed expert held, of how many
  int tp = 1, tp_rank = 0;
  bool sequence_parallel = false;
  // How the next parameter is split over TP: its whole shape, the dimension
  // cut (-1: none), where this rank's slice starts, how many ranks hold it.
  struct Split {
    Shape whole, view;  // the whole tensor's shape, and the view cut in `dim`
    int dim = -1;
    int64_t begin = 0, size = 0;
    int copies = 0;  // 0: every TP rank (unsplit)
    bool first = true;
  };
  Split split;
  // Parameters are 64-byte aligned, except that a parameter with fuse_next is
  // directly followed by the next one, so that adjacent weights multiplied by
  // the same input ([wq; wk; wv], [w1; w3]) are one matrix view: one GEMM.
  void add(const std::string& name, const Shape& shape, ParamGroup group, TpAxis axis,
           bool fuse_next = false) {
    ParamInfo p;
    p.name = name, p.shape = shape, p.numel = shape_numel(shape), p.offset = out.arena_size;
    p.part = part, p.group = group, p.tp_axis = axis;
    p.weight_decay = group != ParamGroup::norm;
    p.expert_begin = group == ParamGroup::expert ? expert_begin : 0;
    p.whole_shape = split.whole.empty() ? shape : split.whole;
    if (group == ParamGroup::expert) p.whole_shape[0] = experts;
    p.tp_view = split.view.empty() ? p.whole_shape : split.view;
    if (group == ParamGroup::expert) p.tp_view[0] = experts;
    p.tp_dim = split.dim, p.tp_begin = split.begin, p.tp_size = split.size;
    p.tp_copies = split.copies == 0 ? tp : split.copies, p.tp_first = split.first;
    // sequence parallel: the norms and routers see 1/tp of the tokens (the
    // routers' input is gathered, but their backward runs on this rank's rows)
    p.tp_partial_grad = (split.dim >= 0 && p.tp_copies > 1) ||
                        (sequence_parallel && (group == ParamGroup::norm || group == ParamGroup::router));
    split = {};
    p.tp_first = p.tp_first && (p.tp_dim >= 0 || tp_rank == 0);
    out.arena_size += fuse_next ? p.numel : (p.numel + 15) / 16 * 16;
    out.params.push_back(std::move(p));
  }
};

}  // namespace

ParamLayout layout_params(const ModelConfig& c, const StageLayout& stage_in) {
  const StageLayout stage = resolve_stage(c, stage_in);
  const int64_t C = c.d_model, D = c.head_dim(), V = c.vocab_size, F = c.expert_hidden,
                SF = int64_t(c.n_shared_experts) * F, El = stage.expert_end - stage.expert_begin;
  const int P = num_parts(c), E = c.n_routed_experts;
  ParamLayout out;
  out.regions.assign(size_t(P), {});
  out.region_offset.assign(size_t(P), 0);
  out.region_size.assign(size_t(P), 0);
  Builder b{out, 0, stage.expert_begin, E};
  b.tp = stage.tp, b.tp_rank = stage.tp_rank, b.sequence_parallel = stage.sequence_parallel;
  using G = ParamGroup;
  using A = TpAxis;
  // Tensor parallelism: the next parameter is this rank's slice [begin,
  // begin + size) along dim of a whole tensor `whole` (seen as `view`),
  // held by `copies` ranks.
  const TpShape ts = tp_shape(c, stage);
  const int r = stage.tp_rank;
  auto cut = [&](Shape whole, int dim, int64_t begin, int64_t size, int copies = 1, Shape view = {}) {
    if (stage.tp > 1) b.split = {std::move(whole), std::move(view), dim, begin, size, copies, r % copies == 0};
  };
  const int64_t H = stage.tp > 1 ? ts.heads : c.n_heads, Hkv = stage.tp > 1 ? ts.kv_heads : c.n_kv_heads,
                Fd = stage.tp > 1 ? ts.dense_hidden : c.dense_hidden, SFl = stage.tp > 1 ? ts.shared_hidden : SF,
                Fe = stage.tp > 1 ? ts.expert_hidden : F, Vl = stage.tp > 1 ? ts.vocab : V;
  for (int part = 0; part < P; ++part) {
    if (!holds_part(stage, part)) continue;
    b.part = part;
    const int first = static_cast<int>(out.params.size());
    out.region_offset[size_t(part)] = out.arena_size;
    const Part pt = part_at(c, part);
    const std::string l = "layers." + std::to_string(pt.layer) + ".";
    switch (pt.kind) {
      case PartKind::embedding:
        cut({V, C}, 0, ts.vocab_begin, Vl);
        b.add("wte", {Vl, C}, G::embedding, A::vocab);
        break;
      case PartKind::attention:
        b.add(l + "attn_norm", {C}, G::norm, A::none);
        cut({c.n_heads * D, C}, 0, r * H * D, H * D);
        b.add(l + "wq", {H * D, C}, G::dense, A::column, /*fuse_next=*/true);
        cut({c.n_kv_heads * D, C}, 0, ts.kv_head_begin * D, Hkv * D, ts.kv_sharing);
        b.add(l + "wk", {Hkv * D, C}, G::dense, A::column, /*fuse_next=*/true);
        cut({c.n_kv_heads * D, C}, 0, ts.kv_head_begin * D, Hkv * D, ts.kv_sharing);
        b.add(l + "wv", {Hkv * D, C}, G::dense, A::column);
        cut({C, c.n_heads * D}, 1, r * H * D, H * D);
        b.add(l + "wo", {C, H * D}, G::dense, A::row);
        break;
      case PartKind::ffn:
        b.add(l + "ffn_norm", {C}, G::norm, A::none);
        if (!c.is_moe_layer(pt.layer)) {
          cut({c.dense_hidden, C}, 0, r * Fd, Fd);
          b.add(l + "w1", {Fd, C}, G::dense, A::column, /*fuse_next=*/true);
          cut({c.dense_hidden, C}, 0, r * Fd, Fd);
          b.add(l + "w3", {Fd, C}, G::dense, A::column);
          cut({C, c.dense_hidden}, 1, r * Fd, Fd);
          b.add(l + "w2", {C, Fd}, G::dense, A::row);
          break;
        }
        b.add(l + "router", {c.n_routed_experts, C}, G::router, A::none);
        // [w1_e; w3_e], under TP this rank's hidden units of each: (E, 2, F, C) cut in F
        cut({E, 2 * F, C}, 2, r * Fe, Fe, 1, {E, 2, F, C});
        b.add(l + "experts.w13", {El, 2 * Fe, C}, G::expert, A::column);
        cut({E, C, F}, 2, r * Fe, Fe);
        b.add(l + "experts.w2", {El, C, Fe}, G::expert, A::row);
        if (SF > 0) {
          cut({SF, C}, 0, r * SFl, SFl);
          b.add(l + "shared.w1", {SFl, C}, G::dense, A::column, /*fuse_next=*/true);
          cut({SF, C}, 0, r * SFl, SFl);
          b.add(l + "shared.w3", {SFl, C}, G::dense, A::column);
          cut({C, SF}, 1, r * SFl, SFl);
          b.add(l + "shared.w2", {C, SFl}, G::dense, A::row);
        }
        break;
      case PartKind::head:
        b.add("final_norm", {C}, G::norm, A::none);
        if (!c.tied_embeddings) {
          cut({V, C}, 0, ts.vocab_begin, Vl);
          b.add("lm_head", {Vl, C}, G::embedding, A::vocab);
        } else if (!same_chunk(stage, 0, part)) {  // the tied table lives in another chunk or stage
          cut({V, C}, 0, ts.vocab_begin, Vl);
          b.add("wte", {Vl, C}, G::embedding, A::vocab);
          out.params.back().tied_replica = true;
        }
        break;
    }
    out.regions[size_t(part)] = {first, static_cast<int>(out.params.size())};
    out.region_size[size_t(part)] = out.arena_size - out.region_offset[size_t(part)];
  }
  return out;
}

ParamCount count_params(const ModelConfig& c, const StageLayout& stage) {
  ParamCount n;
  const double inactive = c.n_routed_experts > 0
      ? double(c.n_routed_experts - c.top_k) / double(c.n_routed_experts) : 0.0;
  for (const ParamInfo& p : layout_params(c, stage).params) {
    if (p.tied_replica) continue;  // the same parameter as the embedding's
    n.total += p.numel;
    if (p.group == ParamGroup::embedding) n.embedding += p.numel;
    if (p.expert()) n.expert += p.numel;
  }
  n.active = n.total - static_cast<int64_t>(double(n.expert) * inactive + 0.5);
  return n;
}

double flops_per_token(const ModelConfig& c, int seq_len) {
  ParamCount p = count_params(c);
  // The embedding lookup is not a matmul; the LM head is (tied or not).
  double matmul_params = double(p.active) - double(c.vocab_size) * c.d_model * (c.tied_embeddings ? 0 : 1);
  double attn = 6.0 * c.n_layers * double(seq_len) * c.n_heads * c.head_dim();
  return 6.0 * matmul_params + attn;
}

MemoryEstimate estimate_memory(const ModelConfig& c, int micro_batch, int seq_len,
                               const StageLayout& stage_in) {
  const StageLayout stage = resolve_stage(c, stage_in);
  const ParamLayout layout = layout_params(c, stage);
  MemoryEstimate m;
  int64_t held = 0;
  for (const ParamInfo& p : layout.params) held += p.numel;
  m.weights = held * 4;
  m.gradients = held * 4;
  m.optimizer = held * 8;
  const TpShape t = tp_shape(c, stage);  // this TP rank's heads and hidden units
  const int64_t N = int64_t(micro_batch) * seq_len, C = c.d_model, D = c.head_dim(),
                H = t.heads, Hkv = t.kv_heads, V = t.vocab, E = c.n_routed_experts,
                El = stage.expert_end - stage.expert_begin, K = c.top_k, F = t.expert_hidden,
                SF = t.shared_hidden, Fd = t.dense_hidden;
  // One saved row of `width` elements that only a block GEMM reads (its
  // input, kept for the wgrad): f32, bf16, or fp8 codes + one f32 scale per 128.
  auto gemm_row = [&](int64_t width) -> int64_t {
    switch (c.precision) {
      case Precision::f32: return 4 * width;
      case Precision::bf16: return 2 * width;
      case Precision::fp8: return width + 4 * ((width + 127) / 128);
    }
    return 4 * width;
  };
  // Per token, f32: attention half: its input x (the residual stream), q k v
  // after RoPE, the attention output (its backward reads it), log-sum-exp and
  // rstd; RMSNorm(x) as a GEMM input (wo casts the f32 attention output again).
  const int64_t attn = 4 * (C + (H + 2 * Hkv) * D + H * D + H + 1) + gemm_row(C);
  // FFN half: h and rstd; dense: gu = [a1 | a3] f32 (the swiglu backward),
  // RMSNorm(h) and g as GEMM inputs.
  const int64_t ffn = 4 * (C + 1);
  const int64_t dense = 4 * 2 * Fd + gemm_row(C) + gemm_row(Fd);
  // MoE: RMSNorm(h) f32 (the router is f32; the shared experts cast it again),
  // scores (E), the (N,K) routing: selections (i32 + f32), after capacity a
  // second pair when a capacity applies, row_of (i64); shared experts gu f32,
  // g; per routed row gu and ye f32, xp and g as GEMM inputs.
  const bool capacity = c.expert_capacity(N) >= 0;
  const int64_t routing = K * (8 + (capacity ? 8 : 0) + 8);
  const int64_t moe = 4 * (C + E) + routing + (SF > 0 ? 4 * 2 * SF + gemm_row(SF) : 0);
  const int64_t routed_row = 4 * (2 * F + C) + gemm_row(C) + gemm_row(F);
  // Routed rows per MoE layer: on one PE the micro-batch's N*K. Under expert
  // parallelism (ep = E / El owners) the host sizes an owner's received rows
  // before their counts arrive, for the worst case, every source's rows to
  // its experts (at most El x capacity each), and the experts' per-row
  // tensors follow that size. The exchange keeps each send's source until
  // the next round proves it delivered: per direction, the source's N*K rows
  // and the owner's received rows (f32). Fused (fused_experts), the forward's
  // travel as the first GEMM reads them: the source keeps them in that form,
  // and the owner's received rows are that GEMM's saved input (counted
  // above); while a dispatch runs, each source's GEMM output waits for the
  // regroup (ep x slot rows of 2F f32, fused without shadows).
  // Shadowed experts (expert_balance): this PE's own rows of its experts and
  // of the shadowed ones take at most its N*K, and the weights of its experts
  // and the shadow slots, per micro-batch (kept for the backward; bf16 casts
  // them too).
  const int64_t ep = El > 0 && El < E ? E / El : 1;
  const int64_t shadows = stage.expert_shadows;
  const int64_t slot = capacity ? std::min(N * K, El * c.expert_capacity(N)) : N * K;
  const int64_t routed_rows = ep == 1 ? N * K : (ep - 1) * slot + (shadows > 0 ? N * K : slot);
  const int64_t group_weights = shadows > 0 ? (El + shadows) * 3 * F * C * (c.precision == Precision::bf16 ? 6 : 4) : 0;
  const bool fused = ep > 1 && stage.fused_experts;
  const int64_t forward_exchange = fused ? gemm_row(C) * N * K : 4 * C * (N * K + routed_rows);
  const int64_t exchange_per_layer = ep == 1 ? 0 : 4 * C * (N * K + routed_rows) + forward_exchange;
  const int64_t fused_outputs = fused && shadows == 0 ? 4 * 2 * F * ep * slot : 0;
  // What lives on the residual stream's rows (x, h and their rstd, the final
  // residual; the MoE's RMSNorm(h) under sequence parallelism, where the
  // region keeps its gathered input too) counts per row held: N/tp rows under
  // sequence parallelism; the rest per token of the micro-batch.
  const bool sp = stage.sequence_parallel;
  const int64_t rows = sp ? N / stage.tp : N;
  const int64_t row_attn = 4 * (C + 1), row_head = 4 * (C + 1);
  int64_t largest_part = 0;
  bool attention = false;
  for (int part = 0; part < num_parts(c); ++part) {
    if (!holds_part(stage, part)) continue;
    const Part p = part_at(c, part);
    int64_t bytes = 0;
    switch (p.kind) {
      case PartKind::embedding: bytes = 4 * N; break;  // token ids (i32)
      case PartKind::attention: bytes = (attn - row_attn) * N + row_attn * rows, attention = true; break;
      case PartKind::ffn:
        if (!c.is_moe_layer(p.layer)) {
          bytes = dense * N + ffn * rows;
          break;
        }
        bytes = moe * N + routed_row * routed_rows + (ffn + (sp ? 4 * C : 0)) * rows + 8 * (El + shadows + 1) +
                group_weights;  // + group offsets
        m.exchange += exchange_per_layer;
        break;
      // the final residual and RMSNorm (C each) and rstd, logits and their
      // gradient (this TP rank's V each), log-sum-exp, loss per token, targets (i32)
      case PartKind::head: bytes = (4 * (C + 2 * V + 2) + 4) * N + row_head * rows; break;
    }
    m.activations += bytes;
    largest_part = std::max(largest_part, bytes);
  }
  if (attention) m.activations += 8 * int64_t(seq_len);  // RoPE positions (i64)
  // A part's backward makes the gradients of what it saved (about as large)
  // and of its input while its saved tensors still live.
  m.workspace = std::max(2 * largest_part, fused_outputs);
  // bf16 keeps each block-GEMM weight's bf16 copy from the forward to the
  // backward (the forward and the dgrad read it); fp8 quantizes W in the
  // forward and W^T in the backward where they are used.
  if (c.precision == Precision::bf16)
    for (const ParamInfo& p : layout.params)
      if ((p.group == ParamGroup::dense || p.expert()) && p.shape.size() >= 2) m.weight_copies += 2 * p.numel;
  return m;
}

}  // namespace coremesh::model

namespace coremesh::model {

parallel::StageParams stage_params(const ModelConfig& c, const StageLayout& stage) {
  const ParamLayout l = layout_params(c, stage);
  parallel::StageParams out;
  out.region_offset = l.region_offset, out.region_size = l.region_size, out.arena_size = l.arena_size;
  for (const ParamInfo& p : l.params) {
    parallel::ParamSpan s;
    s.offset = p.offset, s.numel = p.numel, s.part = p.part;
    s.group = p.expert() ? parallel::ReduceGroup::expert
              : p.tp_partial_grad ? parallel::ReduceGroup::tp_shared
                                  : parallel::ReduceGroup::dense;
    s.tp_sharing = p.tp_copies;
    s.tied_replica = p.tied_replica;
    s.counted = (p.tp_first || p.tp_partial_grad) && !p.tied_replica;
    s.weight_decay = p.weight_decay;
    out.params.push_back(s);
  }
  return out;
}

parallel::ModelShape model_shape(const ModelConfig& c, int batch, int seq_len, int tp) {
  parallel::ModelShape s;
  s.layers = c.n_layers;
  for (int l = 0; l < c.n_layers; ++l)
    if (c.is_moe_layer(l)) s.moe_layers.push_back(l);
  s.experts = c.n_routed_experts, s.top_k = c.top_k, s.d_model = c.d_model;
  s.heads = c.n_heads, s.kv_heads = c.n_kv_heads, s.head_dim = c.head_dim();
  StageLayout one;
  one.tp = tp;
  if (tp > 1 && tp_problems(c, tp).empty()) {
    const TpShape t = tp_shape(c, resolve_stage(c, one));
    s.tp_heads = t.heads, s.tp_kv_heads = t.kv_heads, s.tp_expert_hidden = t.expert_hidden;
  } else {
    s.tp_heads = c.n_heads, s.tp_kv_heads = c.n_kv_heads, s.tp_expert_hidden = c.expert_hidden;
  }
  s.batch = batch, s.seq_len = seq_len;
  s.expert_capacity = c.expert_capacity(int64_t(batch) * seq_len);
  s.balance_loss = c.aux_loss_alpha != 0.0f;
  s.selection_margins = c.keeps_selection_margins();
  s.expert_rows = c.precision == Precision::fp8 ? DType::f8e4m3 : c.precision == Precision::bf16 ? DType::bf16 : DType::f32;
  return s;
}

}  // namespace coremesh::model
