"""Argument checks of ``gather_rows`` (SPEC 6), shared by ``reference.gather_rows`` and the kernel wrapper.

``gather_rows(x [N, D] bf16, index [M] int32) -> [M, D] bf16``, ``out[i] = x[index[i]]``.

``check_gather_rows_args`` reads shapes and dtypes only (no device sync); ``check_gather_rows_index``
reads the index values (the reference always, the wrapper under TILELANG_OPS_DEBUG=1).
``c1_reverse_index`` is the C1 bypass's part of ``compress`` / ``compress_ref``: the index to restore
the input order under context parallelism, or None.
"""

from __future__ import annotations

import torch

from metadata.cache_engine import check_compress_ratio
from metadata.checks import check_tensor

VEC = 8  # bf16 elements of one 16-byte vector: rows are whole vectors
MAX_DIM = 16384  # widest row: a thread holds at most MAX_DIM / VEC / THREADS vectors of one row


def check_gather_rows_args(x, index) -> tuple[int, int, int]:
    """Dtypes, ranks and the row width; returns (N, D, M). Raises TypeError / ValueError."""
    check_tensor("x", x, dtype=torch.bfloat16, ndim=2)
    check_tensor("index", index, dtype=torch.int32, ndim=1)
    if x.device != index.device:
        raise ValueError(f"x and index must share one device, got x={x.device}, index={index.device}")
    n, d = x.shape
    if d % VEC or not 0 < d <= MAX_DIM:
        raise ValueError(f"gather_rows needs the row width D (x.shape[1]) to be a positive multiple of "
                         f"{VEC} (16-byte bf16 vectors) and at most {MAX_DIM}, got D={d} "
                         f"(x shape {tuple(x.shape)})")
    return n, d, index.shape[0]


def check_gather_rows_index(index: torch.Tensor, num_src_rows: int) -> None:
    """Every ``index[i]`` in ``[0, N)``, else ValueError naming the first bad entry (reads the values)."""
    bad = ((index < 0) | (index >= num_src_rows)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(f"index[{i}]={int(index[i])} is outside [0, {num_src_rows}) (x has {num_src_rows} "
                         f"rows; {bad.numel()} entries out of range)")


def c1_reverse_index(projected_kv, metadata, compress_ratio):
    """``metadata.mirror_cp_reverse_index`` when the C1 bypass must restore the input order, else None.

    Under context parallelism (metadata built with ``cp_size > 1``) ``projected_kv`` is the all-gathered
    buffer of every rank's rows, one row per token of the batch; C2 compresses the batch in its
    original order, which this rank's metadata does not describe (its token fields are the rank's own):
    rejected here."""
    index = getattr(metadata, "mirror_cp_reverse_index", None)
    if index is None:
        return None
    check_compress_ratio(compress_ratio)
    if compress_ratio != 1:
        raise ValueError(f"compress_ratio={compress_ratio} with context-parallel metadata (cp_size="
                         f"{getattr(metadata, 'cp_size', '?')}): only the C1 path restores the order of the "
                         f"all-gathered rows (SPEC 6); build C{compress_ratio} metadata with cp_size=1")
    check_tensor("mirror_cp_reverse_index", index, dtype=torch.int32, ndim=1)
    if isinstance(projected_kv, torch.Tensor) and projected_kv.dim() == 2 \
            and projected_kv.shape[0] != index.shape[0]:
        raise ValueError(f"projected_kv has {projected_kv.shape[0]} rows but mirror_cp_reverse_index covers "
                         f"{index.shape[0]} tokens: the C1 path under context parallelism takes the "
                         f"all-gathered rows of every rank")
    return index


def c1_prefill_rows(kv, metadata, is_prefill: bool):
    """The C1 rows ``kv`` [T, D] bf16 (one per token, in the batch's order) laid out as the metadata's
    ratio-1 rows: prefill reserves ``max(1, nc)`` rows per request (SPEC 1.2, 3), so a request with no
    new token (``nc = 0``) gets its zero placeholder row and the rows line up with
    ``slot_mapping_store_ca["1"]`` and ``compressed_positions["1"]``.

    ``kv`` itself when nothing is reserved beyond the tokens (decode; no ratio-1 rows in the metadata;
    ``num_rows["1"]`` equal to T, so every request has a token): the row count is a host int of the
    builder, and the layout is made on the device without a sync."""
    num_rows = getattr(metadata, "num_rows", None)
    rows = num_rows.get("1") if is_prefill and isinstance(num_rows, dict) else None
    if rows is None or rows == kv.shape[0]:
        return kv
    nc = getattr(metadata, "num_compressed", {}).get("1")  # [num_reqs] int32: tokens of each request
    check_tensor("metadata.num_compressed['1']", nc, dtype=torch.int32, ndim=1)
    nc = nc.to(device=kv.device, dtype=torch.int64)
    empty = (nc == 0).to(torch.int64)
    before = torch.cumsum(empty, 0) - empty  # placeholder rows ahead of each request
    t = torch.arange(kv.shape[0], device=kv.device)
    dest = t + before[torch.searchsorted(torch.cumsum(nc, 0), t, right=True)]  # a token's row
    out = torch.zeros(rows, kv.shape[1], dtype=kv.dtype, device=kv.device)
    return out.index_copy_(0, dest, kv)
