// Symmetric memory: raw collective allocation and the SymmetricHeap of
// named, typed buffers (seed 002's SymmetricHeap: alloc, calloc, aligned,
// bulk, lookup by name, usage statistics, dump).
//
// Every allocation and free is collective over the world: all PEs make the
// same calls in the same order (checked: a different size on one PE raises
// an error naming every PE's request, on every PE).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace coremesh::shmem {

void* sym_malloc(size_t bytes);
void* sym_calloc(size_t count, size_t bytes);
void* sym_align(size_t alignment, size_t bytes);
void sym_free(void* ptr);

// A typed view of a symmetric buffer owned by the SymmetricHeap.
template <typename T>
struct Sym {
  T* ptr = nullptr;
  size_t count = 0;

  T* data() const { return ptr; }
  size_t size() const { return count; }
  size_t bytes() const { return count * sizeof(T); }
  T& operator[](size_t i) const { return ptr[i]; }
  T* begin() const { return ptr; }
  T* end() const { return ptr + count; }
  std::span<T> span() const { return {ptr, count}; }
};

struct HeapStats {
  size_t capacity = 0;      // user heap bytes per PE
  size_t used = 0;          // bytes in live blocks (all, named or not)
  size_t peak = 0;
  size_t blocks = 0;
  size_t largest_free = 0;
  size_t named_buffers = 0;
  size_t named_bytes = 0;
};

struct BufferInfo {
  std::string name;
  void* ptr = nullptr;
  size_t bytes = 0;
  size_t alignment = 0;
  size_t elem_bytes = 0;
  bool zeroed = false;
};

// Named buffers. Allocating a name that exists returns the existing buffer
// when the request matches and raises an error when it does not.
// Thread safety: all methods may be called from any thread, but allocation
// and free are collective (same order on every PE).
class SymmetricHeap {
 public:
  static SymmetricHeap& instance();

  template <typename T>
  Sym<T> alloc(const std::string& name, size_t count, size_t alignment = 128) {
    return typed<T>(allocate(name, count * sizeof(T), alignment, sizeof(T), false), count);
  }
  template <typename T>
  Sym<T> calloc(const std::string& name, size_t count) {
    return typed<T>(allocate(name, count * sizeof(T), 128, sizeof(T), true), count);
  }
  // One allocation per (name, count) in order, like seed 002's alloc_bulk;
  // not atomic: on failure the earlier buffers stay allocated.
  template <typename T>
  std::vector<Sym<T>> alloc_bulk(const std::vector<std::pair<std::string, size_t>>& specs) {
    std::vector<Sym<T>> out;
    for (const auto& [name, count] : specs) out.push_back(alloc<T>(name, count));
    return out;
  }
  // Throws when there is no buffer `name` or its element size differs.
  template <typename T>
  Sym<T> find(const std::string& name) const {
    const BufferInfo info = lookup(name, sizeof(T));
    return Sym<T>{static_cast<T*>(info.ptr), info.bytes / sizeof(T)};
  }
  bool contains(const std::string& name) const;
  BufferInfo info(const std::string& name) const;
  void free(const std::string& name);  // collective
  void free_all();                     // collective, in name order
  std::vector<BufferInfo> buffers() const;
  HeapStats stats() const;
  // One line per buffer, prefixed with the PE: name, address, offset, size.
  std::string dump() const;

 private:
  BufferInfo allocate(const std::string& name, size_t bytes, size_t alignment, size_t elem_bytes,
                      bool zero);
  BufferInfo lookup(const std::string& name, size_t elem_bytes) const;
  template <typename T>
  static Sym<T> typed(const BufferInfo& info, size_t count) {
    return Sym<T>{static_cast<T*>(info.ptr), count};
  }
};

}  // namespace coremesh::shmem
