// Tensor: a typed, strided view of reference-counted storage.
//
// Storage is 64-byte aligned (one cache line, a full AVX-512 vector) and may
// also wrap memory owned elsewhere (a symmetric heap, an mmap'ed file).
// Views (view/slice/select/transpose) share storage; clone/contiguous copy.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "coremesh/core/dtype.hpp"
#include "coremesh/core/error.hpp"

namespace coremesh {

using Shape = std::vector<int64_t>;

class Storage {
 public:
  // Allocates `bytes` (rounded up to 64) of 64-byte aligned memory.
  explicit Storage(size_t bytes);
  // Wraps memory owned elsewhere; `release` runs when the last view dies.
  Storage(void* data, size_t bytes, std::function<void(void*)> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const noexcept { return data_; }
  size_t bytes() const noexcept { return bytes_; }
  // Memory wrapped from elsewhere: other storages (and the caller) may see it.
  bool wraps() const noexcept { return static_cast<bool>(release_); }
  // Whether the two storages' memory meets (the same storage, or two wraps
  // of one buffer).
  bool meets(const Storage& other) const noexcept;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  std::function<void(void*)> release_;
};

std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(const Shape& shape, DType dtype = DType::f32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32);
  static Tensor full(const Shape& shape, float value, DType dtype = DType::f32);
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape);
  // A contiguous tensor over memory owned elsewhere (kept alive by `owner`).
  static Tensor wrap(void* data, const Shape& shape, DType dtype,
                     std::shared_ptr<void> owner = nullptr);

  bool defined() const noexcept { return storage_ != nullptr; }
  DType dtype() const noexcept { return dtype_; }
  const Shape& shape() const noexcept { return shape_; }
  const Shape& strides() const noexcept { return strides_; }
  int dim() const noexcept { return static_cast<int>(shape_.size()); }
  int64_t size(int d) const;
  int64_t numel() const noexcept { return defined() ? shape_numel(shape_) : 0; }  // undefined: no elements
  size_t nbytes() const noexcept { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool is_contiguous() const noexcept;
  // Whether the bytes this view spans (first to last element) meet other's.
  bool overlaps(const Tensor& other) const;
  const std::shared_ptr<Storage>& storage() const noexcept { return storage_; }
  int64_t offset() const noexcept { return offset_; }

  void* raw_data() const;
  // Typed pointer to the first element; checks the dtype.
  template <typename T>
  T* data() const {
    CM_CHECK(dtype_of<T>() == dtype_, "convert the tensor with .to(dtype) first",
             "tensor holds {} but {} was requested", dtype_name(dtype_), dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw_data());
  }

  // Views. `view` needs a contiguous tensor; one dimension may be -1.
  Tensor view(const Shape& shape) const;
  Tensor slice(int dim, int64_t start, int64_t end) const;
  Tensor select(int dim, int64_t index) const;
  Tensor transpose(int a, int b) const;

  Tensor contiguous() const;
  Tensor clone() const;
  // Element-wise conversion (exact rounding rules of dtype.hpp).
  Tensor to(DType dtype) const;
  // Element as float, by multi-index (for tests and debugging).
  float item(std::initializer_list<int64_t> index) const;
  std::vector<float> to_float_vector() const;
  // Copies src into this tensor; shapes must match, dtypes may differ; src
  // may overlap this tensor (it is read before anything is written).
  void copy_from(const Tensor& src);
  void fill(float value);

  std::string describe() const;

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;  // in elements
  DType dtype_ = DType::f32;
};

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape) {
  CM_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
           "pass as many values as the shape holds", "{} values for shape {}", values.size(),
           shape_str(shape));
  Tensor t = empty(shape, dtype_of<T>());
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

}  // namespace coremesh
