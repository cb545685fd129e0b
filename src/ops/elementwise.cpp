// Element-wise arithmetic (add, mul), the bias add, and the kernel of a
// fused chain of element-wise ops that graph mode builds (elementwise_chain).
#include "coremesh/ops/elementwise.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <sstream>

#include "detail/checks.hpp"
#include "detail/launch.hpp"
#include "detail/pointwise.hpp"

namespace coremesh::ops {
namespace detail {
runtime::Kernel build_elementwise_chain(const runtime::OpDesc& desc);
}  // namespace detail

namespace {

using runtime::KernelKind;

// One block per at least kMinChunk elements, up to the vector limit; block
// b of bd takes elements [n b / bd, n (b+1) / bd).
constexpr int64_t kMinChunk = 16 * 1024;
// Elements per step of a fused element-wise chain (a buffer on the stack).
constexpr int64_t kChainChunk = 4096;

void check_same_f32(const char* name, const Tensor& a, const Tensor& b, const Tensor& out) {
  CM_CHECK(a.shape() == b.shape() && a.shape() == out.shape(), "pass tensors of equal shape",
           "{}: shapes differ: {}, {}, {}", name, shape_str(a.shape()), shape_str(b.shape()),
           shape_str(out.shape()));
  CM_CHECK(a.dtype() == DType::f32 && b.dtype() == DType::f32 && out.dtype() == DType::f32,
           "convert inputs to f32", "{} needs f32 tensors", name);
  CM_CHECK(a.is_contiguous() && b.is_contiguous() && out.is_contiguous(),
           "call .contiguous() on the inputs", "{} needs contiguous tensors", name);
}

void binary_out(const char* name, const Tensor& a, const Tensor& b, const Tensor& out, detail::BinaryRow fn) {
  check_same_f32(name, a, b, out);
  detail::check_disjoint(out, "out", a, "a", /*in_place=*/true);
  detail::check_disjoint(out, "out", b, "b", /*in_place=*/true);
  const int64_t n = a.numel();
  detail::Plan plan = detail::plan(name, KernelKind::vector, {a.shape(), b.shape()}, {a.dtype(), b.dtype()}, "",
                                   [n](int max_blocks) {
                                     detail::Tiling t;
                                     t.block_dim = static_cast<int>(std::clamp<int64_t>(n / kMinChunk, 1, max_blocks));
                                     return t;
                                   });
  detail::launch(std::move(plan), {{a, b}, {out}}, [a, b, out, n, fn](const runtime::BlockContext& ctx) {
    const int64_t begin = n * ctx.block_idx / ctx.block_dim;
    const int64_t end = n * (ctx.block_idx + 1) / ctx.block_dim;
    fn(a.data<float>() + begin, b.data<float>() + begin, out.data<float>() + begin, end - begin);
  });
}

}  // namespace

void add_out(const Tensor& a, const Tensor& b, Tensor& out) { binary_out("add", a, b, out, detail::add_row); }
void mul_out(const Tensor& a, const Tensor& b, Tensor& out) { binary_out("mul", a, b, out, detail::mul_row); }

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

// out[r, c] = x[r, c] + bias[c]
void add_bias_out(const Tensor& x, const Tensor& bias, const Tensor& out) {
  for (const Tensor* t : {&x, &bias, &out}) {
    detail::check_contiguous(*t, "add_bias tensor");
    detail::check_dtype(*t, DType::f32, "add_bias tensor");
  }
  CM_CHECK(x.dim() >= 1 && bias.dim() == 1 && bias.size(0) == x.size(-1), "bias must be (C) for x (..., C)",
           "add_bias of {} and {}", x.describe(), bias.describe());
  detail::check_disjoint(out, "out", x, "x", /*in_place=*/true);
  detail::check_disjoint(out, "out", bias, "bias");
  detail::check_shape(out, x.shape(), "out");
  const int64_t C = x.size(-1);
  detail::launch_rows("add_bias", KernelKind::vector, {x.shape(), bias.shape()}, {DType::f32}, "",
                      {{x, bias}, {out}}, detail::rows_of(x), C, [x, bias, out, C](int64_t r0, int64_t r1) {
                        for (int64_t r = r0; r < r1; ++r)
                          detail::add_row(x.data<float>() + r * C, bias.data<float>(), out.data<float>() + r * C, C);
                      });
}

Tensor add_bias(const Tensor& x, const Tensor& bias) {
  Tensor out = Tensor::empty(x.shape());
  add_bias_out(x, bias, out);
  return out;
}

// A chain of element-wise ops as one kernel. attrs "chain=<step> <step> ...",
// a step "op[.attr](operands)" with operands "t" (the previous step's
// result) or "iK" (input K of the descriptor): "silu(i0) mul(t,i1)". Each
// chunk of 4096 elements runs the steps through a buffer of one chunk,
// calling the ops' own row functions, so every element is bit-identical to
// running the ops one by one.
runtime::Kernel detail::build_elementwise_chain(const runtime::OpDesc& desc) {
  constexpr int64_t kChunk = kChainChunk;
  struct Step {
    PointwiseFn fn;
    std::vector<int> operands;  // -1: t, else input index
  };
  const std::optional<std::string> program = desc.key.attr("chain");
  CM_CHECK(program && desc.outputs.size() == 1, "describe the chain as attrs chain=... with one output",
           "bad elementwise_chain descriptor {{{}}}", desc.key.attrs);
  std::vector<Step> steps;
  std::istringstream words(*program);
  for (std::string word; words >> word;) {
    const size_t open = word.find('('), dot = word.find('.');
    CM_CHECK(open != std::string::npos && word.back() == ')', "write steps as op(operands)", "bad chain step '{}'", word);
    const std::string op = word.substr(0, std::min(open, dot));
    const std::string attrs = dot < open ? word.substr(dot + 1, open - dot - 1) : "";
    Step s{pointwise_fn(op, attrs), {}};
    std::istringstream list(word.substr(open + 1, word.size() - open - 2));
    for (std::string operand; std::getline(list, operand, ',');)
      s.operands.push_back(operand == "t" ? -1 : std::stoi(operand.substr(1)));
    CM_CHECK(s.fn.arity > 0 && static_cast<int>(s.operands.size()) == s.fn.arity,
             "chain only element-wise ops with their operand counts", "bad chain step '{}'", word);
    for (int i : s.operands)
      CM_CHECK(i < static_cast<int>(desc.inputs.size()) && (i >= 0 || !steps.empty()),
               "operand iK must name an input; t needs a step before", "bad operand in chain step '{}'", word);
    steps.push_back(std::move(s));
  }
  CM_CHECK(!steps.empty(), "give the chain at least one step", "empty elementwise chain");
  const Tensor out = desc.outputs[0];
  for (const Tensor& t : desc.inputs) check_same_f32("elementwise_chain", t, t, out);
  const int64_t n = out.numel();
  Plan plan = plan_rows_for(desc.key, KernelKind::vector, ceil_div(n, kChunk), kChunk);
  const int64_t align = plan.tiling.align;
  std::vector<Tensor> inputs = desc.inputs;
  return make_kernel(std::move(plan), {desc.inputs, desc.outputs},
                     rows_body(ceil_div(n, kChunk), align, [inputs, out, steps, n](int64_t c0, int64_t c1) {
                       float t[kChainChunk];
                       for (int64_t c = c0; c < c1; ++c) {
                         const int64_t at = c * kChainChunk, len = std::min(n - at, kChainChunk);
                         for (size_t s = 0; s < steps.size(); ++s) {
                           float* y = s + 1 == steps.size() ? out.data<float>() + at : t;
                           auto arg = [&](int i) -> const float* { return i < 0 ? t : inputs[size_t(i)].data<float>() + at; };
                           const Step& step = steps[s];
                           if (step.fn.arity == 1) step.fn.unary(arg(step.operands[0]), y, len);
                           else step.fn.binary(arg(step.operands[0]), arg(step.operands[1]), y, len);
                         }
                       }
                     }));
}

}  // namespace coremesh::ops
