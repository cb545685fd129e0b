// Reductions as reduce-scatter + allgather, each PE pulling the peers'
// buffers through the transport (load/store where it offers the fast path,
// the bandwidth-optimal scheme inside one machine):
//
//   barrier
//   PE r reduces chunk r of every member's source into chunk r of its dest
//        (in tiles held in a local accumulator, so dest == source is fine);
//   barrier
//   PE r copies chunk k != r from member k's dest         (allreduce only)
//   barrier
//
// Each PE reads n elements and writes n. On the network (some member's
// buffers not mapped here) a pair of PEs, or a small vector, skips the
// scatter: every PE reduces the whole vector itself, fetching the peers'
// sources -- one transfer phase and one barrier fewer, the same bytes for a
// pair (not when dest overlaps src: a peer may still read it):
//
//   barrier; PE r reduces every member's source into its dest; barrier
//
// A vector of up to 1 MiB / (n_pes - 1) across hosts, on one of the first
// team slots, is pushed instead (reduce_through_landing): one message per
// 64 KiB part and pair, no barrier.
//
// Every chunk is reduced by one PE (or by each, the same way)
// in member order -- dest[i] = ((src_0[i] op src_1[i]) op src_2[i]) ...
// with src_m the buffer of team member m -- so all PEs end with bit-identical
// results, equal to that sum taken on one PE. bf16 accumulates in f32 and
// rounds once.
#pragma once

#include <algorithm>
#include <atomic>
#include <complex>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include "coremesh/core/dtype.hpp"
#include "coremesh/core/error.hpp"
#include "internal.hpp"
#include "wait.hpp"

namespace coremesh::shmem::internal {

enum class ReduceKind { sum, prod, min, max, band, bor, bxor };

template <typename T>
struct Accumulator {
  using type = T;
  static type load(T v) { return v; }
  static T store(type v) { return v; }
};
template <>
struct Accumulator<bf16> {
  using type = float;
  static float load(bf16 v) {
    uint32_t bits = uint32_t{v.bits} << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  static bf16 store(float f) {  // round to nearest even; NaN stays NaN
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((bits >> 16) | 0x40)};
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return bf16{static_cast<uint16_t>(bits >> 16)};
  }
};

template <ReduceKind K, typename A>
inline A combine(A a, A b) {
  if constexpr (K == ReduceKind::sum) return a + b;
  else if constexpr (K == ReduceKind::prod) return a * b;
  else if constexpr (K == ReduceKind::min) return b < a ? b : a;
  else if constexpr (K == ReduceKind::max) return a < b ? b : a;
  else if constexpr (K == ReduceKind::band) return a & b;
  else if constexpr (K == ReduceKind::bor) return a | b;
  else return a ^ b;
}

// This thread's scratch memory for reduce_chunk, at least `bytes`, kept
// between calls: a fresh tile (up to 1 MiB) is a fresh mapping (above malloc's
// mmap threshold), and UCX's gets into fresh mappings cost ~1 ms a tile (the
// 1 MiB network allreduce took 3.4 ms instead of 1.2).
inline std::byte* reduce_scratch(size_t bytes) {
  static thread_local std::vector<std::max_align_t> buffer;
  const size_t words = (bytes + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t);
  if (buffer.size() < words) buffer.resize(words);
  return reinterpret_cast<std::byte*>(buffer.data());
}

// out[0 .. len) = member(0) op member(1) op ... element by element, in
// member order, through acc (len accumulators); out may be a member.
template <typename T, ReduceKind K, typename Member>
void combine_members(int size, const Member& member, size_t len, typename Accumulator<T>::type* acc,
                     T* out) {
  using Acc = Accumulator<T>;
  const T* first = member(0);
  for (size_t i = 0; i < len; ++i) acc[i] = Acc::load(first[i]);
  for (int m = 1; m < size; ++m) {
    const T* in = member(m);
    for (size_t i = 0; i < len; ++i) acc[i] = combine<K>(acc[i], Acc::load(in[i]));
  }
  for (size_t i = 0; i < len; ++i) out[i] = Acc::store(acc[i]);
}

// Reduces chunk [lo, hi) of every member's `src` (at segment offset
// src_offset) into out[0 .. hi - lo).
// Through the fast path a tile is read in place (8 KiB, in cache); when
// some member's source is not mapped here, tiles are 1 MiB (fewer round
// trips than 256 KiB ones: 1 MiB allreduce 0.73 -> 0.69 ms) and those
// members' tiles are fetched with get_nbi, all at once, and one quiet -- one
// round trip per tile, not per member; mapped ones are still read in place.
template <typename T, ReduceKind K>
void reduce_chunk(const Group& g, size_t src_offset, size_t lo, size_t hi, T* out) {
  using A = typename Accumulator<T>::type;
  Transport& t = transport();
  bool direct = true;
  for (int m = 0; m < g.size && direct; ++m)
    direct = t.peer_pointer(g.world_pe(m), src_offset) != nullptr;
  const size_t tile = std::max<size_t>(1, (direct ? 8192 : 1024 * 1024) / sizeof(T));
  // The accumulator, then (network path) one fetched tile per member.
  const size_t acc_bytes = (std::min(tile, hi - lo) * sizeof(A) + 63) / 64 * 64;
  const size_t tile_bytes = (std::min(tile, hi - lo) * sizeof(T) + 63) / 64 * 64;
  std::byte* scratch = reduce_scratch(acc_bytes + (direct ? 0 : g.size * tile_bytes));
  A* acc = reinterpret_cast<A*>(scratch);
  auto fetched = [&](int m) { return reinterpret_cast<T*>(scratch + acc_bytes + m * tile_bytes); };
  for (size_t at = lo; at < hi; at += tile) {
    const size_t len = std::min(tile, hi - at);
    const size_t offset = src_offset + at * sizeof(T);
    auto member = [&](int m) -> const T* {
      if (const std::byte* p = t.peer_pointer(g.world_pe(m), offset))
        return reinterpret_cast<const T*>(p);
      return fetched(m);
    };
    if (!direct) {  // fetch what is not mapped here (this PE's own source is)
      for (int m = 0; m < g.size; ++m)
        if (t.peer_pointer(g.world_pe(m), offset) == nullptr)
          t.get_nbi(fetched(m), g.world_pe(m), offset, len * sizeof(T));
      t.quiet();
    }
    combine_members<T, K>(g.size, member, len, acc, out + (at - lo));
  }
}

// Whether every PE reduces the whole vector (above). The same answer on
// every member: addresses are symmetric, and a member is unmapped for all
// when the group spans hosts.
inline bool reduce_whole_locally(const Group& g, size_t src_offset, const void* dest,
                                 const void* src, size_t bytes) {
  const auto* d = static_cast<const std::byte*>(dest);
  const auto* s = static_cast<const std::byte*>(src);
  if (d < s + bytes && s < d + bytes) return false;
  if (static_cast<size_t>(g.size - 1) * bytes > 256 * 1024) return false;  // one tile each
  for (int m = 0; m < g.size; ++m)
    if (transport().peer_pointer(g.world_pe(m), src_offset) == nullptr) return true;
  return false;
}

// Whether an allreduce of `bytes` goes through the landing areas (below):
// on one of the first team slots, small enough, and some member's memory
// is not mapped here (the team spans hosts). The same answer on every
// member.
inline bool fits_landing(const Group& g, size_t src_offset, size_t bytes) {
  if (g.team_slot < 0 || g.team_slot >= kLandingTeams) return false;
  if (bytes > landing_slot_bytes(state().n_pes)) return false;
  for (int m = 0; m < g.size; ++m)
    if (transport().peer_pointer(g.world_pe(m), src_offset) == nullptr) return true;
  return false;
}

// An allreduce across hosts, one message per part of 64 KiB and pair of
// members, and no barrier: each PE pushes its vector, each part with a
// signal carrying the call's number, into its slot of every member's
// landing area (layout.hpp), then reduces the parts in member order as
// they land in its own.
// A slot of parity c % 2 is written again (call c + 2 of the pair) only
// after its writer has received the reader's vector of call c + 1, which
// the reader sends once done with call c. A pair numbers its calls through
// one area alike: a team's collectives are called in the same order by all
// members, and teams in other slots use other areas.
template <typename T, ReduceKind K>
void reduce_through_landing(const Group& g, T* dest, const T* src, size_t n, const char* api) {
  using A = typename Accumulator<T>::type;
  State& s = state(api);
  Transport& t = transport();
  const LandingArea area = landing_area(s.n_pes, g.team_slot);
  uint64_t* calls = s.landing_calls.data() + static_cast<size_t>(g.team_slot) * static_cast<size_t>(s.n_pes);
  for (int m = 0; m < g.size; ++m)
    if (m != g.my_index) ++calls[g.world_pe(m)];
  auto parity = [&](int pe) { return static_cast<int>(calls[pe] & 1); };
  constexpr size_t kChunk = kLandingChunkBytes / sizeof(T);
  const size_t chunks = (n + kChunk - 1) / kChunk;
  auto send = [&](size_t c) {  // the next member first: not all send to member 0 at once
    const size_t at = c * kChunk, len = std::min(kChunk, n - at);
    for (int k = 1; k < g.size; ++k) {
      const int pe = g.world_pe((g.my_index + k) % g.size);
      t.push(pe, area.slot(parity(pe), s.my_pe) + at * sizeof(T), src + at, len * sizeof(T),
             area.signal(parity(pe), s.my_pe, c), calls[pe]);
    }
  };
  auto member = [&](int m) {
    if (m == g.my_index) return src;
    const int pe = g.world_pe(m);
    return reinterpret_cast<const T*>(local_address(area.slot(parity(pe), pe)));
  };
  A* acc = reinterpret_cast<A*>(reduce_scratch(kChunk * sizeof(A)));
  auto reduce_part = [&](size_t c) {  // once every member's part c has landed
    for (int m = 0; m < g.size; ++m) {
      const int pe = g.world_pe(m);
      if (m == g.my_index) continue;
      std::atomic_ref<uint64_t> signal(*reinterpret_cast<uint64_t*>(local_address(area.signal(parity(pe), pe, c))));
      wait_until_ready(my_doorbell(), [&] { return signal.load(std::memory_order_acquire) >= calls[pe]; }, [&] {
        return fmt::format("PE {} in {} on {} waits for part {} of PE {}'s vector (their call {})", s.my_pe,
                           api, describe_group(g), c, pe, calls[pe]);
      });
    }
    const size_t at = c * kChunk;
    auto part = [&](int m) { return member(m) + at; };
    combine_members<T, K>(g.size, part, std::min(kChunk, n - at), acc, dest + at);
  };
  // Every part goes out first, then the parts are reduced as they land:
  // reducing between sends was slower (512 KiB 0.28 against 0.22 ms over
  // TCP: a PE that computes does not drain its socket, and its peer's
  // sends wait). src is sent whole before dest, which may be src, is
  // written.
  for (size_t c = 0; c < chunks; ++c) send(c);
  for (size_t c = 0; c < chunks; ++c) reduce_part(c);
}

// allreduce: dest and src hold n elements. scatter (reduce_scatter): src
// holds n = size * chunk elements and dest receives this PE's chunk.
template <typename T, ReduceKind K>
void reduce(const Group& g, T* dest, const T* src, size_t n, bool scatter, const char* api) {
  if (scatter) {
    CM_CHECK(n % g.size == 0, "reduce_scatter takes count_per_pe * team size elements",
             "{}: {} elements do not split evenly over {} PEs", api, n, g.size);
  }
  if (n == 0) {  // still collective
    begin_call(g);
    group_sync(g, api);
    return;
  }
  const size_t src_offset = sym_offset(src, n * sizeof(T), api);
  auto chunk_lo = [&](int r) { return n * static_cast<size_t>(r) / g.size; };
  const size_t my_lo = chunk_lo(g.my_index), my_hi = chunk_lo(g.my_index + 1);
  const size_t dest_offset = sym_offset(dest, (scatter ? my_hi - my_lo : n) * sizeof(T), api);
  begin_call(g);
  if (!scatter && fits_landing(g, src_offset, n * sizeof(T)))
    return reduce_through_landing<T, K>(g, dest, src, n, api);
  group_sync(g, api);
  if (!scatter && reduce_whole_locally(g, src_offset, dest, src, n * sizeof(T))) {
    reduce_chunk<T, K>(g, src_offset, 0, n, dest);
    group_sync(g, api);
    return;
  }
  reduce_chunk<T, K>(g, src_offset, my_lo, my_hi, scatter ? dest : dest + my_lo);
  group_sync(g, api);
  if (scatter) return;
  for (int k = 1; k < g.size; ++k) {
    const int r = (g.my_index + k) % g.size;
    const size_t lo = chunk_lo(r), hi = chunk_lo(r + 1);
    if (hi > lo)
      transport().get(dest + lo, g.world_pe(r), dest_offset + lo * sizeof(T), (hi - lo) * sizeof(T));
  }
  group_sync(g, api);
}

}  // namespace coremesh::shmem::internal
