"""Compile the fused compress_store kernels that the GPU tests and the benchmark launch, in parallel
processes, into TileLang's disk cache (TILELANG_CACHE_DIR), so that pytest and the benchmark load
them instead of compiling ~30 kernels one after another (~9 s each on the GPU machine). Optional:
everything works without it, only slower. Run it on the machine that runs the kernels (the cache key
includes the detected target), with the same TILELANG_CACHE_DIR:

    PYTHONPATH=. python tools/warm_compress_store_kernels.py [workers]
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def configs():
    import tilelang_ops.compress_store as cs
    from tests.test_compress_store import GPU_CASES

    # (prefill?, fmt, interleaved, out_norm, weight dtype, index dtype) of every launch
    shapes = {(c.prefill, c.fmt, c.interleaved, c.out_norm, "float32" if c.weight_fp32 else "bfloat16",
               "int64" if c.index64 else "int32") for c in GPU_CASES}
    shapes |= {(True, f, True, n, "bfloat16", "int32") for f, n in (("fp8_main", False), ("fp8_main", True),
                                                                     ("fp4_main", False))}  # benchmark
    shapes |= {(False, "fp8_main", True, True, "bfloat16", "int32")}
    out = []
    for prefill, fmt, inter, norm, wdt, idt in sorted(shapes):
        static = (fmt, 2, 64, inter, norm, wdt, idt, idt)
        if prefill:
            out.append(("p1", static + (cs.PREFILL_ROWS_PER_WARP, cs.WARPS)))
            for rpw in sorted({cs.V2_ROWS_PER_WARP, max(1, cs.V2_ROWS_PER_WARP // 2)}):
                out.append(("p2", static + (rpw, cs.V2_WARPS, cs.V2_MIN_CTAS_PER_SM, cs.V2_FAST)))
            out.append(("p3", static + (cs.V3_MIN_CTAS_PER_SM, cs.V2_FAST)))
        else:
            out.append(("d1", static + (cs.DECODE_WARPS,)))
            out += [("d2", static + (cs.V2_DECODE_WARPS, early, cs.V2_FAST)) for early in (False, True)]
            out.append(("d3", static + (cs.V2_FAST,)))
    # the benchmark's COMPRESS_STORE_SWEEP shapes (1M FP8 tokens without out_norm, b4096q6)
    from benchmarks.bench_compress_store import DECODE_SHAPES, PREFILL_SHAPES

    bench = ("fp8_main", 2, 64, True, False, "bfloat16", "int32", "int32")
    out += [("p2", bench + shape) for shape in PREFILL_SHAPES]
    dec = ("fp8_main", 2, 64, True, True, "bfloat16", "int32", "int32")
    out += [("d2", dec + (w, False)) for w in DECODE_SHAPES]
    return list(dict.fromkeys(out))


def compile_one(item):
    import tilelang_ops.compress_store as cs

    kind, static = item
    factory = {"p1": cs.compress_store_prefill_kernel, "p2": cs.compress_store_prefill_kernel_v2,
               "d1": cs.compress_store_decode_kernel, "d2": cs.compress_store_decode_kernel_v2,
               "p3": cs.compress_store_prefill_kernel_v3, "d3": cs.compress_store_decode_kernel_v3}[kind]
    t0 = time.time()
    try:
        factory(*static)
        return f"{kind} {static}: {time.time() - t0:.1f} s"
    except Exception as exc:  # noqa: BLE001 (reported; the test run compiles it again and fails loudly)
        return f"{kind} {static}: FAILED {type(exc).__name__}: {str(exc)[:200]}"


if __name__ == "__main__":
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else min(8, os.cpu_count() or 1)
    items = configs()
    t0 = time.time()
    spawn = multiprocessing.get_context("spawn")  # importing the tests may have initialized CUDA (no fork)
    with ProcessPoolExecutor(max_workers=workers, mp_context=spawn) as ex:
        for line in ex.map(compile_one, items):
            print(line, flush=True)
    print(f"warmed {len(items)} kernels in {time.time() - t0:.1f} s with {workers} workers")
