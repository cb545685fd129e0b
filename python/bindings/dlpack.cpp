// DLPack exchange (torch.from_dlpack(t), coremesh.from_dlpack(torch_tensor)).
//
// Export: the capsule owns a Tensor handle (so the storage outlives the
// consumer's use) plus the shape and strides arrays DLPack points at.
// Import: the producer's capsule is renamed "used_dltensor" and its deleter
// runs when the last coremesh handle goes, on a thread holding the GIL
// (NumPy's deleter touches Python; torch's does not mind).
#include "common.hpp"
#include "dlpack.hpp"

namespace coremesh::python {
namespace {

struct Export {
  Tensor tensor;
  Shape shape, strides;
  dlpack::ManagedTensor managed{};
};

dlpack::DataType dl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return {dlpack::kFloat, 32, 1};
    case DType::bf16: return {dlpack::kBfloat, 16, 1};
    case DType::f8e4m3:
    case DType::f8e5m2: return {dlpack::kUInt, 8, 1};  // raw codes: no fp8 in DLPack 0.x
    case DType::i32: return {dlpack::kInt, 32, 1};
    case DType::i64: return {dlpack::kInt, 64, 1};
  }
  return {dlpack::kUInt, 8, 1};
}

DType from_dl_type(const dlpack::DataType& t, const py::object& requested) {
  const auto fail = [&] {
    CM_THROW(InvalidArgument,
             "exchange float32, bfloat16, int32 or int64 tensors; uint16 codes with dtype='bf16', uint8 codes "
             "with dtype='f8e4m3'/'f8e5m2' (convert others first, e.g. x.to(torch.int64))",
             "from_dlpack: cannot hold DLPack type code {} with {} bits x {} lanes{}", t.code, t.bits, t.lanes,
             requested.is_none() ? "" : " as " + std::string(dtype_name(dtype_arg(requested))));
  };
  if (t.lanes != 1) fail();
  if (!requested.is_none()) {
    const DType dtype = dtype_arg(requested);
    // the documented pairs only (as from_numpy): reading uint32 as i32 or
    // int16 as bf16 would reinterpret the values silently
    const bool matches = dtype_size(dtype) * 8 == t.bits &&
                         (dtype == DType::f32                          ? t.code == dlpack::kFloat
                          : dtype == DType::i32 || dtype == DType::i64 ? t.code == dlpack::kInt
                          : dtype == DType::bf16                       ? t.code == dlpack::kBfloat || t.code == dlpack::kUInt
                                                                       : t.code == dlpack::kUInt);
    if (!matches) fail();
    return dtype;
  }
  if (t.code == dlpack::kFloat && t.bits == 32) return DType::f32;
  if (t.code == dlpack::kBfloat && t.bits == 16) return DType::bf16;
  if (t.code == dlpack::kInt && t.bits == 32) return DType::i32;
  if (t.code == dlpack::kInt && t.bits == 64) return DType::i64;
  fail();
  return DType::f32;
}

void export_capsule_destructor(PyObject* capsule) {
  // Renamed by a consumer: the consumer calls the deleter.
  if (!PyCapsule_IsValid(capsule, dlpack::kCapsuleName)) return;
  auto* managed =
      static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(capsule, dlpack::kCapsuleName));
  if (managed->deleter) managed->deleter(managed);
}

constexpr const char* kImportOwnerName = "coremesh.dlpack_import";

void import_owner_destructor(PyObject* capsule) {
  auto* managed = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(capsule, kImportOwnerName));
  if (managed->deleter) managed->deleter(managed);
}

}  // namespace

py::object tensor_to_dlpack(const Tensor& t, const py::object& stream) {
  CM_CHECK(stream.is_none(), "pass stream=None: coremesh tensors live in host memory",
           "__dlpack__ got a stream for a CPU tensor");
  CM_CHECK(t.defined(), "create the tensor first", "cannot export an undefined tensor");
  wait_for_device();
  auto* e = new Export{t, t.shape(), t.strides()};
  e->managed.dl_tensor = {t.raw_data(), {dlpack::kCPU, 0}, t.dim(), dl_type(t.dtype()),
                          e->shape.data(), e->strides.data(), 0};
  e->managed.manager_ctx = e;
  e->managed.deleter = [](dlpack::ManagedTensor* self) {
    delete static_cast<Export*>(self->manager_ctx);
  };
  PyObject* capsule = PyCapsule_New(&e->managed, dlpack::kCapsuleName, export_capsule_destructor);
  if (capsule == nullptr) {
    delete e;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

Tensor tensor_from_dlpack(const py::object& obj, const py::object& dtype) {
  py::object capsule = py::hasattr(obj, "__dlpack__") ? obj.attr("__dlpack__")() : obj;
  CM_CHECK(PyCapsule_IsValid(capsule.ptr(), dlpack::kCapsuleName),
           "pass an object with __dlpack__ (a torch tensor, a NumPy array) or an unused capsule",
           "from_dlpack: not an unused DLPack capsule");
  auto* managed = static_cast<dlpack::ManagedTensor*>(
      PyCapsule_GetPointer(capsule.ptr(), dlpack::kCapsuleName));
  const dlpack::Tensor& dl = managed->dl_tensor;
  CM_CHECK(dl.device.device_type == dlpack::kCPU, "move it to the CPU first (t.cpu())",
           "from_dlpack: device type {} is not the CPU", dl.device.device_type);
  const DType dt = from_dl_type(dl.dtype, dtype);
  const Shape shape(dl.shape, dl.shape + dl.ndim);
  if (dl.strides != nullptr && shape_numel(shape) > 0) {  // no element: any strides lay it out
    int64_t expected = 1;
    for (int d = dl.ndim - 1; d >= 0; --d) {
      CM_CHECK(shape[d] == 1 || dl.strides[d] == expected, "call .contiguous() on it first",
               "from_dlpack needs a contiguous tensor; shape {} has strides {}", shape_str(shape),
               shape_str(Shape(dl.strides, dl.strides + dl.ndim)));
      expected *= shape[d];
    }
  }
  void* data = static_cast<char*>(dl.data) + dl.byte_offset;
  CM_CHECK(reinterpret_cast<uintptr_t>(data) % dtype_size(dt) == 0, "copy it first",
           "from_dlpack: data at {} is not aligned to its {}-byte items", data, dtype_size(dt));
  // Take ownership: the producer's capsule is spent, ours calls its deleter.
  PyObject* owner = PyCapsule_New(managed, kImportOwnerName, import_owner_destructor);
  if (owner == nullptr) throw py::error_already_set();
  PyCapsule_SetName(capsule.ptr(), dlpack::kUsedCapsuleName);
  return Tensor::wrap(data, shape, dt, python_owner(py::reinterpret_steal<py::object>(owner)));
}

}  // namespace coremesh::python
