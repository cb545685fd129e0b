#include "coremesh/ops/elementwise.hpp"

#include "coremesh/runtime/op_cache.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::ops {
namespace {

using runtime::KernelKind;

struct ElementwiseTiling {
  int block_dim = 1;
};

// One block per at least kMinChunk elements, up to the vector limit.
ElementwiseTiling choose_elementwise_tiling(int64_t n, int max_blocks) {
  constexpr int64_t kMinChunk = 16 * 1024;
  return {static_cast<int>(std::clamp<int64_t>(n / kMinChunk, 1, max_blocks))};
}

template <typename Fn>
void binary_out(const char* name, const Tensor& a, const Tensor& b, Tensor& out, Fn fn) {
  CM_CHECK(a.shape() == b.shape() && a.shape() == out.shape(), "pass tensors of equal shape",
           "{}: shapes differ: {}, {}, {}", name, shape_str(a.shape()), shape_str(b.shape()),
           shape_str(out.shape()));
  CM_CHECK(a.dtype() == DType::f32 && b.dtype() == DType::f32 && out.dtype() == DType::f32,
           "convert inputs to f32", "{} needs f32 tensors", name);
  CM_CHECK(a.is_contiguous() && b.is_contiguous() && out.is_contiguous(),
           "call .contiguous() on the inputs", "{} needs contiguous tensors", name);
  const int64_t n = a.numel();
  runtime::Stream stream = runtime::current_stream();
  const runtime::CoreLimits limits = stream.effective_limits();
  auto [cache_id, tiling] = runtime::OpCache::global().get<ElementwiseTiling>(
      runtime::OpKey{name, {a.shape(), b.shape()}, {a.dtype(), b.dtype()}, limits, ""},
      [&] { return choose_elementwise_tiling(n, runtime::max_blocks(limits, KernelKind::vector)); });
  const int blocks = tiling->block_dim;
  stream.launch({name, KernelKind::vector, blocks, cache_id},
                [a, b, out, n, fn](const runtime::BlockContext& ctx) {
                  const int64_t begin = n * ctx.block_idx / ctx.block_dim;
                  const int64_t end = n * (ctx.block_idx + 1) / ctx.block_dim;
                  const float* x = a.data<float>();
                  const float* y = b.data<float>();
                  float* z = out.data<float>();
                  for (int64_t i = begin; i < end; ++i) z[i] = fn(x[i], y[i]);
                });
}

}  // namespace

void add_out(const Tensor& a, const Tensor& b, Tensor& out) {
  binary_out("add", a, b, out, [](float x, float y) { return x + y; });
}
void mul_out(const Tensor& a, const Tensor& b, Tensor& out) {
  binary_out("mul", a, b, out, [](float x, float y) { return x * y; });
}

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), DType::f32);
  add_out(a, b, out);
  return out;
}
Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape(), DType::f32);
  mul_out(a, b, out);
  return out;
}

}  // namespace coremesh::ops
