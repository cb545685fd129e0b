// The parts of the model (layout.hpp) as forward/backward pairs over one
// slot's activations, and the state a slot keeps. Private to src/model.
//
//   part        forward (residual stream r = x + delta, kept as the pair)       backward
//   embedding   r = (wte[ids], -)                                                dwte[ids] += dr
//   attention   an = RMSNorm(x + delta);  r = (x + delta, Wo Attn(RoPE(Wqkv an)))  dr -> dx
//   ffn         fn = RMSNorm(x + delta);  r = (x + delta, FFN(fn))                dr -> dh
//   head        loss = CE(RMSNorm(x + delta) head^T)                              -> dr
// Inside a chunk the pair flows on (each residual add is fused into the
// RMSNorm that reads it); at a chunk's end it is added into one tensor, the
// stage's output. Bit for bit the same as the fused add.
#pragma once

#include <cstdint>
#include <vector>

#include "coremesh/model/model.hpp"
#include "coremesh/ops/attention.hpp"
#include "layers.hpp"
#include "moe.hpp"

namespace coremesh::model {

// Parameter indices (into the layout) of one part held; -1: absent.
struct Model::PartParams {
  Part part;
  int norm = -1;                    // attn_norm, ffn_norm or final_norm
  int qkv = -1, wo = -1;            // attention: wq (followed by wk, wv), wo
  int w13 = -1, w2 = -1;            // dense FFN or shared experts: w1 (followed by w3), w2
  int router = -1, ew13 = -1, ew2 = -1;  // routed experts
  int table = -1;                   // embedding: wte; head: lm_head, or wte when tied
  int moe = -1;                     // index into the expert-load tensors
};

namespace detail {

struct Residual {
  Tensor x, delta;  // the stream is x + delta; delta may be undefined
};

struct AttentionActs {
  Tensor x, arstd;           // (N,C) input (the residual stream), (N) RMSNorm rstd
  GemmInput an;              // (N,C) RMSNorm(x) as the qkv GEMM read it
  GemmWeight wqkv, wo;       // this pass's casts of [wq; wk; wv] and wo
  Tensor q, k, v;            // (B,T,H,D), (B,T,Hkv,D) after RoPE
  ops::AttentionOut at;      // out (B,T,H,D) f32 (its backward reads it), lse (B,H,T)
};

struct FfnActs {
  Tensor h, frstd;           // (N,C) input, (N) RMSNorm rstd
  GemmInput ffn_in;          // dense layers: fn = RMSNorm(h) (N,C) as the MLP read it
  Tensor fn;                 // MoE layers: fn (N,C) f32 (the router is f32)
  MlpActs mlp;               // dense layers
  MoeActs moe;               // MoE layers
};

struct HeadActs {
  Tensor xL, xf, frstd;      // input (N,C), RMSNorm(xL) (N,C), (N)
  Tensor logits, lse, loss;  // (N,V), (N), cross entropy per token (N)
};

// A weight-gradient job kept for backward_weight(), with the part whose
// backward made it.
struct DeferredWgrad {
  GradRef ref;
  WgradSink::Job job;
  int part = 0;
};

}  // namespace detail

struct Model::Slot {
  int64_t B = 0, T = 0;
  float loss_scale = 1.0f;
  Tensor ids, targets, positions;  // (N) i32, (N) i32, (T) i64
  std::vector<detail::AttentionActs> attention;  // per layer
  std::vector<detail::FfnActs> ffn;              // per layer
  detail::HeadActs head;
  std::vector<uint8_t> forwarded, backwarded;    // per chunk
};

// Deferred weight gradients of one (slot, chunk).
struct Model::Pending {
  std::vector<detail::DeferredWgrad> jobs;
};

// The forward and backward of each part kind, over Model internals.
struct Parts {
  static detail::Residual embedding_forward(Model& m, Model::Slot& s, const Model::PartParams& p);
  static detail::Residual attention_forward(Model& m, Model::Slot& s, const Model::PartParams& p,
                                            const detail::Residual& in);
  static detail::Residual ffn_forward(Model& m, Model::Slot& s, const Model::PartParams& p,
                                      const detail::Residual& in);
  static void head_forward(Model& m, Model::Slot& s, const Model::PartParams& p, const detail::Residual& in);

  // Each returns d(loss)/d(its input residual stream).
  static Tensor head_backward(Model& m, Model::Slot& s, const Model::PartParams& p, detail::WgradSink& sink);
  static Tensor ffn_backward(Model& m, Model::Slot& s, const Model::PartParams& p, const Tensor& dr,
                             detail::WgradSink& sink);
  static Tensor attention_backward(Model& m, Model::Slot& s, const Model::PartParams& p, const Tensor& dr,
                                   detail::WgradSink& sink);
  static void embedding_backward(Model& m, Model::Slot& s, const Model::PartParams& p, const Tensor& dr,
                                 detail::WgradSink& sink);
};

}  // namespace coremesh::model
