"""Run one benchmark case per name twice, the second time inside an NVTX range ``prof``, so Nsight
Compute can profile just our kernels:

    ncu --nvtx --nvtx-include "prof/" --section SpeedOfLight --section WarpStateStats \
        python tools/profile_ncu.py kv_store:fp8 topk:b128 ...

Cases reuse the benchmark inputs (benchmarks/bench_*.py); no names: every case; ``--help`` lists them.
``--lineinfo`` compiles the kernels with ``-lineinfo`` (use a fresh TILELANG_CACHE_DIR) so ``ncu --page
source`` maps stalls to source lines, and at the end writes the CUDA source of every kernel the run compiled
to ``--src-dir`` (default .) as ``<factory>.<i>.cu``."""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from metadata.cache_format import (  # noqa: E402
    BF16_KV_FORMAT,
    FP4_INDEX_KV_FORMAT,
    FP4_MAIN_KV_FORMAT,
    FP8_MAIN_KV_FORMAT,
)


def _kv_store(fmt, hadamard, rows=1 << 20, config=None):
    from benchmarks.bench_kv_store import _inputs
    from tilelang_ops.kv_store import norm_rope_hadamard_cast_store

    kv, w, cos, sin, pos, slots, cache = _inputs(fmt, rows)
    return lambda: norm_rope_hadamard_cast_store(kv, w, 1e-6, cos, sin, pos, slots, cache, fmt,
                                                 hadamard=hadamard, config=config)


def _compress_store(fmt, config=None):
    from benchmarks.bench_compress_store import _prefill
    from tilelang_ops.compress_store import compress_store_prefill

    args, kw, _ = _prefill(256, fmt, norm=False)
    return lambda: compress_store_prefill(*args, **kw, config=config)


def _compress_store_decode(batch, q, variant=None):
    from benchmarks.bench_compress_store import _decode
    from tilelang_ops.compress_store import compress_store_decode, two_kernel_decode

    args, kw, _ = _decode(batch, q, FP8_MAIN_KV_FORMAT)
    if variant == "two_kernel":
        return lambda: two_kernel_decode(*args, **kw)
    return lambda: compress_store_decode(*args, **kw)


def _topk(b, n, k, dist="randn"):
    from tilelang_ops.testing.topk import make_scores
    from tilelang_ops.topk import topk

    x = make_scores(dist, b, n, device="cuda")
    return lambda: topk(x, k, return_value=False)


CASES = {
    "kv_store:fp8": lambda: _kv_store(FP8_MAIN_KV_FORMAT, False),
    "kv_store:fp4": lambda: _kv_store(FP4_MAIN_KV_FORMAT, False),
    "kv_store:index": lambda: _kv_store(FP4_INDEX_KV_FORMAT, True),
    "kv_store:bf16": lambda: _kv_store(BF16_KV_FORMAT, False),
    "compress_store:fp8": lambda: _compress_store(FP8_MAIN_KV_FORMAT),
    "compress_store:b64q6": lambda: _compress_store_decode(64, 6),
    "compress_store:b64q6_two_kernel": lambda: _compress_store_decode(64, 6, "two_kernel"),
    "compress_store:b4096q6": lambda: _compress_store_decode(4096, 6),
    "topk:b128": lambda: _topk(128, 131072, 2048),
    "topk:b64": lambda: _topk(64, 32768, 2048),
    "topk:b1": lambda: _topk(1, 65536, 2048),
    "topk:b64k512": lambda: _topk(64, 8192, 512),
    "topk:b128_equal": lambda: _topk(128, 131072, 2048, "equal"),
}


def _factories():
    """(name, factory) of every kernel factory (``@tilelang.jit``) in the profiled modules, each once."""
    import importlib

    seen = set()
    for mod in ("kv_store", "topk", "compress_store", "compress"):
        for name, obj in vars(importlib.import_module(f"tilelang_ops.{mod}")).items():
            if hasattr(obj, "compile_flags") and hasattr(obj, "get_tir") and id(obj) not in seen:
                seen.add(id(obj))
                yield name, obj


def _lineinfo() -> None:
    """Every kernel factory compiles with -lineinfo as well (set before its first compile). The flag is
    appended to the factory's own flags, not put in their place: some change the arithmetic (compress's
    ``--fmad=false``), and the profile must be of the kernel the product runs."""
    for _, factory in _factories():
        own = factory.compile_flags
        own = [] if own is None else [own] if isinstance(own, str) else list(own)
        if "-lineinfo" not in own:
            factory.compile_flags = own + ["-lineinfo"]  # a new list: factories may share theirs


def _dump_sources(out: str) -> None:
    """The CUDA source of every kernel compiled in this process (the factories' JIT caches), into ``out``."""
    os.makedirs(out, exist_ok=True)
    for name, factory in _factories():
        for i, kern in enumerate(factory._kernel_cache.values()):
            with open(os.path.join(out, f"{name}.{i}.cu"), "w") as f:
                f.write(kern.get_kernel_source())


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tools/profile_ncu.py",
        description="Run benchmark cases twice, the second time inside the NVTX range 'prof', for Nsight "
                    "Compute (ncu --nvtx --nvtx-include \"prof/\" ...). CUDA only.",
        epilog=f"cases: {', '.join(CASES)}")
    p.add_argument("cases", nargs="*", metavar="CASE", help="cases to profile (default: all)")
    p.add_argument("--lineinfo", action="store_true",
                   help="compile with -lineinfo (use a fresh TILELANG_CACHE_DIR) and write each compiled "
                        "kernel's CUDA source to --src-dir, for ncu --page source")
    p.add_argument("--src-dir", default=".", metavar="DIR",
                   help="where --lineinfo writes <factory>.<i>.cu (default: .)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        print(f"unknown case(s) {unknown}; known: {list(CASES)}")
        return 2
    if not torch.cuda.is_available():
        print("profile_ncu needs CUDA; nothing was run.")
        return 1
    if args.lineinfo:
        _lineinfo()
    for name in args.cases or list(CASES):
        fn = CASES[name]()
        fn()
        torch.cuda.synchronize()
        with torch.cuda.nvtx.range("prof"):
            fn()
        torch.cuda.synchronize()
        print(f"profiled {name}", flush=True)
        del fn
        torch.cuda.empty_cache()
    if args.lineinfo:
        _dump_sources(args.src_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
