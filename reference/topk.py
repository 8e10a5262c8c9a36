"""Loop-style references for index-score selection (SPEC 1.6): top-k, block maxima, candidate restore,
logical-row -> physical-slot conversion, and their composition `topk_to_slots_ref`.

Order used everywhere: NaN ranks highest (like torch.topk), then larger value; equal values (and
-0.0 == +0.0, and NaN among NaNs) go to the lower index. Output order when neither ``sorted`` nor
``sorted_index`` is asked: ascending index (what the kernel gives; tests still compare as sets).

`topk_torch` is the vectorized twin (a stable sort on an order-preserving integer key), tested equal to
`topk_ref` and used as the oracle for big rows on the GPU.
"""

from __future__ import annotations

import builtins
import math

import torch

from metadata.topk_args import (
    check_block_max_args,
    check_convert_args,
    check_convert_values,
    check_end_values,
    check_restore_args,
    check_restore_values,
    check_topk_args,
    check_topk_to_slots_args,
    check_topk_to_slots_values,
)


def _rank_key(value: float, index: int):
    """Sort key, ascending = best first: NaN first, then larger value, then lower index."""
    if math.isnan(value):
        return (0, 0.0, index)
    return (1, -value, index)  # -(+0.0) == -(-0.0): signed zeros tie, as values


def topk_ref(scores, k, *, end=None, sorted=False, sorted_index=False, indices_type=torch.int32,
             idx_oob_fill_value=-1, value_oob_fill_value=float("-inf"), output_idx_offset=None,
             return_value=True):
    """Per row: the min(k, end) best of scores[row, :end] (NaN highest, ties to lower index).

    scores: [b, n] fp32/bf16; end: [b] int32 or None; output_idx_offset: [b] int32/int64 or None.
    Returns (values [b, k] scores.dtype or None, indices [b, k] indices_type).
    """
    b, n = check_topk_args(scores, k, end, sorted=sorted, sorted_index=sorted_index,
                           indices_type=indices_type, output_idx_offset=output_idx_offset,
                           return_value=return_value)
    check_end_values(end, n)
    values = torch.full((b, k), value_oob_fill_value, dtype=scores.dtype)
    indices = torch.full((b, k), idx_oob_fill_value, dtype=indices_type)
    rows = scores.detach().cpu().float().tolist()
    ends = [n] * b if end is None else end.cpu().tolist()
    offsets = [0] * b if output_idx_offset is None else output_idx_offset.cpu().tolist()
    for r in range(b):
        row = rows[r]
        # `sorted` is the keyword argument here, hence builtins.sorted
        ranked = builtins.sorted(range(ends[r]), key=lambda i, row=row: _rank_key(row[i], i))
        chosen = ranked[:k]
        if not sorted:
            chosen = builtins.sorted(chosen)  # ascending index (sorted_index, or "any order")
        for lane, i in enumerate(chosen):
            values[r, lane] = scores[r, i]
            indices[r, lane] = i + offsets[r]
    return (values.to(scores.device) if return_value else None), indices.to(scores.device)


def order_key(scores: torch.Tensor) -> torch.Tensor:
    """Order-preserving integer key (int64 in [0, 2^32)) of fp32/bf16 scores; equal keys = tied values.

    The fp32 bit trick: non-negative floats get the sign bit set, negative floats are bit-inverted;
    -0.0 is folded onto +0.0 and every NaN onto 0xFFFFFFFF (the highest key). The kernels use the same
    key on uint32 (bf16 widened to fp32 first, which is exact).
    """
    bits = scores.float().contiguous().view(torch.int32).long() & 0xFFFFFFFF
    bits = torch.where(bits == 0x80000000, torch.zeros_like(bits), bits)
    key = torch.where(bits >= 0x80000000, bits ^ 0xFFFFFFFF, bits | 0x80000000)
    return torch.where(torch.isnan(scores.float()), torch.full_like(key, 0xFFFFFFFF), key)


def topk_torch(scores, k, *, end=None, sorted=False, sorted_index=False, indices_type=torch.int32,
               idx_oob_fill_value=-1, value_oob_fill_value=float("-inf"), output_idx_offset=None,
               return_value=True):
    """Vectorized twin of `topk_ref` (same signature and result): a stable descending sort of
    `order_key`, entries at or beyond `end` keyed -1 so they rank below every real key."""
    b, n = check_topk_args(scores, k, end, sorted=sorted, sorted_index=sorted_index,
                           indices_type=indices_type, output_idx_offset=output_idx_offset,
                           return_value=return_value)
    check_end_values(end, n)
    dev = scores.device
    width = max(n, k)
    key = torch.full((b, width), -1, dtype=torch.int64, device=dev)
    key[:, :n] = order_key(scores)
    col = torch.arange(width, device=dev)
    ends = torch.full((b,), n, dtype=torch.int64, device=dev) if end is None else end.long()
    key = torch.where(col[None, :] < ends[:, None], key, torch.full_like(key, -1))
    # stable: among equal keys the original (ascending index) order is kept -> lower index first
    _, order = torch.sort(key, dim=1, descending=True, stable=True)
    idx = order[:, :k]
    valid = torch.arange(k, device=dev)[None, :] < ends.clamp(max=k)[:, None]
    if not sorted:
        big = torch.full_like(idx, width)
        idx = torch.sort(torch.where(valid, idx, big), dim=1).values
    vals = None
    if return_value:
        gathered = scores.gather(1, idx.clamp(max=max(n - 1, 0))) if n > 0 else \
            torch.empty((b, k), dtype=scores.dtype, device=dev)
        vals = torch.where(valid, gathered, torch.full_like(gathered, value_oob_fill_value))
    offs = 0 if output_idx_offset is None else output_idx_offset.long()[:, None]
    out_idx = torch.where(valid, idx + offs, torch.full_like(idx, idx_oob_fill_value)).to(indices_type)
    return vals, out_idx


def block_max_scores_ref(scores, block_size, end=None):
    """out[r, j] = max(scores[r, i] for i in block j if i < end[r]); -inf if none; NaN if any is NaN.

    The result is a copy of one input element (no arithmetic): the first NaN of the block if it has
    one (its exact bits: sign and payload kept), else the first of the equal maxima (so -0.0 vs +0.0
    is decided by position). scores: [b, n] fp32/bf16; end: [b] int32 or None.
    Returns [b, ceil(n / block_size)] scores.dtype.
    """
    b, n = check_block_max_args(scores, block_size, end)
    check_end_values(end, n)
    nblk = (n + block_size - 1) // block_size
    rows = scores.detach().cpu().float().tolist()
    ends = [n] * b if end is None else end.cpu().tolist()
    pick = [[-1] * nblk for _ in range(b)]  # index of the chosen element, -1: no valid entry
    for r in range(b):
        for j in range(nblk):
            best = float("-inf")
            for i in range(j * block_size, min((j + 1) * block_size, ends[r])):
                v = rows[r][i]
                if math.isnan(v):
                    pick[r][j] = i
                    break
                if pick[r][j] < 0 or v > best:
                    best, pick[r][j] = v, i
    pick = torch.tensor(pick, dtype=torch.int64).reshape(b, nblk)
    # select on the integer bit pattern: the element's bits are copied exactly (a NaN keeps its sign
    # and payload; a CPU gather on bf16 values may canonicalize NaNs)
    ibits = torch.int32 if scores.dtype == torch.float32 else torch.int16
    src = scores.detach().cpu().contiguous().view(ibits)
    picked = src.gather(1, pick.clamp(min=0)) if n else src.new_zeros((b, nblk))
    neg_inf = torch.full((1,), float("-inf"), dtype=scores.dtype).view(ibits)
    out = torch.where(pick >= 0, picked, neg_inf)
    return out.view(scores.dtype).to(scores.device)


def restore_candidate_indices_ref_(index, candidate_blocks, block_size):
    """In place: local i -> candidate_blocks[r, i // bs] * bs + i % bs; -1 stays -1; a lane whose
    candidate block is negative (padding) becomes -1.

    index: [b, k] int32; candidate_blocks: [b, c] int32. Returns index.
    """
    b, k, _ = check_restore_args(index, candidate_blocks, block_size)
    check_restore_values(index, candidate_blocks, block_size)
    idx, blocks = index.cpu().tolist(), candidate_blocks.cpu().tolist()
    for r in range(b):
        for lane in range(k):
            i = idx[r][lane]
            if i < 0:
                continue
            blk = blocks[r][i // block_size]
            idx[r][lane] = -1 if blk < 0 else blk * block_size + i % block_size
    index.copy_(torch.tensor(idx, dtype=torch.int32).reshape(index.shape))
    return index


def convert_kv_index_ref_(index, block_size_c, valid_lens, block_tables):
    """In place: slot(j) = block_tables[r, j // Bc] * Bc + j % Bc for lanes < valid_lens[r, t] holding
    j >= 0; every other lane becomes -1.

    index: [b, L, k] int32 (logical compressed rows); valid_lens: [b, L] int32;
    block_tables: [b, max_blocks] int32. Returns index.
    """
    b, L, k, _ = check_convert_args(index, block_size_c, valid_lens, block_tables)
    check_convert_values(index, block_size_c, valid_lens, block_tables)
    idx, lens, table = index.cpu().tolist(), valid_lens.cpu().tolist(), block_tables.cpu().tolist()
    for r in range(b):
        for t in range(L):
            for lane in range(k):
                j = idx[r][t][lane]
                if lane >= lens[r][t] or j < 0:
                    idx[r][t][lane] = -1
                else:
                    idx[r][t][lane] = table[r][j // block_size_c] * block_size_c + j % block_size_c
    index.copy_(torch.tensor(idx, dtype=torch.int32).reshape(index.shape))
    return index


def topk_to_slots_ref(scores, k, *, end=None, candidate_blocks=None, candidate_block_size=None,
                      block_size_c, block_tables):
    """topk (indices, ascending local index) -> restore candidates (optional) -> physical slots.

    scores: [b, n] fp32/bf16 (compact candidate rows when candidate_blocks is given); end: [b] int32;
    candidate_blocks: [b, c] int32; block_tables: [b, max_blocks] int32. Returns slots [b, k] int32.
    """
    b, n = check_topk_to_slots_args(scores, k, end, candidate_blocks, candidate_block_size,
                                    block_size_c, block_tables)
    check_topk_to_slots_values(scores, k, end, candidate_blocks, candidate_block_size, block_size_c,
                               block_tables)
    _, index = topk_ref(scores, k, end=end, return_value=False)
    if candidate_blocks is not None:
        restore_candidate_indices_ref_(index, candidate_blocks, candidate_block_size)
    ends = torch.full((b,), n, dtype=torch.int32, device=scores.device) if end is None else end
    valid = ends.clamp(max=k).to(torch.int32).reshape(b, 1)
    convert_kv_index_ref_(index.reshape(b, 1, k), block_size_c, valid, block_tables)
    return index
