"""compress_store: the fused kernel (default variant: prefill v2, decode v3) vs v1 (peer ``v1``: same
bytes, the first, GPU-verified launch layout), our two-kernel pipeline (compress kernel, then store
kernel) and the twin composition (torch eager and torch.compile).

Bytes (what a perfect fused kernel must move): projected_kv read + ring entries read (groups that
began before the step) + ring entries written + cache rows written (stored rows x fmt.row_bytes) +
out_norm written (rows x D x 2). The two-kernel pipeline additionally writes and re-reads the BF16
rows. Metadata comes from the builder; the ring is the engine's default (7 for C2).
"""

from __future__ import annotations

import functools
import os

import torch

from benchmarks.harness import Harness, compile_peer, time_graph_us, time_peer, time_us
from metadata.cache_format import FP4_MAIN_KV_FORMAT, FP8_MAIN_KV_FORMAT
from metadata.prepare_tensor_input import SeqMetadata, prepare_tensor_input
from reference.compress_store import (
    compress_store_decode_torch,
    compress_store_decode_torch_unchecked,
    compress_store_prefill_torch,
    compress_store_prefill_torch_unchecked,
)
from tilelang_ops.compress_store import V2_PREFILL_SHAPES

OP = "compress_store"
D, R, RING, BLOCK = 512, 2, 7, 128
CHUNK = 4096  # prefill: requests of CHUNK tokens, each starting at an odd position
# (requests, format, out_norm). Cases without out_norm do the work of vLLM's fused kernel (compress,
# RMSNorm, RoPE, FP8 insert), the peer the issue names; `_norm` cases also write the indexer's BF16 rows.
PREFILL_CASES = {"tokens1048576_fp8": (256, FP8_MAIN_KV_FORMAT, False),
                 "tokens1048576_fp8_norm": (256, FP8_MAIN_KV_FORMAT, True),
                 "tokens65536_fp8": (16, FP8_MAIN_KV_FORMAT, False),
                 "tokens1048576_fp4": (256, FP4_MAIN_KV_FORMAT, False),
                 "tokens65536_fp4": (16, FP4_MAIN_KV_FORMAT, False)}
DECODE_CASES = {"b1q1_fp8": (1, 1), "b64q6_fp8": (64, 6), "b4096q6_fp8": (4096, 6)}
TINY_TOKENS = 512  # at or below this many query tokens, time CUDA-graph replays (launch-bound)
# COMPRESS_STORE_SWEEP=1 also times other launch shapes of the v2 prefill kernel (tuning data, not reported
# as BENCH lines): (rows per warp, warps per CTA, min CTAs per SM) on 1M FP8 tokens. New compilations ~9 s
# each on the GPU machine (none when tools/warm_compress_store_kernels.py ran first): (16, 4, 3) is the
# default, (6 / 8 / 12, 4, 3) and (4, 4, 3) (the shape of the smaller prefill launches) the pipeline
# depth around it (one prologue per warp against fewer, longer-lived warps); (8, 4, 2) lifts the register
# cap (168 -> ~212, 8 warps per SM instead of 12); (8, 2, 6) keeps 12 warps per SM in CTAs of half the
# size (a shorter tail wave).
PREFILL_SHAPES = V2_PREFILL_SHAPES


def _inputs(seqs, prefill, fmt):
    meta = prepare_tensor_input(seqs, is_prefill=prefill, block_size=BLOCK, compress_ratios=(R,)).to("cuda")
    g = torch.Generator(device="cuda").manual_seed(len(seqs))
    x = torch.randn(meta.total_q, 2 * D, device="cuda", generator=g)
    state = torch.randn(len(seqs), RING, 2, D, device="cuda", generator=g)
    w = (torch.rand(D, device="cuda", generator=g) + 0.5).bfloat16()
    ang = torch.rand(meta.max_seqlen_k + 1, 32, device="cuda", generator=g) * 6.3
    blocks = sum(len(s.block_table) for s in seqs)
    cache = torch.zeros(blocks, fmt.block_bytes(BLOCK // R), dtype=torch.uint8, device="cuda")
    rows = meta.num_rows[str(R)]
    out_norm = torch.empty(rows, D, dtype=torch.bfloat16, device="cuda")
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


def _seq(q, k, first, slot):
    nb = -(-k // BLOCK)
    return SeqMetadata(q, k, list(range(first, first + nb)), slot), first + nb


def _prefill(num_reqs, fmt, norm=True):
    seqs, first, ring_reads = [], 0, 0
    for i in range(num_reqs):
        start = 2 * CHUNK + 1 + 2 * i  # odd: the first group of every request reads one ring entry
        s, first = _seq(CHUNK, start + CHUNK, first, i)
        seqs.append(s)
        ring_reads += start % R
    args, kw, rows, stored = _inputs(seqs, True, fmt)
    ring_writes = num_reqs * min(CHUNK, RING)
    nbytes = (num_reqs * CHUNK + ring_reads + ring_writes) * 2 * D * 4 + stored * fmt.row_bytes
    if norm:
        nbytes += rows * D * 2
    else:
        kw.pop("out_norm")
    return args, kw, nbytes


def _decode(batch, q, fmt):
    seqs, first, ring_reads = [], 0, 0
    for b in range(batch):
        before = 100 + 3 * b  # mixed parities: different tokens of a step close groups
        s, first = _seq(q, before + q, first, b)
        seqs.append(s)
        for p in range(before, before + q):
            if p % R == R - 1:
                ring_reads += sum(1 for t in range(p - R + 1, p + 1) if t < before)
    args, kw, rows, stored = _inputs(seqs, False, fmt)
    nbytes = (2 * batch * q + ring_reads) * 2 * D * 4 + stored * fmt.row_bytes + rows * D * 2
    return args, kw, nbytes


def _case(h, case, op, args, kw, nbytes, fused, two_kernel, twin, compiled, tiny):
    """One BENCH line: ``fused`` (the ``op`` wrapper, "prefill" / "decode") at its default variant; the
    operation's other variant (v1), the two-kernel pipeline and the twin (eager, compiled) as peers."""
    from tilelang_ops.compress_store import VARIANT, VARIANTS

    timer = time_graph_us if tiny else time_us
    us = timer(lambda: fused(*args, **kw))
    peers = {"two_kernel": time_peer("two_kernel", lambda: two_kernel(*args, **kw), timer)}
    for v in VARIANTS[op]:  # the other variant (same bytes) as a peer
        if v != VARIANT[op]:
            other = functools.partial(fused, variant=v)
            peers[v] = time_peer(v, lambda other=other: other(*args, **kw), timer)
    eager = time_peer("eager", lambda: twin(*args, **kw), timer)
    comp = time_peer("compile", lambda: compiled(*args, **kw), timer) if compiled is not None else None
    h.report(OP, case, nbytes, us, eager_us=eager, compile_us=comp,
             peers={k: v for k, v in peers.items() if v is not None} or None)


def run(h: Harness) -> None:
    from tilelang_ops.compress_store import (
        compress_store_decode,
        compress_store_prefill,
        two_kernel_decode,
        two_kernel_prefill,
    )

    if os.environ.get("COMPRESS_STORE_SWEEP", "0") == "1":
        sweep()
    # the twin peers time the twins' arithmetic alone; each case is validated once by the checked twin
    cp = compile_peer(compress_store_prefill_torch_unchecked)
    cd = compile_peer(compress_store_decode_torch_unchecked)
    only = [c for c in os.environ.get("COMPRESS_STORE_CASES", "").split(",") if c]  # e.g. "b1q1,b64q6"
    for case, (num_reqs, fmt, norm) in PREFILL_CASES.items():
        if only and not any(o in case for o in only):
            continue
        args, kw, nbytes = _prefill(num_reqs, fmt, norm)
        compress_store_prefill_torch(*args, **kw)
        _case(h, case, "prefill", args, kw, nbytes, compress_store_prefill, two_kernel_prefill,
              compress_store_prefill_torch_unchecked, cp, tiny=False)
        del args, kw
        torch.cuda.empty_cache()
    for case, (batch, q) in DECODE_CASES.items():
        if only and not any(o in case for o in only):
            continue
        args, kw, nbytes = _decode(batch, q, FP8_MAIN_KV_FORMAT)
        compress_store_decode_torch(*args, **kw)
        _case(h, case, "decode", args, kw, nbytes, compress_store_decode, two_kernel_decode,
              compress_store_decode_torch_unchecked, cd, tiny=batch * q <= TINY_TOKENS)
        del args, kw
        torch.cuda.empty_cache()


def sweep() -> None:
    """Launch-shape sweep of the v2 prefill kernel (COMPRESS_STORE_SWEEP=1)."""
    import tilelang_ops.compress_store as cs

    args, kw, nbytes = _prefill(256, FP8_MAIN_KV_FORMAT, norm=False)
    saved = cs.V2_ROWS_PER_WARP, cs.V2_WARPS, cs.V2_MIN_CTAS_PER_SM
    try:
        for rpw, warps, min_ctas in PREFILL_SHAPES:
            cs.V2_ROWS_PER_WARP, cs.V2_WARPS, cs.V2_MIN_CTAS_PER_SM = rpw, warps, min_ctas
            us = time_us(lambda: cs.compress_store_prefill(*args, **kw, variant="v2"))
            print(f"SWEEP {OP} tokens1048576_fp8 rows_per_warp={rpw} warps={warps} min_ctas={min_ctas} "
                  f"us={us:.1f} GBps={nbytes / us / 1e3:.0f}")
    finally:
        cs.V2_ROWS_PER_WARP, cs.V2_WARPS, cs.V2_MIN_CTAS_PER_SM = saved
