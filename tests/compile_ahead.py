"""Compile, in parallel processes, every kernel specialization the GPU tests launch, before they run.

`make test` on a CUDA machine runs this first, then pytest in parallel workers: the workers load the
kernels from TileLang's disk cache (TILELANG_CACHE_DIR) instead of each compiling them one by one. Every
test module with GPU kernel tests defines ``gpu_compile_jobs(props) -> [(module, function, static args)]``.

    python -m tests.compile_ahead [tests/test_x.py ...]   (default: every tests/test_*.py)
"""

from __future__ import annotations

import glob
import importlib
import os
import sys


def collect_jobs(paths, props) -> list[tuple]:
    jobs = []
    for path in paths:
        mod = importlib.import_module("tests." + os.path.splitext(os.path.basename(path))[0])
        if hasattr(mod, "gpu_compile_jobs"):
            jobs += mod.gpu_compile_jobs(props)
    return list(dict.fromkeys(jobs))


def main(argv) -> int:
    import torch

    from tilelang_ops.build import compile_in_processes

    if not torch.cuda.is_available():
        print("compile_ahead: no CUDA here, nothing to compile")
        return 0
    here = os.path.dirname(os.path.abspath(__file__))
    paths = argv or sorted(glob.glob(os.path.join(here, "test_*.py")))
    jobs = collect_jobs(paths, torch.cuda.get_device_properties(0))
    failed = []

    def report(line):
        if "FAILED" in line:
            failed.append(line)
            print(line, flush=True)

    seconds = compile_in_processes(jobs, workers=os.cpu_count(), report=report)
    print(f"compile_ahead: {len(jobs)} kernel specializations in {seconds:.0f} s"
          + (f", {len(failed)} failed (the tests will report them)" if failed else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
