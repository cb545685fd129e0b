// The DLPack C ABI (github.com/dmlc/dlpack, the unversioned DLManagedTensor
// that PyTorch 1.13 and NumPy 1.24 exchange), declared here because Debian
// ships no dlpack header. A producer passes a PyCapsule named "dltensor"; the
// consumer renames it "used_dltensor" and calls `deleter` when done.
#pragma once

#include <cstdint>

namespace coremesh::python::dlpack {

enum DeviceType : int32_t { kCPU = 1 };
enum TypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4 };

struct Device {
  int32_t device_type;
  int32_t device_id;
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; nullptr: compact row-major
  uint64_t byte_offset;
};

struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

inline constexpr const char* kCapsuleName = "dltensor";
inline constexpr const char* kUsedCapsuleName = "used_dltensor";

}  // namespace coremesh::python::dlpack
