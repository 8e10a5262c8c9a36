"""Device time of topk (the default variant) against torch.topk over the issue's shape matrix, randn fp32
scores, k = 512 and 2048: b in {1, 7, 64, 128, 4096} x n in {100, 2048, 8192, 65536, 131072, 1M} (the
b x n products above 2^29 entries, 2 GiB of scores, are left out). The benchmark (`make bench`) times
four shapes in depth; this shows there is no shape in between where the kernel falls behind. CUDA only:

    python tools/sweep_topk.py [fp32|bf16]

One line per shape: `SWEEP b=.. n=.. k=.. split=.. us=.. torch_topk_us=.. x_torch=..` (x_torch > 1: ours
is faster), timed like the benchmark (L2 flushed before each launch).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import tilelang_ops.topk as topk_mod  # noqa: E402
from benchmarks.harness import time_us  # noqa: E402

BATCHES = (1, 7, 64, 128, 4096)
LENGTHS = (100, 2048, 8192, 65536, 131072, 1 << 20)
KS = (512, 2048)
MAX_ENTRIES = 1 << 29


def main(dtype_name: str = "fp32") -> None:
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    dev = torch.device("cuda")
    for b in BATCHES:
        for n in LENGTHS:
            if b * n > MAX_ENTRIES:
                continue
            x = torch.randn(b, n, device="cuda", generator=gen).to(dtype)
            for k in KS:
                if k > n:
                    continue
                split = topk_mod._launch_split(b, n, topk_mod._cache_cap(n), dev)
                us = time_us(lambda x=x, k=k: topk_mod.topk(x, k, return_value=False), flush_bytes=256 << 20)
                t_us = time_us(lambda x=x, k=k: torch.topk(x, k, dim=1, sorted=False), flush_bytes=256 << 20)
                print(f"SWEEP {dtype_name} b={b} n={n} k={k} split={split} us={us:.1f} "
                      f"torch_topk_us={t_us:.1f} x_torch={t_us / us:.2f}", flush=True)
            del x
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main(*sys.argv[1:])
