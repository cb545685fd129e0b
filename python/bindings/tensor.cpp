// coremesh.Tensor and zero-copy exchange through the buffer protocol.
//
// Export (np.asarray(t), memoryview(t)): the view points at the tensor's
// storage and holds the Tensor object. Import (from_numpy): the tensor wraps
// the exporter's memory and holds a memoryview of it, released with the GIL
// (common.hpp), so a kernel that captured the tensor keeps the array alive.
//
// Host access waits: exporting, item(), clone(), to(), fill_() and copy_()
// first wait for the device's queued work (GIL released), so Python reads
// what the kernels wrote. View methods (view, slice, select, transpose) only
// make new handles and never wait.
//
// NumPy has no bf16 or fp8: they travel as their raw codes, uint16 and uint8
// (from_numpy(codes, dtype="bf16") reads them back).
//
// Tensor(input_data, dtype) is the RFC's (MindSpore's) constructor: it
// copies. An array-like is first made a float32/int32/int64 array by
// coremesh/_convert.py (which also refuses bad input with a hint); a
// coremesh Tensor is cloned after the device's queued work.
#include <pybind11/numpy.h>

#include <cctype>
#include <cstring>
#include <exception>
#include <utility>

#include "common.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::python {
namespace {

const char* buffer_format(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f";
    case DType::bf16: return "H";
    case DType::f8e4m3:
    case DType::f8e5m2: return "B";
    case DType::i32: return "i";
    case DType::i64: return "q";
  }
  return "B";
}

// Shape and byte strides of one export, owned by Py_buffer::internal.
struct BufferLayout {
  std::vector<Py_ssize_t> shape, strides;
};

// NumPy's np.asarray(t) probes the buffer protocol and, when the export
// fails, clears the error and makes a 0-d object array; the error (a failed
// kernel the export waited for) would be lost. It is kept here, with the
// tensor it is of, for Tensor.__array__, which NumPy calls next, to raise.
struct ExportError {
  PyObject* tensor = nullptr;
  std::exception_ptr error;
};
thread_local ExportError g_export_error;

int tensor_getbuffer(PyObject* obj, Py_buffer* view, int flags) {
  view->obj = nullptr;
  g_export_error = {};
  try {
    const Tensor& t = py::cast<const Tensor&>(py::handle(obj));
    CM_CHECK(t.defined(), "create the tensor first", "cannot export an undefined tensor");
    const bool wants_contiguous = (flags & PyBUF_ANY_CONTIGUOUS) == PyBUF_ANY_CONTIGUOUS ||
                                  (flags & PyBUF_C_CONTIGUOUS) == PyBUF_C_CONTIGUOUS ||
                                  (flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS ||
                                  (flags & PyBUF_STRIDES) != PyBUF_STRIDES;
    CM_CHECK(t.is_contiguous() || !wants_contiguous, "call .contiguous() first",
             "the consumer asked for a contiguous buffer but {} is strided", t.describe());
    CM_CHECK((flags & PyBUF_F_CONTIGUOUS) != PyBUF_F_CONTIGUOUS || t.dim() <= 1,
             "ask for C order (np.asarray(t))", "coremesh exports row-major buffers, not Fortran order");
    wait_for_device();
    auto* layout = new BufferLayout;
    const auto esize = static_cast<Py_ssize_t>(dtype_size(t.dtype()));
    for (int d = 0; d < t.dim(); ++d) {
      layout->shape.push_back(static_cast<Py_ssize_t>(t.shape()[d]));
      layout->strides.push_back(static_cast<Py_ssize_t>(t.strides()[d]) * esize);
    }
    view->buf = t.raw_data();
    view->obj = obj;
    Py_INCREF(obj);
    view->len = static_cast<Py_ssize_t>(t.nbytes());
    view->itemsize = esize;
    view->readonly = 0;
    view->format = (flags & PyBUF_FORMAT) ? const_cast<char*>(buffer_format(t.dtype())) : nullptr;
    view->ndim = (flags & PyBUF_ND) == PyBUF_ND ? t.dim() : 1;  // a flat byte view otherwise
    view->shape = (flags & PyBUF_ND) == PyBUF_ND ? layout->shape.data() : nullptr;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? layout->strides.data() : nullptr;
    view->suboffsets = nullptr;
    view->internal = layout;
    return 0;
  } catch (...) {
    g_export_error = {obj, std::current_exception()};
    set_python_error(g_export_error.error);
    return -1;
  }
}

// A NumPy array over t's memory; a kernel's error raises here, not inside
// NumPy's probe (memoryview raises what the export raises).
py::object numpy_view(const py::object& self) {
  wait_for_device();
  return py::module_::import("numpy").attr("asarray")(py::memoryview(self));
}

void tensor_releasebuffer(PyObject*, Py_buffer* view) {
  delete static_cast<BufferLayout*>(view->internal);
}

// The coremesh dtype of a buffer's items; `requested` (may be null)
// reinterprets raw codes (uint16 -> bf16, uint8 -> fp8).
DType buffer_dtype(const Py_buffer& b, const py::object& requested) {
  std::string format = b.format ? b.format : "B";
  if (!format.empty() && (format[0] == '@' || format[0] == '=' || format[0] == '<'))
    format.erase(0, 1);
  const char code = format.size() == 1 ? format[0] : '?';
  const bool is_int = code != '?' && std::strchr("bBhHiIlLqQ", code) != nullptr;
  const auto fail = [&] {
    CM_THROW(InvalidArgument,
             "use float32, int32 or int64 arrays, uint16 codes with dtype='bf16' or uint8 codes "
             "with dtype='f8e4m3'/'f8e5m2' (convert with x.astype(np.float32))",
             "cannot hold a buffer of format '{}' ({} bytes per item){}", format, b.itemsize,
             requested.is_none() ? "" : " as " + std::string(dtype_name(dtype_arg(requested))));
  };
  if (!requested.is_none()) {
    const DType dtype = dtype_arg(requested);
    // the documented pairs only: reading uint32 as i32 or int16 as bf16 would reinterpret silently
    const bool signed_int = is_int && std::islower(code);
    const bool matches = static_cast<Py_ssize_t>(dtype_size(dtype)) == b.itemsize &&
                         (dtype == DType::f32                              ? code == 'f'
                          : dtype == DType::i32 || dtype == DType::i64     ? signed_int
                          : dtype == DType::bf16                           ? code == 'H'
                                                                           : code == 'B');
    if (!matches) fail();
    return dtype;
  }
  if (code == 'f' && b.itemsize == 4) return DType::f32;
  if (is_int && std::islower(code) && b.itemsize == 4) return DType::i32;
  if (is_int && std::islower(code) && b.itemsize == 8) return DType::i64;
  fail();
  return DType::f32;
}

Tensor from_numpy(const py::object& obj, const py::object& dtype) {
  PyObject* raw = PyMemoryView_FromObject(obj.ptr());
  if (raw == nullptr) throw py::error_already_set();
  auto view = py::reinterpret_steal<py::object>(raw);
  const Py_buffer& b = *PyMemoryView_GET_BUFFER(raw);
  CM_CHECK(!b.readonly, "copy it with coremesh.tensor(x): kernels may write into wrapped memory",
           "from_numpy needs a writable buffer; this one is read-only");
  CM_CHECK(PyBuffer_IsContiguous(&b, 'C'),
           "pass np.ascontiguousarray(x), or copy with coremesh.tensor(x)",
           "from_numpy needs a C-contiguous buffer");
  const DType dt = buffer_dtype(b, dtype);
  CM_CHECK(reinterpret_cast<uintptr_t>(b.buf) % dtype_size(dt) == 0,
           "copy it with coremesh.tensor(x)", "the buffer at {} is not aligned to its {}-byte items",
           b.buf, dtype_size(dt));
  Shape shape;
  for (int d = 0; d < b.ndim; ++d) shape.push_back(static_cast<int64_t>(b.shape[d]));
  return Tensor::wrap(b.buf, shape, dt, python_owner(std::move(view)));
}

// Tensor(input_data, dtype=None): a new tensor holding a copy of the data.
Tensor tensor_from_data(const py::object& data, const py::object& dtype) {
  const std::optional<DType> want =
      dtype.is_none() ? std::nullopt : std::optional<DType>(dtype_arg(dtype));
  if (py::isinstance<Tensor>(data)) {
    const Tensor& src = py::cast<const Tensor&>(data);
    CM_CHECK(src.defined(), "pass a tensor with storage", "Tensor(input_data): input_data is an undefined tensor");
    wait_for_device();
    return want && *want != src.dtype() ? src.to(*want) : src.clone();
  }
  const py::object name = want ? py::object(py::str(std::string(dtype_name(*want)))) : py::object(py::none());
  const py::tuple host = py::module_::import("coremesh._convert").attr("host_array")(data, name);
  const auto array = host[0].cast<py::array>();
  const DType target = parse_dtype(host[1].cast<std::string>());
  const DType held = target == DType::i32 || target == DType::i64 ? target : DType::f32;
  Shape shape(array.shape(), array.shape() + array.ndim());
  Tensor t = Tensor::empty(shape, held);  // fresh memory: no kernel uses it, no wait
  CM_ASSERT(size_t(array.nbytes()) == t.nbytes());
  if (t.nbytes() > 0) std::memcpy(t.raw_data(), array.data(), t.nbytes());
  return target == held ? t : t.to(target);
}

// Every element of `t` set to the number `value`, converted as Tensor(value,
// t.dtype) converts it: integers exactly, fractions for an integer dtype refused.
bool is_sequence(const py::handle& x) {
  return py::isinstance<py::sequence>(x) && !py::isinstance<py::str>(x) && !py::isinstance<py::bytes>(x) &&
         !(py::hasattr(x, "ndim") && x.attr("ndim").cast<int>() == 0);  // a 0-d array is one size
}

template <typename Bits>
void fill_bits(Tensor& t, const void* one) {
  Bits bits;
  std::memcpy(&bits, one, sizeof bits);
  std::fill_n(static_cast<Bits*>(t.raw_data()), t.numel(), bits);
}

void fill_exactly(Tensor& t, const py::object& value) {
  CM_CHECK(!is_sequence(value) && !py::isinstance<py::str>(value), "pass one number",
           "the fill value must be a number, not {}", py::repr(value).cast<std::string>());
  const Tensor one = tensor_from_data(value, py::str(std::string(dtype_name(t.dtype()))));
  if (t.numel() == 0) return;
  if (!t.is_contiguous()) {  // a strided view: fill a contiguous copy, then copy it in
    Tensor filled = Tensor::empty(t.shape(), t.dtype());
    fill_exactly(filled, value);
    return t.copy_from(filled);
  }
  switch (dtype_size(t.dtype())) {  // the element's bits, once converted
    case 1: return fill_bits<uint8_t>(t, one.raw_data());
    case 2: return fill_bits<uint16_t>(t, one.raw_data());
    case 4: return fill_bits<uint32_t>(t, one.raw_data());
    default: return fill_bits<uint64_t>(t, one.raw_data());
  }
}


// One size of `shape`: an int or anything with __index__ (numpy's integers).
int64_t size_arg(const py::handle& size, const py::handle& shape) {
  try {
    return py::module_::import("operator").attr("index")(size).cast<int64_t>();
  } catch (const py::error_already_set&) {  // no __index__ (TypeError), or past int64 (OverflowError)
  } catch (const py::cast_error&) {
  }
  CM_THROW(InvalidArgument, "pass sizes as ints (or a sequence of ints) that fit in int64",
           "shape {}: {} is not an int64 size", py::repr(shape).cast<std::string>(), py::repr(size).cast<std::string>());
}

// A shape: a sequence of sizes (a list, a tuple, a NumPy array) or one size.
Shape shape_arg(const py::handle& shape) {
  if (!is_sequence(shape)) return {size_arg(shape, shape)};
  Shape out;
  for (const py::handle size : shape) out.push_back(size_arg(size, shape));
  return out;
}

py::tuple to_tuple(const Shape& values) {
  py::tuple out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = values[i];
  return out;
}

}  // namespace

void wait_for_device() {
  without_gil([] { runtime::synchronize(); });
}

DType dtype_arg(const py::handle& value) {
  std::string name;
  if (value.is_none()) return DType::f32;  // as NumPy's None: the default dtype
  if (py::isinstance<py::str>(value)) {
    name = value.cast<std::string>();
  } else if (py::str(value.get_type().attr("__module__")).cast<std::string>() == "torch") {
    name = py::str(value).cast<std::string>();  // a torch dtype: "torch.float32"
    if (name.rfind("torch.", 0) == 0) name.erase(0, 6);
  } else {
    name = py::str(py::dtype::from_args(py::reinterpret_borrow<py::object>(value)).attr("name"));
  }
  static const std::pair<const char*, const char*> aliases[] = {
      {"float32", "f32"},  {"float", "f32"},        {"bfloat16", "bf16"},
      {"int32", "i32"},    {"int64", "i64"},        {"long", "i64"},
      {"float8_e4m3fn", "f8e4m3"}, {"float8_e5m2", "f8e5m2"}};
  for (const auto& [alias, canonical] : aliases)
    if (name == alias) name = canonical;
  for (DType d : {DType::f32, DType::bf16, DType::f8e4m3, DType::f8e5m2, DType::i32, DType::i64})
    if (dtype_name(d) == name) return d;
  CM_THROW(InvalidArgument,
           "pass coremesh.float32, bfloat16, float8_e4m3, float8_e5m2, int32 or int64 (or 'f32', 'bf16', "
           "'f8e4m3', 'f8e5m2', 'i32', 'i64'); convert the data, not the dtype (float64/float16 data becomes "
           "float32 with dtype=coremesh.float32)",
           "coremesh has no dtype '{}'", name);
}

void bind_tensor(py::module_& m) {
  py::class_<Tensor> cls(m, "Tensor", py::buffer_protocol(), R"doc(
A typed, strided view of reference-counted host memory.

Kernels (coremesh.ops) run asynchronously; a tensor they use stays alive
until they ran. np.asarray(t), t.numpy() and torch.from_dlpack(t) share the
memory without copying, after waiting for the device's queued work.
bf16 and fp8 export as their raw codes (uint16, uint8).)doc");
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  type->tp_as_buffer->bf_getbuffer = tensor_getbuffer;
  type->tp_as_buffer->bf_releasebuffer = tensor_releasebuffer;

  cls.def(py::init(&tensor_from_data), py::arg("input_data"), py::arg("dtype") = py::none(), R"doc(
Tensor(input_data, dtype=None): a new tensor holding a copy of input_data, as
MindSpore's Tensor(np.ones([1024, 2048]), ms.float32).

input_data: a NumPy array, (nested) list or tuple of numbers, a number, or a
coremesh Tensor. dtype: coremesh.float32, bfloat16, float8_e4m3, float8_e5m2,
int32 or int64 (or their names); without it floats become float32, int32
stays int32 and other integers and bools become int64. bf16/fp8 round
exactly. Ragged lists, strings, None, complex numbers, fractions for an
integer dtype and values out of its range raise coremesh.InvalidArgument.
from_numpy shares memory instead of copying.)doc");
  cls.def_property_readonly("shape", [](const Tensor& t) { return to_tuple(t.shape()); }, "Sizes, a tuple of ints.")
      .def_property_readonly("strides", [](const Tensor& t) { return to_tuple(t.strides()); },
                             "Strides in elements.")
      .def_property_readonly("dtype", [](const Tensor& t) { return std::string(dtype_name(t.dtype())); },
                             "'f32', 'bf16', 'f8e4m3', 'f8e5m2', 'i32' or 'i64'.")
      .def_property_readonly("ndim", &Tensor::dim, "Number of dimensions.")
      .def_property_readonly("nbytes", &Tensor::nbytes, "numel() times the element size, in bytes.")
      .def("numel", &Tensor::numel, "Number of elements (the product of shape).")
      .def("dim", &Tensor::dim, "Number of dimensions (as ndim).")
      .def("size", [](const Tensor& t, int d) { return t.size(d); }, py::arg("dim"),
           "Size of dimension dim (negative dims count from the end).")
      .def("is_contiguous", &Tensor::is_contiguous, "Whether the elements are dense in row-major order.")
      .def("data_ptr", [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw_data()); },
           "Address of the first element (for identity checks).")
      .def("__len__", [](const Tensor& t) {
             if (t.dim() == 0) throw py::type_error("len() of a 0-d tensor (as NumPy and torch: use .item())");
             return t.size(0);
           })
      .def("__repr__", &Tensor::describe)
      .def("view", [](const Tensor& t, const py::args& shape) {
             return t.view(shape.size() == 1 && is_sequence(shape[0]) ? shape_arg(shape[0]) : shape_arg(shape));
           }, "A view with another shape (contiguous tensors; one dimension may be -1).")
      .def("slice", &Tensor::slice, py::arg("dim"), py::arg("start"), py::arg("end"),
           "A view of elements [start, end) along dim (0 <= start <= end <= size); shares memory, no wait.")
      .def("select", &Tensor::select, py::arg("dim"), py::arg("index"),
           "A view of element index along dim, with that dimension removed; shares memory, no wait.")
      .def("transpose", &Tensor::transpose, py::arg("dim0"), py::arg("dim1"),
           "A view with dimensions dim0 and dim1 swapped (strided); shares memory, no wait.")
      .def("numpy", &numpy_view, "A NumPy array over the same memory (waits for the device first).")
      .def("__array__", [](const py::object& self, const py::object& dtype, const py::object& copy) {
             const ExportError failed = std::exchange(g_export_error, {});
             if (failed.tensor == self.ptr() && failed.error) std::rethrow_exception(failed.error);
             py::object a = numpy_view(self);
             if (!dtype.is_none()) a = a.attr("astype")(dtype);
             return copy.is_none() || !copy.cast<bool>() ? a : a.attr("copy")();
           }, py::arg("dtype") = py::none(), py::arg("copy") = py::none(),
           "NumPy's fallback when the buffer export failed: raises the export's error.")
      .def("asnumpy", [](py::object self) {
             const Tensor& t = py::cast<const Tensor&>(self);
             CM_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::i32 || t.dtype() == DType::i64,
                      "read the values with t.to(coremesh.float32).asnumpy(), or the raw codes with t.numpy()",
                      "asnumpy() of a {} tensor: NumPy has no {}", dtype_name(t.dtype()), dtype_name(t.dtype()));
             return numpy_view(self);
           }, "MindSpore's spelling of numpy(): a NumPy array over the same memory (waits for the device "
              "first); f32, i32 and i64 tensors (convert bf16/fp8 with to(coremesh.float32)).")
      .def("item", [](const Tensor& t) {
             CM_CHECK(t.numel() == 1, "use numpy() for tensors of more than one element",
                      "item() needs one element, {} has {}", t.describe(), t.numel());
             wait_for_device();
             if (t.dtype() == DType::i64 || t.dtype() == DType::i32)  // exact: through a float lost bits past 2^24
               return py::object(py::int_(t.dtype() == DType::i64 ? t.contiguous().data<int64_t>()[0]
                                                                  : t.contiguous().data<int32_t>()[0]));
             return py::object(py::float_(t.to_float_vector()[0]));
           }, "The one element as a Python number (int for i32/i64, float otherwise); waits for the device first.")
      .def("contiguous", [](const Tensor& t) {
             if (!t.is_contiguous()) wait_for_device();
             return t.contiguous();
           }, "This tensor if contiguous, else a contiguous copy (waits for the device before copying).")
      .def("clone", [](const Tensor& t) { wait_for_device(); return t.clone(); },
           "A contiguous copy with its own memory (waits for the device first).")
      .def("to", [](const Tensor& t, const py::object& dtype) {
             wait_for_device();
             return t.to(dtype_arg(dtype));
           }, py::arg("dtype"), "Converted copy on the host (exact rounding); ops.cast runs on a stream.")
      .def("fill_", [](Tensor& t, const py::object& value) { wait_for_device(); fill_exactly(t, value); return t; },
           py::arg("value"), "Sets every element to value (integers exactly; fractions refused for integer dtypes).")
      .def("copy_", [](Tensor& t, const Tensor& src) { wait_for_device(); t.copy_from(src); return t; },
           py::arg("src"), "Copies src (same shape, any dtype) into this tensor.")
      .def("__dlpack__", &tensor_to_dlpack, py::arg("stream") = py::none(),
           "A DLPack capsule over this tensor's memory (waits for the device first).")
      .def("__dlpack_device__", [](const Tensor&) { return py::make_tuple(1, 0); },
           "(kDLCPU, 0): host memory.");

  m.def("empty", [](const py::object& shape, const py::object& dtype) {
          return Tensor::empty(shape_arg(shape), dtype_arg(dtype));
        }, py::arg("shape"), py::arg("dtype") = "f32", "Uninitialised tensor (64-byte aligned).");
  m.def("zeros", [](const py::object& shape, const py::object& dtype) {
          return Tensor::zeros(shape_arg(shape), dtype_arg(dtype));
        }, py::arg("shape"), py::arg("dtype") = "f32", "Zero-filled tensor (64-byte aligned).");
  m.def("full", [](const py::object& shape, const py::object& value, const py::object& dtype) {
          Tensor t = Tensor::empty(shape_arg(shape), dtype_arg(dtype));  // fresh memory: no kernel uses it
          fill_exactly(t, value);
          return t;
        }, py::arg("shape"), py::arg("value"), py::arg("dtype") = "f32",
        "A tensor of `shape` whose every element is value (converted as Tensor(value, dtype) converts it).");
  m.def("from_numpy", &from_numpy, py::arg("array"), py::arg("dtype") = py::none(), R"doc(
A tensor over the memory of a writable, C-contiguous buffer (a NumPy array),
without copying. float32 -> f32, int32 -> i32, int64 -> i64; uint16 codes
with dtype='bf16', uint8 codes with dtype='f8e4m3' or 'f8e5m2'. The array
stays alive while the tensor or a kernel using it does.)doc");
  m.def("from_dlpack", &tensor_from_dlpack, py::arg("obj"), py::arg("dtype") = py::none(), R"doc(
A tensor over a DLPack producer's memory (torch.Tensor, np.ndarray, or a
"dltensor" capsule), without copying. CPU, contiguous; f32, bf16, i32, i64,
or uint8 codes with dtype='f8e4m3'/'f8e5m2'.)doc");
}

}  // namespace coremesh::python
