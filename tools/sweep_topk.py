"""Device time of topk (the default variant) against torch.topk over the issue's shape matrix, randn
scores, k = 512 and 2048: b in {1, 7, 64, 128, 4096} x n in {100, 2048, 8192, 65536, 131072, 1M} (the
b x n products above 2^29 entries, 2 GiB of fp32 scores, are left out). The benchmark (`make bench`) times
four shapes in depth; this shows there is no shape in between where the kernel falls behind. CUDA only:

    python tools/sweep_topk.py [--dtype fp32|bf16] [--batches 1,7,...] [--lengths 100,...] [--ks 512,2048]
                               [--threads 256,512,1024]

One line per shape: `SWEEP fp32 b=.. n=.. k=.. split=.. threads=.. us=.. torch_topk_us=.. x_torch=..`
(x_torch > 1: ours is faster), timed like the benchmark (L2 flushed before each launch). `--threads` also
times v3 with each of those thread counts per CTA on rows the wrapper does not split (`t<N>_us=..`; 32: one
warp per row, topk_kernel_warp): the measurement behind tilelang_ops.topk._v3_threads.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import tilelang_ops.topk as topk_mod  # noqa: E402
from benchmarks.bench_topk import forced_threads  # noqa: E402
from benchmarks.harness import time_us  # noqa: E402

MAX_ENTRIES = 1 << 29


def _ints(text):
    return [int(v) for v in text.split(",") if v]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--batches", type=_ints, default=[1, 7, 64, 128, 4096])
    ap.add_argument("--lengths", type=_ints, default=[100, 2048, 8192, 65536, 131072, 1 << 20])
    ap.add_argument("--ks", type=_ints, default=[512, 2048])
    ap.add_argument("--threads", type=_ints, default=[])
    a = ap.parse_args(argv)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    gen = torch.Generator(device="cuda").manual_seed(0)
    dev = torch.device("cuda")
    flush = 256 << 20
    for b in a.batches:
        for n in a.lengths:
            if b * n > MAX_ENTRIES:
                continue
            x = torch.randn(b, n, device="cuda", generator=gen).to(dtype)
            for k in a.ks:
                if k > n:
                    continue
                launch = topk_mod._launch(b, n, dev)
                run = lambda x=x, k=k: topk_mod.topk(x, k, return_value=False)  # noqa: E731
                us = time_us(run, flush_bytes=flush)
                forced = ""
                if launch["split"] == 1:
                    for t in a.threads:
                        with forced_threads(t):
                            forced += f" t{t}_us={time_us(run, flush_bytes=flush):.1f}"
                t_us = time_us(lambda x=x, k=k: torch.topk(x, k, dim=1, sorted=False), flush_bytes=flush)
                print(f"SWEEP {a.dtype} b={b} n={n} k={k} split={launch['split']} "
                      f"threads={launch['threads']} us={us:.1f}{forced} torch_topk_us={t_us:.1f} "
                      f"x_torch={t_us / us:.2f}", flush=True)
            del x
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
