"""Shared inputs of kv_store's tests, benchmarks and emulator checks: store cases, their inputs, and a
model of the tensor-core Hadamard's summation order."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from metadata.cache_format import BF16_KV_FORMAT, FP4_INDEX_KV_FORMAT, FP4_MAIN_KV_FORMAT, FP8_MAIN_KV_FORMAT
from tilelang_ops.kv_store import DEFAULT_CONFIGS, OPTION_NAMES, KVStoreConfig, option_applies

SENTINEL = 0xA5  # the byte a fresh cache holds (unwritten bytes must keep it)
FORMATS = {f.name: f for f in (FP8_MAIN_KV_FORMAT, FP4_MAIN_KV_FORMAT, FP4_INDEX_KV_FORMAT, BF16_KV_FORMAT)}


@dataclass(frozen=True)
class StoreCase:
    id: str
    fmt: str
    rows: int
    interleaved: bool = True
    hadamard: bool = False
    weight_fp32: bool = False
    scale: float = 1.0
    offset: float = 0.0
    rows_per_block: int = 8
    index_dtype: torch.dtype = torch.int64
    rope_dim: int = 64  # rotated channels (the last rope_dim of the row)


def no_options(fmt_name: str, **fields) -> KVStoreConfig:
    """The format's default config with every option off (``fields`` override the rest)."""
    return DEFAULT_CONFIGS[fmt_name].replace(**{n: False for n in OPTION_NAMES}, **fields)


def all_options(fmt_name: str, **fields) -> KVStoreConfig:
    """The format's default config with every option that applies to it on."""
    fmt = FORMATS[fmt_name]
    return DEFAULT_CONFIGS[fmt_name].replace(**{n: option_applies(n, fmt) for n in OPTION_NAMES}, **fields)


def make_inputs(case: StoreCase, device="cpu", max_position=64, num_blocks=None, gen=None):
    fmt = FORMATS[case.fmt]
    rows, rpb = case.rows, case.rows_per_block
    num_blocks = num_blocks or (rows + 2 * rpb) // rpb + 1
    kv = (torch.randn(rows, fmt.dim, generator=gen) * case.scale + case.offset).bfloat16()
    w = torch.rand(fmt.dim, generator=gen) * 1.5 + 0.25
    w = w if case.weight_fp32 else w.bfloat16()
    ang = torch.rand(max_position, case.rope_dim // 2, generator=gen) * 6.3
    cos, sin = torch.cos(ang), torch.sin(ang)
    pos = torch.randint(0, max_position, (rows,), generator=gen).to(case.index_dtype)
    slots = torch.randperm(num_blocks * rpb, generator=gen)[:rows].to(case.index_dtype)
    if rows > 2:
        slots[1] = -1
        pos[1] = 10**6  # a skipped row's position is never read
    cache = torch.full((num_blocks, fmt.block_bytes(rpb)), SENTINEL, dtype=torch.uint8)
    to = lambda t: t.to(device)  # noqa: E731
    return fmt, to(kv), to(w), to(cos), to(sin), to(pos), to(slots), to(cache)


def hadamard_mma_model(x: torch.Tensor, chain: int | None = None) -> torch.Tensor:
    """The Hadamard of kv_store's ``hadamard_mma`` option (128-wide rows), as a model of its order: the
    sums over index bits 0, 1, 4, 5 of each A-tile (index bits 2, 3) exact (the tensor core's 16 products of
    BF16 and +-1), ``chain`` (the default config's ``hmma_chain`` when None) A-tiles accumulated in turn
    (the first from 0, each MMA's sum rounded once to FP32), then FP32 butterflies over the remaining bits
    2, 3, 6 (ascending: lo + hi, lo - hi), then times the FP32 constant; BF16 result. Equal to
    ``hadamard_ref`` wherever no FP32 sum rounds."""
    chain = DEFAULT_CONFIGS["fp4_index"].hmma_chain if chain is None else chain
    assert x.shape[-1] == 128 and chain in (1, 2, 4), (x.shape, chain)
    lead = x.shape[:-1]
    y = x.double().reshape(*lead, 2, 2, 2, 2, 2, 2, 2)  # dims: index bits 6, 5, 4, 3, 2, 1, 0

    def butterfly(t, bit):
        d = t.dim() - 1 - bit
        lo, hi = t.select(d, 0), t.select(d, 1)
        return torch.stack((lo + hi, lo - hi), dim=d)

    for bit in (0, 1, 4, 5):  # float64: 16 BF16 terms sum exactly (the test inputs' exponent spread)
        y = butterfly(y, bit)
    # A-tile a = index bits 2, 3: the outputs o of a chain of L tiles (a = g L + l) add (-1)^popcount(l & o)
    # times tile l's exact sum to the previous MMA's FP32 result
    e = y.reshape(*lead, 2, 2, 2, 4, 2, 2).movedim(-3, 0)  # [a] + lead + bits 6, 5, 4 / 1, 0
    out = torch.empty_like(e)
    for g in range(4 // chain):
        for o in range(chain):
            s = torch.zeros_like(e[0])
            for li in range(chain):
                sign = -1.0 if bin(li & o).count("1") % 2 else 1.0
                s = (s + sign * e[g * chain + li]).float().double()
            out[g * chain + o] = s
    y = out.movedim(0, -3).reshape(*lead, 2, 2, 2, 2, 2, 2, 2).float()
    for bit in (2, 3, 6)[chain.bit_length() - 1:]:
        y = butterfly(y, bit)
    return (y.reshape(*lead, 128) * torch.tensor(128 ** -0.5, dtype=torch.float32)).to(torch.bfloat16)


# ---- the benchmark's inputs (built on the GPU) ----

BENCH_ROWS_PER_BLOCK = 64
BENCH_MAX_POSITION = 8192


def bench_inputs(fmt, rows, order="paged", device="cuda"):
    """Inputs of one benchmark case: (kv, w, cos, sin, pos, slots, cache); ``order``: "paged" (blocks in
    random order, rows in order inside a block, as a block table hands them out) or "rowperm" (every row
    to a random slot)."""
    g = torch.Generator(device=device).manual_seed(rows)
    kv = (torch.randn(rows, fmt.dim, device=device, generator=g) * 2).bfloat16()
    w = (torch.rand(fmt.dim, device=device, generator=g) + 0.5).bfloat16()
    ang = torch.rand(BENCH_MAX_POSITION, 32, device=device, generator=g) * 6.3
    cos, sin = torch.cos(ang), torch.sin(ang)
    pos = torch.randint(0, BENCH_MAX_POSITION, (rows,), device=device, generator=g)
    rpb = BENCH_ROWS_PER_BLOCK
    blocks = -(-rows // rpb)
    if order == "rowperm":
        slots = torch.randperm(blocks * rpb, device=device, generator=g)[:rows]
    else:
        row = torch.arange(rows, device=device)
        block = torch.randperm(blocks, device=device, generator=g)
        slots = block[row // rpb] * rpb + row % rpb
    cache = torch.zeros(blocks, fmt.block_bytes(rpb), dtype=torch.uint8, device=device)
    return kv, w, cos, sin, pos, slots, cache
