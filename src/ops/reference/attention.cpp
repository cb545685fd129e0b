// Naive attention reference: full score matrix per (b, h), double precision.
#include <cmath>

#include "coremesh/ops/attention.hpp"

namespace coremesh::ops::reference {
namespace {

struct Probs {
  std::vector<double> P;  // (T,S) softmax, 0 where masked
  std::vector<double> lse;
};

Probs probs(const Tensor& q, const Tensor& k, int64_t b, int64_t h, bool causal, double scale) {
  const int64_t T = q.size(1), S = k.size(1), hk = h / (q.size(2) / k.size(2)), D = q.size(3);
  Probs p{std::vector<double>(static_cast<size_t>(T * S), 0.0), std::vector<double>(static_cast<size_t>(T))};
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> s(static_cast<size_t>(S), -INFINITY);
    double mx = -INFINITY;
    for (int64_t j = 0; j < S; ++j) {
      if (causal && j > t) continue;
      double acc = 0;
      for (int64_t e = 0; e < D; ++e) acc += double(q.item({b, t, h, e})) * k.item({b, j, hk, e});
      s[j] = acc * scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < S; ++j) sum += s[j] == -INFINITY ? 0.0 : std::exp(s[j] - mx);
    p.lse[t] = sum > 0 ? mx + std::log(sum) : -INFINITY;
    for (int64_t j = 0; j < S; ++j)
      p.P[t * S + j] = s[j] == -INFINITY ? 0.0 : std::exp(s[j] - mx) / sum;
  }
  return p;
}

double scale_of(const Tensor& q, float scale) { return scale > 0 ? scale : 1.0 / std::sqrt(double(q.size(3))); }

}  // namespace

AttentionOut attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), S = k.size(1);
  AttentionOut o{Tensor::zeros(q.shape()), Tensor::empty({B, H, T})};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / k.size(2));
      Probs p = probs(q, k, b, h, causal, scale_of(q, scale));
      for (int64_t t = 0; t < T; ++t) {
        o.lse.data<float>()[(b * H + h) * T + t] = static_cast<float>(p.lse[t]);
        for (int64_t e = 0; e < D; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < S; ++j) acc += p.P[t * S + j] * v.item({b, j, hk, e});
          o.out.data<float>()[((b * T + t) * H + h) * D + e] = static_cast<float>(acc);
        }
      }
    }
  return o;
}

// dV = P^T dO; dP = dO V^T; dS = P (dP - rowsum(P dP)); dQ = scale dS K; dK = scale dS^T Q
AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, bool causal, float scale) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), S = k.size(1);
  const double sc = scale_of(q, scale);
  AttentionGrads g{Tensor::zeros(q.shape()), Tensor::zeros(k.shape()), Tensor::zeros(v.shape())};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / k.size(2));
      Probs p = probs(q, k, b, h, causal, sc);
      std::vector<double> dS(static_cast<size_t>(T * S));
      for (int64_t t = 0; t < T; ++t) {
        double rowdot = 0;
        std::vector<double> dP(static_cast<size_t>(S));
        for (int64_t j = 0; j < S; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < D; ++e) acc += double(dout.item({b, t, h, e})) * v.item({b, j, hk, e});
          dP[j] = acc;
          rowdot += acc * p.P[t * S + j];
        }
        for (int64_t j = 0; j < S; ++j) dS[t * S + j] = p.P[t * S + j] * (dP[j] - rowdot);
      }
      for (int64_t t = 0; t < T; ++t)
        for (int64_t e = 0; e < D; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < S; ++j) acc += dS[t * S + j] * k.item({b, j, hk, e});
          g.dq.data<float>()[((b * T + t) * H + h) * D + e] = static_cast<float>(sc * acc);
        }
      for (int64_t j = 0; j < S; ++j)
        for (int64_t e = 0; e < D; ++e) {
          double dk = 0, dv = 0;
          for (int64_t t = 0; t < T; ++t) {
            dk += dS[t * S + j] * q.item({b, t, h, e});
            dv += p.P[t * S + j] * dout.item({b, t, h, e});
          }
          const int64_t idx = ((b * S + j) * k.size(2) + hk) * D + e;
          g.dk.data<float>()[idx] += static_cast<float>(sc * dk);
          g.dv.data<float>()[idx] += static_cast<float>(dv);
        }
    }
  return g;
}

}  // namespace coremesh::ops::reference
