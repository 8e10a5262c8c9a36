"""Loop reference of ``gather_rows`` (SPEC 6) and its vectorized torch twin.

    out[i] = x[index[i]]        x [N, D] bf16, index [M] int32 -> out [M, D] bf16

A copy: the output rows are x's bytes (NaN payloads and signed zeros included), so the kernel is
compared with this bitwise. The reference checks every index value (``[0, N)``) and raises on a bad
one; the kernel does that only under TILELANG_OPS_DEBUG=1 and otherwise writes a zero row.
"""

from __future__ import annotations

import torch

from metadata.gather_rows_args import check_gather_rows_args, check_gather_rows_index


def gather_rows_ref(x, index):
    """``out[i] = x[index[i]]``, one row at a time.

    x     [N, D] bf16 (any strides)
    index [M] int32, every entry in [0, N)
    returns out [M, D] bf16
    """
    n, d, m = check_gather_rows_args(x, index)
    check_gather_rows_index(index, n)
    out = torch.empty(m, d, dtype=torch.bfloat16, device=x.device)
    for i, src in enumerate(index.tolist()):
        out[i] = x[src]
    return out


def gather_rows_torch(x, index):
    """Vectorized twin of ``gather_rows_ref`` (same signature, same checks, same bytes)."""
    n, _, _ = check_gather_rows_args(x, index)
    check_gather_rows_index(index, n)
    return torch.index_select(x, 0, index)


def gather_rows_torch_unchecked(x, index):
    """The arithmetic of ``gather_rows_torch`` (host checks only; the caller has checked the index
    values): the ``torch.index_select`` peer of the benchmark."""
    check_gather_rows_args(x, index)
    return torch.index_select(x, 0, index)
