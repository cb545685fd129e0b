// What ShmemExperts' exchanges share (expert_parallel.cpp, and the shadowed
// experts' parts in expert_shadows.cpp): the signals of a site, the sender
// of non-blocking pieces, the per-exchange plan. Internal to src/parallel.
#pragma once

#include <algorithm>
#include <cstring>

#include "coremesh/core/error.hpp"
#include "coremesh/ops/quant.hpp"
#include "coremesh/parallel/expert_parallel.hpp"
#include "coremesh/shmem/rma.hpp"
#include "coremesh/shmem/session.hpp"
#include "coremesh/shmem/stream_ops.hpp"

namespace coremesh::parallel::expert_exchange {

// kLoads: the counts for the plan; kGrads + w: weight w's shadow parts
// arrived; kAck + w: an owner took my parts of weight w (starts at ep: the
// round before the first is taken).
// kSignals + s (fused dispatch): source s's rows and counts arrived.
enum Signal { kInFwd = 0, kBackFwd = 1, kInBwd = 2, kBackBwd = 3, kLoads = 4, kGrads = 5, kAck = 7, kSignals = 9 };

// Rows of a row-major (rows, ...) tensor of any dtype: the bytes of one,
// where row `row` starts.
inline size_t row_bytes(const Tensor& t) { return t.nbytes() / size_t(std::max<int64_t>(t.size(0), 1)); }
inline std::byte* rows_at(const Tensor& t, int64_t row) {
  return static_cast<std::byte*>(t.raw_data()) + size_t(row) * row_bytes(t);
}

inline void copy_rows(const Tensor& to, int64_t to_row, const Tensor& from, int64_t from_row, int64_t n) {
  if (n > 0) std::memcpy(rows_at(to, to_row), rows_at(from, from_row), size_t(n) * row_bytes(to));
}

// Blanks the rows [from, to) of `t`: zeros, or ones in fp8 rows' scales (a
// zero tile's scale, as ops::quantize_fp8_act writes it).
inline void zero_rows(const Tensor& t, int64_t from, int64_t to, bool scales = false) {
  if (to <= from) return;
  if (scales) std::fill(reinterpret_cast<float*>(rows_at(t, from)), reinterpret_cast<float*>(rows_at(t, to)), 1.0f);
  else std::memset(rows_at(t, from), 0, size_t(to - from) * row_bytes(t));
}

// Scale columns of fp8 rows of `width`: one per 1x128 tile.
inline int64_t scale_cols(int64_t width) { return (width + ops::kQuantBlock - 1) / ops::kQuantBlock; }

// Blocks for `items` independent pieces of a copy: as many as the stream's
// vector-core limit allows (one-sided communication runs on vector cores).
inline int comm_blocks(const runtime::Stream& stream, int64_t items) {
  const int limit = runtime::max_blocks(stream.effective_limits(), runtime::KernelKind::comm);
  return int(std::clamp<int64_t>(items, 1, limit));
}

// The members block `ctx` serves, starting after me so that the members do
// not all send to the same PE first; me last.
template <typename F>
void for_members(const Group& ep, const runtime::BlockContext& ctx, F&& f) {
  const int g = ep.size();
  for (int k = ctx.block_idx; k < g; k += ctx.block_dim) f((ep.me + 1 + k) % g);
}

// One sender's pieces to one receiver in one exchange add up to kSent on the
// receiver's signal, so a receiver that sees ep x kSent has every piece.
constexpr uint64_t kSent = uint64_t{1} << 32;
// A piece is one message on the network path: a non-blocking put of it does
// not hold the sending core for the transfer.
constexpr size_t kPieceBytes = size_t{64} << 10;

// Sends to one PE: non-blocking puts in pieces, each with its own signal add
// (put-with-signal: the add lands after the piece's data), then the rest of
// kSent. The sources must stay untouched until the transfer is done
// (ShmemExperts keeps them to the site's next exchange of the same kind).
class Sender {
 public:
  Sender(uint64_t* sig, int pe) : sig_(sig), pe_(pe) {}
  template <typename T>
  void put(T* dest, const T* src, size_t count) {
    auto* to = reinterpret_cast<std::byte*>(dest);
    const auto* from = reinterpret_cast<const std::byte*>(src);
    for (size_t at = 0, bytes = count * sizeof(T); at < bytes; at += kPieceBytes, --left_)
      shmem::detail::put_signal_bytes(to + at, from + at, std::min(kPieceBytes, bytes - at), sig_, 1,
                                      shmem::SignalOp::add, pe_, /*nbi=*/true);
  }
  // Rows [from_row, from_row + n) of `from` to rows [to_row, ...) of the
  // receiver's `to` (a symmetric tensor of the same row size).
  void put_rows(const Tensor& to, int64_t to_row, const Tensor& from, int64_t from_row, int64_t n) {
    put(rows_at(to, to_row), rows_at(from, from_row), size_t(n) * row_bytes(from));
  }
  void finish() { shmem::detail::put_signal_bytes(sig_, nullptr, 0, sig_, left_, shmem::SignalOp::add, pe_, true); }

 private:
  uint64_t* sig_;
  int pe_;
  uint64_t left_ = kSent;
};

// Rows per source in an owner's receive buffer.
inline int64_t slot_rows(int local, const ShmemExperts::Shape& s) {
  return std::max<int64_t>(1, s.capacity >= 0 ? std::min(s.max_rows, local * s.capacity) : s.max_rows);
}

// Shadow slot k of a plan: its expert, or -1.
inline int64_t shadow_at(const Tensor& shadows, int k) { return shadows.data<int64_t>()[k]; }

}  // namespace coremesh::parallel::expert_exchange

namespace coremesh::parallel {

// What combine and the backward reuse. Source side: the xp offsets. Owner
// side: the counts of the exchange (copied on the stream) and the group
// lists derived from them.
struct ShmemExperts::Plan {
  Site site;
  int64_t rows = 0;        // rows of the source's xp
  uint64_t fwd_round = 0;  // of this site's forward exchanges
  mutable uint64_t bwd_round = 0;
  Tensor xp_offsets;       // (E + 1) i64: the source's xp grouped by global expert
  Tensor counts;           // (ep, 2 E_local) i64: per source, rows per local expert, then their xp starts
  Tensor offsets;          // (E_local + S + 1) i64 of the received rows (then this PE's shadow rows)
  Tensor source_offsets;   // (E_local * ep + S + 1) i64
  Tensor shadows;          // (max(S, 1)) i64: the expert of each shadow slot, -1 when unused
};

}  // namespace coremesh::parallel
