"""Device time of topk v3 (fp32 randn rows, k = 2048, indices only) with rows split over 1, 4 and 8 CTAs,
for shapes beyond the benchmark's (the timings behind tilelang_ops.topk._v3_split). CUDA only:

    python tools/time_topk_split.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tilelang_ops.topk as tk  # noqa: E402
from benchmarks.bench_topk import split_times  # noqa: E402
from tests.test_topk import make_scores  # noqa: E402

if __name__ == "__main__":
    for b, n in ((1, 65536), (1, 131072), (4, 131072), (16, 131072), (8, 262144), (1, 1 << 20)):
        x = make_scores("randn", b, n, device="cuda")
        times = split_times(lambda x=x: tk.topk(x, 2048, return_value=False), b, n, (1, 4, 8), 256 << 20)
        print(f"SPLIT b={b} n={n} k=2048", *(f"{key}={us:.1f}" for key, us in times.items()), flush=True)
