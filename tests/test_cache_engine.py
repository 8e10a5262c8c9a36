"""Accounting contracts: ring sizing and state bytes (SPEC 1.3-1.4) and cache byte layouts (SPEC 2).

Everything here is integer arithmetic that the SPEC states as numbers, so every check is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from metadata import (
    ALL_FORMATS,
    BF16_KV_FORMAT,
    DEFAULT_MAX_BACKTRACKING_TOKENS,
    FP4_INDEX_KV_FORMAT,
    FP4_MAIN_KV_FORMAT,
    FP8_MAIN_KV_FORMAT,
    SUPPORTED_COMPRESS_RATIOS,
    KVCacheFormat,
    check_compress_ratio,
    check_ring_capacity,
    compress_state_bytes,
    compress_state_ring_size,
    needs_index_state,
)
from metadata.cache_engine import check_state_ratio, min_ring_size
from metadata.cache_format import slot_location
from tests.conftest import case_id

# --------------------------------------------------------------------------------------------------
# Ring sizing and state bytes
# --------------------------------------------------------------------------------------------------


def test_engine_defaults():
    assert DEFAULT_MAX_BACKTRACKING_TOKENS == 6  # 5 draft tokens + 1
    assert SUPPORTED_COMPRESS_RATIOS == (1, 2)


@pytest.mark.parametrize(
    "ratio, backtracking, ring",
    [
        (2, DEFAULT_MAX_BACKTRACKING_TOKENS, 7),  # the C2 default the SPEC names
        (2, 1, 2),  # plain decode: the ring holds exactly one group
        (2, 0, 2),  # max(0, -1) = 0
        (1, 6, 0),  # C1 keeps no state
    ],
    ids=lambda v: str(v),
)
def test_ring_size(ratio, backtracking, ring):
    assert compress_state_ring_size(ratio, backtracking) == ring


def test_ring_size_default_argument():
    assert compress_state_ring_size(2) == 7


@pytest.mark.parametrize(
    "ratio, dim, backtracking, nbytes",
    [
        (2, 512, 6, 7 * 2 * 512 * 4),  # 28,672 B per slot: the C2 default of the main branch
        (2, 128, 6, 7 * 2 * 128 * 4),
        (2, 512, 1, 2 * 2 * 512 * 4),
        (1, 512, 6, 0),
    ],
    ids=lambda v: str(v),
)
def test_state_bytes(ratio, dim, backtracking, nbytes):
    assert compress_state_bytes(ratio, dim, backtracking) == nbytes


def test_state_bytes_c2_default_literal():
    assert compress_state_bytes(2, 512) == 28_672


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: compress_state_ring_size(2, -1), ValueError, r"max_backtracking_tokens=-1 must be >= 0"),
        (lambda: compress_state_ring_size(3), ValueError, r"compress_ratio=3 is not supported"),
        (lambda: compress_state_ring_size(0), ValueError, r"compress_ratio=0 is not supported"),
        (lambda: compress_state_ring_size(4), ValueError, r"compress_ratio=4 is not supported"),
        (lambda: compress_state_ring_size(2.0), TypeError, r"compress_ratio must be an int"),
        (lambda: compress_state_bytes(6, 512), ValueError, r"compress_ratio=6"),
        (lambda: check_state_ratio(True), TypeError, r"must be an int, got bool"),
        (lambda: check_state_ratio(1), ValueError, r"compress_ratio=1 keeps no compression state"),
        (lambda: needs_index_state(3), ValueError, r"compress_ratio=3"),
        (lambda: needs_index_state(4), ValueError, r"compress_ratio=4"),
    ],
    ids=["negative_backtracking", "ratio_3", "ratio_0", "ratio_4", "ratio_float", "bytes_ratio_6",
         "state_bool", "state_c1", "index_state_ratio_3", "index_state_ratio_4"],
)
def test_sizing_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("ratio", [1, 2])
def test_needs_index_state_never(ratio):
    assert needs_index_state(ratio) is False  # index keys carry no ring of their own (SPEC 1.5)


@pytest.mark.parametrize("ratio", [1, 2])
def test_check_compress_ratio_accepts_engine_ratios(ratio):
    assert check_compress_ratio(ratio) is None


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(compress_ratio=4), ValueError, r"compress_ratio=4 is not supported; expected one of \(1, 2\)"),
        (dict(compress_ratio=0), ValueError, r"compress_ratio=0 is not supported"),
        (dict(compress_ratio=2, compress_overlap=True), ValueError,
         r"compress_overlap=True is not supported"),
        (dict(compress_ratio=2, use_ape=True), ValueError, r"use_ape=True is not supported"),
        (dict(compress_ratio=True), TypeError, r"compress_ratio must be an int, got bool"),
        (dict(compress_ratio="2"), TypeError, r"compress_ratio must be an int, got str"),
    ],
    ids=["ratio_4", "ratio_0", "overlap", "ape", "bool", "str"],
)
def test_check_compress_ratio_rejects(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        check_compress_ratio(**kwargs)


@pytest.mark.parametrize("ratio", [2])
@pytest.mark.parametrize("max_seqlen_q", [1, 2, 6])
def test_ring_capacity_boundary(ratio, max_seqlen_q):
    need = ratio + max_seqlen_q - 1
    assert min_ring_size(ratio, max_seqlen_q) == need
    check_ring_capacity(need, ratio, max_seqlen_q)  # exactly the minimum is enough
    check_ring_capacity(need + 3, ratio, max_seqlen_q)
    with pytest.raises(ValueError, match=rf"ring of {need - 1} slots .* needs at least {need}"):
        check_ring_capacity(need - 1, ratio, max_seqlen_q)


def test_default_ring_fits_spec_decode():
    # The default C2 ring (7) admits a 6-token verification step and nothing longer.
    ring = compress_state_ring_size(2)
    check_ring_capacity(ring, 2, DEFAULT_MAX_BACKTRACKING_TOKENS)
    with pytest.raises(ValueError, match=r"compress_ratio=2 with max_seqlen_q=7 needs at least 8"):
        check_ring_capacity(ring, 2, DEFAULT_MAX_BACKTRACKING_TOKENS + 1)


# --------------------------------------------------------------------------------------------------
# Cache formats
# --------------------------------------------------------------------------------------------------


@dataclass
class FormatCase:
    id: str
    fmt: KVCacheFormat
    data_bytes: int
    scale_bytes: int
    row_bytes: int
    block_bytes_64: int  # a 128-position C2 block holds 64 rows (SPEC 2)


FORMAT_CASES = [
    FormatCase("fp8_main", FP8_MAIN_KV_FORMAT, 512, 16, 528, 33_792),
    FormatCase("fp4_main", FP4_MAIN_KV_FORMAT, 256, 32, 288, 18_432),
    FormatCase("fp4_index", FP4_INDEX_KV_FORMAT, 64, 4, 68, 4_352),
    FormatCase("bf16", BF16_KV_FORMAT, 1024, 0, 1024, 65_536),
]


def test_all_formats_listed():
    assert ALL_FORMATS == tuple(c.fmt for c in FORMAT_CASES)


@pytest.mark.parametrize("case", FORMAT_CASES, ids=case_id)
def test_format_bytes(case: FormatCase):
    fmt = case.fmt
    assert (fmt.data_bytes, fmt.scale_bytes, fmt.row_bytes) == (case.data_bytes, case.scale_bytes,
                                                                case.row_bytes)
    assert fmt.block_bytes(64) == case.block_bytes_64
    assert fmt.block_bytes(1) == case.row_bytes


@pytest.mark.parametrize("case", FORMAT_CASES, ids=case_id)
@pytest.mark.parametrize("rows", [1, 3, 64, 128])
def test_rows_per_block_inverts_block_bytes(case: FormatCase, rows: int):
    assert case.fmt.rows_per_block(case.fmt.block_bytes(rows)) == rows


@pytest.mark.parametrize("case", FORMAT_CASES, ids=case_id)
@pytest.mark.parametrize("width_delta", ["zero", "negative", "plus_one", "minus_one"])
def test_rows_per_block_rejects_bad_width(case: FormatCase, width_delta: str):
    width = {"zero": 0, "negative": -case.row_bytes, "plus_one": 64 * case.row_bytes + 1,
             "minus_one": 64 * case.row_bytes - 1}[width_delta]
    with pytest.raises(ValueError, match=rf"{case.fmt.name}: cache block width {width} B is not a positive "
                                         rf"multiple of row_bytes={case.row_bytes}"):
        case.fmt.rows_per_block(width)


@pytest.mark.parametrize("case", FORMAT_CASES, ids=case_id)
def test_offsets_tile_the_block(case: FormatCase):
    """Data and scale ranges of all rows cover the block exactly once (no gap, no overlap)."""
    fmt, rows = case.fmt, 64
    owner = [None] * fmt.block_bytes(rows)
    for row in range(rows):
        spans = [(fmt.data_offset(row, rows), fmt.data_bytes), (fmt.scale_offset(row, rows), fmt.scale_bytes)]
        for start, length in spans:
            for byte in range(start, start + length):
                assert owner[byte] is None, f"byte {byte} claimed by rows {owner[byte]} and {row}"
                owner[byte] = row
    assert None not in owner


def test_layouts_per_row_and_block_sections():
    # Per-row formats: row i at [i * row_bytes, (i + 1) * row_bytes), data then scales.
    assert FP8_MAIN_KV_FORMAT.data_offset(3, 64) == 3 * 528
    assert FP8_MAIN_KV_FORMAT.scale_offset(3, 64) == 3 * 528 + 512
    assert FP4_MAIN_KV_FORMAT.scale_offset(5, 64) == 5 * 288 + 256
    # FP4 index: a block is [Bc * 64 data][Bc * 4 scales].
    assert FP4_INDEX_KV_FORMAT.data_offset(5, 64) == 5 * 64
    assert FP4_INDEX_KV_FORMAT.scale_offset(5, 64) == 64 * 64 + 5 * 4
    assert FP4_INDEX_KV_FORMAT.scale_offset(0, 32) == 32 * 64


def test_cast_constants():
    assert FP8_MAIN_KV_FORMAT.qmax == 448.0 and FP8_MAIN_KV_FORMAT.amax_floor == 1e-4
    assert FP4_INDEX_KV_FORMAT.qmax == 6.0 and FP4_INDEX_KV_FORMAT.amax_floor == 6.0 * 2.0**-126
    assert FP4_MAIN_KV_FORMAT.qmax == 6.0 and FP4_MAIN_KV_FORMAT.amax_floor == 6.0 * 2.0**-9
    assert (FP8_MAIN_KV_FORMAT.group_size, FP4_MAIN_KV_FORMAT.group_size, FP4_INDEX_KV_FORMAT.group_size) == (
        32, 16, 32)


@pytest.mark.parametrize("slot, rows_per_block, where", [(0, 64, (0, 0)), (63, 64, (0, 63)), (64, 64, (1, 0)),
                                                         (200, 64, (3, 8)), (5, 1, (5, 0))])
def test_slot_location(slot, rows_per_block, where):
    assert slot_location(slot, rows_per_block) == where
