// Naive cross-entropy and embedding references in double.
#include <cmath>

#include "coremesh/ops/embedding.hpp"
#include "coremesh/ops/loss.hpp"

namespace coremesh::ops::reference {
namespace {
int64_t at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::i64 ? t.data<int64_t>()[i] : t.data<int32_t>()[i];
}
}  // namespace

CrossEntropyOut cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore) {
  const int64_t N = logits.size(0), V = logits.size(1);
  CrossEntropyOut out{Tensor::empty({N}), Tensor::empty({N})};
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(double(logits.item({n, v})));  // small logits in tests
    const double lse = std::log(s);
    out.lse.data<float>()[n] = static_cast<float>(lse);
    const int64_t t = at(targets, n);
    out.loss.data<float>()[n] = t == ignore ? 0.0f : static_cast<float>(lse - logits.item({n, t}));
  }
  return out;
}

Tensor cross_entropy_backward(const Tensor& dloss, const Tensor& logits, const Tensor& targets,
                              const Tensor& lse, int64_t ignore) {
  const int64_t N = logits.size(0), V = logits.size(1);
  Tensor d = Tensor::zeros({N, V});
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = at(targets, n);
    if (t == ignore) continue;
    for (int64_t v = 0; v < V; ++v) {
      const double p = std::exp(double(logits.item({n, v})) - lse.item({n}));
      d.data<float>()[n * V + v] = static_cast<float>(dloss.item({n}) * (p - (v == t)));
    }
  }
  return d;
}

Tensor embedding(const Tensor& table, const Tensor& ids) {
  const int64_t C = table.size(1);
  Shape s = ids.shape();
  s.push_back(C);
  Tensor out = Tensor::empty(s);
  for (int64_t i = 0; i < ids.numel(); ++i)
    for (int64_t c = 0; c < C; ++c) out.data<float>()[i * C + c] = table.item({at(ids, i), c});
  return out;
}

Tensor embedding_backward(const Tensor& dy, const Tensor& ids, int64_t vocab) {
  const int64_t C = dy.size(-1);
  Tensor d = Tensor::zeros({vocab, C});
  for (int64_t i = 0; i < ids.numel(); ++i)
    for (int64_t c = 0; c < C; ++c) d.data<float>()[at(ids, i) * C + c] += dy.data<float>()[i * C + c];
  return d;
}

}  // namespace coremesh::ops::reference
