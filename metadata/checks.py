"""Host-side argument checks shared by the references and the kernel wrappers.

They read only shapes, dtypes and devices (never tensor values), so they cost no device sync and run
before anything is written. Messages show the offending values.
"""

from __future__ import annotations

import operator
import os

import torch
from torch._subclasses.fake_tensor import is_fake

# Checks that need device values (slots beyond the cache, positions beyond the cos/sin table, `end`
# beyond the row) run in the wrappers only when this environment variable is set to 1; the
# references always run them. Without it a kernel still skips such rows instead of touching memory.
DEBUG_ENV = "TILELANG_OPS_DEBUG"


# os.environ.get encodes the key on every call (~0.7 us, once or more per op call); its raw mapping is
# read directly where the platform has one, so an unset variable costs one dict lookup
_ENV_RAW = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey(DEBUG_ENV) if _ENV_RAW is not None else None


def debug_checks_enabled() -> bool:
    if _ENV_RAW is not None and _ENV_KEY not in _ENV_RAW:
        return False
    return os.environ.get(DEBUG_ENV, "0") not in ("", "0", "false", "False")


def describe(value) -> str:
    """What a message shows of a value the caller passed: its type and a short repr."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 80 else text[:77] + '...'}"


# the scalars a host check takes where an int / a float goes; torch.compile passes the symbolic ones
# (torch.SymInt / SymFloat) for Python scalars it traces without specializing: their comparisons become
# the compiled graph's guards
INTS = (int, torch.SymInt)
REALS = (int, float, torch.SymInt, torch.SymFloat)


def is_int(value) -> bool:
    """A Python int (or a traced one), not a bool."""
    return isinstance(value, INTS) and not isinstance(value, bool)


def is_real(value) -> bool:
    """A Python int or float (or a traced one), not a bool."""
    return isinstance(value, REALS) and not isinstance(value, bool)


def check_int(name: str, value, *, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as a Python int, else TypeError; outside ``[lo, hi]`` (bounds given), ValueError.

    Integer scalars that define ``__index__`` (numpy ints) are accepted; bools and tensors are not (a
    host check never reads a device value). A ``torch.SymInt`` (an int that ``torch.compile`` traces
    symbolically) passes as it is: the bounds then become guards instead of specializing its value.
    """
    if isinstance(value, bool) or isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be an int, got {describe(value)}")
    if isinstance(value, torch.SymInt):
        v = value
    else:
        try:
            v = operator.index(value)
        except TypeError:
            raise TypeError(f"{name} must be an int, got {describe(value)}") from None
    if lo is not None and hi is not None and not lo <= v <= hi:
        raise ValueError(f"{name}={v} is outside [{lo}, {hi}]")
    if lo is not None and v < lo:
        raise ValueError(f"{name}={v} must be >= {lo}")
    if hi is not None and v > hi:
        raise ValueError(f"{name}={v} must be <= {hi}")
    return v


def check_int_sequence(name: str, values) -> list[int]:
    """A sequence (list, tuple, range, 1-D tensor on the CPU) of ints, as a list; messages name the entry."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of ints, got {describe(values)}")
    if isinstance(values, torch.Tensor):
        if values.dim() != 1 or values.is_floating_point() or values.dtype == torch.bool \
                or values.device.type != "cpu":
            raise TypeError(f"{name} must be a sequence of ints, got a {values.dtype} tensor of shape "
                            f"{tuple(values.shape)} on {values.device}")
        return values.tolist()
    return [check_int(f"{name}[{i}]", v) for i, v in enumerate(values)]


def check_choice(name: str, value, choices) -> None:
    """``value`` must be one of ``choices`` (a ValueError listing them)."""
    try:
        known = value in choices
    except TypeError:  # an unhashable value is in no table
        known = False
    if not known:
        raise ValueError(f"{name}={value!r} is not one of {list(choices)}")


def check_tensor(name: str, t, *, dtype=None, ndim: int | None = None, shape=None,
                 device: torch.device | str | None = None, contiguous: bool = False) -> None:
    """Raise TypeError/ValueError unless ``t`` is a tensor with the given properties.

    ``dtype`` may be one dtype or a tuple; ``shape`` may hold None for free dimensions.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {describe(t)}")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in allowed:
            want = " or ".join(str(d) for d in allowed)
            raise TypeError(f"{name} must have dtype {want}, got {t.dtype}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if shape is not None:
        if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
            want = tuple("*" if s is None else s for s in shape)
            raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"{name} must be on {device}, got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (strides {t.stride()}, shape {tuple(t.shape)})")


def check_same_device(**tensors) -> torch.device:
    """All tensors on one device; returns it."""
    devices = {name: t.device for name, t in tensors.items() if isinstance(t, torch.Tensor)}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{n}={d}" for n, d in devices.items())
        raise ValueError(f"tensors must share one device, got {listing}")
    return next(iter(devices.values()))


_is_functional = torch._is_functional_tensor
_is_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def has_memory(t: torch.Tensor) -> bool:
    """Whether a tensor has an address to check: not a meta or fake tensor, and not traced by
    torch.compile (whose tensors are fake). A plain ``torch.Tensor`` that wraps no other tensor (an eager
    call's) answers without ``is_fake``, which costs about 1.5 us per tensor."""
    if torch.compiler.is_compiling() or t.is_meta:
        return False
    if t.__class__ is torch.Tensor and not _is_functional(t) and not _is_functorch_wrapped(t):
        return True
    return not is_fake(t)


def check_aligned(**tensors) -> None:
    """16-byte vector accesses need 16-byte aligned bases (torch allocations are; odd views may not be).
    None, non-contiguous tensors (a launch copies them) and tensors without memory pass."""
    for name, t in tensors.items():
        if t is None or not t.is_contiguous() or not has_memory(t):
            continue
        if t.data_ptr() % 16:
            raise ValueError(f"{name} must start at a 16-byte aligned address for the vectorized kernel, "
                             f"got data_ptr % 16 = {t.data_ptr() % 16} (storage offset {t.storage_offset()})")


def same_start(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors start at the same address; tensors without memory (``has_memory``) never do."""
    if not (has_memory(a) and has_memory(b)):
        return False
    return a.data_ptr() == b.data_ptr()


def check_cuda(**tensors) -> torch.device:
    """Kernel wrappers take CUDA tensors only, all on one device."""
    device = check_same_device(**tensors)
    if device.type != "cuda":
        listing = ", ".join(f"{n}={t.device}" for n, t in tensors.items() if isinstance(t, torch.Tensor))
        raise ValueError(f"the TileLang kernel needs CUDA tensors, got {listing}")
    return device
