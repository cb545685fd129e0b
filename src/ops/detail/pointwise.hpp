// Element-wise row functions: one out-of-line definition per op, called by
// the op's own kernel and by a fused chain of element-wise ops (graph mode),
// so both compute every element with the same machine code (bit-identical).
// In place is allowed (y may equal x, a or b).
#pragma once

#include <cstdint>
#include <string>

namespace coremesh::ops::detail {

using UnaryRow = void (*)(const float* x, float* y, int64_t n);
using BinaryRow = void (*)(const float* a, const float* b, float* y, int64_t n);

void add_row(const float* a, const float* b, float* y, int64_t n);   // a + b
void mul_row(const float* a, const float* b, float* y, int64_t n);   // a * b
void silu_row(const float* x, float* y, int64_t n);                  // x sigmoid(x)
void gelu_tanh_row(const float* x, float* y, int64_t n);             // tanh approximation
void gelu_erf_row(const float* x, float* y, int64_t n);              // exact (erf)

struct PointwiseFn {
  int arity = 0;  // 0: not an element-wise op
  UnaryRow unary = nullptr;
  BinaryRow binary = nullptr;
};

// The row function of element-wise op `op` (attrs as in its OpKey).
PointwiseFn pointwise_fn(const std::string& op, const std::string& attrs);

}  // namespace coremesh::ops::detail
