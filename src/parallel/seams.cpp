// The one-PE implementations of the model's seams: nothing crosses a PE.
#include "coremesh/parallel/seams.hpp"

#include "coremesh/ops/gemm.hpp"
#include "coremesh/ops/rope.hpp"

namespace coremesh::parallel {
namespace {

class LocalExperts final : public ExpertDispatcher {
 public:
  Dispatched dispatch(const Tensor& xp, const Tensor& offsets, Site, const Weights&, const FirstGemm&) override {
    Dispatched d;
    d.rows = xp, d.offsets = d.source_offsets = offsets;
    return d;
  }
  Tensor combine(const Tensor& y, const Dispatched&) override { return y; }
  Tensor combine_backward(const Tensor& dy, const Dispatched&) override { return dy; }
  Tensor dispatch_backward(const Tensor& drows, const Dispatched&) override { return drows; }
};

class LocalContext final : public ContextParallel {
 public:
  Tensor positions(int64_t T) const override { return ops::rope_positions(T); }
  ops::AttentionOut attention(const Tensor& q, const Tensor& k, const Tensor& v) override {
    return ops::flash_attention(q, k, v, /*causal=*/true);
  }
  ops::AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                         const Tensor& v, const ops::AttentionOut& fwd) override {
    return ops::flash_attention_backward(dout, q, k, v, fwd.out, fwd.lse, /*causal=*/true);
  }
};

class LocalTensor final : public TensorParallel {
 public:
  Tensor enter(const Tensor& x) override { return x; }
  Tensor enter_backward(const Tensor& dx) override { return dx; }
  Tensor exit(const Tensor& y) override { return y; }
  Tensor exit_backward(const Tensor& dy) override { return dy; }
  Tensor all_reduce(const Tensor& x) override { return x; }
  Tensor sequence_shard(const Tensor& x) override { return x; }
};

}  // namespace

TensorParallel::Entered TensorParallel::enter_matmul(const Tensor& x, const Tensor& w) {
  Tensor entered = enter(x);
  return {ops::matmul(entered, w, false, true), entered};
}

Tensor TensorParallel::matmul_exit(const Tensor& h, const Tensor& w) { return exit(ops::matmul(h, w, false, true)); }

TensorParallel::EnteredFp8 TensorParallel::enter_matmul(const ops::QuantizedTensor& x, const ops::QuantizedTensor& w) {
  return {ops::matmul_fp8(x, w), x};
}

Tensor TensorParallel::matmul_exit(const ops::QuantizedTensor& h, const ops::QuantizedTensor& w) {
  return exit(ops::matmul_fp8(h, w));
}

ExpertDispatcher& ExpertDispatcher::local() {
  static LocalExperts local;
  return local;
}
ContextParallel& ContextParallel::local() {
  static LocalContext local;
  return local;
}
TensorParallel& TensorParallel::local() {
  static LocalTensor local;
  return local;
}

}  // namespace coremesh::parallel
