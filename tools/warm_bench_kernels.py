"""Compile the kernels that `python -m benchmarks kv_store topk` launches (the default and the variant
peers; topk's split / thread-count peers still compile during the benchmark), in parallel processes,
into TileLang's disk cache (TILELANG_CACHE_DIR), so the benchmark loads them instead of compiling ~30
kernels one after another (~9-18 s each on the GPU machine).
Optional, like tools/warm_compress_store_kernels.py (which covers compress_store); run it on the
machine that runs the kernels, with the same TILELANG_CACHE_DIR:

    PYTHONPATH=. python tools/warm_bench_kernels.py [workers]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


FACTORIES = {"v1": "kv_store_kernel", "v2": "kv_store_kernel_v2", "v3": "kv_store_kernel_v3"}


def _kv_static(variant, fmt, hadamard, rows):
    """The static arguments of bench_kv_store's launch (what norm_rope_hadamard_cast_store passes)."""
    import tilelang_ops.kv_store as K
    from benchmarks.bench_kv_store import ROWS_PER_BLOCK

    return K.static_args(variant, fmt, (fmt.name, 64, True, hadamard, False,
                                        ROWS_PER_BLOCK if fmt.block_sections else 1, "bfloat16", "int64",
                                        "int64", K.rows_per_thread(fmt, rows, variant)))


def configs():
    import tilelang_ops.kv_store as K
    import tilelang_ops.topk as topk_mod
    from benchmarks.bench_kv_store import FORMATS, PLAIN_ENV, ROWS, _env
    from benchmarks.bench_topk import PEER_VARIANTS, SHAPES

    kv, tk = "tilelang_ops.kv_store", "tilelang_ops.topk"
    out = []
    for fmt, hadamard in FORMATS:  # the default variant, the v2 peer and the v3plain peer, every row count
        for rows in ROWS:
            for variant in dict.fromkeys((K.VARIANT, "v2")):
                out.append((kv, FACTORIES[variant], _kv_static(variant, fmt, hadamard, rows)))
            with _env(**PLAIN_ENV):  # the v3plain peer
                out.append((kv, FACTORIES["v3"], _kv_static("v3", fmt, hadamard, rows)))
    variants = dict.fromkeys((topk_mod.TOPK_VARIANT,) + PEER_VARIANTS)

    # what topk_mod._topk_jit compiles for b x n FP32 rows on the H200 (132 SMs; the L2 size decides the
    # streaming reads, read from this machine's GPU)
    import torch

    l2 = topk_mod._l2_bytes(torch.device("cuda")) if torch.cuda.is_available() else 0

    def topk_jit(static, v, b, n):
        launch = topk_mod._v3_launch(b, n, 132, 4, l2) if v == "v3" else {}
        return (tk, *topk_mod._jit_args(*static, v, **launch))

    for b, n, _ in SHAPES:
        cap = topk_mod._cache_cap(n)
        for v in variants:  # topk(x, k, return_value=False) on fp32 rows
            static = ("float32", "int32", "int32", cap, False, False, -1, float("-inf"), "topk", 0, 1)
            out.append(topk_jit(static, v, b, n))
    for v in variants:  # the fused scores -> slots case (64 x 32768, block 64)
        cap = topk_mod._cache_cap(32768)
        static = ("float32", "int32", "int32", cap, False, False, -1, float("-inf"), "slots", 0, 64)
        out.append(topk_jit(static, v, 64, 32768))
    return list(dict.fromkeys(out))


if __name__ == "__main__":
    from tilelang_ops.build import compile_in_processes

    compile_in_processes(configs(), int(sys.argv[1]) if len(sys.argv) > 1 else None,
                         report=lambda line: print(line, flush=True))
