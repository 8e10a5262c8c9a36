"""Elementwise kernels of the top-k family: block maxima, candidate restore, row -> slot conversion."""

import tilelang
import tilelang.language as T
import torch

from metadata.checks import check_cuda, debug_checks_enabled
from metadata.topk_args import (
    check_block_max_args,
    check_convert_args,
    check_convert_values,
    check_end_values,
    check_restore_args,
    check_restore_values,
)
from tilelang_ops._library import Plans, call_op, dummy, kernel, register_op
from tilelang_ops.topk._host import TORCH_TO_TL, check_unit_columns, flat_scores

ELEM_THREADS = 256
Tensor = torch.Tensor


@tilelang.jit
def block_max_kernel(block_size: int, in_dtype: str = "float32"):
    """out[r, j] = max over valid entries of block j (first NaN wins; -inf when none)."""
    b, total, nblk, nb_end = T.dynamic("b, total, nblk, nb_end")
    NEG_INF = -T.infinity("float32")

    @T.prim_func
    def kernel(
        scores: T.Tensor((total,), in_dtype),  # [b, n] rows at stride ld, flattened
        end: T.Tensor((nb_end,), "int32"),  # [b] (or [1] dummy when has_end == 0)
        out: T.Tensor((b, nblk), in_dtype),  # [b, ceil(n / block_size)]
        n: T.int32,
        ld: T.int32,
        has_end: T.int32,
    ):
        with T.Kernel(T.ceildiv(nblk, ELEM_THREADS), b, threads=ELEM_THREADS) as (bx, row):
            tx = T.get_thread_binding()
            e = T.alloc_var("int32")
            best = T.alloc_var("float32")
            v = T.alloc_var("float32")
            raw = T.alloc_var(in_dtype)
            best_raw = T.alloc_var(in_dtype)  # the chosen element itself: its bits are copied out
            is_nan = T.alloc_var("int32")
            blk = bx * ELEM_THREADS + tx
            e = n
            if has_end != 0:
                e = T.max(T.min(end[row], n), 0)
            best = NEG_INF
            best_raw = T.Cast(in_dtype, NEG_INF)
            is_nan = 0
            if blk < nblk:
                for q in T.serial(block_size):
                    i = blk * block_size + q
                    if T.And(i < e, is_nan == 0):
                        raw = scores[row * ld + i]
                        v = T.Cast("float32", raw)  # exact widening, compares only
                        if (T.reinterpret(v, "uint32") & T.uint32(0x7FFFFFFF)) > T.uint32(0x7F800000):
                            best_raw = raw  # the first NaN wins with its exact bits (a float round
                            is_nan = 1  # trip would canonicalize a bf16 NaN)
                        elif T.Or(q == 0, v > best):  # first of equal maxima (-0.0 vs +0.0)
                            best = v
                            best_raw = raw
                out[row, blk] = best_raw

    return kernel


def _block_max_check(scores, block_size, end):
    """Every host check of a block_max_scores call; returns (b, n, blocks per row)."""
    b, n = check_block_max_args(scores, block_size, end)
    check_cuda(scores=scores, end=end)
    check_unit_columns(scores)
    if b and n and (b - 1) * scores.stride(0) + n >= 2**31:
        raise ValueError(f"block_max_scores supports < 2^31 score elements, got rows up to "
                         f"{(b - 1) * scores.stride(0) + n}")
    return b, n, (n + block_size - 1) // block_size


def _block_max_plan(scores, block_size, end):
    b, n, nblk = _block_max_check(scores, block_size, end)
    return b, n, nblk, kernel(block_max_kernel, block_size, TORCH_TO_TL[scores.dtype]) if b and nblk else None


_BLOCK_MAX_PLANS = Plans(_block_max_plan)


def _block_max_impl(scores: Tensor, block_size: int, end: Tensor | None = None) -> Tensor:
    b, n, nblk, fn = _BLOCK_MAX_PLANS((scores, block_size, end))
    if debug_checks_enabled():
        check_end_values(end, n)
    out = torch.empty((b, nblk), dtype=scores.dtype, device=scores.device)
    if fn is not None:
        flat, ld = flat_scores(scores)
        fn(flat, end.contiguous() if end is not None else dummy(scores.device, torch.int32), out, n, ld,
           int(end is not None))
    return out


def _block_max_fake(scores, block_size, end=None):
    b, _, nblk = _block_max_check(scores, block_size, end)
    return scores.new_empty((b, nblk))


_BLOCK_MAX_OP = register_op("block_max_scores", _block_max_impl, _block_max_fake)


def block_max_scores(scores, block_size, end=None):
    """out[r, j] = max(scores[r, i] for i in block j, i < end[r]); -inf if none; NaN if any is NaN.

    scores: [b, n] fp32/bf16 (unit column stride); end: [b] int32 or None. Returns [b, ceil(n / block_size)]
    scores.dtype (``torch.ops.tilelang_ops.block_max_scores``).
    """
    return call_op(_BLOCK_MAX_OP, _block_max_check, scores, block_size, end)


@tilelang.jit
def restore_kernel(block_size: int):
    """In place: i -> blocks[r, i // bs] * bs + i % bs; -1 (or an unresolvable lane) -> -1."""
    b, k, c = T.dynamic("b, k, c")

    @T.prim_func
    def kernel(
        index: T.Tensor((b, k), "int32"),  # [b, k] compact offsets, rewritten in place
        blocks: T.Tensor((b, c), "int32"),  # [b, c] candidate block ids
    ):
        with T.Kernel(T.ceildiv(k, ELEM_THREADS), b, threads=ELEM_THREADS) as (bx, row):
            tx = T.get_thread_binding()
            lane = bx * ELEM_THREADS + tx
            i = T.alloc_var("int32")
            blk = T.alloc_var("int32")
            if lane < k:
                i = index[row, lane]
                if i >= 0:
                    blk = -1
                    if i // block_size < c:
                        blk = blocks[row, i // block_size]
                    index[row, lane] = T.if_then_else(blk < 0, -1, blk * block_size + i % block_size)
                else:
                    index[row, lane] = -1

    return kernel


def _restore_check(index, candidate_blocks, block_size):
    """Every host check of a restore_candidate_indices_ call; returns (b, k)."""
    b, k, _ = check_restore_args(index, candidate_blocks, block_size)
    check_cuda(index=index, candidate_blocks=candidate_blocks)
    return b, k


def _restore_plan(index, candidate_blocks, block_size):
    b, k = _restore_check(index, candidate_blocks, block_size)
    return kernel(restore_kernel, block_size) if b and k else None


_RESTORE_PLANS = Plans(_restore_plan)


def _restore_impl(index: Tensor, candidate_blocks: Tensor, block_size: int) -> None:
    fn = _RESTORE_PLANS((index, candidate_blocks, block_size))
    if debug_checks_enabled():
        check_restore_values(index, candidate_blocks, block_size)
    if fn is not None:
        fn(index, candidate_blocks)


def _restore_fake(index, candidate_blocks, block_size):
    _restore_check(index, candidate_blocks, block_size)


_RESTORE_OP = register_op("restore_candidate_indices_", _restore_impl, _restore_fake, mutates_args=("index",))


def restore_candidate_indices_(index, candidate_blocks, block_size):
    """In place: local i -> candidate_blocks[r, i // bs] * bs + i % bs; -1 stays -1 (and a lane
    beyond the candidates or in a negative block becomes -1). index: [b, k] int32;
    candidate_blocks: [b, c] int32. Returns index (``torch.ops.tilelang_ops.restore_candidate_indices_``
    returns nothing)."""
    call_op(_RESTORE_OP, _restore_check, index, candidate_blocks, block_size)
    return index


@tilelang.jit
def convert_kernel(block_size_c: int):
    """In place: slot(j) = table[r, j // Bc] * Bc + j % Bc for lanes < valid_len holding j >= 0."""
    b, L, k, mb = T.dynamic("b, L, k, mb")

    @T.prim_func
    def kernel(
        index: T.Tensor((b, L, k), "int32"),  # [b, L, k] logical rows, rewritten in place
        valid_lens: T.Tensor((b, L), "int32"),  # [b, L]
        table: T.Tensor((b, mb), "int32"),  # [b, max_blocks]
    ):
        with T.Kernel(T.ceildiv(k, ELEM_THREADS), L, b, threads=ELEM_THREADS) as (bx, t, row):
            tx = T.get_thread_binding()
            lane = bx * ELEM_THREADS + tx
            j = T.alloc_var("int32")
            tb = T.alloc_var("int32")
            if lane < k:
                j = index[row, t, lane]
                tb = -1
                if T.And(T.And(lane < valid_lens[row, t], j >= 0), j // block_size_c < mb):
                    tb = table[row, j // block_size_c]
                index[row, t, lane] = T.if_then_else(tb < 0, -1, tb * block_size_c + j % block_size_c)

    return kernel


def _convert_check(index, block_size_c, valid_lens, block_tables):
    """Every host check of a convert_kv_index_ call; returns (b, L, k)."""
    b, L, k, _ = check_convert_args(index, block_size_c, valid_lens, block_tables)
    check_cuda(index=index, valid_lens=valid_lens, block_tables=block_tables)
    return b, L, k


def _convert_plan(index, block_size_c, valid_lens, block_tables):
    b, L, k = _convert_check(index, block_size_c, valid_lens, block_tables)
    return kernel(convert_kernel, block_size_c) if b and L and k else None


_CONVERT_PLANS = Plans(_convert_plan)


def _convert_impl(index: Tensor, block_size_c: int, valid_lens: Tensor, block_tables: Tensor) -> None:
    fn = _CONVERT_PLANS((index, block_size_c, valid_lens, block_tables))
    if debug_checks_enabled():
        check_convert_values(index, block_size_c, valid_lens, block_tables)
    if fn is not None:
        fn(index, valid_lens, block_tables)


def _convert_fake(index, block_size_c, valid_lens, block_tables):
    _convert_check(index, block_size_c, valid_lens, block_tables)


_CONVERT_OP = register_op("convert_kv_index_", _convert_impl, _convert_fake, mutates_args=("index",))


def convert_kv_index_(index, block_size_c, valid_lens, block_tables):
    """In place: slot(j) = block_tables[r, j // Bc] * Bc + j % Bc for lanes < valid_lens[r, t] holding
    j >= 0; every other lane becomes -1. index: [b, L, k] int32; valid_lens: [b, L] int32;
    block_tables: [b, max_blocks] int32. Returns index (``torch.ops.tilelang_ops.convert_kv_index_``
    returns nothing)."""
    call_op(_CONVERT_OP, _convert_check, index, block_size_c, valid_lens, block_tables)
    return index
