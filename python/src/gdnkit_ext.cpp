// gdnkit._gdnkit: the nanobind binding behind gdnkit.chunk_gated_delta_rule.
//
// Tensors arrive as any DLPack-capable object (NumPy arrays, torch tensors, CuPy arrays, ...) and
// are inspected generically through DLPack: dtype, device, shape and strides. torch tensors take a
// faster road to the same facts (torch's __dlpack__ is Python code): DLPack's C exchange table
// where torch has one (2.10 and later), else their attributes. Outputs (o, final_state) and, for
// device memory, the workspace are allocated with the framework of q (numpy.empty / q.new_empty /
// cupy.empty / the array-API namespace's empty; torch's workspace through the table's allocator),
// on q's device, so the binding keeps no buffers of its own. Shape checks live here rather than in
// Python to keep the per-call overhead low.
//
// Errors: gdnkit::Error maps to ValueError (invalid_value), TypeError (invalid_type) and
// RuntimeError (unsupported, cuda), message unchanged. The binding's own checks throw gdnkit::Error
// too, in the library's "<argument>: expected <what>, got <what>" format.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#ifndef GDNKIT_WITH_CUDA
#define GDNKIT_WITH_CUDA 1
#endif
#if GDNKIT_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gdnkit/gdnkit.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using gdnkit::DType;
using gdnkit::Error;
using Kind = gdnkit::Error::Kind;

// Read-only view: accepts read-only NumPy arrays too (the binding never writes through an input).
using Array = nb::ndarray<nb::ro>;

[[noreturn]] void fail(Kind kind, const std::string& argument, const std::string& expected,
                       const std::string& got) {
  throw Error(kind, argument, argument + ": expected " + expected + ", got " + got);
}

// ---------------------------------------------------------------------------------------------
// Python objects looked up once, at import (under the import lock, so no initialisation race).
// They are deliberately never released: they must outlive the static destructors that run after
// the interpreter has gone.

struct Globals {
  PyObject* np_ndarray = nullptr;  // numpy.ndarray
  PyObject* np_empty = nullptr;    // numpy.empty
  PyObject* np_float32 = nullptr;  // numpy.dtype('float32')
  PyObject* np_uint16 = nullptr;   // numpy.dtype('uint16') (bf16 NumPy arrays are read through it)
};
Globals G;

void init_globals() {
  nb::module_ np = nb::module_::import_("numpy");
  G.np_ndarray = nb::object(np.attr("ndarray")).release().ptr();
  G.np_empty = nb::object(np.attr("empty")).release().ptr();
  G.np_float32 = np.attr("dtype")("float32").release().ptr();
  G.np_uint16 = np.attr("dtype")("uint16").release().ptr();
}

bool is_numpy(nb::handle obj) { return PyObject_TypeCheck(obj.ptr(), (PyTypeObject*)G.np_ndarray); }

// ---------------------------------------------------------------------------------------------
// Tensors: what the binding needs of an argument, read through DLPack or, for torch tensors, through
// DLPack's C exchange table or their attributes (torch's __dlpack__ is Python code costing
// microseconds per tensor; the table is one C call, data_ptr(), stride() and friends are C
// attribute reads).

enum class Elem : std::uint8_t { f16, bf16, f32, f64, i32, i64, other };
enum class Dev : std::uint8_t { host, cuda, other };

constexpr int kMaxDims = 8;

struct Tensor {
  const char* name = "";
  nb::handle obj;          // the caller's object (borrowed: the caller's frame keeps it alive)
  Array arr;               // DLPack path: keeps the export alive for the duration of the call
  bool present = false;
  const void* data = nullptr;
  int ndim = 0;
  std::int64_t shape[kMaxDims] = {};
  std::int64_t strides[kMaxDims] = {};  // in elements
  Elem elem = Elem::other;
  std::string other_dtype;  // the dtype's name when elem == other (messages only)
  Dev dev = Dev::host;
  int device_id = 0;
  std::string other_device;  // the device's name when dev == other (messages only)

  std::int64_t dim(int i) const { return shape[i]; }
  std::int64_t stride(int i) const { return strides[i]; }
};

std::string str(std::int64_t x) { return std::to_string(x); }

std::string tuple_str(const std::int64_t* v, int n) {
  std::string s = "(";
  for (int i = 0; i < n; ++i) {
    if (i) s += ", ";
    s += str(v[i]);
  }
  if (n == 1) s += ",";
  return s + ")";
}
std::string shape_str(const Tensor& t) { return tuple_str(t.shape, t.ndim); }
std::string strides_str(const Tensor& t) { return tuple_str(t.strides, t.ndim); }

std::string py_type_name(nb::handle obj) { return nb::type_name(obj.type()).c_str(); }

const char* elem_name(Elem e) {
  switch (e) {
    case Elem::f16: return "float16";
    case Elem::bf16: return "bfloat16";
    case Elem::f32: return "float32";
    case Elem::f64: return "float64";
    case Elem::i32: return "int32";
    case Elem::i64: return "int64";
    case Elem::other: break;
  }
  return "?";
}

std::string dtype_of(const Tensor& t) { return t.elem != Elem::other ? elem_name(t.elem) : t.other_dtype; }

std::string device_str(const Tensor& t) {
  switch (t.dev) {
    case Dev::host: return "cpu";
    case Dev::cuda: return "cuda:" + std::to_string(t.device_id);
    case Dev::other: break;
  }
  return t.other_device;
}

// ---- DLPack path ----

Elem classify(nb::dlpack::dtype d) {
  using C = nb::dlpack::dtype_code;
  if (d.lanes != 1) return Elem::other;
  if (d.code == (std::uint8_t)C::Float) {
    if (d.bits == 16) return Elem::f16;
    if (d.bits == 32) return Elem::f32;
    if (d.bits == 64) return Elem::f64;
  } else if (d.code == (std::uint8_t)C::Bfloat && d.bits == 16) {
    return Elem::bf16;
  } else if (d.code == (std::uint8_t)C::Int) {
    if (d.bits == 32) return Elem::i32;
    if (d.bits == 64) return Elem::i64;
  }
  return Elem::other;
}

std::string dlpack_dtype_name(nb::dlpack::dtype d) {
  using C = nb::dlpack::dtype_code;
  const char* prefix = "?";
  switch (d.code) {
    case (std::uint8_t)C::Int: prefix = "int"; break;
    case (std::uint8_t)C::UInt: prefix = "uint"; break;
    case (std::uint8_t)C::Float: prefix = "float"; break;
    case (std::uint8_t)C::Bfloat: prefix = "bfloat"; break;
    case (std::uint8_t)C::Complex: prefix = "complex"; break;
    case (std::uint8_t)C::Bool: return "bool";
    default: return "dtype code " + std::to_string(d.code) + " (" + std::to_string(d.bits) + " bits)";
  }
  std::string s = prefix + std::to_string(d.bits);
  if (d.lanes != 1) s += "x" + std::to_string(d.lanes);
  return s;
}

// A NumPy array of ml_dtypes.bfloat16 (or any 2-byte dtype NumPy calls "bfloat16") cannot be
// exported through DLPack by NumPy; it is read through a uint16 view instead.
bool numpy_bfloat16(nb::handle obj) {
  if (!is_numpy(obj)) return false;
  nb::object dt = nb::getattr(obj, "dtype");
  nb::object name = nb::getattr(dt, "name", nb::none());
  // Native byte order only: the uint16 view of a byte-swapped array would be read swapped.
  return nb::isinstance<nb::str>(name) && std::string_view(nb::borrow<nb::str>(name).c_str()) == "bfloat16" &&
         nb::cast<int>(dt.attr("itemsize")) == 2 && PyObject_IsTrue(nb::object(dt.attr("isnative")).ptr()) == 1;
}

void read_dlpack(Tensor& t) {
  const nb::handle obj = t.obj;
  bool bf16_view = false;
  if (!nb::try_cast(obj, t.arr, /*convert=*/false)) {
    bool ok = false;
    if (numpy_bfloat16(obj)) {
      nb::object view = nb::steal(PyObject_CallMethod(obj.ptr(), "view", "O", G.np_uint16));
      ok = view.is_valid() && nb::try_cast(view, t.arr, false);
      if (!view.is_valid()) PyErr_Clear();
      bf16_view = ok;
    }
    if (!ok) {
      // Give the reason where a known framework refuses to export.
      nb::object rg = nb::getattr(obj, "requires_grad", nb::none());
      if (rg.is_valid() && !rg.is_none() && PyObject_IsTrue(rg.ptr()) == 1) {
        // A tensor subclass (an nn.Parameter subclass, say) that requires grad reaches here under
        // torch.no_grad(), where the wrapper does not detach: its detached view (the same storage,
        // kept alive by the array) exports.
        nb::object d = nb::steal(PyObject_CallMethod(obj.ptr(), "detach", nullptr));
        if (!d.is_valid()) PyErr_Clear();
        ok = d.is_valid() && nb::try_cast(d, t.arr, false);
        if (!ok)
          fail(Kind::invalid_value, t.name,
               "a tensor that does not require grad (gdnkit is forward-only: use torch.no_grad() or .detach())",
               "requires_grad=True");
      }
    }
    if (!ok) {
      if (is_numpy(obj)) {  // NumPy refuses DLPack for byte-swapped or unusual dtypes and odd strides
        nb::object dt = nb::getattr(obj, "dtype");
        fail(Kind::invalid_type, t.name,
             "a NumPy array of native byte order, a supported dtype and strides in whole elements",
             "dtype " + std::string(nb::str(dt.attr("str")).c_str()) + " (" + nb::str(dt).c_str() + "), strides " +
                 nb::str(nb::getattr(obj, "strides")).c_str() + " bytes");
      }
      fail(Kind::invalid_type, t.name, "a DLPack-capable tensor (NumPy array, torch tensor, ...)",
           py_type_name(obj));
    }
  }
  const Array& a = t.arr;
  if (a.ndim() > static_cast<std::size_t>(kMaxDims))
    fail(Kind::invalid_value, t.name, "at most " + std::to_string(kMaxDims) + " dims", std::to_string(a.ndim()));
  t.ndim = static_cast<int>(a.ndim());
  for (int i = 0; i < t.ndim; ++i) {
    t.shape[i] = static_cast<std::int64_t>(a.shape(i));
    t.strides[i] = a.stride(i);
  }
  t.data = a.data();
  t.elem = bf16_view ? Elem::bf16 : classify(a.dtype());
  if (t.elem == Elem::other) t.other_dtype = dlpack_dtype_name(a.dtype());
  switch (a.device_type()) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value: t.dev = Dev::host; break;  // pinned host memory is host memory
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value: t.dev = Dev::cuda; break;
    default:
      t.dev = Dev::other;
      t.other_device = "DLPack device type " + std::to_string(a.device_type());
  }
  t.device_id = a.device_id();
}

// ---- torch path ----

// DLPack's C exchange table (DLPack 1.3, `__dlpack_c_exchange_api__` on a tensor type, a capsule
// named "dlpack_exchange_api"): C functions that describe a tensor, allocate one and give the
// framework's current stream without any Python-level call. torch provides it from 2.10; the
// binding uses it for torch.Tensor where its major version is 1. Only the fields the binding
// reads are spelled out; the layout is DLPack's stable ABI (dlpack.h).
namespace dl {
struct Version {
  std::uint32_t major, minor;
};
struct Device {
  std::int32_t type, id;  // kDLCPU = 1, kDLCUDA = 2
};
struct DataType {
  std::uint8_t code, bits;
  std::uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  std::int32_t ndim;
  DataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements; null: compact row-major
  std::uint64_t byte_offset;
};
struct Managed {
  Version version;
  void* manager_ctx;
  void (*deleter)(Managed* self);
  std::uint64_t flags;
  Tensor dl_tensor;
};
using SetError = void (*)(void* ctx, const char* kind, const char* message);
struct ExchangeApi {
  struct Header {
    Version version;
    Header* prev_api;
  } header;
  int (*managed_tensor_allocator)(Tensor* prototype, Managed** out, void* error_ctx, SetError set_error);
  int (*managed_tensor_from_py_object_no_sync)(void* py_object, Managed** out);
  int (*managed_tensor_to_py_object_no_sync)(Managed* tensor, void** out_py_object);
  int (*dltensor_from_py_object_no_sync)(void* py_object, Tensor* out);
  int (*current_work_stream)(std::int32_t device_type, std::int32_t device_id, void** out_stream);
};
constexpr std::int32_t kCPU = 1, kCUDA = 2;
}  // namespace dl

struct Torch {
  PyObject* tensor = nullptr;  // torch.Tensor
  PyObject* parameter = nullptr;  // torch.nn.Parameter
  PyObject* f16 = nullptr, *bf16 = nullptr, *f32 = nullptr, *f64 = nullptr, *i32 = nullptr, *i64 = nullptr,
          *u8 = nullptr;
  PyObject *s_data_ptr = nullptr, *s_dtype = nullptr, *s_shape = nullptr, *s_stride = nullptr,
           *s_is_cuda = nullptr, *s_is_cpu = nullptr, *s_get_device = nullptr, *s_new_empty = nullptr,
           *s_is_neg = nullptr;
  // torch._C._cuda_getCurrentRawStream (null where this torch has none): the stream without the table.
  PyObject* raw_stream = nullptr;
  // The exchange table of torch.Tensor, or null (an older torch, or another major version).
  const dl::ExchangeApi* api = nullptr;
};
Torch TT;  // filled the first time a call finds torch imported; never released (see Globals)
// The exchange table of a tensor type, where it has one of major version 1 with the functions that
// read a tensor and give the stream (the allocator is checked where it is used); null otherwise
// (no error set).
const dl::ExchangeApi* exchange_api(PyObject* type) {
  nb::object cap = nb::steal(PyObject_GetAttrString(type, "__dlpack_c_exchange_api__"));
  if (!cap.is_valid()) {
    PyErr_Clear();
    return nullptr;
  }
  auto* api = static_cast<const dl::ExchangeApi*>(PyCapsule_GetPointer(cap.ptr(), "dlpack_exchange_api"));
  if (!api) {
    PyErr_Clear();
    return nullptr;
  }
  if (api->header.version.major != 1 || !api->dltensor_from_py_object_no_sync || !api->current_work_stream)
    return nullptr;
  return api;  // static in the framework: valid for the process's lifetime
}

// True once torch is imported (looked up in sys.modules: gdnkit never imports torch itself).
bool torch_ready() {
  if (TT.tensor) return true;
  PyObject* m = PyImport_GetModule(nb::str("torch").ptr());
  if (!m) {
    PyErr_Clear();
    return false;
  }
  nb::object torch = nb::steal(m);
  if (torch.is_none()) return false;
  try {
    auto keep = [&](const char* name) { return nb::object(torch.attr(name)).release().ptr(); };
    Torch t;
    t.f16 = keep("float16");
    t.bf16 = keep("bfloat16");
    t.f32 = keep("float32");
    t.f64 = keep("float64");
    t.i32 = keep("int32");
    t.i64 = keep("int64");
    t.u8 = keep("uint8");
    t.parameter = nb::object(torch.attr("nn").attr("Parameter")).release().ptr();
    for (auto [slot, name] : {std::pair{&t.s_data_ptr, "data_ptr"}, {&t.s_dtype, "dtype"}, {&t.s_shape, "shape"},
                              {&t.s_stride, "stride"}, {&t.s_is_cuda, "is_cuda"}, {&t.s_is_cpu, "is_cpu"},
                              {&t.s_get_device, "get_device"}, {&t.s_new_empty, "new_empty"},
                              {&t.s_is_neg, "is_neg"}}) {
      *slot = PyUnicode_InternFromString(name);
      if (!*slot) throw nb::python_error();
    }
    if (nb::object c = nb::getattr(torch.attr("_C"), "_cuda_getCurrentRawStream", nb::none()); !c.is_none())
      t.raw_stream = c.release().ptr();
    t.tensor = keep("Tensor");  // last: marks TT as complete
    t.api = exchange_api(t.tensor);
    TT = t;
  } catch (const nb::python_error&) {
    return false;  // a torch without these attributes: the DLPack path handles its tensors
  }
  return true;
}

bool is_torch(nb::handle obj) {
  if (!torch_ready()) return false;
  PyObject* type = (PyObject*)Py_TYPE(obj.ptr());
  return type == TT.tensor || type == TT.parameter;
}

// A torch.Tensor described by the exchange table (about a tenth of the attribute reads' time);
// false (no error set) where anything is unusual: the attribute path then reads it, and gives its
// messages (dtype names as torch spells them, the device).
bool read_torch_table(Tensor& t) {
  PyObject* o = t.obj.ptr();
  if (!TT.api || Py_TYPE(o) != (PyTypeObject*)TT.tensor) return false;
  dl::Tensor d;
  if (TT.api->dltensor_from_py_object_no_sync(o, &d) != 0) {  // e.g. a torch that refuses requires_grad
    PyErr_Clear();
    return false;
  }
  if (d.ndim < 0 || d.ndim > kMaxDims || (d.ndim > 0 && !d.shape)) return false;
  nb::dlpack::dtype dt;
  dt.code = d.dtype.code;
  dt.bits = d.dtype.bits;
  dt.lanes = d.dtype.lanes;
  const Elem elem = classify(dt);
  if (elem == Elem::other) return false;
  if (d.device.type == dl::kCPU) {
    t.dev = Dev::host;
    t.device_id = 0;
  } else if (d.device.type == dl::kCUDA) {
    t.dev = Dev::cuda;
    t.device_id = d.device.id;
  } else {
    return false;
  }
  t.elem = elem;
  t.ndim = d.ndim;
  std::int64_t compact = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.shape[i] = d.shape[i];
    t.strides[i] = d.strides ? d.strides[i] : compact;
    compact *= d.shape[i];
  }
  t.data = static_cast<const char*>(d.data) + d.byte_offset;
  return true;
}

// Reads a torch tensor through the exchange table or its attributes; false (no error set) when
// anything is unusual, and the DLPack path then takes over.
bool read_torch(Tensor& t) {
  if (read_torch_table(t)) return true;
  PyObject* o = t.obj.ptr();
  auto get = [&](PyObject* name) { return nb::steal(PyObject_GetAttr(o, name)); };
  auto call = [&](PyObject* name) { return nb::steal(PyObject_CallMethodNoArgs(o, name)); };
  nb::object dtype = get(TT.s_dtype), shape = get(TT.s_shape), strides = call(TT.s_stride),
             is_cuda = get(TT.s_is_cuda), ptr = call(TT.s_data_ptr);
  if (!dtype.is_valid() || !shape.is_valid() || !strides.is_valid() || !is_cuda.is_valid() || !ptr.is_valid() ||
      !PyTuple_Check(shape.ptr()) || !PyTuple_Check(strides.ptr()) ||
      PyTuple_GET_SIZE(shape.ptr()) != PyTuple_GET_SIZE(strides.ptr()) ||
      PyTuple_GET_SIZE(shape.ptr()) > kMaxDims) {
    PyErr_Clear();
    return false;
  }
  t.ndim = static_cast<int>(PyTuple_GET_SIZE(shape.ptr()));
  for (int i = 0; i < t.ndim; ++i) {
    t.shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
    t.strides[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides.ptr(), i));
  }
  t.data = PyLong_AsVoidPtr(ptr.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  PyObject* d = dtype.ptr();
  t.elem = d == TT.f16 ? Elem::f16 : d == TT.bf16 ? Elem::bf16 : d == TT.f32 ? Elem::f32 : d == TT.f64 ? Elem::f64
         : d == TT.i32 ? Elem::i32 : d == TT.i64 ? Elem::i64 : Elem::other;
  if (t.elem == Elem::other) {
    t.other_dtype = nb::str(dtype).c_str();
    if (t.other_dtype.rfind("torch.", 0) == 0) t.other_dtype.erase(0, 6);
  }
  if (is_cuda.ptr() == Py_True) {
    nb::object index = call(TT.s_get_device);
    if (!index.is_valid()) {
      PyErr_Clear();
      return false;
    }
    t.dev = Dev::cuda;
    t.device_id = static_cast<int>(PyLong_AsLong(index.ptr()));
  } else {
    nb::object is_cpu = get(TT.s_is_cpu);
    if (!is_cpu.is_valid()) {
      PyErr_Clear();
      return false;
    }
    if (is_cpu.ptr() == Py_True) {
      t.dev = Dev::host;
    } else {
      t.dev = Dev::other;
      t.other_device = nb::str(nb::getattr(t.obj, "device")).c_str();
    }
  }
  return true;
}

Tensor import_tensor(nb::handle obj, const char* name) {
  Tensor t;
  t.name = name;
  t.obj = obj;
  if (obj.is_none()) return t;
  t.present = true;
  if (!(is_torch(obj) && read_torch(t))) read_dlpack(t);
  // A torch tensor with the negative bit (a lazily negated view, e.g. the .imag of a conjugated
  // complex tensor) holds -x in memory as x: every road above reads the memory, so it is refused.
  if (torch_ready() && PyObject_TypeCheck(obj.ptr(), (PyTypeObject*)TT.tensor)) {
    nb::object neg = nb::steal(PyObject_CallMethodNoArgs(obj.ptr(), TT.s_is_neg));
    if (!neg.is_valid()) PyErr_Clear();  // a torch without is_neg has no negative views
    else if (neg.ptr() == Py_True)
      fail(Kind::invalid_value, name, "a tensor without torch's negative bit (call .resolve_neg() first)",
           "a negative view (is_neg() is True)");
  }
  return t;
}

// torch's current stream on a CUDA device: from the exchange table, else from
// torch._C._cuda_getCurrentRawStream (what torch's own kernels use), else from
// torch.cuda.current_stream(device).cuda_stream.
std::uintptr_t torch_stream(int device) {
  if (TT.api) {
    void* s = nullptr;
    if (TT.api->current_work_stream(dl::kCUDA, device, &s) != 0) throw nb::python_error();
    return reinterpret_cast<std::uintptr_t>(s);
  }
  nb::object s;
  if (TT.raw_stream) {
    s = nb::borrow(TT.raw_stream)(device);
  } else {
    nb::object torch = nb::module_::import_("torch");
    s = torch.attr("cuda").attr("current_stream")(device).attr("cuda_stream");
  }
  const auto h = reinterpret_cast<std::uintptr_t>(PyLong_AsVoidPtr(s.ptr()));
  if (PyErr_Occurred()) throw nb::python_error();
  return h;
}

void check_same_device(const Tensor& t, const Tensor& q) {
  if (!t.present) return;
  if (t.dev != q.dev || t.device_id != q.device_id || (t.dev == Dev::other && t.other_device != q.other_device))
    fail(Kind::invalid_value, t.name, "a tensor on q's device (" + device_str(q) + ")", device_str(t));
}

// Makes q's device current for the scope (the planner reads the current device's properties and
// run() requires the plan's device to be current).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
#if GDNKIT_WITH_CUDA
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();
      previous_ = -1;
      return;
    }
    if (previous_ != device && cudaSetDevice(device) == cudaSuccess) set_ = true;
#else
    (void)device;  // a CPU-only build: the planner refuses CUDA tensors
#endif
  }
  ~DeviceGuard() {
#if GDNKIT_WITH_CUDA
    if (set_) cudaSetDevice(previous_);
#endif
  }
  // Whether `device` is current in the scope (false where cudaSetDevice failed).
  bool holds(int device) const { return set_ || previous_ == device; }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool set_ = false;
};

// ---------------------------------------------------------------------------------------------
// Layout checks.

// Leading (batch/token) dims of q: [T] (packed, 3-D q) or [B, L] (batched, 4-D q).
struct Lead {
  int n = 1;  // 1 or 2
  std::int64_t B = 1, L = 0;
  std::int64_t T() const { return B * L; }
  std::string str() const {
    return n == 1 ? "T=" + ::str(L) : "[B, T]=[" + ::str(B) + ", " + ::str(L) + "]";
  }
};

std::string lead_of(const Tensor& t, int n) {
  return n == 1 ? "T=" + str(t.dim(0)) : "[B, T]=[" + str(t.dim(0)) + ", " + str(t.dim(1)) + "]";
}

// Checks t has q's leading dims followed by `rest` more dims, and returns its token stride in
// elements (0 = irrelevant, at most one token). Problem has no batch stride, so a 4-D view must
// flatten to [B*T, ...]: batch stride == T * token stride.
std::int64_t token_stride(const Tensor& t, const Lead& lead, int rest, const char* layout) {
  if (t.ndim != lead.n + rest)
    fail(Kind::invalid_value, t.name, std::to_string(lead.n + rest) + " dims " + layout + " like q",
         std::to_string(t.ndim) + " dims " + shape_str(t));
  if ((lead.n == 1 && t.dim(0) != lead.L) ||
      (lead.n == 2 && (t.dim(0) != lead.B || t.dim(1) != lead.L)))
    fail(Kind::invalid_value, t.name, lead.str() + " like q", lead_of(t, lead.n) + " (shape " + shape_str(t) + ")");
  if (lead.T() <= 1) return 0;
  std::int64_t s;
  if (lead.n == 1 || lead.B == 1) {
    s = t.stride(lead.n - 1);
  } else if (lead.L == 1) {
    s = t.stride(0);
  } else {
    s = t.stride(1);
    if (t.stride(0) != lead.L * s)
      fail(Kind::invalid_value, t.name,
           "a batch stride of T * token stride = " + str(lead.L * s) +
               " (the [B, T] dims must flatten to B*T tokens; make it contiguous)",
           str(t.stride(0)) + " (strides " + strides_str(t) + ")");
  }
  if (s <= 0)
    fail(Kind::invalid_value, t.name, "a positive token stride", str(s) + " (strides " + strides_str(t) + ")");
  return s;
}

// Head stride of dim i (0 when there is at most one head: irrelevant).
std::int64_t head_stride(const Tensor& t, int i) {
  if (t.dim(i) <= 1) return 0;
  const std::int64_t s = t.stride(i);
  if (s <= 0)
    fail(Kind::invalid_value, t.name, "a positive head stride", str(s) + " (strides " + strides_str(t) + ")");
  return s;
}

// q, k, v: [..., heads, dim] with the feature dim contiguous.
gdnkit::Strides qkv_strides(const Tensor& t, const Lead& lead) {
  const std::int64_t ts = token_stride(t, lead, 2, lead.n == 1 ? "[T, H, D]" : "[B, T, H, D]");
  if (lead.T() == 0) return {};  // no elements: strides are meaningless (often 0)
  const int d = lead.n + 1;
  if (t.dim(d) > 1 && t.stride(d) != 1)
    fail(Kind::invalid_value, t.name, "a contiguous last dim (stride 1)",
         "stride " + str(t.stride(d)) + " (strides " + strides_str(t) + ")");
  return {ts, head_stride(t, lead.n)};
}

// g, beta: [..., H].
gdnkit::Strides gate_strides(const Tensor& t, const Lead& lead) {
  const std::int64_t ts = token_stride(t, lead, 1, lead.n == 1 ? "[T, H]" : "[B, T, H]");
  if (lead.T() == 0) return {};
  return {ts, head_stride(t, lead.n)};
}

DType qkv_dtype(const Tensor& t) {
  if (t.elem == Elem::f16) return DType::f16;
  if (t.elem == Elem::bf16) return DType::bf16;
  fail(Kind::invalid_type, t.name, "dtype float16 or bfloat16", dtype_of(t));
}

bool is_c_contiguous(const Tensor& t) {
  std::int64_t expect = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expect) return false;
    expect *= t.shape[i];
  }
  return true;
}

// Host cu_seqlens are always checked (O(N)): a bad one would make run() read or write outside the
// tensors, which must not be reachable from Python. Same messages as Plan::validate.
void check_host_cu_seqlens(const Tensor& cu, std::int64_t T) {
  const auto at = [&](std::int64_t i) -> std::int64_t {
    return cu.elem == Elem::i32 ? static_cast<const std::int32_t*>(cu.data)[i]
                                : static_cast<const std::int64_t*>(cu.data)[i];
  };
  const std::int64_t n = cu.dim(0) - 1;
  if (at(0) != 0) fail(Kind::invalid_value, "cu_seqlens[0]", "0", str(at(0)));
  std::int64_t prev = 0;
  for (std::int64_t i = 1; i <= n; ++i) {
    const std::int64_t x = at(i);
    if (x < prev)
      fail(Kind::invalid_value, "cu_seqlens[" + str(i) + "]", "a non-decreasing value >= " + str(prev), str(x));
    prev = x;
  }
  if (prev != T) fail(Kind::invalid_value, "cu_seqlens[" + str(n) + "]", "total_tokens=" + str(T), str(prev));
}

// ---------------------------------------------------------------------------------------------
// Allocation with q's framework, on q's device (for CUDA: under DeviceGuard, on the framework's
// current stream, which is the stream the call runs on).

class Allocator {
 public:
  explicit Allocator(const Tensor& q) : q_(q.obj) {
    if (is_numpy(q_)) {
      kind_ = Numpy;
    } else if (is_torch(q_) || (torch_ready() && PyObject_IsInstance(q_.ptr(), TT.tensor) == 1)) {
      kind_ = Torch;  // q.new_empty(shape[, dtype]): q's device, no grad (subclasses included)
    } else if (nb::object cupy = imported("cupy"); cupy.is_valid() && nb::isinstance(q_, cupy.attr("ndarray"))) {
      kind_ = CurrentDevice;  // cupy.empty allocates on the current device (set by DeviceGuard)
      ns_ = cupy;
    } else if (nb::hasattr(q_, "__array_namespace__")) {
      kind_ = WithDevice;
      ns_ = q_.attr("__array_namespace__")();
      device_ = q_.attr("device");
    } else {
      fail(Kind::invalid_type, "q",
           "a NumPy array, a torch tensor, a CuPy array or an array-API array (outputs are allocated like q)",
           py_type_name(q_));
    }
  }

  // The exchange table for torch tensors (its allocator: the framework's caching allocator on the
  // current stream, for the workspace; TableTensor), or null: then uint8.
  const dl::ExchangeApi* table() const {
    return kind_ == Torch && TT.api && TT.api->managed_tensor_allocator ? TT.api : nullptr;
  }

  // Uninitialised arrays of `shape`: q's dtype, float32, uint8.
  nb::object like_q(nb::handle shape) {
    if (kind_ == Torch) return call(PyObject_CallMethodOneArg(q_.ptr(), TT.s_new_empty, shape.ptr()));
    return empty(shape, nb::getattr(q_, "dtype"));
  }
  nb::object float32(nb::handle shape) {
    if (kind_ == Numpy) return empty(shape, G.np_float32);
    if (kind_ == Torch) return torch_empty(shape, TT.f32);
    return empty(shape, ns_.attr("float32"));
  }
  nb::object uint8(nb::handle shape) {
    if (kind_ == Numpy) return empty(shape, nb::str("uint8"));
    if (kind_ == Torch) return torch_empty(shape, TT.u8);
    return empty(shape, ns_.attr("uint8"));
  }

 private:
  static nb::object call(PyObject* r) {
    if (!r) throw nb::python_error();
    return nb::steal(r);
  }
  nb::object torch_empty(nb::handle shape, PyObject* dtype) {
    nb::object new_empty = nb::steal(PyObject_GetAttr(q_.ptr(), TT.s_new_empty));
    if (!new_empty.is_valid()) throw nb::python_error();
    return new_empty(shape, "dtype"_a = nb::handle(dtype));
  }
  nb::object empty(nb::handle shape, nb::handle dtype) {
    if (kind_ == Numpy) return call(PyObject_CallFunctionObjArgs(G.np_empty, shape.ptr(), dtype.ptr(), nullptr));
    if (kind_ == CurrentDevice) return ns_.attr("empty")(shape, "dtype"_a = dtype);
    return ns_.attr("empty")(shape, "dtype"_a = dtype, "device"_a = device_);
  }
  static nb::object imported(const char* name) {
    PyObject* m = PyImport_GetModule(nb::str(name).ptr());  // new reference, or null
    if (!m) {
      PyErr_Clear();
      return {};
    }
    nb::object mod = nb::steal(m);
    return mod.is_none() ? nb::object() : mod;
  }

  enum { Numpy, Torch, CurrentDevice, WithDevice } kind_ = Numpy;
  nb::handle q_;
  nb::object ns_, device_;
};

// Reads back an array the binding just allocated (its data pointer; it is packed by construction,
// which is checked).
Tensor import_output(nb::handle obj, const char* name, const Tensor& q) {
  Tensor t = import_tensor(obj, name);
  std::int64_t expect = 1;
  bool packed = true, empty = false;
  for (int i = t.ndim - 1; i >= 0; --i) {
    packed &= t.shape[i] <= 1 || t.strides[i] == expect;
    empty |= t.shape[i] == 0;
    expect *= t.shape[i];
  }
  if (!(packed || empty) || t.dev != q.dev || t.device_id != q.device_id)
    throw Error(Kind::unsupported, name, std::string(name) + ": the " + py_type_name(obj) +
                                             " allocated like q is not a packed array on q's device");
  return t;
}

// Scratch from the exchange table's allocator (torch's caching allocator, on q's device and the
// current stream), packed, released when this goes out of scope. allocate() returns false (no
// error set) where the table's allocator refuses: the caller then allocates through Python, which
// raises torch's own error (torch.OutOfMemoryError, ...).
class TableTensor {
 public:
  TableTensor() = default;
  TableTensor(const TableTensor&) = delete;
  TableTensor& operator=(const TableTensor&) = delete;
  ~TableTensor() {
    if (m_ && m_->deleter) m_->deleter(m_);
  }

  bool allocate(const dl::ExchangeApi* api, const Tensor& q, const std::int64_t* dims, int n, dl::DataType dtype) {
    dl::Tensor proto{};
    proto.device = {q.dev == Dev::cuda ? dl::kCUDA : dl::kCPU, q.dev == Dev::cuda ? q.device_id : 0};
    proto.ndim = n;
    proto.dtype = dtype;
    proto.shape = const_cast<std::int64_t*>(dims);
    dl::Managed* m = nullptr;
    if (api->managed_tensor_allocator(&proto, &m, nullptr, &ignore_error) != 0 || !m) return false;
    m_ = m;
    // What was asked for: shape, dtype and device, and packed (or empty).
    const dl::Tensor& d = m->dl_tensor;
    bool ok = d.ndim == n && d.dtype.code == dtype.code && d.dtype.bits == dtype.bits && d.dtype.lanes == 1 &&
              d.device.type == proto.device.type && d.device.id == proto.device.id;
    std::int64_t expect = 1;
    bool empty = false;
    for (int i = n - 1; ok && i >= 0; --i) {
      ok = d.shape[i] == dims[i] && (!d.strides || dims[i] <= 1 || d.strides[i] == expect);
      empty |= dims[i] == 0;
      expect *= dims[i];
    }
    if (!ok || (!d.data && !empty)) return false;  // released by the destructor
    data_ = static_cast<char*>(d.data) + d.byte_offset;
    return true;
  }
  void* data() const { return data_; }
 private:
  static void ignore_error(void*, const char*, const char*) {}
  dl::Managed* m_ = nullptr;
  void* data_ = nullptr;
};

template <std::size_t N>
nb::tuple make_shape(const std::int64_t (&dims)[N], std::size_t n) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(n));
  if (!t) throw nb::python_error();
  for (std::size_t i = 0; i < n; ++i) PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(dims[i]));
  return nb::steal<nb::tuple>(t);
}

struct HostBuffer {
  void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t(256)); }
};

std::string repr_double(double x) { return nb::repr(nb::float_(x)).c_str(); }

// An int argument: Python ints and anything with __index__ (numpy.int64, ...); out of the 64-bit
// range is a ValueError naming the argument.
long long int_arg(nb::handle h, const char* name) {
  if (PyFloat_Check(h.ptr()) || !PyIndex_Check(h.ptr())) fail(Kind::invalid_type, name, "an int or None", py_type_name(h));
  nb::object i = nb::steal(PyNumber_Index(h.ptr()));
  if (!i.is_valid()) throw nb::python_error();
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0)
    fail(Kind::invalid_value, name, "an int in the 64-bit range", nb::repr(i).c_str());
  if (x == -1 && PyErr_Occurred()) throw nb::python_error();
  return x;
}

// A float argument: Python floats and ints and anything with __float__ (numpy.float32, ...), not
// str or bool; an int too large for a double is a ValueError naming the argument.
double float_arg(nb::handle h, const char* name) {
  if (PyUnicode_Check(h.ptr()) || PyBool_Check(h.ptr()) || PyBytes_Check(h.ptr()))
    fail(Kind::invalid_type, name, "a float or None", py_type_name(h));
  const double x = PyFloat_AsDouble(h.ptr());
  if (x == -1.0 && PyErr_Occurred()) {
    const bool overflow = PyErr_ExceptionMatches(PyExc_OverflowError);
    PyErr_Clear();
    if (overflow) fail(Kind::invalid_value, name, "a finite number", nb::repr(h).c_str());
    fail(Kind::invalid_type, name, "a float or None", py_type_name(h));
  }
  return x;
}

const char* text_arg(nb::handle h, const char* name) {
  if (!PyUnicode_Check(h.ptr())) fail(Kind::invalid_type, name, "a str", py_type_name(h));
  const char* s = PyUnicode_AsUTF8(h.ptr());
  if (!s) throw nb::python_error();
  return s;
}

gdnkit::GateSpace parse_gate(std::string_view s) {
  if (s == "log") return gdnkit::GateSpace::log;
  if (s == "linear") return gdnkit::GateSpace::linear;
  fail(Kind::invalid_value, "gate", "'log' or 'linear'", "'" + std::string(s) + "'");
}

gdnkit::StateLayout parse_layout(std::string_view s) {
  if (s == "kv") return gdnkit::StateLayout::kv;
  if (s == "vk") return gdnkit::StateLayout::vk;
  fail(Kind::invalid_value, "state_layout", "'kv' ([N, H, dk, dv]) or 'vk' ([N, H, dv, dk])",
       "'" + std::string(s) + "'");
}

// ---------------------------------------------------------------------------------------------
// Plans of recent calls. Plan::create costs microseconds on the CUDA backend (the checks, the
// split's cost model, the TMA descriptors), a tenth of a Python call; a caller that repeats a
// problem (a benchmark, training at fixed lengths, serving in length buckets) gets the plan it had.
// The key is everything create() reads: the Problem, the Options and the current device. The
// entries stay in most-recently-used order, kPlanCacheEntries at most: a miss costs their
// comparisons (tens of nanoseconds each) and the plan's creation, as before.

constexpr std::size_t kPlanCacheEntries = 16;

struct PlanKey {
  std::int64_t v[40] = {};
  std::string kernel;  // Options::kernel's text ("" for none: no kernel is named "")
  bool operator==(const PlanKey&) const = default;
};

PlanKey plan_key(const gdnkit::Problem& p, const gdnkit::Options& o, int device) {
  PlanKey k;
  std::int64_t* x = k.v;
  auto put = [&](std::int64_t a) {
    if (x == std::end(k.v)) throw std::logic_error("plan_key: PlanKey::v is too short");
    *x++ = a;
  };
  put(p.total_tokens), put(p.num_seqs), put(p.num_q_heads), put(p.num_k_heads), put(p.num_v_heads);
  put(p.head_dim_k), put(p.head_dim_v);
  put(static_cast<int>(p.qkv_dtype)), put(static_cast<int>(p.beta_dtype)), put(static_cast<int>(p.cu_seqlens_dtype));
  put(p.has_cu_seqlens);
  for (const gdnkit::Strides& s : {p.q, p.k, p.v, p.o, p.g, p.beta}) put(s.token), put(s.head);
  std::uint32_t scale_bits = 0;
  if (p.scale) std::memcpy(&scale_bits, &*p.scale, sizeof scale_bits);
  put(p.scale.has_value()), put(scale_bits);
  put(p.has_gate), put(p.has_beta), put(p.has_initial_state), put(p.want_final_state);
  put(static_cast<int>(p.gate_space)), put(static_cast<int>(p.state_layout)), put(static_cast<int>(p.memory));
  put(p.max_seq_len);
  std::uint32_t cutoff_bits = 0;
  std::memcpy(&cutoff_bits, &o.split_decay_cutoff, sizeof cutoff_bits);
  put(static_cast<int>(o.backend)), put(o.cpu_threads), put(o.segments), put(cutoff_bits), put(o.kernel != nullptr);
  put(device);
  if (o.kernel) k.kernel = o.kernel;
  return k;
}

class PlanCache {
 public:
  // The plan of (p, o) on `device` (the current one), from the cache or created (and kept).
  // Throws what Plan::create throws; a failed creation is not kept.
  std::shared_ptr<const gdnkit::Plan> get(const gdnkit::Problem& p, const gdnkit::Options& o, int device) {
    PlanKey key = plan_key(p, o, device);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto hit = find_front(key)) {
        ++hits_;
        return hit;
      }
      ++misses_;
    }
    auto plan = std::make_shared<const gdnkit::Plan>(gdnkit::Plan::create(p, o));
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto hit = find_front(key)) return hit;  // another thread planned it meanwhile (free-threaded)
    if (entries_.size() == kPlanCacheEntries) entries_.pop_back();
    entries_.emplace(entries_.begin(), std::move(key), plan);
    return plan;
  }
  // (hits, misses, entries) since the module was loaded or clear() was called.
  nb::tuple info() {
    std::size_t h, m, n;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      h = hits_, m = misses_, n = entries_.size();
    }
    return nb::make_tuple(h, m, n);  // Python objects made outside the lock
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.clear();
    hits_ = misses_ = 0;
  }

 private:
  // The entry of key moved to the front, or null (mutex_ held).
  std::shared_ptr<const gdnkit::Plan> find_front(const PlanKey& key) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->first == key) {
        std::rotate(entries_.begin(), it, it + 1);
        return entries_.front().second;
      }
    return nullptr;
  }
  std::mutex mutex_;  // the GIL covers today's callers; this keeps a free-threaded build correct
  std::vector<std::pair<PlanKey, std::shared_ptr<const gdnkit::Plan>>> entries_;  // most recent first
  std::size_t hits_ = 0, misses_ = 0;
};

// Never destroyed (see Globals): a call may still be running on another thread at exit.
PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache;
  return *cache;
}

// ---------------------------------------------------------------------------------------------
// The call.

nb::tuple forward(nb::handle q_obj, nb::handle k_obj, nb::handle v_obj, nb::handle g_obj, nb::handle beta_obj,
                  nb::handle scale_obj, nb::handle h0_obj, nb::handle want_final_obj, nb::handle cu_obj,
                  nb::handle gate_obj, nb::handle layout_obj, nb::handle validate_obj, nb::handle stream_obj,
                  nb::handle kernel_obj, nb::handle segments_obj, nb::handle max_len_obj, nb::handle cutoff_obj) {
  gdnkit::Problem p;
  // Borrowed from the str object, which the caller keeps alive for the whole call.
  const char* kernel = kernel_obj.is_none() ? nullptr : text_arg(kernel_obj, "kernel");
  const char* gate = text_arg(gate_obj, "gate");
  const char* state_layout = text_arg(layout_obj, "state_layout");
  p.gate_space = parse_gate(gate);
  p.state_layout = parse_layout(state_layout);
  std::uintptr_t stream_handle = 0;
  if (!stream_obj.is_none()) {
    if (!PyLong_Check(stream_obj.ptr()))
      fail(Kind::invalid_type, "stream", "an integer (a cudaStream_t) or None", py_type_name(stream_obj));
    stream_handle = reinterpret_cast<std::uintptr_t>(PyLong_AsVoidPtr(stream_obj.ptr()));
    if (PyErr_Occurred()) throw nb::python_error();
  }

  // Python truthiness for the flags (accepts numpy.bool_ and friends).
  auto truthy = [](nb::handle h) {
    const int r = PyObject_IsTrue(h.ptr());
    if (r < 0) throw nb::python_error();
    return r == 1;
  };
  p.want_final_state = truthy(want_final_obj);
  const bool validate = truthy(validate_obj);

  if (!scale_obj.is_none()) {
    const double s = float_arg(scale_obj, "scale");
    if (!(std::fabs(s) <= FLT_MAX)) fail(Kind::invalid_value, "scale", "a finite number (float32)", repr_double(s));
    p.scale = static_cast<float>(s);
    // A scale float32 rounds to zero would silently give zeros.
    if (s != 0.0 && *p.scale == 0.0f)
      fail(Kind::invalid_value, "scale", "0 or a magnitude float32 keeps (>= 1.4e-45)", repr_double(s));
  }

  if (q_obj.is_none()) fail(Kind::invalid_type, "q", "a tensor", "None");
  if (k_obj.is_none()) fail(Kind::invalid_type, "k", "a tensor", "None");
  if (v_obj.is_none()) fail(Kind::invalid_type, "v", "a tensor", "None");
  const Tensor q = import_tensor(q_obj, "q");
  const Tensor k = import_tensor(k_obj, "k");
  const Tensor v = import_tensor(v_obj, "v");
  const Tensor g = import_tensor(g_obj, "g");
  const Tensor beta = import_tensor(beta_obj, "beta");
  const Tensor h0 = import_tensor(h0_obj, "initial_state");
  const Tensor cu = import_tensor(cu_obj, "cu_seqlens");

  // Device: q decides; everything else must be on the same one.
  if (q.dev == Dev::other) fail(Kind::unsupported, "q", "a CPU or CUDA tensor", device_str(q));
  for (const Tensor* t : {&k, &v, &g, &beta, &h0, &cu}) check_same_device(*t, q);
  p.memory = q.dev == Dev::host ? gdnkit::Memory::host : gdnkit::Memory::cuda;
  // stream None for a torch CUDA tensor: torch's current stream on q's device.
  // An explicit stream for a torch CUDA tensor must be that one: the outputs and the scratch come
  // from torch's caching allocator, which hands the scratch back for reuse on its current stream
  // once this call returns, while a launch on another stream could still be using it.
  if (q.dev == Dev::cuda && torch_ready() && PyObject_TypeCheck(q_obj.ptr(), (PyTypeObject*)TT.tensor)) {
    const std::uintptr_t current = torch_stream(q.device_id);
    if (stream_obj.is_none()) {
      stream_handle = current;
    } else if (stream_handle != current) {
      fail(Kind::invalid_value, "stream",
           "None or torch's current stream on q's device (" + std::to_string(current) +
               "; run under `with torch.cuda.stream(s):` for another)",
           std::to_string(stream_handle));
    }
  }

  // Layout from q: [T, Hq, dk] (packed) or [B, T, Hq, dk] (batched).
  Lead lead;
  if (q.ndim == 3) {
    lead.n = 1;
    lead.L = q.dim(0);
  } else if (q.ndim == 4) {
    lead.n = 2;
    lead.B = q.dim(0);
    lead.L = q.dim(1);
  } else {
    fail(Kind::invalid_value, "q", "3 dims [T, H, K] or 4 dims [B, T, H, K]",
         std::to_string(q.ndim) + " dims " + shape_str(q));
  }
  const int hd = lead.n;  // index of the head dim
  p.total_tokens = lead.T();

  // dtypes.
  p.qkv_dtype = qkv_dtype(q);
  for (const Tensor* t : {&k, &v})
    if (t->elem != q.elem)
      fail(Kind::invalid_type, t->name, std::string("dtype ") + elem_name(q.elem) + " like q", dtype_of(*t));

  // Shapes and strides of q, k, v.
  p.q = qkv_strides(q, lead);
  p.k = qkv_strides(k, lead);
  p.v = qkv_strides(v, lead);
  // Head counts and head dims are C ints in the Problem: larger ones are refused, not truncated.
  auto int_dim = [&](const Tensor& t, int i, const char* what) {
    if (t.dim(i) > INT_MAX)
      fail(Kind::invalid_value, t.name, std::string("at most 2^31-1 ") + what, str(t.dim(i)) + " (shape " + shape_str(t) + ")");
    return static_cast<int>(t.dim(i));
  };
  p.num_q_heads = int_dim(q, hd, "heads");
  p.num_k_heads = int_dim(k, hd, "heads");
  p.num_v_heads = int_dim(v, hd, "heads");
  p.head_dim_k = int_dim(q, hd + 1, "head dims");
  p.head_dim_v = int_dim(v, hd + 1, "head dims");
  if (k.dim(hd + 1) != q.dim(hd + 1))
    fail(Kind::invalid_value, "k", "head dim " + str(q.dim(hd + 1)) + " like q", str(k.dim(hd + 1)));

  p.has_gate = g.present;
  if (g.present) {
    if (g.elem != Elem::f32) fail(Kind::invalid_type, "g", "dtype float32", dtype_of(g));
    p.g = gate_strides(g, lead);
  }
  p.has_beta = beta.present;
  if (beta.present) {
    switch (beta.elem) {
      case Elem::f32: p.beta_dtype = DType::f32; break;
      case Elem::f16: p.beta_dtype = DType::f16; break;
      case Elem::bf16: p.beta_dtype = DType::bf16; break;
      default: fail(Kind::invalid_type, "beta", "dtype float32, float16 or bfloat16", dtype_of(beta));
    }
    p.beta = gate_strides(beta, lead);
  }

  // Sequences.
  p.has_cu_seqlens = cu.present;
  if (cu.present) {
    if (cu.elem != Elem::i32 && cu.elem != Elem::i64)
      fail(Kind::invalid_type, "cu_seqlens", "dtype int32 or int64", dtype_of(cu));
    p.cu_seqlens_dtype = cu.elem == Elem::i32 ? DType::i32 : DType::i64;
    if (cu.ndim != 1)
      fail(Kind::invalid_value, "cu_seqlens", "1 dim [N+1]", std::to_string(cu.ndim) + " dims " + shape_str(cu));
    if (cu.dim(0) < 2)
      fail(Kind::invalid_value, "cu_seqlens", "at least 2 entries [N+1]", shape_str(cu));
    if (cu.stride(0) != 1)
      fail(Kind::invalid_value, "cu_seqlens", "a contiguous tensor (stride 1)", "stride " + str(cu.stride(0)));
    if (lead.n == 2 && lead.B != 1)
      fail(Kind::invalid_value, "cu_seqlens",
           "batch size B=1 for 4-D q with cu_seqlens (the packed sequences are q[0])", "B=" + str(lead.B));
    p.num_seqs = cu.dim(0) - 1;
  } else {
    if (lead.n == 2 && lead.B < 1)
      fail(Kind::invalid_value, "q", "a batch size B >= 1 in [B, T, H, K]", "B=" + str(lead.B) + " (shape " + shape_str(q) + ")");
    p.num_seqs = lead.n == 2 ? lead.B : 1;
  }

  // The planner checks heads, head dims, strides and dtypes it cares about.
  std::optional<DeviceGuard> guard;
  if (p.memory == gdnkit::Memory::cuda) guard.emplace(q.device_id);
  p.has_initial_state = h0.present;
  gdnkit::Options options;
  options.cpu_threads = 0;  // the library's count: the threads this process may run on (its affinity)
  options.kernel = kernel;
  if (!segments_obj.is_none()) {
    const long long k = int_arg(segments_obj, "segments");
    if (k < INT_MIN || k > INT_MAX) fail(Kind::invalid_value, "segments", "an int in the C int range", std::to_string(k));
    options.segments = static_cast<int>(k);
  }
  if (!cutoff_obj.is_none()) {
    const double c = float_arg(cutoff_obj, "split_decay_cutoff");
    if (!(c >= 0.0 && c < 1.0)) fail(Kind::invalid_value, "options.split_decay_cutoff", "a value in [0, 1) (0: exact)", repr_double(c));
    // In [0, 1) as given, so in float too (the planner checks the float's range again).
    options.split_decay_cutoff = std::min(static_cast<float>(c), std::nextafter(1.0f, 0.0f));
  }
  if (!max_len_obj.is_none()) p.max_seq_len = int_arg(max_len_obj, "max_seq_len");  // the planner checks the range
  // A plan from the cache only where q's device is surely the current one (it is part of the key).
  const int device = p.memory == gdnkit::Memory::cuda ? q.device_id : -1;
  const std::shared_ptr<const gdnkit::Plan> plan =
      !guard || guard->holds(device) ? plan_cache().get(p, options, device)
                                     : std::make_shared<const gdnkit::Plan>(gdnkit::Plan::create(p, options));
  const gdnkit::Plan& P = *plan;
  const std::int64_t N = p.num_seqs, dk = p.head_dim_k, dv = p.head_dim_v, H = P.num_output_heads();

  for (const Tensor* t : {&g, &beta})
    if (t->present && t->dim(hd) != H)
      fail(Kind::invalid_value, t->name, "H=max(Hq, Hv)=" + str(H) + " heads", str(t->dim(hd)) + " (shape " + shape_str(*t) + ")");

  const std::int64_t s2 = p.state_layout == gdnkit::StateLayout::kv ? dk : dv;
  const std::int64_t s3 = p.state_layout == gdnkit::StateLayout::kv ? dv : dk;
  const std::int64_t state_dims[4] = {N, H, s2, s3};
  if (h0.present) {
    if (h0.elem != Elem::f32) fail(Kind::invalid_type, "initial_state", "dtype float32", dtype_of(h0));
    const bool ok = h0.ndim == 4 && h0.dim(0) == N && h0.dim(1) == H && h0.dim(2) == s2 && h0.dim(3) == s3;
    if (!ok)
      fail(Kind::invalid_value, "initial_state",
           std::string("shape ") + (p.state_layout == gdnkit::StateLayout::kv ? "[N, H, dk, dv]" : "[N, H, dv, dk]") +
               " = (" + str(N) + ", " + str(H) + ", " + str(s2) + ", " + str(s3) + ") for state_layout='" +
               std::string(state_layout) + "'",
           shape_str(h0));
    if (!is_c_contiguous(h0))
      fail(Kind::invalid_value, "initial_state", "a C-contiguous tensor", "strides " + strides_str(h0));
  }
  if (cu.present && p.memory == gdnkit::Memory::host && !validate) check_host_cu_seqlens(cu, p.total_tokens);

  // Outputs, allocated like q.
  Allocator alloc(q);
  const dl::ExchangeApi* const table = alloc.table();
  std::int64_t o_dims[4];
  std::size_t o_n = 0;
  if (lead.n == 2) o_dims[o_n++] = lead.B;
  o_dims[o_n++] = lead.L;
  o_dims[o_n++] = H;
  o_dims[o_n++] = dv;
  // o and final_state through the framework's own call (q.new_empty): a tensor that the table's
  // allocator returns reaches Python wrapped around a foreign buffer (from_blob), on which torch's
  // record_stream does nothing and resize_ raises. Only the workspace, which never leaves this
  // call, comes from the table.
  nb::object o_obj = alloc.like_q(make_shape(o_dims, o_n));
  const Tensor o = import_output(o_obj, "o", q);
  nb::object hT_obj = nb::none();
  Tensor hT;
  if (p.want_final_state) {
    hT_obj = alloc.float32(make_shape(state_dims, 4));
    hT = import_output(hT_obj, "final_state", q);
  }

  gdnkit::Tensors t;
  t.q = q.data;
  t.k = k.data;
  t.v = v.data;
  t.g = static_cast<const float*>(g.present ? g.data : nullptr);
  t.beta = beta.present ? beta.data : nullptr;
  t.cu_seqlens = cu.present ? cu.data : nullptr;
  t.initial_state = static_cast<const float*>(h0.present ? h0.data : nullptr);
  t.o = const_cast<void*>(o.data);
  t.final_state = p.want_final_state ? static_cast<float*>(const_cast<void*>(hT.data)) : nullptr;

  // Workspace: host memory from the C++ heap; device memory from q's framework (its caching
  // allocator for torch, on its current stream), 256-byte aligned, released on return: the caching
  // allocator reuses it only after what is queued on that stream, the launches included.
  const std::size_t ws_bytes = P.workspace_bytes();
  std::unique_ptr<std::byte[], HostBuffer> host_ws;
  TableTensor table_ws;
  nb::object dev_ws_obj;
  void* ws = nullptr;
  if (ws_bytes > 0) {
    if (p.memory == gdnkit::Memory::host) {
      host_ws.reset(static_cast<std::byte*>(::operator new[](ws_bytes, std::align_val_t(256))));
      ws = host_ws.get();
    } else {
      const std::int64_t dims[1] = {static_cast<std::int64_t>(ws_bytes + 256)};
      std::uintptr_t addr;
      if (table && table_ws.allocate(table, q, dims, 1, dl::DataType{1, 8, 1})) {  // kDLUInt 8
        addr = reinterpret_cast<std::uintptr_t>(table_ws.data());
      } else {
        dev_ws_obj = alloc.uint8(make_shape(dims, 1));
        addr = reinterpret_cast<std::uintptr_t>(import_output(dev_ws_obj, "workspace", q).data);
      }
      ws = reinterpret_cast<void*>((addr + 255) & ~std::uintptr_t(255));
    }
  }

  const auto stream = reinterpret_cast<gdnkit::Stream>(stream_handle);
  {
    nb::gil_scoped_release release;
    if (validate) P.validate(t, stream);
    P.run(t, ws, ws_bytes, stream);
  }
  return nb::make_tuple(o_obj, hT_obj);
}

}  // namespace

// The library's message with the names of the Python call's arguments where the C++ API names
// them otherwise (Options fields, Problem's head dims).
std::string python_names(std::string msg) {
  static const std::pair<std::string_view, std::string_view> kNames[] = {
      {"options.kernel", "kernel"},
      {"options.segments", "segments"},
      {"options.split_decay_cutoff", "split_decay_cutoff"},
      {"head_dim_k", "q, k head dim"},
      {"head_dim_v", "v head dim"},
  };
  for (const auto& [from, to] : kNames)
    for (std::size_t at = msg.find(from); at != std::string::npos; at = msg.find(from, at + to.size()))
      msg.replace(at, from.size(), to);
  return msg;
}

NB_MODULE(_gdnkit, m) {
  m.doc() = "gdnkit C++ binding (use the gdnkit package, not this module)";
  init_globals();

  nb::register_exception_translator([](const std::exception_ptr& ptr, void*) {
    try {
      std::rethrow_exception(ptr);
    } catch (const gdnkit::Error& e) {
      PyObject* type = PyExc_RuntimeError;
      if (e.kind() == Kind::invalid_value) type = PyExc_ValueError;
      else if (e.kind() == Kind::invalid_type) type = PyExc_TypeError;
      PyErr_SetString(type, python_names(e.what()).c_str());
    }
  });

  m.attr("__version__") = GDNKIT_VERSION;
  m.def("_torch_exchange_table", [] { return torch_ready() && TT.api != nullptr; },
        "True when torch is imported and the binding reads, allocates and finds the stream of torch "
        "tensors through DLPack's C exchange table (torch.Tensor.__dlpack_c_exchange_api__).");
  m.def("_plan_cache_info", [] { return plan_cache().info(); },
        "(hits, misses, entries) of the binding's plan cache since import or _plan_cache_clear().");
  m.def("_plan_cache_clear", [] { plan_cache().clear(); }, "Empties the binding's plan cache.");
  m.def("cuda_available", &gdnkit::cuda_available,
        "True when a CUDA device is present and usable from this process.");
  m.def("_forward", &forward, "q"_a.none(), "k"_a.none(), "v"_a.none(), "g"_a.none(), "beta"_a.none(),
        "scale"_a.none(), "initial_state"_a.none(), "output_final_state"_a.none(), "cu_seqlens"_a.none(),
        "gate"_a.none(), "state_layout"_a.none(), "validate"_a.none(), "stream"_a.none(), "kernel"_a.none(),
        "segments"_a.none(), "max_seq_len"_a.none(), "split_decay_cutoff"_a.none(), "Runs the GDN prefill; see gdnkit.chunk_gated_delta_rule. Returns (o, final_state or None).");
}
