"""Host-side argument checks shared by the references and the kernel wrappers.

They read only shapes, dtypes and devices (never tensor values), so they cost no device sync and run
before anything is written. Messages show the offending values.
"""

from __future__ import annotations

import os

import torch

# Checks that need device values (slots beyond the cache, positions beyond the cos/sin table, `end`
# beyond the row) run in the wrappers only when this environment variable is set to 1; the
# references always run them. Without it a kernel still skips such rows instead of touching memory.
DEBUG_ENV = "TILELANG_OPS_DEBUG"


def debug_checks_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "0") not in ("", "0", "false", "False")


def check_tensor(name: str, t, *, dtype=None, ndim: int | None = None, shape=None,
                 device: torch.device | str | None = None, contiguous: bool = False) -> None:
    """Raise TypeError/ValueError unless ``t`` is a tensor with the given properties.

    ``dtype`` may be one dtype or a tuple; ``shape`` may hold None for free dimensions.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
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


def check_cuda(**tensors) -> torch.device:
    """Kernel wrappers take CUDA tensors only, all on one device."""
    device = check_same_device(**tensors)
    if device.type != "cuda":
        listing = ", ".join(f"{n}={t.device}" for n, t in tensors.items() if isinstance(t, torch.Tensor))
        raise ValueError(f"the TileLang kernel needs CUDA tensors, got {listing}")
    return device
