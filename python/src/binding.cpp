// mamba2_ssd._C: the nanobind extension over the C++ API (include/mamba2_ssd/api.hpp).
//
// Two ways in, one ForwardParams builder:
//   forward_dlpack / workspace_size_dlpack: any array with __dlpack__ (or the buffer protocol),
//     converted with nanobind's ndarray caster: numpy, CuPy, JAX, torch, ...
//   forward_torch: torch.Tensor objects read directly through their attributes (data_ptr(),
//     shape, stride(), dtype, is_cuda). Much cheaper than torch's Python-level __dlpack__ per
//     tensor; used by the torch custom operator in mamba2_ssd/_torch_ops.py.
//
// Errors: mamba2_ssd::Error is raised as InvalidArgumentError (a ValueError), UnsupportedError
// (a NotImplementedError) or CudaError (a RuntimeError), each carrying the C++ message and the
// offending argument's name in `.argument`. A wrong Python type raises TypeError.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include "mamba2_ssd/mamba2_ssd.hpp"

#ifdef MAMBA2_SSD_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace nb = nanobind;
namespace m2 = mamba2_ssd;

namespace {

// ---------------------------------------------------------------- argument slots

// Order of the tensor arguments of every entry point (after the scalars are taken out).
enum Slot : int {
  kX,
  kDt,
  kA,
  kB,
  kC,
  kD,
  kZ,
  kDtBias,
  kInitialStates,
  kSeqIdx,
  kCuSeqlens,
  kOut,
  kFinalStates,
  kVarlenStates,
  kChunkStates,
  kChunkOffsets,
  kNumSlots,
};

constexpr const char* kSlotNames[kNumSlots] = {
    "x",          "dt",  "A",     "B",           "C",            "D",           "z",
    "dt_bias",    "initial_states", "seq_idx",   "cu_seqlens",   "out",         "final_states",
    "varlen_states", "chunk_states", "chunk_offsets",
};

bool is_required(int slot) {
  return slot == kX || slot == kDt || slot == kA || slot == kB || slot == kC || slot == kOut;
}

bool is_output(int slot) { return slot >= kOut; }

m2::TensorView& view_of(m2::ForwardParams& p, int slot) {
  switch (slot) {
    case kX: return p.x;
    case kDt: return p.dt;
    case kA: return p.A;
    case kB: return p.B;
    case kC: return p.C;
    case kD: return p.D;
    case kZ: return p.z;
    case kDtBias: return p.dt_bias;
    case kInitialStates: return p.initial_states;
    case kSeqIdx: return p.seq_idx;
    case kCuSeqlens: return p.cu_seqlens;
    case kOut: return p.out;
    case kFinalStates: return p.final_states;
    case kVarlenStates: return p.varlen_states;
    case kChunkStates: return p.chunk_states;
    default: return p.chunk_offsets;
  }
}

// A stand-in data pointer for tensors with no elements (torch gives them data_ptr() == 0, which
// the C++ API reads as "absent"): validate() then reports the real problem (a size of 0). It is
// never dereferenced: every tensor with a zero size fails validation before anything is read.
alignas(256) unsigned char g_empty_storage[256];

// ---------------------------------------------------------------- errors

PyObject* g_invalid_argument_error = nullptr;  // ValueError subclass
PyObject* g_unsupported_error = nullptr;       // NotImplementedError subclass
PyObject* g_cuda_error = nullptr;              // RuntimeError subclass

[[noreturn]] void invalid(const char* arg, const std::string& what) {
  throw m2::Error(m2::Error::Kind::kInvalidArgument, arg, std::string(arg) + ": " + what);
}

[[noreturn]] void type_error(const std::string& msg) { throw nb::type_error(msg.c_str()); }

std::string type_name(PyObject* o) {
  nb::str name = nb::inst_name(nb::handle(o));
  return std::string(name.c_str());
}

void translate_error(const std::exception_ptr& ptr, void*) {
  try {
    std::rethrow_exception(ptr);
  } catch (const m2::Error& e) {
    PyObject* type = g_cuda_error;
    switch (e.kind()) {
      case m2::Error::Kind::kInvalidArgument: type = g_invalid_argument_error; break;
      case m2::Error::Kind::kUnsupported: type = g_unsupported_error; break;
      case m2::Error::Kind::kCuda: type = g_cuda_error; break;
    }
    PyObject* msg = PyUnicode_FromString(e.what());
    PyObject* inst = msg ? PyObject_CallOneArg(type, msg) : nullptr;
    Py_XDECREF(msg);
    if (!inst) return;  // the error of the failed construction stays set
    PyObject* arg = PyUnicode_FromString(e.argument().c_str());
    if (arg) {
      PyObject_SetAttrString(inst, "argument", arg);
      Py_DECREF(arg);
    }
    PyErr_SetObject(type, inst);
    Py_DECREF(inst);
  }
}

// ---------------------------------------------------------------- device bookkeeping

// The device every tensor of one call must share, taken from x.
struct CallDevice {
  bool set = false;
  m2::Device device = m2::Device::kCPU;
  int index = -1;  // CUDA device ordinal, -1 for CPU

  void expect(int slot, m2::Device d) {
    if (!set) {
      set = true;
      device = d;
      return;
    }
    if (d != device) {
      invalid(kSlotNames[slot], std::string("expected memory of the same kind as x (") + m2::device_name(device) +
                                    "), got " + m2::device_name(d));
    }
  }
};

#ifdef MAMBA2_SSD_WITH_CUDA
// Makes `index` the current CUDA device for the scope of the call.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    if (index < 0) return;
    int current = 0;
    if (cudaGetDevice(&current) != cudaSuccess) {
      (void)cudaGetLastError();
      return;  // validate() reports an unusable device
    }
    if (current != index) {
      if (cudaSetDevice(index) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
      }
      previous_ = current;
    }
  }
  ~DeviceGuard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};
#else
struct DeviceGuard {
  explicit DeviceGuard(int) {}
};
#endif

// ---------------------------------------------------------------- scalars

struct Scalars {
  int64_t chunk_size = 0;
  bool dt_softplus = false;
  double dt_min = 0.0;
  double dt_max = 0.0;
  bool varlen = false;
  int state_dtype = -1;  // -1: unset (dtype of C); else a mamba2_ssd::DType value
};

void apply_scalars(m2::ForwardParams& p, const Scalars& s) {
  p.layout = s.varlen ? m2::Layout::kVarlen : m2::Layout::kBatched;
  p.chunk_size = s.chunk_size;
  p.dt_softplus = s.dt_softplus;
  p.dt_min = static_cast<float>(s.dt_min);
  p.dt_max = static_cast<float>(s.dt_max);
  if (s.state_dtype >= 0) p.state_dtype = static_cast<m2::DType>(s.state_dtype);
}

// ---------------------------------------------------------------- DLPack arrays

const char* dlpack_type_name(uint8_t code) {
  switch (code) {
    case 0: return "int";
    case 1: return "uint";
    case 2: return "float";
    case 3: return "opaque_handle";
    case 4: return "bfloat";
    case 5: return "complex";
    case 6: return "bool";
    default: return "dtype";
  }
}

m2::DType dtype_from_dlpack(int slot, nb::dlpack::dtype t) {
  if (t.lanes == 1) {
    if (t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float)) {
      if (t.bits == 32) return m2::DType::kFloat32;
      if (t.bits == 16) return m2::DType::kFloat16;
    } else if (t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat)) {
      if (t.bits == 16) return m2::DType::kBFloat16;
    } else if (t.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int)) {
      if (t.bits == 32) return m2::DType::kInt32;
      if (t.bits == 64) return m2::DType::kInt64;
    }
  }
  std::string name = std::string(dlpack_type_name(t.code)) + std::to_string(t.bits);
  if (t.lanes != 1) name += "x" + std::to_string(t.lanes);
  invalid(kSlotNames[slot], "unsupported dtype " + name +
                                " (the library takes float32, float16, bfloat16, int32 and int64 arrays; "
                                "see the argument's documented dtype)");
}

// Holds the imported arrays alive for the duration of one call.
struct DlpackArrays {
  nb::ndarray<nb::ro> inputs[kNumSlots];
  nb::ndarray<> outputs[kNumSlots];
  nb::ndarray<> workspace;
};

template <class Array>
void fill_view_from_ndarray(m2::TensorView& v, int slot, const Array& a, CallDevice& dev) {
  const char* name = kSlotNames[slot];
  const int ndim = static_cast<int>(a.ndim());
  if (ndim > m2::TensorView::kMaxRank) {
    invalid(name, "expected a rank between 0 and " + std::to_string(m2::TensorView::kMaxRank) + ", got " +
                      std::to_string(ndim));
  }
  m2::Device d;
  switch (a.device_type()) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value: d = m2::Device::kCPU; break;
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value: d = m2::Device::kCUDA; break;
    default:
      invalid(name, "expected a CPU or CUDA array, got DLPack device type " + std::to_string(a.device_type()));
  }
  dev.expect(slot, d);
  if (slot == kX && d == m2::Device::kCUDA) dev.index = a.device_id();
  v.dtype = dtype_from_dlpack(slot, a.dtype());
  v.rank = ndim;
  bool empty = false;
  for (int i = 0; i < ndim; ++i) {
    v.sizes[i] = static_cast<int64_t>(a.shape(static_cast<size_t>(i)));
    v.strides[i] = a.stride_ptr() ? a.stride(static_cast<size_t>(i)) : 0;
    empty = empty || v.sizes[i] == 0;
  }
  if (!a.stride_ptr()) {  // DLPack: null strides mean row-major
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      v.strides[i] = s;
      s *= v.sizes[i] > 1 ? v.sizes[i] : 1;
    }
  }
  void* data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.data = (data == nullptr && empty) ? static_cast<void*>(g_empty_storage) : data;
}

void import_dlpack(m2::ForwardParams& p, DlpackArrays& keep, const nb::handle* objs, CallDevice& dev) {
  for (int slot = 0; slot < kNumSlots; ++slot) {
    nb::handle h = objs[slot];
    if (h.is_none()) {
      if (is_required(slot)) {
        type_error(std::string(kSlotNames[slot]) + ": expected an array supporting DLPack, got None");
      }
      continue;
    }
    bool ok;
    if (is_output(slot)) {
      ok = nb::try_cast(h, keep.outputs[slot], false);
    } else {
      ok = nb::try_cast(h, keep.inputs[slot], false);
    }
    if (!ok) {
      PyErr_Clear();
      type_error(std::string(kSlotNames[slot]) + ": expected " +
                 (is_output(slot) ? "a writable (not read-only) array" : "an array") +
                 " supporting DLPack (__dlpack__) or the buffer protocol, got " + type_name(h.ptr()));
    }
    if (is_output(slot)) {
      fill_view_from_ndarray(view_of(p, slot), slot, keep.outputs[slot], dev);
    } else {
      fill_view_from_ndarray(view_of(p, slot), slot, keep.inputs[slot], dev);
    }
  }
  p.device = dev.device;
}

// ---------------------------------------------------------------- torch tensors

struct TorchRefs {
  PyTypeObject* tensor_type = nullptr;
  PyObject* dtypes[5] = {};  // indexed by mamba2_ssd::DType
  PyObject* workspace_alloc = nullptr;  // callable(nbytes, like) -> uint8 tensor
  PyObject* convert = nullptr;          // callable(t, kind) -> converted copy (kConvert*)
  PyObject* s_dtype = nullptr;
  PyObject* s_is_cuda = nullptr;
  PyObject* s_is_cpu = nullptr;
  PyObject* s_shape = nullptr;
  PyObject* s_stride = nullptr;
  PyObject* s_data_ptr = nullptr;
  PyObject* s_device = nullptr;
  PyObject* s_get_device = nullptr;
};
TorchRefs g_torch;

// Conversions forward_torch asks the Python side for (see mamba2_ssd/torch_ops.py: _convert).
constexpr int kConvertContiguous = 0;
constexpr int kConvertFloat32 = 1;
constexpr int kConvertInt32 = 2;

nb::object getattr_checked(PyObject* o, PyObject* name) {
  PyObject* r = PyObject_GetAttr(o, name);
  if (!r) throw nb::python_error();
  return nb::steal(r);
}

nb::object call_method0(PyObject* o, PyObject* name) {
  PyObject* r = PyObject_CallMethodNoArgs(o, name);
  if (!r) throw nb::python_error();
  return nb::steal(r);
}

int64_t as_int64(PyObject* o) {
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return static_cast<int64_t>(v);
}

// Reads rank, sizes and strides from torch.Size / tuple objects.
void fill_dims(m2::TensorView& v, int slot, PyObject* shape, PyObject* strides) {
  if (!PyTuple_Check(shape) || !PyTuple_Check(strides)) type_error("internal: shape/stride are not tuples");
  const Py_ssize_t n = PyTuple_GET_SIZE(shape);
  if (n > m2::TensorView::kMaxRank) {
    invalid(kSlotNames[slot], "expected a rank between 0 and " + std::to_string(m2::TensorView::kMaxRank) +
                                  ", got " + std::to_string(n));
  }
  v.rank = static_cast<int32_t>(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    v.sizes[i] = as_int64(PyTuple_GET_ITEM(shape, i));
    v.strides[i] = as_int64(PyTuple_GET_ITEM(strides, i));
  }
}

// cuda_index >= 0: a CUDA tensor must be on that device (forward_torch's check in place of
// validate()'s pointer queries, see check_memory_locations).
void fill_view_from_torch(m2::TensorView& v, int slot, PyObject* t, CallDevice& dev, int cuda_index) {
  const char* name = kSlotNames[slot];
  if (!PyObject_TypeCheck(t, g_torch.tensor_type)) {
    type_error(std::string(name) + ": expected a torch.Tensor, got " + type_name(t));
  }
  // dtype: identity against the registered torch dtype objects
  {
    nb::object dt = getattr_checked(t, g_torch.s_dtype);
    int code = -1;
    for (int i = 0; i < 5; ++i) {
      if (dt.ptr() == g_torch.dtypes[i]) {
        code = i;
        break;
      }
    }
    if (code < 0) {
      invalid(name, "unsupported dtype " + std::string(nb::str(dt).c_str()) +
                        " (the library takes float32, float16, bfloat16, int32 and int64 tensors; see the "
                        "argument's documented dtype)");
    }
    v.dtype = static_cast<m2::DType>(code);
  }
  // device
  {
    m2::Device d;
    if (getattr_checked(t, g_torch.s_is_cuda).ptr() == Py_True) {
      d = m2::Device::kCUDA;
      if (cuda_index >= 0) {
        const int64_t index = as_int64(call_method0(t, g_torch.s_get_device).ptr());
        if (index != cuda_index) {
          invalid(name, "expected a tensor on the device of x (cuda:" + std::to_string(cuda_index) + "), got cuda:" +
                            std::to_string(index));
        }
      }
    } else if (getattr_checked(t, g_torch.s_is_cpu).ptr() == Py_True) {
      d = m2::Device::kCPU;
    } else {
      nb::object devobj = getattr_checked(t, g_torch.s_device);
      invalid(name, std::string("expected a CPU or CUDA tensor, got device ") + nb::str(devobj).c_str());
    }
    dev.expect(slot, d);
  }
  {
    nb::object shape = getattr_checked(t, g_torch.s_shape);
    nb::object strides = call_method0(t, g_torch.s_stride);
    fill_dims(v, slot, shape.ptr(), strides.ptr());
  }
  {
    nb::object ptr = call_method0(t, g_torch.s_data_ptr);
    void* data = PyLong_AsVoidPtr(ptr.ptr());
    if (data == nullptr && PyErr_Occurred()) throw nb::python_error();
    v.data = data != nullptr ? data : static_cast<void*>(g_empty_storage);
  }
}

// ---------------------------------------------------------------- positional argument parsing

// The entry points take their arguments as one positional tuple (nb::args): nanobind's typed
// signatures reject None for object parameters without per-argument annotations, and the
// tuple keeps the per-call dispatch cost minimal. The Python wrappers pass every argument.
//   [0..4]   x, dt, A, B, C          [5] chunk_size           [6..11] D, z, dt_bias,
//   initial_states, seq_idx, cu_seqlens   [12] dt_softplus   [13] dt_min   [14] dt_max
//   [15] varlen   [16] state_dtype code  [17..21] out, final_states, varlen_states,
//   chunk_states, chunk_offsets   then entry-specific trailing arguments.
constexpr int kCommonArgs = 22;

struct ParsedArgs {
  nb::handle tensors[kNumSlots];
  Scalars scalars;
};

int64_t arg_int(PyObject* o, const char* name) {
  if (!PyLong_Check(o) || PyBool_Check(o)) type_error(std::string(name) + ": expected an int, got " + type_name(o));
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return static_cast<int64_t>(v);
}

bool arg_bool(PyObject* o, const char* name) {
  if (o == Py_True) return true;
  if (o == Py_False) return false;
  type_error(std::string(name) + ": expected a bool, got " + type_name(o));
}

double arg_float(PyObject* o, const char* name) {
  if (!PyFloat_Check(o) && !PyLong_Check(o)) type_error(std::string(name) + ": expected a float, got " + type_name(o));
  const double v = PyFloat_AsDouble(o);
  if (v == -1.0 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

uintptr_t arg_stream(PyObject* o) {
  if (!PyLong_Check(o) || PyBool_Check(o)) type_error("stream: expected an int handle, got " + type_name(o));
  void* v = PyLong_AsVoidPtr(o);
  if (v == nullptr && PyErr_Occurred()) throw nb::python_error();
  return reinterpret_cast<uintptr_t>(v);
}

ParsedArgs parse_common(const nb::args& args, std::size_t expected, const char* entry) {
  if (args.size() != expected) {
    type_error(std::string(entry) + ": expected " + std::to_string(expected) + " positional arguments, got " +
               std::to_string(args.size()));
  }
  PyObject* const* a = &PyTuple_GET_ITEM(args.ptr(), 0);
  ParsedArgs r;
  const int tensor_pos[kNumSlots] = {0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 17, 18, 19, 20, 21};
  for (int slot = 0; slot < kNumSlots; ++slot) r.tensors[slot] = nb::handle(a[tensor_pos[slot]]);
  r.scalars.chunk_size = arg_int(a[5], "chunk_size");
  r.scalars.dt_softplus = arg_bool(a[12], "dt_softplus");
  r.scalars.dt_min = arg_float(a[13], "dt_min");
  r.scalars.dt_max = arg_float(a[14], "dt_max");
  r.scalars.varlen = arg_bool(a[15], "varlen");
  r.scalars.state_dtype = static_cast<int>(arg_int(a[16], "state_dtype"));
  return r;
}

// True when `v` satisfies the GPU kernels' 16-byte rule (data pointer and the strides of the
// dimensions of size > 1 other than the innermost), see validate() rule 11.
bool gpu_aligned(const m2::TensorView& v) {
  constexpr std::uintptr_t kAlign = 16;
  if (reinterpret_cast<std::uintptr_t>(v.data) % kAlign != 0) return false;
  const int64_t esize = static_cast<int64_t>(m2::dtype_size(v.dtype));
  if (esize == 0) return true;  // validation reports the dtype
  const int64_t elems = static_cast<int64_t>(kAlign) / esize;
  for (int i = 0; i + 1 < v.rank; ++i) {
    if (v.sizes[i] > 1 && v.strides[i] % elems != 0) return false;
  }
  return true;
}

// ---------------------------------------------------------------- entry points

constexpr bool g_with_cuda =
#ifdef MAMBA2_SSD_WITH_CUDA
    true;
#else
    false;
#endif

// When set, forward_torch / forward_dlpack validate and size the workspace but launch nothing
// (to measure the host overhead of the bindings). Internal.
bool g_skip_forward = false;

// When set, the next GPU forward is preceded by mamba2_ssd::tune() on the same buffers (the
// result is kept for _last_tune_result). Internal: mamba2_ssd.tune() sets it around one call.
// Per thread: the call runs on the thread that set it, and another thread's calls (the GIL is
// released during the forward) must not pick it up.
thread_local bool g_tune_next = false;
thread_local m2::TuneOptions g_tune_options;
thread_local m2::TuneResult g_last_tune;

void run_forward(const m2::ForwardParams& p, void* ws, std::size_t ws_bytes, uintptr_t stream) {
  if (g_skip_forward) {
    (void)m2::validate(p);
    return;
  }
  nb::gil_scoped_release release;
  if (g_tune_next && p.device == m2::Device::kCUDA) {
    g_tune_next = false;
    g_last_tune = m2::tune(p, ws, ws_bytes, reinterpret_cast<CUstream_st*>(stream), g_tune_options);
  }
  m2::forward(p, ws, ws_bytes, reinterpret_cast<CUstream_st*>(stream));
}

nb::dict tune_result_dict(const m2::TuneResult& r) {
  auto cfg = [](const m2::KernelConfig& c) {
    nb::dict d;
    d["pass_state_dstate_tile"] = c.pass_state_dstate_tile;
    d["pass_state_stages"] = c.pass_state_stages;
    d["pass_state_segments"] = c.pass_state_segments;
    d["compute_out_heads_per_cta"] = c.compute_out_heads_per_cta;
    d["fused_walk"] = c.fused_walk;
    d["fused_walk_heads_per_cta"] = c.fused_walk_heads_per_cta;
    return d;
  };
  nb::dict d;
  d["key"] = r.key;
  d["best"] = cfg(r.best);
  d["heuristic"] = cfg(r.heuristic);
  d["best_ms"] = r.best_ms;
  d["heuristic_ms"] = r.heuristic_ms;
  d["complete"] = r.complete;
  d["seconds"] = r.seconds;
  nb::list m;
  for (const auto& x : r.measured) m.append(nb::make_tuple(x.kernel, x.setting, x.ms));
  d["measured"] = m;
  return d;
}

// The workspace of one forward_torch call: a uint8 tensor from torch (mamba2_ssd/torch_ops.py:
// _alloc_workspace, like `like`), held in `owner` until the launches are enqueued.
struct TorchWorkspace {
  PyObject* like;
  nb::object owner;
};

// m2::WorkspaceAllocator over TorchWorkspace; takes the GIL (forward_torch releases it).
void* torch_workspace(std::size_t bytes, void* context) {
  auto& ws = *static_cast<TorchWorkspace*>(context);
  nb::gil_scoped_acquire gil;
  nb::object nbytes = nb::steal(PyLong_FromSize_t(bytes));
  PyObject* call_args[2] = {nbytes.ptr(), ws.like};
  PyObject* t = PyObject_Vectorcall(g_torch.workspace_alloc, call_args, 2, nullptr);
  if (!t) throw nb::python_error();
  ws.owner = nb::steal(t);
  nb::object ptr = call_method0(t, g_torch.s_data_ptr);
  void* data = PyLong_AsVoidPtr(ptr.ptr());
  if (data == nullptr && PyErr_Occurred()) throw nb::python_error();
  return data;
}

// forward_torch(<22 common>, stream, device_index)
void forward_torch(nb::args args) {
  if (g_torch.tensor_type == nullptr) type_error("mamba2_ssd._C: torch support was not initialised");
  const ParsedArgs pa = parse_common(args, kCommonArgs + 2, "forward_torch");
  const nb::handle* objs = pa.tensors;
  PyObject* const* a = &PyTuple_GET_ITEM(args.ptr(), 0);
  const uintptr_t stream = arg_stream(a[kCommonArgs]);
  const int device_index = static_cast<int>(arg_int(a[kCommonArgs + 1], "device_index"));
  nb::handle x = objs[kX];
  m2::ForwardParams p;
  apply_scalars(p, pa.scalars);
  CallDevice dev;
  for (int slot = 0; slot < kNumSlots; ++slot) {
    if (objs[slot].is_none()) {
      if (is_required(slot)) type_error(std::string(kSlotNames[slot]) + ": expected a torch.Tensor, got None");
      continue;
    }
    fill_view_from_torch(view_of(p, slot), slot, objs[slot].ptr(), dev, slot == kX ? -1 : device_index);
  }
  p.device = dev.device;
  // Every CUDA tensor is on x's device (checked above): validate() need not ask the runtime.
  p.check_memory_locations = !(p.device == m2::Device::kCUDA && device_index >= 0);
  // What mamba_ssm's function accepts but the kernels do not take directly is converted here
  // (through torch, on the current stream), so that the common case costs only the checks:
  //  - A, D, dt_bias in a 16-bit float dtype (a bf16 model's parameters): upcast to float32;
  //  - seq_idx in int64: narrowed to int32;
  //  - x, B, C, z, initial_states, D (h, p) with a non-contiguous innermost dimension, and on
  //    the GPU also those not 16-byte aligned (data pointer or outer strides; mamba_ssm's
  //    Triton kernels take any element-aligned view): a contiguous copy.
  // Outputs are never replaced: they fail validation instead.
  nb::object converted[kNumSlots];
  auto convert = [&](int slot, int kind) {
    nb::object k = nb::steal(PyLong_FromLong(kind));
    PyObject* current = converted[slot].is_valid() ? converted[slot].ptr() : objs[slot].ptr();
    PyObject* call_args[2] = {current, k.ptr()};
    PyObject* c = PyObject_Vectorcall(g_torch.convert, call_args, 2, nullptr);
    if (!c) throw nb::python_error();
    converted[slot] = nb::steal(c);
    fill_view_from_torch(view_of(p, slot), slot, c, dev, device_index);
  };
  for (int slot : {kA, kD, kDtBias}) {
    const m2::TensorView& v = view_of(p, slot);
    if (v.present() && (v.dtype == m2::DType::kBFloat16 || v.dtype == m2::DType::kFloat16)) {
      convert(slot, kConvertFloat32);
    }
  }
  if (p.seq_idx.present() && p.seq_idx.dtype == m2::DType::kInt64) convert(kSeqIdx, kConvertInt32);
  const bool on_gpu = p.device == m2::Device::kCUDA;
  for (int slot : {kX, kB, kC, kZ, kInitialStates, kD}) {
    const m2::TensorView& v = view_of(p, slot);
    if (!v.present() || v.rank < 1 || (slot == kD && v.rank != 2)) continue;
    if (!v.last_dim_contiguous() || (on_gpu && !gpu_aligned(v))) convert(slot, kConvertContiguous);
  }
  if (!on_gpu) {
    run_forward(p, nullptr, 0, 0);
    return;
  }
  DeviceGuard guard(device_index);
  // The workspace comes from torch's caching allocator on the current stream (fine inside
  // CUDA graph capture); it is released after the launches are enqueued on that stream.
  TorchWorkspace ws{x.ptr(), nb::object()};
  if (g_tune_next || g_skip_forward) {
    // (a call that tunes first times every setting: the workspace they all fit in)
    const std::size_t need = g_tune_next ? m2::tune_workspace_size(p) : m2::workspace_size(p);
    void* ws_ptr = need > 0 ? torch_workspace(need, &ws) : nullptr;
    run_forward(p, ws_ptr, need, stream);
    return;
  }
  nb::gil_scoped_release release;
  m2::forward_with_allocator(p, torch_workspace, &ws, reinterpret_cast<CUstream_st*>(stream));
}

struct DlpackCall {
  m2::ForwardParams p;
  DlpackArrays keep;
  CallDevice dev;
};

// workspace_size_dlpack(<22 common>) -> bytes
std::size_t workspace_size_dlpack(nb::args args) {
  const ParsedArgs pa = parse_common(args, kCommonArgs, "workspace_size_dlpack");
  DlpackCall c;
  apply_scalars(c.p, pa.scalars);
  import_dlpack(c.p, c.keep, pa.tensors, c.dev);
  DeviceGuard guard(c.dev.index);
  return m2::workspace_size(c.p);
}

// forward_dlpack(<22 common>, workspace, stream)
void forward_dlpack(nb::args args) {
  const ParsedArgs pa = parse_common(args, kCommonArgs + 2, "forward_dlpack");
  PyObject* const* a = &PyTuple_GET_ITEM(args.ptr(), 0);
  nb::handle workspace(a[kCommonArgs]);
  const uintptr_t stream = arg_stream(a[kCommonArgs + 1]);
  DlpackCall c;
  apply_scalars(c.p, pa.scalars);
  import_dlpack(c.p, c.keep, pa.tensors, c.dev);
  if (c.p.device == m2::Device::kCPU) {
    run_forward(c.p, nullptr, 0, 0);
    return;
  }
  DeviceGuard guard(c.dev.index);
  const std::size_t need = g_tune_next ? m2::tune_workspace_size(c.p) : m2::workspace_size(c.p);
  void* ws_ptr = nullptr;
  if (!workspace.is_none()) {
    if (!nb::try_cast(workspace, c.keep.workspace, false)) {
      PyErr_Clear();
      type_error("workspace: expected a writable array supporting DLPack, got " + type_name(workspace.ptr()));
    }
    const auto& w = c.keep.workspace;
    if (w.device_type() != nb::device::cuda::value && w.device_type() != nb::device::cuda_managed::value) {
      invalid("workspace", "expected CUDA memory, got DLPack device type " + std::to_string(w.device_type()));
    }
    run_forward(c.p, const_cast<void*>(static_cast<const void*>(w.data())), w.nbytes(), stream);
    return;
  }
  if (need == 0) {
    run_forward(c.p, nullptr, 0, stream);
    return;
  }
#ifdef MAMBA2_SSD_WITH_CUDA
  // No workspace given: a stream-ordered allocation on `stream`, freed on it after the launches
  // (also valid inside CUDA graph capture).
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  cudaError_t e = cudaMallocAsync(&ws_ptr, need, s);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw m2::Error(m2::Error::Kind::kCuda, "workspace",
                    std::string("workspace: cudaMallocAsync of ") + std::to_string(need) +
                        " bytes failed: " + cudaGetErrorName(e) + " (pass workspace= to avoid the allocation)");
  }
  struct Free {
    void* ptr;
    cudaStream_t s;
    ~Free() { (void)cudaFreeAsync(ptr, s); }
  } free_on_exit{ws_ptr, s};
  run_forward(c.p, ws_ptr, need, stream);
#else
  run_forward(c.p, nullptr, 0, stream);  // reports that this build has no CUDA kernels
#endif
}

void register_torch(nb::handle tensor_type, nb::tuple dtypes, nb::handle workspace_alloc, nb::handle convert) {
  if (!PyType_Check(tensor_type.ptr())) type_error("_register_torch: expected torch.Tensor");
  if (nb::len(dtypes) != 5) type_error("_register_torch: expected 5 dtypes");
  g_torch.tensor_type = reinterpret_cast<PyTypeObject*>(tensor_type.inc_ref().ptr());
  for (int i = 0; i < 5; ++i) g_torch.dtypes[i] = nb::handle(dtypes[i]).inc_ref().ptr();
  g_torch.workspace_alloc = workspace_alloc.inc_ref().ptr();
  g_torch.convert = convert.inc_ref().ptr();
  g_torch.s_dtype = PyUnicode_InternFromString("dtype");
  g_torch.s_is_cuda = PyUnicode_InternFromString("is_cuda");
  g_torch.s_is_cpu = PyUnicode_InternFromString("is_cpu");
  g_torch.s_shape = PyUnicode_InternFromString("shape");
  g_torch.s_stride = PyUnicode_InternFromString("stride");
  g_torch.s_data_ptr = PyUnicode_InternFromString("data_ptr");
  g_torch.s_device = PyUnicode_InternFromString("device");
  g_torch.s_get_device = PyUnicode_InternFromString("get_device");
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "mamba2_ssd C++ extension (nanobind). Use the functions of the mamba2_ssd package.";

  g_invalid_argument_error =
      PyErr_NewExceptionWithDoc("mamba2_ssd.InvalidArgumentError",
                                "A bad argument; the message names it, the expected and the actual value. "
                                "`.argument` holds the argument's name.",
                                PyExc_ValueError, nullptr);
  g_unsupported_error =
      PyErr_NewExceptionWithDoc("mamba2_ssd.UnsupportedError",
                                "A valid input this build or device cannot run (e.g. a GPU shape the kernels do "
                                "not support, or a CPU-only build asked for CUDA). `.argument` names the argument.",
                                PyExc_NotImplementedError, nullptr);
  g_cuda_error = PyErr_NewExceptionWithDoc("mamba2_ssd.CudaError",
                                           "A CUDA runtime error, with the call that failed.", PyExc_RuntimeError,
                                           nullptr);
  m.attr("InvalidArgumentError") = nb::borrow(g_invalid_argument_error);
  m.attr("UnsupportedError") = nb::borrow(g_unsupported_error);
  m.attr("CudaError") = nb::borrow(g_cuda_error);
  nb::register_exception_translator(translate_error);

  m.attr("WITH_CUDA") = g_with_cuda;
  m.attr("DTYPE_FLOAT32") = static_cast<int>(m2::DType::kFloat32);
  m.attr("DTYPE_FLOAT16") = static_cast<int>(m2::DType::kFloat16);
  m.attr("DTYPE_BFLOAT16") = static_cast<int>(m2::DType::kBFloat16);

  m.def("version", []() { return m2::version(); });
  m.def("cuda_available", []() { return m2::cuda_available(); },
        "True when this build has the CUDA kernels and a compute capability 9.0 device is present.");
  m.def("max_varlen_chunks", &m2::max_varlen_chunks, nb::arg("total_tokens"), nb::arg("nseq"),
        nb::arg("chunk_size"),
        "Upper bound on the chunks nseq sequences of total_tokens tokens occupy (the capacity of "
        "chunk_states in the varlen layout).");

  m.def("forward_torch", &forward_torch,
        "forward_torch(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, "
        "dt_softplus, dt_min, dt_max, varlen, state_dtype, out, final_states, varlen_states, chunk_states, "
        "chunk_offsets, stream, device_index): internal entry of the torch custom operator.");
  m.def("forward_dlpack", &forward_dlpack,
        "forward_dlpack(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens, "
        "dt_softplus, dt_min, dt_max, varlen, state_dtype, out, final_states, varlen_states, chunk_states, "
        "chunk_offsets, workspace, stream): positional form of mamba2_ssd.forward_dlpack.");
  m.def("workspace_size_dlpack", &workspace_size_dlpack,
        "workspace_size_dlpack(<the arguments of forward_dlpack without workspace and stream>) -> bytes");
  m.def("_register_torch", &register_torch);
  m.def(
      "_tune_next_call",
      [](double budget_seconds, int repeats, bool store) {
        g_tune_next = true;
        g_tune_options = m2::TuneOptions{};
        g_tune_options.budget_seconds = budget_seconds;
        g_tune_options.repeats = repeats;
        g_tune_options.store = store;
        g_last_tune = m2::TuneResult{};
      },
      nb::arg("budget_seconds"), nb::arg("repeats"), nb::arg("store"));
  m.def("_cancel_tune", []() { g_tune_next = false; });
  m.def("_last_tune_result", []() { return tune_result_dict(g_last_tune); });
  m.def("tuning_cache_path", []() { return m2::tuning_cache_path(); },
        "Path of the tuning cache file ('' when kept in memory only).");
  m.def("reset_tuning_cache", []() { m2::reset_tuning_cache(); },
        "Forget the in-memory tuning entries (the file is read again on next use).");
  m.def("_set_skip_forward", [](bool v) { g_skip_forward = v; },
        "Internal (benchmarks): validate but launch nothing.");
}
