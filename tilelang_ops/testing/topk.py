"""Shared inputs of the top-k family's tests, benchmarks and `make diff` cases: the adversarial score
distributions of SPEC 4, row ends, the garbage beyond them, NaN helpers and the case dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from tilelang_ops.topk.launch import TopkConfig, cache_tier, tile_unroll

NAN, INF = float("nan"), float("inf")


def make_scores(dist: str, b: int, n: int, dtype=torch.float32, device="cpu", seed=0) -> torch.Tensor:
    """[b, n] scores (fp32 or bf16) of distribution `dist`, seeded: the SPEC 4 distributions (DISTS) and
    the adversarial ones of the row kernel's sample, candidate list and direct rank."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    if dist == "randn":
        x = torch.randn(b, n, generator=g)
    elif dist == "conc":  # concentrated: every score in one narrow band near 100
        x = torch.randn(b, n, generator=g) * 1e-3 + 100
    elif dist == "tiny":
        x = torch.randn(b, n, generator=g) * 1e-8
    elif dist == "equal":
        x = torch.full((b, n), 0.5)
    elif dist == "few":  # a handful of distinct values -> huge tie groups
        x = torch.randint(-2, 3, (b, n), generator=g).float()
    elif dist == "sorted":
        x = torch.sort(torch.randn(b, n, generator=g), dim=1, descending=True).values
    elif dist == "ascending":
        x = torch.sort(torch.randn(b, n, generator=g), dim=1).values
    elif dist == "ties50":  # 50 distinct values: a sampled threshold bin holds several large tie groups
        x = torch.randint(0, 50, (b, n), generator=g).float()
    elif dist == "pairs":  # every value twice, at random places: small threshold bins hold ties of two
        v = torch.randn(b, (n + 1) // 2, generator=g)
        x = torch.cat([v, v], dim=1)[:, :n]
        x = torch.gather(x, 1, torch.argsort(torch.rand(b, n, generator=g), dim=1))
    elif dist in ("sampled", "unsampled"):
        # against a sampled threshold estimate (runs of 32 entries every n // 256, as the kernels sample):
        # 100 + randn on exactly the sampled runs (the estimate is too high) or on entries 64..127 of
        # every 256, none of them sampled (the estimate is too low: far more candidates than slots)
        x = torch.randn(b, n, generator=g)
        step = max(n // 256, 1)
        col = torch.arange(n) % step
        hot = col < 32 if dist == "sampled" else (col >= 64) & (col < 128)
        x = torch.where(hot[None, :], x + 100, x)
    elif dist == "outliers":
        # 400 (fewer on short rows) distinct huge scores inside one gap between the runs of 32 that the row
        # kernel samples (every n // 64 entries on rows of the 32768 tier, n // 256 beyond): the k-th largest,
        # for k below their count, lies far above the sample's largest key (the last bin of the pre-binned
        # list)
        x = torch.randn(b, n, generator=g)
        step = max(n // (64 if n <= 32768 else 256), 1)
        count = max(0, min(400, step - 96))
        at = step * (4 * (n // step // 8) + 2) + 64
        x[:, at:at + count] = 1000.0 + torch.arange(count, dtype=torch.float32)
    elif dist == "special":  # NaN of both signs, +-inf, signed zeros, denormals of both signs over randn
        x = torch.randn(b, n, generator=g)
        pick = torch.randint(0, 10, (b, n), generator=g)
        neg_nan = torch.tensor([-0x400000], dtype=torch.int32).view(torch.float32)  # bits 0xFFC00000
        x = torch.where(pick == 0, torch.full_like(x, NAN), x)
        x = torch.where(pick == 1, torch.full_like(x, INF), x)
        x = torch.where(pick == 2, torch.full_like(x, -INF), x)
        x = torch.where(pick == 3, torch.full_like(x, -0.0), x)
        x = torch.where(pick == 4, torch.zeros_like(x), x)
        x = torch.where(pick == 5, torch.full_like(x, 1e-40), x)
        x = torch.where(pick == 6, torch.full_like(x, -1e-40), x)
        x = torch.where(pick == 7, neg_nan.expand_as(x), x)
    else:
        raise KeyError(dist)
    return x.to(dtype).to(device)


DISTS = ("randn", "conc", "tiny", "equal", "few", "sorted", "ascending", "special")


def poison_beyond_end(x: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """Garbage the top-k must never pick: +inf and NaN at and beyond `end`."""
    col = torch.arange(x.shape[1], device=x.device)[None, :]
    beyond = col >= end.to(x.device).long()[:, None]
    garbage = torch.where(col % 2 == 0, torch.full_like(x, INF), torch.full_like(x, NAN))
    return torch.where(beyond, garbage, x)


def canonical_nans(t: torch.Tensor) -> torch.Tensor:
    """Every NaN as the one canonical NaN (for comparisons against torch ops that do not keep NaN bits)."""
    return torch.where(torch.isnan(t), torch.full_like(t, NAN), t)


def block_max_by_amax(x: torch.Tensor, block_size: int, end: torch.Tensor) -> torch.Tensor:
    """Vectorized block maxima of the entries before `end` (-inf for a block without one) by torch.amax,
    NaNs canonical: amax propagates a NaN but not its bits, which block_max_scores_ref keeps."""
    masked = torch.where(torch.arange(x.shape[1])[None] < end[:, None].long(), x, torch.full_like(x, -INF))
    padded = torch.nn.functional.pad(masked, (0, (-x.shape[1]) % block_size), value=-INF)
    return canonical_nans(padded.reshape(x.shape[0], -1, block_size).amax(-1))


def as_pairs_by_index(values, indices):
    """Sort lanes by index (fills last) so unordered outputs compare exactly."""
    key = torch.where(indices < 0, torch.full_like(indices, torch.iinfo(indices.dtype).max), indices)
    order = torch.sort(key, dim=1, stable=True).indices
    return (None if values is None else values.gather(1, order)), indices.gather(1, order)


def with_nan_payloads(x: torch.Tensor, step: int) -> torch.Tensor:
    """Every `step`-th element becomes a NaN with a sign and payload of its own (bits differ from the
    canonical NaN), so a kernel that canonicalizes NaNs (a float round trip) is caught."""
    ibits = torch.int32 if x.dtype == torch.float32 else torch.int16
    nans = [0x7FC00001, -0x3FFFFF, 0x7F800003] if x.dtype == torch.float32 else [0x7FC1, -0x3F, 0x7F83]
    flat = x.clone().view(ibits).reshape(-1)
    for j, bits in enumerate(nans):
        flat[j * 11::step * len(nans)] = bits  # -0x3FFFFF = 0xFFC00001, -0x3F = 0xFFC1: negative NaNs
    return flat.reshape(x.shape).view(x.dtype)


@dataclass(frozen=True)
class TwinCase:
    """A CPU case: the vectorized twin against the loop reference."""

    dist: str
    b: int
    n: int
    k: int
    ends: str  # "full" | "random" | "short" (end <= k) | "zero"
    dtype: str = "fp32"
    mode: str = "sorted"  # sorted | sorted_index | any

    @property
    def id(self):
        return f"{self.dist}-b{self.b}n{self.n}k{self.k}-{self.ends}-{self.dtype}-{self.mode}"


def make_end(kind: str, b: int, n: int, k: int, device="cpu", seed=1) -> torch.Tensor | None:
    """[b] int32 row ends of `kind` (None for "full"), seeded; "random" keeps row 0 full."""
    g = torch.Generator().manual_seed(seed)
    if kind == "full":
        return None
    if kind == "random":
        e = torch.randint(0, n + 1, (b,), generator=g)
        e[0] = n
    elif kind == "short":
        e = torch.randint(0, min(k, n) + 1, (b,), generator=g)
    elif kind == "zero":
        e = torch.zeros(b, dtype=torch.int64)
    else:
        raise KeyError(kind)
    return e.to(torch.int32).to(device)


@dataclass(frozen=True)
class GpuCase:
    """A kernel case (GPU tier, CPU emulator): b rows of n scores, top-k, with row ends and an output
    order; `config` picks the launch (None: the launch rule's)."""

    dist: str
    b: int
    n: int
    k: int
    ends: str = "full"
    dtype: str = "fp32"
    mode: str = "any"
    loop_ref: bool = False  # also check against the loop reference (small shapes only)
    config: TopkConfig | None = None  # None: the launch rule's choice for the device

    @property
    def id(self):
        return f"{self.dist}-b{self.b}n{self.n}k{self.k}-{self.ends}-{self.dtype}-{self.mode}" + (
            f"-{config_label(self.config)}" if self.config else "")


def config_label(config: TopkConfig) -> str:
    """A short readable name of a config: the fields that differ from the default."""
    fields = [f"{f}={getattr(config, f)}" for f in ("kernel", "threads", "split", "stream", "unroll",
                                                     "rows_per_cta")
              if getattr(config, f) != getattr(TopkConfig(), f)]
    return ",".join(fields) or "row"


def with_config(cases, config) -> list[GpuCase]:
    """The cases, each on `config`."""
    return [replace(c, config=config) for c in cases]


# ----------------------------------------------------------------------------------------------------
# The GPU tier's exact-match cases (tests/test_topk.py; its gpu_compile_jobs lists their kernels)

# The launch rule's own choice: every tier and kernel it reaches on the H200, the adversarial
# distributions of SPEC 4 on each.
GPU_CASES = (
    [GpuCase(d, 7, 2048, 512, "random", loop_ref=True) for d in DISTS]
    + [GpuCase(d, 64, 32768, 2048) for d in DISTS]
    + [GpuCase(d, 2, 65536, 2048, "random") for d in DISTS]
    + [GpuCase(d, 16, 131072, 2048) for d in ("randn", "conc", "few", "equal")]
    + [
        GpuCase("randn", 1, 1, 1, loop_ref=True),
        GpuCase("randn", 7, 1, 4, loop_ref=True),
        GpuCase("special", 7, 100, 16, "random", "bf16", "sorted", loop_ref=True),
        GpuCase("few", 4096, 100, 8, "random", mode="sorted_index"),
        GpuCase("randn", 4096, 2048, 64, "random"),
        GpuCase("conc", 128, 8192, 512, "random", "bf16"),
        GpuCase("randn", 64, 8192, 512, mode="sorted"),
        GpuCase("tiny", 128, 8192, 4096, "random", mode="sorted"),
        GpuCase("randn", 128, 131072, 2048, mode="sorted"),
        GpuCase("conc", 1, 1 << 20, 2048),
        GpuCase("few", 1, 1 << 20, 4096, "random", "bf16"),
        GpuCase("randn", 7, 1 << 20, 2048, "short"),
        GpuCase("randn", 4, 1 << 20, 100, "zero"),
        GpuCase("special", 64, 65536, 1, "random"),
        GpuCase("equal", 7, 4096, 4096, "random", mode="sorted"),
        # long rows: sampled threshold estimate holds (randn, conc) or fails (sorted rows, heavy ties)
        GpuCase("sorted", 4, 131072, 2048),
        GpuCase("ascending", 4, 131072, 4096, mode="sorted"),
        GpuCase("tiny", 3, 1 << 20, 4096, "random"),
        GpuCase("special", 3, 200000, 3000, "random", "bf16"),
        GpuCase("randn", 5, 40000, 4096, "random", mode="sorted_index"),
        # 1M entries, k = 2048: the sample's bound is refined inside its histogram bin
        # (row_blocks.ROW_SAMPLE_PAD), on one CTA per row and on a cluster per row (the same bound in every
        # CTA)
        GpuCase("randn", 64, 1 << 20, 2048),
        GpuCase("randn", 2, 1 << 20, 2048),
        # the k-th largest far above the sample (k < 400 outliers) or among the ordinary scores (k > 400)
        GpuCase("outliers", 4, 131072, 300),
        GpuCase("outliers", 4, 131072, 2048),
        GpuCase("outliers", 8, 32768, 300, mode="sorted"),
        GpuCase("outliers", 2, 65536, 100, "random"),
        GpuCase("special", 16, 30000, 3000, "random", "bf16"),
        GpuCase("randn", 16, 20000, 4096, "random", mode="sorted"),
        GpuCase("special", 2, 65536, 2048, "random"),
        GpuCase("equal", 4, 131072, 2048),  # candidate list never fits: the passes read the row
        GpuCase("conc", 4, 131072, 2048, "random"),
        # against the sampled estimate (too high -> radix passes over the row; too low -> more candidates
        # than slots) and 50-way ties in the sampled bin (candidates overflow with min < max)
        GpuCase("sampled", 8, 65536, 2048),
        GpuCase("unsampled", 8, 65536, 2048, "random"),
        GpuCase("unsampled", 16, 32768, 2048),
        GpuCase("ties50", 8, 131072, 2048),
        GpuCase("ties50", 64, 20000, 512, "random", mode="sorted_index"),
        GpuCase("unsampled", 2, 1 << 18, 4096, "random", "bf16"),
        GpuCase("equal", 8, 50000, 1),
        # one-tile rows (keys in registers): NaN / inf / signed zeros in bf16, many tie groups, k near e
        GpuCase("special", 16, 8192, 1000, "random", "bf16"),
        GpuCase("ties50", 16, 8192, 300, "random", mode="sorted_index"),
        GpuCase("ascending", 8, 8192, 4095, "random", mode="sorted"),
        # a threshold bin of <= 256 keys is ranked directly (ROW_RES): ties of two inside it
        GpuCase("pairs", 16, 8192, 512, "random"),
        GpuCase("pairs", 8, 32768, 2048),
        GpuCase("pairs", 4, 131072, 2048, "random", "bf16"),
    ]
)

# The row kernel splits a sampled row (more entries than the candidate capacity) over a cluster of 2, 4 or
# 8 CTAs: shares of 1 to 64 tiles, CTAs with no tile (3 tiles over 4 CTAs), lists that overflow the lead
# (equal, ties50), bounds that fail (sampled, unsampled), every output option; unsplit with streaming
# reads (the evict-first loads of the compaction, see ptx.STREAM_PRELUDE) on the uncached rows.
SPLIT_CASES = [
    GpuCase("randn", 7, 65536, 2048, "random"),
    GpuCase("randn", 33, 9000, 512, "random"),  # 2 tiles
    GpuCase("randn", 16, 20000, 4096, "random", mode="sorted"),  # 3 tiles
    GpuCase("pairs", 8, 32768, 2048),
    GpuCase("unsampled", 16, 32768, 2048),
    GpuCase("sampled", 8, 65536, 2048),
    GpuCase("unsampled", 8, 65536, 2048, "random"),
    GpuCase("ascending", 4, 40000, 4096, mode="sorted"),
    GpuCase("sorted", 4, 131072, 2048),
    GpuCase("equal", 4, 131072, 2048),
    GpuCase("ties50", 8, 131072, 2048),
    GpuCase("conc", 4, 131072, 2048, "random"),
    GpuCase("special", 3, 200000, 3000, "random", "bf16"),
    GpuCase("few", 1, 1 << 20, 4096, "random", "bf16", "sorted_index"),
]
SPLIT_RUNS = [c for s in (2, 4, 8) for c in with_config(SPLIT_CASES, TopkConfig(split=s))] + [
    c for c in with_config(SPLIT_CASES, TopkConfig(stream=True)) if cache_tier(c.n) == 0]

# The row kernel with fewer threads per CTA and the warp kernel, on every case (one-tile rows, rows of a few
# tiles with a sample in the 32768 tier, an uncached row, ties, bounds that fail, every output option).
THREADS_CASES = [
    GpuCase("randn", 300, 2048, 512, "random"),
    GpuCase("special", 64, 4096, 1000, "random", "bf16"),
    GpuCase("few", 64, 8192, 512, "random"),
    GpuCase("equal", 64, 2048, 64, "random", mode="sorted"),
    GpuCase("randn", 64, 32768, 2048, "random"),
    GpuCase("conc", 64, 20000, 2048),
    GpuCase("ties50", 64, 8192, 300, "random", mode="sorted_index"),
    GpuCase("tiny", 64, 4096, 4096, "random"),
    GpuCase("randn", 300, 100, 8, "random"),
    GpuCase("unsampled", 16, 32768, 2048),
    GpuCase("randn", 4, 65536, 2048, "random"),
    GpuCase("ascending", 8, 8192, 4095, "random", mode="sorted"),
]
THREADS_RUNS = [c for cfg in (TopkConfig("warp"), TopkConfig(threads=256), TopkConfig(threads=512))
                for c in with_config(THREADS_CASES, cfg)]

# Rows of one tile: the tile kernel on 1024 threads (end <= 8192) and on 256 threads (end <= 4096, 8 or 16
# keys a thread), and the row kernel's own one-tile path (keys in registers).
TILE_CASES = [
    GpuCase("randn", 64, 8192, 512),
    GpuCase("randn", 7, 2048, 512, "random"),
    GpuCase("conc", 64, 8192, 512, "random", "bf16"),
    GpuCase("tiny", 16, 8192, 4096, "random", mode="sorted"),
    GpuCase("few", 64, 8192, 512, "random"),
    GpuCase("equal", 8, 8192, 512, "random", mode="sorted"),
    GpuCase("special", 16, 8192, 1000, "random", "bf16"),
    GpuCase("ties50", 16, 8192, 300, "random", mode="sorted_index"),
    GpuCase("pairs", 16, 8192, 512, "random"),
    GpuCase("ascending", 8, 8192, 4095, "random", mode="sorted"),
    GpuCase("sorted", 8, 5000, 1, "random"),
    GpuCase("randn", 16, 100, 8, "random", "bf16", "sorted"),
    GpuCase("outliers", 8, 8192, 2048),
    GpuCase("few", 300, 4096, 512, "random"),
    GpuCase("conc", 64, 4096, 1000, "random", "bf16"),
    GpuCase("ties50", 64, 3000, 300, "random", mode="sorted_index"),
    GpuCase("equal", 64, 2048, 64, "random", mode="sorted"),
    GpuCase("special", 32, 2100, 2000, "random", "bf16", "sorted"),
]
TILE_RUNS = [replace(c, config=cfg) for c in TILE_CASES for cfg in (
    TopkConfig("tile", 1024, unroll=tile_unroll(c.n, 1024) or 8),
    TopkConfig("tile", 256, unroll=tile_unroll(c.n, 256) or 8),
    TopkConfig("row")) if cfg.kernel != "tile" or cfg.threads * cfg.unroll >= c.n]

ALL_GPU_CASES = GPU_CASES + SPLIT_RUNS + THREADS_RUNS + TILE_RUNS
