#include "layers.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace coremesh::model::detail {

// ---------------------------------------------------------------- linear
void linear_forward(float* y, const float* x, const float* w, int64_t N, int64_t in, int64_t out,
                    float beta) {
  // y = x @ W^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(N), int(out), int(in), 1.0f, x, int(in),
              w, int(in), beta, y, int(out));
}

void linear_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                     int64_t N, int64_t in, int64_t out, float dx_beta) {
  // forward: y = x @ W^T   =>   dx = dy @ W,  dW = dy^T @ x
  if (dx)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(N), int(in), int(out), 1.0f, dy,
                int(out), w, int(in), dx_beta, dx, int(in));
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(out), int(in), int(N), 1.0f, dy, int(out),
              x, int(in), 1.0f, dw, int(in));
}

// ---------------------------------------------------------------- rmsnorm
void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t N, int64_t C,
                     float eps) {
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    float ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const float r = 1.0f / std::sqrt(ss / float(C) + eps);
    rstd[n] = r;
    float* yr = y + n * C;
    for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * r * w[c];
  }
}

void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t N, int64_t C, bool accumulate_dx) {
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    const float* dyr = dy + n * C;
    const float r = rstd[n];
    // y = x * r * w, r = (mean(x^2) + eps)^(-1/2)  =>  dr/dx = -r^3 x / C
    float dot = 0;
    for (int64_t c = 0; c < C; ++c) dot += dyr[c] * w[c] * xr[c];
    const float k = r * r * r * dot / float(C);
    float* dxr = dx + n * C;
    for (int64_t c = 0; c < C; ++c) {
      const float g = dyr[c] * w[c] * r - xr[c] * k;
      dxr[c] = accumulate_dx ? dxr[c] + g : g;
      dw[c] += dyr[c] * xr[c] * r;
    }
  }
}

// ---------------------------------------------------------------- rope
void rope_apply(float* x, int64_t B, int64_t T, int64_t nh, int64_t D, float theta, bool inverse) {
  const int64_t half = D / 2;
  std::vector<float> cs(static_cast<size_t>(T * half)), sn(static_cast<size_t>(T * half));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double freq = std::pow(double(theta), -2.0 * double(i) / double(D));
      const double ang = double(t) * freq;
      cs[size_t(t * half + i)] = float(std::cos(ang));
      sn[size_t(t * half + i)] = float(std::sin(ang)) * (inverse ? -1.0f : 1.0f);
    }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < nh; ++h) {
        float* p = x + ((b * T + t) * nh + h) * D;
        const float* c = cs.data() + t * half;
        const float* s = sn.data() + t * half;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = p[i], x2 = p[i + half];
          p[i] = x1 * c[i] - x2 * s[i];
          p[i + half] = x1 * s[i] + x2 * c[i];
        }
      }
}

// ---------------------------------------------------------------- attention
void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t qs = H * D, ks = Hkv * D, rep = H / Hkv;
  const float scale = 1.0f / std::sqrt(float(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const float* qb = q + b * T * qs + h * D;
      const float* kb = k + b * T * ks + (h / rep) * D;
      const float* vb = v + b * T * ks + (h / rep) * D;
      float* A = att + (b * H + h) * T * T;
      // S = q k^T * scale  (T,T); only the lower triangle is used.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(T), int(D), scale, qb,
                  int(qs), kb, int(ks), 0.0f, A, int(T));
      for (int64_t i = 0; i < T; ++i) {
        float* row = A + i * T;
        float mx = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, row[j]);
        float sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += (row[j] = std::exp(row[j] - mx));
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
        for (int64_t j = i + 1; j < T; ++j) row[j] = 0.0f;
      }
      // out = P v  (T,D)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(T), int(D), int(T), 1.0f, A,
                  int(T), vb, int(ks), 0.0f, out + b * T * qs + h * D, int(qs));
    }
}

void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout,
                        const float* att, const float* q, const float* k, const float* v, int64_t B,
                        int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t qs = H * D, ks = Hkv * D, rep = H / Hkv;
  const float scale = 1.0f / std::sqrt(float(D));
  std::memset(dk, 0, sizeof(float) * size_t(B * T * ks));
  std::memset(dv, 0, sizeof(float) * size_t(B * T * ks));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const float* qb = q + b * T * qs + h * D;
      const float* kb = k + b * T * ks + (h / rep) * D;
      const float* vb = v + b * T * ks + (h / rep) * D;
      const float* dob = dout + b * T * qs + h * D;
      const float* A = att + (b * H + h) * T * T;
      float* dS = scratch;
      // out = P v  =>  dP = dout v^T,  dv += P^T dout
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(T), int(D), 1.0f, dob,
                  int(qs), vb, int(ks), 0.0f, dS, int(T));
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(T), int(D), int(T), 1.0f, A, int(T),
                  dob, int(qs), 1.0f, dv + b * T * ks + (h / rep) * D, int(ks));
      // P = softmax(S)  =>  dS = P * (dP - sum_j dP_j P_j)   (times scale for q k^T)
      for (int64_t i = 0; i < T; ++i) {
        const float* p = A + i * T;
        float* d = dS + i * T;
        float dot = 0;
        for (int64_t j = 0; j <= i; ++j) dot += d[j] * p[j];
        for (int64_t j = 0; j <= i; ++j) d[j] = p[j] * (d[j] - dot) * scale;
        for (int64_t j = i + 1; j < T; ++j) d[j] = 0.0f;
      }
      // S = q k^T  =>  dq = dS k,  dk += dS^T q
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(T), int(D), int(T), 1.0f, dS,
                  int(T), kb, int(ks), 0.0f, dq + b * T * qs + h * D, int(qs));
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(T), int(D), int(T), 1.0f, dS, int(T),
                  qb, int(qs), 1.0f, dk + b * T * ks + (h / rep) * D, int(ks));
    }
}

// ---------------------------------------------------------------- swiglu
void swiglu_forward(float* g, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
}

void swiglu_backward(float* da, float* db, const float* dg, const float* a, const float* b,
                     int64_t n) {
  // g = silu(a) * b, silu(a) = a*sig(a), silu'(a) = sig(a) * (1 + a*(1 - sig(a)))
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-a[i]));
    db[i] = dg[i] * a[i] * s;
    da[i] = dg[i] * b[i] * s * (1.0f + a[i] * (1.0f - s));
  }
}

// ---------------------------------------------------------------- cross entropy
double softmax_cross_entropy_forward(float* logits, const int32_t* targets, int64_t N, int64_t V) {
  double loss = 0;
  for (int64_t n = 0; n < N; ++n) {
    float* row = logits + n * V;
    float mx = -INFINITY;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, row[v]);
    const double target_logit = double(row[targets[n]]) - double(mx);
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += (row[v] = std::exp(row[v] - mx));
    const float inv = float(1.0 / sum);
    for (int64_t v = 0; v < V; ++v) row[v] *= inv;
    loss += std::log(sum) - target_logit;  // -log softmax(row)[target]
  }
  return loss / double(N);
}

void softmax_cross_entropy_backward(float* dlogits, const float* probs, const int32_t* targets,
                                    int64_t N, int64_t V, float scale) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t v = 0; v < V; ++v) dlogits[n * V + v] = probs[n * V + v] * scale;
    dlogits[n * V + targets[n]] -= scale;
  }
}

}  // namespace coremesh::model::detail
