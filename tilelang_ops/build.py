"""Build check: lower a kernel factory and nvcc-compile it for sm_90a, with or without a GPU."""

from __future__ import annotations

import tilelang

SM90_TARGET = {"kind": "cuda", "arch": "sm_90a"}


def compile_for_sm90(factory, *args, **kwargs):
    """Compile ``factory(*args, **kwargs)`` (a ``@tilelang.jit`` factory) for sm_90a; returns the
    JITKernel. It runs nvcc but never launches, so it works on a machine without CUDA."""
    prim_func = factory.get_tir(*args, **kwargs)
    return tilelang.compile(
        prim_func,
        out_idx=factory.out_idx,
        target=SM90_TARGET,
        pass_configs=factory.pass_configs,
        compile_flags=factory.compile_flags,
    )
