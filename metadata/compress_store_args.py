"""Argument checks of the fused compress-and-store operator (SPEC 1.5 main branch, SPEC 3).

The fused op takes the compress arguments followed by the main-branch store arguments, so its checks
are the compress checks (``metadata.compress_args``) and the store checks (``metadata.kv_store_args``)
composed, plus what only the composition knows:

* the format must be a main-branch format (FP8 main, FP4 main, BF16): the index branch (FP4 index,
  Hadamard) stores keys projected from the norm stage, never compressed rows directly;
* the format's row width must be the compressed latent width D of the ring;
* the row count is ``positions.shape[0]`` (a host int, no sync): prefill ``sum(max(1, nc))``
  (``num_rows`` must agree when given), decode one row per query token.

``check_*_args`` read only shapes, dtypes, devices and Python scalars; ``check_*_values`` read the
metadata values (a device sync): references always, kernel wrappers under ``debug_checks_enabled()``.
Both run before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from metadata.cache_format import BF16_KV_FORMAT, FP4_MAIN_KV_FORMAT, FP8_MAIN_KV_FORMAT, KVCacheFormat
from metadata.checks import check_int, check_tensor, describe
from metadata.compress_args import (
    CompressDims,
    check_decode_args,
    check_decode_values,
    check_prefill_args,
    check_prefill_values,
)
from metadata.kv_store_args import INDEX_DTYPES, StoreGeometry, check_store_args, check_store_values

MAIN_BRANCH_FORMATS = (FP8_MAIN_KV_FORMAT, FP4_MAIN_KV_FORMAT, BF16_KV_FORMAT)


@dataclass(frozen=True)
class CompressStoreDims:
    compress: CompressDims
    store: StoreGeometry


def check_main_format(fmt, dim: int) -> None:
    if not isinstance(fmt, KVCacheFormat):
        raise TypeError(f"fmt must be a KVCacheFormat, got {describe(fmt)}")
    if fmt not in MAIN_BRANCH_FORMATS:
        names = ", ".join(f.name for f in MAIN_BRANCH_FORMATS)
        raise ValueError(f"compress_store writes main-branch rows: fmt must be one of {names}, got "
                         f"{fmt.name} (index keys go through norm_rope_hadamard_cast_store)")
    if fmt.dim != dim:
        raise ValueError(f"{fmt.name} rows hold {fmt.dim} elements but the compressed latent width "
                         f"(state_cache.shape[-1]) is D={dim}")


def _prefill_row_count(positions, slot_mapping, num_rows) -> int:
    """Prefill rows on the host: positions, slot_mapping and num_rows (when given) must agree; a
    disagreement names each of them with its length (the device value cu_compressed[-1] decides later)."""
    check_tensor("positions", positions, dtype=INDEX_DTYPES, ndim=1)
    rows = positions.shape[0]
    if num_rows is not None and check_int("num_rows", num_rows) != rows:
        raise ValueError(f"positions has {rows} rows but num_rows={num_rows} (one entry per compressed row)")
    check_tensor("slot_mapping", slot_mapping, dtype=INDEX_DTYPES, ndim=1)
    if slot_mapping.shape[0] != rows:
        raise ValueError(f"positions has {rows} rows but slot_mapping has {slot_mapping.shape[0]}: both hold "
                         f"one entry per compressed row (cu_compressed[-1] of them)")
    return rows


def _store_checks(projected_kv, rows, dim, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache,
                  fmt, out_norm, rope_dim, interleaved) -> StoreGeometry:
    # The store checks take the compressed rows [rows, D] bf16, which the fused op never materializes:
    # a stride-0 view with that shape, dtype and device stands in for them (no allocation of rows).
    stand_in = projected_kv.new_empty((), dtype=torch.bfloat16).expand(rows, dim)
    return check_store_args(stand_in, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
                            rope_dim=rope_dim, interleaved=interleaved, hadamard=False, out_norm=out_norm)


def check_compress_store_prefill_args(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                                      cu_compressed, compress_ratio, norm_weight, eps, cos, sin, positions,
                                      slot_mapping, kv_cache, fmt, *, out_norm=None, num_rows=None,
                                      rope_dim=64, interleaved=True) -> CompressStoreDims:
    """Host checks of ``compress_store_prefill`` (no device sync); returns both geometries."""
    rows = _prefill_row_count(positions, slot_mapping, num_rows)
    dims = check_prefill_args(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                              cu_compressed, compress_ratio, num_rows)
    if rows < dims.num_reqs:
        raise ValueError(f"positions has {rows} rows but cu_seqlens_q holds {dims.num_reqs} requests (every "
                         f"request reserves at least one row)")
    check_main_format(fmt, dims.dim)
    geom = _store_checks(projected_kv, rows, dims.dim, norm_weight, eps, cos, sin, positions, slot_mapping,
                         kv_cache, fmt, out_norm, rope_dim, interleaved)
    return CompressStoreDims(dims, geom)


def check_compress_store_decode_args(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                                     compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping,
                                     kv_cache, fmt, *, out_norm=None, rope_dim=64,
                                     interleaved=True) -> CompressStoreDims:
    """Host checks of ``compress_store_decode`` (incl. the ring capacity rule); returns both geometries."""
    dims = check_decode_args(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                             compress_ratio)
    check_main_format(fmt, dims.dim)
    geom = _store_checks(projected_kv, dims.num_tokens, dims.dim, norm_weight, eps, cos, sin, positions,
                         slot_mapping, kv_cache, fmt, out_norm, rope_dim, interleaved)
    return CompressStoreDims(dims, geom)


def check_compress_store_prefill_values(projected_kv, state_cache, cu_seqlens_q, context_lens,
                                        state_block_idx, cu_compressed, compress_ratio, positions,
                                        slot_mapping, dims: CompressStoreDims) -> None:
    """Metadata values of a prefill batch (device sync): compress metadata, then slots and positions."""
    want = check_prefill_values(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                                cu_compressed, compress_ratio)
    if want != dims.store.rows:
        raise ValueError(f"positions and slot_mapping have {dims.store.rows} rows but "
                         f"cu_compressed[-1]={want} (one entry per compressed row)")
    check_store_values(positions, slot_mapping, dims.store)


def check_compress_store_decode_values(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                                       positions, slot_mapping, dims: CompressStoreDims) -> None:
    """Metadata values of a decode step (device sync): token adjacency, then slots and positions."""
    check_decode_values(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q)
    check_store_values(positions, slot_mapping, dims.store)
