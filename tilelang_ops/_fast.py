"""The compiled eager path: a plain eager call whose static key an earlier call recorded is replayed by a
small C++ extension (``csrc/fastpath.cc``) without entering the Python layers: it matches the key on
tensor attributes, allocates the outputs through torch's DLPack allocator, launches the TVM-FFI functions
on torch's current stream and bumps the version counters of what the op writes.

Recording. The second plain eager call with a static key runs the op's implementation on the Python path
(every host check included) under ``Recorder``, a dispatch mode that sees every torch operation the
implementation makes, while the launch plans hand out the implementation's compiled functions wrapped to
record their arguments. The call becomes a recipe only when all it did was allocate (``torch.empty``),
make views and launch compiled functions, with every tensor a launch got traced to an argument, an
allocation or a kept placeholder, and its result the allocations or arguments themselves; anything else
(a copy, a fill, a device read, a debug check) leaves the key on the Python path. A recipe holds nothing
that depends on a call's data: launch scalars come from the key's plan, and per-call address checks are
kept by matching which arguments start at the same address.

The extension is built with the host C++ compiler on first use (about a second) into the kernel cache
directory; where it cannot be built or loaded, or torch lacks the DLPack exchange API, every call takes
the Python path.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "fastpath.cc")
_NAME = "tilelang_ops_fastpath"
_lock = threading.Lock()
_module = None
_failed = False


def _cache_dir() -> str:
    base = os.environ.get("TILELANG_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tilelang")
    return os.path.join(base, "tilelang_ops_fastpath")


def build(verbose: bool = False) -> str:
    """Compile the extension (once per source, Python and TVM-FFI version); returns the library's path."""
    import tvm_ffi
    from tvm_ffi import libinfo

    with open(_SRC, "rb") as f:
        source = f.read()
    digest = hashlib.sha256(source + sys.version.encode() + tvm_ffi.__version__.encode()).hexdigest()[:16]
    path = os.path.join(_cache_dir(), f"{_NAME}-{digest}{importlib.machinery.EXTENSION_SUFFIXES[0]}")
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    include = libinfo.find_include_path()
    includes = include if isinstance(include, list) else [include]
    libdir = os.path.dirname(libinfo.find_libtvm_ffi())
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        raise RuntimeError("no C++ compiler (c++ or g++) on PATH")
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as tmp:
        out = os.path.join(tmp, os.path.basename(path))
        cmd = [cxx, "-O2", "-shared", "-fPIC", "-std=c++17", f"-I{sysconfig.get_paths()['include']}",
               *(f"-I{i}" for i in includes), _SRC, "-o", out, f"-L{libdir}", "-ltvm_ffi",
               f"-Wl,-rpath,{libdir}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"building {_SRC} failed:\n{' '.join(cmd)}\n{proc.stderr}")
        if verbose:
            print(" ".join(cmd))
        os.replace(out, path)  # atomic: concurrent processes build the same bytes
    return path


def bump(written: list) -> None:
    """What the ADInplaceOrView kernel the ops skip does: a version bump of each tensor a call wrote. One
    call with a list: given a bare tensor, ``_increment_version`` iterates its first dimension and bumps
    the counter once per row."""
    try:
        torch._C._increment_version(written)
    except RuntimeError:  # an inference tensor, which has no version counter (on some torch versions)
        torch._C._increment_version([t for t in written if not t.is_inference()])


def unavailable() -> bool:
    """Whether building or loading the extension failed in this process."""
    return _failed


def extension():
    """The loaded extension, or None where it cannot be had (said once, as a warning)."""
    global _module, _failed
    if _module is not None or _failed:
        return _module
    with _lock:
        if _module is not None or _failed:
            return _module
        try:
            import tvm_ffi  # noqa: F401  (loads libtvm_ffi, which the extension links)

            spec = importlib.util.spec_from_file_location(_NAME, build())
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            has_cuda = hasattr(torch._C, "_cuda_getDevice")
            module.init(torch.Tensor.__dlpack_c_exchange_api__, torch.Tensor, bump,
                        torch._C._increment_version, torch._C._len_torch_dispatch_stack,
                        torch._C._is_torch_function_mode_enabled,
                        torch._C._cuda_getDevice if has_cuda else (lambda: 0),
                        torch._C._cuda_setDevice if has_cuda else (lambda d: None))
            _module = module
        except Exception as e:  # noqa: BLE001 - any failure leaves the Python path serving
            _failed = True
            warnings.warn(f"tilelang_ops: the compiled eager path is unavailable ({e}); calls take the "
                          f"Python path", RuntimeWarning, stacklevel=3)
    return _module


# --------------------------------------------------------------------------------------------------
# recording
# --------------------------------------------------------------------------------------------------

_aten = torch.ops.aten
_ALLOC = _aten.empty.memory_format


class Unrepresentable(Exception):
    """The recorded call did something a recipe cannot replay."""


class Recorder(TorchDispatchMode):
    """Watches one call of an op's implementation: its allocations (``torch.empty``) and views, traced to
    their sources, and the launches of its compiled functions (``launch``)."""

    def __init__(self, args: tuple):
        super().__init__()
        self.args = args
        # tensors by their TensorImpl (``_cdata``): the object a dispatch mode returns is not always the one
        # its caller gets
        self.source: dict[int, tuple] = {}  # tensor's _cdata -> ("arg", i) | ("alloc", j)
        self.keep: list = []  # every tensor seen, so that no id is reused while recording
        self.allocs: list[torch.Tensor] = []  # what the call allocated, in order
        self.launches: list[tuple] = []  # (fn, args)
        self.why: str | None = None
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                self.source.setdefault(a._cdata, ("arg", i))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is _ALLOC:
            if (kwargs.get("layout") not in (None, torch.strided) or kwargs.get("pin_memory")
                    or kwargs.get("memory_format") not in (None, torch.contiguous_format)):
                self.why = self.why or f"{func} with {kwargs}"
            self.keep.append(out)
            self.source[out._cdata] = ("alloc", len(self.allocs))
            self.allocs.append(out)
        elif func.is_view and args and isinstance(args[0], torch.Tensor):
            src = self.source.get(args[0]._cdata)
            for o in (out if isinstance(out, (tuple, list)) else (out,)):
                self.keep.append(o)
                if src is not None and isinstance(o, torch.Tensor):
                    self.source[o._cdata] = src
        else:
            self.why = self.why or str(func)
        return out

    def launch(self, fn, args) -> None:
        self.launches.append((fn, args))

    def recipe(self, result, bumps: tuple, kept: dict) -> tuple:
        """(allocs, launches, bumps, result) for the extension's ``add``; raises ``Unrepresentable``."""
        if self.why is not None:
            raise Unrepresentable(f"the call ran {self.why}")
        launches = []
        for fn, args in self.launches:
            function = getattr(fn, "tvm_function", fn)
            if not hasattr(function, "__chandle__"):
                raise Unrepresentable(f"{fn!r} is not a TVM-FFI function")
            launches.append((function, tuple(self._param(a, kept) for a in args)))
        return tuple(self.allocs), tuple(launches), bumps, self._result(result)

    def _param(self, a, kept: dict) -> tuple:
        if isinstance(a, torch.Tensor):
            if type(a) is not torch.Tensor:
                raise Unrepresentable(f"a {type(a).__name__} launch argument")
            src = self.source.get(a._cdata)
            if src is not None:
                return (src[0], src[1], a)
            if a._cdata in kept:
                return ("kept", a)
            raise Unrepresentable("a launch argument made outside the call")
        if a is None:
            return ("none",)
        if type(a) is bool:
            return ("bool", int(a))
        if type(a) is int:
            return ("int", a)
        if type(a) is float:
            return ("float", a)
        raise Unrepresentable(f"a {type(a).__name__} launch argument")

    def _ref(self, t) -> int:
        if type(t) is not torch.Tensor:
            raise Unrepresentable(f"returns a {type(t).__name__}")
        for i, a in enumerate(self.args):
            if a is t:
                return i
        # (a factory function's result reaches its caller through a detach: an alias of the allocation)
        src = self.source.get(t._cdata)
        if src is not None and src[0] == "alloc":
            made = self.allocs[src[1]]
            if (t.data_ptr(), t.shape, t.stride(), t.dtype) == (made.data_ptr(), made.shape, made.stride(),
                                                                 made.dtype):
                return -(src[1] + 1)
        raise Unrepresentable("returns a tensor that is neither an argument nor an allocation")

    def _result(self, result):
        if result is None:
            return None
        if isinstance(result, tuple):
            return ("tuple", tuple(self._ref(t) for t in result))
        return ("one", self._ref(result))
