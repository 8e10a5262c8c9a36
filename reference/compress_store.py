"""Reference of the fused compress-and-store operator (SPEC 1.5 main branch, SPEC 3).

It is, literally, the compress reference followed by the store reference on the main branch
(RMSNorm -> RoPE -> cast -> store, no Hadamard):

    kv = compress_prefill_ref(...)                          (gated mean, BF16 rows, ring updated)
    norm_rope_hadamard_cast_store_ref(kv, ..., hadamard=False, out_norm=out_norm)

``compress_store_*_torch`` compose the vectorized twins the same way (same checks, same bits; used for
big GPU shapes); ``compress_store_*_torch_unchecked`` compose the twins' arithmetic alone (host checks
only), the eager / torch.compile benchmark peers, validated once outside the timed call.

Decisions:
* Nothing is returned. The fused kernel keeps each compressed BF16 row on chip; returning it would add
  a ``rows x D x 2`` byte write that the store does not need. ``out_norm`` (the norm stage, what the
  indexer projects) is the one BF16 tensor the operator can hand back.
* Placeholder rows (prefill ``nc = 0``) and decode tokens that close no group compress to a zero row
  with slot -1: nothing is stored, and their ``out_norm`` row is the norm stage of a zero row (zeros
  for ``eps > 0``), as the store reference does for every row with slot < 0.
* Every check (host and metadata values, both halves) runs before the ring or the cache is written.
"""

from __future__ import annotations

from metadata.compress_store_args import (
    check_compress_store_decode_args,
    check_compress_store_decode_values,
    check_compress_store_prefill_args,
    check_compress_store_prefill_values,
)
from reference.compress import (
    compress_decode_ref,
    compress_decode_torch_unchecked,
    compress_prefill_ref,
    compress_prefill_torch_unchecked,
)
from reference.kv_store import (
    norm_rope_hadamard_cast_store_ref,
    norm_rope_hadamard_cast_store_torch_unchecked,
)


def compress_store_prefill_ref(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                               cu_compressed, compress_ratio, norm_weight, eps, cos, sin, positions,
                               slot_mapping, kv_cache, fmt, *, out_norm=None, num_rows=None, rope_dim=64,
                               interleaved=True) -> None:
    """cache[slot_mapping[j]] = cast(rope(rmsnorm(gated_mean(group j)))) for each completed row j.

    projected_kv    [num_tokens, 2 * D] fp32        (score half, then latent half)
    state_cache     [num_state_slots, S, 2, D] fp32, ring updated in place
    cu_seqlens_q    [num_reqs + 1] int32             chunk offsets into projected_kv
    context_lens    [num_reqs] int32                 context length after the chunk
    state_block_idx [num_reqs] int32                 ring slot of each request
    cu_compressed   [num_reqs + 1] int32             row offsets, max(1, nc) rows per request
    norm_weight     [D] bf16 or fp32
    cos, sin        [max_position, rope_dim / 2] fp32
    positions       [rows] int32/int64               compressed positions j * r (0 for placeholders)
    slot_mapping    [rows] int32/int64               cache slot of each row, -1 for placeholders
    kv_cache        [num_blocks, fmt.block_bytes(rows_per_block)] uint8, written in place
    out_norm        optional [rows, D] bf16           receives the norm stage of every row
    """
    dims = check_compress_store_prefill_args(
        projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed,
        compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
        out_norm=out_norm, num_rows=num_rows, rope_dim=rope_dim, interleaved=interleaved)
    check_compress_store_prefill_values(projected_kv, state_cache, cu_seqlens_q, context_lens,
                                        state_block_idx, cu_compressed, compress_ratio, positions,
                                        slot_mapping, dims)
    kv = compress_prefill_ref(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                              cu_compressed, compress_ratio, num_rows=dims.store.rows)
    norm_rope_hadamard_cast_store_ref(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
                                      rope_dim=rope_dim, interleaved=interleaved, hadamard=False,
                                      out_norm=out_norm)


def compress_store_decode_ref(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                              compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache,
                              fmt, *, out_norm=None, rope_dim=64, interleaved=True) -> None:
    """Decode / verification step: compress_decode_ref, then the main-branch store of every token's row.

    projected_kv    [total_q, 2 * D] fp32
    state_cache     [num_state_slots, S, 2, D] fp32, ring updated in place
    context_lens    [total_q] int32                  position + 1 of each token
    state_block_idx [total_q] int32                  ring slot of each token
    max_seqlen_q    int                              most tokens of one request (ring capacity rule)
    positions       [total_q] int32/int64            j * r where the token closes group j, else 0
    slot_mapping    [total_q] int32/int64            cache slot of row j, -1 where no group closes
    (norm_weight, eps, cos, sin, kv_cache, fmt, out_norm as in ``compress_store_prefill_ref``)
    """
    dims = check_compress_store_decode_args(
        projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q, compress_ratio, norm_weight,
        eps, cos, sin, positions, slot_mapping, kv_cache, fmt, out_norm=out_norm, rope_dim=rope_dim,
        interleaved=interleaved)
    check_compress_store_decode_values(projected_kv, state_cache, context_lens, state_block_idx,
                                       max_seqlen_q, positions, slot_mapping, dims)
    kv = compress_decode_ref(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                             compress_ratio)
    norm_rope_hadamard_cast_store_ref(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
                                      rope_dim=rope_dim, interleaved=interleaved, hadamard=False,
                                      out_norm=out_norm)


# ----------------------------------------------------------------------------------------------
# Vectorized twins: every check of the loop reference, then the twins' arithmetic composed.
# ----------------------------------------------------------------------------------------------


def compress_store_prefill_torch(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                                 cu_compressed, compress_ratio, norm_weight, eps, cos, sin, positions,
                                 slot_mapping, kv_cache, fmt, *, out_norm=None, num_rows=None, rope_dim=64,
                                 interleaved=True) -> None:
    """Vectorized twin of ``compress_store_prefill_ref`` (same signature, same checks, same bits)."""
    dims = check_compress_store_prefill_args(
        projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed,
        compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
        out_norm=out_norm, num_rows=num_rows, rope_dim=rope_dim, interleaved=interleaved)
    check_compress_store_prefill_values(projected_kv, state_cache, cu_seqlens_q, context_lens,
                                        state_block_idx, cu_compressed, compress_ratio, positions,
                                        slot_mapping, dims)
    compress_store_prefill_torch_unchecked(
        projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed, compress_ratio,
        norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt, out_norm=out_norm,
        num_rows=dims.store.rows, rope_dim=rope_dim, interleaved=interleaved)


def compress_store_decode_torch(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                                compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache,
                                fmt, *, out_norm=None, rope_dim=64, interleaved=True) -> None:
    """Vectorized twin of ``compress_store_decode_ref`` (same signature, same checks, same bits)."""
    dims = check_compress_store_decode_args(
        projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q, compress_ratio, norm_weight,
        eps, cos, sin, positions, slot_mapping, kv_cache, fmt, out_norm=out_norm, rope_dim=rope_dim,
        interleaved=interleaved)
    check_compress_store_decode_values(projected_kv, state_cache, context_lens, state_block_idx,
                                       max_seqlen_q, positions, slot_mapping, dims)
    compress_store_decode_torch_unchecked(
        projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q, compress_ratio, norm_weight,
        eps, cos, sin, positions, slot_mapping, kv_cache, fmt, out_norm=out_norm, rope_dim=rope_dim,
        interleaved=interleaved)


def compress_store_prefill_torch_unchecked(projected_kv, state_cache, cu_seqlens_q, context_lens,
                                           state_block_idx, cu_compressed, compress_ratio, norm_weight, eps,
                                           cos, sin, positions, slot_mapping, kv_cache, fmt, *, out_norm=None,
                                           num_rows=None, rope_dim=64, interleaved=True) -> None:
    """The arithmetic of ``compress_store_prefill_torch`` (host checks only: metadata values are trusted,
    the caller has run ``check_compress_store_prefill_values``)."""
    dims = check_compress_store_prefill_args(
        projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed,
        compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
        out_norm=out_norm, num_rows=num_rows, rope_dim=rope_dim, interleaved=interleaved)
    kv = compress_prefill_torch_unchecked(projected_kv, state_cache, cu_seqlens_q, context_lens,
                                          state_block_idx, cu_compressed, compress_ratio,
                                          num_rows=dims.store.rows)
    norm_rope_hadamard_cast_store_torch_unchecked(kv, norm_weight, eps, cos, sin, positions, slot_mapping,
                                                  kv_cache, fmt, rope_dim=rope_dim, interleaved=interleaved,
                                                  hadamard=False, out_norm=out_norm)


def compress_store_decode_torch_unchecked(projected_kv, state_cache, context_lens, state_block_idx,
                                          max_seqlen_q, compress_ratio, norm_weight, eps, cos, sin, positions,
                                          slot_mapping, kv_cache, fmt, *, out_norm=None, rope_dim=64,
                                          interleaved=True) -> None:
    """The arithmetic of ``compress_store_decode_torch`` (host checks only: metadata values are trusted,
    the caller has run ``check_compress_store_decode_values``)."""
    check_compress_store_decode_args(
        projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q, compress_ratio, norm_weight,
        eps, cos, sin, positions, slot_mapping, kv_cache, fmt, out_norm=out_norm, rope_dim=rope_dim,
        interleaved=interleaved)
    kv = compress_decode_torch_unchecked(projected_kv, state_cache, context_lens, state_block_idx,
                                         max_seqlen_q, compress_ratio)
    norm_rope_hadamard_cast_store_torch_unchecked(kv, norm_weight, eps, cos, sin, positions, slot_mapping,
                                                  kv_cache, fmt, rope_dim=rope_dim, interleaved=interleaved,
                                                  hadamard=False, out_norm=out_norm)
