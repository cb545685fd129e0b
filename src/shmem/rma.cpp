// One-sided operations: translation and checks here, data movement in the
// transport.
#include <cstring>

#include "coremesh/core/error.hpp"
#include "internal.hpp"
#include "wait.hpp"

namespace coremesh::shmem::internal {

namespace {
// The local end of a transfer (any memory of this PE, but not NULL).
void check_local(const void* p, const char* what, const char* api) {
  CM_CHECK(p != nullptr, "pass the local array of the transfer", "{}: the local {} is NULL", api, what);
}
}  // namespace

// Zero-length transfers are no-ops whatever the addresses (NULL included).
void put(void* dest, const void* src, size_t bytes, int pe, const char* api) {
  if (bytes == 0) return;
  check_pe(pe, api);
  check_local(src, "source", api);
  const size_t offset = sym_offset(dest, bytes, api);
  state(api).transport->put(pe, offset, src, bytes);
}

void get(void* dest, const void* src, size_t bytes, int pe, const char* api) {
  if (bytes == 0) return;
  check_pe(pe, api);
  check_local(dest, "target", api);
  const size_t offset = sym_offset(src, bytes, api);
  state(api).transport->get(dest, pe, offset, bytes);
}

void put_nbi(void* dest, const void* src, size_t bytes, int pe, const char* api) {
  if (bytes == 0) return;
  check_pe(pe, api);
  check_local(src, "source", api);
  const size_t offset = sym_offset(dest, bytes, api);
  state(api).transport->put_nbi(pe, offset, src, bytes);
}

void get_nbi(void* dest, const void* src, size_t bytes, int pe, const char* api) {
  if (bytes == 0) return;
  check_pe(pe, api);
  check_local(dest, "target", api);
  const size_t offset = sym_offset(src, bytes, api);
  state(api).transport->get_nbi(dest, pe, offset, bytes);
}

namespace {
// Checks the symmetric end of a strided transfer (strides count elements
// and may be negative in neither OpenSHMEM nor here: >= 1); returns the
// offset of its first element.
size_t strided_offset(const void* sym, ptrdiff_t stride, size_t nelems, size_t elem_bytes,
                      const char* api) {
  CM_CHECK(stride >= 1, "strides count elements and must be >= 1", "{}: stride {} < 1", api,
           stride);
  return sym_offset(sym, span_bytes(nelems, static_cast<size_t>(stride), elem_bytes), api);
}
}  // namespace

// Strided transfers: one load/store loop where the transport offers the
// fast path, else one put/get per element.
void iput(void* dest, const void* src, ptrdiff_t dst, ptrdiff_t sst, size_t nelems,
          size_t elem_bytes, int pe, const char* api) {
  if (nelems == 0) return;
  check_pe(pe, api);
  check_local(src, "source", api);
  const size_t offset = strided_offset(dest, dst, nelems, elem_bytes, api);
  CM_CHECK(sst >= 1, "strides count elements and must be >= 1", "{}: source stride {} < 1", api,
           sst);
  Transport& t = transport();
  const auto* source = static_cast<const std::byte*>(src);
  if (std::byte* target = t.peer_pointer(pe, offset)) {
    for (size_t i = 0; i < nelems; ++i)
      std::memcpy(target + i * dst * elem_bytes, source + i * sst * elem_bytes, elem_bytes);
    t.notify(pe);
    return;
  }
  for (size_t i = 0; i < nelems; ++i)
    t.put(pe, offset + i * dst * elem_bytes, source + i * sst * elem_bytes, elem_bytes);
}

void iget(void* dest, const void* src, ptrdiff_t dst, ptrdiff_t sst, size_t nelems,
          size_t elem_bytes, int pe, const char* api) {
  if (nelems == 0) return;
  check_pe(pe, api);
  check_local(dest, "target", api);
  const size_t offset = strided_offset(src, sst, nelems, elem_bytes, api);
  CM_CHECK(dst >= 1, "strides count elements and must be >= 1", "{}: target stride {} < 1", api,
           dst);
  Transport& t = transport();
  auto* target = static_cast<std::byte*>(dest);
  const std::byte* source = t.peer_pointer(pe, offset);
  for (size_t i = 0; i < nelems; ++i) {
    if (source) std::memcpy(target + i * dst * elem_bytes, source + i * sst * elem_bytes, elem_bytes);
    else t.get(target + i * dst * elem_bytes, pe, offset + i * sst * elem_bytes, elem_bytes);
  }
}

// A zero-length put with signal still delivers the signal.
void put_signal(void* dest, const void* src, size_t bytes, uint64_t* signal, uint64_t value,
                int sig_op, int pe, bool nbi, const char* api) {
  check_pe(pe, api);
  CM_CHECK(sig_op == 0 || sig_op == 1, "use SHMEM_SIGNAL_SET or SHMEM_SIGNAL_ADD",
           "{}: unknown signal operation {}", api, sig_op);
  const size_t offset = bytes == 0 ? 0 : sym_offset(dest, bytes, api);
  const size_t signal_offset = sym_offset(signal, sizeof(uint64_t), api);
  CM_CHECK(signal_offset % alignof(uint64_t) == 0, "signals are 8-byte aligned uint64_t",
           "{}: signal address {} is misaligned", api, static_cast<void*>(signal));
  state(api).transport->put_signal(pe, offset, src, bytes, signal_offset, value,
                                   static_cast<SignalOp>(sig_op), nbi);
}

uint64_t atomic(void* dest, int pe, AmoOp op, int width, uint64_t operand, uint64_t compare,
                const char* api) {
  check_pe(pe, api);
  const size_t offset = sym_offset(dest, static_cast<size_t>(width), api);
  CM_CHECK(offset % static_cast<size_t>(width) == 0, "atomics work on naturally aligned words",
           "{}: address {} is not {}-byte aligned", api, dest, width);
  return state(api).transport->atomic(pe, offset, op, width, operand, compare);
}

void quiet() {
  if (is_initialized()) state().transport->quiet();
}
void fence() {
  if (is_initialized()) state().transport->fence();
}

// Locks: an MCS queue lock (Mellor-Crummey, Scott) in the symmetric long.
// Its first 32-bit half on PE 0 is the queue's tail (last PE + 1, 0: free);
// the second half on each PE is that PE's queue node: bit 0 "the lock is
// yours", bits 1.. the next PE + 1. A waiting PE sleeps on its own node,
// which its predecessor writes by an AMO: nobody polls another PE's memory.
namespace {
constexpr size_t kTail = 0, kNode = 4;
uint32_t load_node(size_t offset) {
  return std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(local_address(offset + kNode)))
      .load(std::memory_order_acquire);
}
void reset_node(size_t offset) {
  std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(local_address(offset + kNode)))
      .store(0, std::memory_order_release);
}
size_t lock_offset(long* lock, const char* api) {
  static_assert(sizeof(long) == 8, "the lock holds two 32-bit words");
  const size_t offset = sym_offset(lock, sizeof(long), api);
  CM_CHECK(offset % sizeof(long) == 0, "locks are aligned longs", "{}: misaligned lock {}", api,
           static_cast<void*>(lock));
  return offset;
}
}  // namespace

void set_lock(long* lock) {
  const char* api = "shmem_set_lock";
  const size_t offset = lock_offset(lock, api);
  State& s = state(api);
  Transport& t = *s.transport;
  reset_node(offset);
  const auto me = static_cast<uint64_t>(s.my_pe + 1);
  const uint64_t prev = t.atomic(0, offset + kTail, AmoOp::swap, 4, me, 0);
  if (prev == 0) return;
  t.atomic(static_cast<int>(prev - 1), offset + kNode, AmoOp::bor, 4, me << 1, 0);
  wait_until_ready(my_doorbell(), [&] { return (load_node(offset) & 1) != 0; }, [&] {
    return fmt::format("PE {} waits in shmem_set_lock (lock at offset {}) behind PE {}", s.my_pe,
                       offset, prev - 1);
  });
}

void clear_lock(long* lock) {
  const char* api = "shmem_clear_lock";
  const size_t offset = lock_offset(lock, api);
  State& s = state(api);
  Transport& t = *s.transport;
  quiet();  // the critical section's writes complete before the lock is passed on
  const auto me = static_cast<uint64_t>(s.my_pe + 1);
  if ((load_node(offset) >> 1) == 0) {
    if (t.atomic(0, offset + kTail, AmoOp::compare_swap, 4, 0, me) == me) return;  // no waiter
    // A successor swapped the tail and is about to link itself in.
    wait_until_ready(my_doorbell(), [&] { return (load_node(offset) >> 1) != 0; }, [&] {
      return fmt::format("PE {} waits in shmem_clear_lock for its successor to enqueue", s.my_pe);
    });
  }
  const int next = static_cast<int>(load_node(offset) >> 1) - 1;
  t.atomic(next, offset + kNode, AmoOp::bor, 4, 1, 0);
}

bool test_lock(long* lock) {
  const char* api = "shmem_test_lock";
  const size_t offset = lock_offset(lock, api);
  State& s = state(api);
  reset_node(offset);
  const auto me = static_cast<uint64_t>(s.my_pe + 1);
  return s.transport->atomic(0, offset + kTail, AmoOp::compare_swap, 4, me, 0) != 0;
}

}  // namespace coremesh::shmem::internal
