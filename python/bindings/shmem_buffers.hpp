// Buffers and argument parsing shared by shmem.cpp and shmem_collectives.cpp.
//
// SHMEM calls take NumPy arrays (any C-contiguous buffer): symmetric ones
// (from shmem.empty/zeros) where OpenSHMEM needs symmetric memory, any
// memory on the local side. Sizes come from the arrays' byte lengths; a
// signal or ivar argument uses the first element of its array (pass a slice,
// sig[3:4], for another element).
#pragma once

#include <string>

#include "common.hpp"
#include "coremesh/shmem/shmem.hpp"

namespace coremesh::python {

struct Buffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  size_t itemsize = 0;
  char code = 'B';      // struct-module type code, byte-order prefix removed
  py::object view;      // a memoryview that keeps the buffer exported
};

// `what` names the argument in errors; `writable` requires a writable buffer.
Buffer buffer_arg(const py::handle& obj, const char* what, bool writable);

inline shmem::Team team_arg(const std::optional<shmem::Team>& team) {
  return team ? *team : shmem::Team::world();
}

// Drops the arrays of on-stream work that has completed (needs the GIL).
void release_on_stream_arrays();

shmem::Cmp cmp_arg(const std::string& name);
shmem::SignalOp signal_op_arg(const std::string& name);
shmem::ReduceOp reduce_op_arg(const std::string& name);

// The uint64 signal a put_signal / signal_wait targets (first element).
uint64_t* signal_arg(const py::handle& obj);

// Calls fn(T{}) with T the element type of `b`: int32, int64, uint32,
// uint64, and with Floats also float and double.
template <bool Floats, typename Fn>
auto dispatch_element(const Buffer& b, const char* api, Fn&& fn) {
  const bool is_signed = b.code == 'i' || b.code == 'l' || b.code == 'q';
  const bool is_unsigned = b.code == 'I' || b.code == 'L' || b.code == 'Q';
  if (is_signed && b.itemsize == 4) return fn(int32_t{});
  if (is_signed && b.itemsize == 8) return fn(int64_t{});
  if (is_unsigned && b.itemsize == 4) return fn(uint32_t{});
  if (is_unsigned && b.itemsize == 8) return fn(uint64_t{});
  if constexpr (Floats) {
    if (b.code == 'f' && b.itemsize == 4) return fn(float{});
    if (b.code == 'd' && b.itemsize == 8) return fn(double{});
  }
  CM_THROW(InvalidArgument,
           Floats ? "use an int32, int64, uint32, uint64, float32 or float64 array"
                  : "use an int32, int64, uint32 or uint64 array",
           "{}: unsupported element type '{}' ({} bytes)", api, b.code, b.itemsize);
}

}  // namespace coremesh::python
