// Flash attention (forward + backward), MHA and GQA, and the merge of two
// partial attention results through their log-sum-exps (ring attention).
//
// Notation: B batch, T query length, S key length, H query heads, Hkv key/value
// heads (H % Hkv == 0; head h reads kv head h / (H/Hkv)), D head size.
//   q (B,T,H,D), k and v (B,S,Hkv,D), out (B,T,H,D), lse (B,H,T), all f32.
//   lse[b,h,t] = log sum_s exp(scale * q[b,t,h] . k[b,s,h'])   (over allowed s)
// causal: query t sees keys s <= t (needs T == S). Rows that see no key get
// out = 0 and lse = -inf. scale <= 0 means 1/sqrt(D).
//
// Tiling: one unit per (b, kv head); its query tiles stack all query heads of
// the GQA group (~32 rows) so they share each K/V tile, and causal tiles stop
// at their last query. The forward splits a unit's queries into chunks when
// there are fewer groups than blocks; units are dealt round-robin to
// block_dim <= the cube limit blocks. The backward's unit owns its dk/dv rows
// and its heads' dq rows, so nothing is reduced afterwards. Tiles run on
// small_gemm (libxsmm); softmax is online (running max and sum).
#pragma once

#include "coremesh/core/tensor.hpp"

namespace coremesh::ops {

struct AttentionOut {
  Tensor out;  // (B,T,H,D)
  Tensor lse;  // (B,H,T)
};
AttentionOut flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true,
                             float scale = 0.0f);

struct AttentionGrads {
  Tensor dq, dk, dv;
};
// dout (B,T,H,D), plus the forward's inputs, out and lse.
AttentionGrads flash_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                        const Tensor& v, const Tensor& out, const Tensor& lse,
                                        bool causal = true, float scale = 0.0f);

// Combines attention of the same queries over two disjoint key sets:
//   lse = log(exp(lse1) + exp(lse2)),  out = exp(lse1 - lse) out1 + exp(lse2 - lse) out2
// out* (B,T,H,D), lse* (B,H,T); an lse of -inf means "no keys".
AttentionOut merge_attention(const Tensor& out1, const Tensor& lse1, const Tensor& out2,
                             const Tensor& lse2);

namespace reference {
// Materializes the full score matrix (the "manual attention" of PyTorch).
AttentionOut attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true,
                       float scale = 0.0f);
AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, bool causal = true, float scale = 0.0f);
}  // namespace reference

}  // namespace coremesh::ops
