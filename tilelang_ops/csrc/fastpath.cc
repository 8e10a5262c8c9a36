// The compiled eager path of the registered ops (tilelang_ops/_fast.py builds and loads it).
//
// A recipe is what one plain eager call of an op did, recorded on the Python path: the static key of its
// arguments (per tensor: dtype, device, shape, strides, address mod 16, which earlier argument starts at
// the same address; per scalar: exact type and value), the outputs it allocated, each launch of a
// compiled TVM-FFI function with its parameters (an argument, an allocation or a kept tensor, possibly
// viewed at a fixed byte offset with its own shape, strides and dtype; or a constant scalar), the
// arguments whose version counters it bumps and what it returns. `call(op, args)` finds the recipe whose
// key the call matches (newest first) and replays it: allocations through torch's DLPack allocator
// (contiguous, as torch.empty makes them), launches on torch's current stream, version bumps. It returns
// NotImplemented where no recipe matches, where a dispatch or torch-function mode is active or where a
// tensor is not a plain torch.Tensor, and the Python path serves the call.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr int kMaxRecipes = 8;  // per op: an engine alternates a few static keys per op
constexpr int kMaxArgs = 32;     // arguments of a call
constexpr int kMaxParams = 64;   // parameters of a launch
constexpr int kMaxAllocs = 16;   // allocations of a call

const DLPackExchangeAPI* g_api = nullptr;
PyTypeObject* g_tensor_type = nullptr;
PyObject* g_bump = nullptr;          // bump(list of tensors): their version counters, inference tensors skipped
PyObject* g_increment = nullptr;     // torch._C._increment_version
PyObject* g_dispatch_len = nullptr;  // torch._C._len_torch_dispatch_stack
PyObject* g_function_mode = nullptr;  // torch._C._is_torch_function_mode_enabled
PyObject* g_get_device = nullptr;    // torch._C._cuda_getDevice
PyObject* g_set_device = nullptr;    // torch._C._cuda_setDevice

enum ArgKind { kArgTensor, kArgNone, kArgInt, kArgFloat, kArgOther };
enum Source { kSrcArg, kSrcAlloc, kSrcKept };
enum ParamKind { kParamTensor, kParamInt, kParamFloat, kParamBool, kParamNone };

bool SameDType(DLDataType a, DLDataType b) { return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes; }

char* Start(const DLTensor& t) { return static_cast<char*>(t.data) + t.byte_offset; }

struct ArgSpec {
  int kind = kArgNone;
  // tensors
  DLDataType dtype{};
  DLDevice device{};
  std::vector<int64_t> shape, strides;
  int align = 0;    // start address mod 16
  int same_as = -1;  // the first earlier tensor argument that starts at the same address
  // scalars: exact type and value (int by value, float by bits, anything else by ==)
  PyTypeObject* type = nullptr;
  long long i = 0;
  double f = 0;
  PyObject* obj = nullptr;
};

struct Param {
  int kind = kParamNone;
  int source = kSrcArg, index = 0;
  bool view = false;  // its own offset, shape, strides and dtype instead of the source's
  int64_t offset = 0;
  DLDataType dtype{};
  std::vector<int64_t> shape, strides;
  PyObject* kept = nullptr;  // a tensor that outlives every call (a placeholder)
  DLTensor kept_dl{};
  long long i = 0;
  double f = 0;
};

struct Launch {
  PyObject* fn = nullptr;
  TVMFFIObjectHandle handle = nullptr;
  std::vector<Param> params;
};

struct Alloc {  // a contiguous tensor made by torch's DLPack allocator (torch.empty's, without its parser)
  DLDataType dtype{};
  DLDevice device{};
  std::vector<int64_t> shape;
};

struct Recipe {
  std::vector<ArgSpec> args;
  std::vector<Alloc> allocs;
  std::vector<Launch> launches;
  std::vector<int> bumps;  // argument positions
  int result_kind = 0;     // 0 None, 1 one tensor, 2 a tuple
  std::vector<int> result;  // >= 0: an argument; < 0: allocation -(j + 1)
  int device_type = kDLCPU, device_id = 0;
  bool python = false;  // a key the Python path serves: call returns Ellipsis

  ~Recipe() {
    for (auto& a : args) Py_XDECREF(a.obj);
    for (auto& l : launches) {
      Py_XDECREF(l.fn);
      for (auto& p : l.params) Py_XDECREF(p.kept);
    }
  }
};

struct Op {
  // newest first; shared, so that a replay keeps its recipe while another thread (between the Python calls
  // a replay makes) adds or clears recipes
  std::vector<std::shared_ptr<Recipe>> recipes;
  bool keep_device = false;
  long long replays = 0;
};

void OpDestructor(PyObject* capsule) { delete static_cast<Op*>(PyCapsule_GetPointer(capsule, "tilelang_ops.op")); }

Op* GetOp(PyObject* capsule) { return static_cast<Op*>(PyCapsule_GetPointer(capsule, "tilelang_ops.op")); }

bool IsTensor(PyObject* o) { return Py_TYPE(o) == g_tensor_type; }

// The DLTensor of a torch tensor (its arrays live as long as the tensor's sizes); -1 with a Python error
// where torch cannot export it or gives no strides (which recipes compare).
int Export(PyObject* tensor, DLTensor* out) {
  if (g_api->dltensor_from_py_object_no_sync(tensor, out) != 0) return -1;
  if (out->ndim > 0 && out->strides == nullptr) {
    PyErr_SetString(PyExc_BufferError, "a tensor exported without strides");
    return -1;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------------
// recipes
// ---------------------------------------------------------------------------------------------------

int FillArgSpec(PyObject* a, const DLTensor* dl, const std::vector<DLTensor>& dls,
                const std::vector<PyObject*>& objs, int pos, ArgSpec* s) {
  if (a == Py_None) {
    s->kind = kArgNone;
    return 0;
  }
  if (dl != nullptr) {
    s->kind = kArgTensor;
    s->dtype = dl->dtype;
    s->device = dl->device;
    s->shape.assign(dl->shape, dl->shape + dl->ndim);
    s->strides.assign(dl->strides, dl->strides + dl->ndim);
    s->align = static_cast<int>(reinterpret_cast<uintptr_t>(Start(*dl)) & 15);
    for (int j = 0; j < pos; ++j) {
      if (objs[j] != nullptr && Start(dls[j]) == Start(*dl)) {
        s->same_as = j;
        break;
      }
    }
    return 0;
  }
  s->type = Py_TYPE(a);
  if (PyLong_CheckExact(a)) {
    s->kind = kArgInt;
    int overflow = 0;
    s->i = PyLong_AsLongLongAndOverflow(a, &overflow);
    if (overflow) {
      s->kind = kArgOther;
    } else {
      return 0;
    }
  } else if (PyFloat_CheckExact(a)) {
    s->kind = kArgFloat;
    s->f = PyFloat_AS_DOUBLE(a);
    return 0;
  }
  s->kind = kArgOther;  // bool, str, torch.dtype, ...: compared by type and ==
  Py_INCREF(a);
  s->obj = a;
  return 0;
}

int ReadShape(PyObject* seq, std::vector<int64_t>* out) {
  PyObject* fast = PySequence_Fast(seq, "shape must be a sequence");
  if (fast == nullptr) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  for (Py_ssize_t k = 0; k < n; ++k) {
    long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, k));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return -1;
    }
    out->push_back(v);
  }
  Py_DECREF(fast);
  return 0;
}

// A tensor parameter (source, index) given the tensor the recorded launch got: the source's own export
// where it is the same view, else a view at a fixed offset from the source's start.
int FillTensorParam(PyObject* tensor, const DLTensor& src, Param* p) {
  DLTensor dl;
  if (Export(tensor, &dl) != 0) return -1;
  bool same = Start(dl) == Start(src) && dl.ndim == src.ndim && SameDType(dl.dtype, src.dtype) &&
              std::memcmp(dl.shape, src.shape, sizeof(int64_t) * dl.ndim) == 0 &&
              std::memcmp(dl.strides, src.strides, sizeof(int64_t) * dl.ndim) == 0;
  p->kind = kParamTensor;
  p->view = !same;
  if (!same) {
    p->offset = Start(dl) - Start(src);
    p->dtype = dl.dtype;
    p->shape.assign(dl.shape, dl.shape + dl.ndim);
    p->strides.assign(dl.strides, dl.strides + dl.ndim);
  }
  return 0;
}

// add(op, args, allocs, launches, bumps, result): a recipe from one recorded call; with allocs None, a
// key that the Python path serves (call returns Ellipsis for it).
//   args      the call's arguments (tuple)
//   allocs    (tensor, ...): the call's allocations; a replay makes contiguous tensors of their dtype,
//             device and shape
//   launches  ((tvm_ffi.Function, (param, ...)), ...); param: ("arg", i, tensor) | ("alloc", j, tensor) |
//             ("kept", tensor) | ("int", v) | ("float", v) | ("bool", v) | ("none",)
//   bumps     argument positions whose version counters the call bumps
//   result    None | ("one", ref) | ("tuple", (ref, ...)); ref: i >= 0 an argument, -(j + 1) allocation j
PyObject* Add(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 6) {
    PyErr_SetString(PyExc_TypeError, "add(op, args, allocs, launches, bumps, result)");
    return nullptr;
  }
  Op* op = GetOp(argv[0]);
  if (op == nullptr) return nullptr;
  PyObject *args = argv[1], *allocs = argv[2], *launches = argv[3], *bumps = argv[4], *result = argv[5];
  if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) > kMaxArgs) {
    PyErr_SetString(PyExc_ValueError, "args must be a tuple of at most 32 arguments");
    return nullptr;
  }
  auto r = std::make_shared<Recipe>();
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  std::vector<DLTensor> dls(n);
  std::vector<PyObject*> objs(n, nullptr);
  bool have_device = false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* a = PyTuple_GET_ITEM(args, i);
    if (IsTensor(a)) {
      if (Export(a, &dls[i]) != 0) goto fail;
      objs[i] = a;
      if (!have_device) {
        r->device_type = dls[i].device.device_type;
        r->device_id = dls[i].device.device_id;
        have_device = true;
      }
    }
    r->args.emplace_back();
    if (FillArgSpec(a, objs[i] ? &dls[i] : nullptr, dls, objs, static_cast<int>(i), &r->args.back()) != 0)
      goto fail;
  }
  if (allocs == Py_None) {
    r->python = true;
    goto done;
  }
  {
    std::vector<DLTensor> alloc_dls;
    PyObject* fast = PySequence_Fast(allocs, "allocs");
    if (fast == nullptr) goto fail;
    if (PySequence_Fast_GET_SIZE(fast) > kMaxAllocs) {
      PyErr_SetString(PyExc_ValueError, "a recipe makes at most 16 allocations");
      Py_DECREF(fast);
      goto fail;
    }
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(fast); ++j) {
      PyObject* tensor = PySequence_Fast_GET_ITEM(fast, j);
      if (!IsTensor(tensor)) {
        PyErr_SetString(PyExc_TypeError, "an allocation must be a torch.Tensor");
        Py_DECREF(fast);
        goto fail;
      }
      alloc_dls.emplace_back();
      if (Export(tensor, &alloc_dls.back()) != 0) {
        Py_DECREF(fast);
        goto fail;
      }
      Alloc a;
      const DLTensor& t = alloc_dls.back();
      a.dtype = t.dtype;
      a.device = t.device;
      a.shape.assign(t.shape, t.shape + t.ndim);
      r->allocs.push_back(a);
    }
    Py_DECREF(fast);
    fast = PySequence_Fast(launches, "launches");
    if (fast == nullptr) goto fail;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(fast); ++k) {
      PyObject *fn, *params;
      if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, k), "OO", &fn, &params)) {
        Py_DECREF(fast);
        goto fail;
      }
      r->launches.emplace_back();
      Launch& l = r->launches.back();
      Py_INCREF(fn);
      l.fn = fn;
      PyObject* h = PyObject_CallMethod(fn, "__chandle__", nullptr);
      if (h == nullptr) {
        Py_DECREF(fast);
        goto fail;
      }
      l.handle = PyLong_AsVoidPtr(h);
      Py_DECREF(h);
      PyObject* pf = PySequence_Fast(params, "params");
      if (pf == nullptr || PySequence_Fast_GET_SIZE(pf) > kMaxParams) {
        if (pf != nullptr) {
          PyErr_SetString(PyExc_ValueError, "a launch takes at most 64 parameters");
          Py_DECREF(pf);
        }
        Py_DECREF(fast);
        goto fail;
      }
      for (Py_ssize_t q = 0; q < PySequence_Fast_GET_SIZE(pf); ++q) {
        PyObject* spec = PySequence_Fast_GET_ITEM(pf, q);
        l.params.emplace_back();
        Param& p = l.params.back();
        const char* kind = PyUnicode_AsUTF8(PyTuple_GetItem(spec, 0));
        int rc = -1;
        if (kind == nullptr) {
        } else if (!std::strcmp(kind, "arg") || !std::strcmp(kind, "alloc")) {
          long idx = PyLong_AsLong(PyTuple_GetItem(spec, 1));
          bool is_arg = kind[1] == 'r';
          Py_ssize_t limit = is_arg ? n : static_cast<Py_ssize_t>(alloc_dls.size());
          if (idx < 0 || idx >= limit || (is_arg && objs[idx] == nullptr)) {
            PyErr_SetString(PyExc_ValueError, "a tensor parameter's source is out of range");
          } else {
            p.source = is_arg ? kSrcArg : kSrcAlloc;
            p.index = static_cast<int>(idx);
            rc = FillTensorParam(PyTuple_GetItem(spec, 2), is_arg ? dls[idx] : alloc_dls[idx], &p);
          }
        } else if (!std::strcmp(kind, "kept")) {
          PyObject* t = PyTuple_GetItem(spec, 1);
          p.kind = kParamTensor;
          p.source = kSrcKept;
          Py_INCREF(t);
          p.kept = t;
          rc = Export(t, &p.kept_dl);
          if (rc == 0) {  // its geometry is copied: the export's arrays live only as long as the tensor's
            p.shape.assign(p.kept_dl.shape, p.kept_dl.shape + p.kept_dl.ndim);  // sizes (it is kept alive,
            p.strides.assign(p.kept_dl.strides, p.kept_dl.strides + p.kept_dl.ndim);  // but not its view)
            p.kept_dl.shape = nullptr;
            p.kept_dl.strides = nullptr;
          }
        } else if (!std::strcmp(kind, "int") || !std::strcmp(kind, "bool")) {
          p.kind = kind[0] == 'i' ? kParamInt : kParamBool;
          p.i = PyLong_AsLongLong(PyTuple_GetItem(spec, 1));
          rc = (p.i == -1 && PyErr_Occurred()) ? -1 : 0;
        } else if (!std::strcmp(kind, "float")) {
          p.kind = kParamFloat;
          p.f = PyFloat_AsDouble(PyTuple_GetItem(spec, 1));
          rc = (p.f == -1.0 && PyErr_Occurred()) ? -1 : 0;
        } else if (!std::strcmp(kind, "none")) {
          p.kind = kParamNone;
          rc = 0;
        } else {
          PyErr_Format(PyExc_ValueError, "unknown parameter kind %s", kind);
        }
        if (rc != 0) {
          Py_DECREF(pf);
          Py_DECREF(fast);
          goto fail;
        }
      }
      Py_DECREF(pf);
    }
    Py_DECREF(fast);
  }
  {
    std::vector<int64_t> b;
    if (ReadShape(bumps, &b) != 0) goto fail;
    for (auto v : b) {
      if (v < 0 || v >= n) {
        PyErr_SetString(PyExc_ValueError, "a bumped argument is out of range");
        goto fail;
      }
      r->bumps.push_back(static_cast<int>(v));
    }
    if (result == Py_None) {
      r->result_kind = 0;
    } else {
      const char* kind = PyUnicode_AsUTF8(PyTuple_GetItem(result, 0));
      if (kind == nullptr) goto fail;
      r->result_kind = kind[0] == 'o' ? 1 : 2;
      std::vector<int64_t> refs;
      PyObject* what = PyTuple_GetItem(result, 1);
      if (r->result_kind == 1) {
        refs.push_back(PyLong_AsLongLong(what));
        if (PyErr_Occurred()) goto fail;
      } else if (ReadShape(what, &refs) != 0) {
        goto fail;
      }
      for (auto v : refs) {
        if (v >= n || v < -static_cast<int64_t>(r->allocs.size()) || (v >= 0 && objs[v] == nullptr)) {
          PyErr_SetString(PyExc_ValueError, "a result is neither a tensor argument nor an allocation");
          goto fail;
        }
        r->result.push_back(static_cast<int>(v));
      }
    }
  }
done:
  if (static_cast<int>(op->recipes.size()) >= kMaxRecipes) op->recipes.pop_back();
  op->recipes.insert(op->recipes.begin(), r);
  Py_RETURN_NONE;
fail:
  return nullptr;
}

// ---------------------------------------------------------------------------------------------------
// calls
// ---------------------------------------------------------------------------------------------------

bool Matches(const Recipe& r, PyObject* args, const DLTensor* dls, const char* is_tensor) {
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  if (static_cast<Py_ssize_t>(r.args.size()) != n) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    const ArgSpec& s = r.args[i];
    PyObject* a = PyTuple_GET_ITEM(args, i);
    switch (s.kind) {
      case kArgNone:
        if (a != Py_None) return false;
        break;
      case kArgTensor: {
        if (!is_tensor[i]) return false;
        const DLTensor& d = dls[i];
        if (!SameDType(d.dtype, s.dtype) || d.device.device_type != s.device.device_type ||
            d.device.device_id != s.device.device_id || d.ndim != static_cast<int>(s.shape.size()))
          return false;
        if (std::memcmp(d.shape, s.shape.data(), sizeof(int64_t) * d.ndim) != 0 ||
            std::memcmp(d.strides, s.strides.data(), sizeof(int64_t) * d.ndim) != 0)
          return false;
        if ((reinterpret_cast<uintptr_t>(Start(d)) & 15) != static_cast<uintptr_t>(s.align)) return false;
        int same_as = -1;
        for (Py_ssize_t j = 0; j < i; ++j) {
          if (is_tensor[j] && Start(dls[j]) == Start(d)) {
            same_as = static_cast<int>(j);
            break;
          }
        }
        if (same_as != s.same_as) return false;
        break;
      }
      case kArgInt: {
        if (Py_TYPE(a) != s.type) return false;
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
        if (overflow || v != s.i) return false;
        break;
      }
      case kArgFloat: {
        if (Py_TYPE(a) != s.type) return false;
        double v = PyFloat_AS_DOUBLE(a);
        if (std::memcmp(&v, &s.f, sizeof(double)) != 0) return false;
        break;
      }
      default: {
        if (Py_TYPE(a) != s.type) return false;
        if (a != s.obj) {
          int eq = PyObject_RichCompareBool(a, s.obj, Py_EQ);
          if (eq != 1) {
            PyErr_Clear();
            return false;
          }
        }
      }
    }
  }
  return true;
}

int CallPython(PyObject* fn, PyObject* arg, long long* out) {
  PyObject* res = arg ? PyObject_CallOneArg(fn, arg) : PyObject_CallNoArgs(fn);
  if (res == nullptr) return -1;
  *out = PyLong_Check(res) ? PyLong_AsLongLong(res) : PyObject_IsTrue(res);
  Py_DECREF(res);
  return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

int RaiseFFIError(const char* what) {
  TVMFFIObjectHandle err = nullptr;
  TVMFFIErrorMoveFromRaised(&err);
  if (err == nullptr) {
    PyErr_Format(PyExc_RuntimeError, "tilelang_ops: %s failed", what);
    return -1;
  }
  TVMFFIErrorCell* cell = TVMFFIErrorGetCellPtr(err);
  std::string kind(cell->kind.data, cell->kind.size), msg(cell->message.data, cell->message.size);
  PyErr_Format(PyExc_RuntimeError, "%s: %s", kind.c_str(), msg.c_str());
  TVMFFIObjectDecRef(err);
  return -1;
}

// Launches every launch of r on the current stream of its device.
int RunLaunches(const Recipe& r, const DLTensor* arg_dls, const DLTensor* alloc_dls) {
  void* stream = nullptr;
  TVMFFIStreamHandle prev = nullptr;
  bool set_stream = r.device_type != kDLCPU;
  if (set_stream) {
    if (g_api->current_work_stream(static_cast<DLDeviceType>(r.device_type), r.device_id, &stream) != 0) return -1;
    if (TVMFFIEnvSetStream(r.device_type, r.device_id, stream, &prev) != 0) return RaiseFFIError("setting the stream");
  }
  int rc = 0;
  for (const Launch& l : r.launches) {
    size_t np = l.params.size();
    TVMFFIAny any[kMaxParams];
    DLTensor views[kMaxParams];
    for (size_t q = 0; q < np; ++q) {
      const Param& p = l.params[q];
      TVMFFIAny& v = any[q];
      v.type_index = kTVMFFINone;
      v.zero_padding = 0;
      v.v_int64 = 0;
      switch (p.kind) {
        case kParamTensor: {
          const DLTensor* src = p.source == kSrcArg ? &arg_dls[p.index]
                                : p.source == kSrcAlloc ? &alloc_dls[p.index] : &p.kept_dl;
          if (p.source == kSrcKept) {  // the kept tensor's geometry from the recipe's own arrays
            DLTensor& t = views[q];
            t = p.kept_dl;
            t.shape = const_cast<int64_t*>(p.shape.data());
            t.strides = const_cast<int64_t*>(p.strides.data());
            src = &t;
          } else if (p.view) {
            DLTensor& t = views[q];
            t = *src;
            t.data = Start(*src) + p.offset;
            t.byte_offset = 0;
            t.dtype = p.dtype;
            t.ndim = static_cast<int32_t>(p.shape.size());
            t.shape = const_cast<int64_t*>(p.shape.data());
            t.strides = const_cast<int64_t*>(p.strides.data());
            src = &t;
          }
          v.type_index = kTVMFFIDLTensorPtr;
          v.v_ptr = const_cast<DLTensor*>(src);
          break;
        }
        case kParamInt:
          v.type_index = kTVMFFIInt;
          v.v_int64 = p.i;
          break;
        case kParamBool:
          v.type_index = kTVMFFIBool;
          v.v_int64 = p.i != 0;
          break;
        case kParamFloat:
          v.type_index = kTVMFFIFloat;
          v.v_float64 = p.f;
          break;
        default:
          break;
      }
    }
    TVMFFIAny result;
    result.type_index = kTVMFFINone;
    result.zero_padding = 0;
    result.v_int64 = 0;
    if (TVMFFIFunctionCall(l.handle, any, static_cast<int32_t>(np), &result) != 0) {
      rc = RaiseFFIError("a kernel launch");
      break;
    }
    if (result.type_index >= kTVMFFIStaticObjectBegin && result.v_obj != nullptr) TVMFFIObjectDecRef(result.v_obj);
  }
  if (set_stream && prev != stream) TVMFFIEnvSetStream(r.device_type, r.device_id, prev, nullptr);
  return rc;
}

void SetAllocError(void*, const char* kind, const char* message) {
  PyErr_Format(PyExc_RuntimeError, "%s: %s", kind, message);
}

PyObject* Replay(Op* op, const Recipe& r, PyObject* args, const DLTensor* dls) {
  size_t na = r.allocs.size();
  PyObject* outs[kMaxAllocs] = {};
  DLTensor alloc_dls[kMaxAllocs];
  PyObject* ret = nullptr;
  long long before = 0, after = 0;
  for (size_t j = 0; j < na; ++j) {
    const Alloc& a = r.allocs[j];
    DLTensor proto{};
    proto.device = a.device;
    proto.dtype = a.dtype;
    proto.ndim = static_cast<int32_t>(a.shape.size());
    proto.shape = const_cast<int64_t*>(a.shape.data());
    DLManagedTensorVersioned* made = nullptr;
    if (g_api->managed_tensor_allocator(&proto, &made, nullptr, SetAllocError) != 0 || made == nullptr) goto done;
    void* obj = nullptr;
    if (g_api->managed_tensor_to_py_object_no_sync(made, &obj) != 0) goto done;  // owns made either way
    outs[j] = static_cast<PyObject*>(obj);
    if (Export(outs[j], &alloc_dls[j]) != 0) goto done;
  }
  if (op->keep_device && CallPython(g_get_device, nullptr, &before) != 0) goto done;
  if (RunLaunches(r, dls, alloc_dls) != 0) {
    if (op->keep_device) {  // the error stands; the device is restored all the same
      PyObject *type, *value, *tb;
      PyErr_Fetch(&type, &value, &tb);
      PyObject* d = PyLong_FromLongLong(before);
      Py_XDECREF(PyObject_CallOneArg(g_set_device, d));
      Py_XDECREF(d);
      PyErr_Restore(type, value, tb);
    }
    goto done;
  }
  if (op->keep_device) {
    if (CallPython(g_get_device, nullptr, &after) != 0) goto done;
    if (after != before) {
      PyObject* d = PyLong_FromLongLong(before);
      PyObject* res = PyObject_CallOneArg(g_set_device, d);
      Py_DECREF(d);
      if (res == nullptr) goto done;
      Py_DECREF(res);
    }
  }
  if (!r.bumps.empty()) {
    PyObject* written = PyList_New(0);
    if (written == nullptr) goto done;
    for (int i : r.bumps) {
      PyObject* t = PyTuple_GET_ITEM(args, i);
      if (t != Py_None && PyList_Append(written, t) != 0) {
        Py_DECREF(written);
        goto done;
      }
    }
    PyObject* res = PyObject_CallOneArg(g_increment, written);
    if (res == nullptr && PyErr_ExceptionMatches(PyExc_RuntimeError)) {  // an inference tensor among them
      PyErr_Clear();
      res = PyObject_CallOneArg(g_bump, written);
    }
    Py_DECREF(written);
    if (res == nullptr) goto done;
    Py_DECREF(res);
  }
  {
    auto ref = [&](int k) -> PyObject* {
      PyObject* o = k >= 0 ? PyTuple_GET_ITEM(args, k) : outs[-k - 1];
      Py_INCREF(o);
      return o;
    };
    if (r.result_kind == 0) {
      Py_INCREF(Py_None);
      ret = Py_None;
    } else if (r.result_kind == 1) {
      ret = ref(r.result[0]);
    } else {
      ret = PyTuple_New(static_cast<Py_ssize_t>(r.result.size()));
      if (ret != nullptr)
        for (size_t k = 0; k < r.result.size(); ++k) PyTuple_SET_ITEM(ret, k, ref(r.result[k]));
    }
  }
done:
  for (size_t j = 0; j < na; ++j) Py_XDECREF(outs[j]);
  return ret;
}

// call(op, args): the replay of the newest recipe the call matches (Ellipsis for a key the Python path
// serves), or NotImplemented.
PyObject* Call(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 2 || !PyTuple_Check(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "call(op, args: tuple)");
    return nullptr;
  }
  Op* op = GetOp(argv[0]);
  if (op == nullptr) return nullptr;
  if (op->recipes.empty()) Py_RETURN_NOTIMPLEMENTED;
  PyObject* args = argv[1];
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  if (n > kMaxArgs) Py_RETURN_NOTIMPLEMENTED;
  long long modes = 0;
  if (CallPython(g_dispatch_len, nullptr, &modes) != 0) return nullptr;
  if (modes) Py_RETURN_NOTIMPLEMENTED;
  if (CallPython(g_function_mode, nullptr, &modes) != 0) return nullptr;
  if (modes) Py_RETURN_NOTIMPLEMENTED;
  DLTensor dls[kMaxArgs];
  char is_tensor[kMaxArgs] = {};
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* a = PyTuple_GET_ITEM(args, i);
    if (IsTensor(a)) {
      if (Export(a, &dls[i]) != 0) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
      }
      is_tensor[i] = 1;
    } else if (PyObject_TypeCheck(a, g_tensor_type)) {
      Py_RETURN_NOTIMPLEMENTED;  // a subclass (fake, functional, parameter, ...)
    }
  }
  for (size_t k = 0; k < op->recipes.size(); ++k) {
    std::shared_ptr<Recipe> r = op->recipes[k];
    if (!Matches(*r, args, dls, is_tensor)) continue;
    // to the front, found again: a comparison may have run Python code that changed the table
    auto at = std::find(op->recipes.begin(), op->recipes.end(), r);
    if (at != op->recipes.end() && at != op->recipes.begin()) {
      op->recipes.erase(at);
      op->recipes.insert(op->recipes.begin(), r);
    }
    if (r->python) {
      Py_INCREF(Py_Ellipsis);
      return Py_Ellipsis;
    }
    ++op->replays;
    return Replay(op, *r, args, dls);
  }
  Py_RETURN_NOTIMPLEMENTED;
}

// ---------------------------------------------------------------------------------------------------
// a probe for tests: a TVM-FFI function that appends what each call got to a Python list
// ---------------------------------------------------------------------------------------------------

// Appends (name, the call's parameters) to the sink; self is (sink, name). Parameters as Python values: a tensor as (address, shape, strides, (code, bits, lanes),
// (device type, id)), a scalar as itself, None for none.
int ProbeCall(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny*) {
  if (PyTuple_GET_ITEM(static_cast<PyObject*>(self), 0) == Py_None) return 0;  // a no-op launch
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* row = PyTuple_New(num_args);
  for (int32_t k = 0; row != nullptr && k < num_args; ++k) {
    const TVMFFIAny& a = args[k];
    PyObject* v = nullptr;
    if (a.type_index == kTVMFFIDLTensorPtr || a.type_index == kTVMFFITensor) {
      const DLTensor* t = a.type_index == kTVMFFITensor ? TVMFFITensorGetDLTensorPtr(a.v_obj)
                                                        : static_cast<const DLTensor*>(a.v_ptr);
      PyObject* shape = PyTuple_New(t->ndim);
      PyObject* strides = PyTuple_New(t->ndim);
      for (int d = 0; d < t->ndim; ++d) {
        PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(t->shape[d]));
        PyTuple_SET_ITEM(strides, d, PyLong_FromLongLong(t->strides[d]));
      }
      v = Py_BuildValue("(KNN(iii)(ii))", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(Start(*t))),
                        shape, strides, t->dtype.code, t->dtype.bits, t->dtype.lanes, t->device.device_type,
                        t->device.device_id);
    } else if (a.type_index == kTVMFFIInt) {
      v = PyLong_FromLongLong(a.v_int64);
    } else if (a.type_index == kTVMFFIBool) {
      v = PyBool_FromLong(a.v_int64 != 0);
    } else if (a.type_index == kTVMFFIFloat) {
      v = PyFloat_FromDouble(a.v_float64);
    } else {
      Py_INCREF(Py_None);
      v = Py_None;
    }
    PyTuple_SET_ITEM(row, k, v);
  }
  PyObject* sink = PyTuple_GET_ITEM(static_cast<PyObject*>(self), 0);
  PyObject* entry = row ? PyTuple_Pack(2, PyTuple_GET_ITEM(static_cast<PyObject*>(self), 1), row) : nullptr;
  int rc = entry != nullptr && PyList_Append(sink, entry) == 0 ? 0 : -1;
  Py_XDECREF(entry);
  Py_XDECREF(row);
  if (rc != 0) {
    PyErr_Clear();
    TVMFFIErrorSetRaisedFromCStr("RuntimeError", "probe: could not record a call");
  }
  PyGILState_Release(gil);
  return rc;
}

void ProbeDelete(void* self) {
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_DECREF(static_cast<PyObject*>(self));
  PyGILState_Release(gil);
}

// probe(name, sink: list): registers the global TVM-FFI function `name`, which appends (name, its
// parameters) to sink on each call, or does nothing where sink is None (tvm_ffi.get_global_func(name)
// returns it).
PyObject* Probe(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 2 || !PyUnicode_Check(argv[0]) || !(PyList_Check(argv[1]) || argv[1] == Py_None)) {
    PyErr_SetString(PyExc_TypeError, "probe(name: str, sink: list | None)");
    return nullptr;
  }
  PyObject* self = PyTuple_Pack(2, argv[1], argv[0]);
  if (self == nullptr) return nullptr;
  TVMFFIObjectHandle fn = nullptr;
  if (TVMFFIFunctionCreate(self, ProbeCall, ProbeDelete, &fn) != 0) {
    Py_DECREF(self);
    RaiseFFIError("creating the probe");
    return nullptr;
  }
  Py_ssize_t len = 0;
  const char* name = PyUnicode_AsUTF8AndSize(argv[0], &len);
  TVMFFIByteArray bytes{name, static_cast<size_t>(len)};
  int rc = TVMFFIFunctionSetGlobal(&bytes, fn, 1);
  TVMFFIObjectDecRef(fn);
  if (rc != 0) {
    RaiseFFIError("registering the probe");
    return nullptr;
  }
  Py_RETURN_NONE;
}

// new_op(keep_device): an op's recipe table.
PyObject* NewOp(PyObject*, PyObject* arg) {
  int keep = PyObject_IsTrue(arg);
  if (keep < 0) return nullptr;
  auto* op = new Op();
  op->keep_device = keep;
  return PyCapsule_New(op, "tilelang_ops.op", OpDestructor);
}

// clear(op): drops its recipes and its count of replays.
PyObject* Clear(PyObject*, PyObject* capsule) {
  Op* op = GetOp(capsule);
  if (op == nullptr) return nullptr;
  op->recipes.clear();
  op->replays = 0;
  Py_RETURN_NONE;
}

// stats(op): (recipes that launch, keys the Python path serves, calls replayed).
PyObject* Stats(PyObject*, PyObject* capsule) {
  Op* op = GetOp(capsule);
  if (op == nullptr) return nullptr;
  long long python = 0;
  for (auto& r : op->recipes) python += r->python;
  return Py_BuildValue("(LLL)", static_cast<long long>(op->recipes.size()) - python, python, op->replays);
}

// init(exchange_api capsule, torch.Tensor, bump, increment_version, dispatch_len, function_mode,
//      get_device, set_device)
PyObject* Init(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 8) {
    PyErr_SetString(PyExc_TypeError, "init takes 8 arguments");
    return nullptr;
  }
  auto* api = static_cast<const DLPackExchangeAPI*>(PyCapsule_GetPointer(argv[0], "dlpack_exchange_api"));
  if (api == nullptr) return nullptr;
  if (api->header.version.major != DLPACK_MAJOR_VERSION || api->dltensor_from_py_object_no_sync == nullptr ||
      api->current_work_stream == nullptr || api->managed_tensor_allocator == nullptr ||
      api->managed_tensor_to_py_object_no_sync == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "torch's DLPack exchange API lacks what the fast path needs");
    return nullptr;
  }
  g_api = api;
  PyObject** slots[] = {reinterpret_cast<PyObject**>(&g_tensor_type), &g_bump, &g_increment, &g_dispatch_len,
                        &g_function_mode, &g_get_device, &g_set_device};
  for (int k = 0; k < 7; ++k) {
    Py_INCREF(argv[k + 1]);
    Py_XDECREF(*slots[k]);
    *slots[k] = argv[k + 1];
  }
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"init", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(Init)), METH_FASTCALL, "init"},
    {"new_op", NewOp, METH_O, "new_op(keep_device) -> an op's recipe table"},
    {"add", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(Add)), METH_FASTCALL,
     "add(op, args, allocs, launches, bumps, result)"},
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(Call)), METH_FASTCALL,
     "call(op, args) -> the replayed call's result, or NotImplemented"},
    {"clear", Clear, METH_O, "clear(op)"},
    {"stats", Stats, METH_O, "stats(op) -> (recipes, keys the Python path serves, replays)"},
    {"probe", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(Probe)), METH_FASTCALL,
     "probe(name, sink): a global TVM-FFI function recording its calls into sink (tests)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "tilelang_ops_fastpath", nullptr, -1, kMethods};

}  // namespace

PyMODINIT_FUNC PyInit_tilelang_ops_fastpath(void) { return PyModule_Create(&kModule); }
