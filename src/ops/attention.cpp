// Flash attention forward/backward and LSE merge. See attention.hpp for the
// notation: q (B,T,H,D), k/v (B,S,Hkv,D), lse (B,H,T).
#include "coremesh/ops/attention.hpp"

#include <cmath>
#include <cstring>

#include "detail/checks.hpp"
#include "detail/launch.hpp"
#include "detail/vec_math.hpp"
#include "gemm_engine/sgemm.hpp"
#include "gemm_engine/small_gemm.hpp"

namespace coremesh::ops {
namespace {

constexpr int64_t Bc = 128;  // key rows per tile

// The query heads of a GQA group share every K/V tile, so a tile stacks all of
// them (row g*br + r is head hk*G + g at query i0 + r) into about this many
// rows: the group reads K and V once, and the GEMMs get a taller M.
constexpr int64_t kTileRows = 32;

struct Dims {
  int64_t B, T, S, H, Hkv, D;
  float scale;
  bool causal;
  int64_t group() const { return H / Hkv; }
  int64_t query_rows() const { return std::max<int64_t>(8, kTileRows / group()); }  // br per tile
};

Dims check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale) {
  CM_CHECK(std::isfinite(scale), "pass a finite scale (<= 0: 1/sqrt(head size))", "attention scale {}", scale);
  for (const Tensor* t : {&q, &k, &v}) {
    detail::check_contiguous(*t, "q/k/v");
    detail::check_dtype(*t, DType::f32, "q/k/v");
    CM_CHECK(t->dim() == 4, "pass q (B,T,H,D), k and v (B,S,Hkv,D)", "attention input {} is not 4-D",
             t->describe());
  }
  Dims d{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), scale, causal};
  CM_CHECK(k.shape() == v.shape() && k.size(0) == d.B && k.size(3) == d.D,
           "k and v must be (B,S,Hkv,D) with q's B and D", "q {} k {} v {}", q.describe(),
           k.describe(), v.describe());
  CM_CHECK(d.Hkv > 0 && d.H % d.Hkv == 0, "use a number of query heads divisible by kv heads",
           "H={} is not a multiple of Hkv={}", d.H, d.Hkv);
  CM_CHECK(!causal || d.T == d.S, "causal attention needs as many queries as keys",
           "causal attention with T={} and S={}", d.T, d.S);
  if (d.scale <= 0.0f) d.scale = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(d.D, 1)));
  return d;
}

// Number of keys of tile [j0, j0+bc) that query i may see.
inline int64_t allowed(const Dims& d, int64_t i, int64_t j0, int64_t bc) {
  return d.causal ? std::clamp<int64_t>(i - j0 + 1, 0, bc) : bc;
}

// Keys [0, kv_end) that some query of [i0, i0+br) sees: causal skips the rest.
inline int64_t keys_seen(const Dims& d, int64_t i0, int64_t br) { return d.causal ? i0 + br : d.S; }

detail::Plan plan_units(const char* op, const Dims& d, int64_t units) {
  return detail::plan(op, detail::KernelKind::cube, {{d.B, d.T, d.H, d.D}, {d.B, d.S, d.Hkv, d.D}},
                      {DType::f32}, fmt::format("causal={};scale={}", d.causal, d.scale),
                      [&](int max_blocks) {
                        detail::Tiling t;
                        t.tile_m = d.query_rows();
                        t.tile_n = Bc;
                        t.block_dim = static_cast<int>(std::min<int64_t>(max_blocks, std::max<int64_t>(units, 1)));
                        return t;
                      });
}

// Row (b, t, h) of a (B,T,H,D) tensor, and kv head hk's row 0 of a (B,S,Hkv,D) one.
template <typename F>
F* head_row(F* x, const Dims& d, int64_t b, int64_t t, int64_t h) {
  return x + ((b * d.T + t) * d.H + h) * d.D;
}
template <typename F>
F* kv_rows(F* x, const Dims& d, int64_t b, int64_t hk) {
  return x + (b * d.S * d.Hkv + hk) * d.D;
}

// dst (G*br, D) = scale * the stacked rows of group hk at queries [i0, i0+br).
void gather_group(const float* x, const Dims& d, int64_t b, int64_t hk, int64_t i0, int64_t br, float scale,
                  float* __restrict dst) {
  for (int64_t r = 0; r < br; ++r) {  // the group's heads of one query are adjacent in x
    const float* __restrict in = head_row(x, d, b, i0 + r, hk * d.group());
    for (int64_t g = 0; g < d.group(); ++g)
      for (int64_t e = 0; e < d.D; ++e) dst[(g * br + r) * d.D + e] = scale * in[g * d.D + e];
  }
}

// gather_group of dO (unscaled) and, in the same pass, delta[R] = dO_R . O_R
// (the backward's rowsum(dO * O)): O's rows of the group sit where dO's do,
// and 8 partial sums vectorize where a separate dot per row did not.
void gather_dout_delta(const float* dout, const float* out, const Dims& d, int64_t b, int64_t hk, int64_t i0,
                       int64_t br, float* __restrict dst, float* __restrict delta) {
  constexpr int64_t kLanes = 8;
  for (int64_t r = 0; r < br; ++r) {
    const float* __restrict in = head_row(dout, d, b, i0 + r, hk * d.group());
    const float* __restrict o = head_row(out, d, b, i0 + r, hk * d.group());
    for (int64_t g = 0; g < d.group(); ++g) {
      const int64_t R = g * br + r;
      const float *x = in + g * d.D, *y = o + g * d.D;
      float acc[kLanes] = {};
      int64_t e = 0;
      for (; e + kLanes <= d.D; e += kLanes)
        for (int64_t j = 0; j < kLanes; ++j) {
          dst[R * d.D + e + j] = x[e + j];
          acc[j] += x[e + j] * y[e + j];
        }
      float s = 0.0f;
      for (; e < d.D; ++e) dst[R * d.D + e] = x[e], s += x[e] * y[e];
      for (int64_t j = 0; j < kLanes; ++j) s += acc[j];
      delta[R] = s;
    }
  }
}

// The stacked rows back into x: x[b, i0 + r, hk*G + g] = factor(R) * src row R = g*br + r.
template <typename Factor>
void scatter_group(const float* __restrict src, const Dims& d, int64_t b, int64_t hk, int64_t i0, int64_t br,
                   Factor factor, float* x) {
  for (int64_t r = 0; r < br; ++r) {
    float* __restrict o = head_row(x, d, b, i0 + r, hk * d.group());
    for (int64_t g = 0; g < d.group(); ++g) {
      const int64_t R = g * br + r;
      const float f = factor(R);
      for (int64_t e = 0; e < d.D; ++e) o[g * d.D + e] = f * src[R * d.D + e];
    }
  }
}

// Starts loading n rows of `width` floats, ld apart, into the cache ahead of
// use (for writing: owned, so the later stores do not wait for them): the
// operands come from L3 in strided rows that the hardware prefetcher does not
// fetch ahead.
void prefetch_rows(const float* p, int64_t n, int64_t ld, int64_t width, bool for_write = false) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t e = 0; e < width; e += 16) {
      if (for_write)
        __builtin_prefetch(p + i * ld + e, 1);
      else
        __builtin_prefetch(p + i * ld + e);
    }
}

// prefetch_rows for the group's rows of x (B,T,H,D) at queries [i0, i1).
void prefetch_group(const float* x, const Dims& d, int64_t b, int64_t hk, int64_t i0, int64_t i1,
                    bool for_write = false) {
  if (i1 > i0)
    prefetch_rows(head_row(x, d, b, i0, hk * d.group()), i1 - i0, d.H * d.D, d.group() * d.D, for_write);
}

// prefetch_rows for kv head hk's rows [0, n) of x (B,S,Hkv,D).
void prefetch_kv(const float* x, const Dims& d, int64_t b, int64_t hk, int64_t n) {
  prefetch_rows(kv_rows(x, d, b, hk), n, d.Hkv * d.D, d.D);
}

// dst (D, n), leading dimension S: kv head hk's rows [0, n) of x (B,S,Hkv,D)
// transposed, so that q k^T and dO v^T read their right operand row-major
// (see small_gemm.hpp). Done once per unit, where the rows are hot anyway.
void transpose_kv(const float* x, const Dims& d, int64_t b, int64_t hk, int64_t n, float* __restrict dst) {
  const float* __restrict in = kv_rows(x, d, b, hk);
  const int64_t ld = d.Hkv * d.D;
  for (int64_t s0 = 0; s0 < n; s0 += 8) {  // 8 key rows at a time: reads stay in a few lines
    const int64_t s1 = std::min(n, s0 + 8);
    for (int64_t e = 0; e < d.D; ++e)
      for (int64_t s = s0; s < s1; ++s) dst[e * d.S + s] = in[s * ld + e];
  }
}

// Scores of row `s` past its n allowed keys become -inf up to a multiple of
// 8 (within bc); returns that length. row_max and exp_sub_sum then run
// without scalar tails: exp(-inf) gives 0, and masked entries are zeroed
// afterwards all the same.
int64_t mask_row(float* s, int64_t n, int64_t bc) {
  const int64_t padded = std::min(bc, (n + 7) / 8 * 8);
  std::fill(s + n, s + padded, -INFINITY);
  return padded;
}

// Max of n scores. detail::max_of's 16 scalar partial maxima do not
// vectorize with GCC 12; a GCC vector type gets vmaxps.
float row_max(const float* s, int64_t n) {
  using v8 = float __attribute__((vector_size(32)));
  v8 acc = v8{} - INFINITY;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8 x;
    std::memcpy(&x, s + i, sizeof x);
    acc = x > acc ? x : acc;
  }
  float m = -INFINITY;
  for (int j = 0; j < 8; ++j) m = acc[j] > m ? acc[j] : m;
  for (; i < n; ++i) m = s[i] > m ? s[i] : m;
  return m;
}

// Forward scratch: K^T of the group, and one stacked tile of q (pre-scaled),
// scores, output and softmax state (running max m, sum l).
struct ForwardScratch {
  std::vector<float> kt, q, s, o, m, l;
  explicit ForwardScratch(const Dims& d)
      : kt(d.D * d.S), q(d.group() * d.query_rows() * d.D), s(d.group() * d.query_rows() * Bc), o(q.size()),
        m(d.group() * d.query_rows()), l(m.size()) {}
};

// Online softmax of one row of scores s against its n allowed keys (then
// zero up to bc): s becomes exp(s - max) and the running max m, sum l and
// the row's output o (D values) are rescaled to the new max. `first`: o
// holds nothing yet (the tile's P V overwrites it).
void softmax_row(float* s, int64_t n, int64_t bc, bool first, float& m, float& l, float* o, int64_t D) {
  if (n == 0) {
    std::fill(s, s + bc, 0.0f);
    return;
  }
  const int64_t padded = mask_row(s, n, bc);
  const float mx = std::max(m, row_max(s, padded));
  const float rowsum = detail::exp_sub_sum(s, s, padded, mx);
  std::fill(s + n, s + bc, 0.0f);
  const float alpha = m == -INFINITY ? 0.0f : detail::fast_exp(m - mx);
  l = l * alpha + rowsum;
  m = mx;
  if (!first)
    for (int64_t e = 0; e < D; ++e) o[e] *= alpha;
}

// Raw pointers of the forward's operands, taken once per block
// (Tensor::data checks the dtype on every call).
struct ForwardArgs {
  const float *q, *k, *v;
  float *out, *lse;
};

// Forward of kv group (b, hk) for queries [t0, t1): q is pre-scaled, so the
// scores need no extra pass before the exponentials.
void forward_unit(const Dims& d, const ForwardArgs& a, int64_t b, int64_t hk, int64_t t0, int64_t t1,
                  ForwardScratch& w) {
  const int64_t G = d.group(), ldk = d.Hkv * d.D;
  transpose_kv(a.k, d, b, hk, d.causal ? t1 : d.S, w.kt.data());
  const float* V = kv_rows(a.v, d, b, hk);
  for (int64_t i0 = t0; i0 < t1; i0 += d.query_rows()) {
    const int64_t br = std::min(d.query_rows(), t1 - i0), rows = G * br, kv_end = keys_seen(d, i0, br);
    gather_group(a.q, d, b, hk, i0, br, d.scale, w.q.data());
    prefetch_group(a.q, d, b, hk, i0 + br, std::min(t1, i0 + 2 * br));
    prefetch_group(a.out, d, b, hk, i0, i0 + br, /*for_write=*/true);  // written at the tile's end
    std::fill(w.m.begin(), w.m.end(), -INFINITY);
    std::fill(w.l.begin(), w.l.end(), 0.0f);
    for (int64_t j0 = 0; j0 < kv_end; j0 += Bc) {
      const int64_t bc = std::min(Bc, kv_end - j0);
      detail::small_gemm(false, rows, bc, d.D, w.q.data(), d.D, w.kt.data() + j0, d.S, false, w.s.data(), Bc);
      for (int64_t R = 0; R < rows; ++R)
        softmax_row(w.s.data() + R * Bc, allowed(d, i0 + R % br, j0, bc), bc, j0 == 0, w.m[R], w.l[R],
                    w.o.data() + R * d.D, d.D);
      // O (rows,D) (+)= P (rows,bc) V (bc,D)
      detail::small_gemm(false, rows, d.D, bc, w.s.data(), Bc, V + j0 * ldk, ldk, j0 > 0, w.o.data(), d.D);
    }
    if (kv_end == 0) std::fill(w.o.begin(), w.o.end(), 0.0f);
    scatter_group(w.o.data(), d, b, hk, i0, br, [&](int64_t R) { return w.l[R] > 0.0f ? 1.0f / w.l[R] : 0.0f; },
                  a.out);
    for (int64_t R = 0; R < rows; ++R)
      a.lse[(b * d.H + hk * G + R / br) * d.T + i0 + R % br] =
          w.l[R] > 0.0f ? w.m[R] + std::log(w.l[R]) : -INFINITY;
  }
}

// Backward scratch: K^T and V^T of the group, and one stacked tile of q
// (pre-scaled), dO, lse, delta = Dv = rowsum(dO * O), P, dS and dQ.
struct BackwardScratch {
  std::vector<float> kt, vt, q, dout, lse, delta, p, ds, dq;
  explicit BackwardScratch(const Dims& d)
      : kt(d.D * d.S), vt(kt.size()), q(d.group() * d.query_rows() * d.D), dout(q.size()),
        lse(d.group() * d.query_rows()), delta(lse.size()), p(lse.size() * Bc), ds(p.size()), dq(q.size()) {}
};

// P[R,c] = exp(s - lse_R) for allowed keys, else 0 (all 0 for lse = -inf),
// then dS = P * (dP - delta_R) while the row is in L1: P and dP (in dS)
// hold the tile's two score GEMMs.
void probabilities_and_ds(const Dims& d, float* P, float* dS, int64_t rows, int64_t br, int64_t i0, int64_t j0,
                          int64_t bc, const float* lse, const float* delta) {
  for (int64_t R = 0; R < rows; ++R) {
    float *p = P + R * Bc, *ds = dS + R * Bc;
    const int64_t live = std::isfinite(lse[R]) ? allowed(d, i0 + R % br, j0, bc) : 0;
    detail::exp_sub_sum(p, p, mask_row(p, live, bc), lse[R]);
    std::fill(p + live, p + bc, 0.0f);
    for (int64_t c = 0; c < bc; ++c) ds[c] = p[c] * (ds[c] - delta[R]);
  }
}

struct BackwardArgs {
  const float *dout, *q, *k, *v, *out, *lse;
  float *dq, *dk, *dv;
};

// With P = exp(S - lse) (S = scale q k^T), dP = dO V^T, Dv_i = sum_e dO[i,e] O[i,e]:
//   dV = P^T dO,  dS = P * (dP - Dv),  dQ = scale dS K,  dK = scale dS^T Q
// Kv group (b, hk), all heads of the group stacked per query tile: the dK and
// dV GEMMs sum over the group's heads as part of their inner dimension.
void backward_unit(const Dims& d, const BackwardArgs& a, int64_t b, int64_t hk, BackwardScratch& w) {
  const int64_t G = d.group(), ldk = d.Hkv * d.D;
  const float* K = kv_rows(a.k, d, b, hk);
  float *dK = kv_rows(a.dk, d, b, hk), *dV = kv_rows(a.dv, d, b, hk);
  for (int64_t s = 0; s < d.S; ++s) {
    std::fill(dK + s * ldk, dK + s * ldk + d.D, 0.0f);
    std::fill(dV + s * ldk, dV + s * ldk + d.D, 0.0f);
  }
  transpose_kv(a.k, d, b, hk, d.S, w.kt.data());
  transpose_kv(a.v, d, b, hk, d.S, w.vt.data());
  for (int64_t i0 = 0; i0 < d.T; i0 += d.query_rows()) {
    const int64_t br = std::min(d.query_rows(), d.T - i0), rows = G * br, kv_end = keys_seen(d, i0, br);
    gather_group(a.q, d, b, hk, i0, br, d.scale, w.q.data());
    gather_dout_delta(a.dout, a.out, d, b, hk, i0, br, w.dout.data(), w.delta.data());
    for (int64_t R = 0; R < rows; ++R) w.lse[R] = a.lse[(b * d.H + hk * G + R / br) * d.T + i0 + R % br];
    for (const float* x : {a.q, a.dout, a.out}) prefetch_group(x, d, b, hk, i0 + br, std::min(d.T, i0 + 2 * br));
    for (int64_t j0 = 0; j0 < kv_end; j0 += Bc) {
      const int64_t bc = std::min(Bc, kv_end - j0);
      float *P = w.p.data(), *dS = w.ds.data();
      // P = q k^T and dP = dO V^T, then P and dS = P (dP - Dv) in one pass;
      // dV += P^T dO;  dK += dS^T (scale Q);  dQ (+)= dS K
      detail::small_gemm(false, rows, bc, d.D, w.q.data(), d.D, w.kt.data() + j0, d.S, false, P, Bc);
      detail::small_gemm(false, rows, bc, d.D, w.dout.data(), d.D, w.vt.data() + j0, d.S, false, dS, Bc);
      probabilities_and_ds(d, P, dS, rows, br, i0, j0, bc, w.lse.data(), w.delta.data());
      detail::small_gemm(true, bc, d.D, rows, P, Bc, w.dout.data(), d.D, true, dV + j0 * ldk, ldk);
      detail::small_gemm(true, bc, d.D, rows, dS, Bc, w.q.data(), d.D, true, dK + j0 * ldk, ldk);
      detail::small_gemm(false, rows, d.D, bc, dS, Bc, K + j0 * ldk, ldk, j0 > 0, w.dq.data(), d.D);
    }
    if (kv_end == 0) std::fill(w.dq.begin(), w.dq.end(), 0.0f);
    scatter_group(w.dq.data(), d, b, hk, i0, br, [&](int64_t) { return d.scale; }, a.dq);
  }
}

}  // namespace

// Units are (b, hk, chunk of query tiles): one chunk per group when there
// are at least as many groups as blocks (the demo model), else enough chunks
// to give every block work. K^T is built once per unit.
AttentionOut flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale) {
  const Dims d = check_qkv(q, k, v, causal, scale);
  detail::blas_single_thread();
  AttentionOut res{Tensor::empty(q.shape()), Tensor::empty({d.B, d.H, d.T})};
  const int64_t groups = d.B * d.Hkv, nq = detail::ceil_div(d.T, d.query_rows());
  detail::Plan plan = plan_units("flash_attention", d, groups * nq);
  if (groups * nq == 0 || d.D == 0) return res;
  const int64_t chunks = std::min(nq, detail::ceil_div(plan.tiling.block_dim, groups)), units = groups * chunks;
  Tensor out = res.out, lse = res.lse;
  auto queries = [d, nq, chunks](int64_t u) {  // [t0, t1) of unit u
    const int64_t c = u % chunks;
    return std::pair{nq * c / chunks * d.query_rows(), std::min(d.T, nq * (c + 1) / chunks * d.query_rows())};
  };
  detail::launch(std::move(plan), {{q, k, v}, {out, lse}}, [q, k, v, out, lse, d, chunks, units,
                                                            queries](const detail::BlockContext& ctx) {
    const ForwardArgs a{q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(), lse.data<float>()};
    ForwardScratch w(d);
    for (int64_t u = ctx.block_idx; u < units; u += ctx.block_dim) {
      if (const int64_t next = u + ctx.block_dim; next < units) {  // its inputs arrive during this unit
        const int64_t b = next / chunks / d.Hkv, hk = next / chunks % d.Hkv;
        const auto [t0, t1] = queries(next);
        for (const float* x : {a.k, a.v}) prefetch_kv(x, d, b, hk, d.causal ? t1 : d.S);
        prefetch_group(a.q, d, b, hk, t0, std::min(t1, t0 + d.query_rows()));
      }
      const auto [t0, t1] = queries(u);
      forward_unit(d, a, u / chunks / d.Hkv, u / chunks % d.Hkv, t0, t1, w);
    }
  });
  return res;
}

// One unit per kv group (b, hk): it owns that group's dk/dv rows and its
// heads' dq rows, so nothing is reduced afterwards and no helper passes run.
AttentionGrads flash_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& out, const Tensor& lse,
                                        bool causal, float scale) {
  const Dims d = check_qkv(q, k, v, causal, scale);
  detail::check_shape(dout, q.shape(), "dout");
  detail::check_shape(out, q.shape(), "out");
  detail::check_shape(lse, {d.B, d.H, d.T}, "lse");
  detail::check_contiguous(dout, "dout");
  detail::check_contiguous(out, "out");
  detail::blas_single_thread();
  AttentionGrads g{Tensor::empty(q.shape()), Tensor::empty(k.shape()), Tensor::empty(v.shape())};
  if (q.numel() == 0 && k.numel() == 0) return g;
  const int64_t units = d.B * d.Hkv;
  detail::Plan plan = plan_units("flash_attention_bwd", d, units);
  detail::launch(std::move(plan), {{dout, q, k, v, out, lse}, {g.dq, g.dk, g.dv}},
                 [dout, q, k, v, out, lse, g, d, units](const detail::BlockContext& ctx) {
    const BackwardArgs a{dout.data<float>(), q.data<float>(), k.data<float>(), v.data<float>(), out.data<float>(),
                         lse.data<float>(), g.dq.data<float>(), g.dk.data<float>(), g.dv.data<float>()};
    BackwardScratch w(d);
    for (int64_t u = ctx.block_idx; u < units; u += ctx.block_dim) {
      if (const int64_t next = u + ctx.block_dim; next < units) {  // its inputs arrive during this unit
        const int64_t b = next / d.Hkv, hk = next % d.Hkv;
        for (const float* x : {a.k, a.v}) prefetch_kv(x, d, b, hk, d.S);
        for (const float* x : {a.q, a.dout, a.out}) prefetch_group(x, d, b, hk, 0, std::min(d.T, d.query_rows()));
      }
      backward_unit(d, a, u / d.Hkv, u % d.Hkv, w);
    }
  });
  return g;
}

AttentionOut merge_attention(const Tensor& out1, const Tensor& lse1, const Tensor& out2,
                             const Tensor& lse2) {
  for (const Tensor* t : {&out1, &lse1, &out2, &lse2}) {
    detail::check_contiguous(*t, "merge input");
    detail::check_dtype(*t, DType::f32, "merge input");
  }
  CM_CHECK(out1.dim() == 4 && out1.shape() == out2.shape() && lse1.shape() == lse2.shape(),
           "pass two (B,T,H,D) outputs and two (B,H,T) lse", "merge of {} and {}", out1.describe(),
           out2.describe());
  const int64_t B = out1.size(0), T = out1.size(1), H = out1.size(2), D = out1.size(3);
  detail::check_shape(lse1, {B, H, T}, "lse1");
  AttentionOut res{Tensor::empty(out1.shape()), Tensor::empty(lse1.shape())};
  Tensor out = res.out, lse = res.lse;
  detail::launch_rows("merge_attention", detail::KernelKind::vector, {out1.shape()}, {DType::f32}, "",
                      {{out1, lse1, out2, lse2}, {out, lse}}, B * T * H, 3 * D, [out1, lse1, out2, lse2, out, lse, T, H, D](int64_t r0, int64_t r1) {
                        for (int64_t r = r0; r < r1; ++r) {  // r = (b*T + t)*H + h
                          const int64_t li = (r / (T * H) * H + r % H) * T + r / H % T;
                          const float a = lse1.data<float>()[li], c = lse2.data<float>()[li];
                          const float mx = std::fmax(a, c);
                          float w1 = 0.0f, w2 = 0.0f, l = -INFINITY;
                          if (mx != -INFINITY) {
                            l = mx + std::log(std::exp(a - mx) + std::exp(c - mx));
                            w1 = std::exp(a - l);
                            w2 = std::exp(c - l);
                          }
                          lse.data<float>()[li] = l;
                          const float* x = out1.data<float>() + r * D;
                          const float* y = out2.data<float>() + r * D;
                          float* o = out.data<float>() + r * D;
                          for (int64_t e = 0; e < D; ++e) o[e] = w1 * x[e] + w2 * y[e];
                        }
                      });
  return res;
}

}  // namespace coremesh::ops
