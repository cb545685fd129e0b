// Private layer kernels of the model, llm.c style: forward and backward side
// by side, shapes in comments. Notation: N = B*T tokens, C model width,
// H/Hkv heads, D head dim, V vocab, F hidden width. Row-major everywhere;
// linear weights are (out, in) like nn.Linear (y = x W^T).
//
// These are the model's own CPU building blocks until the kernel library
// (include/coremesh/ops) offers equivalents (linear with transposes, rmsnorm,
// rope, causal attention, swiglu, cross entropy); GEMMs go to OpenBLAS.
#pragma once

#include <cstdint>

namespace coremesh::model::detail {

// y (N,out) = x (N,in) @ W^T, W (out,in); beta: 0 overwrite, 1 accumulate.
void linear_forward(float* y, const float* x, const float* w, int64_t N, int64_t in, int64_t out,
                    float beta = 0.0f);
// dx (N,in) (+)= dy (N,out) @ W;   dW (out,in) += dy^T @ x.
// dx may be null (no input gradient wanted); dx_beta 0 overwrites, 1 accumulates.
void linear_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                     int64_t N, int64_t in, int64_t out, float dx_beta);

// y = x / sqrt(mean(x^2) + eps) * w, per row; x, y (N,C), rstd (N).
void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t N, int64_t C,
                     float eps);
// dx (+)= rstd * (dy*w - x * rstd^2 * mean(dy*w*x));  dw += sum_n dy * x * rstd.
void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t N, int64_t C, bool accumulate_dx);

// RoPE in place on x (B*T, nh*D), rotate-half pairs (i, i+D/2), angle t*theta^(-2i/D).
// inverse = true rotates by -angle (the backward of the forward rotation).
void rope_apply(float* x, int64_t B, int64_t T, int64_t nh, int64_t D, float theta, bool inverse);

// Causal attention. q (N, H*D), k, v (N, Hkv*D) -> out (N, H*D); att (B,H,T,T)
// keeps the probabilities for backward. scale = 1/sqrt(D).
void attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                       int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D);
// dq (N,H*D), dk, dv (N,Hkv*D) are overwritten. scratch: T*T floats.
void attention_backward(float* dq, float* dk, float* dv, float* scratch, const float* dout,
                        const float* att, const float* q, const float* k, const float* v, int64_t B,
                        int64_t T, int64_t H, int64_t Hkv, int64_t D);

// g = silu(a) * b, element-wise over n.
void swiglu_forward(float* g, const float* a, const float* b, int64_t n);
// da = dg * b * silu'(a), db = dg * silu(a) (overwritten).
void swiglu_backward(float* da, float* db, const float* dg, const float* a, const float* b,
                     int64_t n);

// Cross entropy over logits (N,V) in place: logits become probabilities.
// Returns the mean loss over the N rows.
double softmax_cross_entropy_forward(float* logits, const int32_t* targets, int64_t N, int64_t V);
// dlogits (N,V) = (probs - onehot(target)) * scale (probs from the forward).
void softmax_cross_entropy_backward(float* dlogits, const float* probs, const int32_t* targets,
                                    int64_t N, int64_t V, float scale);

}  // namespace coremesh::model::detail
