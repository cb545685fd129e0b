#include "coremesh/core/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <utility>

#include "coremesh/core/allocator.hpp"
#include "coremesh/core/error.hpp"

namespace coremesh {
namespace {

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

int normalize_dim(int d, int rank) {
  int nd = d < 0 ? d + rank : d;
  CM_CHECK(nd >= 0 && nd < rank, "use a dimension in [-rank, rank)",
           "dimension {} is out of range for a tensor of rank {}", d, rank);
  return nd;
}

float load_float(const void* p, DType dtype) {
  switch (dtype) {
    case DType::f32: return *static_cast<const float*>(p);
    case DType::bf16: return to_float(*static_cast<const bf16*>(p));
    case DType::f8e4m3: return to_float(*static_cast<const f8e4m3*>(p));
    case DType::f8e5m2: return to_float(*static_cast<const f8e5m2*>(p));
    case DType::i32: return static_cast<float>(*static_cast<const int32_t*>(p));
    case DType::i64: return static_cast<float>(*static_cast<const int64_t*>(p));
  }
  return 0;
}

// v truncated toward zero; a value outside I (nan, inf) is refused, not saturated.
template <typename I>
I to_int(float v, DType dtype) {
  constexpr float lo = float(std::numeric_limits<I>::min());  // -2^31 or -2^63, exact
  CM_CHECK(v >= lo && v < -lo, "clamp the values into the integer range first, or keep a floating-point dtype",
           "{} does not fit in {}", v, dtype_name(dtype));
  return static_cast<I>(v);
}

void store_float(void* p, DType dtype, float v) {
  switch (dtype) {
    case DType::f32: *static_cast<float*>(p) = v; break;
    case DType::bf16: *static_cast<bf16*>(p) = to_bf16(v); break;
    case DType::f8e4m3: *static_cast<f8e4m3*>(p) = to_f8e4m3(v); break;
    case DType::f8e5m2: *static_cast<f8e5m2*>(p) = to_f8e5m2(v); break;
    case DType::i32: *static_cast<int32_t*>(p) = to_int<int32_t>(v, dtype); break;
    case DType::i64: *static_cast<int64_t*>(p) = to_int<int64_t>(v, dtype); break;
  }
}

bool is_integer(DType dtype) { return dtype == DType::i32 || dtype == DType::i64; }

int64_t load_int(const void* p, DType dtype) {
  return dtype == DType::i32 ? *static_cast<const int32_t*>(p) : *static_cast<const int64_t*>(p);
}

void store_int(void* p, DType dtype, int64_t v) {
  if (dtype == DType::i64) return void(*static_cast<int64_t*>(p) = v);
  CM_CHECK(v >= INT32_MIN && v <= INT32_MAX, "clamp the values into the i32 range first, or keep i64",
           "{} does not fit in i32", v);
  *static_cast<int32_t*>(p) = static_cast<int32_t>(v);
}

// Calls fn(element offset) for every element of a strided tensor in row-major order.
template <typename Fn>
void for_each_offset(const Shape& shape, const Shape& strides, int64_t base, Fn&& fn) {
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  const int rank = static_cast<int>(shape.size());
  std::vector<int64_t> index(shape.size(), 0);
  int64_t offset = base;
  for (int64_t i = 0; i < n; ++i) {
    fn(i, offset);
    for (int d = rank - 1; d >= 0; --d) {
      if (++index[d] < shape[d]) {
        offset += strides[d];
        break;
      }
      offset -= strides[d] * (shape[d] - 1);
      index[d] = 0;
    }
  }
}

}  // namespace

// alloc_host throws (with a hint) when out of memory.
Storage::Storage(size_t bytes) : data_(alloc_host(bytes)), bytes_(bytes) {}

Storage::Storage(void* data, size_t bytes, std::function<void(void*)> release)
    : data_(data), bytes_(bytes), release_(std::move(release)) {}

bool Storage::meets(const Storage& other) const noexcept {
  if (this == &other) return true;
  const auto* first = static_cast<const std::byte*>(data_);
  const auto* other_first = static_cast<const std::byte*>(other.data_);
  return bytes_ && other.bytes_ && first < other_first + other.bytes_ && other_first < first + bytes_;
}

Storage::~Storage() {
  if (release_) release_(data_);
  else free_host(data_, bytes_);
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape)
    CM_CHECK(!__builtin_mul_overflow(n, s, &n), "use sizes whose product fits in 63 bits",
             "shape {} has more elements than an int64 counts", shape_str(shape));
  return n;
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  for (int64_t s : shape)
    CM_CHECK(s >= 0, "sizes must be >= 0", "negative size in shape {}", shape_str(shape));
  const int64_t n = shape_numel(shape);
  CM_CHECK(n <= INT64_MAX / int64_t(dtype_size(dtype)), "use sizes whose bytes fit in 63 bits",
           "shape {} of {} has more bytes than an int64 counts", shape_str(shape), dtype_name(dtype));
  Tensor t;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(n) * dtype_size(dtype));
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill(value);
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner) {
  Tensor t;
  size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  CM_CHECK(data != nullptr || bytes == 0, "wrap memory that exists (a null pointer holds no elements)",
           "Tensor::wrap of a null pointer as {} elements", shape_numel(shape));
  t.storage_ = std::make_shared<Storage>(data, bytes, [owner](void*) {});
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

int64_t Tensor::size(int d) const { return shape_[normalize_dim(d, dim())]; }

bool Tensor::is_contiguous() const noexcept {
  if (numel() == 0) return true;  // no elements, no order (as torch: a transposed empty tensor)
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* Tensor::raw_data() const {
  CM_CHECK(defined(), "create the tensor before using it", "tensor is undefined");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

Tensor Tensor::view(const Shape& shape) const {
  CM_CHECK(is_contiguous(), "call .contiguous() before .view()",
           "view of a non-contiguous tensor {}", describe());
  Shape resolved = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i] == -1) {
      CM_CHECK(infer < 0, "use -1 for at most one dimension", "two -1 in view shape {}",
               shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      CM_CHECK(resolved[i] >= 0, "sizes must be >= 0 (-1: inferred)", "negative size in view shape {}",
               shape_str(shape));
      CM_CHECK(!__builtin_mul_overflow(known, resolved[i], &known), "use sizes whose product fits in 63 bits",
               "view shape {} has more elements than an int64 counts", shape_str(shape));
    }
  }
  if (infer >= 0) resolved[infer] = known == 0 ? 0 : numel() / known;
  CM_CHECK(shape_numel(resolved) == numel(), "the new shape must hold the same number of elements",
           "cannot view {} as {}", shape_str(shape_), shape_str(shape));
  Tensor t = *this;
  t.shape_ = resolved;
  t.strides_ = contiguous_strides(resolved);
  return t;
}

Tensor Tensor::slice(int d, int64_t start, int64_t end) const {
  d = normalize_dim(d, dim());
  CM_CHECK(0 <= start && start <= end && end <= shape_[d], "use 0 <= start <= end <= size",
           "slice [{}, {}) out of range for dimension {} of size {}", start, end, d, shape_[d]);
  Tensor t = *this;
  t.offset_ += start * strides_[d];
  t.shape_[d] = end - start;
  return t;
}

Tensor Tensor::select(int d, int64_t index) const {
  d = normalize_dim(d, dim());
  CM_CHECK(0 <= index && index < shape_[d], "use an index in [0, size)",
           "index {} out of range for dimension {} of size {}", index, d, shape_[d]);
  Tensor t = *this;
  t.offset_ += index * strides_[d];
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

Tensor Tensor::transpose(int a, int b) const {
  a = normalize_dim(a, dim());
  b = normalize_dim(b, dim());
  Tensor t = *this;
  std::swap(t.shape_[a], t.shape_[b]);
  std::swap(t.strides_[a], t.strides_[b]);
  return t;
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  CM_CHECK(defined(), "create the tensor before using it", "tensor is undefined");
  if (dtype == dtype_) return *this;
  Tensor t = empty(shape_, dtype);
  t.copy_from(*this);
  return t;
}

namespace {
// [first byte, end) of the elements a view reaches.
std::pair<uintptr_t, uintptr_t> byte_span(const Tensor& t) {
  int64_t low = 0, high = 0;
  for (size_t i = 0; i < t.shape().size(); ++i) {
    const int64_t reach = (t.shape()[i] - 1) * t.strides()[i];
    (reach < 0 ? low : high) += reach;
  }
  const auto at = reinterpret_cast<uintptr_t>(t.raw_data());
  const auto size = static_cast<int64_t>(dtype_size(t.dtype()));
  return {at + uintptr_t(low * size), at + uintptr_t((high + 1) * size)};
}
}  // namespace

bool Tensor::overlaps(const Tensor& other) const {
  if (!defined() || !other.defined() || numel() == 0 || other.numel() == 0) return false;
  const auto [first, end] = byte_span(*this);
  const auto [other_first, other_end] = byte_span(other);
  return first < other_end && other_first < end;
}

void Tensor::copy_from(const Tensor& src) {
  CM_CHECK(defined() && src.defined(), "create both tensors before copying", "copy {} an undefined tensor",
           defined() ? "from" : "into");
  CM_CHECK(src.shape_ == shape_, "copy between tensors of equal shape",
           "copy from {} into {}", shape_str(src.shape_), shape_str(shape_));
  const size_t esize = dtype_size(dtype_);
  if (src.dtype_ == dtype_ && src.is_contiguous() && is_contiguous()) {
    std::memmove(raw_data(), src.raw_data(), nbytes());
    return;
  }
  if (overlaps(src)) {  // element by element would read what it already overwrote
    Tensor staged = empty(src.shape_, src.dtype_);
    staged.copy_from(src);
    return copy_from(staged);
  }
  std::vector<int64_t> dst_offsets;
  dst_offsets.reserve(static_cast<size_t>(numel()));
  for_each_offset(shape_, strides_, offset_, [&](int64_t, int64_t off) { dst_offsets.push_back(off); });
  char* dst_base = static_cast<char*>(storage_->data());
  const char* src_base = static_cast<const char*>(src.storage_->data());
  const size_t src_esize = dtype_size(src.dtype_);
  const bool int_pair = is_integer(src.dtype_) && is_integer(dtype_);
  for_each_offset(src.shape_, src.strides_, src.offset_, [&](int64_t i, int64_t off) {
    void* dst = dst_base + dst_offsets[static_cast<size_t>(i)] * static_cast<int64_t>(esize);
    const void* s = src_base + off * static_cast<int64_t>(src_esize);
    if (src.dtype_ == dtype_) std::memcpy(dst, s, esize);
    else if (int_pair) store_int(dst, dtype_, load_int(s, src.dtype_));  // exact, not through a float
    else store_float(dst, dtype_, load_float(s, src.dtype_));
  });
}

void Tensor::fill(float value) {
  if (is_contiguous()) {  // fast paths (zero_grad): +0 is all-zero bits in every dtype
    if (value == 0.0f && !std::signbit(value)) return void(std::memset(raw_data(), 0, nbytes()));
    if (dtype_ == DType::f32) return void(std::fill_n(static_cast<float*>(raw_data()), numel(), value));
  }
  char* base = static_cast<char*>(storage_->data());
  const size_t esize = dtype_size(dtype_);
  for_each_offset(shape_, strides_, offset_, [&](int64_t, int64_t off) {
    store_float(base + off * static_cast<int64_t>(esize), dtype_, value);
  });
}

float Tensor::item(std::initializer_list<int64_t> index) const {
  CM_CHECK(defined(), "create the tensor before using it", "tensor is undefined");
  CM_CHECK(static_cast<int>(index.size()) == dim(), "give one index per dimension",
           "{} indices for a tensor of rank {}", index.size(), dim());
  int64_t off = offset_;
  int d = 0;
  for (int64_t i : index) {
    CM_CHECK(0 <= i && i < shape_[d], "use an index in [0, size)",
             "index {} out of range for dimension {} of size {}", i, d, shape_[d]);
    off += i * strides_[d++];
  }
  return load_float(static_cast<char*>(storage_->data()) + off * static_cast<int64_t>(dtype_size(dtype_)),
                    dtype_);
}

std::vector<float> Tensor::to_float_vector() const {
  CM_CHECK(defined(), "create the tensor before using it", "tensor is undefined");
  std::vector<float> out(static_cast<size_t>(numel()));
  const char* base = static_cast<const char*>(storage_->data());
  const size_t esize = dtype_size(dtype_);
  for_each_offset(shape_, strides_, offset_, [&](int64_t i, int64_t off) {
    out[static_cast<size_t>(i)] = load_float(base + off * static_cast<int64_t>(esize), dtype_);
  });
  return out;
}

std::string Tensor::describe() const {
  if (!defined()) return "Tensor(undefined)";
  return fmt::format("Tensor({}, {}{})", shape_str(shape_), dtype_name(dtype_),
                     is_contiguous() ? "" : ", strided");
}

}  // namespace coremesh
