"""topk benchmarks: the TileLang radix select vs torch.topk (the peer, also reported as eager).

`us` is the default kernel variant (tilelang_ops.topk.TOPK_VARIANT); every other variant (the
GPU-verified fallback "v1") is timed on the same input and reported as a peer under its name (x_v1 > 1:
the default is faster).

Bytes = b * n * bytes per score (one read of the scores; the k outputs are negligible). Each shape runs
for randn and for the adversarial distributions (case suffix), since a radix select's speed depends on
how the keys spread over the digits.
"""

from __future__ import annotations

import contextlib

import torch

import tilelang_ops.topk as topk_mod
from benchmarks.harness import time_us
from tilelang_ops.topk import topk, topk_to_slots

OP = "topk"
# the four shapes, then many short rows (a prefill's queries against a short context)
SHAPES = [(128, 131072, 2048), (64, 32768, 2048), (1, 65536, 2048), (64, 8192, 512), (4096, 2048, 512),
          (4096, 1000, 512)]
DISTS = {"": "randn", "_conc": "conc", "_tiny": "tiny", "_equal": "equal", "_few": "few",
         "_sorted": "sorted"}
PEER_VARIANTS = topk_mod.VARIANTS  # timed next to the default, all but the default itself


def _scores(dist, b, n):
    from tests.test_topk import make_scores

    return make_scores(dist, b, n, device="cuda")


@contextlib.contextmanager
def _variant(name):
    saved = topk_mod.TOPK_VARIANT
    topk_mod.TOPK_VARIANT = name
    try:
        yield
    finally:
        topk_mod.TOPK_VARIANT = saved


@contextlib.contextmanager
def forced_threads(threads):
    """v3 launches `threads` per CTA on every row it does not split (instead of _v3_threads's choice; 32:
    one warp per row)."""
    saved = topk_mod._v3_threads
    topk_mod._v3_threads = lambda b, n, cache_cap, sms: threads
    try:
        yield
    finally:
        topk_mod._v3_threads = saved


def split_times(fn, b, n, splits, flush) -> dict:
    """Times of fn with tilelang_ops.topk.MAX_SPLIT set to each of `splits`, for those where the wrapper
    then launches exactly that many CTAs per row on b rows of n entries (keys "split<S>")."""
    out = {}
    saved = topk_mod.MAX_SPLIT
    try:
        for split in splits:
            topk_mod.MAX_SPLIT = split
            if topk_mod._launch(b, n, torch.device("cuda"))["split"] == split:
                out[f"split{split}"] = time_us(fn, flush_bytes=flush)
    finally:
        topk_mod.MAX_SPLIT = saved
    return out


def _peers(fn, flush, b, n) -> dict:
    """Times of fn under each peer variant that is not the default (keys: the variant names); where v3
    splits these rows over a cluster, v3 on one CTA per row ("split1") and on half the default's largest
    split ("split4" with MAX_SPLIT = 8); where v3 launches fewer threads per CTA than the full CTA,
    v3 on the other two of one warp per row, 256-thread and 1024-thread CTAs ("threads32", "threads256",
    "threads1024")."""
    out = {}
    for name in PEER_VARIANTS:
        if name != topk_mod.TOPK_VARIANT:
            with _variant(name):
                out[name] = time_us(fn, flush_bytes=flush)
    launch = topk_mod._launch(b, n, torch.device("cuda"))
    if launch["split"] > 1:
        out.update(split_times(fn, b, n, (1, topk_mod.MAX_SPLIT // 2), flush))
    if launch["threads"] != topk_mod.THREADS:
        for threads in (32, topk_mod.SHORT_ROW_THREADS, topk_mod.THREADS):
            if threads == launch["threads"]:
                continue
            with forced_threads(threads):
                out[f"threads{threads}"] = time_us(fn, flush_bytes=flush)
    return out


def run(h) -> None:
    for b, n, k in SHAPES:
        for suffix, dist in DISTS.items():
            x = _scores(dist, b, n)
            case = f"b{b}n{n}k{k}{suffix}"
            flush = 256 << 20  # scores are re-read from HBM each launch, not from L2
            us = time_us(lambda x=x, k=k: topk(x, k, return_value=False), flush_bytes=flush)
            peers = _peers(lambda x=x, k=k: topk(x, k, return_value=False), flush, b, n)
            torch_us = time_us(lambda x=x, k=k: torch.topk(x, k, dim=1, sorted=False), flush_bytes=flush)
            h.report(OP, case, b * n * x.element_size(), us, eager_us=torch_us,
                     peers={**peers, "torch_topk": torch_us})
    # the fused scores -> slots path on the decode shape
    b, n, k = 64, 32768, 2048
    x = _scores("randn", b, n)
    table = torch.randint(0, 100000, (b, n // 64 + 1), dtype=torch.int32, device="cuda")
    end = torch.full((b,), n, dtype=torch.int32, device="cuda")
    slots = lambda: topk_to_slots(x, k, end=end, block_size_c=64, block_tables=table)  # noqa: E731
    us = time_us(slots, flush_bytes=256 << 20)
    peers = _peers(slots, 256 << 20, b, n)
    torch_us = time_us(lambda: torch.topk(x, k, dim=1, sorted=False), flush_bytes=256 << 20)
    h.report(OP, f"slots_b{b}n{n}k{k}", b * n * 4, us, eager_us=torch_us,
             peers={**peers, "torch_topk": torch_us})
