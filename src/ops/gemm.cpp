// Dense GEMM: f32/bf16 inputs, transposes, batching, FP8 block-scaled, backward.
// Tiling: the output of each batch is cut into a grid_m x grid_n grid; the
// Bt * grid units are spread over block_dim blocks (<= the cube limit).
#include "coremesh/ops/gemm.hpp"

#include "coremesh/ops/grouped_gemm.hpp"
#include "detail/checks.hpp"
#include "detail/convert.hpp"
#include "detail/launch.hpp"
#include "detail/pointwise.hpp"
#include "gemm_engine/sgemm.hpp"

namespace coremesh::ops {
namespace {

using detail::ceil_div;

// Chooses the grid that minimises the largest tile, using at most `budget`
// tiles and never tiles smaller than kMinTile rows/columns; small problems
// stay on one tile because a block per tile would cost more than it saves.
std::pair<int, int> choose_grid(int64_t m, int64_t n, int64_t k, int64_t budget) {
  constexpr int64_t kMinTile = 16;
  constexpr int64_t kMinFlopsPerTile = 2 * 64 * 64 * 64;
  budget = std::min<int64_t>(budget, std::max<int64_t>(1, 2 * m * n * k / kMinFlopsPerTile));
  std::pair<int, int> best{1, 1};
  int64_t best_cost = INT64_MAX;
  for (int64_t gm = 1; gm <= budget; ++gm) {
    for (int64_t gn = 1; gm * gn <= budget; ++gn) {
      if (gm > 1 && ceil_div(m, gm) < kMinTile) continue;
      if (gn > 1 && ceil_div(n, gn) < kMinTile) continue;
      const int64_t cost = ceil_div(m, gm) * ceil_div(n, gn);
      // On ties prefer the squarer tile (sgemm is slow on thin tiles), then
      // splitting rows (contiguous output).
      const int64_t thin = std::min(ceil_div(m, gm), ceil_div(n, gn));
      const int64_t best_thin = std::min(ceil_div(m, best.first), ceil_div(n, best.second));
      if (cost < best_cost ||
          (cost == best_cost && (thin > best_thin || (thin == best_thin && gm > best.first)))) {
        best_cost = cost;
        best = {static_cast<int>(gm), static_cast<int>(gn)};
      }
    }
  }
  return best;
}

struct Dims {
  int64_t batch, m, n, k;
};

Dims check_matmul(const Tensor& a, const Tensor& b, const Tensor* c, bool ta, bool tb) {
  CM_CHECK((a.dim() == 2 || a.dim() == 3) && (b.dim() == 2 || b.dim() == 3),
           "pass (M,K) / (K,N) matrices or (Bt,.,.) batches", "matmul of {} and {}", a.describe(),
           b.describe());
  for (const Tensor* t : {&a, &b}) {
    detail::check_contiguous(*t, "matmul input");
    CM_CHECK(t->dtype() == DType::f32 || t->dtype() == DType::bf16, "convert inputs to f32 or bf16",
             "matmul input {} is not f32 or bf16", t->describe());
  }
  const int64_t ba = a.dim() == 3 ? a.size(0) : 1, bb = b.dim() == 3 ? b.size(0) : 1;
  CM_CHECK(a.dim() == 2 || b.dim() == 2 || ba == bb, "batched operands need equal batch sizes",
           "batch sizes differ: {} vs {}", a.describe(), b.describe());
  const int64_t m = ta ? a.size(-1) : a.size(-2), k = ta ? a.size(-2) : a.size(-1);
  const int64_t kb = tb ? b.size(-1) : b.size(-2), n = tb ? b.size(-2) : b.size(-1);
  CM_CHECK(k == kb, "op(a) is (M,K), op(b) is (K,N)", "matmul inner sizes differ: {}{} @ {}{}",
           shape_str(a.shape()), ta ? "^T" : "", shape_str(b.shape()), tb ? "^T" : "");
  const int64_t batch = a.dim() == 3 ? ba : bb;  // a 2-D operand is shared by every batch (even none)
  if (c) {
    const Shape want = (a.dim() == 3 || b.dim() == 3) ? Shape{batch, m, n} : Shape{m, n};
    detail::check_shape(*c, want, "c");
    detail::check_dtype(*c, DType::f32, "c");
    detail::check_contiguous(*c, "c");
  }
  return {batch, m, n, k};
}

// f32 view of `count` elements of t starting at element `offset`, converted
// into `scratch` when t is bf16.
const float* f32_elems(const Tensor& t, int64_t offset, int64_t count, std::vector<float>& scratch) {
  if (t.dtype() == DType::f32) return t.data<float>() + offset;
  scratch.resize(static_cast<size_t>(count));
  detail::load_float(static_cast<const char*>(t.raw_data()) + offset * 2, t.dtype(), count,
                     scratch.data());
  return scratch.data();
}

// The grid of the Bt x gm x gn output tiles over at most max_blocks blocks.
detail::Tiling matmul_tiling(const Dims& d, int max_blocks) {
  detail::Tiling t;
  auto [gm, gn] = choose_grid(d.m, d.n, d.k, ceil_div(max_blocks, std::max<int64_t>(d.batch, 1)));
  t.tile_m = ceil_div(std::max<int64_t>(d.m, 1), gm);
  t.tile_n = ceil_div(std::max<int64_t>(d.n, 1), gn);
  t.block_dim = static_cast<int>(std::clamp<int64_t>(d.batch * gm * gn, 1, max_blocks));
  return t;
}

// What a block does with each output tile after computing it (the fused ops
// of graph mode, built from descriptors: see the builders below). Each is
// the eager op's row function on the same operands in the same order, so a
// fused kernel is bit-identical to matmul followed by the op.
struct Epilogue {
  enum class Kind { none, add, bias } kind = Kind::none;
  Tensor x;                  // add: c = x + tile (tile + x if tile_first)
  bool tile_first = false;
  bool in_place = false;     // x is c: the tile goes to a scratch first
  Tensor bias;               // bias: c = tile + bias
};

struct MatmulCall {
  Tensor a, b, c;
  Dims d;
  bool ta, tb;
  float beta;
  int64_t gm, gn;
  std::shared_ptr<detail::RowShare> share;  // null: each block runs its tiles alone
  Epilogue epilogue;
};

void run_matmul_block(const MatmulCall& m, const detail::BlockContext& ctx) {
  const Dims& d = m.d;
  const Tensor &a = m.a, &b = m.b;
  const int64_t gm = m.gm, gn = m.gn;
  const int64_t sa = a.dim() == 3 ? d.m * d.k : 0, sb = b.dim() == 3 ? d.k * d.n : 0;
  auto [u0, u1] = detail::split_range(d.batch * gm * gn, ctx.block_idx, ctx.block_dim);
  std::vector<float> abuf, bbuf, tile;
  const int64_t lda = m.ta ? d.m : d.k, ldb = m.tb ? d.k : d.n;
  int64_t a_cached = -1, b_cached = -1;
  const float *ap_whole = nullptr, *bp = nullptr;
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t bt = u / (gm * gn), t = u % (gm * gn);
    auto [r0, r1] = detail::split_range(d.m, static_cast<int>(t / gn), static_cast<int>(gm));
    auto [c0, c1] = detail::split_range(d.n, static_cast<int>(t % gn), static_cast<int>(gn));
    if (r0 == r1 || c0 == c1) continue;
    // op(a) rows r0..r1: contiguous rows unless transposed.
    const float* ap = nullptr;
    if (!m.ta) {
      ap = f32_elems(a, bt * sa + r0 * d.k, (r1 - r0) * d.k, abuf);
    } else {  // whole (K,M) matrix, converted once per batch
      if (a.dtype() == DType::f32 || a_cached != bt * sa)
        ap_whole = f32_elems(a, bt * sa, d.m * d.k, abuf), a_cached = bt * sa;
      ap = ap_whole + r0;
    }
    if (b.dtype() == DType::f32 || b_cached != bt * sb)
      bp = f32_elems(b, bt * sb, d.k * d.n, bbuf), b_cached = bt * sb;
    const float* bq = m.tb ? bp + c0 * d.k : bp + c0;
    const int64_t at = bt * d.m * d.n + r0 * d.n + c0;
    float* cp = m.c.data<float>() + at;
    const Epilogue& e = m.epilogue;
    if (e.kind == Epilogue::Kind::none) {
      detail::sgemm_pieces(m.share.get(), static_cast<int>(t), {m.ta, m.tb, c1 - c0, lda, ldb, d.n, m.beta},
                           {{ap, bq, cp, r1 - r0, d.k}});
      continue;
    }
    // Fused: the tile as matmul computes it, then the op on its rows.
    const int64_t w = c1 - c0;
    float* out = cp;
    int64_t ldo = d.n;
    if (e.in_place) tile.resize(static_cast<size_t>((r1 - r0) * w)), out = tile.data(), ldo = w;
    detail::sgemm(m.ta, m.tb, r1 - r0, w, d.k, 1.0f, ap, lda, bq, ldb, 0.0f, out, ldo);
    for (int64_t r = 0; r < r1 - r0; ++r) {
      const float* tr = out + r * ldo;
      float* cr = cp + r * d.n;
      if (e.kind == Epilogue::Kind::bias) {
        detail::add_row(tr, e.bias.data<float>() + c0, cr, w);
      } else {
        const float* xr = e.x.data<float>() + at + r * d.n;
        if (e.tile_first) detail::add_row(tr, xr, cr, w);
        else detail::add_row(xr, tr, cr, w);
      }
    }
  }
}

std::string matmul_attrs(bool ta, bool tb, float beta) { return fmt::format("ta={};tb={};beta={}", ta, tb, beta); }

bool attr_true(const runtime::OpDesc& desc, const char* name) { return desc.key.attr(name).value_or("") == "true"; }

// The kernel of a fused matmul: inputs {a, b, third}, output {c}; attrs ta,
// tb. matmul_add: c = x + op(a) op(b) with x the third input (c may be x:
// C += A B; tile_first: the add took the product as its first operand).
// matmul_bias: c = op(a) op(b) + bias.
runtime::Kernel build_fused_matmul(const runtime::OpDesc& desc, Epilogue::Kind kind) {
  CM_CHECK(desc.inputs.size() == 3 && desc.outputs.size() == 1, "pass inputs {a, b, x or bias} and output {c}",
           "{} with {} inputs and {} outputs", desc.key.op, desc.inputs.size(), desc.outputs.size());
  const Tensor &a = desc.inputs[0], &b = desc.inputs[1], &third = desc.inputs[2], &c = desc.outputs[0];
  const bool ta = attr_true(desc, "ta"), tb = attr_true(desc, "tb");
  const Dims d = check_matmul(a, b, &c, ta, tb);
  detail::check_contiguous(third, "x/bias");
  detail::check_dtype(third, DType::f32, "x/bias");
  Epilogue e{kind};
  if (kind == Epilogue::Kind::add) {
    detail::check_shape(third, c.shape(), "x");
    e.x = third;
    e.tile_first = attr_true(desc, "tile_first");
    e.in_place = third.storage() == c.storage();
    CM_CHECK(!e.in_place || third.offset() == c.offset(), "the sum may overwrite x only exactly in place",
             "matmul_add output {} overlaps x {}", c.describe(), third.describe());
  } else {
    detail::check_shape(third, {d.n}, "bias");
    e.bias = third;
  }
  detail::Plan plan = detail::plan_for(desc.key, detail::KernelKind::cube, [&](int mb) { return matmul_tiling(d, mb); });
  MatmulCall m{a, b, c, d, ta, tb, 0.0f, ceil_div(d.m, plan.tiling.tile_m), ceil_div(d.n, plan.tiling.tile_n), nullptr,
               std::move(e)};
  return detail::make_kernel(std::move(plan), {desc.inputs, desc.outputs},
                             [m = std::move(m)](const detail::BlockContext& ctx) { run_matmul_block(m, ctx); });
}

// The tuner's space: every output grid up to 8 x 8 tiles (of >= 16 rows and
// columns) with at most 4 tiles per block, each on as many blocks as it has tiles.
std::vector<detail::Tiling> matmul_tilings(const runtime::OpKey& key, const detail::Tiling&, int max_blocks) {
  const Shape &a = key.shapes.at(0), &b = key.shapes.at(1);
  const bool ta = key.attr("ta").value_or("") == "true", tb = key.attr("tb").value_or("") == "true";
  const int64_t m = ta ? a.back() : a[a.size() - 2], n = tb ? b[b.size() - 2] : b.back();
  const int64_t batch = std::max(a.size() == 3 ? a[0] : 1, b.size() == 3 ? b[0] : 1);
  std::vector<detail::Tiling> out;
  for (int64_t gm = 1; gm <= 8; ++gm)
    for (int64_t gn = 1; gn <= 8; ++gn) {
      if ((gm > 1 && ceil_div(m, gm) < 16) || (gn > 1 && ceil_div(n, gn) < 16) || gm * gn > 4 * max_blocks) continue;
      detail::Tiling t;
      t.tile_m = ceil_div(std::max<int64_t>(m, 1), gm), t.tile_n = ceil_div(std::max<int64_t>(n, 1), gn);
      t.block_dim = static_cast<int>(std::min<int64_t>(max_blocks, batch * gm * gn));
      out.push_back(t);
    }
  return out;
}

[[maybe_unused]] const bool registered =
    runtime::register_op("matmul", {0, nullptr, matmul_tilings}) &&
    runtime::register_op("matmul_add", {0, [](const runtime::OpDesc& d) { return build_fused_matmul(d, Epilogue::Kind::add); },
                                        matmul_tilings}) &&
    runtime::register_op("matmul_bias", {0, [](const runtime::OpDesc& d) { return build_fused_matmul(d, Epilogue::Kind::bias); },
                                         matmul_tilings});

}  // namespace

void matmul_out(const Tensor& a, const Tensor& b, Tensor& c, bool ta, bool tb, float beta) {
  const Dims d = check_matmul(a, b, &c, ta, tb);
  detail::check_disjoint(c, "c", a, "a");
  detail::check_disjoint(c, "c", b, "b");
  detail::blas_single_thread();
  detail::Plan plan = detail::plan("matmul", detail::KernelKind::cube, {a.shape(), b.shape()}, {a.dtype(), b.dtype()},
                                   matmul_attrs(ta, tb, beta), [&](int mb) { return matmul_tiling(d, mb); });
  if (d.batch * d.m * d.n == 0) return;
  const int64_t gm = ceil_div(d.m, plan.tiling.tile_m), gn = ceil_div(d.n, plan.tiling.tile_n);
  // One row tile per block: the blocks balance their ends through a
  // RowShare. Only with f32 operands: another block reads them in place, and
  // a converted copy would die with its block.
  std::shared_ptr<detail::RowShare> share;
  if (d.batch == 1 && gn == 1 && gm > 1 && gm == plan.tiling.block_dim && a.dtype() == DType::f32 &&
      b.dtype() == DType::f32)
    share = std::make_shared<detail::RowShare>(static_cast<int>(gm));
  detail::Args args{{a, b}, {c}};
  if (beta != 0.0f) args.in.add(c);
  MatmulCall m{a, b, c, d, ta, tb, beta, gm, gn, std::move(share), {}};
  detail::launch(std::move(plan), args, [m = std::move(m)](const detail::BlockContext& ctx) { run_matmul_block(m, ctx); });
}

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const Dims d = check_matmul(a, b, nullptr, ta, tb);
  Tensor c = (a.dim() == 3 || b.dim() == 3) ? Tensor::empty({d.batch, d.m, d.n}) : Tensor::empty({d.m, d.n});
  matmul_out(a, b, c, ta, tb);
  return c;
}

// c = op(a) op(b):
//   da = dc op(b)^T        (trans_a: da = op(b) dc^T)
//   db = op(a)^T dc        (trans_b: db = dc^T op(a))
// A shared 2-D operand of a batched product gets the sum over the batch.
MatmulGrads matmul_backward(const Tensor& dc, const Tensor& a, const Tensor& b, bool ta, bool tb) {
  for (const Tensor* t : {&dc, &a, &b}) detail::check_dtype(*t, DType::f32, "matmul_backward input");
  const Dims d = check_matmul(a, b, &dc, ta, tb);
  MatmulGrads g;
  auto flat = [](const Tensor& t) { return t.dim() == 3 ? t.view({-1, t.size(2)}) : t; };
  // da
  if (a.dim() == 2 && dc.dim() == 3) {  // shared a: sum over the batch
    // The first product overwrites (no host-side zeroing: a replayed graph runs none).
    g.da = d.batch ? Tensor::empty(a.shape()) : Tensor::zeros(a.shape());
    for (int64_t i = 0; i < d.batch; ++i) {
      Tensor dci = dc.select(0, i), bi = b.dim() == 3 ? b.select(0, i) : b;
      const float beta = i == 0 ? 0.0f : 1.0f;
      if (!ta) matmul_out(dci, bi, g.da, false, !tb, beta);
      else matmul_out(bi, dci, g.da, tb, true, beta);
    }
  } else {
    g.da = ta ? matmul(b, dc, tb, true) : matmul(dc, b, false, !tb);
  }
  // db
  if (b.dim() == 2 && dc.dim() == 3) {  // shared b: sum over the batch
    g.db = d.batch ? Tensor::empty(b.shape()) : Tensor::zeros(b.shape());
    if (!ta) {  // flatten the batch into rows
      Tensor a2 = flat(a), dc2 = flat(dc);
      if (!tb) matmul_out(a2, dc2, g.db, true, false);
      else matmul_out(dc2, a2, g.db, true, false);
    } else {
      for (int64_t i = 0; i < d.batch; ++i) {
        const float beta = i == 0 ? 0.0f : 1.0f;
        if (!tb) matmul_out(a.select(0, i), dc.select(0, i), g.db, false, false, beta);
        else matmul_out(dc.select(0, i), a.select(0, i), g.db, true, true, beta);
      }
    }
  } else {
    g.db = tb ? matmul(dc, a, true, ta) : matmul(a, dc, !ta, false);
  }
  return g;
}

Tensor matmul_fp8(const QuantizedTensor& x, const QuantizedTensor& w) {
  CM_CHECK(x.data.dim() == 2 && w.data.dim() == 2, "pass x (M,K) and w (N,K)",
           "matmul_fp8 expects 2-D data, got {} and {}", x.data.describe(), w.data.describe());
  Tensor offsets = Tensor::from_vector<int64_t>({0, x.data.size(0)}, {2});
  QuantizedTensor w3{w.data.view({1, w.data.size(0), w.data.size(1)}),
                     w.scale.view({1, w.scale.size(0), w.scale.size(1)})};
  return grouped_matmul_fp8(x, w3, offsets);
}

void matmul_fp8_wgrad_out(const Tensor& dy, const Tensor& x, Tensor& out, float beta) {
  CM_CHECK(dy.dim() == 2 && x.dim() == 2 && dy.size(0) == x.size(0), "pass dy (M,N) and x (M,K) over the same tokens",
           "matmul_fp8_wgrad of {} and {}", dy.describe(), x.describe());
  matmul_out(fp8_round_transposed(dy), fp8_round_transposed(x), out, false, true, beta);
}

Tensor matmul_fp8_wgrad(const Tensor& dy, const Tensor& x) {
  CM_CHECK(dy.dim() == 2 && x.dim() == 2, "pass dy (M,N) and x (M,K)", "matmul_fp8_wgrad of {} and {}",
           dy.describe(), x.describe());
  Tensor out = Tensor::empty({dy.size(1), x.size(1)});
  matmul_fp8_wgrad_out(dy, x, out);
  return out;
}

}  // namespace coremesh::ops
