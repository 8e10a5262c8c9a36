"""Timing of topk v3 split rows at MAX_SPLIT 1 / 4 / 8 (harness timing, L2 flushed)."""
import torch

import tilelang_ops.topk as tk
from benchmarks.harness import time_us
from tests.test_topk import make_scores

for b, n in ((1, 65536), (1, 131072), (4, 131072), (16, 131072), (8, 262144), (1, 1 << 20)):
    x = make_scores("randn", b, n, device="cuda")
    out = []
    for split in (1, 4, 8):
        tk.MAX_SPLIT = split
        if tk._launch_split(b, n, tk._cache_cap(n), torch.device("cuda")) != split:
            continue
        tk.topk(x, 2048, return_value=False)
        us = time_us(lambda x=x: tk.topk(x, 2048, return_value=False), flush_bytes=256 << 20)
        out.append(f"split{split}={us:.1f}")
    print(f"SPLIT b={b} n={n} k=2048 " + " ".join(out), flush=True)
