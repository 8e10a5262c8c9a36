"""Top-k tuning: `TopkConfig` (every knob of a launch) and the launch rule that picks the default one for a
call's shape and device. The reasons and measured bounds behind the rule are in docs/design.md, "## topk"."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tilelang_ops.topk.macros import (
    MAX_CACHE,
    SHORT_ROW_THREADS,
    SMALL_CACHE,
    THREADS,
    TILE,
    UNROLL,
    cand_cap,
)
from tilelang_ops.topk.warp import WARP_ROWS

KERNELS = ("row", "tile", "warp")
MAX_SPLIT = 8  # CTAs per split row at most
STREAM_L2_FRACTION = 0.5  # unsplit uncached launches reading at least this much of the L2 stream
WARP_ROW_MAX = 1024  # the longest rows given a warp (beyond, the tile kernel wins at any batch)
WARP_DIV = 104  # a warp per row from n / WARP_DIV rows per SM
TILE_MAX_UNROLL = 16  # 256 threads x 16 keys: rows of the short tier on 256-thread CTAs


@dataclass(frozen=True)
class TopkConfig:
    """One top-k launch. kernel: "row" (`row.row_kernel`, any row length), "tile" (`tile.tile_kernel`, rows
    of at most threads * unroll entries) or "warp" (`warp.warp_kernel`, a warp per row); threads: per CTA of
    the row and tile kernels (256, 512 or 1024; the warp kernel has rows_per_cta warps); split: CTAs per row
    of the row kernel (a cluster when > 1, 1024 threads); stream: the row kernel's compaction reads with the
    L2 evict-first policy; unroll: keys a thread of the tile kernel (8 or 16); rows_per_cta: of the warp
    kernel. The row kernel's tier (cache_cap) follows from the row length (`cache_tier`)."""

    kernel: str = "row"
    threads: int = THREADS
    split: int = 1
    stream: bool = False
    unroll: int = UNROLL
    rows_per_cta: int = WARP_ROWS

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(f"config.kernel must be one of {KERNELS}, got {self.kernel!r}")
        if self.threads not in (256, 512, 1024):
            raise ValueError(f"config.threads must be 256, 512 or 1024, got {self.threads}")
        if self.split not in (1, 2, 4, 8):
            raise ValueError(f"config.split must be 1, 2, 4 or 8, got {self.split}")
        if self.split > 1 and (self.kernel != "row" or self.threads != THREADS):
            raise ValueError(f"config.split > 1 needs the row kernel on {THREADS} threads, got {self}")
        if self.stream and self.kernel != "row":
            raise ValueError(f"config.stream needs the row kernel, got {self}")
        if self.unroll not in (8, 16):
            raise ValueError(f"config.unroll must be 8 or 16, got {self.unroll}")
        if self.rows_per_cta < 1:
            raise ValueError(f"config.rows_per_cta must be >= 1, got {self.rows_per_cta}")

    def check_row_length(self, n: int) -> None:
        """A tile kernel takes rows of at most threads * unroll entries."""
        if self.kernel == "tile" and n > self.threads * self.unroll:
            raise ValueError(f"config {self} takes rows of at most {self.threads * self.unroll} entries, "
                             f"got n={n}")


def cache_tier(n: int) -> int:
    """The row kernel's tier for rows of n entries (its `cache_cap`): 0 beyond MAX_CACHE, else SMALL_CACHE
    or MAX_CACHE; three tiers, so few kernels compile."""
    if n > MAX_CACHE:
        return 0
    return SMALL_CACHE if n <= SMALL_CACHE else MAX_CACHE


def tile_unroll(n: int, threads: int) -> int:
    """Keys a thread of the tile kernel for rows of n entries on `threads` threads: UNROLL, or the power of
    two above that covers the row (0: the row is more than one tile)."""
    if n > TILE:
        return 0
    u = UNROLL
    while threads * u < n and u < TILE_MAX_UNROLL:
        u *= 2
    return u if threads * u >= n else 0


def split_rows(b: int, n: int, sms: int, max_split: int = MAX_SPLIT) -> int:
    """CTAs per row: the most, up to max_split, such that the b rows' CTAs take at most half the SMs (one
    1024-thread CTA per SM); 1 for rows that are never sampled (n <= the candidate capacity)."""
    if n <= cand_cap(cache_tier(n)):
        return 1
    split = max_split
    while split > 1 and b * split > sms // 2:
        split //= 2
    return split


def row_threads(b: int, n: int, sms: int) -> int:
    """Threads per CTA of an unsplit row, or 32: one warp per row. A warp per row when rows are at most
    WARP_ROW_MAX entries and there are at least n / WARP_DIV of them per SM; else SHORT_ROW_THREADS for rows
    of the short tier when there are more rows than SMs (three CTAs share an SM), else THREADS."""
    if n <= WARP_ROW_MAX and b * WARP_DIV >= n * sms:
        return 32
    return SHORT_ROW_THREADS if cache_tier(n) == SMALL_CACHE and b > sms else THREADS


def topk_config(b: int, n: int, itemsize: int, sms: int, l2_bytes: int = 0) -> TopkConfig:
    """The launch rule: the default config for b rows of n entries of `itemsize` bytes on `sms` SMs and an
    L2 of `l2_bytes` (0: unknown, never stream)."""
    split = split_rows(b, n, sms)
    if split > 1:
        return TopkConfig("row", THREADS, split)
    threads = row_threads(b, n, sms)
    if threads == 32:
        return TopkConfig("warp")
    unroll = tile_unroll(n, threads)
    if unroll:
        return TopkConfig("tile", threads, unroll=unroll)
    stream = (cache_tier(n) == 0 and threads == THREADS and l2_bytes > 0
              and b * n * itemsize >= STREAM_L2_FRACTION * l2_bytes)
    return TopkConfig("row", threads, stream=stream)


_PROPS = {}


def device_props(device):
    """The device's properties, looked up once per device (the launch rule reads them on every call)."""
    if device not in _PROPS:
        _PROPS[device] = torch.cuda.get_device_properties(device)
    return _PROPS[device]


def default_config(b: int, n: int, itemsize: int, device) -> TopkConfig:
    """`topk_config` for this device."""
    props = device_props(device)
    return topk_config(b, n, itemsize, props.multi_processor_count, props.L2_cache_size)
