// Data-moving collectives on the shm transport: every member reads what it
// needs straight from the peers' symmetric buffers (pull), between barriers:
//
//   barrier  -- every source is ready
//   pull     -- each PE writes only its own dest
//   barrier  -- nobody reuses a source (or dest) a peer may still read
//
// Small per-call values (collect sizes, alltoallv counts) are published in
// the caller's SyncArea / team slot and read by the peers after the first
// barrier.
#include <cstring>

#include "coremesh/core/error.hpp"
#include "internal.hpp"

namespace coremesh::shmem::internal {

namespace {
const std::byte* peer_bytes(int pe, const void* local_sym, size_t bytes, const char* api) {
  return peer_address(pe, sym_offset(local_sym, bytes, api));
}
std::byte* as_bytes(void* p) { return static_cast<std::byte*>(p); }
}  // namespace

void broadcast(const Group& g, void* dest, const void* src, size_t bytes, int root,
               bool root_copies, const char* api) {
  CM_CHECK(root >= 0 && root < g.size, "PE_root is an index within the team / active set",
           "{}: root {} is not in {} of {} PEs", api, root, describe_group(g), g.size);
  sym_offset(dest, bytes, api);
  const std::byte* source = peer_bytes(g.world_pe(root), src, bytes, api);
  begin_call(g);
  group_sync(g, api);
  if (g.my_index != root || (root_copies && dest != src)) std::memcpy(dest, source, bytes);
  group_sync(g, api);
}

void fcollect(const Group& g, void* dest, const void* src, size_t bytes, const char* api) {
  sym_offset(dest, bytes * g.size, api);
  const size_t src_offset = sym_offset(src, bytes, api);
  begin_call(g);
  group_sync(g, api);
  for (int i = 0; i < g.size; ++i)
    std::memcpy(as_bytes(dest) + i * bytes, peer_address(g.world_pe(i), src_offset), bytes);
  group_sync(g, api);
}

void collect(const Group& g, void* dest, const void* src, size_t bytes, const char* api) {
  const size_t src_offset = sym_offset(src, bytes, api);
  State& s = state(api);
  const int parity = begin_call(g);
  sync_area(s.my_pe, g.sync_offset)->published[parity][0] = static_cast<int64_t>(bytes);
  group_sync(g, api);
  size_t at = 0;
  std::vector<size_t> sizes(g.size);
  for (int i = 0; i < g.size; ++i) {
    sizes[i] = static_cast<size_t>(sync_area(g.world_pe(i), g.sync_offset)->published[parity][0]);
    at += sizes[i];
  }
  sym_offset(dest, at, api);
  at = 0;
  for (int i = 0; i < g.size; ++i) {
    std::memcpy(as_bytes(dest) + at, peer_address(g.world_pe(i), src_offset), sizes[i]);
    at += sizes[i];
  }
  group_sync(g, api);
}

void alltoall(const Group& g, void* dest, const void* src, size_t bytes_per_pe, const char* api) {
  sym_offset(dest, bytes_per_pe * g.size, api);
  const size_t src_offset = sym_offset(src, bytes_per_pe * g.size, api);
  begin_call(g);
  group_sync(g, api);
  // Start with the next PE so that not everybody reads PE 0 first.
  for (int k = 0; k < g.size; ++k) {
    const int i = (g.my_index + k) % g.size;
    std::memcpy(as_bytes(dest) + i * bytes_per_pe,
                peer_address(g.world_pe(i), src_offset + g.my_index * bytes_per_pe),
                bytes_per_pe);
  }
  group_sync(g, api);
}

void alltoalls(const Group& g, void* dest, const void* src, ptrdiff_t dst, ptrdiff_t sst,
               size_t nelems, size_t elem_bytes, const char* api) {
  CM_CHECK(dst >= 1 && sst >= 1, "strides count elements and must be >= 1",
           "{}: strides dst {} sst {}", api, dst, sst);
  const size_t count = nelems * g.size;
  if (count == 0) {
    begin_call(g);
    group_sync(g, api);
    return;
  }
  sym_offset(dest, ((count - 1) * dst + 1) * elem_bytes, api);
  const size_t src_offset = sym_offset(src, ((count - 1) * sst + 1) * elem_bytes, api);
  begin_call(g);
  group_sync(g, api);
  for (int i = 0; i < g.size; ++i) {
    const std::byte* peer = peer_address(g.world_pe(i), src_offset);
    for (size_t e = 0; e < nelems; ++e) {
      const size_t from = (g.my_index * nelems + e) * sst, to = (i * nelems + e) * dst;
      std::memcpy(as_bytes(dest) + to * elem_bytes, peer + from * elem_bytes, elem_bytes);
    }
  }
  group_sync(g, api);
}

// alltoallv metadata in the team slot after the SyncArea:
//   int64 meta[parity][kind][n_pes], kind 0 = send counts, 1 = send offsets,
//   2 = recv counts (all in elements).
std::vector<CopySpan> alltoallv_exchange(const Group& g, void* dest, const size_t* recv_counts,
                                         const size_t* recv_offsets, const void* src,
                                         const size_t* send_counts, const size_t* send_offsets,
                                         size_t elem_bytes, const char* api) {
  CM_ASSERT(g.has_team_slot);
  State& s = state(api);
  const size_t n = static_cast<size_t>(g.size);
  size_t src_end = 0, dest_end = 0;
  for (size_t i = 0; i < n; ++i) {
    if (send_counts[i]) src_end = std::max(src_end, send_offsets[i] + send_counts[i]);
    if (recv_counts[i]) dest_end = std::max(dest_end, recv_offsets[i] + recv_counts[i]);
  }
  const size_t src_offset = sym_offset(src, src_end * elem_bytes, api);
  sym_offset(dest, dest_end * elem_bytes, api);
  const int parity = begin_call(g);
  auto meta = [&](int pe, int kind) {
    return reinterpret_cast<int64_t*>(peer_address(pe, g.sync_offset + sizeof(SyncArea)) +
                                      ((parity * 3 + kind) * n) * sizeof(int64_t));
  };
  for (size_t i = 0; i < n; ++i) {
    meta(s.my_pe, 0)[i] = static_cast<int64_t>(send_counts[i]);
    meta(s.my_pe, 1)[i] = static_cast<int64_t>(send_offsets[i]);
    meta(s.my_pe, 2)[i] = static_cast<int64_t>(recv_counts[i]);
  }
  group_sync(g, api);
  // Every PE checks the whole count matrix, so a mismatch fails everywhere.
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      const int64_t sent = meta(g.world_pe(a), 0)[b], expected = meta(g.world_pe(b), 2)[a];
      CM_CHECK(sent == expected,
               "recv_counts[j] on PE i must equal send_counts[i] on PE j (exchange the counts "
               "first, e.g. with alltoall)",
               "{} on {}: PE {} sends {} elements to PE {}, which expects {}", api,
               describe_group(g), g.world_pe(a), sent, g.world_pe(b), expected);
    }
  }
  std::vector<CopySpan> copies;
  for (size_t k = 0; k < n; ++k) {
    const size_t j = (g.my_index + k) % n;
    if (recv_counts[j] == 0) continue;
    const int peer = g.world_pe(static_cast<int>(j));
    const size_t from = static_cast<size_t>(meta(peer, 1)[g.my_index]);
    copies.push_back({as_bytes(dest) + recv_offsets[j] * elem_bytes,
                      peer_address(peer, src_offset + from * elem_bytes),
                      recv_counts[j] * elem_bytes});
  }
  return copies;
}

void run_copies(const std::vector<CopySpan>& copies, size_t part, size_t parts) {
  size_t total = 0;
  for (const CopySpan& c : copies) total += c.bytes;
  // Part p copies bytes [total * p / parts, total * (p + 1) / parts) of the
  // concatenation, cut at 64-byte multiples.
  auto cut = [&](size_t p) { return p == parts ? total : total * p / parts / 64 * 64; };
  const size_t lo = cut(part), hi = cut(part + 1);
  size_t at = 0;
  for (const CopySpan& c : copies) {
    const size_t begin = std::max(lo, at), end = std::min(hi, at + c.bytes);
    if (begin < end) std::memcpy(c.dst + (begin - at), c.src + (begin - at), end - begin);
    at += c.bytes;
  }
}

void alltoallv(const Group& g, void* dest, const size_t* recv_counts, const size_t* recv_offsets,
               const void* src, const size_t* send_counts, const size_t* send_offsets,
               size_t elem_bytes, const char* api) {
  run_copies(alltoallv_exchange(g, dest, recv_counts, recv_offsets, src, send_counts,
                                send_offsets, elem_bytes, api),
             0, 1);
  group_sync(g, api);
}

}  // namespace coremesh::shmem::internal
