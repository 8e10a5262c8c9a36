"""Host-side argument checks for the top-k family (SPEC 1.6 / 3), shared by `reference.topk` and
`tilelang_ops.topk`.

The ``check_*_args`` functions read shapes, dtypes and devices only (no device sync); the
``check_*_values`` functions read tensor values: the references always call them, the kernel wrappers
only under ``metadata.checks.debug_checks_enabled()``. Without them a kernel still never reads or writes
outside its tensors (it writes -1 / fills for lanes it cannot resolve).
"""

from __future__ import annotations

import torch

from metadata.checks import check_int, check_same_device, check_tensor, describe

SCORE_DTYPES = (torch.float32, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
MAX_K = 4096  # the kernels hold at most this many selected lanes per row


def check_scores(scores) -> tuple[int, int]:
    """scores: [b, n] fp32 or bf16, unit stride along n (any row stride). Returns (b, n)."""
    check_tensor("scores", scores, dtype=SCORE_DTYPES, ndim=2)
    b, n = scores.shape
    if n > 1 and scores.stride(1) != 1:
        raise ValueError(f"scores must have unit stride along the row, got strides {scores.stride()}")
    return b, n


def check_end(end, b: int, device) -> None:
    """end: [b] int32 (None means the whole row)."""
    if end is None:
        return
    check_tensor("end", end, dtype=torch.int32, shape=(b,))
    check_same_device(scores=torch.empty(0, device=device), end=end)


def check_topk_args(scores, k, end, *, sorted=False, sorted_index=False, indices_type=torch.int32,
                    output_idx_offset=None, return_value=True) -> tuple[int, int]:
    """All shape/dtype/device rules of `topk`; returns (b, n)."""
    b, n = check_scores(scores)
    check_int("k", k, lo=1)
    if k > MAX_K:
        raise ValueError(f"k must be <= {MAX_K}, got {k}")
    check_end(end, b, scores.device)
    if indices_type not in INDEX_DTYPES:
        raise TypeError(f"indices_type must be torch.int32 or torch.int64, got {indices_type}")
    if sorted and sorted_index:
        raise ValueError("sorted=True (by value) and sorted_index=True (by index) are exclusive")
    if output_idx_offset is not None:
        check_tensor("output_idx_offset", output_idx_offset, dtype=INDEX_DTYPES, shape=(b,))
        check_same_device(scores=scores, output_idx_offset=output_idx_offset)
    if not isinstance(return_value, bool):
        raise TypeError(f"return_value must be a bool, got {describe(return_value)}")
    return b, n


def check_end_values(end, n: int) -> None:
    """Value check (device sync): 0 <= end <= n."""
    if end is None or end.numel() == 0:
        return
    lo, hi = int(end.min()), int(end.max())
    if lo < 0 or hi > n:
        bad = int(((end < 0) | (end > n)).nonzero()[0, 0])
        raise ValueError(f"end must lie in [0, n={n}], got end[{bad}] = {int(end[bad])} "
                         f"(min {lo}, max {hi})")


def check_block_max_args(scores, block_size, end) -> tuple[int, int]:
    b, n = check_scores(scores)
    check_int("block_size", block_size, lo=1)
    check_end(end, b, scores.device)
    return b, n


def check_restore_args(index, candidate_blocks, block_size) -> tuple[int, int, int]:
    """index: [b, k] int32 (compact offsets, -1 = empty lane); candidate_blocks: [b, c] int32."""
    check_tensor("index", index, dtype=torch.int32, ndim=2, contiguous=True)
    b, k = index.shape
    check_tensor("candidate_blocks", candidate_blocks, dtype=torch.int32, ndim=2, contiguous=True)
    if candidate_blocks.shape[0] != b:
        raise ValueError(f"candidate_blocks must have {b} rows like index, "
                         f"got {tuple(candidate_blocks.shape)}")
    check_int("block_size", block_size, lo=1)
    check_same_device(index=index, candidate_blocks=candidate_blocks)
    return b, k, candidate_blocks.shape[1]


def check_restore_values(index, candidate_blocks, block_size) -> None:
    """Value check: every lane is -1 or a compact offset inside the c * block_size candidate rows."""
    limit = candidate_blocks.shape[1] * block_size
    bad = (index < -1) | (index >= limit)
    if bool(bad.any()):
        r, c = bad.nonzero()[0].tolist()
        raise ValueError(f"index[{r}, {c}] = {int(index[r, c])} is neither -1 nor in [0, {limit}) "
                         f"(candidate blocks {candidate_blocks.shape[1]} x block_size {block_size})")


def check_convert_args(index, block_size_c, valid_lens, block_tables) -> tuple[int, int, int, int]:
    """index: [b, L, k] int32; valid_lens: [b, L] int32; block_tables: [b, max_blocks] int32."""
    check_tensor("index", index, dtype=torch.int32, ndim=3, contiguous=True)
    b, L, k = index.shape
    check_int("block_size_c", block_size_c, lo=1)
    check_tensor("valid_lens", valid_lens, dtype=torch.int32, shape=(b, L), contiguous=True)
    check_tensor("block_tables", block_tables, dtype=torch.int32, ndim=2, contiguous=True)
    if block_tables.shape[0] != b:
        raise ValueError(f"block_tables must have {b} rows like index, got {tuple(block_tables.shape)}")
    check_same_device(index=index, valid_lens=valid_lens, block_tables=block_tables)
    return b, L, k, block_tables.shape[1]


def check_convert_values(index, block_size_c, valid_lens, block_tables) -> None:
    """Value check: valid_lens >= 0; every valid lane holds -1 or a row whose block is in the table
    and allocated (block id >= 0)."""
    if bool((valid_lens < 0).any()):
        r, c = (valid_lens < 0).nonzero()[0].tolist()
        raise ValueError(f"valid_lens[{r}, {c}] = {int(valid_lens[r, c])} is negative")
    k = index.shape[2]
    lane = torch.arange(k, device=index.device)
    valid = lane[None, None, :] < valid_lens[:, :, None]
    max_blocks = block_tables.shape[1]
    logical = index.long()
    blk = torch.div(logical, block_size_c, rounding_mode="floor")
    bad = valid & ((index < -1) | (blk >= max_blocks))
    if bool(bad.any()):
        r, t, c = bad.nonzero()[0].tolist()
        raise ValueError(f"index[{r}, {t}, {c}] = {int(index[r, t, c])} is outside the block table "
                         f"({max_blocks} blocks of {block_size_c} rows)")
    live = valid & (index >= 0)
    table = block_tables.long().gather(1, blk.clamp(0, max_blocks - 1).reshape(index.shape[0], -1))
    table = table.reshape(index.shape)
    bad = live & (table < 0)
    if bool(bad.any()):
        r, t, c = bad.nonzero()[0].tolist()
        raise ValueError(f"index[{r}, {t}, {c}] = {int(index[r, t, c])} lies in block "
                         f"{int(blk[r, t, c])} whose block_tables entry is {int(table[r, t, c])}")


def check_topk_to_slots_args(scores, k, end, candidate_blocks, candidate_block_size, block_size_c,
                             block_tables) -> tuple[int, int]:
    """`topk_to_slots` rules: `topk` rules plus restore (optional) and convert arguments."""
    b, n = check_topk_args(scores, k, end)
    if (candidate_blocks is None) != (candidate_block_size is None):
        raise ValueError("candidate_blocks and candidate_block_size go together (both or neither)")
    if candidate_blocks is not None:
        check_tensor("candidate_blocks", candidate_blocks, dtype=torch.int32, ndim=2, contiguous=True)
        if candidate_blocks.shape[0] != b:
            raise ValueError(f"candidate_blocks must have {b} rows, got {tuple(candidate_blocks.shape)}")
        check_int("candidate_block_size", candidate_block_size, lo=1)
        if candidate_blocks.shape[1] * candidate_block_size < n:
            raise ValueError(f"scores has {n} compact rows but candidate_blocks covers only "
                             f"{candidate_blocks.shape[1]} x {candidate_block_size}")
        check_same_device(scores=scores, candidate_blocks=candidate_blocks)
    check_int("block_size_c", block_size_c, lo=1)
    check_tensor("block_tables", block_tables, dtype=torch.int32, ndim=2, contiguous=True)
    if block_tables.shape[0] != b:
        raise ValueError(f"block_tables must have {b} rows like scores, got {tuple(block_tables.shape)}")
    check_same_device(scores=scores, block_tables=block_tables)
    return b, n


def check_topk_to_slots_values(scores, k, end, candidate_blocks, candidate_block_size, block_size_c,
                               block_tables) -> None:
    """Value check of `topk_to_slots` (device sync), in the caller's arguments: ``end`` in ``[0, n]``,
    and every row a lane may select (a valid compact row, through its candidate block when there are
    candidates; -1 candidate blocks are padding) lies in an allocated block of ``block_tables``."""
    b, n = scores.shape
    check_end_values(end, n)
    ends = torch.full((b,), n, dtype=torch.int64, device=scores.device) if end is None else end.long()
    col = torch.arange(n, device=scores.device)
    valid = col[None, :] < ends[:, None]  # [b, n] rows top-k may select
    if candidate_blocks is None:
        logical = col[None, :].expand(b, n)
    else:
        blk = candidate_blocks.long()[:, col // candidate_block_size]
        valid = valid & (blk >= 0)
        logical = blk * candidate_block_size + col % candidate_block_size
    def limit(r):
        return f"end[{r}]={int(ends[r])}" if end is not None else f"the row length n={n} (end=None)"

    max_blocks = block_tables.shape[1]
    tb = torch.div(logical, block_size_c, rounding_mode="floor")
    short = valid & (tb >= max_blocks)
    if bool(short.any()):
        r, i = short.nonzero()[0].tolist()
        via = ""
        if candidate_blocks is not None:
            c = i // candidate_block_size
            via = (f" (candidate_blocks[{r}, {c}]={int(candidate_blocks[r, c])} x "
                   f"candidate_block_size={candidate_block_size})")
        raise ValueError(f"block_tables has {max_blocks} blocks of block_size_c={block_size_c} rows each, "
                         f"too short for row {int(logical[r, i])}{via} in block {int(tb[r, i])}, which top-k "
                         f"may select under {limit(r)}")
    entry = block_tables.long().gather(1, tb.clamp(0, max(max_blocks - 1, 0))) if max_blocks else tb
    unallocated = valid & (entry < 0)
    if bool(unallocated.any()):
        r, i = unallocated.nonzero()[0].tolist()
        raise ValueError(f"block_tables[{r}, {int(tb[r, i])}]={int(entry[r, i])} is not an allocated block, "
                         f"but top-k may select its row {int(logical[r, i])} under {limit(r)}")
