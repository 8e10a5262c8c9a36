"""Index logits (SPEC 5): references, twins, host checks, the launch rule, the kernels on the CPU emulator,
the sm_90a build, and (GPU tier) every kernel against its reference plus the whole index read path.

Comparisons: logits are bitwise (the reference fixes the kernel's FP32 order: exact integer block dots,
one rounding per head in a fixed tree, ``reference.index_logits``), over the whole output tensor, which is
pre-filled with a sentinel, so unwritten columns must keep it and ``clean`` columns must be -inf; query
codes and scales bitwise (payload bytes); slots and indices bitwise (integers; an unordered top-k is
compared after sorting each row). In the end-to-end path the FP4 index cache written by the store is
compared within the store's own tolerance (its default kernel sums part of the Hadamard on tensor cores in
another FP32 order, which may move a code by one step); the chain after the store is compared bitwise
against the references run on the stored cache.
"""

import re
from fractions import Fraction

import numpy as np
import pytest
import torch

from reference.index_logits import (
    fma32,
    paged_index_logits_ref,
    paged_index_logits_torch,
    quantize_index_rows_ref,
    quantize_index_rows_torch,
    ragged_index_logits_ref,
    ragged_index_logits_torch,
)
from tests.conftest import case_id, requires_cuda
from tilelang_ops.index_logits import IndexLogitsConfig, kernel_static, launch_config
from tilelang_ops.testing import compare_bitwise
from tilelang_ops.testing.index_logits import (
    DISTS,
    PagedCase,
    RaggedCase,
    index_values,
    make_paged_inputs,
    make_ragged_inputs,
)
from tilelang_ops.testing.index_path import PathCase

P, R, C = PagedCase, RaggedCase, IndexLogitsConfig


def _fresh(kw):
    """The arguments with a fresh copy of the sentinel-filled output."""
    return {**kw, "out": kw["out"].clone()}


# ----------------------------------------------------------------------------------------------------
# CPU: references, twins, the FP32 order

CPU_PAGED = [
    P("b2_n2_k70_rpb16", 2, 2, 70, rows_per_block=16),
    P("b1_n1_k40_h32_wide_clean", 1, 1, 40, heads=32, rows_per_block=8, dist="wide", klen="ragged",
      clean=True),
    P("b2_n3_k33_rpb5_extreme_clean", 2, 3, 33, rows_per_block=5, dist="extreme", clean=True),
    P("b1_n4_k20_mixed", 1, 4, 20, dist="mixed", klen="ragged"),
    P("b1_n1_k1_zeros", 1, 1, 1, dist="zeros", klen="full"),
    P("b2_n1_k0", 2, 1, 0),
    P("cand_b2_n2_bs8", 2, 2, 60, rows_per_block=16, candidates=(4, 8), dist="mixed"),
    P("cand_b1_n1_bs16_clean", 1, 1, 50, candidates=(3, 16), clean=True),
]
CPU_RAGGED = [
    R("t5_n50_random_clean", 5, 50, ranges="ragged", clean=True),
    R("t7_n40_h32_multi_wide", 7, 40, heads=32, ranges="multi", dist="wide"),
    R("t4_n30_causal_tiny", 4, 30, dist="tiny"),
]


@pytest.mark.parametrize("case", CPU_PAGED, ids=case_id)
def test_paged_twin_equals_loop_reference(case):
    kw = make_paged_inputs(case)
    got, want = paged_index_logits_torch(**_fresh(kw)), paged_index_logits_ref(**_fresh(kw))
    compare_bitwise("logits", got, want).check()


@pytest.mark.parametrize("case", CPU_RAGGED, ids=case_id)
def test_ragged_twin_equals_loop_reference(case):
    kw = make_ragged_inputs(case)
    got, want = ragged_index_logits_torch(**_fresh(kw)), ragged_index_logits_ref(**_fresh(kw))
    compare_bitwise("logits", got, want).check()


def test_quantize_twin_equals_loop_reference_and_store_cast():
    g = torch.Generator().manual_seed(3)
    x = torch.cat([index_values(16, d, g) for d in DISTS]).to(torch.bfloat16).reshape(4, -1, 128)
    x[0, 0, :5] = torch.tensor([-0.0, 0.0, 1e-30, -1e-30, 3.0])  # signed zeros keep their sign bit
    (c1, s1), (c2, s2) = quantize_index_rows_ref(x), quantize_index_rows_torch(x)
    compare_bitwise("codes", c2, c1).check()
    compare_bitwise("scales", s2, s1).check()
    assert c1.shape == (4, x.shape[1], 64) and s1.shape == (4, x.shape[1], 4)


def test_unwritten_columns_keep_their_values_and_clean_writes_neg_inf():
    kw = make_paged_inputs(P("c", 1, 2, 30, klen="ragged"))
    klen = kw["klen"]
    got = paged_index_logits_ref(**_fresh(kw))
    col = torch.arange(30)
    beyond = col[None, None, :] >= klen[:, :, None]
    assert bool((got[beyond] == 12345.0).all()) and bool(torch.isfinite(got[~beyond]).all())
    got = paged_index_logits_ref(**{**_fresh(kw), "clean": True})
    assert bool(torch.isneginf(got[beyond]).all())


def test_fma32_rounds_once():
    """fma32 against exact rational arithmetic: the result is the FP32 number nearest a * b + c (ties to
    even), including subnormal and cancelling cases."""
    rng = np.random.default_rng(0)
    vals = np.concatenate([rng.standard_normal(300), rng.standard_normal(100) * 1e-38,
                           2.0 ** rng.integers(-140, 40, 100)]).astype(np.float32)
    for i in range(600):
        a, b, c = (vals[rng.integers(0, vals.size)] for _ in range(3))
        if i % 3 == 0:
            c = np.float32(-float(a) * float(b))  # cancellation: the rounded product's residue
        got = fma32(a, b, c)
        exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
        err = abs(Fraction(float(got)) - exact)
        for nb in (np.nextafter(got, np.float32(np.inf)), np.nextafter(got, np.float32(-np.inf))):
            other = abs(Fraction(float(nb)) - exact)
            assert err < other or (err == other and (got.view(np.int32) & 1) == 0), (a, b, c, got)


def test_reference_is_the_exact_score_up_to_the_head_sum_rounding():
    """The FP32 order computes sum_h w_h relu(q_h . k): against float64 of the dequantized rows, within
    the head sum's roundings (64 steps of 2^-24 of the sum of |terms|)."""
    from reference.kv_store import dequantize_rows

    case = P("x", 2, 2, 90, rows_per_block=16, klen="full")
    kw = make_paged_inputs(case)
    got = paged_index_logits_torch(**_fresh(kw))
    fmt_rows = 16
    table = kw["block_tables"]
    from metadata.cache_format import FP4_INDEX_KV_FORMAT as FMT

    for r in range(case.b):
        slots = [int(table[r, j // fmt_rows]) * fmt_rows + j % fmt_rows for j in range(90)]
        keys = dequantize_rows(kw["index_cache"], slots, FMT).double()  # [90, 128]
        for t in range(case.n):
            qrows = []
            for h in range(case.heads):
                cache = torch.cat([kw["q_codes"][r, t, h], kw["q_scales"][r, t, h]])[None]
                qrows.append(dequantize_rows(cache, [0], FMT)[0])
            q = torch.stack(qrows).double()  # [H, 128]
            terms = kw["weights"][r, t].double()[None, :] * (keys @ q.T).clamp_min(0)  # [90, H]
            want, scale = terms.sum(1), terms.abs().sum(1)
            assert bool(((got[r, t].double() - want).abs() <= scale * 64 * 2.0 ** -24 + 1e-300).all())


def _bad_paged(**over):
    kw = make_paged_inputs(P("e", 2, 2, 40, rows_per_block=16))
    kw.update(over)
    return kw


def _paged_errors():
    kw = make_paged_inputs(P("e", 2, 2, 40, rows_per_block=16))
    cand = torch.zeros(2, 2, 3, dtype=torch.int32)
    return [
        ("q_codes dtype", dict(q_codes=kw["q_codes"].to(torch.int32)), TypeError, "q_codes"),
        ("q_codes heads", dict(q_codes=kw["q_codes"][:, :, :48], q_scales=kw["q_scales"][:, :, :48],
                               weights=kw["weights"][:, :, :48]), ValueError, "q_codes"),
        ("n = 9", dict(q_codes=kw["q_codes"][:, :1].expand(2, 9, 64, 64)), ValueError, "query rows"),
        ("q_scales shape", dict(q_scales=kw["q_scales"][..., :3]), ValueError, "q_scales"),
        ("weights dtype", dict(weights=kw["weights"].double()), TypeError, "weights"),
        ("cache width", dict(index_cache=kw["index_cache"][:, :100].contiguous()), ValueError, "row_bytes"),
        ("table rows", dict(block_tables=kw["block_tables"][:1]), ValueError, "block_tables"),
        ("table too short", dict(max_klen=kw["block_tables"].shape[1] * 16 + 1, out=None), ValueError,
         "too short"),
        ("klen dtype", dict(klen=kw["klen"].long()), TypeError, "klen"),
        ("max_klen tensor", dict(max_klen=torch.tensor(40)), TypeError, "max_klen"),
        ("max_klen bool", dict(max_klen=True), TypeError, "max_klen"),
        ("max_klen negative", dict(max_klen=-1, out=None), ValueError, "max_klen"),
        ("candidates alone", dict(candidate_blocks=cand), ValueError, "candidate_block_size"),
        ("candidate size 12", dict(candidate_blocks=cand, candidate_block_size=12), ValueError, "12"),
        ("candidates too few", dict(candidate_blocks=cand, candidate_block_size=8), ValueError, "compact"),
        ("clean int", dict(clean=1), TypeError, "clean"),
        ("out shape", dict(out=kw["out"][:, :, :10]), ValueError, "out"),
        ("out dtype", dict(out=kw["out"].double()), TypeError, "out"),
    ]


@pytest.mark.parametrize("name, over, exc, text", _paged_errors(), ids=[e[0] for e in _paged_errors()])
def test_paged_bad_arguments_raise_before_anything_is_written(name, over, exc, text):
    from tilelang_ops.index_logits import paged_index_logits

    kw = _bad_paged(**over)
    for fn in (paged_index_logits_ref, paged_index_logits_torch, paged_index_logits):
        out = kw.get("out")
        before = None if out is None else out.clone()
        with pytest.raises(exc, match=text):
            fn(**kw)
        if out is not None:
            assert torch.equal(out, before), f"{fn.__name__} wrote before raising"


@pytest.mark.parametrize("name, over, text", [
    ("klen above max_klen", dict(klen=torch.full((2, 2), 41, dtype=torch.int32)), r"klen\[0, 0\] = 41"),
    ("negative klen", dict(klen=torch.full((2, 2), -1, dtype=torch.int32)), r"klen\[0, 0\] = -1"),
    ("block id beyond the cache", "table", r"block_tables\[1, 0\] = \d+ .*outside the cache"),
    ("candidate below -1", "candidates", r"candidate_blocks\[0, 1, 0\] = -2"),
])
def test_paged_value_checks_name_the_value_and_write_nothing(name, over, text):
    """The loop reference and the twin read the metadata values (the wrapper does under the debug switch,
    tests/test_bad_input_gpu.py): the error names the entry and its value, and ``out`` is unchanged."""
    kw = _bad_paged()
    if over == "table":
        kw["block_tables"] = kw["block_tables"].clone()
        kw["block_tables"][1, 0] = kw["index_cache"].shape[0]
    elif over == "candidates":
        cand = torch.zeros(2, 2, 3, dtype=torch.int32)
        cand[0, 1, 0] = -2
        kw.update(candidate_blocks=cand, candidate_block_size=16)
    else:
        kw.update(over)
    for fn in (paged_index_logits_ref, paged_index_logits_torch):
        before = kw["out"].clone()
        with pytest.raises(ValueError, match=text):
            fn(**kw)
        assert torch.equal(kw["out"], before), f"{fn.__name__} wrote before raising"


def test_ragged_bad_arguments_and_values():
    from tilelang_ops.index_logits import ragged_index_logits

    kw = make_ragged_inputs(R("e", 4, 30))
    bad = [(dict(k_codes=kw["k_codes"][:, :32]), ValueError, "k_codes"),
           (dict(k_scales=kw["k_scales"].float()), TypeError, "k_scales"),
           (dict(ks=kw["ks"].long()), TypeError, "ks"),
           (dict(max_width=3.0), TypeError, "max_width"),
           (dict(q_codes=kw["q_codes"][:3]), ValueError, "q_scales")]
    for over, exc, text in bad:
        for fn in (ragged_index_logits_ref, ragged_index_logits_torch, ragged_index_logits):
            with pytest.raises(exc, match=text):
                fn(**{**kw, **over})
    for over in (dict(ke=kw["ks"] - 1), dict(ke=kw["ke"] + 100), dict(max_width=1, out=None),
                 dict(ks=kw["ks"] - 1 - kw["ks"].max())):
        bad = {**kw, **over}
        row = int(((bad["ks"] < 0) | (bad["ke"] < bad["ks"]) | (bad["ke"] > 30)
                   | (bad["ke"] - bad["ks"] > bad["max_width"])).int().argmax())
        text = f"row {row}: ks = {int(bad['ks'][row])}, ke = {int(bad['ke'][row])} must satisfy"
        for fn in (ragged_index_logits_ref, ragged_index_logits_torch):
            out = bad.get("out")
            before = None if out is None else out.clone()
            with pytest.raises(ValueError, match=re.escape(text)):
                fn(**bad)
            if out is not None:
                assert torch.equal(out, before), f"{fn.__name__} wrote before raising"


def test_wrappers_need_cuda():
    from tilelang_ops.index_logits import paged_index_logits, quantize_index_rows

    kw = make_paged_inputs(P("c", 1, 1, 8))
    with pytest.raises(ValueError, match="CUDA"):
        paged_index_logits(**kw)
    with pytest.raises(ValueError, match="CUDA"):
        quantize_index_rows(torch.zeros(2, 128, dtype=torch.bfloat16))


# ----------------------------------------------------------------------------------------------------
# launch rule, static keys

def test_launch_rule_gives_valid_configs():
    for op in ("paged", "cand", "ragged"):
        for rows in (1, 7, 64, 4096):
            for width in (0, 1, 63, 65536, 131072):
                for n in (1, 2, 3, 4, 8):
                    cfg = launch_config(op, rows=rows, width=width, n=n, sms=132)
                    cfg.validate()
                    if op == "paged":
                        assert cfg.rows >= n
                    if n <= 4:
                        wg = launch_config(op, rows=rows, width=width, n=n, sms=132, wgmma=True)
                        wg.validate()
                        assert wg.wgmma and wg.rows == cfg.rows and wg.keys_per_cta >= cfg.keys_per_cta // 2
    assert 65536 // launch_config("paged", rows=64, width=65536, n=1).keys_per_cta <= 32
    with pytest.raises(ValueError, match="wgmma takes at most 4"):
        launch_config("paged", rows=8, width=100, n=8, wgmma=True)
    with pytest.raises(ValueError):
        IndexLogitsConfig(rows=2, warps=4, keys_per_step=16).validate()
    with pytest.raises(ValueError):
        launch_config("dense", rows=1, width=1)


@pytest.mark.parametrize("schedule", ["random", "warps"])
def test_emulator_runs_one_case_of_each_kernel(schedule):
    """Generated CUDA on the CPU emulator (tools/index_logits_emu.py), bitwise against the twins: the
    quantize kernel, the paged kernel (fast and general path), candidates, ragged on mma.sync and on wgmma
    (the emulator computes a wgmma from its A fragments and the B bytes its descriptor addresses, per the
    PTX ISA's K-major layout without swizzle; only the GPU tier checks that reading); under random switches
    and warp-serially (fiber_emu: a race between two barriers changes the results)."""
    from tools.index_logits_emu import emulate_paged, emulate_quantize, emulate_ragged

    g = torch.Generator().manual_seed(1)
    x = torch.cat([index_values(8, d, g) for d in ("randn", "wide", "extreme")]).to(torch.bfloat16)
    got, want = emulate_quantize(x, schedule=schedule), quantize_index_rows_torch(x)
    compare_bitwise("codes", got[0], want[0]).check()
    compare_bitwise("scales", got[1], want[1]).check()
    for case in (P("p", 2, 2, 90, rows_per_block=16, dist="mixed", clean=True),
                 P("c", 1, 1, 100, candidates=(4, 16), dist="mixed")):
        kw = make_paged_inputs(case)
        got = emulate_paged(schedule=schedule, **_fresh(kw))
        compare_bitwise("logits", got, paged_index_logits_torch(**_fresh(kw))).check()
    for case, cfg in ((R("r", 6, 70, ranges="ragged", clean=True), None),
                      (R("wg", 7, 130, ranges="ragged", dist="mixed", clean=True), WGMMA_CFG)):
        kw = make_ragged_inputs(case)
        got = emulate_ragged(schedule=schedule, config=cfg, **_fresh(kw))
        compare_bitwise("logits", got, ragged_index_logits_torch(**_fresh(kw))).check()


@pytest.mark.build
def test_kernels_build_for_sm90():
    """Every configuration of build_configs compiles for sm_90a (nvcc, no GPU needed)."""
    from tilelang_ops.build import compile_sm90_in_processes
    from tilelang_ops.index_logits import build_configs

    names = [n for n, _, _ in build_configs()]
    assert compile_sm90_in_processes("tilelang_ops.index_logits", names, workers=2) == names


# ----------------------------------------------------------------------------------------------------
# GPU tier: the matrix of the issue. Static keys: the launch rule's (mode, H, rows per CTA, config) plus
# the 16-byte-copy flag; the cases share them (about a dozen kernels).

# the scores on wgmma (IndexLogitsConfig.wgmma): ragged / a request's 2-4 rows at 3 CTAs per SM, one row at 4
WGMMA_CFG = C(rows=4, warps=4, keys_per_step=64, stages=4, keys_per_cta=1024, min_ctas=3, wgmma=True)
WGMMA_ROW_CFG = C(rows=1, warps=4, keys_per_step=64, stages=4, keys_per_cta=2048, min_ctas=4, wgmma=True)

GPU_PAGED = [
    (P("b64_n1_k65536", 64, 1, 65536), None),
    (P("b64_n4_k8192_mixed", 64, 4, 8192, dist="mixed"), None),
    (P("b7_n2_k4099_ragged_clean", 7, 2, 4099, klen="ragged", clean=True), None),
    (P("b1_n8_k131072", 1, 8, 131072), None),
    (P("b7_n8_k257_tiny", 7, 8, 257, dist="tiny", klen="ragged"), None),
    (P("b64_n2_k1000_h32_extreme", 64, 2, 1000, heads=32, dist="extreme"), None),
    (P("b7_n4_k777_rpb5_wide", 7, 4, 777, rows_per_block=5, dist="wide", clean=True), None),
    (P("b1_n1_k1", 1, 1, 1, klen="full"), None),
    (P("b7_n1_k0", 7, 1, 0), None),
    (P("b1_n1_k8192_big", 1, 1, 8192, dist="big"), None),
    (P("b7_n3_k3001_rpb16_shift", 7, 3, 3001, rows_per_block=16, dist="shift"), None),
    (P("b64_n1_k2048_h32_zeros", 64, 1, 2048, heads=32, dist="zeros"), None),
    (P("cand_b7_n2_bs16", 7, 2, 6000, candidates=(64, 16)), None),
    (P("cand_b1_n4_bs8_mixed_clean", 1, 4, 3000, candidates=(100, 8), dist="mixed", clean=True), None),
    (P("cand_b64_n1_bs16_h32", 64, 1, 20000, heads=32, candidates=(128, 16)), None),
    # other configurations of the same kernels (deeper / shallower rings, more warps, small splits)
    (P("cfg_stages2_w8_kc128", 7, 1, 5000, dist="mixed"), C(rows=1, warps=8, keys_per_step=128, stages=2,
                                                             keys_per_cta=256, min_ctas=0)),
    (P("cfg_stages6_split64", 7, 2, 3000), C(rows=2, warps=4, keys_per_step=64, stages=6, keys_per_cta=64)),
    (P("wgmma_b64_n1_k8192", 64, 1, 8192), WGMMA_ROW_CFG),
    (P("wgmma_b7_n1_k4099_h32_ragged_wide_clean", 7, 1, 4099, heads=32, klen="ragged", dist="wide",
       clean=True), WGMMA_ROW_CFG),
    (P("wgmma_b64_n4_k8192_mixed", 64, 4, 8192, dist="mixed"), WGMMA_CFG),
    (P("wgmma_b7_n3_k3001_rpb16_h32_extreme", 7, 3, 3001, rows_per_block=16, heads=32, dist="extreme"),
     WGMMA_CFG),
    (P("wgmma_cand_b7_n2_bs16_mixed", 7, 2, 6000, candidates=(64, 16), dist="mixed"), WGMMA_ROW_CFG),
    (P("wgmma_b7_n2_k777_rpb5_clean", 7, 2, 777, rows_per_block=5, clean=True),
     C(rows=2, warps=4, keys_per_step=64, stages=4, keys_per_cta=256, min_ctas=3, wgmma=True)),
]
GPU_RAGGED = [
    (R("prefill_t512_n8192_causal", 512, 8192), None),
    (R("prefill_t300_n9000_multi_clean", 300, 9000, ranges="multi", clean=True), None),
    (R("prefill_t64_n3000_random_h32", 64, 3000, heads=32, ranges="ragged", dist="mixed"), None),
    (R("prefill_t7_n40000_causal_wide", 7, 40000, dist="wide"), None),
    (R("cfg_rows8", 40, 2000, ranges="ragged", clean=True), C(rows=8, warps=8, keys_per_step=64, stages=4,
                                                              keys_per_cta=512, min_ctas=0)),
    (R("wgmma_t512_n8192_causal", 512, 8192), WGMMA_CFG),
    (R("wgmma_t300_n9000_multi_clean_mixed", 300, 9000, ranges="multi", dist="mixed", clean=True), WGMMA_CFG),
    (R("wgmma_t64_n3000_random_h32_wide", 64, 3000, heads=32, ranges="ragged", dist="wide"), WGMMA_CFG),
    (R("wgmma_t7_n40000_causal_extreme", 7, 40000, dist="extreme"), WGMMA_CFG),
]
GPU_PATHS = [
    PathCase("decode_b7_n2", False, (300, 9000, 4095, 33, 2, 70000, 1000), 2, k=512),
    PathCase("decode_b16_n1", False, tuple(8192 + 37 * i for i in range(16)), 1, k=2048),
    PathCase("decode_b3_n4_h32", False, (5000, 129, 20000), 4, heads=32, k=512),
    PathCase("prefill_b2_chunk300", True, (700, 6000), 300, k=512),
    PathCase("prefill_b1_chunk1024", True, (20000,), 1024, k=2048),
]


def _paged_static(case, cfg, sms):
    mode = "cand" if case.candidates else "paged"
    rows = case.b * case.n if case.candidates else case.b
    width = case.candidates[0] * case.candidates[1] if case.candidates else case.max_klen
    cfg = cfg or launch_config(mode, rows=rows, width=width, n=case.n, sms=sms)
    return kernel_static(mode, case.heads, cfg, case.rows_per_block % 4 == 0)


def _ragged_static(case, cfg, sms):
    cfg = cfg or launch_config("ragged", rows=case.t, width=case.num_keys, sms=sms)
    return kernel_static("ragged", case.heads, cfg, True)


def _path_statics(case, sms):
    """Static keys of a path case's index-logits launches (decode: paged; prefill: ragged)."""
    if case.prefill:
        cfg = launch_config("ragged", rows=case.seqlen_q * len(case.seqlens_k),
                            width=max(case.seqlens_k) // 2, sms=sms)
        return [kernel_static("ragged", case.heads, cfg, True)]
    cfg = launch_config("paged", rows=len(case.seqlens_k), width=max(case.seqlens_k) // 2,
                        n=case.seqlen_q, sms=sms)
    return [kernel_static("paged", case.heads, cfg, True)]


def gpu_compile_jobs(props) -> list[tuple[str, str, tuple]]:
    """(module, function, static args) of every index-logits kernel this file's GPU tests launch (the
    path tests' other operators compile their own kernels on first use)."""
    sms = props.multi_processor_count
    statics = [_paged_static(c, cfg, sms) for c, cfg in GPU_PAGED if c.max_klen and c.b]
    statics += [_ragged_static(c, cfg, sms) for c, cfg in GPU_RAGGED]
    for case in GPU_PATHS:
        statics += _path_statics(case, sms)
    # quantize: x [1, T, 128] (its own test, ragged queries [T, H, 128]) and decode queries [b, n, H, 128]
    jobs = [("tilelang_ops.index_logits", "get_quantize_kernel", (128, rank)) for rank in (2, 3)]
    return jobs + [("tilelang_ops.index_logits", "get_kernel", s) for s in dict.fromkeys(statics)]


def test_gpu_compile_jobs_match_the_launch_plans():
    """The jobs name exactly the static keys the wrapper's launch plans compute for the cases (on a
    132-SM stand-in), and stay few."""
    from types import SimpleNamespace

    from tilelang_ops.index_logits import paged_plan, ragged_plan

    props = SimpleNamespace(multi_processor_count=132, L2_cache_size=60 << 20)
    jobs = {j[2] for j in gpu_compile_jobs(props) if j[1] == "get_kernel"}
    planned = set()
    for case, cfg in GPU_PAGED:
        if case.max_klen and case.b and case.max_klen <= 8192 and case.b * case.max_klen <= 1 << 17:
            planned.add(paged_plan(**make_paged_inputs(case), config=cfg, sms=132)[0])
    for case, cfg in GPU_RAGGED:
        if case.t * case.num_keys <= 1 << 20:
            planned.add(ragged_plan(**make_ragged_inputs(case), config=cfg, sms=132)[0])
    assert planned and planned <= jobs
    assert len(jobs) <= 24


@requires_cuda
@pytest.mark.parametrize("dist", DISTS)
def test_gpu_quantize_bitwise(dist):
    from tilelang_ops.index_logits import quantize_index_rows

    g = torch.Generator().manual_seed(7)
    x = index_values(4099, dist, g).to(torch.bfloat16).reshape(1, 4099, 128).cuda()
    got, want = quantize_index_rows(x), quantize_index_rows_torch(x)
    compare_bitwise("codes", got[0], want[0]).check()
    compare_bitwise("scales", got[1], want[1]).check()


@requires_cuda
@pytest.mark.parametrize("case, cfg", GPU_PAGED, ids=[c.id for c, _ in GPU_PAGED])
def test_gpu_paged_bitwise(case, cfg):
    from tilelang_ops.index_logits import paged_index_logits

    kw = make_paged_inputs(case, device="cuda")
    got = paged_index_logits(**_fresh(kw), config=cfg)
    compare_bitwise("logits", got, paged_index_logits_torch(**_fresh(kw))).check()


@requires_cuda
@pytest.mark.parametrize("case, cfg", GPU_RAGGED, ids=[c.id for c, _ in GPU_RAGGED])
def test_gpu_ragged_bitwise(case, cfg):
    from tilelang_ops.index_logits import ragged_index_logits

    kw = make_ragged_inputs(case, device="cuda")
    got = ragged_index_logits(**_fresh(kw), config=cfg)
    compare_bitwise("logits", got, ragged_index_logits_torch(**_fresh(kw))).check()


@requires_cuda
def test_gpu_paged_out_none_and_every_row_count():
    """out=None allocates; n = 1..8 all map onto the four row counts; valid columns equal the twin."""
    from tilelang_ops.index_logits import paged_index_logits

    for n in range(1, 9):
        kw = make_paged_inputs(P(f"n{n}", 3, n, 300, klen="ragged"), device="cuda")
        got = paged_index_logits(**{**kw, "out": None})
        want = paged_index_logits_torch(**_fresh(kw))
        keep = torch.arange(300, device="cuda")[None, None, :] < kw["klen"][:, :, None]
        compare_bitwise(f"logits n={n}", torch.where(keep, got, 0.0), torch.where(keep, want, 0.0)).check()


def test_gather_index_rows_is_the_loop_over_block_tables():
    """The prefill path's torch gather of each request's index rows (both chains of the end-to-end test use
    it, so it is checked here against a loop over the block tables, byte for byte)."""
    from tilelang_ops.testing.index_path import BC, RATIO, build_path, gather_index_rows

    p = build_path(PathCase("prefill_b3", True, (700, 6000, 301), 300), device="cpu")
    cache, meta = p["index_cache"], p["meta"]
    g = torch.Generator().manual_seed(3)
    cache.copy_(torch.randint(0, 256, cache.shape, dtype=torch.uint8, generator=g))
    codes, scales = gather_index_rows(cache, p["index_rows"])
    want_codes, want_scales = [], []
    for b in range(meta.num_reqs):
        for j in range(int(meta.seqlens_k[b]) // RATIO):
            blk, pos = int(meta.block_tables[b, j // BC]), j % BC
            want_codes.append(cache[blk, pos * 64:(pos + 1) * 64])
            want_scales.append(cache[blk, BC * 64 + pos * 4:BC * 64 + (pos + 1) * 4])
    compare_bitwise("codes", codes, torch.stack(want_codes)).check()
    compare_bitwise("scales", scales, torch.stack(want_scales)).check()


@requires_cuda
@pytest.mark.parametrize("case", GPU_PATHS, ids=case_id)
def test_gpu_index_read_path_end_to_end(case):
    from tilelang_ops.testing.index_path import build_path, kernel_ops, reference_ops, run

    p = build_path(case, device="cuda")
    ker = run(p, kernel_ops())
    ref = run(p, reference_ops())
    for name in ("main_cache", "state", "out_norm", "kv_index"):
        compare_bitwise(name, ker[name], ref[name]).check()
    # the FP4 index store: within its own tolerance (module docstring); codes / scales bytes apart
    diff = int((ker["index_cache"] != ref["index_cache"]).sum())
    assert diff <= max(4, ker["kv_index"].shape[0] * 68 // 1000), f"{diff} index cache bytes differ"
    # from the stored cache on: bitwise
    chk = run(p, reference_ops(), index_cache=ker["index_cache"])
    compare_bitwise("q_codes", ker["q_codes"], chk["q_codes"]).check()
    compare_bitwise("q_scales", ker["q_scales"], chk["q_scales"]).check()
    if case.prefill:
        width = (ker["ke"] - ker["ks"])[:, None]
        valid = torch.arange(ker["logits"].shape[1], device="cuda")[None, :] < width
        compare_bitwise("logits", torch.where(valid, ker["logits"], 0.0),
                        torch.where(valid, chk["logits"], 0.0)).check()
        compare_bitwise("indices", torch.sort(ker["indices"], 1).values,
                        torch.sort(chk["indices"], 1).values).check()
    else:
        klen = ker["klen"]
        valid = torch.arange(ker["logits"].shape[2], device="cuda")[None, None, :] < klen[:, :, None]
        compare_bitwise("logits", torch.where(valid, ker["logits"], 0.0),
                        torch.where(valid, chk["logits"], 0.0)).check()
        compare_bitwise("slots", ker["slots"], chk["slots"]).check()
