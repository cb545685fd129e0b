// One-sided operations: translation and checks here, data movement in the
// transport.
#include <cstring>

#include "coremesh/core/error.hpp"
#include "internal.hpp"
#include "wait.hpp"

namespace coremesh::shmem::internal {

void put(void* dest, const void* src, size_t bytes, int pe, const char* api) {
  check_pe(pe, api);
  const size_t offset = sym_offset(dest, bytes, api);
  state(api).transport->put(pe, offset, src, bytes);
}

void get(void* dest, const void* src, size_t bytes, int pe, const char* api) {
  check_pe(pe, api);
  const size_t offset = sym_offset(src, bytes, api);
  state(api).transport->get(dest, pe, offset, bytes);
}

void put_nbi(void* dest, const void* src, size_t bytes, int pe, const char* api) {
  check_pe(pe, api);
  const size_t offset = sym_offset(dest, bytes, api);
  state(api).transport->put_nbi(pe, offset, src, bytes);
}

void get_nbi(void* dest, const void* src, size_t bytes, int pe, const char* api) {
  check_pe(pe, api);
  const size_t offset = sym_offset(src, bytes, api);
  state(api).transport->get_nbi(dest, pe, offset, bytes);
}

namespace {
// Checks both ends of a strided transfer; returns the offset of the first element.
size_t strided_offset(const void* sym, ptrdiff_t stride, size_t nelems, size_t elem_bytes,
                      const char* api) {
  CM_CHECK(stride >= 1, "strides count elements and must be >= 1", "{}: stride {} < 1", api,
           stride);
  const size_t span = (nelems - 1) * static_cast<size_t>(stride) * elem_bytes + elem_bytes;
  return sym_offset(sym, span, api);
}
}  // namespace

void iput(void* dest, const void* src, ptrdiff_t dst, ptrdiff_t sst, size_t nelems,
          size_t elem_bytes, int pe, const char* api) {
  if (nelems == 0) return;
  check_pe(pe, api);
  const size_t offset = strided_offset(dest, dst, nelems, elem_bytes, api);
  CM_CHECK(sst >= 1, "strides count elements and must be >= 1", "{}: source stride {} < 1", api,
           sst);
  std::byte* target = peer_address(pe, offset);
  const auto* source = static_cast<const std::byte*>(src);
  for (size_t i = 0; i < nelems; ++i)
    std::memcpy(target + i * dst * elem_bytes, source + i * sst * elem_bytes, elem_bytes);
  notify(pe);
}

void iget(void* dest, const void* src, ptrdiff_t dst, ptrdiff_t sst, size_t nelems,
          size_t elem_bytes, int pe, const char* api) {
  if (nelems == 0) return;
  check_pe(pe, api);
  const size_t offset = strided_offset(src, sst, nelems, elem_bytes, api);
  CM_CHECK(dst >= 1, "strides count elements and must be >= 1", "{}: target stride {} < 1", api,
           dst);
  const std::byte* source = peer_address(pe, offset);
  auto* target = static_cast<std::byte*>(dest);
  for (size_t i = 0; i < nelems; ++i)
    std::memcpy(target + i * dst * elem_bytes, source + i * sst * elem_bytes, elem_bytes);
}

void put_signal(void* dest, const void* src, size_t bytes, uint64_t* signal, uint64_t value,
                int sig_op, int pe, bool nbi, const char* api) {
  check_pe(pe, api);
  CM_CHECK(sig_op == 0 || sig_op == 1, "use SHMEM_SIGNAL_SET or SHMEM_SIGNAL_ADD",
           "{}: unknown signal operation {}", api, sig_op);
  const size_t offset = sym_offset(dest, bytes, api);
  const size_t signal_offset = sym_offset(signal, sizeof(uint64_t), api);
  CM_CHECK(signal_offset % alignof(uint64_t) == 0, "signals are 8-byte aligned uint64_t",
           "{}: signal address {} is misaligned", api, static_cast<void*>(signal));
  state(api).transport->put_signal(pe, offset, src, bytes, signal_offset, value,
                                   static_cast<SignalOp>(sig_op), nbi);
}

void quiet() {
  if (is_initialized()) state().transport->quiet();
}
void fence() {
  if (is_initialized()) state().transport->fence();
}
void notify(int pe) { state().transport->notify(pe); }

// Locks: the lock word at PE 0 holds 0 (free) or owner + 1.
void set_lock(long* lock) {
  const size_t offset = sym_offset(lock, sizeof(long), "shmem_set_lock");
  State& s = state();
  std::atomic_ref<long> word(*reinterpret_cast<long*>(peer_address(0, offset)));
  long expected = 0;
  auto acquire = [&] {
    expected = 0;
    return word.compare_exchange_strong(expected, s.my_pe + 1, std::memory_order_acquire);
  };
  wait_until_ready(doorbell(0), acquire, [&] {
    return fmt::format("PE {} waits in shmem_set_lock for the lock at heap offset {} held by PE {}",
                       s.my_pe, offset, expected - 1);
  });
}

void clear_lock(long* lock) {
  const size_t offset = sym_offset(lock, sizeof(long), "shmem_clear_lock");
  quiet();  // the critical section's writes complete before the lock is free
  std::atomic_ref<long>(*reinterpret_cast<long*>(peer_address(0, offset)))
      .store(0, std::memory_order_release);
  notify(0);
}

bool test_lock(long* lock) {
  const size_t offset = sym_offset(lock, sizeof(long), "shmem_test_lock");
  std::atomic_ref<long> word(*reinterpret_cast<long*>(peer_address(0, offset)));
  long expected = 0;
  return !word.compare_exchange_strong(expected, state().my_pe + 1, std::memory_order_acquire);
}

}  // namespace coremesh::shmem::internal
