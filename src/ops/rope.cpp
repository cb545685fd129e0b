// RoPE forward and backward (the same rotation with the angle negated), on
// (B,T,H,D) tensors or on packed q|k|v projection rows.
// Notation: P = D/2 pairs; blocks own ranges of (b,t) rows.
#include "coremesh/ops/rope.hpp"

#include <cmath>
#include <cstring>

#include "detail/checks.hpp"
#include "detail/launch.hpp"

namespace coremesh::ops {
namespace {

// cos/sin of every pair at every position, computed on first use per position
// (the B sequences of a batch share the T positions, so a block evaluates
// each angle once instead of once per row). Angles in double, as the reference.
class AngleTable {
 public:
  AngleTable(const Tensor& positions, int64_t D, float base, float sign)
      : pos_(positions.data<int64_t>()), P_(D / 2), sign_(sign),
        freq_(static_cast<size_t>(P_)), cs_(static_cast<size_t>(positions.numel() * P_)),
        sn_(cs_.size()), ready_(static_cast<size_t>(positions.numel()), 0) {
    for (int64_t p = 0; p < P_; ++p) freq_[p] = std::pow(double(base), -2.0 * double(p) / double(D));
  }
  // (cos, sin) arrays of P floats for position index t.
  std::pair<const float*, const float*> at(int64_t t) {
    float* c = cs_.data() + t * P_;
    float* s = sn_.data() + t * P_;
    if (!ready_[t]) {
      for (int64_t p = 0; p < P_; ++p) {
        const double a = double(pos_[t]) * freq_[p];
        c[p] = static_cast<float>(std::cos(a));
        s[p] = sign_ * static_cast<float>(std::sin(a));
      }
      ready_[t] = 1;
    }
    return {c, s};
  }

 private:
  const int64_t* pos_;
  int64_t P_;
  float sign_;
  std::vector<double> freq_;
  std::vector<float> cs_, sn_;
  std::vector<char> ready_;
};

// Rotates H heads of D values from `in` to `out` (may alias).
void rotate_heads(const float* in, float* out, int64_t H, int64_t D, const float* cs,
                  const float* sn, bool interleaved) {
  const int64_t P = D / 2, step = interleaved ? 2 : 1, second = interleaved ? 1 : P;
  for (int64_t h = 0; h < H; ++h, in += D, out += D)
    for (int64_t p = 0; p < P; ++p) {
      const int64_t i = p * step, j = i + second;
      const float x1 = in[i], x2 = in[j];
      out[i] = x1 * cs[p] - x2 * sn[p];
      out[j] = x1 * sn[p] + x2 * cs[p];
    }
}

void check_positions(const Tensor& positions, int64_t T) {
  detail::check_contiguous(positions, "positions");
  detail::check_dtype(positions, DType::i64, "positions");
  detail::check_shape(positions, {T}, "positions");
}

void check_f32(const Tensor& t, const char* what) {
  detail::check_contiguous(t, what);
  detail::check_dtype(t, DType::f32, what);
}

std::string rope_attrs(const RopeConfig& cfg) {
  CM_CHECK(cfg.base > 0 && std::isfinite(cfg.base), "use a finite base > 0 (10000 in most models)",
           "rope base {}", cfg.base);
  return detail::key_attrs({{"base", cfg.base}, {"interleaved", cfg.interleaved}});
}

Tensor rotate(const char* name, const Tensor& x, const Tensor& positions, const RopeConfig& cfg,
              float sign) {
  check_f32(x, "x");
  CM_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "pass x (B,T,H,D) with an even head size",
           "rope input {} is not (B,T,H,D) with even D", x.describe());
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  check_positions(positions, T);
  Tensor y = Tensor::empty(x.shape());
  detail::launch_rows(name, detail::KernelKind::vector, {x.shape()}, {DType::f32}, rope_attrs(cfg),
                      {detail::defined({x, positions}), {y}}, B * T, H * D, [x, y, positions, cfg, sign, T, H, D](int64_t r0, int64_t r1) {
                        AngleTable table(positions, D, cfg.base, sign);
                        for (int64_t r = r0; r < r1; ++r) {  // r = b*T + t
                          auto [cs, sn] = table.at(r % T);
                          rotate_heads(x.data<float>() + r * H * D, y.data<float>() + r * H * D, H,
                                       D, cs, sn, cfg.interleaved);
                        }
                      });
  return y;
}

// Shape checks shared by the packed forms; returns D.
int64_t packed_head_dim(int64_t width, int64_t H, int64_t Hkv) {
  CM_CHECK(H > 0 && Hkv > 0 && H % Hkv == 0, "pass heads > 0 and a kv_heads that divides it",
           "heads {}, kv_heads {}", H, Hkv);
  const int64_t heads = H + 2 * Hkv;
  CM_CHECK(width % heads == 0 && (width / heads) % 2 == 0,
           "pass qkv rows of (heads + 2 kv_heads) * D values with an even D",
           "qkv row width {} is not a multiple of {} heads with an even head size", width, heads);
  return width / heads;
}

}  // namespace

Tensor rope(const Tensor& x, const Tensor& positions, const RopeConfig& config) {
  return rotate("rope", x, positions, config, 1.0f);
}

// y = R(a) x with R orthogonal, so dx = R(a)^T dy = R(-a) dy.
Tensor rope_backward(const Tensor& dy, const Tensor& positions, const RopeConfig& config) {
  return rotate("rope_backward", dy, positions, config, -1.0f);
}

QkvHeads rope_qkv(const Tensor& qkv, int64_t heads, int64_t kv_heads, const Tensor& positions,
                  const RopeConfig& cfg) {
  check_f32(qkv, "qkv");
  CM_CHECK(qkv.dim() == 3, "pass qkv as (B,T,(H+2Hkv)*D)", "qkv is {}", qkv.describe());
  const int64_t B = qkv.size(0), T = qkv.size(1), W = qkv.size(2), H = heads, Hkv = kv_heads;
  const int64_t D = packed_head_dim(W, H, Hkv);
  check_positions(positions, T);
  QkvHeads out{Tensor::empty({B, T, H, D}), Tensor::empty({B, T, Hkv, D}), Tensor::empty({B, T, Hkv, D})};
  detail::launch_rows(
      "rope_qkv", detail::KernelKind::vector, {qkv.shape()}, {DType::f32},
      rope_attrs(cfg) + fmt::format(";H={};Hkv={}", H, Hkv), {detail::defined({qkv, positions}), {out.q, out.k, out.v}},
      B * T, W, [qkv, out, positions, cfg, T, W, H, Hkv, D](int64_t r0, int64_t r1) {
        AngleTable table(positions, D, cfg.base, 1.0f);
        for (int64_t r = r0; r < r1; ++r) {
          auto [cs, sn] = table.at(r % T);
          const float* in = qkv.data<float>() + r * W;
          rotate_heads(in, out.q.data<float>() + r * H * D, H, D, cs, sn, cfg.interleaved);
          rotate_heads(in + H * D, out.k.data<float>() + r * Hkv * D, Hkv, D, cs, sn, cfg.interleaved);
          std::memcpy(out.v.data<float>() + r * Hkv * D, in + (H + Hkv) * D,
                      static_cast<size_t>(Hkv * D) * sizeof(float));
        }
      });
  return out;
}

Tensor rope_qkv_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                         const Tensor& positions, const RopeConfig& cfg) {
  for (const Tensor* t : {&dq, &dk, &dv}) check_f32(*t, "dq/dk/dv");
  CM_CHECK(dq.dim() == 4 && dk.dim() == 4 && dk.shape() == dv.shape() &&
               dq.size(0) == dk.size(0) && dq.size(1) == dk.size(1) && dq.size(3) == dk.size(3),
           "pass dq (B,T,H,D) and dk, dv (B,T,Hkv,D)", "dq {}, dk {}, dv {}", dq.describe(),
           dk.describe(), dv.describe());
  const int64_t B = dq.size(0), T = dq.size(1), H = dq.size(2), Hkv = dk.size(2), D = dq.size(3);
  const int64_t W = (H + 2 * Hkv) * D;
  packed_head_dim(W, H, Hkv);
  check_positions(positions, T);
  Tensor dqkv = Tensor::empty({B, T, W});
  detail::launch_rows(
      "rope_qkv_backward", detail::KernelKind::vector, {dqkv.shape()}, {DType::f32},
      rope_attrs(cfg) + fmt::format(";H={};Hkv={}", H, Hkv), {detail::defined({dq, dk, dv, positions}), {dqkv}},
      B * T, W, [dq, dk, dv, dqkv, positions, cfg, T, W, H, Hkv, D](int64_t r0, int64_t r1) {
        AngleTable table(positions, D, cfg.base, -1.0f);
        for (int64_t r = r0; r < r1; ++r) {
          auto [cs, sn] = table.at(r % T);
          float* out = dqkv.data<float>() + r * W;
          rotate_heads(dq.data<float>() + r * H * D, out, H, D, cs, sn, cfg.interleaved);
          rotate_heads(dk.data<float>() + r * Hkv * D, out + H * D, Hkv, D, cs, sn, cfg.interleaved);
          std::memcpy(out + (H + Hkv) * D, dv.data<float>() + r * Hkv * D,
                      static_cast<size_t>(Hkv * D) * sizeof(float));
        }
      });
  return dqkv;
}

Tensor rope_positions(int64_t T, int64_t start) {
  Tensor p = Tensor::empty({T}, DType::i64);
  for (int64_t t = 0; t < T; ++t) p.data<int64_t>()[t] = start + t;
  return p;
}

}  // namespace coremesh::ops
