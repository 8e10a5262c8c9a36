"""Compile the fused compress_store kernels that the GPU tests and the benchmark launch, in parallel
processes, into TileLang's disk cache (TILELANG_CACHE_DIR), so that pytest and the benchmark load
them instead of compiling ~30 kernels one after another (~9 s each on the GPU machine). Optional:
everything works without it, only slower. Run it on the machine that runs the kernels (the cache key
includes the detected target), with the same TILELANG_CACHE_DIR:

    PYTHONPATH=. python tools/warm_compress_store_kernels.py [workers]
"""

from __future__ import annotations

import os
import sys

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
    kinds = {"p1": "compress_store_prefill_kernel", "p2": "compress_store_prefill_kernel_v2",
             "d1": "compress_store_decode_kernel", "d3": "compress_store_decode_kernel_v3"}
    out = []
    for prefill, fmt, inter, norm, wdt, idt in sorted(shapes):
        static = (fmt, 2, 64, inter, norm, wdt, idt, idt)
        if prefill:
            out.append(("p1", static + (cs.PREFILL_ROWS_PER_WARP, cs.WARPS)))
            for rows in (cs.V2_MANY_ROWS, 1):  # the large- and small-launch shapes the wrapper picks
                out.append(("p2", static + cs.v2_prefill_launch(rows)))
        else:
            out.append(("d1", static + (cs.DECODE_WARPS,)))
            out.append(("d3", static + (cs.V2_FAST,)))
    # the benchmark's COMPRESS_STORE_SWEEP shapes (1M FP8 tokens without out_norm)
    from benchmarks.bench_compress_store import PREFILL_SHAPES

    bench = ("fp8_main", 2, 64, True, False, "bfloat16", "int32", "int32")
    out += [("p2", bench + shape + (cs.V2_FAST,)) for shape in PREFILL_SHAPES]
    return [("tilelang_ops.compress_store", kinds[kind], static) for kind, static in dict.fromkeys(out)]


if __name__ == "__main__":
    from tilelang_ops.build import compile_in_processes

    compile_in_processes(configs(), int(sys.argv[1]) if len(sys.argv) > 1 else None,
                         report=lambda line: print(line, flush=True))
