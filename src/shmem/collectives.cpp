// Data-moving collectives: every member pulls what it needs from the
// peers' symmetric buffers with the transport's get, between barriers:
//
//   barrier  -- every source is ready
//   pull     -- each PE writes only its own dest
//   barrier  -- nobody reuses a source (or dest) a peer may still read
//
// Small per-call values (collect sizes, alltoallv counts) are published in
// the caller's SyncArea / team slot and fetched by the peers after the
// first barrier. Zero-length calls still synchronise (they are collective)
// but check no address.
#include <cstring>

#include "coremesh/core/error.hpp"
#include "internal.hpp"

namespace coremesh::shmem::internal {

namespace {
std::byte* as_bytes(void* p) { return static_cast<std::byte*>(p); }
void pull(void* dst, int pe, size_t offset, size_t bytes) {
  if (bytes != 0) transport().get(dst, pe, offset, bytes);
}
}  // namespace

void broadcast(const Group& g, void* dest, const void* src, size_t bytes, int root,
               bool root_copies, const char* api) {
  CM_CHECK(root >= 0 && root < g.size, "PE_root is an index within the team / active set",
           "{}: root {} is not in {} of {} PEs", api, root, describe_group(g), g.size);
  const size_t src_offset = bytes ? sym_offset(src, bytes, api) : 0;
  if (bytes) sym_offset(dest, bytes, api);
  begin_call(g);
  group_sync(g, api);
  if (g.my_index != root) pull(dest, g.world_pe(root), src_offset, bytes);
  else if (root_copies && dest != src && bytes) std::memmove(dest, src, bytes);
  group_sync(g, api);
}

void fcollect(const Group& g, void* dest, const void* src, size_t bytes, const char* api) {
  const size_t src_offset = bytes ? sym_offset(src, bytes, api) : 0;
  if (bytes) sym_offset(dest, bytes * g.size, api);
  begin_call(g);
  group_sync(g, api);
  for (int k = 0; k < g.size; ++k) {
    const int i = (g.my_index + k) % g.size;  // not everybody reads member 0 first
    pull(as_bytes(dest) + i * bytes, g.world_pe(i), src_offset, bytes);
  }
  group_sync(g, api);
}

void collect(const Group& g, void* dest, const void* src, size_t bytes, const char* api) {
  // Each member publishes its size and where its source lies: a member
  // that contributes nothing may pass any source (NULL too), so nobody
  // reads a peer's source at an offset of its own.
  const int64_t mine[2] = {static_cast<int64_t>(bytes),
                           bytes ? static_cast<int64_t>(sym_offset(src, bytes, api)) : 0};
  // A team's members count the same calls, so its call parity agrees on
  // every member. An active set's count lives in the user's pSync array,
  // which the program may also pass to other active sets (9.9.1): the
  // members' counts then differ, and a parity taken from them would read
  // a peer's other slot (stale sizes: wrong data). The call ends with a
  // sync after every read, so one slot suffices there.
  const int parity = begin_call(g);
  const std::vector<int64_t> all = exchange(g, g.team_slot >= 0 ? parity : 0, mine, api);
  size_t total = 0;
  for (int i = 0; i < g.size; ++i) total += static_cast<size_t>(all[2 * i]);
  if (total) sym_offset(dest, total, api);
  size_t at = 0;
  for (int i = 0; i < g.size; ++i) {
    const auto size = static_cast<size_t>(all[2 * i]);
    pull(as_bytes(dest) + at, g.world_pe(i), static_cast<size_t>(all[2 * i + 1]), size);
    at += size;
  }
  group_sync(g, api);
}

void alltoall(const Group& g, void* dest, const void* src, size_t bytes_per_pe, const char* api) {
  const size_t src_offset = bytes_per_pe ? sym_offset(src, bytes_per_pe * g.size, api) : 0;
  if (bytes_per_pe) sym_offset(dest, bytes_per_pe * g.size, api);
  begin_call(g);
  group_sync(g, api);
  for (int k = 0; k < g.size; ++k) {
    const int i = (g.my_index + k) % g.size;
    pull(as_bytes(dest) + i * bytes_per_pe, g.world_pe(i), src_offset + g.my_index * bytes_per_pe,
         bytes_per_pe);
  }
  group_sync(g, api);
}

void alltoalls(const Group& g, void* dest, const void* src, ptrdiff_t dst, ptrdiff_t sst,
               size_t nelems, size_t elem_bytes, const char* api) {
  CM_CHECK(dst >= 1 && sst >= 1, "strides count elements and must be >= 1",
           "{}: strides dst {} sst {}", api, dst, sst);
  const size_t count = array_bytes(nelems, size_t(g.size));  // elements over the team
  if (count == 0) {
    begin_call(g);
    group_sync(g, api);
    return;
  }
  sym_offset(dest, span_bytes(count, size_t(dst), elem_bytes), api);
  const size_t src_offset = sym_offset(src, span_bytes(count, size_t(sst), elem_bytes), api);
  begin_call(g);
  group_sync(g, api);
  std::vector<std::byte> scratch;
  const size_t span = ((nelems - 1) * sst + 1) * elem_bytes;  // my part of one peer's source
  for (int i = 0; i < g.size; ++i) {
    const std::byte* peer =
        view(g.world_pe(i), src_offset + g.my_index * nelems * sst * elem_bytes, span, scratch);
    for (size_t e = 0; e < nelems; ++e) {
      std::memcpy(as_bytes(dest) + (i * nelems + e) * dst * elem_bytes,
                  peer + e * sst * elem_bytes, elem_bytes);
    }
  }
  group_sync(g, api);
}

// alltoallv metadata in the team slot after the SyncArea:
//   int64 meta[parity][kind][n_pes], kind 0 = send counts (elements),
//   1 = where those elements start (symmetric byte offset), 2 = recv counts.
std::vector<CopySpan> alltoallv_exchange(const Group& g, void* dest, const size_t* recv_counts,
                                         const size_t* recv_offsets, const void* src,
                                         const size_t* send_counts, const size_t* send_offsets,
                                         size_t elem_bytes, const char* api, int call_parity) {
  CM_ASSERT(g.team_slot >= 0);
  state(api);  // checks that the library is initialized
  const size_t n = static_cast<size_t>(g.size);
  size_t src_end = 0, dest_end = 0;
  for (size_t i = 0; i < n; ++i) {
    if (send_counts[i]) src_end = std::max(src_end, send_offsets[i] + send_counts[i]);
    if (recv_counts[i]) dest_end = std::max(dest_end, recv_offsets[i] + recv_counts[i]);
  }
  const size_t src_offset = src_end ? sym_offset(src, src_end * elem_bytes, api) : 0;
  if (dest_end) sym_offset(dest, dest_end * elem_bytes, api);
  // Publish our counts in our team slot, then fetch every member's rows.
  const int parity = call_parity >= 0 ? call_parity : begin_call(g);
  const size_t meta_bytes = 3 * n * sizeof(int64_t);
  auto meta_offset = [&](int p) {
    return g.sync_offset + sizeof(SyncArea) + static_cast<size_t>(p) * meta_bytes;
  };
  auto* mine = reinterpret_cast<int64_t*>(local_address(meta_offset(parity)));
  for (size_t i = 0; i < n; ++i) {
    mine[i] = static_cast<int64_t>(send_counts[i]);
    mine[n + i] = static_cast<int64_t>(src_offset + send_offsets[i] * elem_bytes);  // absolute
    mine[2 * n + i] = static_cast<int64_t>(recv_counts[i]);
  }
  group_sync(g, api);
  std::vector<int64_t> all(n * 3 * n);  // member a's [kind][peer] at all[a * 3n ...]
  for (size_t a = 0; a < n; ++a) {
    if (static_cast<int>(a) == g.my_index) std::memcpy(&all[a * 3 * n], mine, meta_bytes);
    else transport().get(&all[a * 3 * n], g.world_pe(static_cast<int>(a)), meta_offset(parity), meta_bytes);
  }
  auto meta = [&](size_t member, int kind, size_t peer) { return all[member * 3 * n + kind * n + peer]; };
  // Every PE checks the whole count matrix, so a mismatch fails everywhere.
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      const int64_t sent = meta(a, 0, b), expected = meta(b, 2, a);
      CM_CHECK(sent == expected,
               "recv_counts[j] on PE i must equal send_counts[i] on PE j (exchange the counts "
               "first, e.g. with alltoall)",
               "{} on {}: PE {} sends {} elements to PE {}, which expects {}", api,
               describe_group(g), g.world_pe(static_cast<int>(a)), sent,
               g.world_pe(static_cast<int>(b)), expected);
    }
  }
  std::vector<CopySpan> copies;
  for (size_t k = 0; k < n; ++k) {
    const size_t j = (g.my_index + k) % n;
    if (recv_counts[j] == 0) continue;
    const size_t from = static_cast<size_t>(meta(j, 1, static_cast<size_t>(g.my_index)));
    copies.push_back({as_bytes(dest) + recv_offsets[j] * elem_bytes, g.world_pe(static_cast<int>(j)),
                      from, recv_counts[j] * elem_bytes});
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
    if (begin < end) transport().get(c.dst + (begin - at), c.pe, c.offset + (begin - at), end - begin);
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
