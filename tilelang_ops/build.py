"""Build check: lower a kernel factory and nvcc-compile it for sm_90a, with or without a GPU."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor

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


def _quiet_worker() -> None:
    """A compile worker reports through its return value; TileLang's per-compile INFO lines would only
    interleave with the caller's output."""
    import tilelang  # its import sets the level to INFO: set ours after it

    tilelang.set_log_level("WARNING")


def _spawn_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes: the caller may already hold a CUDA context, which a forked
    child cannot use."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_quiet_worker)


def _sm90_job(job):
    """Compile configuration ``name`` of ``module.build_configs()`` for sm_90a (a worker of
    ``compile_sm90_in_processes``)."""
    module, name = job
    for n, factory, args in importlib.import_module(module).build_configs():
        if n == name:
            compile_for_sm90(factory, *args)
            return name
    raise KeyError(f"{module}.build_configs() has no configuration {name!r}")


def compile_sm90_in_processes(module: str, names, workers=None) -> list[str]:
    """The build check of ``names`` (configurations of ``module.build_configs()``: (name, factory, static
    arguments)) in ``workers`` spawned processes (default: one per CPU): lowering and nvcc are
    single-threaded, and the big kernels take tens of seconds each. A failure raises here. Returns names."""
    names = list(names)
    workers = workers or min(len(names), os.cpu_count() or 1)
    jobs = [(module, n) for n in names]
    if workers <= 1:
        return [_sm90_job(j) for j in jobs]
    with _spawn_pool(workers) as ex:
        return list(ex.map(_sm90_job, jobs))


def _compile_job(job):
    module, factory, static = job
    t0 = time.time()
    try:
        getattr(importlib.import_module(module), factory)(*static)
        return f"{factory}{static}: {time.time() - t0:.1f} s"
    except Exception as exc:  # noqa: BLE001 (reported; the caller compiles it again and fails loudly)
        return f"{factory}{static}: FAILED {type(exc).__name__}: {str(exc)[:200]}"


def compile_in_processes(jobs, workers=None, report=print):
    """Compile ``getattr(module, factory)(*static)`` for each ``(module, factory, static)`` job in
    parallel processes, for the machine's own target, into TileLang's disk cache (TILELANG_CACHE_DIR),
    so a later run loads the kernels instead of compiling them one by one (spawned processes,
    ``_spawn_pool``). Returns the seconds taken."""
    jobs = list(dict.fromkeys(jobs))
    workers = workers or min(8, os.cpu_count() or 1)
    t0 = time.time()
    with _spawn_pool(workers) as ex:
        for line in ex.map(_compile_job, jobs):
            report(line)
    report(f"compiled {len(jobs)} kernels in {time.time() - t0:.1f} s with {workers} workers")
    return time.time() - t0
