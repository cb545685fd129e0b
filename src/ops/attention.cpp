// Flash attention forward/backward and LSE merge. See attention.hpp for the
// notation: q (B,T,H,D), k/v (B,S,Hkv,D), lse (B,H,T).
#include "coremesh/ops/attention.hpp"

#include <cmath>

#include "detail.hpp"
#include "small_gemm.hpp"

namespace coremesh::ops {
namespace {

constexpr int64_t Br = 64;   // query rows per tile
constexpr int64_t Bc = 128;  // key rows per tile

struct Dims {
  int64_t B, T, S, H, Hkv, D;
  float scale;
  bool causal;
  int64_t group() const { return H / Hkv; }
};

Dims check_qkv(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale) {
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

detail::Plan plan_units(const char* op, const Dims& d, int64_t units) {
  return detail::plan(op, detail::KernelKind::cube, {{d.B, d.T, d.H, d.D}, {d.B, d.S, d.Hkv, d.D}},
                      {DType::f32}, fmt::format("causal={};scale={}", d.causal, d.scale),
                      [&](int max_blocks) {
                        detail::Tiling t;
                        t.tile_m = Br;
                        t.tile_n = Bc;
                        t.block_dim = static_cast<int>(std::min<int64_t>(max_blocks, std::max<int64_t>(units, 1)));
                        return t;
                      });
}

// P[r,c] = exp(scale q_i.k_j - lse_i) for allowed keys, else 0; S holds q.k.
void probabilities(const Dims& d, float* S, int64_t i0, int64_t br, int64_t j0, int64_t bc,
                   const float* lse) {
  for (int64_t r = 0; r < br; ++r) {
    const int64_t n = allowed(d, i0 + r, j0, bc);
    const float l = lse[i0 + r];
    float* row = S + r * Bc;
    const int64_t live = std::isfinite(l) ? n : 0;
    for (int64_t c = 0; c < live; ++c) row[c] *= d.scale;
    detail::exp_sub_sum(row, row, live, l);
    std::fill(row + live, row + bc, 0.0f);
  }
}

// x (B,S,Hkv,D) -> (B,Hkv,D,S): the right-hand operands of q k^T and dO v^T
// read row-major without a transpose (see small_gemm.hpp).
Tensor heads_transposed(const char* op, const Tensor& x, const Dims& d) {
  Tensor t = Tensor::empty({d.B, d.Hkv, d.D, d.S});
  detail::launch_rows(op, detail::KernelKind::vector, {x.shape()}, {DType::f32}, "", d.B * d.Hkv,
                      d.S * d.D, [x, t, d](int64_t r0, int64_t r1) {
                        for (int64_t r = r0; r < r1; ++r) {  // r = b*Hkv + hk
                          const float* in = x.data<float>() + (r / d.Hkv * d.S * d.Hkv + r % d.Hkv) * d.D;
                          float* out = t.data<float>() + r * d.D * d.S;
                          const int64_t ld = d.Hkv * d.D;
                          for (int64_t e = 0; e < d.D; ++e)  // contiguous writes; the S rows read stay in L1
                            for (int64_t s = 0; s < d.S; ++s) out[e * d.S + s] = in[s * ld + e];
                        }
                      });
  return t;
}

}  // namespace

AttentionOut flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale) {
  const Dims d = check_qkv(q, k, v, causal, scale);
  detail::blas_single_thread();
  AttentionOut res{Tensor::empty(q.shape()), Tensor::empty({d.B, d.H, d.T})};
  const int64_t nq = detail::ceil_div(d.T, Br), units = d.B * d.H * nq;
  detail::Plan plan = plan_units("flash_attention", d, units);
  if (units == 0 || d.D == 0) return res;
  Tensor out = res.out, lse = res.lse;
  const Tensor kt = heads_transposed("flash_attention_kt", k, d);
  detail::launch("flash_attention", detail::KernelKind::cube, plan, [q, kt, v, out, lse, d, nq, units](const detail::BlockContext& ctx) {
    std::vector<float> S(Br * Bc), O(Br * d.D), m(Br), l(Br);
    const int64_t ldq = d.H * d.D, ldk = d.Hkv * d.D;
    for (int64_t u = ctx.block_idx; u < units; u += ctx.block_dim) {  // round-robin: causal balance
      const int64_t b = u / (d.H * nq), h = u / nq % d.H, i0 = u % nq * Br, br = std::min(Br, d.T - i0);
      const int64_t hk = h / d.group();
      const float* Q = q.data<float>() + ((b * d.T + i0) * d.H + h) * d.D;
      const float* Kt = kt.data<float>() + (b * d.Hkv + hk) * d.D * d.S;  // (D,S)
      const float* V = v.data<float>() + (b * d.S * d.Hkv + hk) * d.D;
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.0f);
      std::fill(O.begin(), O.end(), 0.0f);
      const int64_t kv_end = d.causal ? i0 + br : d.S;
      for (int64_t j0 = 0; j0 < kv_end; j0 += Bc) {
        const int64_t bc = std::min(Bc, kv_end - j0);
        // S (br,bc) = Q K^T
        detail::small_gemm(false, br, bc, d.D, Q, ldq, Kt + j0, d.S, false, S.data(), Bc);
        for (int64_t r = 0; r < br; ++r) {  // online softmax of scale * S, row by row
          float* row = S.data() + r * Bc;
          const int64_t n = allowed(d, i0 + r, j0, bc);
          if (n == 0) {
            std::fill(row, row + bc, 0.0f);
            continue;
          }
          for (int64_t c = 0; c < n; ++c) row[c] *= d.scale;
          const float mx = std::fmax(m[r], detail::max_of(row, n));
          const float rowsum = detail::exp_sub_sum(row, row, n, mx);
          std::fill(row + n, row + bc, 0.0f);
          const float alpha = m[r] == -INFINITY ? 0.0f : detail::fast_exp(m[r] - mx);
          l[r] = l[r] * alpha + rowsum;
          m[r] = mx;
          for (int64_t e = 0; e < d.D; ++e) O[r * d.D + e] *= alpha;
        }
        // O (br,D) += P (br,bc) V (bc,D)
        detail::small_gemm(false, br, d.D, bc, S.data(), Bc, V + j0 * ldk, ldk, true, O.data(), d.D);
      }
      float* out_rows = out.data<float>() + ((b * d.T + i0) * d.H + h) * d.D;
      float* lse_row = lse.data<float>() + (b * d.H + h) * d.T + i0;
      for (int64_t r = 0; r < br; ++r) {
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        for (int64_t e = 0; e < d.D; ++e) out_rows[r * ldq + e] = O[r * d.D + e] * inv;
        lse_row[r] = l[r] > 0.0f ? m[r] + std::log(l[r]) : -INFINITY;
      }
    }
  });
  return res;
}

// With P = exp(S - lse) (S = scale q k^T), dP = dO V^T, Dv_i = sum_e dO[i,e] O[i,e]:
//   dV = P^T dO,  dS = P * (dP - Dv),  dQ = scale dS K,  dK = scale dS^T Q
// Pass 1: Dv (and k, v transposed per head for the small GEMMs). Pass 2: one
// unit per (b, h) walks its (key tile, query tile)
// pairs once, recomputing P a single time and accumulating dQ, dK and dV
// (five small GEMMs per pair). A unit owns its head's rows of dq, and of dk/dv
// for MHA; with GQA the heads of a group write per-head dK/dV that pass 3 sums.
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
  Tensor Dv = Tensor::empty({d.B, d.H, d.T});
  detail::launch_rows("flash_attention_bwd_dot", detail::KernelKind::vector, {q.shape()}, {DType::f32},
                      "", d.B * d.T * d.H, 2 * d.D, [dout, out, Dv, d](int64_t r0, int64_t r1) {
                        for (int64_t r = r0; r < r1; ++r) {  // r = (b*T + t)*H + h
                          const int64_t b = r / (d.T * d.H), t = r / d.H % d.T, h = r % d.H;
                          Dv.data<float>()[(b * d.H + h) * d.T + t] =
                              detail::dot(dout.data<float>() + r * d.D, out.data<float>() + r * d.D, d.D);
                        }
                      });
  const bool gqa = d.group() > 1;
  // Per-head dK/dV (B,S,H,D) for GQA; the outputs themselves for MHA.
  Tensor dk_h = gqa ? Tensor::empty({d.B, d.S, d.H, d.D}) : g.dk;
  Tensor dv_h = gqa ? Tensor::empty({d.B, d.S, d.H, d.D}) : g.dv;
  const int64_t ldq = d.H * d.D, ldk = d.Hkv * d.D;
  const int64_t nk = detail::ceil_div(d.S, Bc), units = d.B * d.H;
  detail::Plan plan = plan_units("flash_attention_bwd", d, units);
  Tensor dq = g.dq;
  const Tensor kt = heads_transposed("flash_attention_kt", k, d);
  const Tensor vt = heads_transposed("flash_attention_vt", v, d);
  detail::launch("flash_attention_bwd", detail::KernelKind::cube, plan,
                 [q, k, kt, vt, dout, lse, Dv, dq, dk_h, dv_h, d, nk, units, ldq, ldk](const detail::BlockContext& ctx) {
    std::vector<float> P(Br * Bc), dS(Br * Bc);
    for (int64_t u = ctx.block_idx; u < units; u += ctx.block_dim) {
      const int64_t b = u / d.H, h = u % d.H, hk = h / d.group();
      const int64_t ldkh = ldq;  // dk_h/dv_h have H heads (GQA scratch, or MHA's dk/dv)
      const float* L = lse.data<float>() + (b * d.H + h) * d.T;
      const float* Dr = Dv.data<float>() + (b * d.H + h) * d.T;
      const float* Kt = kt.data<float>() + (b * d.Hkv + hk) * d.D * d.S;  // (D,S)
      const float* Vt = vt.data<float>() + (b * d.Hkv + hk) * d.D * d.S;
      float* dQ = dq.data<float>() + (b * d.T * d.H + h) * d.D;
      float* dK = dk_h.data<float>() + (b * d.S * d.H + h) * d.D;
      float* dV = dv_h.data<float>() + (b * d.S * d.H + h) * d.D;
      for (int64_t t = 0; t < d.T; ++t) std::fill(dQ + t * ldq, dQ + t * ldq + d.D, 0.0f);
      for (int64_t s = 0; s < d.S; ++s) {
        std::fill(dK + s * ldkh, dK + s * ldkh + d.D, 0.0f);
        std::fill(dV + s * ldkh, dV + s * ldkh + d.D, 0.0f);
      }
      for (int64_t jt = 0; jt < nk; ++jt) {
        const int64_t j0 = jt * Bc, bc = std::min(Bc, d.S - j0);
        const float* K = k.data<float>() + ((b * d.S + j0) * d.Hkv + hk) * d.D;
        for (int64_t i0 = d.causal ? j0 / Br * Br : 0; i0 < d.T; i0 += Br) {
          const int64_t br = std::min(Br, d.T - i0);
          const float* Q = q.data<float>() + ((b * d.T + i0) * d.H + h) * d.D;
          const float* dO = dout.data<float>() + ((b * d.T + i0) * d.H + h) * d.D;
          detail::small_gemm(false, br, bc, d.D, Q, ldq, Kt + j0, d.S, false, P.data(), Bc);
          probabilities(d, P.data(), i0, br, j0, bc, L);
          // dV += P^T dO;  dP = dO V^T;  dS = scale P (dP - Dv);  dK += dS^T Q;  dQ += dS K
          detail::small_gemm(true, bc, d.D, br, P.data(), Bc, dO, ldq, true, dV + j0 * ldkh, ldkh);
          detail::small_gemm(false, br, bc, d.D, dO, ldq, Vt + j0, d.S, false, dS.data(), Bc);
          for (int64_t r = 0; r < br; ++r)
            for (int64_t c = 0; c < bc; ++c)
              dS[r * Bc + c] = d.scale * P[r * Bc + c] * (dS[r * Bc + c] - Dr[i0 + r]);
          detail::small_gemm(true, bc, d.D, br, dS.data(), Bc, Q, ldq, true, dK + j0 * ldkh, ldkh);
          detail::small_gemm(false, br, d.D, bc, dS.data(), Bc, K, ldk, true, dQ + i0 * ldq, ldq);
        }
      }
    }
  });
  if (gqa) {  // Pass 3: dk[b,s,hk] = sum of dk_h[b,s,h] over the heads h of group hk (same for dv)
    Tensor dk = g.dk, dv = g.dv;
    detail::launch_rows("flash_attention_bwd_gqa_sum", detail::KernelKind::vector, {k.shape()},
                        {DType::f32}, "", d.B * d.S * d.Hkv, 2 * d.group() * d.D,
                        [dk_h, dv_h, dk, dv, d](int64_t r0, int64_t r1) {
                          for (int64_t r = r0; r < r1; ++r) {  // r = (b*S + s)*Hkv + hk
                            for (auto [from, to] : {std::pair{&dk_h, &dk}, std::pair{&dv_h, &dv}}) {
                              const float* in = from->data<float>() + r * d.group() * d.D;
                              float* o = to->data<float>() + r * d.D;
                              std::copy(in, in + d.D, o);
                              for (int64_t j = 1; j < d.group(); ++j)
                                for (int64_t e = 0; e < d.D; ++e) o[e] += in[j * d.D + e];
                            }
                          }
                        });
  }
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
                      B * T * H, 3 * D, [out1, lse1, out2, lse2, out, lse, T, H, D](int64_t r0, int64_t r1) {
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
