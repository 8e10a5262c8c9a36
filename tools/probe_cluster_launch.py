"""Device time of an almost empty 1024-thread launch, plain vs thread block clusters, with and without
cluster barriers, and with dynamic shared memory of 0 to 220 KiB (the topk benchmark's harness timing).
CUDA only:

    python tools/probe_cluster_launch.py

Measured on the H200 (bench_results/h200.txt): 2.8-3.0 us plain, +0.15 us as clusters of 2 or 4, +0.33 us
per cluster barrier (a CTA barrier: ~0.02 us), which is why topk v3 splits rows only for small batches;
the shared memory size does not change the cost (3.17 us from 8 to 220 KiB at 64 rows).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tilelang  # noqa: E402
import tilelang.language as T  # noqa: E402
import torch  # noqa: E402

from benchmarks.harness import time_us  # noqa: E402
from tilelang_ops.topk import CLUSTER_PRELUDE  # noqa: E402


@tilelang.jit
def probe(cluster: int, syncs: int, smem_words: int = 0):
    b = T.dynamic("b")

    @T.prim_func
    def k(x: T.Tensor((b,), "int32")):
        with T.Kernel(b * cluster, threads=1024, prelude=CLUSTER_PRELUDE if cluster > 1 else None,
                      cluster_dims=cluster if cluster > 1 else None) as bx:
            tx = T.get_thread_binding()
            if smem_words:  # a shared buffer of this size that is really used (not optimized away)
                s = T.alloc_shared([smem_words], "int32")
                s[tx] = tx
                T.sync_threads()
                x[bx // cluster] = s[smem_words - 1 - tx]
            for _ in T.serial(syncs):
                if cluster > 1:
                    T.call_extern("uint32", "tl_topk_cluster_arrive")
                    T.call_extern("uint32", "tl_topk_cluster_wait")
                else:
                    T.sync_threads()
            if tx == 0:
                x[bx // cluster] = bx
    return k


if __name__ == "__main__":
    for rows in (1, 33, 64):
        x = torch.zeros(rows, dtype=torch.int32, device="cuda")
        for cl in (1, 2, 4):
            if rows * cl > 132:
                continue
            for syncs in (0, 1, 3):
                kern = probe(cl, syncs)
                us = time_us(lambda kern=kern, x=x: kern(x), flush_bytes=256 << 20)
                print(f"PROBE rows={rows} cluster={cl} syncs={syncs} us={us:.2f}", flush=True)
    # the launch cost of the dynamic shared memory size alone (one 1024-thread CTA per row)
    for rows in (64, 128):
        x = torch.zeros(rows, dtype=torch.int32, device="cuda")
        for kib in (0, 8, 32, 64, 96, 160, 220):
            kern = probe(1, 0, kib * 256)
            us = time_us(lambda kern=kern, x=x: kern(x), flush_bytes=256 << 20)
            print(f"PROBE rows={rows} smem_kib={kib} us={us:.2f}", flush=True)
