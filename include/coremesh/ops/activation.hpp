// Activations and softmax, forward and backward (f32, contiguous).
// Notation: (..., C) tensors; SwiGLU takes the fused gate/up projection
// (..., 2F) laid out as [gate | up] and returns (..., F).
#pragma once

#include "coremesh/core/tensor.hpp"

namespace coremesh::ops {

// silu(x) = x * sigmoid(x)
Tensor silu(const Tensor& x);
Tensor silu_backward(const Tensor& dy, const Tensor& x);

enum class GeluApprox { none, tanh };  // erf form, or GPT-2's tanh form
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::tanh);
Tensor gelu_backward(const Tensor& dy, const Tensor& x, GeluApprox approx = GeluApprox::tanh);

// gate_up (..., 2F) -> silu(gate) * up (..., F)
Tensor swiglu(const Tensor& gate_up);
void swiglu_out(const Tensor& gate_up, const Tensor& out);
// dy (..., F), gate_up (..., 2F) -> d gate_up (..., 2F)
Tensor swiglu_backward(const Tensor& dy, const Tensor& gate_up);

// softmax over the last dimension (max-subtracted); backward from y.
Tensor softmax(const Tensor& x);
Tensor softmax_backward(const Tensor& dy, const Tensor& y);

namespace reference {
Tensor silu(const Tensor& x);
Tensor silu_backward(const Tensor& dy, const Tensor& x);
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::tanh);
Tensor gelu_backward(const Tensor& dy, const Tensor& x, GeluApprox approx = GeluApprox::tanh);
Tensor swiglu(const Tensor& gate_up);
Tensor swiglu_backward(const Tensor& dy, const Tensor& gate_up);
Tensor softmax(const Tensor& x);
Tensor softmax_backward(const Tensor& dy, const Tensor& y);
}  // namespace reference

}  // namespace coremesh::ops
