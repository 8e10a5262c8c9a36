"""The public ops as ``torch.ops.tilelang_ops.<name>`` (SPEC 7), and the cheap eager path they share.

Registration. Each op is defined in the ``tilelang_ops`` torch library with the schema
``torch.library.infer_schema`` gives its annotated implementation (``mutates_args`` naming what it
writes in place) and a fake implementation that runs the host checks and only allocates outputs, so
``torch.compile`` traces it as one node and ``torch.library.opcheck`` tests it. ``custom_op`` would put
two Python layers in front of the kernel on every eager call (an Autograd kernel that checks
``requires_grad`` and redispatches, an ADInplaceOrView kernel that bumps the version counters). The ops
have no derivative (indices, caches, quantized bytes), so those keys fall through in C++ and the CUDA
key calls the implementation directly, which bumps the version counters itself: the dispatcher then
costs about as much as for a built-in op.

Eager path. A call's static key (the shapes, strides, dtypes and devices of its tensors, the 16-byte
alignment of their addresses and its Python scalars) maps to a launch plan made by the op's full host
checks on the first call with that key (``Plans``); later calls with the same key look the plan up (a
few recent keys through compiled guard checks, before the key is built) and launch the compiled function
directly (``direct``). No call reads a device value on the host unless TILELANG_OPS_DEBUG=1 asks for the value
checks, so the ops record into CUDA graphs.

Compiles. Kernels are compiled on the first call that needs them (``kernel``), or ahead of time by
``warmup``; a compile that would happen while a CUDA graph is being captured raises instead.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import threading
import time
from collections.abc import Callable, Sequence
from operator import itemgetter

import torch

from metadata.checks import debug_checks_enabled
from tilelang_ops import _fast

NAMESPACE = "tilelang_ops"

# The Library object that holds the direct registrations must stay alive as long as the ops.
_LIB = torch.library.Library(NAMESPACE, "DEF")
OPS: dict[str, object] = {}


class _OpCall:
    """What an op's Python API needs (``call_op``): the CUDA implementation (version bumps included), the
    tensor arguments of a call, (position, Python type, optional) of its scalar arguments (the dispatcher
    would take a 0-d tensor or a bool as an int, so the Python API checks the exact type first), the
    scalars of a call, the tuples of scalar classes already checked; for the compiled eager path
    (``_fast``): the op's recipe table (made on first use), the positions it writes and how often each
    static key took the Python path."""

    __slots__ = ("impl", "tensors_of", "scalars", "scalars_of", "accepted", "fast", "written", "seen")

    def __init__(self, impl, tensor_positions, scalars, written):
        self.impl, self.tensors_of, self.scalars = impl, _picker(tensor_positions), scalars
        self.scalars_of, self.accepted = _picker(tuple(i for i, _, _ in scalars)), set()
        self.fast, self.written, self.seen = None, written, {}


_CALLS: dict[object, _OpCall] = {}
_SCALAR_TYPES = {"SymInt": int, "int": int, "bool": bool, "float": float, "str": str,
                 "ScalarType": torch.dtype}
# the classes each kind accepts: an int where a float goes, and the symbolic values torch.compile passes
# for Python scalars it does not specialize
_ACCEPTS = {int: (int, torch.SymInt), bool: (bool, torch.SymBool),
            float: (float, int, torch.SymFloat, torch.SymInt), str: (str,), torch.dtype: (torch.dtype,)}


def mutated_positions(op) -> tuple[int, ...]:
    """Positions of the arguments an op's schema marks as written (``Tensor(a!)``)."""
    return tuple(i for i, a in enumerate(op._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def _picker(positions: tuple[int, ...]) -> Callable[[Sequence], tuple]:
    """The items of a call's arguments at ``positions``, as a tuple (``itemgetter`` of one position
    returns the bare item)."""
    if len(positions) == 1:
        i = positions[0]
        return lambda args: (args[i],)
    return itemgetter(*positions) if positions else (lambda args: ())


def bump_versions(impl: Callable, indices: tuple[int, ...]) -> Callable:
    """``impl`` followed by what the skipped ADInplaceOrView kernel does: a version bump of each mutated
    argument, once the call has succeeded. The dispatcher leaves out trailing arguments that have their
    default (``out_norm=None``), so a position may be beyond the call's arguments."""
    if not indices:
        return impl
    written_of, last = _picker(indices), max(indices)

    def run(*args):
        out = impl(*args)
        written = written_of(args) if len(args) > last else [args[i] for i in indices if i < len(args)]
        _fast.bump([t for t in written if t is not None])
        return out

    return run


def register_op(name: str, impl: Callable, fake: Callable, *, mutates_args: Sequence[str] = ()):
    """Define ``torch.ops.tilelang_ops.<name>`` from ``impl`` (annotated, positional arguments only:
    the schema is inferred from its signature), with ``fake`` as its fake implementation; returns the
    op's default overload."""
    schema = torch.library.infer_schema(impl, mutates_args=tuple(mutates_args))
    _LIB.define(name + schema)
    overload = getattr(getattr(torch.ops, NAMESPACE), name).default
    params = schema[1:schema.index(") ->")].split(", ")  # "(args) -> returns"; no default holds ", "
    # no derivative: Autograd and ADInplaceOrView fall through in C++ (see the module docstring)
    _LIB.impl(name, torch.library.fallthrough_kernel, "Autograd")
    _LIB.impl(name, torch.library.fallthrough_kernel, "ADInplaceOrView")
    written = mutated_positions(overload)
    cuda_impl = bump_versions(impl, written)
    _LIB.impl(name, cuda_impl, "CUDA")
    # CPU tensors reach the implementation too, whose host checks name the argument on the CPU
    _LIB.impl(name, impl, "CPU")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIB)
    OPS[name] = overload
    scalars = tuple((i, _SCALAR_TYPES[p.split()[0].rstrip("?")], p.split()[0].endswith("?"))
                    for i, p in enumerate(params) if not p.startswith("Tensor"))
    _CALLS[overload] = _OpCall(cuda_impl, tuple(i for i, p in enumerate(params) if p.startswith("Tensor")),
                               scalars, written)
    return overload


_Tensor = torch.Tensor


def plan_key(args: Sequence) -> tuple:
    """The static key of a call: what the host checks read of each tensor (shape, strides, dtype, device
    and address modulo 16), (type, value) of each other argument; a float by its ``float.hex`` (equality
    makes -0.0 0.0 and a NaN unequal to itself)."""
    return tuple([(a.shape, a.stride(), a.dtype, a.device, a.data_ptr() & 15) if isinstance(a, _Tensor)
                  else (float, a.hex()) if a.__class__ is float else (a.__class__, a) for a in args])


MAX_PLANS = 4096  # launch plans kept per op; prefill shapes vary per call, so the cache is bounded

try:  # torch's compiled tensor-guard check (what torch.compile's guards run)
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # pragma: no cover - torch 2.11 and 2.13 have it
    _TensorGuards = None

_data_ptr = _Tensor.data_ptr


RECENT_KEYS = 4  # keys per op tried by their compiled checks before the table (an engine alternates few)


class Plans:
    """An op's launch plans by static key (``plan_key``): ``plans(args)`` looks the key up, or makes the
    plan with ``make(*args)`` (the op's full host checks) on the key's first call.

    Each key also gets one compiled check, and the checks of the ``RECENT_KEYS`` most recent keys are tried
    first, newest first: the other arguments compared by class and value, torch's ``TensorGuards`` over the
    tensor arguments (exact type, dispatch keys, dtype, device, sizes, strides, ``requires_grad``), every
    address 16-byte aligned. An engine's decode step repeats a few keys per op (layers alternate compress
    ratios and cache formats), and a check costs a fraction of building the key."""

    __slots__ = ("make", "table", "recent")

    def __init__(self, make: Callable):
        self.make = make
        self.table: dict[tuple, tuple] = {}  # key -> (plan, its compiled check or None)
        # compiled checks, newest first: (tensors of a call, their guard check, other arguments of a call,
        # their values and classes, (position, sign) of the zero floats, plan)
        self.recent: list[tuple] = []
        _PLAN_CACHES.append(self)

    def __call__(self, args: tuple):
        return handed_out(self._find(args))

    def _find(self, args: tuple):
        for recent in self.recent:
            tensors_of, check, others_of, others, classes, zeros, found = recent
            now = others_of(args)
            # classes before values: a tensor where the key holds a scalar would compare elementwise
            if tuple(map(type, now)) != classes or now != others:
                continue
            # equal floats have equal bits except a zero's sign (a NaN equals nothing: the table serves it)
            if zeros and any(math.copysign(1.0, now[j]) != sign for j, sign in zeros):
                continue
            tensors = tensors_of(args)
            if not check(*tensors):
                continue
            aligned = 0
            for t in tensors:
                aligned |= _data_ptr(t)
            if aligned & 15:
                continue
            if recent is not self.recent[0]:
                self._remember(recent)
            return found
        key = plan_key(args)
        entry = self.table.get(key)
        if entry is None:
            if len(self.table) >= MAX_PLANS:
                self.table.clear()
            found = self.make(*args)
            entry = self.table[key] = (found, self._check(key, args, found))
        if entry[1] is not None:
            self._remember(entry[1])
        return entry[0]

    def _remember(self, recent: tuple) -> None:
        self.recent = [recent] + [r for r in self.recent if r is not recent][:RECENT_KEYS - 1]

    @staticmethod
    def _check(key: tuple, args: tuple, found) -> tuple | None:
        """The compiled check of ``key``: only for keys of plain, aligned tensors (others take the table)."""
        if _TensorGuards is None:
            return None
        tpos = tuple(i for i, a in enumerate(args) if isinstance(a, _Tensor))
        if any(args[i].__class__ is not _Tensor or key[i][4] for i in tpos):
            return None
        opos = tuple(i for i in range(len(args)) if i not in tpos)
        tensors = [args[i] for i in tpos]
        try:  # a private torch API: where it changed, the table alone serves
            guards = _TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                                   dynamic_dims_strides=[list(t.stride()) for t in tensors])
        except (TypeError, RuntimeError):
            return None
        others_of = _picker(opos)
        others = others_of(args)
        zeros = tuple((j, math.copysign(1.0, v)) for j, v in enumerate(others)
                      if v.__class__ is float and v == 0)
        return _picker(tpos), guards.check, others_of, others, tuple(map(type, others)), zeros, found


_PLAN_CACHES: list[Plans] = []


def forget_plans() -> None:
    """Drop every launch plan and compiled kernel of this process (the next calls check and look up again)."""
    for plans in _PLAN_CACHES:
        plans.table.clear()
        plans.recent = []
    _KERNELS.clear()
    _EXECUTABLES.clear()
    forget_recipes()


def forget_recipes() -> None:
    """Drop every recipe of the compiled eager path (each key records again on its second plain call)."""
    for call in _CALLS.values():
        call.seen.clear()
        if call.fast is not None:
            _fast.extension().clear(call.fast)


_PLAIN = frozenset((torch.Tensor, type(None)))

_fast_call: Callable = None  # the extension's ``call``, once an op has a recipe table


def _plain_untraced(tensors: Sequence) -> bool:
    """Whether a call torch.compile does not trace is plain eager, given its tensor arguments: no dispatch
    or torch-function mode active, every tensor a plain ``torch.Tensor`` (no fake, functional or other
    subclass)."""
    if torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled():
        return False
    return _PLAIN.issuperset(map(type, tensors))


def call_op(op, check: Callable, *args):
    """``op(*args)``; where the dispatcher rejects an argument (a type its schema does not take), or the
    op fails, ``check(*args)`` (the op's host checks) raises the error that names the argument first.

    A plain eager call (not traced, ``_plain_untraced``) whose static key a recipe holds is replayed by the
    compiled eager path (``_fast``); other plain eager calls run the op's CUDA implementation itself, which
    is what the dispatcher would call (the op has no derivative and no other kernel for CUDA tensors),
    without the dispatcher's boxing of every argument, and the second such call of a key records its
    recipe; traced, fake or mode-wrapped calls go through the op."""
    call = _CALLS[op]
    traced = torch.compiler.is_compiling()
    if not traced and call.fast is not None and not debug_checks_enabled():
        out = _fast_call(call.fast, args)
        if out is not NotImplemented:
            # Ellipsis: a key that a recipe cannot serve, of a plain call that a checked one matched
            return call.impl(*args) if out is Ellipsis else out
    # the check depends on the classes alone, so an eager call skips it for classes that passed (torch.compile
    # traces the loop: it does not trace an itemgetter)
    classes = None if traced else tuple(map(type, call.scalars_of(args)))
    if traced or classes not in call.accepted:
        for i, kind, optional in call.scalars:
            a = args[i]
            t = type(a)  # (what dynamo resolves for a traced scalar; it does not resolve a.__class__)
            if t not in _ACCEPTS[kind] and not (optional and a is None):
                check(*args)
                raise TypeError(f"{op}: argument {i} must be a Python {kind.__name__}, got {t.__name__}")
        if not traced:
            call.accepted.add(classes)
    try:
        if traced:
            return op(*args)
        tensors = call.tensors_of(args)
        if not _plain_untraced(tensors):
            return op(*args)
        if not _COMPILED_EAGER or debug_checks_enabled() or not _recordable(tensors):
            return call.impl(*args)
        return _eager(call, args)
    except (TypeError, RuntimeError):
        check(*args)
        raise


RECORD_DEVICES = frozenset(("cuda",))  # devices whose calls become recipes (the CPU tests add "cpu")
_COMPILED_EAGER = False


def compiled_eager(enabled: bool | None = None) -> bool:
    """Whether plain eager calls of this process record recipes and replay them through the compiled
    eager path (``_fast``); ``enabled`` sets it (off drops every recipe). Returns the setting before."""
    global _COMPILED_EAGER
    before = _COMPILED_EAGER
    if enabled is not None:
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool or None, got {type(enabled).__name__}")
        _COMPILED_EAGER = enabled
        if not enabled:
            forget_recipes()
    return before


RECORD_AFTER = 1  # Python-path calls of a static key before the next one is recorded


def _recordable(tensors: Sequence) -> bool:
    """Whether the call's device records recipes (its first tensor's: a key holds every tensor's)."""
    for t in tensors:
        if t is not None:
            return t.device.type in RECORD_DEVICES
    return False


def _eager(call: _OpCall, args: tuple):
    """A plain eager call on the Python path; the ``RECORD_AFTER + 1``-th of its static key is recorded
    into the op's recipe table."""
    if _fast.unavailable():
        return call.impl(*args)
    key = plan_key(args)
    seen = call.seen.get(key, 0)
    if seen < RECORD_AFTER:
        if len(call.seen) >= MAX_PLANS:
            call.seen.clear()
        call.seen[key] = seen + 1
        return call.impl(*args)
    ext = _fast.extension()
    if ext is None:
        return call.impl(*args)
    if call.fast is None:
        global _fast_call
        _fast_call = ext.call
        call.fast = ext.new_op(torch.cuda.device_count() >= 2)
    recorder = _fast.Recorder(args)
    _LOCAL.recorder = recorder
    try:
        with recorder:
            out = call.impl(*args)
    finally:
        _LOCAL.recorder = None
    try:
        ext.add(call.fast, args, *recorder.recipe(out, tuple(i for i in call.written if i < len(args)),
                                                  {t._cdata: t for t in _DUMMIES.values()}))
    except (_fast.Unrepresentable, ValueError):  # (ValueError: beyond the extension's bounds)
        ext.add(call.fast, args, None, None, None, None)  # the Python path serves the key
    return out


def dense(*args) -> bool:
    """Whether every tensor among ``args`` is contiguous. A property of the static key, so a plan holds it
    and a launch copies its inputs (``contiguous()``) only when it is False."""
    return all(t.is_contiguous() for t in args if isinstance(t, _Tensor))


_DUMMIES: dict[tuple, torch.Tensor] = {}


def dummy(device: torch.device, dtype: torch.dtype, shape: tuple = (1,), fill=0) -> torch.Tensor:
    """A cached buffer of ``fill`` on ``device`` (a tensor's) for an argument a launch does not use (an
    absent optional tensor). Made on the first call that needs it; during a CUDA-graph capture a missing one
    raises, since its fill would run only at replay."""
    key = (device, dtype, shape, fill)
    t = _DUMMIES.get(key)
    if t is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"tilelang_ops: a {dtype} {tuple(shape)} placeholder for this call's shape "
                               f"was not made before this CUDA graph capture; run the step once (or "
                               f"tilelang_ops.warmup) first")
        t = _DUMMIES[key] = torch.full(shape, fill, dtype=dtype, device=device)
    return t


def keeps_current_device(fn: Callable, get_device: Callable[[], int],
                         set_device: Callable[[int], None]) -> Callable:
    """``fn``, after which the process's current device is the one before the call. TVM's host code makes
    the device of the kernel's tensors current (``cudaSetDevice``) and leaves it so: a call on ``cuda:1``
    data would otherwise move torch's current device, and every later ``device="cuda"`` with it. Costs
    two device queries per launch; a call on the current device sets nothing."""
    def launch(*args):
        before = get_device()
        try:
            return fn(*args)
        finally:
            if get_device() != before:
                set_device(before)

    launch.tvm_function = fn  # what the compiled eager path launches (keeping the device itself)
    return launch


def direct(jit_kernel) -> Callable:
    """The compiled function of a TileLang ``JITKernel``, called with every parameter (outputs
    included, in the kernel's order): the TVM-FFI executable itself, without the adapter's Python
    argument stitching. Where the process sees several GPUs the current device is kept
    (``keeps_current_device``); with one, the only device is always current and the launch queries
    nothing. Kernels of another execution backend are called through the kernel object."""
    adapter = getattr(jit_kernel, "adapter", None)
    get = getattr(adapter, "_get_executable", None)
    if get is None or getattr(adapter, "_ffi_callee_allocated_output_abi", False):
        return jit_kernel
    if torch.cuda.device_count() < 2:  # (a CPU build of torch counts none)
        return get()
    return keeps_current_device(get(), torch._C._cuda_getDevice, torch._C._cuda_setDevice)


# --------------------------------------------------------------------------------------------------
# compiles: on first use, or ahead of time through warmup
# --------------------------------------------------------------------------------------------------

_KERNELS: dict[tuple, Callable] = {}
_progress: list[Callable[[str], None]] = []


def kernel(factory, *static) -> Callable:
    """``direct(factory(*static))``, compiled once per process (TileLang's disk cache serves later
    processes). Raises instead of compiling while the current stream captures a CUDA graph."""
    key = (id(factory), static)  # factories are module-level objects (JITImpl is not hashable)
    fn = _KERNELS.get(key)
    if fn is not None:
        return handed_out(fn)
    name = f"{getattr(factory, '__name__', factory)}{static}"
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"tilelang_ops: kernel {name} is not compiled and a CUDA graph is being "
                           f"captured; run the step once (or tilelang_ops.warmup) before capture")
    t0 = time.perf_counter()
    fn = _KERNELS[key] = launchable(direct(factory(*static)))
    for report in _progress:
        report(f"compiled {name} in {time.perf_counter() - t0:.1f} s")
    return handed_out(fn)


_EXECUTABLES: dict[int, Callable] = {}  # id -> every compiled function ``kernel`` handed out


class _Local(threading.local):
    recorder = None  # the ``_fast.Recorder`` of the call this thread records, if any


_LOCAL = _Local()


def launchable(fn: Callable) -> Callable:
    """``fn``, known from now on as a compiled function (its launches are recorded into recipes)."""
    _EXECUTABLES[id(fn)] = fn
    return fn


def handed_out(found):
    """What a launch plan or ``kernel`` hands its caller: ``found`` itself, or, while this thread records a
    call (``_fast.Recorder``), ``found`` with its compiled functions recording their launches."""
    return found if _LOCAL.recorder is None else _recording(found)


def _recording(found, depth: int = 0):
    """``found`` (a launch plan, a compiled function) with each compiled function in it wrapped to
    record its launches into the current recorder; tuples, lists and dataclasses are rebuilt. A compiled
    function left anywhere else in it makes the call unrepresentable."""
    if id(found) in _EXECUTABLES and _EXECUTABLES[id(found)] is found:
        recorder = _LOCAL.recorder

        def launch(*args):
            recorder.launch(found, args)
            return found(*args)
        return launch
    if depth > 4:
        return found
    if type(found) in (tuple, list):
        items = [_recording(x, depth + 1) for x in found]
        return found if all(a is b for a, b in zip(items, found)) else type(found)(items)
    if dataclasses.is_dataclass(found) and not isinstance(found, type):
        changes = {f.name: _recording(getattr(found, f.name), depth + 1) for f in dataclasses.fields(found)}
        changes = {k: v for k, v in changes.items() if v is not getattr(found, k)}
        return dataclasses.replace(found, **changes) if changes else found
    if any(id(x) in _EXECUTABLES for x in gc.get_referents(found)):
        _LOCAL.recorder.why = f"a compiled function inside a {type(found).__name__}"
    return found


def warmup(step: Callable, *args, progress: Callable[[str], None] | None = print, **kwargs):
    """Run ``step(*args, **kwargs)`` once eagerly, compiling every kernel it launches (and making the
    launch plans of its static shapes), then synchronize; ``progress`` gets one line per compile.

    Call it with inputs of each static shape a CUDA graph will capture (each batch bucket); the capture
    then compiles nothing. Returns what ``step`` returns."""
    if progress is not None:
        _progress.append(progress)
    try:
        out = step(*args, **kwargs)
    finally:
        if progress is not None:
            _progress.remove(progress)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out
