"""gather_rows (SPEC 6): loop reference, twin, argument checks, launch rule, sm_90a build (CPU tier) and
the kernel against its reference (GPU tier).

Every comparison is bitwise: gather_rows copies rows, so the output is x's bytes (the inputs are random
16-bit patterns: NaN payloads, infinities, subnormals and signed zeros included).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from metadata.checks import DEBUG_ENV
from reference.gather_rows import gather_rows_ref, gather_rows_torch
from tests.conftest import case_id, requires_cuda
from tilelang_ops.gather_rows import (
    BUILD_SHAPES,
    DEFAULT_CONFIG,
    SMALL_CONFIG,
    gather_rows,
    gather_rows_config,
    rows_per_cta,
)
from tilelang_ops.testing import compare_bitwise
from tilelang_ops.testing.gather_rows import (
    GatherCase,
    bit_rows,
    expected_rows,
    gather_inputs,
    sentinel_reads,
)

H200 = SimpleNamespace(multi_processor_count=132, L2_cache_size=60 << 20)


def i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


# ------------------------------------------------------------------------------------------------
# CPU tier: reference, twin, checks, launch rule
# ------------------------------------------------------------------------------------------------


def test_reference_by_hand():
    x = torch.arange(4 * 8, dtype=torch.float32).reshape(4, 8).bfloat16()
    out = gather_rows_ref(x, i32([3, 0, 3, 1]))
    want = torch.stack([x[3], x[0], x[3], x[1]])
    compare_bitwise("out", out, want).check()  # a copy: bitwise
    assert gather_rows_ref(x, i32([])).shape == (0, 8)


@pytest.mark.parametrize("n,d,m,strided", [(50, 512, 77, False), (1, 8, 5, False), (9, 520, 0, False),
                                           (33, 64, 100, True)], ids=str)
def test_reference_equals_twin(n, d, m, strided):
    base = bit_rows(n, d + 24 if strided else d, seed=n + m)
    x = base[:, 8:8 + d] if strided else base  # a row-strided view
    index = torch.randint(0, n, (m,), dtype=torch.int32, generator=torch.Generator().manual_seed(m))
    compare_bitwise("ref vs twin", gather_rows_ref(x, index), gather_rows_torch(x, index)).check()


BAD_ARGS = {
    "x_fp32": (TypeError, "x must have dtype torch.bfloat16", lambda x, i: (x.float(), i)),
    "index_int64": (TypeError, "index must have dtype torch.int32", lambda x, i: (x, i.long())),
    "index_2d": (ValueError, "index must have 1 dimensions", lambda x, i: (x, i[None])),
    "x_1d": (ValueError, "x must have 2 dimensions", lambda x, i: (x[0], i)),
    "d_not_multiple_of_8": (ValueError, "D=12", lambda x, i: (x[:, :12], i)),
    "d_too_wide": (ValueError, "at most 16384",
                   lambda x, i: (torch.zeros(2, 16392, dtype=torch.bfloat16), i)),
    "x_not_tensor": (TypeError, "x must be a torch.Tensor", lambda x, i: (x.tolist(), i)),
    "devices": (ValueError, "share one device", lambda x, i: (x, i.to("meta"))),
}


@pytest.mark.parametrize("name", list(BAD_ARGS))
@pytest.mark.parametrize("fn", [gather_rows_ref, gather_rows_torch, gather_rows], ids=lambda f: f.__name__)
def test_bad_arguments_raise(fn, name):
    exc, match, make = BAD_ARGS[name]
    x, index = make(bit_rows(4, 16, 0), i32([0, 3]))
    with pytest.raises(exc, match=match):
        fn(x, index)


@pytest.mark.parametrize("bad", [-1, 4, 1 << 30, -(1 << 31)])
@pytest.mark.parametrize("fn", [gather_rows_ref, gather_rows_torch], ids=lambda f: f.__name__)
def test_references_reject_out_of_range_index(fn, bad):
    """The loop reference and the twin read the index values (the wrapper does under the debug switch)."""
    with pytest.raises(ValueError, match=rf"index\[1\]={bad} is outside \[0, 4\)"):
        fn(bit_rows(4, 16, 0), i32([0, bad, 2]))


@pytest.mark.parametrize("layout,in_place", [("contiguous", True), ("strided", True), ("odd_stride", False),
                                             ("transposed", False), ("misaligned", False)])
def test_flat_rows_view(layout, in_place):
    """The kernel's view of x: row s at s * stride of a flat buffer, in place when the rows are 16-byte
    aligned unit-stride vectors, else a contiguous copy."""
    from tilelang_ops.gather_rows import _flat_rows

    n, d = 5, 16
    if layout == "misaligned":
        x = bit_rows(1, n * d + 1, 3).view(-1)[1:].view(n, d)  # 2 bytes past a 16-byte boundary
    else:
        x, _, _ = gather_inputs(GatherCase("v", n, d, 1, layout=layout))
    flat, stride = _flat_rows(x)
    assert flat.dim() == 1 and flat.is_contiguous() and stride % 8 == 0 and flat.data_ptr() % 16 == 0
    assert (flat.data_ptr() == x.data_ptr()) == in_place
    rows = torch.stack([flat[r * stride: r * stride + d] for r in range(n)])
    compare_bitwise("flat rows", rows, x).check()
    assert flat.numel() == (n - 1) * stride + d  # nothing past the last row


def test_wrapper_needs_cuda():
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        gather_rows(bit_rows(4, 16, 0), i32([0]))


def test_launch_rule():
    """DEFAULT_CONFIG once its grid covers every SM, else one vector per thread (more CTAs)."""
    rows = rows_per_cta(512, DEFAULT_CONFIG)
    assert rows == 16 and rows_per_cta(512, SMALL_CONFIG) == 4
    assert rows_per_cta(8, DEFAULT_CONFIG) == 1024 and rows_per_cta(16384, DEFAULT_CONFIG) == 1
    assert gather_rows_config(1 << 20, 512, H200) == DEFAULT_CONFIG
    assert gather_rows_config(132 * rows, 512, H200) == DEFAULT_CONFIG
    assert gather_rows_config(132 * rows - rows, 512, H200) == SMALL_CONFIG
    assert gather_rows_config(1, 512, H200) == SMALL_CONFIG
    assert gather_rows_config(1 << 20, 16384, SimpleNamespace(multi_processor_count=8)) == DEFAULT_CONFIG


@pytest.mark.parametrize("kwargs", [dict(threads=48), dict(threads=2048), dict(vectors_per_thread=0),
                                    dict(vectors_per_thread=2.0)], ids=str)
def test_config_rejects(kwargs):
    from tilelang_ops.gather_rows import GatherRowsConfig

    with pytest.raises(ValueError, match=f"GatherRowsConfig.{next(iter(kwargs))}="):
        GatherRowsConfig(**kwargs)


@pytest.mark.build
def test_emulator_runs_the_kernel_bitwise():
    """The generated CUDA on the CPU emulator (tools/check_gather_rows_emu.py), blocks in reverse order, on
    a ragged width with out-of-range entries and a strided x; and a broken bound is caught."""
    from tools.check_gather_rows_emu import CASES, MUTATIONS, mismatches, source

    case = next(c for c in CASES if c.id == "d512_m40_bad_strided")
    src = source(case.d, case.config)
    assert mismatches(src, case, "reverse") == 0
    a, b = MUTATIONS["upper_bound"]
    assert a in src and mismatches(src.replace(a, b), case, "forward") > 0, "the emulator misses a bad bound"


@pytest.mark.build
def test_kernels_build_for_sm90():
    from tilelang_ops.build import compile_for_sm90
    from tilelang_ops.gather_rows import build_configs

    for name, factory, static in build_configs():
        src = compile_for_sm90(factory, *static).get_kernel_source()
        assert "*(uint4*)(buf" in src and "*(uint4*)(out" in src, f"{name}: rows must move as 16-byte vectors"
        assert "(int64_t)" in src, f"{name}: source offsets must be 64-bit (N * D may pass 2^31)"
    assert {d for d, _ in BUILD_SHAPES} >= {512, 8, 520}


# ------------------------------------------------------------------------------------------------
# GPU tier: the kernel against the reference
# ------------------------------------------------------------------------------------------------


GPU_CASES = [
    GatherCase("d512_m1", 10, 512, 1),
    GatherCase("d512_m3_odd", 7, 512, 3),
    GatherCase("d512_m0", 7, 512, 0),
    GatherCase("d512_n0_m0", 0, 512, 0),
    GatherCase("d512_m1001_odd", 300, 512, 1001),
    GatherCase("d512_m1001_default_config", 300, 512, 1001, config=DEFAULT_CONFIG),
    GatherCase("d512_m5000_small_config", 5000, 512, 5000, "perm", config=SMALL_CONFIG),
    GatherCase("d512_m65537_perm", 65537, 512, 65537, "perm"),
    GatherCase("d512_m4099_repeat", 3, 512, 4099, "repeat"),
    GatherCase("d512_m3001_strided", 2000, 512, 3001, layout="strided"),
    GatherCase("d512_m300_odd_stride", 100, 512, 300, layout="odd_stride"),
    GatherCase("d512_m40_transposed", 64, 512, 40, layout="transposed"),
    GatherCase("d512_m3000_bad", 500, 512, 3000, "bad"),
    GatherCase("d512_m3000_bad_small_config", 500, 512, 3000, "bad", config=SMALL_CONFIG),
    GatherCase("d8_m5003", 1000, 8, 5003),
    GatherCase("d8_m77_bad_default_config", 10, 8, 77, "bad", config=DEFAULT_CONFIG),
    GatherCase("d520_m1001_ragged_default_config", 100, 520, 1001, config=DEFAULT_CONFIG),
    GatherCase("d520_m999_bad_strided", 100, 520, 999, "bad", "strided"),
    GatherCase("d16384_m37", 20, 16384, 37),
]


def _static_key(case: GatherCase, props) -> tuple | None:
    """(D, config) of the kernel a case launches, None when it launches nothing."""
    if case.m == 0 or case.n == 0:
        return None
    return case.d, case.config or gather_rows_config(case.m, case.d, props)


def gpu_compile_jobs(props) -> list[tuple[str, str, tuple]]:
    """(module, function, static args) of every kernel specialization this file's GPU tests launch."""
    keys = {k for k in (_static_key(c, props) for c in GPU_CASES) if k is not None}
    return [("tilelang_ops.gather_rows", "get_kernel", key) for key in sorted(keys, key=repr)]


def test_gpu_compile_jobs_cover_the_cases():
    jobs = gpu_compile_jobs(H200)
    assert {static for _, _, static in jobs} == {_static_key(c, H200) for c in GPU_CASES} - {None}
    assert all(fn == "get_kernel" and mod == "tilelang_ops.gather_rows" for mod, fn, _ in jobs)
    assert len(jobs) <= 8  # specializations stay few: cases share (D, config)


@requires_cuda
@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
def test_kernel_matches_reference(case, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)  # bad indices: zero rows, no error
    x, index, bad = gather_inputs(case, "cuda")
    out = gather_rows(x, index, config=case.config)
    torch.cuda.synchronize()
    # a copy: bitwise; bad entries (never read) give zero rows, so a sentinel in the output would be a
    # read outside x
    compare_bitwise("out", out, expected_rows(x, index, bad)).check()
    assert sentinel_reads(out) == 0


@requires_cuda
def test_kernel_debug_switch_rejects_bad_index(monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "1")
    x = bit_rows(10, 512, 1, "cuda")
    with pytest.raises(ValueError, match=r"index\[2\]=10 is outside \[0, 10\)"):
        gather_rows(x, i32([0, 9, 10, -1]).cuda())
    out = gather_rows(x, i32([9, 0]).cuda())
    compare_bitwise("out", out, gather_rows_ref(x, i32([9, 0]).cuda())).check()


@requires_cuda
def test_kernel_output_is_fresh_and_index_may_be_strided():
    x = bit_rows(64, 512, 2, "cuda")
    index = torch.arange(0, 128, dtype=torch.int32, device="cuda").flip(0)[::2] % 64  # a strided view
    out = gather_rows(x, index)
    compare_bitwise("out", out, gather_rows_ref(x, index)).check()
    assert out.data_ptr() != x.data_ptr() and out.is_contiguous()
