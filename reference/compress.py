"""Loop-style references of the compress operator (SPEC 1.1-1.3) and their vectorized torch twins.

Gated mean of one group of ``r`` positions, per channel ``d``:

    z[d] = sum_t softmax_t(s[t, d]) * v[t, d]

FP32 throughout, one BF16 round-to-nearest-even cast at the end. The FP32 operation order is fixed
here (and the kernels follow it) so results are bitwise reproducible:

    m   = max(s_0, s_1, ..., s_{r-1})                  (exact, any order)
    e_t = exp(s_t - m)
    den = (((e_0 + e_1) + e_2) + ...)                  positions in ascending order
    num = (((e_0 * v_0) + e_1 * v_1) + ...)            ascending, separate multiply and add (no FMA)
    z   = num / den                                    IEEE division

Two forms compute the same bits: ``*_ref`` are explicit Python loops over requests, groups and
tokens (obviously right, slow), ``*_torch`` are vectorized twins (tested bitwise equal on CPU) used
for big GPU shapes. Both run every check (host and metadata values) before the ring is written.
``*_torch_unchecked`` is a twin's arithmetic alone (host checks only): the eager / torch.compile
benchmark peers validate once outside the timed call and time it; it trusts the metadata values.
"""

from __future__ import annotations

import torch

from metadata.compress_args import (
    check_decode_args,
    check_decode_values,
    check_prefill_args,
    check_prefill_values,
    dispatch_compress,
    prefill_row_counts,
)
from reference.gather_rows import gather_rows_ref

SCORE, LATENT = 0, 1  # axis 2 of state_cache


def gated_mean(scores: list[torch.Tensor], latents: list[torch.Tensor]) -> torch.Tensor:
    """FP32 ``sum_t softmax_t(s_t) * v_t`` over a group, in the order of the module docstring.

    Works on any matching shapes (one row [D] in the loops, [rows, D] in the twins)."""
    m = scores[0]
    for s in scores[1:]:
        m = torch.maximum(m, s)
    weights = [torch.exp(s - m) for s in scores]
    den = weights[0]
    num = weights[0] * latents[0]
    for w, v in zip(weights[1:], latents[1:], strict=True):
        den = den + w
        num = num + w * v
    return num / den


# ----------------------------------------------------------------------------------------------
# Loop references
# ----------------------------------------------------------------------------------------------


def compress_prefill_ref(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                         cu_compressed, compress_ratio, *, num_rows=None):
    """Chunked prefill: rows ``floor(s/r) .. floor(e/r) - 1`` of each request, ring updated in place.

    projected_kv    [num_tokens, 2 * D] fp32  (score half, then latent half)
    state_cache     [num_state_slots, S, 2, D] fp32, updated in place
    cu_seqlens_q    [num_reqs + 1] int32  chunk offsets into projected_kv
    context_lens    [num_reqs] int32      e: context length after the chunk; the chunk is [e - len, e)
    state_block_idx [num_reqs] int32      ring slot of each request
    cu_compressed   [num_reqs + 1] int32  output row offsets, max(1, nc) rows per request
    returns kv      [rows, D] bf16        (placeholder rows, nc = 0, are zero)
    """
    dims = check_prefill_args(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                              cu_compressed, compress_ratio, num_rows)
    rows = check_prefill_values(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                                cu_compressed, compress_ratio, num_rows)
    r, ring = compress_ratio, dims.ring
    score, latent = projected_kv.chunk(2, -1)
    cu_q, ctx = cu_seqlens_q.tolist(), context_lens.tolist()
    slots, cu_c = state_block_idx.tolist(), cu_compressed.tolist()
    starts, _ = prefill_row_counts(cu_q, ctx, r)

    kv = torch.zeros(rows, dims.dim, dtype=torch.bfloat16, device=projected_kv.device)
    # Every read (chunk and ring) happens before any ring write of the batch (SPEC 1.2).
    for i in range(dims.num_reqs):
        first_tok, s, e, slot = cu_q[i], starts[i], ctx[i], slots[i]
        for k, g in enumerate(range(s // r, e // r)):
            scores, latents = [], []
            for p in range(g * r, g * r + r):
                if p >= s:  # in this chunk
                    scores.append(score[first_tok + p - s])
                    latents.append(latent[first_tok + p - s])
                else:  # a group that began before the chunk: its earlier inputs wait in the ring
                    scores.append(state_cache[slot, p % ring, SCORE])
                    latents.append(state_cache[slot, p % ring, LATENT])
            kv[cu_c[i] + k] = gated_mean(scores, latents).to(torch.bfloat16)

    # The ring keeps the newest min(len, S) positions of each chunk.
    for i in range(dims.num_reqs):
        first_tok, s, e, slot = cu_q[i], starts[i], ctx[i], slots[i]
        for p in range(max(s, e - ring), e):
            state_cache[slot, p % ring, SCORE] = score[first_tok + p - s]
            state_cache[slot, p % ring, LATENT] = latent[first_tok + p - s]
    return kv


def compress_decode_ref(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                        compress_ratio):
    """Decode / verification step: one row per query token, zero where no group completes.

    projected_kv    [total_q, 2 * D] fp32
    state_cache     [num_state_slots, S, 2, D] fp32, updated in place
    context_lens    [total_q] int32   position + 1 of each token
    state_block_idx [total_q] int32   ring slot of each token (tokens of one request share it)
    max_seqlen_q    int               most tokens of one request in this step (capacity rule)
    returns kv      [total_q, D] bf16
    """
    dims = check_decode_args(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                             compress_ratio)
    check_decode_values(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q)
    r, ring = compress_ratio, dims.ring
    score, latent = projected_kv.chunk(2, -1)
    positions = [c - 1 for c in context_lens.tolist()]
    slots = state_block_idx.tolist()

    # First every token writes its inputs ...
    for i, (p, slot) in enumerate(zip(positions, slots, strict=True)):
        state_cache[slot, p % ring, SCORE] = score[i]
        state_cache[slot, p % ring, LATENT] = latent[i]
    # ... then every token that closes a group reads the whole group from the ring.
    kv = torch.zeros(dims.num_tokens, dims.dim, dtype=torch.bfloat16, device=projected_kv.device)
    for i, (p, slot) in enumerate(zip(positions, slots, strict=True)):
        if p % r != r - 1:
            continue
        group = range(p - r + 1, p + 1)
        z = gated_mean([state_cache[slot, q % ring, SCORE] for q in group],
                       [state_cache[slot, q % ring, LATENT] for q in group])
        kv[i] = z.to(torch.bfloat16)
    return kv


def compress_ref(projected_kv, state_cache, metadata, compress_ratio, is_prefill, *,
                 compress_overlap=False, use_ape=False):
    """Engine entry point: C1 passes its BF16 input through; C2 compresses (prefill or decode).

    ``metadata`` has ``cu_seqlens_q, context_lens, state_block_idx, max_seqlen_q`` and
    ``cu_compressed[str(r)]`` (an ``InputMetadata``; duck-typed). Under context parallelism (the
    metadata carries ``mirror_cp_reverse_index``) C1 takes the all-gathered rows and returns them in the
    batch's order: ``gather_rows_ref(projected_kv, mirror_cp_reverse_index)`` (SPEC 6). A prefill
    request with no new token gets its zero placeholder row (``c1_prefill_rows``)."""
    return dispatch_compress(compress_prefill_ref, compress_decode_ref, gather_rows_ref,
                             projected_kv, state_cache, metadata, compress_ratio, is_prefill,
                             compress_overlap=compress_overlap, use_ape=use_ape)


# ----------------------------------------------------------------------------------------------
# Vectorized twins (same bits and same checks as the loops; the arithmetic has no host loop)
# ----------------------------------------------------------------------------------------------


@torch.compiler.disable
def _segment_of(cu: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Segment of each flat index given offsets ``cu`` [n + 1]: the largest i with cu[i] <= idx.

    Kept out of torch.compile graphs: Inductor (torch 2.11, CUDA) cannot lower searchsorted over a
    sliced boundary tensor, and this is index bookkeeping, not the bytes the peer is timed on.
    """
    return torch.searchsorted(cu[1:], idx, right=True)


def _gated_mean_gathered(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x [rows, r, 2 * D] fp32 (score, latent per position) -> z [rows, D] fp32, loop order."""
    r = x.shape[1]
    return gated_mean([x[:, t, :dim] for t in range(r)], [x[:, t, dim:] for t in range(r)])


def compress_prefill_torch(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                           cu_compressed, compress_ratio, *, num_rows=None):
    """Vectorized twin of ``compress_prefill_ref`` (same signature, same checks, same bits)."""
    check_prefill_args(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed,
                       compress_ratio, num_rows)
    rows = check_prefill_values(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                                cu_compressed, compress_ratio, num_rows)
    return compress_prefill_torch_unchecked(projected_kv, state_cache, cu_seqlens_q, context_lens,
                                            state_block_idx, cu_compressed, compress_ratio, num_rows=rows)


def compress_prefill_torch_unchecked(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                                     cu_compressed, compress_ratio, *, num_rows=None):
    """The arithmetic of ``compress_prefill_torch`` (host checks only: metadata values are trusted, the
    caller has run ``check_prefill_values``)."""
    dims = check_prefill_args(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                              cu_compressed, compress_ratio, num_rows)
    r, ring, dim, dev = compress_ratio, dims.ring, dims.dim, projected_kv.device
    rows = int(cu_compressed[-1]) if num_rows is None else num_rows
    cu_q, e = cu_seqlens_q.long(), context_lens.long()
    slot, cu_c = state_block_idx.long(), cu_compressed.long()
    s = e - (cu_q[1:] - cu_q[:-1])
    nc = e // r - s // r
    # One table holding chunk tokens then ring entries: both rows are (score half, latent half).
    ring_rows = state_cache.view(-1, 2 * dim)
    table = torch.cat([projected_kv, ring_rows])

    row = torch.arange(rows, device=dev)
    req = _segment_of(cu_c, row).clamp_max(max(dims.num_reqs - 1, 0))
    k = row - cu_c[req]
    valid = k < nc[req]
    pos = ((s[req] // r + k) * r)[:, None] + torch.arange(r, device=dev)  # [rows, r]
    from_chunk = pos >= s[req][:, None]
    tok = cu_q[req][:, None] + pos - s[req][:, None]
    ring_idx = dims.num_tokens + slot[req][:, None] * ring + pos % ring
    idx = torch.where(from_chunk, tok, ring_idx)
    idx = torch.where(valid[:, None], idx, 0).clamp(0, table.shape[0] - 1)
    z = _gated_mean_gathered(table[idx], dim)
    kv = torch.where(valid[:, None], z, 0.0).to(torch.bfloat16)

    # Ring writes after all reads: the newest min(len, S) tokens of each chunk.
    tok_all = torch.arange(dims.num_tokens, device=dev)
    treq = _segment_of(cu_q, tok_all)
    p = s[treq] + tok_all - cu_q[treq]
    keep = p >= e[treq] - ring
    dst = slot[treq] * ring + p % ring
    ring_rows.index_copy_(0, dst[keep], projected_kv[keep])
    return kv


def compress_decode_torch(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                          compress_ratio):
    """Vectorized twin of ``compress_decode_ref`` (same signature, same checks, same bits)."""
    check_decode_args(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q, compress_ratio)
    check_decode_values(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q)
    return compress_decode_torch_unchecked(projected_kv, state_cache, context_lens, state_block_idx,
                                           max_seqlen_q, compress_ratio)


def compress_decode_torch_unchecked(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                                    compress_ratio):
    """The arithmetic of ``compress_decode_torch`` (host checks only: metadata values are trusted, the
    caller has run ``check_decode_values``)."""
    dims = check_decode_args(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                             compress_ratio)
    r, ring, dim = compress_ratio, dims.ring, dims.dim
    p, slot = context_lens.long() - 1, state_block_idx.long()
    ring_rows = state_cache.view(-1, 2 * dim)
    ring_rows.index_copy_(0, slot * ring + p % ring, projected_kv)
    pos = p[:, None] - (r - 1) + torch.arange(r, device=p.device)
    idx = slot[:, None] * ring + pos.remainder(ring)
    z = _gated_mean_gathered(ring_rows[idx], dim)
    closes = (p % r == r - 1)[:, None]
    return torch.where(closes, z, 0.0).to(torch.bfloat16)
