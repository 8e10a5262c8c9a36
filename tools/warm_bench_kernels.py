"""Compile the kernels that `python -m benchmarks kv_store topk` launches (every variant the benchmark
times), in parallel processes, into TileLang's disk cache (TILELANG_CACHE_DIR), so the benchmark
loads them instead of compiling ~30 kernels one after another (~9-18 s each on the GPU machine).
Optional, like tools/warm_compress_store_kernels.py (which covers compress_store); run it on the
machine that runs the kernels, with the same TILELANG_CACHE_DIR:

    PYTHONPATH=. python tools/warm_bench_kernels.py [workers]
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def configs():
    import tilelang_ops.kv_store as K
    import tilelang_ops.topk as topk_mod
    from benchmarks.bench_kv_store import FORMATS, OPTION_PEERS, ROWS, ROWS_PER_BLOCK
    from benchmarks.bench_topk import PEER_VARIANTS, SHAPES

    out = []
    for fmt, hadamard in FORMATS:  # the default variant and the v2 peer, every row count's R
        for rows in ROWS:
            for variant in dict.fromkeys((K.VARIANT, "v2")):
                static = (fmt.name, 64, True, hadamard, False, ROWS_PER_BLOCK if fmt.block_sections else 1,
                          "bfloat16", "int64", "int64", K.rows_per_thread(fmt, rows, variant))
                out.append(("kv_store", variant, K.static_args(variant, fmt, static)))
            if fmt.name in OPTION_PEERS:  # peer v3opt: v3 with the format's cast option on
                static = (fmt.name, 64, True, hadamard, False, ROWS_PER_BLOCK if fmt.block_sections else 1,
                          "bfloat16", "int64", "int64", K.rows_per_thread(fmt, rows, "v3"))
                os.environ["KV_STORE_V3_OPTIONS"] = OPTION_PEERS[fmt.name]
                try:
                    out.append(("kv_store", "v3", K.static_args("v3", fmt, static)))
                finally:
                    del os.environ["KV_STORE_V3_OPTIONS"]
    variants = dict.fromkeys((topk_mod.TOPK_VARIANT,) + PEER_VARIANTS)
    for cap in sorted({topk_mod._cache_cap(n) for _, n, _ in SHAPES}):
        for v in variants:  # topk(x, k, return_value=False) on fp32 rows
            out.append(("topk", v, ("float32", "int32", "int32", cap, False, False, -1, float("-inf"), "topk",
                                    0, 1, v)))
    for v in variants:  # the fused scores -> slots case (64 x 32768, block 64)
        out.append(("topk", v, ("float32", "int32", "int32", topk_mod._cache_cap(32768), False, False, -1,
                                float("-inf"), "slots", 0, 64, v)))
    return list(dict.fromkeys(out))


def compile_one(item):
    op, variant, static = item
    t0 = time.time()
    try:
        if op == "kv_store":
            import tilelang_ops.kv_store as K

            K.KERNELS[variant](*static)
        else:
            from tilelang_ops.topk import _topk_jit

            _topk_jit(*static)
        return f"{op} {variant} {static}: {time.time() - t0:.1f} s"
    except Exception as exc:  # noqa: BLE001 (reported; the benchmark compiles it again and fails loudly)
        return f"{op} {variant} {static}: FAILED {type(exc).__name__}: {str(exc)[:200]}"


if __name__ == "__main__":
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else min(8, os.cpu_count() or 1)
    items = configs()
    t0 = time.time()
    spawn = multiprocessing.get_context("spawn")  # no CUDA context may be inherited by a fork
    with ProcessPoolExecutor(max_workers=workers, mp_context=spawn) as ex:
        for line in ex.map(compile_one, items):
            print(line, flush=True)
    print(f"warmed {len(items)} kernels in {time.time() - t0:.1f} s with {workers} workers")
