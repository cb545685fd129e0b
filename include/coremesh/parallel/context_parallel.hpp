// Context parallelism over SHMEM: the ContextParallel seam for sequences
// split over the PEs of a CP group (cp of them).
//
// The split (SequenceSplit): each sequence of T tokens is cut into 2·cp
// chunks and rank r holds chunks r and 2·cp−1−r (zig-zag: every rank gets
// the same causal work), or, zig-zag off, cp chunks and rank r chunk r.
// positions() gives each local token its true position (RoPE).
//
// Ring (cp_comm ring; Liu et al., "Ring Attention"; the zig-zag balance of
// ring-flash-attention): K/V blocks travel around the ring r -> r+1 by
// one-sided puts into the next PE's symmetric slots, on a comm stream, while
// the compute stream attends over the block just received.
// Under zig-zag a step against the block of rank s is one full
// (non-causal) attention: s < r: all local queries against s's first chunk;
// s > r: the local second chunk against both of s's chunks; s = r: causal.
// The partial results merge by their log-sum-exps (ops::merge_attention).
// The backward runs its own ring: K/V travel as in the forward and the
// dK/dV accumulator of each block travels with it, each rank adding its
// share, until it arrives at the block's owner (rank r's dK is summed in the
// order r, r+1, ..., r−1). Two slots per channel (double buffering); a
// receiver hands a slot back (a signal to the sender) once it is done with it.
//
// Ulysses (cp_comm ulysses; DeepSpeed-Ulysses): an all-to-all turns q, k, v
// from sequence-sharded (B,T/cp,H,D) into head-sharded (B,T,H/cp,D), one full
// causal flash attention runs on the heads of this PE, and an all-to-all
// brings out and lse back. The backward sends dout, q, k, v, out and lse to
// head sharding again (nothing head-sharded is kept between the passes) and
// dq, dk, dv back. Needs H and Hkv divisible by cp.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coremesh/parallel/comm.hpp"
#include "coremesh/parallel/config.hpp"
#include "coremesh/parallel/seams.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::parallel {

// Which tokens of each sequence a CP rank holds.
struct SequenceSplit {
  int cp = 1, rank = 0;
  bool zigzag = true;
  int chunks() const { return zigzag ? 2 * cp : cp; }
  // The global chunks of `r`, in local order (zig-zag: r, 2·cp−1−r).
  std::vector<int> chunks_of(int r) const;
  // Global position of local token t of rank r, local length T_local.
  int64_t global(int r, int64_t t, int64_t T_local) const;
  Tensor positions(int64_t T_local) const;  // (T_local) i64 of this rank
};

// Bytes one PE puts per attention call (forward or backward), by formula.
struct CpTraffic {
  int64_t forward = 0, backward = 0;
};
// B, T_local, H, Hkv, D: this PE's shapes; f32.
CpTraffic cp_bytes_per_call(CpComm comm, int cp, int64_t B, int64_t T_local, int64_t H, int64_t Hkv, int64_t D);

class ShmemContext final : public ContextParallel {
 public:
  struct Sizes {
    int64_t batch = 0, tokens = 0;  // B and T_local at most
    int64_t heads = 0, kv_heads = 0, head_dim = 0;
  };
  // Collective over the world (allocates the symmetric buffers).
  ShmemContext(Group cp, CpComm comm, bool zigzag, const Sizes& max);
  ~ShmemContext() override;
  // What a layout must change for `comm` (empty: fine).
  static std::vector<std::string> problems(CpComm comm, int cp, int64_t heads, int64_t kv_heads);

  const SequenceSplit& split() const { return split_; }
  int64_t bytes_put() const { return bytes_put_; }  // counted as the puts are enqueued
  // Bytes of symmetric memory the buffers take on each PE.
  static int64_t symmetric_bytes(CpComm comm, int cp, const Sizes& max);

  Tensor positions(int64_t T) const override { return split_.positions(T); }
  ops::AttentionOut attention(const Tensor& q, const Tensor& k, const Tensor& v) override;
  ops::AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const ops::AttentionOut& fwd) override;

  struct Channel;   // ring: symmetric slots the previous PE puts into
  struct Exchange;  // Ulysses: a symmetric all-to-all receive buffer

 private:
  void check_shapes(const Tensor& q, const Tensor& k) const;
  // K/V of this step (views of slot `s`'s predecessor or this PE's own) to
  // the next PE's slot s on the comm stream; the event: the put has run.
  runtime::Event forward_kv(int s, const std::vector<Tensor>& kv);
  ops::AttentionOut ring_forward(const Tensor& q, const Tensor& k, const Tensor& v);
  ops::AttentionGrads ring_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const ops::AttentionOut& fwd);
  // Sequence-sharded (B,T_l,Hx,Dx) tensors -> head-sharded (B,T,Hx/cp,Dx), and back.
  std::vector<Tensor> to_heads(const std::vector<Tensor>& xs);
  std::vector<Tensor> to_sequence(const std::vector<Tensor>& ys);
  void all_to_all(int64_t msg, std::function<void(int, float*)> pack, std::function<void(int, float*)> unpack);

  Group group_;
  CpComm comm_kind_;
  SequenceSplit split_;
  Sizes max_;
  std::optional<runtime::Stream> comm_;  // the K/V puts (made at the first ring call)
  std::unique_ptr<Channel> kv_, dkv_;
  std::unique_ptr<Exchange> a2a_;
  int64_t bytes_put_ = 0;
};

}  // namespace coremesh::parallel
