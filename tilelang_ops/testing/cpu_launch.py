"""The ops' eager paths on the CPU, up to their launches: every host check, the launch plan and the launch
itself, with each compiled kernel replaced by a stand-in (no GPU, nothing compiled). The torch-integration
tests bind each launch to its kernel's parameters this way; ``tools/host_cost.py`` times the Python layers
of each call with no-op launches.

``eager_on_the_cpu(make_launch, put)`` patches (through ``put(obj, name, value)``, e.g. pytest's
``monkeypatch.setattr``, or ``patcher(stack)`` of an ``ExitStack``): the device checks pass CPU tensors,
the device properties the launch rules read are an H200's, and every module's compile helper
(``_library.kernel``, under whatever name it was imported) returns ``make_launch(factory, *static)``.
Launch plans are dropped before and after, since they hold the stand-in launches.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from types import SimpleNamespace
from unittest import mock

import torch

# what the launch rules read of the device (an H200's SM count and L2; 80 GiB)
DEVICE_PROPS = SimpleNamespace(multi_processor_count=132, L2_cache_size=50 << 20, total_memory=80 << 30,
                               name="CPU stand-in")


def patcher(stack: ExitStack) -> Callable:
    """``put(obj, name, value)``: an attribute patched until ``stack`` closes."""
    return lambda obj, name, value: stack.enter_context(mock.patch.object(obj, name, value))


def _op_modules() -> list:
    return [m for name, m in list(sys.modules.items()) if name.startswith("tilelang_ops") and m is not None]


def accept_cpu_tensors(put: Callable) -> None:
    """Every loaded tilelang_ops module's device check passes CPU tensors (so the ops run on the CPU up to
    their launches, or through references standing in for their kernels)."""
    for module in _op_modules():
        if hasattr(module, "check_cuda"):
            put(module, "check_cuda", lambda **tensors: torch.device("cpu"))


@contextmanager
def eager_on_the_cpu(make_launch: Callable, put: Callable, *, record: bool = False) -> Iterator[None]:
    """Within: the ops' eager calls run on CPU tensors, each launch calling ``make_launch(factory,
    *static)`` (made once per plan) with the launch's arguments. ``record``: CPU calls become recipes of
    the compiled eager path too (``make_launch`` then returns TVM-FFI functions, e.g. ``probe``)."""
    from tilelang_ops import _library

    put(torch.cuda, "get_device_properties", lambda device=None: DEVICE_PROPS)
    accept_cpu_tensors(put)
    if record:
        put(_library, "RECORD_DEVICES", _library.RECORD_DEVICES | {"cpu"})
        put(_library, "_COMPILED_EAGER", True)
    compile_helper = _library.kernel

    def stand_in(factory, *static):
        return _library.handed_out(_library.launchable(make_launch(factory, *static)))

    for module in _op_modules():
        for attr, value in vars(module).copy().items():
            if value is compile_helper:  # under whatever name a module imported it
                put(module, attr, stand_in)
    put(sys.modules["tilelang_ops.topk.launch"], "device_props", lambda device: DEVICE_PROPS)
    _library.forget_plans()
    try:
        yield
    finally:
        _library.forget_plans()
