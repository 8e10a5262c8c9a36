"""Inputs for the index-logits operators shared by tests, benchmarks, tools and ``make diff``: index rows
in several value distributions, paged caches with shuffled blocks and garbage in unwritten rows, klen
patterns, candidate blocks, ragged prefill ranges."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from metadata.cache_format import FP4_INDEX_KV_FORMAT
from reference.kv_store import quantize_rows_torch

FMT = FP4_INDEX_KV_FORMAT
DISTS = ("randn", "wide", "mixed", "tiny", "big", "shift", "extreme", "zeros")


def index_values(rows: int, dist: str, gen: torch.Generator) -> torch.Tensor:
    """[rows, 128] BF16-valued fp32 rows. ``randn``: what the store writes after the Hadamard (every block
    within a binade or two of the row's largest); ``wide``: blocks scaled by 2^-12 .. 2^6 (spreads far
    beyond 3 binades, the kernels' general path); ``mixed``: one row in 8 wide; ``tiny`` / ``big``: times
    1e-8 / 1e4; ``shift``: 100 + randn (every block one exponent); ``extreme``: rows times 2^-100 .. 2^100;
    ``zeros``: all zero."""
    x = torch.randn(rows, FMT.dim, generator=gen)
    if dist in ("wide", "mixed"):
        e = torch.randint(-12, 7, (rows, FMT.num_scales), generator=gen).float()
        scale = torch.exp2(e).repeat_interleave(FMT.group_size, dim=1)
        if dist == "mixed":
            scale = torch.where((torch.arange(rows) % 8 == 3)[:, None], scale, torch.ones_like(scale))
        x = x * scale
    elif dist == "tiny":
        x = x * 1e-8
    elif dist == "big":
        x = x * 1e4
    elif dist == "shift":
        x = x + 100.0
    elif dist == "extreme":
        x = x * torch.exp2(torch.randint(-100, 101, (rows, 1), generator=gen).float())
    elif dist == "zeros":
        x = torch.zeros_like(x)
    elif dist != "randn":
        raise ValueError(f"unknown distribution {dist!r}; known: {DISTS}")
    return x.to(torch.bfloat16).float()


def index_rows(rows: int, dist: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [rows, 64] uint8, scales [rows, 4] uint8): ``index_values`` through the store's cast."""
    return quantize_rows_torch(index_values(rows, dist, gen), FMT)


def garbage_bytes(nbytes: int) -> torch.Tensor:
    """NaN and +inf FP32 bit patterns, as bytes: what an unwritten cache region may hold."""
    pattern = torch.tensor([float("nan"), float("inf"), -float("nan"), float("inf")]).view(torch.uint8)
    reps = -(-nbytes // pattern.numel())
    return pattern.repeat(reps)[:nbytes]


def make_klen(b: int, n: int, max_klen: int, pattern: str, gen: torch.Generator) -> torch.Tensor:
    """[b, n] int32. ``full``: every row max_klen; ``decode``: request r's rows t see K_r - (n - 1 - t) // 2
    (a verification step at consecutive positions, C2), K_r random in [max_klen / 2, max_klen] with one
    request at max_klen; ``ragged``: random in [0, max_klen], including 0, 1 and max_klen."""
    if pattern == "full":
        return torch.full((b, n), max_klen, dtype=torch.int32)
    if pattern == "decode":
        top = torch.randint(max_klen // 2, max_klen + 1, (b,), generator=gen)
        top[0] = max_klen
        lag = (n - 1 - torch.arange(n)) // 2
        return (top[:, None] - lag[None, :]).clamp(min=0).to(torch.int32)
    if pattern == "ragged":
        k = torch.randint(0, max_klen + 1, (b, n), generator=gen)
        flat = k.view(-1)
        for i, v in enumerate((0, 1, max_klen)):
            if i < flat.numel():
                flat[(i * 7) % flat.numel()] = v
        return k.to(torch.int32)
    raise ValueError(f"unknown klen pattern {pattern!r}")


@dataclass(frozen=True)
class PagedCase:
    id: str
    b: int
    n: int
    max_klen: int
    heads: int = 64
    rows_per_block: int = 64
    klen: str = "decode"  # make_klen pattern
    dist: str = "randn"  # keys and queries (index_values)
    candidates: tuple | None = None  # (c, bs): candidate blocks per row and their size
    clean: bool = False
    seed: int = 0


def make_paged_inputs(case: PagedCase, device="cpu") -> dict:
    """Keyword arguments of ``paged_index_logits`` for ``case`` (plus ``out``, pre-filled with a sentinel
    so that unwritten columns can be checked). Each request's rows sit in its own blocks, spread over a
    shuffled pool with extra unused blocks; rows beyond the request's keys, unused blocks and block-table
    entries beyond the keys hold garbage (NaN / inf bytes, huge block ids)."""
    g = torch.Generator().manual_seed(case.seed * 1000 + case.b * 31 + case.n * 7 + case.max_klen)
    b, n, rpb = case.b, case.n, case.rows_per_block
    klen = make_klen(b, n, case.max_klen, case.klen, g)
    keys = klen.amax(1).tolist()  # K_r: rows of request r (with candidates: its logical rows)
    need = [-(-k // rpb) for k in keys]
    max_blocks = max([-(-case.max_klen // rpb)] + need) + 1
    num_blocks = sum(need) + 3
    perm = torch.randperm(num_blocks, generator=g)
    cache = garbage_bytes(num_blocks * FMT.block_bytes(rpb)).reshape(num_blocks, -1).clone()
    table = torch.full((b, max_blocks), 1 << 30, dtype=torch.int32)  # never read beyond the keys
    used = 0
    flat = cache.view(-1)
    width = cache.shape[1]
    for r in range(b):
        codes, scales = index_rows(keys[r], case.dist, g)
        table[r, :need[r]] = perm[used:used + need[r]].to(torch.int32)
        used += need[r]
        j = torch.arange(keys[r])
        phys, pos = table[r, j // rpb].long(), j % rpb
        d0 = phys * width + pos * FMT.data_bytes
        s0 = phys * width + rpb * FMT.data_bytes + pos * FMT.scale_bytes
        flat[(d0[:, None] + torch.arange(FMT.data_bytes)).reshape(-1)] = codes.reshape(-1)
        flat[(s0[:, None] + torch.arange(FMT.scale_bytes)).reshape(-1)] = scales.reshape(-1)
    qc, qs = index_rows(b * n * case.heads, case.dist, g)
    q_codes = qc.reshape(b, n, case.heads, FMT.data_bytes)
    q_scales = qs.reshape(b, n, case.heads, FMT.scale_bytes)
    weights = (torch.randn(b, n, case.heads, generator=g) * 0.1).float()
    cand = bs = None
    max_klen = case.max_klen
    if case.candidates is not None:
        c, bs = case.candidates
        cand = torch.full((b, n, c), -1, dtype=torch.int32)
        klen = torch.zeros(b, n, dtype=torch.int32)  # compact columns
        for r in range(b):
            nblk = -(-keys[r] // bs)  # the last block may end in unwritten rows (scored as they are)
            for t in range(n):
                pick = torch.randperm(nblk, generator=g)[:c]
                cand[r, t, :pick.numel()] = pick.to(torch.int32)
                if c > 2 and pick.numel() == c:
                    cand[r, t, c // 2] = -1  # a padding block inside the valid columns
                klen[r, t] = max(0, pick.numel() * bs - (t % 3) * 5)  # rows of a request differ
        max_klen = c * bs
    out = torch.full((b, n, max_klen), 12345.0, dtype=torch.float32)
    args = dict(q_codes=q_codes, q_scales=q_scales, weights=weights, index_cache=cache, block_tables=table,
                klen=klen, max_klen=max_klen, candidate_blocks=cand, candidate_block_size=bs,
                clean=case.clean, out=out)
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


@dataclass(frozen=True)
class RaggedCase:
    id: str
    t: int
    num_keys: int
    heads: int = 64
    ranges: str = "causal"  # causal | multi | ragged
    dist: str = "randn"
    clean: bool = False
    seed: int = 0


def make_ranges(t: int, num_keys: int, pattern: str, gen: torch.Generator) -> tuple:
    """(ks, ke) [t] int32. ``causal``: the last t queries of one sequence of num_keys keys (query i sees
    keys [0, num_keys - t + i + 1)); ``multi``: three sequences of a prefill batch back to back, each
    causal over its own keys; ``ragged``: random ranges, some empty, one the whole [0, N)."""
    if pattern == "causal":
        ke = torch.arange(num_keys - t + 1, num_keys + 1)
        return torch.zeros(t, dtype=torch.int32), ke.to(torch.int32)
    if pattern == "multi":
        cut = sorted(torch.randint(1, max(num_keys, 2), (2,), generator=gen).tolist())
        starts, ends = [0, cut[0], cut[1]], [cut[0], cut[1], num_keys]
        ks, ke = [], []
        for i in range(t):
            s = i * 3 // max(t, 1)
            ks.append(starts[s])
            span = ends[s] - starts[s]
            ke.append(starts[s] + min(span, 1 + (i * 37) % max(span, 1)))
        return torch.tensor(ks, dtype=torch.int32), torch.tensor(ke, dtype=torch.int32)
    if pattern == "ragged":
        a = torch.randint(0, num_keys + 1, (t,), generator=gen)
        c = torch.randint(0, num_keys + 1, (t,), generator=gen)
        ks, ke = torch.minimum(a, c), torch.maximum(a, c)
        if t > 1:
            ke[1] = ks[1]  # empty
        if t > 2:
            ks[2], ke[2] = 0, num_keys
        return ks.to(torch.int32), ke.to(torch.int32)
    raise ValueError(f"unknown range pattern {pattern!r}")


def make_ragged_inputs(case: RaggedCase, device="cpu") -> dict:
    """Keyword arguments of ``ragged_index_logits`` for ``case`` (``out`` pre-filled with a sentinel)."""
    g = torch.Generator().manual_seed(case.seed * 1000 + case.t * 13 + case.num_keys)
    k_codes, k_scales = index_rows(case.num_keys, case.dist, g)
    qc, qs = index_rows(case.t * case.heads, case.dist, g)
    ks, ke = make_ranges(case.t, case.num_keys, case.ranges, g)
    max_width = int((ke - ks).max()) if case.t else 0
    args = dict(q_codes=qc.reshape(case.t, case.heads, -1), q_scales=qs.reshape(case.t, case.heads, -1),
                weights=(torch.randn(case.t, case.heads, generator=g) * 0.1).float(), k_codes=k_codes,
                k_scales=k_scales, ks=ks, ke=ke, max_width=max_width, clean=case.clean,
                out=torch.full((case.t, max_width), 12345.0, dtype=torch.float32))
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
