// SymmetricHeap: named, typed buffers over the collective allocator.
#include <map>
#include <mutex>

#include "coremesh/core/error.hpp"
#include "coremesh/shmem/heap.hpp"
#include "internal.hpp"

namespace coremesh::shmem {

void* sym_malloc(size_t bytes) { return internal::sym_alloc(bytes, 128, false, "sym_malloc"); }
void* sym_calloc(size_t count, size_t bytes) {
  size_t total = 0;
  if (__builtin_mul_overflow(count, bytes, &total)) return nullptr;  // as shmem_calloc
  return internal::sym_alloc(total, 128, true, "sym_calloc");
}
void* sym_align(size_t alignment, size_t bytes) {
  return internal::sym_alloc(bytes, alignment, false, "sym_align");
}
void sym_free(void* ptr) { internal::sym_free(ptr, "sym_free"); }

namespace {
std::mutex g_mutex;
std::map<std::string, BufferInfo> g_buffers;  // by name; cleared when the library restarts
const void* g_heap_base = nullptr;            // detects a re-initialised library

std::map<std::string, BufferInfo>& buffers_locked() {
  const void* base = internal::state("SymmetricHeap").base;
  if (base != g_heap_base) {
    g_buffers.clear();
    g_heap_base = base;
  }
  return g_buffers;
}
}  // namespace

SymmetricHeap& SymmetricHeap::instance() {
  static SymmetricHeap heap;
  return heap;
}

BufferInfo SymmetricHeap::allocate(const std::string& name, size_t bytes, size_t alignment,
                                   size_t elem_bytes, bool zero) {
  {
    std::lock_guard lock(g_mutex);
    auto& buffers = buffers_locked();
    auto it = buffers.find(name);
    if (it != buffers.end()) {
      const BufferInfo& b = it->second;
      CM_CHECK(b.bytes == bytes && b.elem_bytes == elem_bytes,
               "use a new name, or free the buffer first",
               "symmetric buffer '{}' exists with {} B of {}-byte elements; requested {} B of "
               "{}-byte elements",
               name, b.bytes, b.elem_bytes, bytes, elem_bytes);
      return b;
    }
  }
  void* ptr = internal::sym_alloc(bytes, alignment, zero, "SymmetricHeap::alloc");
  BufferInfo info{name, ptr, bytes, std::max<size_t>(alignment, 128), elem_bytes, zero};
  std::lock_guard lock(g_mutex);
  buffers_locked()[name] = info;
  return info;
}

BufferInfo SymmetricHeap::lookup(const std::string& name, size_t elem_bytes) const {
  BufferInfo b = info(name);
  CM_CHECK(b.elem_bytes == elem_bytes, "look the buffer up with the type it was allocated with",
           "symmetric buffer '{}' holds {}-byte elements, not {}-byte ones", name, b.elem_bytes,
           elem_bytes);
  return b;
}

bool SymmetricHeap::contains(const std::string& name) const {
  std::lock_guard lock(g_mutex);
  return buffers_locked().count(name) != 0;
}

BufferInfo SymmetricHeap::info(const std::string& name) const {
  std::lock_guard lock(g_mutex);
  auto& buffers = buffers_locked();
  auto it = buffers.find(name);
  CM_CHECK(it != buffers.end(), "allocate it first (SymmetricHeap::alloc)",
           "no symmetric buffer named '{}' ({} buffers exist)", name, buffers.size());
  return it->second;
}

void SymmetricHeap::free(const std::string& name) {
  BufferInfo b = info(name);
  internal::sym_free(b.ptr, "SymmetricHeap::free");
  std::lock_guard lock(g_mutex);
  buffers_locked().erase(name);
}

void SymmetricHeap::free_all() {
  for (const BufferInfo& b : buffers()) free(b.name);
}

std::vector<BufferInfo> SymmetricHeap::buffers() const {
  std::lock_guard lock(g_mutex);
  std::vector<BufferInfo> out;
  for (const auto& [name, b] : buffers_locked()) out.push_back(b);
  return out;
}

HeapStats SymmetricHeap::stats() const {
  internal::State& s = internal::state("SymmetricHeap::stats");
  HeapStats st;
  {
    std::lock_guard lock(s.mutex);
    const internal::HeapUsage u = s.allocator.usage();
    st.capacity = u.capacity;
    st.used = u.used;
    st.peak = u.peak;
    st.blocks = u.blocks;
    st.largest_free = u.largest_free;
  }
  for (const BufferInfo& b : buffers()) {
    ++st.named_buffers;
    st.named_bytes += b.bytes;
  }
  return st;
}

std::string SymmetricHeap::dump() const {
  internal::State& s = internal::state("SymmetricHeap::dump");
  const HeapStats st = stats();
  std::string out = fmt::format("[pe {}] symmetric heap: {} named buffers ({} B); {} of {} B used "
                                "in {} blocks, peak {} B, largest free {} B\n",
                                s.my_pe, st.named_buffers, st.named_bytes, st.used, st.capacity,
                                st.blocks, st.peak, st.largest_free);
  for (const BufferInfo& b : buffers()) {
    out += fmt::format("[pe {}]   '{}': {} offset {} size {} B align {} elem {} B{}\n", s.my_pe,
                       b.name, b.ptr, static_cast<std::byte*>(b.ptr) - s.base, b.bytes,
                       b.alignment, b.elem_bytes, b.zeroed ? " (zeroed)" : "");
  }
  return out;
}

}  // namespace coremesh::shmem
