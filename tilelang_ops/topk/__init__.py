"""Index-score selection (SPEC 1.6): exact top-k, block maxima, candidate restore, logical-row ->
physical-slot conversion, and the fused scores -> slots path.

Top-k is exact and deterministic: scores map to order-preserving uint32 keys (fp32 bits; bf16 widened
exactly; -0.0 folded onto +0.0 and every NaN onto 0xFFFFFFFF, so NaN ranks highest as in torch.topk; the
key of `reference.topk.order_key`), a radix select finds the k-th largest key, and an ordered pass gives
ties to the lower index and writes the lanes in **ascending index order** (unsorted and ``sorted_index``
are the same thing here); ``sorted=True`` sorts the k lanes afterwards with a stable torch sort on the same
key. Lanes [min(k, end), k) get the fills; `end` is clamped to [0, n] in the kernels so a bad `end` can
never read outside the row (the value check runs under TILELANG_OPS_DEBUG=1).

Three kernels, one per algorithm, chosen by `launch.topk_config` (or passed as ``config=``): `row` (any row
length: a sampled bound, one compacting read, radix passes on the short list; long rows of few-row
launches split over a cluster), `tile` (rows of one tile, keys in registers) and `warp` (many short rows,
one warp a row).
"""

import math

import torch

from metadata.checks import check_cuda, debug_checks_enabled
from metadata.topk_args import check_end_values, check_topk_args, check_topk_to_slots_args
from tilelang_ops._library import Plans, call_op, dummy, kernel, register_op
from tilelang_ops.topk._host import TORCH_TO_TL, check_unit_columns, flat_scores
from tilelang_ops.topk.elementwise import (
    block_max_kernel,
    block_max_scores,
    convert_kernel,
    convert_kv_index_,
    restore_candidate_indices_,
    restore_kernel,
)
from tilelang_ops.topk.launch import TopkConfig, cache_tier, default_config
from tilelang_ops.topk.row import row_kernel
from tilelang_ops.topk.tile import tile_kernel
from tilelang_ops.topk.warp import warp_kernel

Tensor = torch.Tensor

__all__ = ["TopkConfig", "block_max_scores", "convert_kv_index_", "restore_candidate_indices_", "topk",
           "topk_to_slots"]


def kernel_for(static: tuple, n: int, config: TopkConfig):
    """(factory, static arguments) of the top-k kernel of `config` for rows of n entries. static: (in
    dtype, index dtype, offset dtype, with_values, with_offset, idx_fill, val_fill, mode, cand_bs,
    block_c), the arguments every kernel takes."""
    config.check_row_length(n)
    if config.kernel == "warp":
        return warp_kernel, static + (config.rows_per_cta,)
    if config.kernel == "tile":
        return tile_kernel, static + (config.threads, config.unroll)
    return row_kernel, static[:3] + (cache_tier(n),) + static[3:] + (config.split, config.threads,
                                                                      config.stream)


_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def sort_key(values: torch.Tensor) -> torch.Tensor:
    """An int32 key in the order of ``reference.topk.order_key`` (equal keys for equal orders), in fewer
    torch ops: the fp32 bits with -0.0 folded onto +0.0, negatives' magnitude bits flipped (so signed
    integer order is value order), every NaN the largest key. INT32_MIN stays free: no value maps there."""
    bits = values.float().view(torch.int32)
    bits = bits.masked_fill(bits == _INT32_MIN, 0)
    key = bits ^ ((bits >> 31) & _INT32_MAX)
    return key.masked_fill_(values != values, _INT32_MAX)


def _sort_by_value(values, indices, end, n, k):
    """Stable descending sort of the (ascending-index) k lanes on the order key: ties keep the lower
    index first, fills (beyond the valid count) stay last."""
    key = sort_key(values)
    # lanes at or beyond min(end, n) hold fills: below every value
    if end is not None:
        key.masked_fill_(torch.arange(k, device=values.device) >= end.clamp(0, n)[:, None], _INT32_MIN)
    elif n < k:
        key[:, n:] = _INT32_MIN
    order = torch.sort(key, dim=1, descending=True, stable=True).indices
    return values.gather(1, order), indices.gather(1, order)


def exact_fill(value) -> float | str:
    """The value fill as a kernel's static argument: kernel caches compare their arguments by equality,
    for which -0.0 is 0.0 and a NaN differs from itself, so those two travel as ``float.hex``."""
    value = float(value)
    return value.hex() if value != value or (value == 0.0 and math.copysign(1.0, value) < 0) else value


def _topk_check(scores, k, end, sorted, sorted_index, indices_type, idx_oob_fill_value, value_oob_fill_value,
                output_idx_offset, return_value):
    """Every host check of a topk call; returns (b, n)."""
    b, n = check_topk_args(scores, k, end, sorted=sorted, sorted_index=sorted_index,
                           indices_type=indices_type, output_idx_offset=output_idx_offset,
                           return_value=return_value)
    check_cuda(scores=scores, end=end, output_idx_offset=output_idx_offset)
    check_unit_columns(scores)
    return b, n


def _topk_plan(scores, k, end, sorted, sorted_index, indices_type, idx_oob_fill_value, value_oob_fill_value,
               output_idx_offset, return_value, config=None):
    """(b, n, need_values, compiled kernel, placeholders) of a topk call's static key, after its host
    checks; the placeholders stand in for the absent optional tensors (end, offset, candidate blocks and
    block table, values)."""
    b, n = _topk_check(scores, k, end, sorted, sorted_index, indices_type, idx_oob_fill_value,
                       value_oob_fill_value, output_idx_offset, return_value)
    need_values = return_value or sorted
    if b == 0:
        return b, n, need_values, None, None
    off_dtype = output_idx_offset.dtype if output_idx_offset is not None else torch.int32
    config = config or default_config(b, n, scores.element_size(), scores.device)
    static = (TORCH_TO_TL[scores.dtype], TORCH_TO_TL[indices_type], TORCH_TO_TL[off_dtype], need_values,
              output_idx_offset is not None, int(idx_oob_fill_value), exact_fill(value_oob_fill_value),
              "topk", 0, 1)
    factory, static = kernel_for(static, n, config)
    dev = scores.device
    placeholders = (dummy(dev, torch.int32), dummy(dev, off_dtype), dummy(dev, torch.int32, (b, 1)),
                    dummy(dev, scores.dtype, (1, 1)))
    return b, n, need_values, kernel(factory, *static), placeholders


def _topk_launch(plan_, scores, k, end, sorted, indices_type, output_idx_offset):
    b, n, need_values, fn, placeholders = plan_
    dev = scores.device
    if debug_checks_enabled():
        check_end_values(end, n)
    values = torch.empty((b if need_values else 0, k), dtype=scores.dtype, device=dev)
    indices = torch.empty((b, k), dtype=indices_type, device=dev)
    if b == 0:
        return values, indices
    no_end, no_off, no_blocks, no_values = placeholders
    flat, ld = flat_scores(scores)
    # end and offset: the kernel reads them with unit stride
    fn(flat, end.contiguous() if end is not None else no_end,
       output_idx_offset.contiguous() if output_idx_offset is not None else no_off, no_blocks, no_blocks,
       values if need_values else no_values, indices, n, ld, int(end is not None))
    if sorted:
        values, indices = _sort_by_value(values, indices, end, n, k)
    return values, indices


_TOPK_PLANS = Plans(_topk_plan)


def _topk_impl(scores: Tensor, k: int, end: Tensor | None, sorted: bool, sorted_index: bool,
               indices_type: torch.dtype, idx_oob_fill_value: int, value_oob_fill_value: float,
               output_idx_offset: Tensor | None, return_value: bool) -> tuple[Tensor, Tensor]:
    # no schema defaults: the schema parser takes no -inf (the Python API ``topk`` has them)
    args = (scores, k, end, sorted, sorted_index, indices_type, idx_oob_fill_value, value_oob_fill_value,
            output_idx_offset, return_value)
    return _topk_launch(_TOPK_PLANS(args), scores, k, end, sorted, indices_type,
                        output_idx_offset)


def _topk_fake(scores, k, end, sorted, sorted_index, indices_type, idx_oob_fill_value, value_oob_fill_value,
               output_idx_offset, return_value):
    b, _ = _topk_check(scores, k, end, sorted, sorted_index, indices_type, idx_oob_fill_value,
                       value_oob_fill_value, output_idx_offset, return_value)
    need_values = return_value or sorted
    return (scores.new_empty((b if need_values else 0, k)), scores.new_empty((b, k), dtype=indices_type))


_TOPK_OP = register_op("topk", _topk_impl, _topk_fake)


def topk(scores, k, *, end=None, sorted=False, sorted_index=False, indices_type=torch.int32,
         idx_oob_fill_value=-1, value_oob_fill_value=float("-inf"), output_idx_offset=None,
         return_value=True, config: TopkConfig | None = None):
    """Per row: the min(k, end) best of scores[row, :end] (NaN highest, ties to lower index).

    scores: [b, n] fp32/bf16 (unit column stride); end: [b] int32; output_idx_offset: [b] int32/int64.
    Returns (values [b, k] or None, indices [b, k] indices_type); unsorted output is ascending index.
    ``torch.ops.tilelang_ops.topk`` (its values are [0, k] when neither return_value nor sorted asks
    for them). config: the launch (default: `launch.topk_config` for this shape and device); a call with
    a config launches directly, outside the registered op.
    """
    args = (scores, k, end, sorted, sorted_index, indices_type, idx_oob_fill_value, value_oob_fill_value,
            output_idx_offset, return_value)
    if config is None:
        values, indices = call_op(_TOPK_OP, _topk_check, *args)
    else:
        if not isinstance(config, TopkConfig):
            raise TypeError(f"config must be a TopkConfig, got {type(config).__name__}")
        values, indices = _topk_launch(_topk_plan(*args, config), scores, k, end, sorted, indices_type,
                                       output_idx_offset)
    return (values if return_value else None), indices


# The registered op takes its required arguments first: (scores, k, block_size_c, block_tables, end,
# candidate_blocks, candidate_block_size), so ``torch.ops.tilelang_ops.topk_to_slots`` has defaults.

def _slots_check(scores, k, block_size_c, block_tables, end=None, candidate_blocks=None,
                 candidate_block_size=None):
    """Every host check of a topk_to_slots call; returns (b, n)."""
    b, n = check_topk_to_slots_args(scores, k, end, candidate_blocks, candidate_block_size, block_size_c,
                                    block_tables)
    check_cuda(scores=scores, end=end, candidate_blocks=candidate_blocks, block_tables=block_tables)
    check_unit_columns(scores)
    return b, n


def _slots_plan(scores, k, block_size_c, block_tables, end, candidate_blocks, candidate_block_size,
                config=None):
    b, n = _slots_check(scores, k, block_size_c, block_tables, end, candidate_blocks, candidate_block_size)
    if b == 0:
        return b, n, None, None
    config = config or default_config(b, n, scores.element_size(), scores.device)
    static = (TORCH_TO_TL[scores.dtype], "int32", "int32", False, False, -1, float("-inf"), "slots",
              candidate_block_size or 0, block_size_c)
    factory, static = kernel_for(static, n, config)
    dev = scores.device
    # placeholders of the absent tensors: end (and the offset slots mode never has), candidate blocks, values
    placeholders = (dummy(dev, torch.int32), dummy(dev, torch.int32, (b, 1)),
                    dummy(dev, scores.dtype, (1, 1)))
    return b, n, kernel(factory, *static), placeholders


def _slots_launch(plan_, scores, k, block_size_c, block_tables, end, candidate_blocks, candidate_block_size):
    b, n, fn, placeholders = plan_
    if debug_checks_enabled():
        from reference.topk import topk_to_slots_ref

        # the reference runs every value check (end range, candidate range, table range)
        topk_to_slots_ref(scores, k, end=end, candidate_blocks=candidate_blocks,
                          candidate_block_size=candidate_block_size, block_size_c=block_size_c,
                          block_tables=block_tables)
    dev = scores.device
    slots = torch.empty((b, k), dtype=torch.int32, device=dev)
    if b == 0:
        return slots
    no_end, no_blocks, no_values = placeholders
    flat, ld = flat_scores(scores)
    fn(flat, end.contiguous() if end is not None else no_end, no_end,
       candidate_blocks if candidate_blocks is not None else no_blocks, block_tables, no_values, slots, n, ld,
       int(end is not None))
    return slots


_SLOTS_PLANS = Plans(_slots_plan)


def _slots_impl(scores: Tensor, k: int, block_size_c: int, block_tables: Tensor, end: Tensor | None = None,
                candidate_blocks: Tensor | None = None, candidate_block_size: int | None = None) -> Tensor:
    args = (scores, k, block_size_c, block_tables, end, candidate_blocks, candidate_block_size)
    return _slots_launch(_SLOTS_PLANS(args), *args)


def _slots_fake(scores, k, block_size_c, block_tables, end=None, candidate_blocks=None,
                candidate_block_size=None):
    b, _ = _slots_check(scores, k, block_size_c, block_tables, end, candidate_blocks, candidate_block_size)
    return scores.new_empty((b, k), dtype=torch.int32)


_SLOTS_OP = register_op("topk_to_slots", _slots_impl, _slots_fake)


def topk_to_slots(scores, k, *, end=None, candidate_blocks=None, candidate_block_size=None,
                  block_size_c, block_tables, config: TopkConfig | None = None):
    """One launch: topk indices (ascending local index) -> candidate restore (optional) -> slots,
    slot(j) = block_tables[r, j // Bc] * Bc + j % Bc; lanes beyond min(k, end) are -1.

    scores: [b, n] fp32/bf16 (compact candidate rows when candidate_blocks is given); end: [b] int32;
    candidate_blocks: [b, c] int32; block_tables: [b, max_blocks] int32. Returns slots [b, k] int32.
    A row or block the table cannot resolve gives -1 (TILELANG_OPS_DEBUG=1 raises instead).
    ``torch.ops.tilelang_ops.topk_to_slots(scores, k, block_size_c, block_tables, end, candidate_blocks,
    candidate_block_size)``; config: the launch (default: `launch.topk_config` for this shape and device),
    launched directly, outside the registered op.
    """
    args = (scores, k, block_size_c, block_tables, end, candidate_blocks, candidate_block_size)
    if config is None:
        return call_op(_SLOTS_OP, _slots_check, *args)
    if not isinstance(config, TopkConfig):
        raise TypeError(f"config must be a TopkConfig, got {type(config).__name__}")
    return _slots_launch(_slots_plan(*args, config), *args)


_TOPK = ("float32", "int32", "int32", True, False, -1, float("-inf"), "topk", 0, 1)
_BF16_OFF = ("bfloat16", "int64", "int64", True, True, -1, float("-inf"), "topk", 0, 1)
_IDX_ONLY = ("float32", "int32", "int32", False, False, -5, 0.0, "topk", 0, 1)
_SLOTS_CAND = ("float32", "int32", "int32", False, False, -1, float("-inf"), "slots", 16, 64)
_SLOTS_BF16 = ("bfloat16", "int32", "int32", False, False, -1, float("-inf"), "slots", 0, 64)
# (name, static arguments, row length, config): every code path of the three kernels
_BUILD = [
    ("topk fp32 uncached", _TOPK, 65536, TopkConfig()),
    ("topk fp32 cache32768", _TOPK, 32768, TopkConfig()),
    ("topk bf16 int64+offset cache4096", _BF16_OFF, 4096, TopkConfig()),
    ("topk fp32 indices-only fills", _IDX_ONLY, 32768, TopkConfig()),
    ("topk_to_slots fp32 cand16 Bc64", _SLOTS_CAND, 65536, TopkConfig()),
    ("topk_to_slots bf16 Bc64 cache4096", _SLOTS_BF16, 4096, TopkConfig()),
    ("topk fp32 cache32768 split2", _TOPK, 32768, TopkConfig(split=2)),
    ("topk fp32 uncached split8", _TOPK, 65536, TopkConfig(split=8)),
    ("topk_to_slots fp32 cand16 Bc64 split4", _SLOTS_CAND, 65536, TopkConfig(split=4)),
    ("topk fp32 uncached stream", _TOPK, 65536, TopkConfig(stream=True)),
    ("topk bf16 int64+offset cache4096 threads256", _BF16_OFF, 4096, TopkConfig(threads=256)),
    ("topk fp32 cache32768 threads512", _TOPK, 32768, TopkConfig(threads=512)),
    ("topk warp fp32", _TOPK, 1024, TopkConfig("warp")),
    ("topk warp bf16 int64+offset", _BF16_OFF, 1024, TopkConfig("warp")),
    ("topk_to_slots warp fp32 cand16 Bc64", _SLOTS_CAND, 1024, TopkConfig("warp")),
    ("topk tile fp32", _TOPK, 8192, TopkConfig("tile")),
    ("topk tile bf16 int64+offset", _BF16_OFF, 8192, TopkConfig("tile")),
    ("topk_to_slots tile fp32 cand16 Bc64", _SLOTS_CAND, 8192, TopkConfig("tile")),
    ("topk tile256x16 bf16 int64+offset", _BF16_OFF, 4096, TopkConfig("tile", 256, unroll=16)),
]
QUICK_BUILD = ("topk fp32 uncached split8", "topk fp32 uncached stream", "topk bf16 int64+offset cache4096",
               "topk_to_slots fp32 cand16 Bc64", "topk fp32 cache32768 split2",
               "topk fp32 cache32768 threads512", "topk warp bf16", "topk tile bf16", "topk tile256x16",
               "block_max", "restore", "convert")


def build_configs() -> list[tuple]:
    """(name, factory, static arguments) of every kernel configuration the build check compiles."""
    configs = [(name, *kernel_for(static, n, config)) for name, static, n, config in _BUILD]
    return configs + [
        ("block_max bs16 fp32", block_max_kernel, (16, "float32")),
        ("block_max bs8 bf16", block_max_kernel, (8, "bfloat16")),
        ("restore bs16", restore_kernel, (16,)),
        ("convert Bc64", convert_kernel, (64,)),
    ]


def build_all(quick: bool = False, workers: int | None = None) -> list[str]:
    """Compile every kernel for sm_90a at several static configurations (CPU build check), in ``workers``
    processes (default one per CPU). quick: one configuration per code path (the CPU test tier; `make diff`
    builds them all)."""
    from tilelang_ops.build import compile_sm90_in_processes

    names = [name for name, _, _ in build_configs() if not quick or name.startswith(QUICK_BUILD)]
    return compile_sm90_in_processes(__name__, names, workers)
