"""gather_rows (SPEC 6): loop reference, twin, argument checks, launch rule, sm_90a build (CPU tier) and
the kernel against its reference (GPU tier).

Every comparison is bitwise: gather_rows copies rows, so the output is x's bytes (the inputs are random
16-bit patterns: NaN payloads, infinities, subnormals and signed zeros included).
"""

from __future__ import annotations

from dataclasses import dataclass
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
    GatherRowsConfig,
    gather_rows,
    gather_rows_config,
    rows_per_cta,
)
from tilelang_ops.testing import compare_bitwise

H200 = SimpleNamespace(multi_processor_count=132, L2_cache_size=60 << 20)
SENTINEL_BITS = 0x7FC1  # a NaN payload the inputs never contain: a read outside x shows as this


def bit_rows(n: int, d: int, seed: int, device="cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(1 << 15), 1 << 15, (n, d), dtype=torch.int32, generator=g).to(torch.int16)
    bits[bits == SENTINEL_BITS] = 0
    return bits.view(torch.bfloat16).to(device)


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
def test_reference_rejects_out_of_range_index(bad):
    with pytest.raises(ValueError, match=rf"index\[1\]={bad} is outside \[0, 4\)"):
        gather_rows_ref(bit_rows(4, 16, 0), i32([0, bad, 2]))


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


@dataclass(frozen=True)
class GpuCase:
    id: str
    n: int  # rows of x
    d: int
    m: int  # rows gathered
    pattern: str = "random"  # random | repeat (one row many times) | perm | bad (out-of-range entries)
    layout: str = "contiguous"  # contiguous | strided (row stride > D, in place) | odd_stride | transposed
    config: GatherRowsConfig | None = None  # None: the launch rule's choice


GPU_CASES = [
    GpuCase("d512_m1", 10, 512, 1),
    GpuCase("d512_m3_odd", 7, 512, 3),
    GpuCase("d512_m0", 7, 512, 0),
    GpuCase("d512_n0_m0", 0, 512, 0),
    GpuCase("d512_m1001_odd", 300, 512, 1001),
    GpuCase("d512_m1001_default_config", 300, 512, 1001, config=DEFAULT_CONFIG),
    GpuCase("d512_m5000_small_config", 5000, 512, 5000, "perm", config=SMALL_CONFIG),
    GpuCase("d512_m65537_perm", 65537, 512, 65537, "perm"),
    GpuCase("d512_m4099_repeat", 3, 512, 4099, "repeat"),
    GpuCase("d512_m3001_strided", 2000, 512, 3001, layout="strided"),
    GpuCase("d512_m300_odd_stride", 100, 512, 300, layout="odd_stride"),
    GpuCase("d512_m40_transposed", 64, 512, 40, layout="transposed"),
    GpuCase("d512_m3000_bad", 500, 512, 3000, "bad"),
    GpuCase("d512_m3000_bad_small_config", 500, 512, 3000, "bad", config=SMALL_CONFIG),
    GpuCase("d8_m5003", 1000, 8, 5003),
    GpuCase("d8_m77_bad", 10, 8, 77, "bad"),
    GpuCase("d520_m1001_ragged", 100, 520, 1001),
    GpuCase("d520_m999_bad_strided", 100, 520, 999, "bad", "strided"),
    GpuCase("d16384_m37", 20, 16384, 37),
]


def _static_key(case: GpuCase, props) -> tuple | None:
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
    assert len(jobs) <= 6  # specializations stay few: cases share (D, config)


BAD_ENTRIES = (-1, -2, -(1 << 31), (1 << 31) - 1, 1 << 20)  # plus n and n + 1 (just past the end)


def gpu_inputs(case: GpuCase, device):
    """(x, index, sentinel-framed storage or None, bad-entry mask) of a case; x's rows sit between
    rows of SENTINEL_BITS so a read just outside x is visible in the output."""
    g = torch.Generator().manual_seed(case.n * 7 + case.m)
    d = case.d
    width = {"strided": d + 64, "odd_stride": d + 4}.get(case.layout, d)
    frame = bit_rows(case.n + 2, width, seed=case.m + d)
    frame.view(torch.int16)[0] = SENTINEL_BITS
    frame.view(torch.int16)[-1] = SENTINEL_BITS
    if width > d:
        frame.view(torch.int16)[:, d:] = SENTINEL_BITS
    frame = frame.to(device)
    x = frame[1:-1, :d]
    if case.layout == "transposed":
        x = x.t().contiguous().t()  # inner stride != 1: the wrapper copies
    n = case.n
    if case.pattern == "repeat":
        index = torch.full((case.m,), n // 2, dtype=torch.int32)
    elif case.pattern == "perm":
        index = torch.randperm(n, generator=g)[: case.m].int()
    else:
        index = torch.randint(0, max(1, n), (case.m,), generator=g, dtype=torch.int32)
    bad = torch.zeros(case.m, dtype=torch.bool)
    if case.pattern == "bad":
        entries = torch.tensor(BAD_ENTRIES + (n, n + 1), dtype=torch.int32)
        pick = torch.randperm(case.m, generator=g)[: case.m // 5]
        index[pick] = entries[torch.arange(pick.numel()) % entries.numel()]
        bad[pick] = True
    return x, index.to(device), bad


def expected(x, index, bad):
    """Good rows from the loop reference (the twin for big cases: tested equal to it above), bad rows zero."""
    ref = gather_rows_ref if index.numel() <= 5000 else gather_rows_torch
    good = torch.where(bad.to(index.device), 0, index)
    want = ref(x, good)
    want[bad.to(want.device)] = 0
    return want


@requires_cuda
@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
def test_kernel_matches_reference(case, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)  # bad indices: zero rows, no error
    x, index, bad = gpu_inputs(case, "cuda")
    out = gather_rows(x, index, config=case.config)
    torch.cuda.synchronize()
    want = expected(x, index, bad)
    # a copy: bitwise; bad entries (never read) give zero rows, so a sentinel in the output would be a
    # read outside x
    compare_bitwise("out", out, want).check()
    assert not (out.view(torch.int16) == SENTINEL_BITS).any()


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
