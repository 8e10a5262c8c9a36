"""Shared inputs of compress_store's tests, benchmarks and emulator checks: the store half's parameters,
projected inputs, one-call argument lists, the GPU tests' request mixes and the benchmark's batches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from metadata.cache_format import BF16_KV_FORMAT, FP4_MAIN_KV_FORMAT, FP8_MAIN_KV_FORMAT
from metadata.prepare_tensor_input import SeqMetadata, prepare_tensor_input
from tilelang_ops.compress_store import CompressStoreConfig

SENTINEL = 0xA5  # the byte a fresh cache holds (unwritten bytes must keep it)
D = 512  # the main-branch formats fix the row width, so the compressed latent is 512 wide
FORMATS = {f.name: f for f in (FP8_MAIN_KV_FORMAT, FP4_MAIN_KV_FORMAT, BF16_KV_FORMAT)}
GPU_BLOCK = 128  # the engine's block size: 64 C2 rows per cache block

# Prefill launch shapes the benchmark's sweep times and the GPU tests check bitwise: the default (16, 4, 3),
# the pipeline depth around it (6 / 8 / 12 rows per warp, and 4: the shape of the smaller launches), a lifted
# register cap (min_ctas 2) and 12 warps per SM in CTAs of half the size (8, 2, 6).
PREFILL_SWEEP = [CompressStoreConfig(rows_per_warp=rpw, warps=warps, min_ctas=min_ctas)
                 for rpw, warps, min_ctas in ((8, 4, 3), (8, 2, 6), (12, 4, 3), (6, 4, 3), (4, 4, 3),
                                              (16, 4, 3), (8, 4, 2))]


@dataclass
class Params:
    """The store half's arguments (weights, tables, format) shared by the calls of one test."""

    fmt: object
    w: torch.Tensor  # [D] bf16 or fp32
    cos: torch.Tensor  # [max_position, 32] fp32
    sin: torch.Tensor  # [max_position, 32] fp32
    eps: float = 1e-6
    interleaved: bool = True
    rope_dim: int = 64

    def to(self, device):
        return Params(self.fmt, self.w.to(device), self.cos.to(device), self.sin.to(device), self.eps,
                      self.interleaved, self.rope_dim)


def make_params(fmt_name="fp8_main", *, max_position=4096, weight_fp32=False, interleaved=True, gen=None):
    w = torch.rand(D, generator=gen) * 1.5 + 0.25
    ang = torch.rand(max_position, 32, generator=gen) * 6.3
    return Params(FORMATS[fmt_name], w if weight_fp32 else w.bfloat16(), torch.cos(ang), torch.sin(ang),
                  interleaved=interleaved)


def sequence(n, gen=None, scale=1.0):
    """Projected inputs [n, 2 * D] fp32; scores spread wide so softmax weights are far from uniform."""
    x = torch.randn(n, 2 * D, generator=gen) * scale
    x[:, :D] *= 4
    return x


def prefill_args(x, state, meta, r, p: Params, cache):
    k = str(r)
    return (x, state, meta.cu_seqlens_q, meta.context_lens, meta.state_block_idx, meta.cu_compressed[k], r,
            p.w, p.eps, p.cos, p.sin, meta.compressed_positions[k], meta.slot_mapping_store_ca[k], cache,
            p.fmt)


def decode_args(x, state, meta, r, p: Params, cache):
    k = str(r)
    return (x, state, meta.context_lens, meta.state_block_idx, meta.max_seqlen_q, r, p.w, p.eps, p.cos,
            p.sin, meta.compressed_positions[k], meta.slot_mapping_store_ca[k], cache, p.fmt)


def run_step(fn, x, state, meta, r, p, cache, out_norm=None):
    """One prefill or decode call of a fused function (``fn`` = (prefill_fn, decode_fn))."""
    kw = dict(out_norm=out_norm, rope_dim=p.rope_dim, interleaved=p.interleaved)
    if meta.is_prefill:
        fn[0](*prefill_args(x, state, meta, r, p, cache), num_rows=meta.num_rows[str(r)], **kw)
    else:
        fn[1](*decode_args(x, state, meta, r, p, cache), **kw)


@dataclass(frozen=True)
class GpuCase:
    """A random request mix for one fused call (C2, the engine's block size)."""

    id: str
    prefill: bool
    fmt: str
    num_reqs: int
    max_len: int  # prefill: chunk of 0..max_len tokens; decode: 1..max_len tokens per request
    ring: int  # 0: the minimum (prefill r, decode r + max_len - 1)
    seed: int
    max_before: int = 300  # context before the step: 0..max_before positions
    odd_starts: bool = False  # every chunk starts at an odd position (its first group reads the ring)
    interleaved: bool = True
    weight_fp32: bool = False
    index64: bool = False
    out_norm: bool = True
    config: CompressStoreConfig | None = None  # prefill: None is the launch rule's


def batch_meta(case: GpuCase, g: torch.Generator):
    """The case's builder metadata (CPU; shuffled state slots and physical blocks) and its slot count."""
    r = 2
    num_slots = 2 * case.num_reqs + 1
    slots = torch.randperm(num_slots, generator=g)[:case.num_reqs].tolist()
    shape = []
    for _ in slots:
        before = int(torch.randint(0, case.max_before + 1, (1,), generator=g))
        before = before | 1 if case.odd_starts else before
        q = int(torch.randint(0 if case.prefill else 1, case.max_len + 1, (1,), generator=g))
        shape.append((q, before + q))
    blocks_needed = [max(1, -(-k // GPU_BLOCK)) for _, k in shape]
    physical = torch.randperm(sum(blocks_needed) + 3, generator=g).tolist()
    seqs, used = [], 0
    for (q, k), slot, nb in zip(shape, slots, blocks_needed):
        seqs.append(SeqMetadata(q, k, physical[used:used + nb], slot))
        used += nb
    meta = prepare_tensor_input(seqs, is_prefill=case.prefill, block_size=GPU_BLOCK, compress_ratios=(r,))
    if case.index64:
        for d in (meta.compressed_positions, meta.slot_mapping_store_ca):
            d["2"] = d["2"].long()
    return meta, num_slots, len(physical)


def gpu_batch(case: GpuCase, device="cuda"):
    """(meta, x [tokens, 2 D] fp32, state [slots, ring, 2, D] fp32, Params, cache) on ``device``."""
    g = torch.Generator().manual_seed(case.seed)
    r = 2
    meta, num_slots, num_blocks = batch_meta(case, g)
    ring = case.ring or (r if case.prefill else r + case.max_len - 1)
    x = sequence(meta.total_q, g)
    state = torch.randn(num_slots, ring, 2, D, generator=g) * 3
    p = make_params(case.fmt, max_position=meta.max_seqlen_k + 2, weight_fp32=case.weight_fp32,
                    interleaved=case.interleaved, gen=g)
    cache = torch.full((num_blocks, p.fmt.block_bytes(GPU_BLOCK // r)), SENTINEL, dtype=torch.uint8)
    return meta.to(device), x.to(device), state.to(device), p.to(device), cache.to(device)


# ---- the benchmark's batches (built on the GPU): C2, ring 7, requests in consecutive blocks ----

BENCH_R, BENCH_RING = 2, 7
CHUNK = 4096  # prefill: requests of CHUNK tokens, each starting at an odd position


def bench_inputs(seqs, prefill, fmt, device="cuda"):
    """The benchmark's batch for ``seqs`` (validated by the builder before any tensor exists):
    (args, kwargs, rows, stored rows)."""
    R = BENCH_R
    meta = prepare_tensor_input(seqs, is_prefill=prefill, block_size=GPU_BLOCK,
                                compress_ratios=(R,)).to(device)
    g = torch.Generator(device=device).manual_seed(len(seqs))
    x = torch.randn(meta.total_q, 2 * D, device=device, generator=g)
    state = torch.randn(len(seqs), BENCH_RING, 2, D, device=device, generator=g)
    w = (torch.rand(D, device=device, generator=g) + 0.5).bfloat16()
    ang = torch.rand(meta.max_seqlen_k + 1, 32, device=device, generator=g) * 6.3
    blocks = sum(len(s.block_table) for s in seqs)
    cache = torch.zeros(blocks, fmt.block_bytes(GPU_BLOCK // R), dtype=torch.uint8, device=device)
    rows = meta.num_rows[str(R)]
    out_norm = torch.empty(rows, D, dtype=torch.bfloat16, device=device)
    store = (w, 1e-6, torch.cos(ang), torch.sin(ang), meta.compressed_positions[str(R)],
             meta.slot_mapping_store_ca[str(R)], cache, fmt)
    if prefill:
        args = (x, state, meta.cu_seqlens_q, meta.context_lens, meta.state_block_idx,
                meta.cu_compressed[str(R)], R) + store
        kw = dict(out_norm=out_norm, num_rows=rows)
    else:
        args = (x, state, meta.context_lens, meta.state_block_idx, meta.max_seqlen_q, R) + store
        kw = dict(out_norm=out_norm)
    stored = int((meta.slot_mapping_store_ca[str(R)] >= 0).sum())
    return args, kw, rows, stored


def _bench_seq(q, k, first, slot):
    nb = -(-k // GPU_BLOCK)
    return SeqMetadata(q, k, list(range(first, first + nb)), slot), first + nb


def prefill_batch(num_reqs, fmt, norm=True, device="cuda"):
    """``num_reqs`` requests of CHUNK tokens at odd starts: (args, kwargs, bytes a perfect kernel moves)."""
    R = BENCH_R
    seqs, first, ring_reads = [], 0, 0
    for i in range(num_reqs):
        start = 2 * CHUNK + 1 + 2 * i  # odd: the first group of every request reads one ring entry
        s, first = _bench_seq(CHUNK, start + CHUNK, first, i)
        seqs.append(s)
        ring_reads += start % R
    args, kw, rows, stored = bench_inputs(seqs, True, fmt, device)
    ring_writes = num_reqs * min(CHUNK, BENCH_RING)
    nbytes = (num_reqs * CHUNK + ring_reads + ring_writes) * 2 * D * 4 + stored * fmt.row_bytes
    if norm:
        nbytes += rows * D * 2
    else:
        kw.pop("out_norm")
    return args, kw, nbytes


def decode_batch(batch, q, fmt, device="cuda"):
    """``batch`` requests of ``q`` query tokens after mixed-parity contexts: (args, kwargs, bytes)."""
    R = BENCH_R
    seqs, first, ring_reads = [], 0, 0
    for b in range(batch):
        before = 100 + 3 * b  # mixed parities: different tokens of a step close groups
        s, first = _bench_seq(q, before + q, first, b)
        seqs.append(s)
        for p in range(before, before + q):
            if p % R == R - 1:
                ring_reads += sum(1 for t in range(p - R + 1, p + 1) if t < before)
    args, kw, rows, stored = bench_inputs(seqs, False, fmt, device)
    nbytes = (2 * batch * q + ring_reads) * 2 * D * 4 + stored * fmt.row_bytes + rows * D * 2
    return args, kw, nbytes
