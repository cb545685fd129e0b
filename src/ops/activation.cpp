// SiLU, GELU, SwiGLU, softmax: forward and backward, side by side.
#include "coremesh/ops/activation.hpp"

#include <cmath>

#include "detail/checks.hpp"
#include "detail/launch.hpp"
#include "detail/pointwise.hpp"
#include "detail/vec_math.hpp"

namespace coremesh::ops {
namespace {

constexpr int64_t kChunk = 4096;  // elements per work unit of element-wise kernels
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoef = 0.044715f;

inline float sigmoid(float x) { return 1.0f / (1.0f + detail::fast_exp(-x)); }

void check_f32(const Tensor& t, const char* what) {
  detail::check_contiguous(t, what);
  detail::check_dtype(t, DType::f32, what);
}

// out[i] = fn(i) for every element, in chunks of kChunk. fn captures its
// inputs' raw pointers (taken at launch; the captured tensors keep them alive)
// so the loop does no per-element checks and can vectorize.
template <typename Fn>
Tensor map_elements(const char* name, const std::vector<Tensor>& inputs, const std::string& attrs, Fn fn) {
  const Tensor& like = inputs.back();
  Tensor out = Tensor::empty(like.shape());
  const int64_t n = like.numel();
  detail::launch_rows(name, detail::KernelKind::vector, {like.shape()}, {DType::f32}, attrs, {inputs, {out}},
                      detail::ceil_div(n, kChunk), kChunk, [out, n, fn](int64_t c0, int64_t c1) {
                        float* o = out.data<float>();
                        for (int64_t i = c0 * kChunk, end = std::min(n, c1 * kChunk); i < end; ++i)
                          o[i] = fn(i);
                      });
  return out;
}

// out = row(x) by chunks of kChunk: the op's row function (detail/pointwise.hpp),
// shared with fused element-wise chains.
Tensor map_rows(const char* name, const Tensor& x, const std::string& attrs, detail::UnaryRow row) {
  Tensor out = Tensor::empty(x.shape());
  const int64_t n = x.numel();
  detail::launch_rows(name, detail::KernelKind::vector, {x.shape()}, {DType::f32}, attrs, {{x}, {out}},
                      detail::ceil_div(n, kChunk), kChunk, [x, out, n, row](int64_t c0, int64_t c1) {
                        const int64_t begin = c0 * kChunk, end = std::min(n, c1 * kChunk);
                        row(x.data<float>() + begin, out.data<float>() + begin, end - begin);
                      });
  return out;
}

}  // namespace

// y = x * s, s = sigmoid(x)
Tensor silu(const Tensor& x) {
  check_f32(x, "x");
  return map_rows("silu", x, "", detail::silu_row);
}
// dy/dx = s * (1 + x * (1 - s))
Tensor silu_backward(const Tensor& dy, const Tensor& x) {
  check_f32(x, "x");
  check_f32(dy, "dy");
  detail::check_shape(dy, x.shape(), "dy");
  return map_elements("silu_backward", {dy, x}, "",
                      [x, dy, xp = x.data<float>(), dyp = dy.data<float>()](int64_t i) {
    const float v = xp[i], s = sigmoid(v);
    return dyp[i] * s * (1.0f + v * (1.0f - s));
  });
}

// tanh: y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
// none: y = 0.5 x (1 + erf(x / sqrt 2))
Tensor gelu(const Tensor& x, GeluApprox approx) {
  check_f32(x, "x");
  return approx == GeluApprox::tanh ? map_rows("gelu", x, "tanh", detail::gelu_tanh_row)
                                    : map_rows("gelu", x, "erf", detail::gelu_erf_row);
}
// tanh: dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// none: dy/dx = 0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi)
Tensor gelu_backward(const Tensor& dy, const Tensor& x, GeluApprox approx) {
  check_f32(x, "x");
  check_f32(dy, "dy");
  detail::check_shape(dy, x.shape(), "dy");
  return map_elements("gelu_backward", {dy, x}, approx == GeluApprox::tanh ? "tanh" : "erf",
                      [x, dy, approx, xp = x.data<float>(), dyp = dy.data<float>()](int64_t i) {
                        const float v = xp[i];
                        float d;
                        if (approx == GeluApprox::tanh) {
                          const float t = std::tanh(kSqrt2OverPi * (v + kGeluCoef * v * v * v));
                          d = 0.5f * (1.0f + t) +
                              0.5f * v * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoef * v * v);
                        } else {
                          d = 0.5f * (1.0f + std::erf(v * 0.70710678118654752f)) +
                              v * std::exp(-0.5f * v * v) * 0.3989422804014327f;
                        }
                        return dyp[i] * d;
                      });
}

// out[r,f] = silu(gate[r,f]) * up[r,f], gate_up[r] = [gate | up]
void swiglu_out(const Tensor& gate_up, const Tensor& out) {
  check_f32(gate_up, "gate_up");
  check_f32(out, "out");
  detail::check_disjoint(out, "out", gate_up, "gate_up");
  CM_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, "pass the fused (..., 2F) projection",
           "swiglu input {} has an odd last dimension", gate_up.describe());
  const int64_t F = gate_up.size(-1) / 2, R = detail::rows_of(gate_up);
  Shape want = gate_up.shape();
  want.back() = F;
  detail::check_shape(out, want, "out");
  detail::launch_rows("swiglu", detail::KernelKind::vector, {gate_up.shape()}, {DType::f32}, "",
                      {{gate_up}, {out}}, R, 3 * F, [gate_up, out, F](int64_t r0, int64_t r1) {
                        for (int64_t r = r0; r < r1; ++r) {
                          const float* g = gate_up.data<float>() + r * 2 * F;
                          const float* u = g + F;
                          float* o = out.data<float>() + r * F;
                          detail::sigmoid_row(g, o, F);  // o = sigmoid(gate)
                          for (int64_t f = 0; f < F; ++f) o[f] *= g[f] * u[f];
                        }
                      });
}

Tensor swiglu(const Tensor& gate_up) {
  Shape s = gate_up.shape();
  CM_CHECK(!s.empty(), "pass the fused (..., 2F) projection", "swiglu of a scalar");
  s.back() /= 2;
  Tensor out = Tensor::empty(s);
  swiglu_out(gate_up, out);
  return out;
}

// d gate = dy * up * silu'(gate),  d up = dy * silu(gate)
Tensor swiglu_backward(const Tensor& dy, const Tensor& gate_up) {
  check_f32(gate_up, "gate_up");
  check_f32(dy, "dy");
  const int64_t F = gate_up.size(-1) / 2, R = detail::rows_of(gate_up);
  Shape want = gate_up.shape();
  want.back() = F;
  detail::check_shape(dy, want, "dy");
  Tensor d = Tensor::empty(gate_up.shape());
  detail::launch_rows("swiglu_backward", detail::KernelKind::vector, {gate_up.shape()},
                      {DType::f32}, "", {{dy, gate_up}, {d}}, R, 5 * F, [gate_up, dy, d, F](int64_t r0, int64_t r1) {
                        for (int64_t r = r0; r < r1; ++r) {
                          const float* g = gate_up.data<float>() + r * 2 * F;
                          const float* u = g + F;
                          const float* o = dy.data<float>() + r * F;
                          float* dg = d.data<float>() + r * 2 * F;
                          float* du = dg + F;
                          detail::sigmoid_row(g, du, F);  // du holds sigmoid(gate) until overwritten
                          for (int64_t f = 0; f < F; ++f) {
                            const float s = du[f];
                            du[f] = o[f] * g[f] * s;
                            dg[f] = o[f] * u[f] * s * (1.0f + g[f] * (1.0f - s));
                          }
                        }
                      });
  return d;
}

// y[r,c] = exp(x[r,c] - max_r) / sum_j exp(x[r,j] - max_r)
Tensor softmax(const Tensor& x) {
  check_f32(x, "x");
  CM_CHECK(x.dim() >= 1, "pass rows (..., C): softmax normalizes the last dimension", "softmax of a 0-d tensor");
  Tensor y = Tensor::empty(x.shape());
  const int64_t C = x.size(-1), R = detail::rows_of(x);
  detail::launch_rows("softmax", detail::KernelKind::vector, {x.shape()}, {DType::f32}, "", {{x}, {y}}, R, 3 * C,
                      [x, y, C](int64_t r0, int64_t r1) {
                        for (int64_t r = r0; r < r1; ++r) {
                          const float* xr = x.data<float>() + r * C;
                          float* yr = y.data<float>() + r * C;
                          const float m = detail::max_of(xr, C);
                          const float inv = 1.0f / detail::exp_sub_sum(xr, yr, C, m);
                          for (int64_t c = 0; c < C; ++c) yr[c] *= inv;
                        }
                      });
  return y;
}

// dx[c] = y[c] * (dy[c] - sum_j dy[j] y[j])
Tensor softmax_backward(const Tensor& dy, const Tensor& y) {
  check_f32(y, "y");
  check_f32(dy, "dy");
  detail::check_shape(dy, y.shape(), "dy");
  CM_CHECK(y.dim() >= 1, "pass rows (..., C): softmax normalizes the last dimension", "softmax_backward of a 0-d tensor");
  Tensor dx = Tensor::empty(y.shape());
  const int64_t C = y.size(-1), R = detail::rows_of(y);
  detail::launch_rows("softmax_backward", detail::KernelKind::vector, {y.shape()}, {DType::f32}, "",
                      {{dy, y}, {dx}}, R, 3 * C, [dy, y, dx, C](int64_t r0, int64_t r1) {
                        for (int64_t r = r0; r < r1; ++r) {
                          const float* yr = y.data<float>() + r * C;
                          const float* g = dy.data<float>() + r * C;
                          const float dot = detail::dot(g, yr, C);
                          float* out = dx.data<float>() + r * C;
                          for (int64_t c = 0; c < C; ++c) out[c] = yr[c] * (g[c] - dot);
                        }
                      });
  return dx;
}

}  // namespace coremesh::ops
