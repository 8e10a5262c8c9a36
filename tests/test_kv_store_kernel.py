"""norm_rope_hadamard_cast_store kernel: configs and the launch rule, sm_90a build check, CPU emulator
(CPU tier) and kernel vs reference (GPU tier)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from metadata.cache_format import (
    FP8_MAIN_KV_FORMAT,
    KVCacheFormat,
)
from reference.kv_store import (
    _hadamard_matrix,
    norm_rope_hadamard_cast_store_ref,
    norm_rope_hadamard_cast_store_torch,
)
from tests.conftest import case_id, requires_cuda
from tilelang_ops.diffcases import kv_store as kv_diff
from tilelang_ops.kv_store import (
    AMAX_PRELUDE,
    BF16X2_PRELUDE,
    DEFAULT_CONFIGS,
    HMMA_PRELUDE,
    INV_E4M3_PRELUDE,
    KVStoreConfig,
    check_config,
    chunks_fit,
    kv_store_kernel,
    launch_config,
    norm_rope_hadamard_cast_store,
    static_args,
    uses_hadamard_mma,
)
from tilelang_ops.testing import compare_bitwise
from tilelang_ops.testing.kv_store import (
    FORMATS,
    SENTINEL,
    StoreCase,
    all_options,
    hadamard_mma_model,
    make_inputs,
    no_options,
)

PLAIN = KVStoreConfig()  # two chunks, one row per thread, no options, the compiler's register choice

# (id, static args of kv_store_kernel: format .. slot dtype, config)
BUILD_JOBS = [
    ("fp8_main_plain", ("fp8_main", 64, True, False, True, 1, "bfloat16", "int64", "int64", PLAIN)),
    ("fp8_main_chunks4", ("fp8_main", 64, True, False, True, 1, "bfloat16", "int64", "int64",
                          PLAIN.replace(chunks=4))),
    ("fp8_main_half_w32_i32", ("fp8_main", 64, False, False, False, 1, "float32", "int32", "int32", PLAIN)),
    ("fp4_main_plain_R2", ("fp4_main", 64, True, False, False, 1, "bfloat16", "int32", "int64",
                           PLAIN.replace(rows_per_thread=2))),
    ("fp4_index_plain_rpb64", ("fp4_index", 64, True, True, True, 64, "bfloat16", "int64", "int64", PLAIN)),
    ("fp4_index_half_rpb5", ("fp4_index", 64, False, False, True, 5, "float32", "int32", "int32", PLAIN)),
    ("bf16_plain_R2", ("bf16", 64, False, False, True, 1, "float32", "int32", "int64",
                       PLAIN.replace(rows_per_thread=2))),
] + [(f"{f}_default", (f, 64, True, f == "fp4_index", True, 64 if f == "fp4_index" else 1, "bfloat16",
                       "int64", "int64", launch_config(FORMATS[f], 1 << 20)))
     for f in ("fp8_main", "fp4_main", "fp4_index", "bf16")]


@pytest.mark.parametrize("job", BUILD_JOBS, ids=lambda j: j[0])
def test_build_sm90(job):
    """The kernel lowers and compiles for sm_90a with 16-byte row loads and its payload in vector stores
    (or predicated ones with pred_store): its store guard is a kernel argument, so TileLang's safe-memory
    pass (which would split every vector store into guarded byte stores) is off."""
    from tilelang_ops.build import compile_for_sm90

    _, static = job
    src = compile_for_sm90(kv_store_kernel, *static).get_kernel_source()
    fmt_name, rpb, has_out_norm, config = static[0], static[5], static[4], static[-1]
    if config.pred_store:
        assert "tl_kvs_st" in src, f"{fmt_name}: predicated stores expected"
    else:
        want = STORE_VECTOR.get(fmt_name, "*(uint2*)(cache" if rpb % 2 == 0 else "*(uint*)(cache")
        assert want in src, f"{fmt_name}: expected a vectorized payload store {want!r}"
        assert "(slot < capacity)" in src or config.chunks == 1
    assert "*(uint4*)(kv" in src or "(uint4*)(kv +" in src  # 16-byte row loads
    assert "__shfl_xor_sync" in src
    assert ("out_norm +" in src or "out_norm[" in src) == has_out_norm
    if fmt_name == "bf16":  # a BF16 row is stored from the rounded BF16 words (no re-round, no byte masks)
        assert "& (ushort)255" not in src


# the vector store each format must use for its payload (read from the generated CUDA)
STORE_VECTOR = {"fp8_main": "*(uint4*)(cache", "fp4_main": "*(uint2*)(cache", "bf16": "*(uint4*)(cache"}


def test_build_sm90_options():
    """The cast options lower and compile; e2m1_bf16x2 declares and calls its BF16x2 helpers, keeps the
    8-byte payload stores and needs no division for the scale; scale_mul drops the amax / 6 division;
    inv_table reads 2 / sf from its table (no division left but the norm's), e2m1_noclamp votes;
    weight_smem stages FP32 weights in shared memory behind one barrier; rope_spread exchanges a row's
    rotated channels through shared memory between two __syncwarp; amax_bf16x2 takes a chunk's amax with
    max.xorsign.abs.bf16x2; rcp_norm takes the norm's reciprocal as rcp.rn (with inv_table, no division
    is left); options off (or not applicable) leave the source without them."""
    from tilelang_ops.build import compile_for_sm90

    def src(shape, **options):
        config = KVStoreConfig(min_ctas=5, **options)
        return compile_for_sm90(kv_store_kernel, *shape, config).get_kernel_source()

    idx = ("fp4_index", 64, True, True, False, 64, "bfloat16", "int64", "int64")
    s = src(idx, e2m1_bf16x2=True)
    assert BF16X2_PRELUDE in s and "tl_kvs_bf16x2_fma(aw" in s and "__byte_perm" in s
    assert "*(uint2*)(cache" in s and "__fdiv_rn(amax" not in s
    # hadamard_mma: the Hadamard's cross-lane butterflies (one shuffle site) become one MMA call site (2 x 8
    # tiles, unrolled); the norm's and the scale group's shuffles stay
    s_mma = src(idx, e2m1_bf16x2=True, hadamard_mma=True)
    assert HMMA_PRELUDE in s_mma and s_mma.count("tl_kvs_hmma_chain<") == 1
    assert s.count("__shfl_xor_sync") == 3 and s_mma.count("__shfl_xor_sync") == 2
    assert "oth[j_8] = __shfl_xor_sync(" in s and "oth[" not in s_mma
    assert HMMA_PRELUDE not in src(idx[:3] + (False,) + idx[4:], e2m1_bf16x2=True, hadamard_mma=True)
    main = ("fp4_main", 64, True, False, False, 1, "bfloat16", "int64", "int64")
    s = src(main, rows_per_thread=2, scale_mul=True)
    assert "__fdiv_rn(amax" not in s and "__fmul_rn(amax" in s and "tl_kvs" not in s
    s_plain = src(main, rows_per_thread=2)
    assert "__fdiv_rn(amax" in s_plain and "__syncthreads()" not in s_plain
    s = src(main, rows_per_thread=2, scale_mul=True, inv_table=True, e2m1_noclamp=True)
    assert INV_E4M3_PRELUDE in s and "inv = tl_kvs_inv_e4m3(" in s and "__all_sync(" in s
    assert "__fdiv_rn" not in s.replace("rinv[0] = __fdiv_rn(", "")  # the scale's division is gone
    s = src(main, rows_per_thread=2, scale_mul=True, inv_table=True, e2m1_noclamp=True, rcp_norm=True)
    assert "__fdiv_rn" not in s and "rinv[0] = __frcp_rn(" in s  # rcp_norm: no division left
    fp8 = ("fp8_main", 64, True, False, False, 1, "bfloat16", "int64", "int64")
    s = src(fp8, rows_per_thread=2, weight_smem=True, rope_spread=True)
    assert s.count("__syncthreads()") == 1 and s.count("__syncwarp()") == 2  # in the rows loop
    assert "maxabs" not in s
    s = src(fp8, rows_per_thread=2, amax_bf16x2=True)
    # one call site, in an unrolled loop
    assert AMAX_PRELUDE in s and s.count("tl_kvs_bf16x2_maxabs(a16, ") == 1
    assert "max.xorsign.abs.bf16x2" in s
    # rope_spread needs the pairs to split evenly over a row's 16 lanes: rope_dim 48 keeps the chunk-wise RoPE
    st48 = ("fp4_main", 48, True, False, False, 1, "bfloat16", "int64", "int64")
    s = compile_for_sm90(kv_store_kernel, *st48, DEFAULT_CONFIGS["fp4_main"]).get_kernel_source()
    assert "__syncwarp()" not in s and "__all_sync(" in s


def test_config_rules():
    """The launch rule's table and the config checks: an option that does not apply to a format, an
    e2m1_noclamp without its table, a chunking that cannot lay the row out are errors."""
    on = lambda name: set(DEFAULT_CONFIGS[name].options())  # noqa: E731
    assert on("fp4_index") == {"e2m1_bf16x2", "weight_smem", "hadamard_mma", "pred_store"}
    assert on("fp4_main") == {"scale_mul", "inv_table", "e2m1_noclamp", "weight_smem", "rope_spread",
                              "pred_store"}
    assert on("fp8_main") == {"weight_smem", "rope_spread", "amax_bf16x2", "rcp_norm"}
    assert on("bf16") == {"weight_smem"}
    for name, fmt in FORMATS.items():
        assert launch_config(fmt, 1 << 20).rows_per_thread == 2
        assert launch_config(fmt, 32767).rows_per_thread == 1
        assert launch_config(fmt, 1 << 20) == DEFAULT_CONFIGS[name]
        check_config(fmt, all_options(name))
    with pytest.raises(ValueError, match="do not apply"):
        check_config(FORMATS["fp4_main"], KVStoreConfig(e2m1_bf16x2=True))
    with pytest.raises(ValueError, match="do not apply"):
        check_config(FORMATS["bf16"], KVStoreConfig(rope_spread=True, amax_bf16x2=True))
    with pytest.raises(ValueError, match="needs inv_table"):
        KVStoreConfig(scale_mul=True, e2m1_noclamp=True)
    for bad in ({"chunks": 3}, {"rows_per_thread": 0}, {"min_ctas": -1}, {"hmma_chain": 3}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            KVStoreConfig(**bad)
    # a half-split RoPE partner must sit in another lane: FP4 index rows with 4 chunks have 2 lanes
    assert not chunks_fit(FORMATS["fp4_index"], 4, 64, False)
    assert chunks_fit(FORMATS["fp4_index"], 2, 64, False)


def test_wrapper_rejects_bad_config():
    case = StoreCase("cfg", "fp8_main", 4)
    fmt, kv, w, cos, sin, pos, slots, cache = make_inputs(case)
    with pytest.raises(TypeError, match="KVStoreConfig"):
        norm_rope_hadamard_cast_store(kv, w, 1e-6, cos, sin, pos, slots, cache, fmt, config={"chunks": 2})
    with pytest.raises(ValueError, match="do not apply"):
        norm_rope_hadamard_cast_store(kv, w, 1e-6, cos, sin, pos, slots, cache, fmt,
                                      config=KVStoreConfig(hadamard_mma=True))
    fmt, kv, w, cos, sin, pos, slots, cache = make_inputs(StoreCase("cfg", "fp4_index", 4, interleaved=False))
    with pytest.raises(ValueError, match="chunks=4"):
        norm_rope_hadamard_cast_store(kv, w, 1e-6, cos, sin, pos, slots, cache, fmt, interleaved=False,
                                      config=KVStoreConfig(chunks=4))


def test_kernel_supports():
    from tilelang_ops.kv_store import kernel_supports

    for fmt in FORMATS.values():
        for interleaved in (True, False):
            assert kernel_supports(fmt, 64, interleaved) is None
    assert kernel_supports(FP8_MAIN_KV_FORMAT, 8, True) is not None  # not a multiple of 16
    assert kernel_supports(FP8_MAIN_KV_FORMAT, 48, False) is not None  # half-split partner lanes
    assert kernel_supports(KVCacheFormat("x", 384, "e4m3", "ue8m0", 32), 64, True) is not None


def test_wrapper_rejects_cpu_and_unsupported():
    from tilelang_ops.kv_store import norm_rope_hadamard_cast_store

    case = StoreCase("w", "fp8_main", 4)
    fmt, kv, w, cos, sin, pos, slots, cache = make_inputs(case)
    with pytest.raises(ValueError, match="CUDA"):
        norm_rope_hadamard_cast_store(kv, w, 1e-6, cos, sin, pos, slots, cache, fmt)
    with pytest.raises(TypeError):  # the shared host checks run first
        norm_rope_hadamard_cast_store(kv.float(), w, 1e-6, cos, sin, pos, slots, cache, fmt)


def compare_store(got, want, fmt, slots):
    """The tolerant rule of tilelang_ops/diffcases/kv_store.py (kept for compress_store, whose gated
    mean may move a rounding): unwritten bytes bitwise; codes and scales one step at most, in at most
    0.1% of them. kv_store's own kernel tests compare bitwise."""
    for c in kv_diff.compare_store(got, want, fmt, slots):
        c.check()


def test_compare_store_can_fail():
    """The tolerant comparison must reject a two-step code, a moved sentinel and a 1%-wide drift."""
    case = StoreCase("cmp", "fp8_main", 50)
    fmt, kv, w, cos, sin, pos, slots, cache = make_inputs(case)
    norm_rope_hadamard_cast_store_ref(kv, w, 1e-6, cos, sin, pos, slots, cache, fmt)
    compare_store(cache, cache.clone(), fmt, slots)
    s = int(slots[0])
    blk, r = divmod(s, 8)
    bad = cache.clone()
    bad[blk, r * 528 + 3] ^= 0x02  # two steps away
    with pytest.raises(AssertionError):
        compare_store(bad, cache, fmt, slots)
    bad = cache.clone()
    unused = [x for x in range(cache.shape[0] * 8) if x not in set(slots.tolist())][0]
    bad[unused // 8, (unused % 8) * 528] ^= 1
    with pytest.raises(AssertionError):
        compare_store(bad, cache, fmt, slots)
    bad = cache.clone()
    for x in slots[slots >= 0].tolist():
        b, rr = divmod(x, 8)
        for k in range(0, 64, 7):
            code = int(bad[b, rr * 528 + k])
            bad[b, rr * 528 + k] = code + 1 if code not in (0x7E, 0xFE, 0x7F, 0xFF, 0x80, 0) else code
    with pytest.raises(AssertionError):
        compare_store(bad, cache, fmt, slots)




# ---- the CPU emulator (tools/check_kv_store_emu.py) on the launch rule's kernel of each format ----

EMU_CASES = {"fp8_main": 0, "fp4_main": 4, "fp4_index": 7, "bf16": 12}  # indices into its CASES


@pytest.mark.parametrize("fmt_name", list(EMU_CASES))
def test_cpu_emulator_runs_the_default_kernel(fmt_name):
    """The generated CUDA of a large launch's config (R = 2; slot -1, slots beyond the cache and positions
    beyond the table included), run on CPU: cache and out_norm bitwise equal to the twin."""
    from tools import check_kv_store_emu as emu

    case, _, has_norm, bad = emu.CASES[EMU_CASES[fmt_name]]
    assert case.fmt == fmt_name
    mismatches, line = emu.check_case(case, (2,), has_norm, bad, configs=("default",), orders=("forward",))
    assert mismatches == 0, line


@pytest.mark.parametrize("chain", [1, 4])
def test_cpu_emulator_runs_the_other_hmma_chains(chain):
    """The FP4 index kernel with ``hmma_chain`` 1 and 4 (the launch rule's is 2): its butterflies after the
    chained MMAs give the Hadamard order of ``hadamard_mma_model`` with that chain, bitwise."""
    from tools import check_kv_store_emu as emu

    case, _, has_norm, bad = emu.CASES[EMU_CASES["fp4_index"]]
    data = emu.inputs(case, bad)
    config = emu.config_for("default", case, 2).replace(hmma_chain=chain)
    had = emu.hadamard_fn(config, case)
    assert had is not None and config.hmma_chain != DEFAULT_CONFIGS["fp4_index"].hmma_chain
    want = emu.oracle(case, has_norm, data, loop=False, had=had)
    got = emu.run_emu(config, case, has_norm, data)
    assert [emu.ndiff(a, b) for a, b in zip(got, want)] == [0, 0]


def test_cpu_emulator_catches_a_broken_kernel():
    from tools import check_kv_store_emu as emu

    assert emu.mutation_caught(0, emu.MUTATIONS["rstd_scaled"])
    assert emu.mutation_caught(EMU_CASES["fp4_index"], emu.OPTION_MUTATIONS["bf16x2_scale_round"][1])


GPU = "cuda"  # the GPU-tier tests' device


def _sync():
    if GPU == "cuda":
        torch.cuda.synchronize()


@dataclass(frozen=True)
class GpuCase(StoreCase):
    rows_per_block: int = 64  # a real cache block (StoreCase's CPU cases use 8)
    out_norm: bool = True
    config: KVStoreConfig | None = None  # None: the launch rule's


def _config(case: GpuCase) -> KVStoreConfig:
    return case.config or launch_config(FORMATS[case.fmt], case.rows, case.rope_dim, case.interleaved)


def _static_key(case: GpuCase) -> tuple:
    """kv_store_kernel's static arguments for the launch ``case`` makes."""
    dt = {torch.int32: "int32", torch.int64: "int64"}[case.index_dtype]
    return static_args(FORMATS[case.fmt], case.rope_dim, case.interleaved, case.hadamard, case.out_norm,
                       case.rows_per_block, "float32" if case.weight_fp32 else "bfloat16", dt, dt,
                       _config(case))


GPU_CASES = []
for _f, _h in (("fp8_main", False), ("fp4_main", False), ("fp4_index", True), ("bf16", False)):
    for _rows in (1, 5, 64, 1000, 65536, 1 << 20):
        GPU_CASES.append(GpuCase(f"{_f}_rows{_rows}", _f, _rows, hadamard=_h))
    GPU_CASES.append(GpuCase(f"{_f}_half_w32_i32", _f, 777, interleaved=False, hadamard=_h, weight_fp32=True,
                             index_dtype=torch.int32, out_norm=False))
GPU_CASES += [
    GpuCase("fp4_main_rope48", "fp4_main", 1000, rope_dim=48),
    GpuCase("fp4_main_rope128", "fp4_main", 777, rope_dim=128),
    GpuCase("fp8_main_rope16", "fp8_main", 333, rope_dim=16),
    GpuCase("fp8_main_rope128_half", "fp8_main", 333, interleaved=False, rope_dim=128),
    GpuCase("bf16_rope32_half", "bf16", 100, interleaved=False, rope_dim=32),
    GpuCase("fp4_index_had_rope32_half", "fp4_index", 333, interleaved=False, hadamard=True, rope_dim=32),
    GpuCase("fp8_main_hadamard", "fp8_main", 333, hadamard=True),  # main rows' Hadamard: amax_bf16x2 reads
    GpuCase("fp4_main_hadamard_half", "fp4_main", 333, interleaved=False, hadamard=True),  # its BF16 words
    GpuCase("fp4_index_plain_rows4097", "fp4_index", 4097),
    GpuCase("fp4_index_hadamard_rpb5", "fp4_index", 333, hadamard=True, rows_per_block=5),
    GpuCase("fp4_index_half_rpb16", "fp4_index", 100, interleaved=False, rows_per_block=16),
    GpuCase("fp8_main_rows3001", "fp8_main", 3001),
    GpuCase("bf16_half_w32_i32_norm", "bf16", 777, interleaved=False, weight_fp32=True,
            index_dtype=torch.int32),
    GpuCase("fp8_main_rows1M_no_norm", "fp8_main", 1 << 20, out_norm=False),
]

# Explicit configs on a partial last CTA and a tiny launch (and, for the options, rows of tiny values:
# scales at the amax floor; for FP4 main rows whose amax / 6 lands just above subnormal e4m3 scales, |z| up
# to 9: e2m1_noclamp's clamped encode). The rows share each config's kernel.
CONFIG_CASES = []
for _f in FORMATS:
    _idx = _f == "fp4_index"
    for _il in (True, False):
        _half = "" if _il else "_half"
        for _chunks in (2, 4):  # 4 falls back to 2 where the half-split RoPE partner would share the lane
            while not chunks_fit(FORMATS[_f], _chunks, 64, _il):
                _chunks //= 2
            _cfg = DEFAULT_CONFIGS[_f].replace(chunks=_chunks, rows_per_thread=1)
            for _rows in (3001, 7):
                CONFIG_CASES.append(GpuCase(f"{_f}{_half}_chunks{_chunks}_rows{_rows}", _f, _rows,
                                            interleaved=_il, hadamard=_idx, rows_per_block=5 if _idx else 64,
                                            config=_cfg))
        tiny, near_subnormal = (1e-30, 1.0) if _idx else (1e-6, 5e-6)
        for _opts, _make in (("options", all_options), ("plain", no_options)):
            for _rpt in (1, 2):
                _cfg = _make(_f, rows_per_thread=_rpt)
                for _rows, _scale in ((3001, 1.0), (7, 1.0), (515, tiny), (263, near_subnormal)):
                    CONFIG_CASES.append(GpuCase(f"{_f}{_half}_{_opts}_R{_rpt}_rows{_rows}_x{_scale:g}", _f,
                                                _rows,
                                                interleaved=_il, hadamard=_idx, scale=_scale,
                                                rows_per_block=5 if _idx else 64, config=_cfg))
    for _rpt in (1, 2, 4):  # every rows-per-thread count: rows < R * rows_per_cta tails
        for _rows in (3001, 7):
            CONFIG_CASES.append(GpuCase(f"{_f}_R{_rpt}_rows{_rows}", _f, _rows, hadamard=_idx,
                                        config=DEFAULT_CONFIGS[_f].replace(rows_per_thread=_rpt)))
CONFIG_CASES = list({c.id: c for c in CONFIG_CASES}.values())  # (the chunk fallback repeats a few)

# The tensor-core Hadamard without pred_store (hadamard_mma forced on; rows per thread by the launch rule)
_HMMA = DEFAULT_CONFIGS["fp4_index"].replace(pred_store=False)
HMMA_CASES = [GpuCase("idx_rows1M", "fp4_index", 1 << 20, hadamard=True, out_norm=False, config=_HMMA),
              GpuCase("idx_rows1000", "fp4_index", 1000, hadamard=True,
                      config=_HMMA.replace(rows_per_thread=1)),
              GpuCase("idx_half_rpb5", "fp4_index", 333, interleaved=False, hadamard=True, rows_per_block=5,
                      config=_HMMA.replace(rows_per_thread=1)),
              GpuCase("idx_tiny", "fp4_index", 515, hadamard=True, scale=1e-30,
                      config=_HMMA.replace(rows_per_thread=1)),
              GpuCase("idx_rope32_half", "fp4_index", 333, interleaved=False, hadamard=True, rope_dim=32,
                      config=_HMMA.replace(rows_per_thread=1))]

# |x| = 1 rows at position 0 (every stage exact): the default config and every option on
EXACT_CASES = [GpuCase(f"{f}_{'il' if il else 'half'}_{opts}", f, 300, interleaved=il,
                       hadamard=f == "fp4_index",
                       config=None if opts == "default" else all_options(f, rows_per_thread=1))
               for f in FORMATS for il in (True, False) for opts in ("default", "all")]

REPEAT_CASE = GpuCase("rep", "fp8_main", 200, out_norm=False)


def gpu_compile_jobs(props) -> list[tuple[str, str, tuple]]:
    """(module, function, static args) of every kernel specialization this file's GPU tests launch (the
    launch rule does not depend on the device)."""
    keys = {_static_key(c) for c in GPU_CASES + CONFIG_CASES + HMMA_CASES + EXACT_CASES + [REPEAT_CASE]}
    return [("tilelang_ops.kv_store", "kv_store_kernel", key) for key in sorted(keys, key=repr)]


def test_gpu_compile_jobs_cover_the_cases():
    jobs = gpu_compile_jobs(None)
    statics = {static for _, _, static in jobs}
    for case in GPU_CASES + CONFIG_CASES + HMMA_CASES + EXACT_CASES + [REPEAT_CASE]:
        assert _static_key(case) in statics, case.id
        kernel_config = _static_key(case)[-1]
        check_config(FORMATS[case.fmt], kernel_config)
        assert chunks_fit(FORMATS[case.fmt], kernel_config.chunks, case.rope_dim, case.interleaved), case.id
    assert len(jobs) == len(statics) <= 110  # cases share their static shapes


def _gpu_inputs(case: GpuCase, slack: int = 3):
    g = torch.Generator().manual_seed(case.rows)
    num_blocks = (case.rows * slack) // case.rows_per_block + 2
    fmt, kv, w, cos, sin, pos, slots, cache = make_inputs(case, GPU, max_position=4096,
                                                          num_blocks=num_blocks, gen=g)
    if case.rows > 2:
        slots[::17] = -1  # a sprinkling of skipped rows
    return fmt, kv, w, cos, sin, pos, slots, cache


def _oracle(case, fmt, kv, w, cos, sin, pos, slots, cache, out_norm, reference_order=False):
    """Loop-reference-equivalent results: the twin (tested bitwise equal to the loop reference) on
    CPU for small shapes, on the GPU for large ones. Where the case's kernel sums the Hadamard on the
    tensor cores (``uses_hadamard_mma``), the twin sums in that order (``hadamard_mma_model``) unless
    ``reference_order``."""
    dev = "cpu" if case.rows <= 4096 else GPU
    t = lambda x: None if x is None else x.to(dev)  # noqa: E731
    c, on = t(cache), t(out_norm)
    mma = not reference_order and uses_hadamard_mma(fmt, case.hadamard, _config(case))
    norm_rope_hadamard_cast_store_torch(t(kv), t(w), 1e-6, t(cos), t(sin), t(pos), t(slots), c, fmt,
                                        rope_dim=case.rope_dim, interleaved=case.interleaved,
                                        hadamard=case.hadamard, out_norm=on,
                                        hadamard_fn=hadamard_mma_model if mma else None)
    return c, on


def _check_cache(label, case, fmt, got, want, slots):
    """The kernel's cache against the oracle's (``_oracle``, in the kernel's Hadamard order): bitwise,
    except where the kernel sums the Hadamard on the tensor cores: the MMA's FP32 accumulation is the
    hardware's own (hadamard_mma_model is exact-then-round), so there the issue's tolerance applies
    (``compare_store``)."""
    want = want.to(got.device)
    if uses_hadamard_mma(fmt, case.hadamard, _config(case)):
        for c in kv_diff.compare_store(got, want, fmt, slots):
            c.check()
    else:
        compare_bitwise(label, got, want).check()


def _check_reference_order(case, fmt, kv, w, cos, sin, pos, slots, cache):
    """Where the kernel sums the Hadamard on the tensor cores: its cache against the reference's order
    under the issue's tolerance (an FP32 sum one ulp apart may flip a rounding: each differing code or
    scale one step off, at most 0.1% of them; unwritten bytes bitwise). Returns the differing bytes."""
    if not uses_hadamard_mma(fmt, case.hadamard, _config(case)):
        return 0
    ref, _ = _oracle(case, fmt, kv, w, cos, sin, pos, slots, torch.full_like(cache, SENTINEL), None,
                     reference_order=True)
    ref = ref.to(cache.device)
    differ = int((cache != ref).sum())
    print(f"{case.id}: {differ} cache bytes differ from the reference's Hadamard order")
    for c in kv_diff.compare_store(cache, ref, fmt, slots):
        c.check()
    return differ


def _store(case, kv, w, cos, sin, pos, slots, cache, fmt, out_norm, eps=1e-6):
    norm_rope_hadamard_cast_store(kv, w, eps, cos, sin, pos, slots, cache, fmt, rope_dim=case.rope_dim,
                                  interleaved=case.interleaved, hadamard=case.hadamard, out_norm=out_norm,
                                  config=_config(case))
    _sync()


@requires_cuda
@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
def test_kernel_vs_reference(case):
    fmt, kv, w, cos, sin, pos, slots, cache = _gpu_inputs(case)
    out_norm = None
    if case.out_norm:
        out_norm = torch.full((case.rows, fmt.dim), 3.0, dtype=torch.bfloat16, device=GPU)
    want_cache, want_norm = _oracle(case, fmt, kv, w, cos, sin, pos, slots, cache.clone(),
                                    None if out_norm is None else out_norm.clone())
    _store(case, kv, w, cos, sin, pos, slots, cache, fmt, out_norm)
    # Bitwise, every case: kernel and reference run the same FP32 operations in the same order (the
    # sum of squares in rms_sum_of_squares' documented order, IEEE sqrt / division, no FMA), so the
    # whole cache (payload, scales, untouched sentinel bytes) and the norm stage are identical.
    # (The tensor-core Hadamard, where on, sums in another order: the oracle follows it, and
    # _check_reference_order holds it to the tolerance against the reference's order.)
    _check_cache("kv_cache", case, fmt, cache, want_cache, slots)
    if out_norm is not None:
        compare_bitwise("out_norm", out_norm, want_norm.to(out_norm.device)).check()
    _check_reference_order(case, fmt, kv, w, cos, sin, pos, slots, cache)
    # determinism: a second launch (the same kernel) into a fresh copy gives the same bytes
    cache2 = torch.full_like(cache, SENTINEL)
    _store(case, kv, w, cos, sin, pos, slots, cache2, fmt,
           None if out_norm is None else torch.empty_like(out_norm))
    compare_bitwise("determinism", cache2, cache).check()


@requires_cuda
@pytest.mark.parametrize("case", CONFIG_CASES, ids=case_id)
def test_kernel_configs(case):
    """Every config stores the oracle's bytes (cache and out_norm; the options change instructions, not
    bytes, except hadamard_mma's order)."""
    fmt, kv, w, cos, sin, pos, slots, cache = _gpu_inputs(case)
    out_norm = torch.full((case.rows, fmt.dim), 3.0, dtype=torch.bfloat16, device=GPU)
    want, want_norm = _oracle(case, fmt, kv, w, cos, sin, pos, slots, cache.clone(), out_norm.clone())
    _store(case, kv, w, cos, sin, pos, slots, cache, fmt, out_norm)
    _check_cache(f"kv_cache rows={case.rows}", case, fmt, cache, want, slots)
    compare_bitwise(f"out_norm rows={case.rows}", out_norm, want_norm.to(out_norm.device)).check()


@requires_cuda
@pytest.mark.parametrize("mixed", [False, True], ids=["randn", "mixed"])
@pytest.mark.parametrize("case", HMMA_CASES, ids=case_id)
def test_kernel_hadamard_mma(case, mixed):
    """The tensor-core Hadamard within the issue's tolerance of the twin in its approximate order
    (hadamard_mma_model: the MMA's 16-term sums exact, rounded once; the H200's accumulator rounds
    otherwise) and of the reference's order; out_norm bitwise. ``mixed``: inputs spread over 24 binades,
    so that many FP32 sums round and the orders part (randn: none)."""
    fmt, kv, w, cos, sin, pos, slots, cache = _gpu_inputs(case)
    if mixed:
        g = torch.Generator().manual_seed(case.rows + 1)
        kv = (kv.float() * torch.exp2(torch.randint(-20, 4, tuple(kv.shape), generator=g).float()
                                      ).to(kv.device)).bfloat16()
    out_norm = None
    if case.out_norm:
        out_norm = torch.full((case.rows, fmt.dim), 3.0, dtype=torch.bfloat16, device=GPU)
    want, want_norm = _oracle(case, fmt, kv, w, cos, sin, pos, slots, cache.clone(),
                              None if out_norm is None else out_norm.clone())
    _store(case, kv, w, cos, sin, pos, slots, cache, fmt, out_norm)
    print(f"hadamard_mma {case.id} mixed={mixed}: {int((cache != want.to(cache.device)).sum())} cache bytes "
          f"differ from the model's order (of {int((slots >= 0).sum()) * fmt.row_bytes} written)")
    _check_reference_order(case, fmt, kv, w, cos, sin, pos, slots, cache)
    _check_cache("kv_cache vs hadamard_mma_model", case, fmt, cache, want, slots)
    if out_norm is not None:
        compare_bitwise("out_norm", out_norm, want_norm.to(out_norm.device)).check()


@requires_cuda
@pytest.mark.parametrize("case", EXACT_CASES, ids=case_id)
def test_kernel_exact_inputs_bitwise(case):
    """|x| = 1 rows, eps = 0, position 0 (cos = 1, sin = 0): every stage is exact, so the kernel must
    match the loop reference bit for bit (cache and out_norm), with the default config and with every
    option on (the tensor-core Hadamard included: exact sums leave no order to differ)."""
    fmt = FORMATS[case.fmt]
    rows, rpb = case.rows, case.rows_per_block
    g = torch.Generator().manual_seed(17)
    kv = torch.where(torch.rand(rows, fmt.dim, generator=g) < 0.5, -1.0, 1.0).bfloat16()
    w = (torch.randn(fmt.dim, generator=g)
         * torch.exp2(torch.randint(-20, 20, (fmt.dim,), generator=g).float())).bfloat16()
    ang = torch.rand(8, 32, generator=g) * 6.3
    cos, sin = torch.cos(ang), torch.sin(ang)
    cos[0], sin[0] = 1.0, 0.0
    pos = torch.zeros(rows, dtype=torch.int64)
    slots = torch.randperm(rows * 2, generator=g)[:rows]
    slots[::7] = -1
    cache = torch.full(((rows * 2) // rpb + 1, fmt.block_bytes(rpb)), SENTINEL, dtype=torch.uint8)
    if case.hadamard:  # 7-bit integers times 2^-1..2^1: every Hadamard sum is a multiple of 1/2 below 2^15,
        # exact in FP32 in any order (asserted below), so the tensor-core order cannot differ either
        w = (torch.randint(-127, 128, (fmt.dim,), generator=g).float()
             * torch.exp2(torch.randint(-1, 2, (fmt.dim,), generator=g).float())).bfloat16()
        sums = (kv.double() * w.double()) @ _hadamard_matrix(fmt.dim).T
        assert torch.equal(sums.float().double(), sums)
    want, want_norm = cache.clone(), torch.zeros(rows, fmt.dim, dtype=torch.bfloat16)
    norm_rope_hadamard_cast_store_ref(kv, w, 0.0, cos, sin, pos, slots, want, fmt,
                                      interleaved=case.interleaved, hadamard=case.hadamard,
                                      out_norm=want_norm)
    got, got_norm = cache.to(GPU), torch.zeros(rows, fmt.dim, dtype=torch.bfloat16, device=GPU)
    dev = [t.to(GPU) for t in (kv, w, cos, sin, pos, slots)]
    _store(case, dev[0], dev[1], dev[2], dev[3], dev[4], dev[5], got, fmt, got_norm, eps=0.0)
    compare_bitwise("kv_cache", got, want).check()
    compare_bitwise("out_norm", got_norm, want_norm).check()


@requires_cuda
def test_kernel_repeated_calls_and_bad_rows(monkeypatch):
    case = REPEAT_CASE
    fmt, kv, w, cos, sin, pos, slots, cache = _gpu_inputs(case)
    want = cache.clone()
    for step in range(3):  # three calls into one cache, disjoint-or-overlapping slot sets
        # positions roll with their slots: the skipped row's out-of-table position stays skipped
        s, p = torch.roll(slots, step * 13), torch.roll(pos, step * 13)
        kvs = (kv.float() * (step + 1)).bfloat16()
        norm_rope_hadamard_cast_store(kvs, w, 1e-6, cos, sin, p, s, cache, fmt)
        want, _ = _oracle(case, fmt, kvs, w, cos, sin, p, s, want, None)
        compare_bitwise(f"kv_cache call {step}", cache, want.to(cache.device)).check()
    # bad slot / position: without the debug switch the kernel skips those rows (no write anywhere)
    monkeypatch.delenv("TILELANG_OPS_DEBUG", raising=False)
    bad_slots = torch.tensor([cache.shape[0] * case.rows_per_block + 5, -1, 3], device=GPU)
    bad_pos = torch.tensor([0, 0, 10**7], device=GPU)
    before = cache.clone()
    norm_rope_hadamard_cast_store(kv[:3], w, 1e-6, cos, sin, bad_pos, bad_slots, cache, fmt)
    compare_bitwise("skipped rows leave the cache alone", cache, before).check()
    monkeypatch.setenv("TILELANG_OPS_DEBUG", "1")
    with pytest.raises(ValueError):
        norm_rope_hadamard_cast_store(kv[:3], w, 1e-6, cos, sin, bad_pos, bad_slots, cache, fmt)
