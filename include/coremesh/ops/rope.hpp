// Rotary position embedding (RoPE), forward and backward.
// Angles are evaluated once per position per kernel block (a small table).
//
// x (B,T,H,D) f32, D even; positions (T) i64 (shared by the batch; e.g. the
// zig-zag chunks of context parallelism). Pair p of a head, frequency
// f_p = base^(-2p/D), angle a = pos * f_p, is rotated by a:
//   (x1, x2) -> (x1 cos a - x2 sin a, x1 sin a + x2 cos a)
// where the pair is (x[p], x[p + D/2]) (half split, GPT-NeoX / Llama) or
// (x[2p], x[2p+1]) (interleaved, GPT-J / DeepSeek). The backward rotates by -a.
#pragma once

#include "coremesh/core/tensor.hpp"

namespace coremesh::ops {

struct RopeConfig {
  float base = 10000.0f;
  bool interleaved = false;
};

Tensor rope(const Tensor& x, const Tensor& positions, const RopeConfig& config = {});
Tensor rope_backward(const Tensor& dy, const Tensor& positions, const RopeConfig& config = {});
// Packed attention projections: qkv (B,T,(H+2Hkv)*D) = one x [Wq;Wk;Wv]^T
// GEMM. Returns contiguous q (B,T,H,D) and k (B,T,Hkv,D) rotated and v
// (B,T,Hkv,D) copied, ready for flash attention, in one pass.
struct QkvHeads {
  Tensor q, k, v;
};
QkvHeads rope_qkv(const Tensor& qkv, int64_t heads, int64_t kv_heads, const Tensor& positions,
                  const RopeConfig& config = {});
// Its backward: dq (B,T,H,D), dk, dv (B,T,Hkv,D) -> dqkv (B,T,(H+2Hkv)*D).
Tensor rope_qkv_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                         const Tensor& positions, const RopeConfig& config = {});
// positions = start, start+1, ..., start+T-1
Tensor rope_positions(int64_t T, int64_t start = 0);

namespace reference {
Tensor rope(const Tensor& x, const Tensor& positions, const RopeConfig& config = {});
}  // namespace reference

}  // namespace coremesh::ops
