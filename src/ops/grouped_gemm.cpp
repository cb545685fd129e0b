// Grouped GEMM over the four layouts of seed 002, f32/bf16/fp8 inputs, f32
// accumulation. One engine: a kernel enumerates (group, row tile, column tile)
// work units at run time (the group list may come from an earlier kernel) and
// block b of n takes units split_range(total, b, n). Each unit is one
// single-threaded sgemm on f32 operands (converted per block when needed).
#include "coremesh/ops/grouped_gemm.hpp"

#include <cstring>

#include "detail/checks.hpp"
#include "detail/convert.hpp"
#include "detail/fp8_codec.hpp"
#include "detail/launch.hpp"
#include "gemm_engine/sgemm.hpp"

namespace coremesh::ops {
namespace {

using detail::ceil_div;
constexpr int64_t QB = kQuantBlock;
// Blocks split a unit between them at multiples of this many rows.
constexpr int64_t kPieceRows = 16;

// G groups over shared or per-group tensors; see the header for layouts.
struct Problem {
  int64_t G = 0, M = 0, N = 0, K = 0;
  WeightLayout layout = WeightLayout::nk;
  std::vector<Tensor> xs, ws, ys;  // size 1 (shared) or G
  Tensor offsets;                  // defined: x and y rows split by offsets
  Tensor x_scale, w_scale;         // fp8 scales (x: (M,Kb), w: (G,Nb,Kb))
  GroupRange groups;               // the groups computed (end -1: G)
};

struct Span {
  int64_t m = 0;
  const Tensor* x = nullptr;
  int64_t xr = 0;
  const Tensor* y = nullptr;
  int64_t yr = 0;
  const Tensor* w = nullptr;
  int64_t w_index = 0;  // group index inside a stacked (G,...) weight
};

// Spans of all groups, resolved when the kernel runs.
std::vector<Span> resolve(const Problem& p) {
  std::vector<Span> spans(static_cast<size_t>(p.G));
  const int64_t* off = p.offsets.defined() ? p.offsets.data<int64_t>() : nullptr;
  int64_t stacked = 0;
  for (int64_t g = 0; g < p.G; ++g) {
    Span& s = spans[static_cast<size_t>(g)];
    const bool shared_x = p.xs.size() == 1 && off;
    s.x = &p.xs[shared_x ? 0 : g];
    s.m = off ? off[g + 1] - off[g] : s.x->size(0);
    s.xr = off ? off[g] : 0;
    s.y = &p.ys[p.ys.size() == 1 ? 0 : g];
    s.yr = off ? off[g] : (p.ys.size() == 1 ? stacked : 0);
    s.w = &p.ws[p.ws.size() == 1 ? 0 : g];
    s.w_index = p.ws.size() == 1 ? g : 0;
    stacked += s.m;
  }
  if (off) {
    CM_CHECK(off[0] == 0 && off[p.G] <= p.M, "offsets must start at 0 and end at most at M",
             "group offsets [0]={} [G]={} for M={}", off[0], off[p.G], p.M);
    for (int64_t g = 0; g < p.G; ++g)
      CM_CHECK(off[g] <= off[g + 1], "offsets must be non-decreasing",
               "group offsets decrease at group {}: {} > {}", g, off[g], off[g + 1]);
  }
  return spans;
}

// f32 pointer to rows [r0, r0+m) of x (row-major, K columns), converting into
// `scratch` when x is not f32 or is fp8 with scales.
const float* x_rows(const Problem& p, const Span& s, int64_t r0, int64_t m,
                    std::vector<float>& scratch) {
  const int64_t K = p.K, row = s.xr + r0;
  if (s.x->dtype() == DType::f32) return s.x->data<float>() + row * K;
  scratch.resize(static_cast<size_t>(m * K));
  const char* base = static_cast<const char*>(s.x->raw_data()) + row * K * dtype_size(s.x->dtype());
  if (!p.x_scale.defined()) {
    detail::load_float(base, s.x->dtype(), m * K, scratch.data());
    return scratch.data();
  }
  // fp8 with 1xQB tiles: code * scale, one run per tile.
  const uint8_t* code = reinterpret_cast<const uint8_t*>(base);
  const int64_t Kb = ceil_div(K, QB);
  const float* sc = p.x_scale.data<float>() + row * Kb;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t kb = 0; kb < Kb; ++kb) {
      const int64_t at = r * K + kb * QB;
      fp8::decode_scaled(code + at, std::min(QB, K - kb * QB), sc[r * Kb + kb], scratch.data() + at);
    }
  return scratch.data();
}

// f32 pointer to the whole weight of a group, converting when needed.
const float* w_group(const Problem& p, const Span& s, std::vector<float>& scratch) {
  const int64_t NK = p.N * p.K;
  if (s.w->dtype() == DType::f32) return s.w->data<float>() + s.w_index * NK;
  scratch.resize(static_cast<size_t>(NK));
  const char* base =
      static_cast<const char*>(s.w->raw_data()) + s.w_index * NK * dtype_size(s.w->dtype());
  if (!p.w_scale.defined()) {
    detail::load_float(base, s.w->dtype(), NK, scratch.data());
    return scratch.data();
  }
  // fp8 (N,K) codes with (Nb,Kb) block scales: code * scale, one run per row of a block.
  const uint8_t* code = reinterpret_cast<const uint8_t*>(base);
  const int64_t Nb = ceil_div(p.N, QB), Kb = ceil_div(p.K, QB);
  const float* sc = p.w_scale.data<float>() + s.w_index * Nb * Kb;
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t kb = 0; kb < Kb; ++kb) {
      const int64_t at = n * p.K + kb * QB;
      fp8::decode_scaled(code + at, std::min(QB, p.K - kb * QB), sc[n / QB * Kb + kb], scratch.data() + at);
    }
  return scratch.data();
}

void run_forward(const Problem& p) {
  detail::blas_single_thread();
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  for (auto* list : {&p.xs, &p.ws})
    for (const Tensor& t : *list) shapes.push_back(t.shape()), dtypes.push_back(t.dtype());
  const int64_t M = p.M, N = p.N;
  detail::Plan plan = detail::plan(
      "grouped_matmul", detail::KernelKind::cube, shapes, dtypes,
      fmt::format("G={};layout={};offsets={}", p.G, static_cast<int>(p.layout), p.offsets.defined()),
      [&](int max_blocks) {
        detail::Tiling t;
        // Rows per tile: enough units to balance max_blocks blocks, 16..1024
        // rows (a group is one sgemm where that balances: split ones get thin tails).
        t.tile_m = std::clamp<int64_t>(ceil_div(std::max<int64_t>(M, 1), 4 * max_blocks), 16, 1024);
        t.tile_m = ceil_div(t.tile_m, 16) * 16;
        const int64_t row_units = ceil_div(M, t.tile_m) + p.G;
        t.tile_n = row_units >= 2 * max_blocks ? N : std::max<int64_t>(64, ceil_div(N, 2 * max_blocks));
        t.tile_n = std::min(N, ceil_div(t.tile_n, 16) * 16);
        t.block_dim = static_cast<int>(std::min<int64_t>(
            max_blocks, std::max<int64_t>(1, row_units * ceil_div(N, std::max<int64_t>(t.tile_n, 1)))));
        return t;
      });
  if (N == 0) return;
  const int64_t tm = plan.tiling.tile_m, tn = plan.tiling.tile_n;
  // The blocks balance their ends through a RowShare (whole rows only; f32
  // operands, which another block reads in place).
  bool in_place = tn == N && plan.tiling.block_dim > 1;
  for (auto* list : {&p.xs, &p.ws})
    for (const Tensor& t : *list) in_place = in_place && t.dtype() == DType::f32;
  auto share = in_place ? std::make_shared<detail::RowShare>(plan.tiling.block_dim) : nullptr;
  detail::Args args{p.xs, p.ys};
  for (const Tensor& w : p.ws) args.in.add(w);
  for (const Tensor* t : {&p.offsets, &p.x_scale, &p.w_scale})
    if (t->defined()) args.in.add(*t);
  detail::launch(std::move(plan), args, [p, tm, tn, share](const detail::BlockContext& ctx) {
    const std::vector<Span> spans = resolve(p);
    const int64_t N = p.N, K = p.K, g_end = p.groups.end < 0 ? p.G : p.groups.end;
    if (ctx.block_idx == 0 && p.offsets.defined() && g_end == p.G) {  // rows past the last group: zeros
      const int64_t end = p.offsets.data<int64_t>()[p.G];
      float* y = p.ys[0].data<float>();
      std::memset(y + end * N, 0, static_cast<size_t>((p.M - end) * N) * sizeof(float));
    }
    // Units (group, row tile, column tile), split by cost (groups differ in
    // size), a block's first and last unit possibly in part (by rows).
    struct Unit { int64_t g, r0, m, n0, n; };
    std::vector<Unit> units;
    std::vector<int64_t> prefix{0}, rows;
    for (int64_t g = p.groups.begin; g < g_end; ++g)
      for (int64_t r0 = 0; r0 < spans[static_cast<size_t>(g)].m; r0 += tm)
        for (int64_t n0 = 0; n0 < N; n0 += tn) {
          const Unit u{g, r0, std::min(tm, spans[static_cast<size_t>(g)].m - r0), n0, std::min(tn, N - n0)};
          units.push_back(u);
          prefix.push_back(prefix.back() + u.m * u.n);
          rows.push_back(u.m);
        }
    std::vector<float> xbuf, wbuf;
    int64_t w_cached = -1;
    const float* w = nullptr;
    const bool nk = p.layout == WeightLayout::nk;
    const int64_t ldw = nk ? K : N;
    std::vector<detail::GemmPiece> shared;
    for (const detail::UnitRows& piece :
         detail::split_rows_by_cost(prefix, rows, ctx.block_idx, ctx.block_dim, kPieceRows)) {
      const Unit& u = units[static_cast<size_t>(piece.unit)];
      const Span& s = spans[static_cast<size_t>(u.g)];
      const int64_t r0 = u.r0 + piece.r0, m = piece.r1 - piece.r0;
      if (w_cached != u.g) w = w_group(p, s, wbuf), w_cached = u.g;
      const float* x = x_rows(p, s, r0, m, xbuf);
      const float* wn = nk ? w + u.n0 * K : w + u.n0;
      float* y = s.y->data<float>() + (s.yr + r0) * N + u.n0;
      if (share)
        shared.push_back({x, wn, y, m, K});
      else
        detail::sgemm(false, nk, m, u.n, K, 1.0f, x, K, wn, ldw, 0.0f, y, N);
    }
    if (share) detail::sgemm_pieces(share.get(), ctx.block_idx, {false, nk, N, K, ldw, N, 0.0f}, std::move(shared));
  });
}

void check_weight(const Tensor& w, int64_t N, int64_t K, WeightLayout layout, const char* what) {
  detail::check_contiguous(w, what);
  const Shape want = layout == WeightLayout::nk ? Shape{N, K} : Shape{K, N};
  CM_CHECK(w.shape() == want, "every weight must have the same (N,K) or (K,N) shape",
           "{} has shape {}, expected {}", what, shape_str(w.shape()), shape_str(want));
}

void check_offsets(const Tensor& offsets, int64_t G) {
  detail::check_contiguous(offsets, "offsets");
  detail::check_dtype(offsets, DType::i64, "offsets");
  detail::check_shape(offsets, {G + 1}, "offsets");
}

// (N,K) of a stacked weight (G,N,K) [nk] or (G,K,N) [kn].
std::pair<int64_t, int64_t> weight_nk(const Tensor& w, WeightLayout layout) {
  CM_CHECK(w.dim() == 3, "pass stacked weights (G,N,K) or (G,K,N)", "w must be 3-D, got {}",
           w.describe());
  return layout == WeightLayout::nk ? std::pair{w.size(1), w.size(2)} : std::pair{w.size(2), w.size(1)};
}

// The tuner's spaces (any tile sizes are valid: units clip at the edges).
// grouped_matmul: row tiles of 16..1024 rows x the heuristic's column tile,
// its half and its quarter; grouped_matmul_dw: row tiles of dw of 16..1024
// rows. Every block in use.
constexpr int64_t kTileRows[] = {16, 32, 64, 128, 256, 512, 1024};

std::vector<detail::Tiling> grouped_tilings(const runtime::OpKey&, const detail::Tiling& h, int max_blocks) {
  std::vector<detail::Tiling> out;
  for (int64_t tm : kTileRows)
    for (int64_t div : {1, 2, 4}) {
      const int64_t tn = div == 1 ? h.tile_n : ceil_div(ceil_div(h.tile_n, div), 16) * 16;
      if (tn >= 16 || div == 1) out.push_back({max_blocks, h.align, tm, tn});
    }
  return out;
}

std::vector<detail::Tiling> grouped_dw_tilings(const runtime::OpKey& key, const detail::Tiling& h, int max_blocks) {
  const int64_t R = key.shapes.at(1).at(1);  // dw (G,R,C)
  std::vector<detail::Tiling> out;
  for (int64_t tm : kTileRows)
    if (tm < R * 2) out.push_back({max_blocks, h.align, std::min(tm, std::max<int64_t>(R, 1)), 0});
  return out;
}

[[maybe_unused]] const bool registered = runtime::register_op("grouped_matmul", {0, nullptr, grouped_tilings}) &&
                                         runtime::register_op("grouped_matmul_dw", {0, nullptr, grouped_dw_tilings});

void check_groups(GroupRange r, int64_t G) {
  CM_CHECK(0 <= r.begin && r.begin <= G && (r.end < 0 || (r.begin <= r.end && r.end <= G)),
           "pass a group range 0 <= begin <= end <= G (end -1: G)", "groups [{}, {}) of {}", r.begin, r.end, G);
}

}  // namespace

void grouped_matmul_out(const Tensor& x, const Tensor& w, const Tensor& offsets, const Tensor& y,
                        WeightLayout layout, GroupRange groups) {
  detail::check_contiguous(x, "x");
  detail::check_contiguous(w, "w");
  auto [N, K] = weight_nk(w, layout);
  CM_CHECK(x.dim() == 2 && x.size(1) == K, "x must be (M,K) with the weights' K",
           "x {} does not match weights {}", x.describe(), w.describe());
  check_offsets(offsets, w.size(0));
  detail::check_contiguous(y, "y");
  detail::check_shape(y, {x.size(0), N}, "y");
  detail::check_dtype(y, DType::f32, "y");
  for (const auto& [in, name] : {std::pair{x, "x"}, std::pair{w, "w"}, std::pair{offsets, "offsets"}})
    detail::check_disjoint(y, "y", in, name);
  check_groups(groups, w.size(0));
  Problem p{w.size(0), x.size(0), N, K, layout, {x}, {w}, {y}, offsets, {}, {}, groups};
  run_forward(p);
}

Tensor grouped_matmul(const Tensor& x, const Tensor& w, const Tensor& offsets, WeightLayout layout) {
  auto [N, K] = weight_nk(w, layout);
  Tensor y = Tensor::empty({x.dim() == 2 ? x.size(0) : 0, N});
  grouped_matmul_out(x, w, offsets, y, layout);
  return y;
}

Tensor grouped_matmul(const Tensor& x, const std::vector<Tensor>& ws, const Tensor& offsets,
                      WeightLayout layout) {
  CM_CHECK(!ws.empty(), "pass at least one weight", "empty weight list");
  const int64_t N = layout == WeightLayout::nk ? ws[0].size(0) : ws[0].size(1);
  const int64_t K = layout == WeightLayout::nk ? ws[0].size(1) : ws[0].size(0);
  for (const Tensor& w : ws) check_weight(w, N, K, layout, "ws[g]");
  detail::check_contiguous(x, "x");
  CM_CHECK(x.dim() == 2 && x.size(1) == K, "x must be (M,K)", "x {} vs K={}", x.describe(), K);
  const int64_t G = static_cast<int64_t>(ws.size());
  check_offsets(offsets, G);
  Tensor y = Tensor::empty({x.size(0), N});
  run_forward(Problem{G, x.size(0), N, K, layout, {x}, ws, {y}, offsets, {}, {}});
  return y;
}

std::vector<Tensor> grouped_matmul(const std::vector<Tensor>& xs, const std::vector<Tensor>& ws,
                                   WeightLayout layout) {
  CM_CHECK(!ws.empty() && xs.size() == ws.size(), "pass one x per weight",
           "{} inputs for {} weights", xs.size(), ws.size());
  const int64_t N = layout == WeightLayout::nk ? ws[0].size(0) : ws[0].size(1);
  const int64_t K = layout == WeightLayout::nk ? ws[0].size(1) : ws[0].size(0);
  std::vector<Tensor> ys;
  int64_t M = 0;
  for (size_t g = 0; g < xs.size(); ++g) {
    check_weight(ws[g], N, K, layout, "ws[g]");
    detail::check_contiguous(xs[g], "xs[g]");
    CM_CHECK(xs[g].dim() == 2 && xs[g].size(1) == K, "each x must be (M_g,K)",
             "xs[{}] is {}, K={}", g, xs[g].describe(), K);
    ys.push_back(Tensor::empty({xs[g].size(0), N}));
    M += xs[g].size(0);
  }
  run_forward(Problem{static_cast<int64_t>(ws.size()), M, N, K, layout, xs, ws, ys, {}, {}, {}});
  return ys;
}

Tensor grouped_matmul_stacked(const std::vector<Tensor>& xs, const std::vector<Tensor>& ws,
                              WeightLayout layout) {
  CM_CHECK(!ws.empty() && xs.size() == ws.size(), "pass one x per weight",
           "{} inputs for {} weights", xs.size(), ws.size());
  const int64_t N = layout == WeightLayout::nk ? ws[0].size(0) : ws[0].size(1);
  const int64_t K = layout == WeightLayout::nk ? ws[0].size(1) : ws[0].size(0);
  int64_t M = 0;
  for (size_t g = 0; g < xs.size(); ++g) {
    check_weight(ws[g], N, K, layout, "ws[g]");
    detail::check_contiguous(xs[g], "xs[g]");
    CM_CHECK(xs[g].dim() == 2 && xs[g].size(1) == K, "each x must be (M_g,K)",
             "xs[{}] is {}, K={}", g, xs[g].describe(), K);
    M += xs[g].size(0);
  }
  Tensor y = Tensor::empty({M, N});
  run_forward(Problem{static_cast<int64_t>(ws.size()), M, N, K, layout, xs, ws, {y}, {}, {}, {}});
  return y;
}

Tensor grouped_matmul_fp8(const QuantizedTensor& x, const QuantizedTensor& w, const Tensor& offsets,
                          const Tensor& out, GroupRange groups) {
  detail::check_dtype(x.data, DType::f8e4m3, "x.data");
  detail::check_dtype(w.data, DType::f8e4m3, "w.data");
  detail::check_contiguous(x.data, "x.data");
  detail::check_contiguous(w.data, "w.data");
  auto [N, K] = weight_nk(w.data, WeightLayout::nk);
  const int64_t G = w.data.size(0), M = x.data.size(0);
  CM_CHECK(x.data.dim() == 2 && x.data.size(1) == K, "x must be (M,K)", "x {} vs K={}",
           x.data.describe(), K);
  detail::check_shape(x.scale, {M, ceil_div(K, QB)}, "x.scale");
  detail::check_shape(w.scale, {G, ceil_div(N, QB), ceil_div(K, QB)}, "w.scale");
  check_offsets(offsets, G);
  if (out.defined()) {
    detail::check_dtype(out, DType::f32, "out");
    detail::check_contiguous(out, "out");
    detail::check_shape(out, {M, N}, "out");
  }
  check_groups(groups, G);
  Tensor y = out.defined() ? out : Tensor::empty({M, N});
  run_forward(Problem{G, M, N, K, WeightLayout::nk, {x.data}, {w.data}, {y}, offsets, x.scale, w.scale, groups});
  return y;
}

// y = x w^T per group:  dx = dy w   (the same grouped GEMM with the other layout)
//                       dw[g] = dy_g^T x_g   (kn: dw[g] = x_g^T dy_g)
GroupedMatmulGrads grouped_matmul_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                           const Tensor& offsets, WeightLayout layout,
                                           const Tensor& dw_into, float dw_beta) {
  for (auto* t : {&dy, &x, &w}) detail::check_dtype(*t, DType::f32, "dy/x/w");
  if (dw_into.defined()) detail::check_shape(dw_into, w.shape(), "dw_into");
  auto [N, K] = weight_nk(w, layout);
  const int64_t G = w.size(0), M = x.size(0);
  detail::check_shape(dy, {M, N}, "dy");
  GroupedMatmulGrads grads;
  // dx (M,K) = dy (M,N) @ w_g viewed as (N,K): kn-layout product for nk weights.
  Tensor w_as = w.view({G, layout == WeightLayout::nk ? N : K, layout == WeightLayout::nk ? K : N});
  grads.dx = grouped_matmul(dy, w_as, offsets,
                            layout == WeightLayout::nk ? WeightLayout::kn : WeightLayout::nk);
  grads.dw = dw_into.defined() ? dw_into : Tensor::empty(w.shape());
  grouped_matmul_dw(dy, x, offsets, grads.dw, layout, dw_into.defined() ? dw_beta : 0.0f);
  return grads;
}

void grouped_matmul_dw(const Tensor& dy, const Tensor& x, const Tensor& offsets, const Tensor& dw,
                       WeightLayout layout, float beta) {
  for (auto* t : {&dy, &x}) detail::check_dtype(*t, DType::f32, "dy/x");
  detail::check_contiguous(dw, "dw");
  detail::check_dtype(dw, DType::f32, "dw");
  CM_CHECK(dw.dim() == 3 && dy.dim() == 2 && x.dim() == 2 && dy.size(0) == x.size(0),
           "pass dy (M,N), x (M,K) and dw (G,N,K) [nk] or (G,K,N) [kn]",
           "dy {} x {} dw {}", dy.describe(), x.describe(), dw.describe());
  const int64_t G = dw.size(0), N = dy.size(1), K = x.size(1);
  detail::check_shape(dw, layout == WeightLayout::nk ? Shape{G, N, K} : Shape{G, K, N}, "dw");
  check_offsets(offsets, G);
  // dw: one unit per (group, row block of dw); each unit reduces over the group's rows.
  const int64_t R = layout == WeightLayout::nk ? N : K, C = layout == WeightLayout::nk ? K : N;
  detail::Plan plan = detail::plan(
      "grouped_matmul_dw", detail::KernelKind::cube, {x.shape(), dw.shape()}, {DType::f32},
      fmt::format("layout={}", static_cast<int>(layout)), [&](int max_blocks) {
        detail::Tiling t;
        // ~8 units per block (split by cost: groups differ in rows), tiles of >= 64 rows.
        const int64_t per_group = ceil_div(8 * max_blocks, std::max<int64_t>(G, 1));
        t.tile_m = std::max<int64_t>(64, ceil_div(ceil_div(R, per_group), 16) * 16);
        t.tile_m = std::min(t.tile_m, std::max<int64_t>(R, 1));
        t.block_dim = static_cast<int>(std::min<int64_t>(max_blocks, std::max<int64_t>(1, G * ceil_div(R, t.tile_m))));
        return t;
      });
  if (G == 0 || R == 0) return;
  const int64_t tr = plan.tiling.tile_m, nt = ceil_div(R, tr);
  // The blocks balance their ends through a RowShare (all operands are f32).
  auto share = plan.tiling.block_dim > 1 ? std::make_shared<detail::RowShare>(plan.tiling.block_dim) : nullptr;
  detail::launch(std::move(plan), {beta == 0.0f ? std::vector<Tensor>{dy, x, offsets} : std::vector<Tensor>{dy, x, offsets, dw}, {dw}},
                 [dy, x, dw, offsets, G, N, K, R, C, tr, nt, layout, beta, share](const detail::BlockContext& ctx) {
                   const int64_t* off = offsets.data<int64_t>();
                   for (int64_t g = 0; g < G; ++g)
                     CM_CHECK(off[0] == 0 && off[g] <= off[g + 1] && off[G] <= x.size(0),
                              "offsets must start at 0, not decrease and end at most at M",
                              "bad group offsets at group {}", g);
                   // unit u = (group u / nt, row tile u % nt of dw), cost ~ group rows
                   std::vector<int64_t> prefix{0}, tile_rows;
                   for (int64_t u = 0; u < G * nt; ++u) {
                     tile_rows.push_back(std::min(tr, R - u % nt * tr));
                     prefix.push_back(prefix.back() + (off[u / nt + 1] - off[u / nt]) * tile_rows.back());
                   }
                   // nk: dw[n,k] = sum_m dy[m,n] x[m,k];  kn: dw[k,n] = sum_m x[m,k] dy[m,n]
                   const bool nk = layout == WeightLayout::nk;
                   const int64_t lda = nk ? N : K, ldb = nk ? K : N;
                   std::vector<detail::GemmPiece> pieces;
                   for (const detail::UnitRows& piece : detail::split_rows_by_cost(
                            prefix, tile_rows, ctx.block_idx, ctx.block_dim, kPieceRows)) {
                     const int64_t u = piece.unit, g = u / nt, r0 = u % nt * tr + piece.r0;
                     const int64_t rows = piece.r1 - piece.r0;
                     const int64_t m0 = off[g], m = off[g + 1] - off[g];
                     float* out = dw.data<float>() + g * R * C + r0 * C;
                     const float* xg = x.data<float>() + m0 * K;
                     const float* dyg = dy.data<float>() + m0 * N;
                     pieces.push_back({nk ? dyg + r0 : xg + r0, nk ? xg : dyg, out, rows, m});
                   }
                   detail::sgemm_pieces(share.get(), ctx.block_idx, {true, false, C, lda, ldb, C, beta},
                                        std::move(pieces));
                 });
}

}  // namespace coremesh::ops
