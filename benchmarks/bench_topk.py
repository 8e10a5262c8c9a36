"""topk benchmarks: the TileLang radix select vs torch.topk (the peer, also reported as eager).

`us` is the default configuration (`tilelang_ops.topk.launch.topk_config`); where the launch rule splits
rows over a cluster or picks a smaller CTA, the alternatives are timed on the same input and reported as
peers (split1 / split4, threads32 (a warp per row) / threads256 / threads1024; x_peer > 1: the default is
faster).

Bytes = b * n * bytes per score (one read of the scores; the k outputs are negligible). Each shape runs
for randn and for the adversarial distributions (case suffix), since a radix select's speed depends on
how the keys spread over the digits.
"""

from __future__ import annotations

import torch

from benchmarks.harness import time_us
from tilelang_ops.testing.topk import make_scores
from tilelang_ops.topk import TopkConfig, topk, topk_to_slots
from tilelang_ops.topk.launch import MAX_SPLIT, default_config, tile_unroll

OP = "topk"
# the four shapes, then many short rows (a prefill's queries against a short context)
SHAPES = [(128, 131072, 2048), (64, 32768, 2048), (1, 65536, 2048), (64, 8192, 512), (4096, 2048, 512),
          (4096, 1000, 512)]
DISTS = {"": "randn", "_conc": "conc", "_tiny": "tiny", "_equal": "equal", "_few": "few",
         "_sorted": "sorted"}


def _scores(dist, b, n):
    return make_scores(dist, b, n, device="cuda")


def alternatives(b: int, n: int) -> dict[str, TopkConfig]:
    """The configs timed next to the default for b rows of n FP32 entries (keys: peer names): one CTA a
    row and half the largest split where the rule splits; the warp kernel and the 256- and 1024-thread CTAs
    (tile kernel where the row fits one tile) where it picks fewer threads than the full CTA."""
    config = default_config(b, n, 4, torch.device("cuda"))
    out = {}
    if config.split > 1:
        out["split1"] = TopkConfig()
        if config.split != MAX_SPLIT // 2:
            out[f"split{MAX_SPLIT // 2}"] = TopkConfig(split=MAX_SPLIT // 2)
    if config.kernel == "warp" or config.threads != 1024:
        for threads in (32, 256, 1024):
            if threads == 32:
                alt = TopkConfig("warp")
            elif tile_unroll(n, threads):
                alt = TopkConfig("tile", threads, unroll=tile_unroll(n, threads))
            else:
                alt = TopkConfig("row", threads)
            if alt != config:
                out[f"threads{threads}"] = alt
    return out


def _peers(fn, flush, b, n) -> dict:
    """Times of fn(config) for each of `alternatives(b, n)`."""
    return {name: time_us(lambda c=c: fn(c), flush_bytes=flush) for name, c in alternatives(b, n).items()}


def run(h) -> None:
    for b, n, k in SHAPES:
        for suffix, dist in DISTS.items():
            x = _scores(dist, b, n)
            case = f"b{b}n{n}k{k}{suffix}"
            flush = 256 << 20  # scores are re-read from HBM each launch, not from L2
            us = time_us(lambda x=x, k=k: topk(x, k, return_value=False), flush_bytes=flush)
            peers = _peers(lambda c, x=x, k=k: topk(x, k, return_value=False, config=c), flush, b, n)
            torch_us = time_us(lambda x=x, k=k: torch.topk(x, k, dim=1, sorted=False), flush_bytes=flush)
            h.report(OP, case, b * n * x.element_size(), us, eager_us=torch_us,
                     peers={**peers, "torch_topk": torch_us})
    # the fused scores -> slots path on the decode shape
    b, n, k = 64, 32768, 2048
    x = _scores("randn", b, n)
    table = torch.randint(0, 100000, (b, n // 64 + 1), dtype=torch.int32, device="cuda")
    end = torch.full((b,), n, dtype=torch.int32, device="cuda")
    slots = lambda c=None: topk_to_slots(x, k, end=end, block_size_c=64, block_tables=table, config=c)  # noqa: E731
    us = time_us(slots, flush_bytes=256 << 20)
    peers = _peers(slots, 256 << 20, b, n)
    torch_us = time_us(lambda: torch.topk(x, k, dim=1, sorted=False), flush_bytes=256 << 20)
    h.report(OP, f"slots_b{b}n{n}k{k}", b * n * 4, us, eager_us=torch_us,
             peers={**peers, "torch_topk": torch_us})
