"""Top-k family (SPEC 1.6): loop references, the vectorized twin, host checks, and (GPU tier) the
TileLang kernels against them.

Comparisons: indices and slots are integers -> bitwise. Values are copies of input scores (no
arithmetic) -> bitwise too (NaN payloads included, since the kernel copies the score bits). When neither
``sorted`` nor ``sorted_index`` is asked the order is unspecified by contract, so those tests compare
(index, value) pairs after sorting both sides by index.
"""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
import torch

from reference.topk import (
    block_max_scores_ref,
    convert_kv_index_ref_,
    order_key,
    restore_candidate_indices_ref_,
    topk_ref,
    topk_to_slots_ref,
    topk_torch,
)
from tests.conftest import case_id, requires_cuda
from tilelang_ops.testing import compare_bitwise
from tilelang_ops.testing.topk import (
    ALL_GPU_CASES,
    DISTS,
    INF,
    NAN,
    TwinCase,
    as_pairs_by_index,
    block_max_by_amax,
    canonical_nans,
    config_label,
    make_end,
    make_scores,
    poison_beyond_end,
    with_nan_payloads,
)
from tilelang_ops.topk.launch import TopkConfig, tile_unroll

# ----------------------------------------------------------------------------------------------------
# CPU tier: the loop reference on hand-made rows

def test_ties_go_to_lower_index():
    x = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0, 2.0]])
    v, i = topk_ref(x, 2, sorted=True)
    assert i.tolist() == [[1, 2]] and v.tolist() == [[2.0, 2.0]]
    _, i = topk_ref(x, 5, sorted=True)
    assert i.tolist() == [[1, 2, 3, 5, 0]]


def test_nan_ranks_highest_and_signed_zeros_tie():
    x = torch.tensor([[0.0, NAN, -0.0, INF, NAN, 0.0, -1.0]])
    v, i = topk_ref(x, 5, sorted=True)
    assert i.tolist() == [[1, 4, 3, 0, 2]]  # NaNs by index, then inf, then the zeros by index
    assert torch.isnan(v[0, :2]).all() and v[0, 2] == INF
    # torch.topk agrees where there are no ties
    y = torch.tensor([[3.0, NAN, -2.0, INF, 1.0]])
    tv, ti = torch.topk(y, 3)
    assert topk_ref(y, 3, sorted=True, indices_type=torch.int64)[1].tolist() == ti.tolist()


def test_signed_zero_key_folds():
    assert int(order_key(torch.tensor([-0.0]))) == int(order_key(torch.tensor([0.0])))
    x = torch.tensor([-INF, -1.0, -1e-40, 0.0, 1e-40, 1.0, INF, NAN])
    keys = order_key(x)
    assert (keys[1:] > keys[:-1]).all() and int(keys[-1]) == 0xFFFFFFFF and int(keys.min()) > 0


def test_key_floor_leaves_key_zero_free():
    # the row kernel marks "no entry" (past the end) with key 0 and starts its search range at key 1: every
    # real score, NaN and -inf included, must key at least 0x007FFFFF (the key of -inf). Every bf16 bit
    # pattern, and fp32 extremes plus random bit patterns.
    bf = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    f32 = torch.cat([torch.randint(-(1 << 31), (1 << 31) - 1, (1 << 20,), generator=g, dtype=torch.int64),
                     torch.tensor([0x7F800000, 0xFF800000, 0xFF7FFFFF, 0x80000001, 0xFFFFFFFF, 0x7FFFFFFF,
                                   0xFF800001, 0x80000000, 0])]).to(torch.int64)
    f32 = torch.where(f32 >= 1 << 31, f32 - (1 << 32), f32).to(torch.int32).view(torch.float32)
    for x in (bf, f32):
        keys = order_key(x)
        assert int(keys.min()) == 0x007FFFFF == int(order_key(torch.tensor([-INF])))
        assert int(keys.max()) == 0xFFFFFFFF


def test_end_shorter_than_k_and_zero_fills():
    x = torch.tensor([[5.0, 4.0, 3.0, 2.0], [1.0, 2.0, 3.0, 4.0], [9.0, 9.0, 9.0, 9.0]])
    end = torch.tensor([2, 0, 4], dtype=torch.int32)
    v, i = topk_ref(x, 3, end=end, sorted=True, idx_oob_fill_value=-7, value_oob_fill_value=-3.5)
    assert i.tolist() == [[0, 1, -7], [-7, -7, -7], [0, 1, 2]]
    assert v.tolist() == [[5.0, 4.0, -3.5], [-3.5, -3.5, -3.5], [9.0, 9.0, 9.0]]


def test_k_larger_than_row():
    x = torch.tensor([[1.0, 3.0, 2.0]])
    v, i = topk_ref(x, 5, sorted=True)
    assert i.tolist() == [[1, 2, 0, -1, -1]] and v[0, 3] == -INF


def test_garbage_beyond_end_ignored():
    x = torch.tensor([[1.0, 2.0, INF, NAN, INF]])
    _, i = topk_ref(x, 2, end=torch.tensor([2], dtype=torch.int32), sorted=True)
    assert i.tolist() == [[1, 0]]


def test_offsets_shift_valid_lanes_only():
    x = torch.tensor([[1.0, 3.0, 2.0], [4.0, 5.0, 6.0]])
    off = torch.tensor([100, 1000], dtype=torch.int32)
    _, i = topk_ref(x, 4, end=torch.tensor([2, 3], dtype=torch.int32), sorted=True, output_idx_offset=off)
    assert i.tolist() == [[101, 100, -1, -1], [1002, 1001, 1000, -1]]


def test_sorted_index_and_unsorted_order():
    x = torch.tensor([[1.0, 7.0, 3.0, 9.0, 5.0]])
    assert topk_ref(x, 3, sorted=True)[1].tolist() == [[3, 1, 4]]
    assert topk_ref(x, 3, sorted_index=True)[1].tolist() == [[1, 3, 4]]
    assert topk_ref(x, 3)[1].tolist() == [[1, 3, 4]]  # documented: ascending index


def test_return_value_false_and_int64():
    x = torch.tensor([[1.0, 7.0, 3.0]])
    v, i = topk_ref(x, 2, return_value=False, indices_type=torch.int64)
    assert v is None and i.dtype == torch.int64 and i.tolist() == [[1, 2]]


def test_bf16_values_are_copies():
    x = torch.tensor([[1.0, 1.0078125, 1.015625, -2.0]], dtype=torch.bfloat16)  # bf16 step at 1: 2^-7
    v, i = topk_ref(x, 2, sorted=True)
    assert v.dtype == torch.bfloat16 and i.tolist() == [[2, 1]]
    compare_bitwise("values", v, x[:, [2, 1]]).check()


def test_non_contiguous_rows():
    base = make_scores("few", 5, 64)
    x = base[:, 3:40]  # row stride 64, unit column stride
    assert not x.is_contiguous()
    for fn in (topk_ref, topk_torch):
        v, i = fn(x, 9, sorted=True)
        rv, ri = topk_ref(x.contiguous(), 9, sorted=True)
        compare_bitwise("indices", i, ri).check()
        compare_bitwise("values", v, rv).check()


def test_sample_adversarial_generators():
    # the kernels sample runs of 32 at every n // 256 entries: "sampled" puts the hot (+100) entries
    # exactly there, "unsampled" only between them (else the GPU cases would not test what they claim)
    n = 65536
    sampled = torch.tensor([r * (n // 256) + lane for r in range(256) for lane in range(32)])
    for dist, want in (("sampled", True), ("unsampled", False)):
        x = make_scores(dist, 2, n)
        hot = x > 50
        assert bool(hot[:, sampled].all()) == want and bool(hot[:, sampled].any()) == want
        assert int(hot.sum()) == 2 * 256 * (32 if want else 64)
    x = make_scores("ties50", 2, 1000)
    assert torch.unique(x).numel() == 50


# ----------------------------------------------------------------------------------------------------
# CPU tier: the vectorized twin equals the loop reference over the distribution matrix

TWIN_CASES = [TwinCase(d, 3, 300, 17, "random") for d in DISTS] + [
    TwinCase("few", 4, 257, 64, "random", "bf16", "any"),
    TwinCase("pairs", 4, 301, 33, "random"),  # ties of two: the lower index wins within each pair
    TwinCase("special", 4, 129, 200, "short", "bf16", "sorted_index"),
    TwinCase("randn", 2, 50, 1, "full"),
    TwinCase("equal", 2, 50, 50, "full", mode="any"),
    TwinCase("special", 3, 33, 5, "zero"),
    TwinCase("tiny", 2, 1, 4, "full"),
    TwinCase("conc", 2, 1000, 128, "short", "bf16"),
    TwinCase("randn", 2, 2048, 512, "random"),
    TwinCase("conc", 2, 2048, 512, "full", mode="any"),
    TwinCase("few", 2, 2048, 1000, "random", mode="sorted_index"),
]


def _mode_kwargs(mode):
    return {"sorted": mode == "sorted", "sorted_index": mode == "sorted_index"}


@pytest.mark.parametrize("case", TWIN_CASES, ids=case_id)
def test_twin_equals_loop_reference(case):
    dtype = torch.float32 if case.dtype == "fp32" else torch.bfloat16
    x = make_scores(case.dist, case.b, case.n, dtype)
    end = make_end(case.ends, case.b, case.n, case.k)
    if end is not None:
        x = poison_beyond_end(x, end)
    off = torch.arange(case.b, dtype=torch.int32) * 1000
    kw = dict(end=end, output_idx_offset=off, **_mode_kwargs(case.mode))
    rv, ri = topk_ref(x, case.k, **kw)
    tv, ti = topk_torch(x, case.k, **kw)
    # integer indices and copied score bits: bitwise
    compare_bitwise("indices", ti, ri).check()
    compare_bitwise("values", tv, rv).check()
    # invariants that do not depend on the reference: exactly min(k, end) valid lanes, all < end
    ends = torch.full((case.b,), case.n) if end is None else end.long()
    valid = (ri >= 0).sum(1)
    assert valid.tolist() == ends.clamp(max=case.k).tolist()
    local = torch.where(ri >= 0, ri - off[:, None], torch.zeros_like(ri))
    assert (local < ends[:, None].clamp(min=1)).all()


def test_twin_matches_torch_topk_without_ties():
    x = torch.stack([torch.randperm(5000) for _ in range(4)]).float() / 7 - 300  # distinct per row
    assert all(torch.unique(r).numel() == r.numel() for r in x)
    tv, ti = torch.topk(x, 300, dim=1)
    v, i = topk_torch(x, 300, sorted=True, indices_type=torch.int64)
    compare_bitwise("indices", i, ti).check()
    compare_bitwise("values", v, tv).check()


# ----------------------------------------------------------------------------------------------------
# CPU tier: block maxima, candidate restore, slot conversion, fused path

def _special_scores(b: int, n: int, dtype, g) -> torch.Tensor:
    """Random scores, 40 % of them NaN of either sign, signed zeros, infinities, +-1, a subnormal; the first
    a negative NaN with every bit set."""
    x = torch.randn(b, n, generator=g)
    pool = torch.tensor([float("nan"), -float("nan"), 0.0, -0.0, float("inf"), -float("inf"), 1.0, -1.0,
                         1e-40])
    pick = torch.rand(b, n, generator=g) < 0.4
    x[pick] = pool[torch.randint(0, len(pool), (int(pick.sum()),), generator=g)]
    x = x.to(dtype)
    x.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)[0, 0] = -1
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_end", [False, True], ids=["no_end", "end"])
def test_kernel_sort_step_orders_as_the_reference(dtype, with_end):
    """sorted=True: the wrapper sorts the kernel's ascending-index lanes by ``sort_key`` (int32, fewer torch
    ops than ``order_key``): the reference's sorted indices exactly, and its values (their bits, except the
    payload of a NaN fill), over NaN of both signs, signed zeros, infinities, ties, n < k, end of 0 to n and
    fills that would outrank real values (+inf, NaN)."""
    from tilelang_ops.topk import _sort_by_value, sort_key

    g = torch.Generator().manual_seed(7)
    probe = torch.tensor([float("-inf"), -1.0, -0.0, 0.0, 1e-40, 1.0, float("inf"), float("nan")])
    keys = sort_key(probe).tolist()
    assert keys == sorted(keys) and keys[2] == keys[3] and len(set(keys)) == 7  # order, -0 == +0
    for b, n, k in ((4, 50, 8), (3, 7, 12), (5, 300, 64), (2, 1, 4)):
        for fills in ((-1, float("-inf")), (-7, float("inf")), (3, float("nan")), (0, -0.0)):
            x = _special_scores(b, n, dtype, g)
            end = torch.randint(0, n + 1, (b,), generator=g, dtype=torch.int32) if with_end else None
            kw = dict(end=end, idx_oob_fill_value=fills[0], value_oob_fill_value=fills[1])
            lanes_v, lanes_i = topk_torch(x, k, sorted_index=True, **kw)  # the kernel's unsorted output
            got_v, got_i = _sort_by_value(lanes_v, lanes_i, end, n, k)
            want_v, want_i = topk_torch(x, k, sorted=True, **kw)
            where = f"b{b} n{n} k{k} fills {fills}"
            assert torch.equal(got_i, want_i), where
            same = (got_v.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
                    == want_v.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
            assert bool((same | (got_v.isnan() & want_v.isnan())).all()), where


def test_block_max_scores_ref():
    x = torch.tensor([[1.0, 5.0, 2.0, NAN, 3.0, 4.0, 7.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]])
    out = block_max_scores_ref(x, 3, torch.tensor([7, 4], dtype=torch.int32))
    assert out.shape == (2, 3)
    assert out[0, 0] == 5.0 and torch.isnan(out[0, 1]) and out[0, 2] == 7.0
    assert out[1].tolist() == [3.0, 4.0, -INF]  # block 2 has no valid entry; block 1 only index 3
    assert block_max_scores_ref(x, 3, torch.zeros(2, dtype=torch.int32)).eq(-INF).all()
    # vectorized cross-check on a bigger case
    x = make_scores("special", 3, 100)
    end = torch.tensor([100, 37, 0], dtype=torch.int32)
    out = block_max_scores_ref(x, 16, end)
    assert out.shape == (3, 7)
    compare_bitwise("block_max", canonical_nans(out), block_max_by_amax(x, 16, end)).check()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_max_scores_ref_nan_bits(dtype):
    ibits = torch.int32 if dtype == torch.float32 else torch.int16
    x = with_nan_payloads(make_scores("randn", 2, 64, dtype), step=5)
    assert torch.isnan(x).sum() > 4
    out = block_max_scores_ref(x, 8)
    # contract: the first NaN of a block, bit for bit; else the first of the maxima
    for r in range(2):
        for j in range(8):
            blk = x[r, j * 8:(j + 1) * 8]
            nan_at = torch.isnan(blk).nonzero()
            at = int(nan_at[0]) if len(nan_at) else int(torch.argmax(blk.float()))
            assert out[r, j:j + 1].view(ibits).item() == blk[at:at + 1].view(ibits).item()
    z = torch.tensor([[-0.0, 0.0, -1.0, 0.0, -0.0, -2.0]], dtype=dtype)  # ties: the first one's sign
    assert torch.signbit(block_max_scores_ref(z, 3)).tolist() == [[True, False]]


def test_restore_candidate_indices_ref():
    idx = torch.tensor([[0, 5, 9, -1], [15, -1, -1, -1]], dtype=torch.int32)
    blocks = torch.tensor([[4, 2], [7, -1]], dtype=torch.int32)
    out = restore_candidate_indices_ref_(idx, blocks, 8)
    assert out is idx
    assert idx.tolist() == [[32, 37, 17, -1], [-1, -1, -1, -1]]


def test_convert_kv_index_ref():
    idx = torch.tensor([[[0, 3, 4, 9], [1, 2, -1, 5]]], dtype=torch.int32)  # [b=1, L=2, k=4]
    lens = torch.tensor([[3, 4]], dtype=torch.int32)
    table = torch.tensor([[10, 20, 30]], dtype=torch.int32)  # Bc = 4
    out = convert_kv_index_ref_(idx, 4, lens, table)
    assert out is idx
    assert idx.tolist() == [[[40, 43, 80, -1], [41, 42, -1, 81]]]


@pytest.mark.parametrize("with_candidates", [False, True])
def test_topk_to_slots_ref_is_the_composition(with_candidates):
    b, n, k, bs, bc = 4, 64, 10, 8, 16
    x = make_scores("few", b, n)
    end = torch.tensor([64, 7, 0, 30], dtype=torch.int32)
    table = torch.randperm(40)[: b * 10].reshape(b, 10).to(torch.int32)
    blocks = torch.stack([torch.randperm(12)[:8] for _ in range(b)]).to(torch.int32) if with_candidates \
        else None
    slots = topk_to_slots_ref(x, k, end=end, candidate_blocks=blocks,
                              candidate_block_size=bs if with_candidates else None,
                              block_size_c=bc, block_tables=table)
    # by hand: top-k local rows in ascending order -> logical rows -> slots
    _, local = topk_torch(x, k, end=end)
    want = torch.full((b, k), -1, dtype=torch.int32)
    for r in range(b):
        for lane in range(k):
            i = int(local[r, lane])
            if i < 0:
                continue
            j = int(blocks[r, i // bs]) * bs + i % bs if with_candidates else i
            want[r, lane] = int(table[r, j // bc]) * bc + j % bc
    compare_bitwise("slots", slots, want).check()


# ----------------------------------------------------------------------------------------------------
# CPU tier: every error path raises before anything is written

def _scores(b=2, n=8):
    return torch.randn(b, n)


ERROR_CASES = {
    "scores-dtype": (lambda: topk_ref(_scores().double(), 2), TypeError),
    "scores-ndim": (lambda: topk_ref(torch.randn(8), 2), ValueError),
    "scores-col-stride": (lambda: topk_ref(torch.randn(8, 4).t(), 2), ValueError),
    "scores-not-tensor": (lambda: topk_ref([[1.0]], 1), TypeError),
    "k-zero": (lambda: topk_ref(_scores(), 0), ValueError),
    "k-float": (lambda: topk_ref(_scores(), 2.0), TypeError),
    "k-too-big": (lambda: topk_ref(_scores(), 4097), ValueError),
    "end-dtype": (lambda: topk_ref(_scores(), 2, end=torch.tensor([1, 2])), TypeError),
    "end-shape": (lambda: topk_ref(_scores(), 2, end=torch.tensor([1], dtype=torch.int32)), ValueError),
    "end-beyond-n": (lambda: topk_ref(_scores(), 2, end=torch.tensor([1, 9], dtype=torch.int32)),
                     ValueError),
    "end-negative": (lambda: topk_torch(_scores(), 2, end=torch.tensor([-1, 2], dtype=torch.int32)),
                     ValueError),
    "indices-type": (lambda: topk_ref(_scores(), 2, indices_type=torch.int16), TypeError),
    "sorted-both": (lambda: topk_ref(_scores(), 2, sorted=True, sorted_index=True), ValueError),
    "offset-shape": (lambda: topk_ref(_scores(), 2, output_idx_offset=torch.zeros(3, dtype=torch.int32)),
                     ValueError),
    "offset-dtype": (lambda: topk_ref(_scores(), 2, output_idx_offset=torch.zeros(2)), TypeError),
    "block-size": (lambda: block_max_scores_ref(_scores(), 0, None), ValueError),
    "block-end-beyond": (lambda: block_max_scores_ref(_scores(), 4, torch.tensor([9, 1], dtype=torch.int32)),
                         ValueError),
    "restore-dtype": (lambda: restore_candidate_indices_ref_(torch.zeros(2, 3, dtype=torch.int64),
                                                             torch.zeros(2, 2, dtype=torch.int32), 4),
                      TypeError),
    "restore-rows": (lambda: restore_candidate_indices_ref_(torch.zeros(2, 3, dtype=torch.int32),
                                                            torch.zeros(3, 2, dtype=torch.int32), 4),
                     ValueError),
    "restore-beyond": (lambda: restore_candidate_indices_ref_(torch.full((2, 3), 8, dtype=torch.int32),
                                                              torch.zeros(2, 2, dtype=torch.int32), 4),
                       ValueError),
    "restore-below-minus-one": (lambda: restore_candidate_indices_ref_(
        torch.full((2, 3), -2, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int32), 4), ValueError),
    "convert-ndim": (lambda: convert_kv_index_ref_(torch.zeros(2, 3, dtype=torch.int32), 4,
                                                   torch.zeros(2, 1, dtype=torch.int32),
                                                   torch.zeros(2, 2, dtype=torch.int32)), ValueError),
    "convert-lens-shape": (lambda: convert_kv_index_ref_(torch.zeros(2, 1, 3, dtype=torch.int32), 4,
                                                         torch.zeros(2, 2, dtype=torch.int32),
                                                         torch.zeros(2, 2, dtype=torch.int32)), ValueError),
    "convert-table-dtype": (lambda: convert_kv_index_ref_(torch.zeros(2, 1, 3, dtype=torch.int32), 4,
                                                          torch.zeros(2, 1, dtype=torch.int32),
                                                          torch.zeros(2, 2, dtype=torch.int64)), TypeError),
    "convert-beyond-table": (lambda: convert_kv_index_ref_(torch.full((2, 1, 3), 8, dtype=torch.int32), 4,
                                                           torch.full((2, 1), 3, dtype=torch.int32),
                                                           torch.zeros(2, 2, dtype=torch.int32)), ValueError),
    "convert-unallocated-block": (lambda: convert_kv_index_ref_(
        torch.full((2, 1, 3), 5, dtype=torch.int32), 4, torch.full((2, 1), 3, dtype=torch.int32),
        torch.full((2, 2), -1, dtype=torch.int32)), ValueError),
    "convert-negative-len": (lambda: convert_kv_index_ref_(torch.zeros(2, 1, 3, dtype=torch.int32), 4,
                                                           torch.full((2, 1), -1, dtype=torch.int32),
                                                           torch.zeros(2, 2, dtype=torch.int32)), ValueError),
    "slots-candidates-half": (lambda: topk_to_slots_ref(_scores(), 2, candidate_blocks=torch.zeros(
        2, 2, dtype=torch.int32), block_size_c=4, block_tables=torch.zeros(2, 2, dtype=torch.int32)),
        ValueError),
    "slots-candidates-short": (lambda: topk_to_slots_ref(_scores(), 2, candidate_blocks=torch.zeros(
        2, 1, dtype=torch.int32), candidate_block_size=4, block_size_c=4,
        block_tables=torch.zeros(2, 2, dtype=torch.int32)), ValueError),
}


@pytest.mark.parametrize("name", sorted(ERROR_CASES))
def test_error_paths(name):
    fn, exc = ERROR_CASES[name]
    with pytest.raises(exc):
        fn()


def test_error_leaves_index_untouched():
    idx = torch.tensor([[1, 2, 99]], dtype=torch.int32)
    before = idx.clone()
    with pytest.raises(ValueError):
        restore_candidate_indices_ref_(idx, torch.tensor([[3, 4]], dtype=torch.int32), 4)
    assert torch.equal(idx, before)


# ----------------------------------------------------------------------------------------------------
# CPU tier: the kernel wrappers reject bad input before launching, and every kernel builds for sm_90a

def test_wrappers_reject_cpu_tensors_and_bad_args():
    from tilelang_ops.topk import (
        block_max_scores,
        convert_kv_index_,
        restore_candidate_indices_,
        topk,
        topk_to_slots,
    )

    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="CUDA"):
        topk(x, 2)
    with pytest.raises(TypeError):
        topk(x.double(), 2)
    with pytest.raises(ValueError):
        topk(x, 0)
    with pytest.raises(ValueError, match="CUDA"):
        block_max_scores(x, 4)
    with pytest.raises(ValueError, match="CUDA"):
        restore_candidate_indices_(torch.zeros(2, 3, dtype=torch.int32),
                                     torch.zeros(2, 1, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="CUDA"):
        convert_kv_index_(torch.zeros(2, 1, 3, dtype=torch.int32), 4, torch.zeros(2, 1, dtype=torch.int32),
                            torch.zeros(2, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="CUDA"):
        topk_to_slots(x, 2, block_size_c=4, block_tables=torch.zeros(2, 2, dtype=torch.int32))


@pytest.mark.parametrize("schedule", ["random", "warps"])
def test_cpu_emulator_runs_each_kernel(schedule):
    # tools/check_topk_emu.py: one small case of each kernel (row on 256 threads and on a cluster, tile, warp,
    # the fused slots path, block max) as generated CUDA on the CPU emulator, bitwise against the twin; under
    # random switches and warp-serially (each warp on to its next barrier first: a shared-memory race between
    # two barriers, such as a warp rewriting counts a slower warp still reads, changes the results)
    if shutil.which("g++") is None:
        pytest.skip("the emulator compiles the kernels' C++ with g++")
    from tools import check_topk_emu as emu

    kernels = {emu.config_of(c).kernel for c in emu.SMOKE}
    assert kernels == {"row", "tile", "warp"} and any(c.config.split > 1 for c in emu.SMOKE)
    results = emu.smoke(seed=1, schedule=schedule)
    assert len(results) == 2 * len(emu.SMOKE) + 3
    failed = [c.message() for c in results if not c.passed]
    assert not failed, failed


@pytest.mark.build
def test_build_sm90():
    from tilelang_ops.topk import build_all

    # each code path of the three kernels (the uncached row kernel as the streaming one; all: `make diff`)
    built = build_all(quick=True)
    assert "topk_to_slots fp32 cand16 Bc64" in built and "topk fp32 uncached stream" in built
    assert "topk fp32 cache32768 threads512" in built
    assert "topk warp bf16 int64+offset" in built
    assert "topk tile bf16 int64+offset" in built


# ----------------------------------------------------------------------------------------------------
# GPU tier: kernels against the references (exact)

def _run_gpu_case(case, fn_kernel):
    dtype = torch.float32 if case.dtype == "fp32" else torch.bfloat16
    x = make_scores(case.dist, case.b, case.n, dtype, device="cuda")
    end = make_end(case.ends, case.b, case.n, case.k, device="cuda")
    if end is not None:
        x = poison_beyond_end(x, end)
    kw = dict(end=end, **_mode_kwargs(case.mode))
    return x, end, kw, fn_kernel(x, case.k, **kw, config=case.config)


def _check_gpu_case(case, fn_kernel, tag=""):
    """Run the case through fn_kernel and compare with the sort-based oracle; returns (x, end, values,
    indices) as compared. Indices are integers and values copied score bits: bitwise. Unspecified order
    (mode "any") compares the (index, value) lanes as sets."""
    x, end, kw, (v, i) = _run_gpu_case(case, fn_kernel)
    rv, ri = topk_torch(x, case.k, **kw)
    if case.mode == "any":
        v, i = as_pairs_by_index(v, i)
        rv, ri = as_pairs_by_index(rv, ri)
    compare_bitwise(f"indices{tag}", i, ri).check()
    compare_bitwise(f"values{tag}", v, rv).check()
    return x, end, v, i




@requires_cuda
@pytest.mark.parametrize("case", ALL_GPU_CASES, ids=case_id)
def test_gpu_topk_exact(case):
    from tilelang_ops.topk import topk

    x, end, v, i = _check_gpu_case(case, topk, f" {config_label(case.config)}" if case.config else "")
    if case.loop_ref:
        lv, li = topk_ref(x.cpu(), case.k, end=None if end is None else end.cpu(), **_mode_kwargs(case.mode))
        if case.mode == "any":
            lv, li = as_pairs_by_index(lv, li)
        compare_bitwise("indices vs loop", i, li).check()
        compare_bitwise("values vs loop", v, lv).check()


# The fused scores -> slots path on every kernel (the default for long rows, a split row, the 256-thread row
# kernel, the warp kernel, the tile kernel on both CTAs).
SLOTS_CONFIGS = [(None, 40000), (TopkConfig(), 30000), (TopkConfig(split=2), 30000),
                 (TopkConfig(threads=256), 30000), (TopkConfig("warp"), 30000),
                 (TopkConfig("tile"), 8000), (TopkConfig("tile", 256, unroll=16), 4000)]


@requires_cuda
@pytest.mark.parametrize("config, n", SLOTS_CONFIGS,
                         ids=[f"{config_label(c) if c else 'default'}-n{n}" for c, n in SLOTS_CONFIGS])
@pytest.mark.parametrize("with_candidates", [False, True])
def test_gpu_topk_to_slots_config(config, n, with_candidates):
    from tilelang_ops.topk import topk_to_slots

    b, k, bc, bs = 8, 2048, 64, 16
    end = make_end("random", b, n, k, device="cuda")
    x = poison_beyond_end(make_scores("randn", b, n, device="cuda"), end)
    table = torch.randint(0, 100000, (b, 1000), dtype=torch.int32, device="cuda")
    blocks = torch.stack([torch.randperm(1000 * bc // bs)[: n // bs] for _ in range(b)]).to(torch.int32)
    blocks = blocks.cuda() if with_candidates else None
    got = topk_to_slots(x, k, end=end, candidate_blocks=blocks, candidate_block_size=bs if with_candidates
                        else None, block_size_c=bc, block_tables=table, config=config)
    _, idx = topk_torch(x, k, end=end)
    if with_candidates:
        restore_candidate_indices_ref_(idx, blocks, bs)
    want = convert_kv_index_ref_(idx.reshape(b, 1, k), bc, end.clamp(max=k).reshape(b, 1), table)
    compare_bitwise("slots", got, want.reshape(b, k)).check()


def test_split_choice():
    from tilelang_ops.topk.launch import MAX_SPLIT, split_rows
    from tilelang_ops.topk.macros import CAND, SMALL_CACHE

    assert MAX_SPLIT == 8
    # at most half the SMs: 8 CTAs per row up to 8 rows, 4 up to 16, 2 up to 33
    assert [split_rows(b, 65536, 132) for b in (1, 8, 9, 16, 17, 33, 34)] == [8, 8, 4, 4, 2, 2, 1]
    assert split_rows(64, 32768, 132) == 1  # the decode shape: rows already fill half the SMs
    assert split_rows(128, 131072, 132) == 1  # the rows already fill the device
    assert split_rows(1, CAND, 132) == 1  # one tile: never sampled, never split
    assert split_rows(1, SMALL_CACHE, 132) == 1
    assert split_rows(1, CAND + 1, 132) == 8
    assert split_rows(33, 65536, 132, max_split=2) == 2 and split_rows(34, 65536, 132, max_split=2) == 1


def test_launch_rule():
    from tilelang_ops.topk.launch import WARP_ROW_MAX, topk_config

    C = TopkConfig
    # a warp per row for at least n / 104 rows of <= WARP_ROW_MAX entries per SM; else 256-thread CTAs for
    # more short rows (<= 4096 entries) than SMs; a split row keeps the full CTA
    assert WARP_ROW_MAX == 1024
    # (the 256-thread rows are one tile of the tile kernel: 8 keys a thread up to 2048 entries, then 16)
    assert topk_config(1270, 1000, 4, 132) == C("warp")
    assert topk_config(1269, 1000, 4, 132) == C("tile", 256, unroll=8)
    assert topk_config(1300, 1024, 4, 132) == C("warp")
    assert topk_config(1299, 1024, 4, 132) == C("tile", 256, unroll=8)
    assert topk_config(762, 600, 4, 132) == C("warp")
    assert topk_config(761, 600, 4, 132) == C("tile", 256, unroll=8)
    assert topk_config(1 << 20, 1025, 4, 132) == C("tile", 256, unroll=8)  # past WARP_ROW_MAX
    assert topk_config(1 << 20, 2049, 4, 132) == C("tile", 256, unroll=16)
    assert topk_config(1 << 20, 4096, 4, 132) == C("tile", 256, unroll=16)
    assert topk_config(1 << 20, 4097, 4, 132) == C("tile", 1024, unroll=8)  # past the short tier
    assert topk_config(133, 2049, 4, 132) == C("tile", 256, unroll=16)
    assert topk_config(132, 2048, 4, 132) == C("tile", 1024, unroll=8)  # a row per SM anyway
    assert topk_config(4096, 8193, 4, 132) == C()  # the 32768 tier
    assert topk_config(4096, 65536, 4, 132) == C()
    assert topk_config(1, 65536, 4, 132) == C(split=8)
    # streaming reads for unsplit rows of the uncached tier when the launch reads half the L2 or more
    l2 = 60 << 20
    assert topk_config(128, 131072, 4, 132, l2) == C(stream=True)
    assert topk_config(128, 131072, 2, 132, l2) == C(stream=True)  # 32 MiB
    assert topk_config(64, 131072, 2, 132, l2) == C()  # 16 MiB
    assert topk_config(64, 32768, 4, 132, l2) == C()  # 8 MiB
    assert topk_config(1024, 32768, 4, 132, l2) == C()  # the 32768 tier never
    assert topk_config(1, 1 << 24, 4, 132, l2) == C(split=8)  # split rows never stream
    # rows of one tile (<= 8192 entries) on 1024 threads: the tile kernel
    assert topk_config(16384, 8192, 4, 132, l2) == C("tile", unroll=8)
    assert topk_config(64, 8192, 4, 132) == C("tile")
    assert topk_config(64, 8193, 4, 132) == C()
    assert topk_config(128, 131072, 4, 132, 0) == C()  # no L2 size known
    assert [tile_unroll(n, t) for n, t in ((1, 1024), (8192, 1024), (8193, 1024), (2048, 256), (2049, 256),
                                           (4096, 256), (4097, 256))] == [8, 8, 0, 8, 16, 16, 0]


def test_kernel_for():
    from tilelang_ops.topk import kernel_for, row_kernel, tile_kernel, warp_kernel

    static = ("float32", "int32", "int32", False, False, -1, float("-inf"), "topk", 0, 1)
    row = static[:3] + (0,) + static[3:]
    assert kernel_for(static, 65536, TopkConfig()) == (row_kernel, row + (1, 1024, False))
    assert kernel_for(static, 65536, TopkConfig(split=2)) == (row_kernel, row + (2, 1024, False))
    assert kernel_for(static, 65536, TopkConfig(stream=True)) == (row_kernel, row + (1, 1024, True))
    assert kernel_for(static, 4096, TopkConfig(threads=256))[1][3] == 4096  # the short tier
    assert kernel_for(static, 100, TopkConfig("warp")) == (warp_kernel, static + (4,))
    assert kernel_for(static, 4096, TopkConfig("tile", 256, unroll=16)) == (tile_kernel, static + (256, 16))


@pytest.mark.parametrize("kw, match", [
    (dict(kernel="v1"), "config.kernel"), (dict(threads=128), "config.threads"),
    (dict(split=3), "config.split"),
    (dict(split=2, threads=256), "split"), (dict(kernel="tile", split=2), "split"),
    (dict(kernel="warp", stream=True), "stream"), (dict(unroll=4), "config.unroll"),
    (dict(rows_per_cta=0), "rows_per_cta")], ids=lambda v: str(v))
def test_config_rejects_bad_knobs(kw, match):
    with pytest.raises(ValueError, match=match):
        TopkConfig(**kw)


def test_tile_config_rejects_long_rows():
    from tilelang_ops.topk import kernel_for

    static = ("float32", "int32", "int32", True, False, -1, float("-inf"), "topk", 0, 1)
    with pytest.raises(ValueError, match="n=8193"):
        kernel_for(static, 8193, TopkConfig("tile"))
    with pytest.raises(ValueError, match="n=2049"):
        kernel_for(static, 2049, TopkConfig("tile", 256))


@requires_cuda
def test_gpu_topk_options_offsets_int64_fills_noncontiguous():
    from tilelang_ops.topk import topk

    base = make_scores("few", 64, 5000, device="cuda")
    x = base[:, 7:4007]  # row stride 5000
    end = make_end("random", 64, 4000, 300, device="cuda")
    off = torch.arange(64, device="cuda", dtype=torch.int64) * 100000
    kw = dict(end=end, indices_type=torch.int64, idx_oob_fill_value=-9, value_oob_fill_value=7.5,
              output_idx_offset=off, sorted_index=True)
    v, i = topk(x, 300, **kw)
    rv, ri = topk_torch(x.contiguous(), 300, **kw)
    compare_bitwise("indices", i, ri).check()
    compare_bitwise("values", v, rv).check()
    none, i2 = topk(x, 300, end=end, return_value=False)
    assert none is None
    compare_bitwise("indices no values", i2, topk_torch(x, 300, end=end, sorted_index=True)[1]).check()


@requires_cuda
def test_gpu_topk_deterministic():
    from tilelang_ops.topk import topk

    x = make_scores("few", 128, 131072, device="cuda")
    first = topk(x, 2048)
    for _ in range(3):
        again = topk(x, 2048)
        compare_bitwise("indices", again[1], first[1]).check()
        compare_bitwise("values", again[0], first[0]).check()


@requires_cuda
def test_gpu_topk_debug_checks(monkeypatch):
    from tilelang_ops.topk import topk

    x = torch.randn(2, 10, device="cuda")
    bad = torch.tensor([3, 11], dtype=torch.int32, device="cuda")
    monkeypatch.setenv("TILELANG_OPS_DEBUG", "1")
    with pytest.raises(ValueError, match="end"):
        topk(x, 2, end=bad)
    monkeypatch.setenv("TILELANG_OPS_DEBUG", "0")
    # without the switch the kernel clamps end to n: no out-of-bounds read, row 1 uses all 10 entries
    _, i = topk(x, 2, end=bad, sorted=True)
    assert i[1].tolist() == topk_torch(x[1:], 2, sorted=True)[1][0].tolist()


@requires_cuda
@pytest.mark.parametrize("dist", ["randn", "special", "equal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_block_max_scores(dist, dtype):
    from tilelang_ops.topk import block_max_scores

    x = make_scores(dist, 7, 1000, dtype, device="cuda")
    end = make_end("random", 7, 1000, 0, device="cuda")
    end[1] = 0
    x = poison_beyond_end(x, end)
    x = with_nan_payloads(x, step=37)
    for bs in (8, 16, 7):
        # max is a copy of one element (no arithmetic), the first NaN's exact bits: bitwise
        got = block_max_scores(x, bs, end)
        compare_bitwise("block_max", got, block_max_scores_ref(x, bs, end)).check()
    compare_bitwise("block_max full", block_max_scores(x, 16), block_max_scores_ref(x, 16)).check()


@requires_cuda
def test_gpu_restore_and_convert():
    from tilelang_ops.topk import convert_kv_index_, restore_candidate_indices_

    b, k, c, bs = 64, 512, 40, 16
    idx = torch.randint(-1, c * bs, (b, k), dtype=torch.int32, device="cuda")
    blocks = torch.randint(-1, 1000, (b, c), dtype=torch.int32, device="cuda")
    want = restore_candidate_indices_ref_(idx.clone(), blocks, bs)
    compare_bitwise("restored", restore_candidate_indices_(idx, blocks, bs), want).check()

    L, bc, mb = 3, 64, 50
    idx = torch.randint(-1, mb * bc, (b, L, k), dtype=torch.int32, device="cuda")
    lens = torch.randint(0, k + 1, (b, L), dtype=torch.int32, device="cuda")
    table = torch.randint(0, 10000, (b, mb), dtype=torch.int32, device="cuda")
    want = convert_kv_index_ref_(idx.clone(), bc, lens, table)
    compare_bitwise("slots", convert_kv_index_(idx, bc, lens, table), want).check()


@requires_cuda
@pytest.mark.parametrize("with_candidates", [False, True])
@pytest.mark.parametrize("dist", ["randn", "few", "conc"])
def test_gpu_topk_to_slots(with_candidates, dist):
    from tilelang_ops.topk import topk_to_slots

    b, n, k, bs, bc, mb = 32, 4096, 512, 16, 64, 200
    x = make_scores(dist, b, n, device="cuda")
    end = make_end("random", b, n, k, device="cuda")
    x = poison_beyond_end(x, end)
    table = torch.randint(0, 100000, (b, mb), dtype=torch.int32, device="cuda")
    blocks = torch.stack([torch.randperm(mb * bc // bs)[: n // bs] for _ in range(b)]).to(
        torch.int32).cuda() if with_candidates else None
    kw = dict(end=end, candidate_blocks=blocks, candidate_block_size=bs if with_candidates else None,
              block_size_c=bc, block_tables=table)
    got = topk_to_slots(x, k, **kw)
    # reference composition from the vectorized top-k (tested equal to the loop one) + loop restore/convert
    _, idx = topk_torch(x, k, end=end)
    if with_candidates:
        restore_candidate_indices_ref_(idx, blocks, bs)
    valid = end.clamp(max=k).reshape(b, 1)
    want = convert_kv_index_ref_(idx.reshape(b, 1, k), bc, valid, table).reshape(b, k)
    compare_bitwise("slots", got, want).check()
    if dist == "few":  # small slice against the loop composition
        ref = topk_to_slots_ref(x[:4].cpu(), k, end=end[:4].cpu(),
                                candidate_blocks=None if blocks is None else blocks[:4].cpu(),
                                candidate_block_size=kw["candidate_block_size"], block_size_c=bc,
                                block_tables=table[:4].cpu())
        compare_bitwise("slots vs loop", got[:4], ref).check()


# ----------------------------------------------------------------------------------------------------
# The kernel specializations the GPU tests launch (tests/compile_ahead.py compiles them first)

def _topk_static(dtype: str, values=True, idx="int32", off="int32", offset=False, idx_fill=-1,
                 val_fill=float("-inf"), mode="topk", cand_bs=0, block_c=1) -> tuple:
    """The static arguments every top-k kernel takes (see tilelang_ops.topk.kernel_for)."""
    in_dtype = "float32" if dtype == "fp32" else "bfloat16"
    return (in_dtype, idx, off, values, offset, idx_fill, val_fill, mode, cand_bs, block_c)


def gpu_topk_launches() -> list[tuple]:
    """(static args, b, n, itemsize, config or None) of every top-k launch of this file's GPU tests."""
    out = [(_topk_static(c.dtype), c.b, c.n, 4 if c.dtype == "fp32" else 2, c.config) for c in ALL_GPU_CASES]
    options = _topk_static("fp32", idx="int64", off="int64", offset=True, idx_fill=-9, val_fill=7.5)
    out += [(options, 64, 4000, 4, None), (_topk_static("fp32", values=False), 64, 4000, 4, None),
            (_topk_static("fp32"), 128, 131072, 4, None),  # deterministic
            (_topk_static("fp32"), 2, 10, 4, None)]  # debug checks
    for cand in (False, True):
        slots = _topk_static("fp32", values=False, mode="slots", cand_bs=16 if cand else 0, block_c=64)
        out += [(slots, 8, n, 4, config) for config, n in SLOTS_CONFIGS]
        out.append((slots, 32, 4096, 4, None))  # test_gpu_topk_to_slots
    return out


def gpu_compile_jobs(props) -> list[tuple[str, str, tuple]]:
    """(module, function, static args) of every top-k family kernel this file's GPU tests launch."""
    from tilelang_ops.topk import kernel_for
    from tilelang_ops.topk.launch import topk_config

    jobs = []
    for static, b, n, itemsize, config in gpu_topk_launches():
        config = config or topk_config(b, n, itemsize, props.multi_processor_count, props.L2_cache_size)
        factory, args = kernel_for(static, n, config)
        jobs.append(("tilelang_ops.topk", {"row": "row_kernel", "tile": "tile_kernel", "warp": "warp_kernel"}[
            config.kernel], args))
    jobs += [("tilelang_ops.topk", "block_max_kernel", (bs, dt)) for dt in ("float32", "bfloat16")
             for bs in (8, 16, 7)]
    jobs += [("tilelang_ops.topk", "restore_kernel", (16,)), ("tilelang_ops.topk", "convert_kernel", (64,))]
    return list(dict.fromkeys(jobs))


H200 = SimpleNamespace(multi_processor_count=132, L2_cache_size=60 << 20)


def test_gpu_compile_jobs_cover_the_cases():
    import importlib

    # the module object (tilelang_ops.topk as an attribute of the package may be the function)
    tk = importlib.import_module("tilelang_ops.topk")
    from tilelang_ops.topk.launch import topk_config

    jobs = gpu_compile_jobs(H200)
    assert len(jobs) == len(set(jobs))
    by_factory = {}
    for mod, fn, static in jobs:
        assert mod == "tilelang_ops.topk" and callable(getattr(tk, fn)), (mod, fn)
        by_factory.setdefault(fn, set()).add(static)
    # every exact-match case, on the kernel its config (or the H200's launch rule) picks
    for c in ALL_GPU_CASES:
        config = c.config or topk_config(c.b, c.n, 4 if c.dtype == "fp32" else 2, 132, 60 << 20)
        factory, static = tk.kernel_for(_topk_static(c.dtype), c.n, config)
        assert static in by_factory[f"{config.kernel}_kernel"], c.id
        assert factory is getattr(tk, f"{config.kernel}_kernel")
    # all three kernels and every row-kernel knob are exercised
    assert {"row_kernel", "tile_kernel", "warp_kernel"} <= set(by_factory)
    row = by_factory["row_kernel"]
    assert {s[3] for s in row} == {0, 4096, 32768} and {s[-3] for s in row} == {1, 2, 4, 8}
    assert {s[-2] for s in row} == {256, 512, 1024} and {s[-1] for s in row} == {False, True}
    # specializations stay bounded: cases share dtype, tier and config (the cold GPU tier compiles these)
    assert len(jobs) <= 57


def test_a_negative_zero_fill_reaches_the_kernel():
    """The value fill is a static kernel argument, and kernel caches compare those by equality (-0.0 ==
    0.0): a -0.0 fill still lowers to a -0.0 store, and its key differs from 0.0's."""
    from tvm.target import Target

    from tilelang_ops.build import SM90_TARGET
    from tilelang_ops.topk import TopkConfig, exact_fill, kernel_for

    scripts = []
    for fill in (-0.0, 0.0):
        static = ("float32", "int32", "int32", True, False, -1, exact_fill(fill), "topk", 0, 1)
        factory, static = kernel_for(static, 8192, TopkConfig("tile"))
        with Target(SM90_TARGET):
            scripts.append(factory.get_tir(*static).script())
    assert 'T.Cast("float32", T.float32(-0.0))' in scripts[0]
    assert 'T.Cast("float32", T.float32(0.0))' in scripts[1]
