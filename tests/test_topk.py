"""Top-k family (SPEC 1.6): loop references, the vectorized twin, host checks, and (GPU tier) the
TileLang kernels against them.

Comparisons: indices and slots are integers -> bitwise. Values are copies of input scores (no
arithmetic) -> bitwise too (NaN payloads included, since the kernel copies the score bits). When neither
``sorted`` nor ``sorted_index`` is asked the order is unspecified by contract, so those tests compare
(index, value) pairs after sorting both sides by index.
"""

from __future__ import annotations

from dataclasses import dataclass

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

NAN, INF = float("nan"), float("inf")


# ----------------------------------------------------------------------------------------------------
# score generators (the adversarial distributions of SPEC 4)

def make_scores(dist: str, b: int, n: int, dtype=torch.float32, device="cpu", seed=0) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    if dist == "randn":
        x = torch.randn(b, n, generator=g)
    elif dist == "conc":  # concentrated: every score in one narrow band near 100
        x = torch.randn(b, n, generator=g) * 1e-3 + 100
    elif dist == "tiny":
        x = torch.randn(b, n, generator=g) * 1e-8
    elif dist == "equal":
        x = torch.full((b, n), 0.5)
    elif dist == "few":  # a handful of distinct values -> huge tie groups
        x = torch.randint(-2, 3, (b, n), generator=g).float()
    elif dist == "sorted":
        x = torch.sort(torch.randn(b, n, generator=g), dim=1, descending=True).values
    elif dist == "ascending":
        x = torch.sort(torch.randn(b, n, generator=g), dim=1).values
    elif dist == "ties50":  # 50 distinct values: a sampled threshold bin holds several large tie groups
        x = torch.randint(0, 50, (b, n), generator=g).float()
    elif dist == "pairs":  # every value twice, at random places: small threshold bins hold ties of two
        v = torch.randn(b, (n + 1) // 2, generator=g)
        x = torch.cat([v, v], dim=1)[:, :n]
        x = torch.gather(x, 1, torch.argsort(torch.rand(b, n, generator=g), dim=1))
    elif dist in ("sampled", "unsampled"):
        # against a sampled threshold estimate (runs of 32 entries every n // 256, as the kernels sample):
        # 100 + randn on exactly the sampled runs (the estimate is too high) or on entries 64..127 of
        # every 256, none of them sampled (the estimate is too low: far more candidates than slots)
        x = torch.randn(b, n, generator=g)
        step = max(n // 256, 1)
        col = torch.arange(n) % step
        hot = col < 32 if dist == "sampled" else (col >= 64) & (col < 128)
        x = torch.where(hot[None, :], x + 100, x)
    elif dist == "outliers":
        # 400 (fewer on short rows) distinct huge scores inside one gap between the runs of 32 that v3
        # samples (every n // 64 entries on rows of the 32768 tier, n // 256 beyond): the k-th largest, for
        # k below their count, lies far above the sample's largest key (the last bin of the pre-binned list)
        x = torch.randn(b, n, generator=g)
        step = max(n // (64 if n <= 32768 else 256), 1)
        count = max(0, min(400, step - 96))
        at = step * (4 * (n // step // 8) + 2) + 64
        x[:, at:at + count] = 1000.0 + torch.arange(count, dtype=torch.float32)
    elif dist == "special":  # NaN of both signs, +-inf, signed zeros, denormals of both signs over randn
        x = torch.randn(b, n, generator=g)
        pick = torch.randint(0, 10, (b, n), generator=g)
        neg_nan = torch.tensor([-0x400000], dtype=torch.int32).view(torch.float32)  # bits 0xFFC00000
        x = torch.where(pick == 0, torch.full_like(x, NAN), x)
        x = torch.where(pick == 1, torch.full_like(x, INF), x)
        x = torch.where(pick == 2, torch.full_like(x, -INF), x)
        x = torch.where(pick == 3, torch.full_like(x, -0.0), x)
        x = torch.where(pick == 4, torch.zeros_like(x), x)
        x = torch.where(pick == 5, torch.full_like(x, 1e-40), x)
        x = torch.where(pick == 6, torch.full_like(x, -1e-40), x)
        x = torch.where(pick == 7, neg_nan.expand_as(x), x)
    else:
        raise KeyError(dist)
    return x.to(dtype).to(device)


DISTS = ("randn", "conc", "tiny", "equal", "few", "sorted", "ascending", "special")


def poison_beyond_end(x: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """Garbage the top-k must never pick: +inf and NaN at and beyond `end`."""
    col = torch.arange(x.shape[1], device=x.device)[None, :]
    beyond = col >= end.to(x.device).long()[:, None]
    garbage = torch.where(col % 2 == 0, torch.full_like(x, INF), torch.full_like(x, NAN))
    return torch.where(beyond, garbage, x)


def canonical_nans(t: torch.Tensor) -> torch.Tensor:
    """Every NaN as the one canonical NaN (for comparisons against torch ops that do not keep NaN bits)."""
    return torch.where(torch.isnan(t), torch.full_like(t, NAN), t)


def block_max_by_amax(x: torch.Tensor, block_size: int, end: torch.Tensor) -> torch.Tensor:
    """Vectorized block maxima of the entries before `end` (-inf for a block without one) by torch.amax,
    NaNs canonical: amax propagates a NaN but not its bits, which block_max_scores_ref keeps."""
    masked = torch.where(torch.arange(x.shape[1])[None] < end[:, None].long(), x, torch.full_like(x, -INF))
    padded = torch.nn.functional.pad(masked, (0, (-x.shape[1]) % block_size), value=-INF)
    return canonical_nans(padded.reshape(x.shape[0], -1, block_size).amax(-1))


def as_pairs_by_index(values, indices):
    """Sort lanes by index (fills last) so unordered outputs compare exactly."""
    key = torch.where(indices < 0, torch.full_like(indices, torch.iinfo(indices.dtype).max), indices)
    order = torch.sort(key, dim=1, stable=True).indices
    return (None if values is None else values.gather(1, order)), indices.gather(1, order)


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
    # topk v3 marks "no entry" (past the end) with key 0 and starts its search range at key 1: every real
    # score, NaN and -inf included, must key at least 0x007FFFFF (the key of -inf). Every bf16 bit pattern,
    # and fp32 extremes plus random bit patterns.
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

@dataclass(frozen=True)
class TwinCase:
    dist: str
    b: int
    n: int
    k: int
    ends: str  # "full" | "random" | "short" (end <= k) | "zero"
    dtype: str = "fp32"
    mode: str = "sorted"  # sorted | sorted_index | any

    @property
    def id(self):
        return f"{self.dist}-b{self.b}n{self.n}k{self.k}-{self.ends}-{self.dtype}-{self.mode}"


def make_end(kind: str, b: int, n: int, k: int, device="cpu", seed=1) -> torch.Tensor | None:
    g = torch.Generator().manual_seed(seed)
    if kind == "full":
        return None
    if kind == "random":
        e = torch.randint(0, n + 1, (b,), generator=g)
        e[0] = n
    elif kind == "short":
        e = torch.randint(0, min(k, n) + 1, (b,), generator=g)
    elif kind == "zero":
        e = torch.zeros(b, dtype=torch.int64)
    else:
        raise KeyError(kind)
    return e.to(torch.int32).to(device)


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


def with_nan_payloads(x: torch.Tensor, step: int) -> torch.Tensor:
    """Every `step`-th element becomes a NaN with a sign and payload of its own (bits differ from the
    canonical NaN), so a kernel that canonicalizes NaNs (a float round trip) is caught."""
    ibits = torch.int32 if x.dtype == torch.float32 else torch.int16
    nans = [0x7FC00001, -0x3FFFFF, 0x7F800003] if x.dtype == torch.float32 else [0x7FC1, -0x3F, 0x7F83]
    flat = x.clone().view(ibits).reshape(-1)
    for j, bits in enumerate(nans):
        flat[j * 11::step * len(nans)] = bits  # -0x3FFFFF = 0xFFC00001, -0x3F = 0xFFC1: negative NaNs
    return flat.reshape(x.shape).view(x.dtype)


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
    from tilelang_ops import topk as K

    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="CUDA"):
        K.topk(x, 2)
    with pytest.raises(TypeError):
        K.topk(x.double(), 2)
    with pytest.raises(ValueError):
        K.topk(x, 0)
    with pytest.raises(ValueError, match="CUDA"):
        K.block_max_scores(x, 4)
    with pytest.raises(ValueError, match="CUDA"):
        K.restore_candidate_indices_(torch.zeros(2, 3, dtype=torch.int32),
                                     torch.zeros(2, 1, dtype=torch.int32), 4)
    with pytest.raises(ValueError, match="CUDA"):
        K.convert_kv_index_(torch.zeros(2, 1, 3, dtype=torch.int32), 4, torch.zeros(2, 1, dtype=torch.int32),
                            torch.zeros(2, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match="CUDA"):
        K.topk_to_slots(x, 2, block_size_c=4, block_tables=torch.zeros(2, 2, dtype=torch.int32))


@pytest.mark.build
def test_build_sm90():
    from tilelang_ops.topk import TOPK_VARIANT, build_all

    # each code path of the default variant (its uncached tier as the streaming kernel), the uncached tier
    # of the other (all: `make diff`)
    built = build_all(quick=True)
    assert f"topk_to_slots fp32 cand16 Bc64 {TOPK_VARIANT}" in built
    assert "topk fp32 uncached v1" in built and "topk fp32 uncached stream" in built
    assert "topk fp32 cache32768 threads512" in built
    assert "topk warp bf16 int64+offset" in built
    assert "topk tile bf16 int64+offset" in built


# ----------------------------------------------------------------------------------------------------
# GPU tier: kernels against the references (exact)

@dataclass(frozen=True)
class GpuCase:
    dist: str
    b: int
    n: int
    k: int
    ends: str = "full"
    dtype: str = "fp32"
    mode: str = "any"
    loop_ref: bool = False  # also check against the loop reference (small shapes only)

    @property
    def id(self):
        return f"{self.dist}-b{self.b}n{self.n}k{self.k}-{self.ends}-{self.dtype}-{self.mode}"


GPU_CASES = (
    [GpuCase(d, 7, 2048, 512, "random", loop_ref=True) for d in DISTS]
    + [GpuCase(d, 64, 32768, 2048) for d in DISTS]
    + [GpuCase(d, 2, 65536, 2048, "random") for d in DISTS]
    + [GpuCase(d, 16, 131072, 2048) for d in ("randn", "conc", "few", "equal")]
    + [
        GpuCase("randn", 1, 1, 1, loop_ref=True),
        GpuCase("randn", 7, 1, 4, loop_ref=True),
        GpuCase("special", 7, 100, 16, "random", "bf16", "sorted", loop_ref=True),
        GpuCase("few", 4096, 100, 8, "random", mode="sorted_index"),
        GpuCase("randn", 4096, 2048, 64, "random"),
        GpuCase("conc", 128, 8192, 512, "random", "bf16"),
        GpuCase("randn", 64, 8192, 512, mode="sorted"),
        GpuCase("tiny", 128, 8192, 4096, "random", mode="sorted"),
        GpuCase("randn", 128, 131072, 2048, mode="sorted"),
        GpuCase("conc", 1, 1 << 20, 2048),
        GpuCase("few", 1, 1 << 20, 4096, "random", "bf16"),
        GpuCase("randn", 7, 1 << 20, 2048, "short"),
        GpuCase("randn", 4, 1 << 20, 100, "zero"),
        GpuCase("special", 64, 65536, 1, "random"),
        GpuCase("equal", 7, 4096, 4096, "random", mode="sorted"),
        # long rows: sampled threshold estimate holds (randn, conc) or fails (sorted rows, heavy ties)
        GpuCase("sorted", 4, 131072, 2048),
        GpuCase("ascending", 4, 131072, 4096, mode="sorted"),
        GpuCase("tiny", 3, 1 << 20, 4096, "random"),
        GpuCase("special", 3, 200000, 3000, "random", "bf16"),
        GpuCase("randn", 5, 40000, 4096, "random", mode="sorted_index"),
        # 1M entries, k = 2048: the sample's bound is refined inside its histogram bin (V3_SAMPLE_PAD in
        # tilelang_ops/topk.py), on one CTA per row and on a cluster per row (the same bound in every CTA)
        GpuCase("randn", 64, 1 << 20, 2048),
        GpuCase("randn", 2, 1 << 20, 2048),
        # the k-th largest far above the sample (k < 400 outliers) or among the ordinary scores (k > 400)
        GpuCase("outliers", 4, 131072, 300),
        GpuCase("outliers", 4, 131072, 2048),
        GpuCase("outliers", 8, 32768, 300, mode="sorted"),
        GpuCase("outliers", 2, 65536, 100, "random"),
    ]
)


def _run_gpu_case(case, fn_kernel):
    dtype = torch.float32 if case.dtype == "fp32" else torch.bfloat16
    x = make_scores(case.dist, case.b, case.n, dtype, device="cuda")
    end = make_end(case.ends, case.b, case.n, case.k, device="cuda")
    if end is not None:
        x = poison_beyond_end(x, end)
    kw = dict(end=end, **_mode_kwargs(case.mode))
    return x, end, kw, fn_kernel(x, case.k, **kw)


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
@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
def test_gpu_topk_exact(case):
    from tilelang_ops.topk import topk

    x, end, v, i = _check_gpu_case(case, topk)
    if case.loop_ref:
        lv, li = topk_ref(x.cpu(), case.k, end=None if end is None else end.cpu(), **_mode_kwargs(case.mode))
        if case.mode == "any":
            lv, li = as_pairs_by_index(lv, li)
        compare_bitwise("indices vs loop", i, li).check()
        compare_bitwise("values vs loop", v, lv).check()


# Every kernel variant on a subset (v1: GPU-verified fallback; v3: the default, see tilelang_ops.topk): a
# failure here names the variant, so the default can be flipped with confidence.
VARIANT_CASES = [
    GpuCase("randn", 7, 2048, 512, "random"),
    GpuCase("special", 7, 100, 16, "random", "bf16", "sorted"),
    GpuCase("randn", 64, 32768, 2048),  # 32768 tier: v1 caches the row, v3 samples + compacts candidates
    GpuCase("few", 64, 32768, 2048),
    GpuCase("equal", 64, 32768, 2048),
    GpuCase("special", 16, 30000, 3000, "random", "bf16"),
    GpuCase("randn", 16, 20000, 4096, "random", mode="sorted"),
    GpuCase("conc", 128, 8192, 512, "random", "bf16"),
    GpuCase("tiny", 128, 8192, 4096, "random", mode="sorted"),
    GpuCase("randn", 2, 65536, 2048, "random"),
    GpuCase("special", 2, 65536, 2048, "random"),
    GpuCase("sorted", 4, 131072, 2048),
    GpuCase("ascending", 4, 131072, 4096, mode="sorted"),
    GpuCase("randn", 16, 131072, 2048),
    GpuCase("equal", 4, 131072, 2048),  # candidate list never fits: the passes read the row
    GpuCase("conc", 4, 131072, 2048, "random"),
    GpuCase("few", 1, 1 << 20, 4096, "random", "bf16"),
    GpuCase("special", 3, 200000, 3000, "random", "bf16"),
    GpuCase("randn", 4096, 2048, 64, "random"),
    # against the sampled estimate (v3: too high -> radix passes over the row; too low -> more candidates
    # than slots) and 50-way ties in the sampled bin (candidates overflow with min < max)
    GpuCase("sampled", 8, 65536, 2048),
    GpuCase("unsampled", 8, 65536, 2048, "random"),
    GpuCase("unsampled", 16, 32768, 2048),
    GpuCase("ties50", 8, 131072, 2048),
    GpuCase("ties50", 64, 20000, 512, "random", mode="sorted_index"),
    GpuCase("unsampled", 2, 1 << 18, 4096, "random", "bf16"),
    GpuCase("randn", 64, 8192, 512),
    GpuCase("equal", 8, 50000, 1),
    # v3's one-tile rows (keys in registers): NaN / inf / signed zeros in bf16, many tie groups, k near e
    GpuCase("special", 16, 8192, 1000, "random", "bf16"),
    GpuCase("ties50", 16, 8192, 300, "random", mode="sorted_index"),
    GpuCase("ascending", 8, 8192, 4095, "random", mode="sorted"),
    # v3 ranks a threshold bin of <= 256 keys directly (V3_RES): ties of two inside it (registers, list, bf16)
    GpuCase("pairs", 16, 8192, 512, "random"),
    GpuCase("pairs", 8, 32768, 2048),
    GpuCase("pairs", 4, 131072, 2048, "random", "bf16"),
]
VARIANT_NAMES = ["v1", "v3"]


@requires_cuda
@pytest.mark.parametrize("variant", VARIANT_NAMES)
@pytest.mark.parametrize("case", VARIANT_CASES, ids=case_id)
def test_gpu_topk_variant_exact(case, variant, monkeypatch):
    import tilelang_ops.topk as tk

    monkeypatch.setattr(tk, "TOPK_VARIANT", variant)
    _check_gpu_case(case, tk.topk, f" {variant}")


@requires_cuda
@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_gpu_topk_to_slots_variant(variant, monkeypatch):
    import tilelang_ops.topk as tk

    monkeypatch.setattr(tk, "TOPK_VARIANT", variant)
    b, n, k, bc = 16, 40000, 2048, 64  # long rows (no row cache): sampled estimate + compaction
    x = make_scores("randn", b, n, device="cuda")
    end = make_end("random", b, n, k, device="cuda")
    x = poison_beyond_end(x, end)
    table = torch.randint(0, 100000, (b, n // bc + 1), dtype=torch.int32, device="cuda")
    got = tk.topk_to_slots(x, k, end=end, block_size_c=bc, block_tables=table)
    _, idx = topk_torch(x, k, end=end, sorted_index=True)
    want = convert_kv_index_ref_(idx.reshape(b, 1, k).clone(), bc, end.clamp(max=k).reshape(b, 1), table)
    compare_bitwise(f"slots {variant}", got, want.reshape(b, k)).check()


# v3 splits a sampled row (more entries than the candidate capacity) over a cluster of up to MAX_SPLIT CTAs
# while b * split CTAs take at most half the SMs. Each case runs with split 1, 2, 4 and 8 (where they do;
# the wrapper's choice is asserted, so a case that would not split fails instead of passing vacuously):
# shares of 1 to 64 tiles, CTAs with no tile (3 tiles over 4 CTAs), lists that overflow the lead (equal,
# ties50), bounds that fail (sampled, unsampled), every output option.
SPLIT_CASES = [
    GpuCase("randn", 7, 65536, 2048, "random"),
    GpuCase("randn", 33, 9000, 512, "random"),  # 2 tiles
    GpuCase("randn", 16, 20000, 4096, "random", mode="sorted"),  # 3 tiles
    GpuCase("pairs", 8, 32768, 2048),
    GpuCase("unsampled", 16, 32768, 2048),
    GpuCase("sampled", 8, 65536, 2048),
    GpuCase("unsampled", 8, 65536, 2048, "random"),
    GpuCase("ascending", 4, 40000, 4096, mode="sorted"),
    GpuCase("sorted", 4, 131072, 2048),
    GpuCase("equal", 4, 131072, 2048),
    GpuCase("ties50", 8, 131072, 2048),
    GpuCase("conc", 4, 131072, 2048, "random"),
    GpuCase("special", 3, 200000, 3000, "random", "bf16"),
    GpuCase("few", 1, 1 << 20, 4096, "random", "bf16", "sorted_index"),
]


@requires_cuda
@pytest.mark.parametrize("split", [1, 2, 4, 8])
@pytest.mark.parametrize("case", SPLIT_CASES, ids=case_id)
def test_gpu_topk_split_exact(case, split, monkeypatch):
    import tilelang_ops.topk as tk

    if case.b * split > tk._sm_count(torch.device("cuda")) // 2:
        pytest.skip(f"{case.b} rows x {split} CTAs: more than half the SMs (the wrapper would split less)")
    monkeypatch.setattr(tk, "TOPK_VARIANT", "v3")
    monkeypatch.setattr(tk, "MAX_SPLIT", split)
    assert tk._launch(case.b, case.n, torch.device("cuda"))["split"] == split
    _check_gpu_case(case, tk.topk, f" split {split}")


# v3 with fewer threads per CTA (several CTAs per SM: what the wrapper launches for many short rows, see
# _v3_threads), forced on every case (one CTA per row); the launched thread count is asserted. One-tile rows
# (up to 8 x threads entries, keys in registers), rows of a few tiles (the candidate list, with a sample
# in the 32768 tier), an uncached row, ties, bounds that fail, every output option.
THREADS_CASES = [
    GpuCase("randn", 300, 2048, 512, "random"),
    GpuCase("special", 64, 4096, 1000, "random", "bf16"),
    GpuCase("few", 64, 8192, 512, "random"),
    GpuCase("equal", 64, 2048, 64, "random", mode="sorted"),
    GpuCase("randn", 64, 32768, 2048, "random"),
    GpuCase("conc", 64, 20000, 2048),
    GpuCase("ties50", 64, 8192, 300, "random", mode="sorted_index"),
    GpuCase("tiny", 64, 4096, 4096, "random"),
    GpuCase("randn", 300, 100, 8, "random"),
    GpuCase("unsampled", 16, 32768, 2048),
    GpuCase("randn", 4, 65536, 2048, "random"),
    GpuCase("ascending", 8, 8192, 4095, "random", mode="sorted"),
]


@requires_cuda
@pytest.mark.parametrize("threads", [32, 256, 512])
@pytest.mark.parametrize("case", THREADS_CASES, ids=case_id)
def test_gpu_topk_threads_exact(case, threads, monkeypatch):
    import tilelang_ops.topk as tk

    monkeypatch.setattr(tk, "TOPK_VARIANT", "v3")
    monkeypatch.setattr(tk, "MAX_SPLIT", 1)
    monkeypatch.setattr(tk, "_v3_threads", lambda b, n, cache_cap, sms: threads)
    monkeypatch.setattr(tk, "TILE_SHORT", False)  # v3 itself on 256 threads (test_gpu_topk_tile_exact: tile)
    assert tk._launch(case.b, case.n, torch.device("cuda")) == {"split": 1, "threads": threads}
    _check_gpu_case(case, tk.topk, f" threads {threads}")


# Rows of one tile: topk_kernel_tile on 1024 threads (k < end <= TILE) and on 256 threads (end <= 4096, 8 or
# 16 keys a thread: the short tier's rows, forced on every case that fits), and v3's own one-tile path (keys
# in registers, TILE_ROWS off).
TILE_CASES = [
    GpuCase("randn", 64, 8192, 512),
    GpuCase("randn", 7, 2048, 512, "random"),
    GpuCase("conc", 64, 8192, 512, "random", "bf16"),
    GpuCase("tiny", 16, 8192, 4096, "random", mode="sorted"),
    GpuCase("few", 64, 8192, 512, "random"),
    GpuCase("equal", 8, 8192, 512, "random", mode="sorted"),
    GpuCase("special", 16, 8192, 1000, "random", "bf16"),
    GpuCase("ties50", 16, 8192, 300, "random", mode="sorted_index"),
    GpuCase("pairs", 16, 8192, 512, "random"),
    GpuCase("ascending", 8, 8192, 4095, "random", mode="sorted"),
    GpuCase("sorted", 8, 5000, 1, "random"),
    GpuCase("randn", 16, 100, 8, "random", "bf16", "sorted"),
    GpuCase("outliers", 8, 8192, 2048),
    GpuCase("few", 300, 4096, 512, "random"),
    GpuCase("conc", 64, 4096, 1000, "random", "bf16"),
    GpuCase("ties50", 64, 3000, 300, "random", mode="sorted_index"),
    GpuCase("equal", 64, 2048, 64, "random", mode="sorted"),
    GpuCase("special", 32, 2100, 2000, "random", "bf16", "sorted"),
]


@requires_cuda
@pytest.mark.parametrize("kernel, threads", [("tile", 1024), ("tile", 256), ("v3", 1024)],
                         ids=["tile", "tile256", "v3"])
@pytest.mark.parametrize("case", TILE_CASES, ids=case_id)
def test_gpu_topk_tile_exact(case, kernel, threads, monkeypatch):
    import tilelang_ops.topk as tk

    if tk._tile_unroll(case.n, threads) == 0:
        pytest.skip(f"rows of {case.n} entries are more than one tile on {threads} threads")
    monkeypatch.setattr(tk, "TOPK_VARIANT", "v3")
    monkeypatch.setattr(tk, "TILE_ROWS", kernel == "tile")
    monkeypatch.setattr(tk, "_v3_threads", lambda b, n, cache_cap, sms: threads)
    launch = tk._launch(case.b, case.n, torch.device("cuda"))
    assert (launch.get("tile", 0) > 0) == (kernel == "tile") and launch["threads"] == threads, launch
    _check_gpu_case(case, tk.topk, f" {kernel} {threads} threads")


# v3's streaming reads (evict-first loads in the compaction, see STREAM_PRELUDE), forced on every launch of
# uncached rows in one CTA each (the wrapper: such launches that read half the L2 or more, e.g. 128 x 131072
# FP32); the uncached cases above.
@requires_cuda
@pytest.mark.parametrize("case", SPLIT_CASES, ids=case_id)
def test_gpu_topk_stream_exact(case, monkeypatch):
    import tilelang_ops.topk as tk

    monkeypatch.setattr(tk, "TOPK_VARIANT", "v3")
    monkeypatch.setattr(tk, "MAX_SPLIT", 1)
    monkeypatch.setattr(tk, "STREAM_L2_FRACTION", 0.0)
    if tk._cache_cap(case.n) != 0:
        pytest.skip("rows of the cached tiers: the wrapper never streams them")
    launch = tk._launch(case.b, case.n, torch.device("cuda"), 2 if case.dtype == "bf16" else 4)
    assert launch == {"split": 1, "threads": tk.THREADS, "stream": True}
    _check_gpu_case(case, tk.topk, " stream")


@requires_cuda
@pytest.mark.parametrize("split, threads, n, tile", [
    (1, 1024, 30000, 0), (2, 1024, 30000, 0), (1, 256, 30000, 0), (1, 32, 30000, 0),
    (1, 1024, 8000, 8), (1, 256, 4000, 16),  # rows of one tile: topk_kernel_tile
])
def test_gpu_topk_to_slots_launch(split, threads, n, tile, monkeypatch):
    import tilelang_ops.topk as tk

    monkeypatch.setattr(tk, "TOPK_VARIANT", "v3")
    monkeypatch.setattr(tk, "MAX_SPLIT", split)
    monkeypatch.setattr(tk, "_v3_threads", lambda b, n, cache_cap, sms: threads)
    b, k, bc, bs = 8, 2048, 64, 16
    want_launch = {"split": split, "threads": threads, **({"tile": tile} if tile else {})}
    assert tk._launch(b, n, torch.device("cuda")) == want_launch
    end = make_end("random", b, n, k, device="cuda")
    x = poison_beyond_end(make_scores("randn", b, n, device="cuda"), end)
    table = torch.randint(0, 100000, (b, 1000), dtype=torch.int32, device="cuda")
    blocks = torch.stack([torch.randperm(1000 * bc // bs)[: n // bs] for _ in range(b)]).to(torch.int32)
    blocks = blocks.cuda()
    got = tk.topk_to_slots(x, k, end=end, candidate_blocks=blocks, candidate_block_size=bs, block_size_c=bc,
                           block_tables=table)
    _, idx = topk_torch(x, k, end=end)
    restore_candidate_indices_ref_(idx, blocks, bs)
    want = convert_kv_index_ref_(idx.reshape(b, 1, k), bc, end.clamp(max=k).reshape(b, 1), table)
    compare_bitwise(f"slots split {split} threads {threads} tile {tile}", got, want.reshape(b, k)).check()


def test_v3_split_choice(monkeypatch):
    import tilelang_ops.topk as tk
    from tilelang_ops.topk import CAND, MAX_CACHE, SMALL_CACHE, _v3_split

    assert tk.MAX_SPLIT == 8
    # at most half the SMs: 8 CTAs per row up to 8 rows, 4 up to 16, 2 up to 33
    assert [_v3_split(b, 65536, 0, 132) for b in (1, 8, 9, 16, 17, 33, 34)] == [8, 8, 4, 4, 2, 2, 1]
    assert _v3_split(64, 32768, MAX_CACHE, 132) == 1  # the decode shape: measured slower split
    assert _v3_split(128, 131072, 0, 132) == 1  # the rows already fill the device
    assert _v3_split(1, CAND, MAX_CACHE, 132) == 1  # one tile: never sampled, never split
    assert _v3_split(1, SMALL_CACHE, SMALL_CACHE, 132) == 1
    assert _v3_split(1, CAND + 1, MAX_CACHE, 132) == 8
    monkeypatch.setattr(tk, "MAX_SPLIT", 2)
    assert _v3_split(33, 65536, 0, 132) == 2 and _v3_split(34, 65536, 0, 132) == 1


def test_v3_launch_choice():
    from tilelang_ops.topk import (
        SHORT_ROW_THREADS,
        THREADS,
        WARP_ROW_MAX,
        _jit_args,
        _tile_unroll,
        _v3_launch,
    )

    # a warp per row for at least n / 104 rows of <= WARP_ROW_MAX entries per SM; else 256-thread CTAs for
    # more short rows (<= 4096 entries) than SMs; a split row keeps the full CTA
    assert SHORT_ROW_THREADS == 256 and THREADS == 1024 and WARP_ROW_MAX == 1024
    # (the 256-thread rows are one tile of the tile kernel: 8 keys a thread up to 2048 entries, then 16)
    assert _v3_launch(1270, 1000, 132) == {"split": 1, "threads": 32}
    assert _v3_launch(1269, 1000, 132) == {"split": 1, "threads": 256, "tile": 8}
    assert _v3_launch(1300, 1024, 132) == {"split": 1, "threads": 32}
    assert _v3_launch(1299, 1024, 132) == {"split": 1, "threads": 256, "tile": 8}
    assert _v3_launch(762, 600, 132) == {"split": 1, "threads": 32}
    assert _v3_launch(761, 600, 132) == {"split": 1, "threads": 256, "tile": 8}
    assert _v3_launch(1 << 20, 1025, 132) == {"split": 1, "threads": 256, "tile": 8}  # past WARP_ROW_MAX
    assert _v3_launch(1 << 20, 2049, 132) == {"split": 1, "threads": 256, "tile": 16}
    assert _v3_launch(1 << 20, 4096, 132) == {"split": 1, "threads": 256, "tile": 16}
    assert _v3_launch(1 << 20, 4097, 132) == {"split": 1, "threads": 1024, "tile": 8}  # past the short tier
    assert _v3_launch(133, 2049, 132) == {"split": 1, "threads": 256, "tile": 16}
    assert _v3_launch(132, 2048, 132) == {"split": 1, "threads": 1024, "tile": 8}  # a row per SM anyway
    assert _v3_launch(4096, 8193, 132) == {"split": 1, "threads": 1024}  # the 32768 tier
    assert _v3_launch(4096, 65536, 132) == {"split": 1, "threads": 1024}
    assert _v3_launch(1, 65536, 132) == {"split": 8, "threads": 1024}
    # streaming reads for unsplit rows of the uncached tier when the launch reads half the L2 or more
    l2 = 60 << 20
    assert _v3_launch(128, 131072, 132, 4, l2) == {"split": 1, "threads": 1024, "stream": True}
    assert _v3_launch(128, 131072, 132, 2, l2) == {"split": 1, "threads": 1024, "stream": True}  # 32 MiB
    assert _v3_launch(64, 131072, 132, 2, l2) == {"split": 1, "threads": 1024}  # 16 MiB
    assert _v3_launch(64, 32768, 132, 4, l2) == {"split": 1, "threads": 1024}  # 8 MiB
    assert _v3_launch(1024, 32768, 132, 4, l2) == {"split": 1, "threads": 1024}  # the 32768 tier never
    assert _v3_launch(1, 1 << 24, 132, 4, l2) == {"split": 8, "threads": 1024}  # split rows never stream
    # rows of one tile (<= TILE entries) on 1024 threads: topk_kernel_tile
    assert _v3_launch(16384, 8192, 132, 4, l2) == {"split": 1, "threads": 1024, "tile": 8}
    assert _v3_launch(64, 8192, 132) == {"split": 1, "threads": 1024, "tile": 8}
    assert _v3_launch(64, 8193, 132) == {"split": 1, "threads": 1024}
    assert _v3_launch(128, 131072, 132, 4, 0) == {"split": 1, "threads": 1024}  # no L2 size known
    # the default launch keeps the factory's default arguments (and so its cache key)
    static = ("float32", "int32", "int32", 0, False, False, -1, float("-inf"), "topk", 0, 1)
    assert _jit_args(*static, "v3") == ("topk_kernel_v3", static)
    assert _jit_args(*static, "v3", split=2) == ("topk_kernel_v3", static + (2,))
    assert _jit_args(*static, "v3", threads=256) == ("topk_kernel_v3", static + (1, 256))
    assert _jit_args(*static, "v3", threads=32) == ("topk_kernel_warp", static[:3] + static[4:])  # no tier
    assert _jit_args(*static, "v1") == ("topk_kernel", static + ("v1",))
    assert _jit_args(*static, "v3", stream=True) == ("topk_kernel_v3", static + (1, 1024, True))
    assert _jit_args(*static, "v3", tile=8) == ("topk_kernel_tile", static[:3] + static[4:])  # no tier
    assert _jit_args(*static, "v3", threads=256, tile=16) == ("topk_kernel_tile",
                                                               static[:3] + static[4:] + (256, 16))
    assert [_tile_unroll(n, t) for n, t in ((1, 1024), (8192, 1024), (8193, 1024), (2048, 256), (2049, 256),
                                            (4096, 256), (4097, 256))] == [8, 8, 0, 8, 16, 16, 0]


def test_topk_variant_names():
    import tilelang_ops.topk as tk

    assert tk.TOPK_VARIANT in tk.VARIANTS and "v1" in tk.VARIANTS and set(VARIANT_NAMES) == set(tk.VARIANTS)
    with pytest.raises(ValueError, match="variant"):
        tk.topk_kernel.get_tir("float32", "int32", "int32", 0, True, False, -1, float("-inf"), "topk", 0, 1,
                               "v9")


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
