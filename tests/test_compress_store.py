"""compress_store (SPEC 1.5 main branch): the fused compress -> RMSNorm -> RoPE -> cast -> store.

Comparison rules (SPEC 4), per output:
* loop reference vs twin vs explicit composition: cache bytes, ring and out_norm **bitwise** (the same
  FP32 operations in the same order: reference/compress.py and reference/kv_store.py docstrings);
* chunking / decode invariances: bitwise as well (a row's arithmetic does not depend on how the
  sequence was cut, only where its inputs come from);
* kernel vs reference and vs the two-kernel pipeline (GPU tier): ring, whole cache tensor (stored and
  untouched bytes) and out_norm **bitwise**, for every launch config. Every FP32 operation is the same
  on both sides: the references run on the GPU there, where torch's FP32 exp is the CUDA math
  library's ``expf`` (PyTorch builds without fast math), the function the kernel calls
  (``test_gpu_kernel_expf_is_torch_exp`` checks that on every argument the gated mean can produce);
  the RMS sum of squares follows the fixed order of ``reference.kv_store.rms_sum_of_squares`` on
  both sides; all other steps are IEEE-rounded single operations. (tests/test_compress.py keeps a
  one-ulp allowance for its rows; the expf test above is what lets this file drop it.)
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field

import pytest
import tilelang
import tilelang.language as T
import torch

from metadata.cache_format import FP4_INDEX_KV_FORMAT, FP8_MAIN_KV_FORMAT
from metadata.prepare_tensor_input import SeqMetadata, prepare_tensor_input
from reference.compress import compress_decode_ref, compress_prefill_ref
from reference.compress_store import (
    compress_store_decode_ref,
    compress_store_decode_torch,
    compress_store_prefill_ref,
    compress_store_prefill_torch,
)
from reference.kv_store import apply_rope_ref, norm_rope_hadamard_cast_store_ref
from tests.conftest import case_id, requires_cuda
from tilelang_ops.compress_store import (
    MANY_ROWS,
    CompressStoreConfig,
    _expf,
    compress_store_decode,
    compress_store_decode_kernel,
    compress_store_prefill,
    compress_store_prefill_kernel,
    prefill_config,
    two_kernel_decode,
    two_kernel_prefill,
)
from tilelang_ops.testing import compare_bitwise
from tilelang_ops.testing.compress_store import (
    FORMATS,
    GPU_BLOCK,
    PREFILL_SWEEP,
    SENTINEL,
    D,
    GpuCase,
    batch_meta,
    decode_args,
    gpu_batch,
    make_params,
    prefill_args,
    prefill_batch,
    run_step,
    sequence,
)

BLOCK = 16  # token positions per allocator block: 16 / r compressed rows per cache block


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def new_cache(fmt, num_blocks, r, device="cpu"):
    return torch.full((num_blocks, fmt.block_bytes(BLOCK // r)), SENTINEL, dtype=torch.uint8, device=device)


def seq(q, k, slot, first_block=0):
    """A request with a contiguous block table starting at ``first_block`` (enough for k positions)."""
    blocks = max(1, -(-k // BLOCK))
    return SeqMetadata(q, k, list(range(first_block, first_block + blocks)), slot)


REF = (compress_store_prefill_ref, compress_store_decode_ref)
TWIN = (compress_store_prefill_torch, compress_store_decode_torch)


def composed(x, state, meta, r, p, cache, out_norm=None):
    """compress then store, spelled out with the two operators' own references."""
    k = str(r)
    if meta.is_prefill:
        kv = compress_prefill_ref(x, state, meta.cu_seqlens_q, meta.context_lens, meta.state_block_idx,
                                  meta.cu_compressed[k], r)
    else:
        kv = compress_decode_ref(x, state, meta.context_lens, meta.state_block_idx, meta.max_seqlen_q, r)
    norm_rope_hadamard_cast_store_ref(kv, p.w, p.eps, p.cos, p.sin, meta.compressed_positions[k],
                                      meta.slot_mapping_store_ca[k], cache, p.fmt, rope_dim=p.rope_dim,
                                      interleaved=p.interleaved, out_norm=out_norm)
    return kv


@dataclass(frozen=True)
class BatchCase:
    id: str
    prefill: bool
    fmt: str
    r: int
    ring: int
    seqs: tuple  # (seqlen_q, seqlen_k, state_slot) per request
    interleaved: bool = True
    weight_fp32: bool = False
    extra: dict = field(default_factory=dict, hash=False)


def build_batch(case: BatchCase, gen, device="cpu"):
    """Metadata from the builder (requests in disjoint block ranges), inputs, a random ring, a cache."""
    seqs, first = [], 0
    for q, k, slot in case.seqs:
        s = seq(q, k, slot, first)
        first += len(s.block_table)
        seqs.append(s)
    meta = prepare_tensor_input(seqs, is_prefill=case.prefill, block_size=BLOCK, compress_ratios=(case.r,))
    x = sequence(meta.total_q, gen)
    num_slots = max(slot for *_, slot in case.seqs) + 1
    state = torch.randn(num_slots, case.ring, 2, D, generator=gen) * 3  # garbage must never reach a row
    params = make_params(case.fmt, weight_fp32=case.weight_fp32, interleaved=case.interleaved, gen=gen)
    cache = new_cache(params.fmt, first + 1, case.r)
    return meta.to(device), x.to(device), state.to(device), params.to(device), cache.to(device)


# (seqlen_q, seqlen_k, slot): straddling groups (odd start), nc = 0 chunks, an empty chunk,
# a chunk longer than the ring, non-contiguous slots.
PREFILL_MIX = ((5, 9, 6), (0, 4, 1), (1, 5, 0), (11, 11, 3), (9, 20, 2), (1, 1, 7), (2, 3, 4))
# decode: several tokens per request, groups closing at different offsets of a step
DECODE_MIX = ((3, 10, 2), (1, 5, 0), (6, 17, 4), (2, 2, 1))

CPU_CASES = [
    BatchCase("prefill_fp8", True, "fp8_main", 2, 7, PREFILL_MIX),
    BatchCase("prefill_fp4_half_w32", True, "fp4_main", 2, 7, PREFILL_MIX[:4], interleaved=False,
              weight_fp32=True),
    BatchCase("prefill_bf16_min_ring", True, "bf16", 2, 2, PREFILL_MIX),
    BatchCase("decode_fp8_q6_min_ring", False, "fp8_main", 2, 7, DECODE_MIX),
    BatchCase("decode_fp4", False, "fp4_main", 2, 7, DECODE_MIX[:2]),
    BatchCase("decode_bf16_half", False, "bf16", 2, 8, DECODE_MIX, interleaved=False),
]


# ----------------------------------------------------------------------------------------------
# composition: fused reference == compress ref then store ref == twins
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CPU_CASES, ids=case_id)
def test_reference_is_the_composition_and_twin_matches(case):
    gen = torch.Generator().manual_seed(1)
    meta, x, state0, p, cache0 = build_batch(case, gen)
    rows = meta.num_rows[str(case.r)]
    outs = {}
    for name, fn in (("ref", REF), ("twin", TWIN), ("composed", None)):
        state, cache = state0.clone(), cache0.clone()
        out_norm = torch.full((rows, D), 7.0, dtype=torch.bfloat16)
        if fn is None:
            kv = composed(x, state, meta, case.r, p, cache, out_norm)
        else:
            assert run_step(fn, x, state, meta, case.r, p, cache, out_norm) is None  # returns nothing
        outs[name] = (state, cache, out_norm)
    for name in ("ref", "twin"):
        for what, got, want in zip(("ring", "cache", "out_norm"), outs[name], outs["composed"]):
            compare_bitwise(f"{name} {what}", got, want).check()

    # Rows with slot -1 (placeholders, tokens closing no group) compress to zero and store nothing;
    # their out_norm row is the norm stage of a zero row (zeros for eps > 0).
    slots = meta.slot_mapping_store_ca[str(case.r)].long()
    skipped = slots < 0
    assert bool(skipped.any()) and bool((~skipped).any())  # the case exercises both kinds of rows
    compare_bitwise("skipped kv rows", kv[skipped], torch.zeros_like(kv[skipped])).check()
    _, cache, out_norm = outs["ref"]
    compare_bitwise("skipped out_norm", out_norm[skipped], torch.zeros_like(out_norm[skipped])).check()
    assert_only_slots_written(cache, cache0, slots[~skipped], p.fmt, BLOCK // case.r)


def assert_only_slots_written(cache, before, slots, fmt, rows_per_block):
    """Bytes of every slot not in ``slots`` keep their old value; each stored slot changed somewhere."""
    touched = torch.zeros(cache.shape[0] * rows_per_block, dtype=torch.bool)
    touched[slots] = True
    for s in range(touched.numel()):
        blk, row = divmod(s, rows_per_block)
        seg = slice(row * fmt.row_bytes, (row + 1) * fmt.row_bytes)
        same = torch.equal(cache[blk, seg], before[blk, seg])
        assert same != bool(touched[s]), f"slot {s}: written={not same}, stored={bool(touched[s])}"


def test_stored_rows_follow_the_pipeline():
    """Independent of the composition: BF16 cache rows are RoPE(out_norm) bitwise, and out_norm is the
    float64 gated mean of the right positions, RMS-normalized (within BF16 rounding)."""
    gen = torch.Generator().manual_seed(2)
    r, n = 2, 11
    p = make_params("bf16", weight_fp32=True, gen=gen)
    x = sequence(n, gen)
    state = torch.randn(1, 7, 2, D, generator=gen)
    # first chunk 3 positions (group 1 straddles), then 8 more
    history = x[:3]
    meta = prepare_tensor_input([seq(3, 3, 0)], is_prefill=True, block_size=BLOCK, compress_ratios=(r,))
    run_step(REF, history, state, meta, r, p, new_cache(p.fmt, 2, r))
    meta = prepare_tensor_input([seq(8, n, 0)], is_prefill=True, block_size=BLOCK, compress_ratios=(r,))
    cache = new_cache(p.fmt, 2, r)
    out_norm = torch.empty(meta.num_rows["2"], D, dtype=torch.bfloat16)
    run_step(REF, x[3:], state, meta, r, p, cache, out_norm)
    assert meta.num_rows["2"] == 4  # rows 1..4 (positions 2..9); position 10 waits in the ring
    s, v = x[:, :D].double(), x[:, D:].double()
    for k, j in enumerate(range(1, 5)):
        g = slice(j * r, j * r + r)
        z = (torch.softmax(s[g], 0) * v[g]).sum(0)
        z = z.bfloat16().double()
        y = z / torch.sqrt((z * z).mean() + p.eps) * p.w.double()
        assert torch.allclose(out_norm[k].double(), y, rtol=2**-7, atol=1e-6), j
        slot = int(meta.slot_mapping_store_ca["2"][k])
        blk, row = divmod(slot, BLOCK // r)
        stored = cache[blk, row * 1024:(row + 1) * 1024].view(torch.bfloat16)
        pos = j * r
        want = apply_rope_ref(out_norm[k], p.cos[pos], p.sin[pos], 64, True)
        compare_bitwise(f"row {j}", stored, want).check()
    compare_bitwise("ring p=10", state[0, 10 % 7], x[10].view(2, D)).check()


# ----------------------------------------------------------------------------------------------
# invariances: chunking, prefill vs decode, batch vs separate calls
# ----------------------------------------------------------------------------------------------


def schedule(parts, decode_step, n):
    """(length, is_prefill) steps: the prefill chunks ``parts``, then decode steps of ``decode_step``
    tokens until ``n`` tokens are processed."""
    steps = [(length, True) for length in parts]
    done = sum(parts)
    while decode_step and done < n:
        steps.append((min(decode_step, n - done), False))
        done += steps[-1][0]
    return steps


def process(parts, x, r, ring, p, fn=REF, decode_step=None):
    """Prefill ``parts`` (chunk lengths), then decode steps of ``decode_step`` tokens up to len(x).
    Returns the cache, the ring, and the out_norm rows of completed groups in order."""
    n = x.shape[0]
    state = torch.zeros(1, ring, 2, D)
    cache = new_cache(p.fmt, -(-n // BLOCK) + 1, r)
    norms, e = [], 0
    steps = schedule(parts, decode_step, n)
    for length, is_prefill in steps:
        e += length
        meta = prepare_tensor_input([seq(length, e, 0)], is_prefill=is_prefill, block_size=BLOCK,
                                    compress_ratios=(r,))
        rows = meta.num_rows[str(r)]
        out_norm = torch.empty(rows, D, dtype=torch.bfloat16)
        run_step(fn, x[e - length:e], state, meta, r, p, cache, out_norm)
        norms.append(out_norm[meta.slot_mapping_store_ca[str(r)] >= 0])
    return cache, state, torch.cat(norms)


# The metadata builder mirrors the engine (ratios 1, 2), so every case here is C2.
@pytest.mark.parametrize("r,ring", [(2, 2), (2, 7)], ids=lambda v: str(v))
def test_chunking_invariance(r, ring):
    """Any cut of a sequence into prefill chunks stores the same bytes and leaves the same ring as
    the whole-sequence prefill (bitwise), including nc = 0 chunks and chunks longer than the ring."""
    gen = torch.Generator().manual_seed(3)
    n = 13
    p = make_params("fp8_main", gen=gen)
    x = sequence(n, gen)
    whole = process([n], x, r, ring, p)
    for parts in ([1, 12], [3, 1, 1, 8], [2, 2, 9], [5, 3, 5], [1] * 13):
        got = process(parts, x, r, ring, p, fn=REF if parts == [3, 1, 1, 8] else TWIN)
        for what, a, b in zip(("cache", "ring", "out_norm"), got, whole):
            compare_bitwise(f"{what} parts={parts}", a, b).check()


@pytest.mark.parametrize("step", [1, 2, 3, 6])
def test_decode_and_verification_match_prefill(step):
    """Prefill 5 positions, then decode steps of ``step`` tokens (minimum ring r + step - 1): the same
    cache bytes, ring and norm rows as prefilling everything."""
    gen = torch.Generator().manual_seed(4)
    r, n = 2, 19
    ring = r + step - 1
    p = make_params("fp4_main", gen=gen)
    x = sequence(n, gen)
    whole = process([n], x, r, ring, p, fn=TWIN)
    got = process([5], x, r, ring, p, fn=REF if step == 3 else TWIN, decode_step=step)
    for what, a, b in zip(("cache", "ring", "out_norm"), got, whole):
        compare_bitwise(f"{what} step={step}", a, b).check()


def test_batch_equals_separate_calls():
    """A random request mix in one call == one call per request (cache, ring, out_norm bitwise)."""
    gen = torch.Generator().manual_seed(5)
    r, ring = 2, 7
    mix = []
    for slot in torch.randperm(12, generator=gen).tolist()[:9]:
        k = int(torch.randint(0, 40, (1,), generator=gen))
        q = int(torch.randint(0, k + 1, (1,), generator=gen))
        mix.append((q, k, slot))
    case = BatchCase("mix", True, "fp8_main", r, ring, tuple(mix))
    meta, x, state0, p, cache0 = build_batch(case, gen)
    state, cache = state0.clone(), cache0.clone()
    out_norm = torch.empty(meta.num_rows["2"], D, dtype=torch.bfloat16)
    run_step(TWIN, x, state, meta, r, p, cache, out_norm)
    sep_state, sep_cache, norms = state0.clone(), cache0.clone(), []
    first_block = 0
    for (q, k, slot) in mix:
        s = seq(q, k, slot, first_block)
        first_block += len(s.block_table)
        m = prepare_tensor_input([s], is_prefill=True, block_size=BLOCK, compress_ratios=(r,))
        tok0 = int(meta.cu_seqlens_q[len(norms)])
        on = torch.empty(m.num_rows["2"], D, dtype=torch.bfloat16)
        run_step(TWIN, x[tok0:tok0 + q], sep_state, m, r, p, sep_cache, on)
        norms.append(on)
    compare_bitwise("ring", state, sep_state).check()
    compare_bitwise("cache", cache, sep_cache).check()
    compare_bitwise("out_norm", out_norm, torch.cat(norms)).check()


def test_placeholder_only_batches_write_no_cache_bytes():
    """Huge inputs in chunks that complete no group: the cache keeps its sentinel bytes, out_norm rows
    are zero, and only the ring changes."""
    gen = torch.Generator().manual_seed(6)
    p = make_params("fp8_main", gen=gen)
    for prefill, mix in ((True, ((1, 5, 0), (0, 8, 1), (1, 1, 2))), (False, ((1, 5, 0), (1, 1, 2)))):
        case = BatchCase("ph", prefill, "fp8_main", 2, 7, mix)
        meta, x, state, p, cache = build_batch(case, gen)
        x = x * 1e30
        before, ring_before = cache.clone(), state.clone()
        out_norm = torch.full((meta.num_rows["2"], D), 3.0, dtype=torch.bfloat16)
        run_step(REF, x, state, meta, 2, p, cache, out_norm)
        assert torch.equal(cache, before)
        compare_bitwise("out_norm", out_norm, torch.zeros_like(out_norm)).check()
        assert not torch.equal(state, ring_before)


# ----------------------------------------------------------------------------------------------
# error paths: raised before the ring, the cache or out_norm is written
# ----------------------------------------------------------------------------------------------

ERRORS = {
    "fmt_fp4_index": ValueError, "fmt_type": TypeError, "ratio_3": ValueError, "ratio_1": ValueError,
    "ring_too_small_decode": ValueError, "ring_too_small_prefill": ValueError, "dim_mismatch": ValueError,
    "num_rows_mismatch": ValueError, "positions_shape": ValueError, "slot_shape": ValueError,
    "out_norm_shape": ValueError, "projected_dtype": TypeError, "weight_shape": ValueError,
    "slot_beyond_cache": ValueError, "position_beyond_table": ValueError,
    "cu_compressed_wrong": ValueError, "decode_tokens_not_adjacent": ValueError,
}


def _bad_call(name, fns):
    gen = torch.Generator().manual_seed(7)
    decode = name in ("ring_too_small_decode", "decode_tokens_not_adjacent")
    case = BatchCase("err", not decode, "fp8_main", 2, 6 if name == "ring_too_small_decode" else 7,
                     ((3, 9, 0), (1, 5, 1)) if not decode else ((6, 9, 0), (1, 5, 1)))
    meta, x, state, p, cache = build_batch(case, gen, "cpu")
    rows = meta.num_rows["2"]
    out_norm = torch.full((rows, D), 3.0, dtype=torch.bfloat16)
    args = list(prefill_args(x, state, meta, 2, p, cache) if not decode else
                decode_args(x, state, meta, 2, p, cache))
    kw = dict(out_norm=out_norm)
    if not decode:
        kw["num_rows"] = rows
    # argument positions: prefill (.., ratio 6, w 7, eps 8, cos 9, sin 10, pos 11, slots 12, cache 13, fmt 14)
    if name == "fmt_fp4_index":
        args[14] = FP4_INDEX_KV_FORMAT
    elif name == "fmt_type":
        args[14] = "fp8_main"
    elif name == "ratio_3":
        args[6] = 3
    elif name == "ratio_1":
        args[6] = 1
    elif name == "ring_too_small_decode":  # 6 tokens of one request need S >= 2 + 6 - 1 = 7
        pass
    elif name == "ring_too_small_prefill":
        args[1] = state[:, :1].contiguous()
    elif name == "dim_mismatch":
        args[0] = x[:, :256].contiguous()
        args[1] = state[..., :128].contiguous()
    elif name == "num_rows_mismatch":
        kw["num_rows"] = rows + 1
    elif name == "positions_shape":
        args[11] = args[11][:-1]
    elif name == "slot_shape":
        args[12] = args[12][None]
    elif name == "out_norm_shape":
        kw["out_norm"] = torch.zeros(rows + 1, D, dtype=torch.bfloat16)
    elif name == "projected_dtype":
        args[0] = x.double()
    elif name == "weight_shape":
        args[7] = p.w[:100]
    elif name == "slot_beyond_cache":
        args[12] = args[12].clone()
        args[12][0] = cache.shape[0] * (BLOCK // 2)
    elif name == "position_beyond_table":
        args[11] = args[11].clone()
        args[11][0] = p.cos.shape[0]
    elif name == "cu_compressed_wrong":
        args[5] = torch.tensor([0, 2, 3], dtype=torch.int32)
    elif name == "decode_tokens_not_adjacent":
        args[2] = args[2].flip(0).contiguous()
        args[3] = args[3].flip(0).contiguous()
    else:
        raise AssertionError(name)
    fn = fns[1] if decode else fns[0]
    return fn, args, kw


@pytest.mark.parametrize("name", list(ERRORS))
@pytest.mark.parametrize("impl", ["ref", "twin"])
def test_errors_before_any_write(name, impl):
    """The twin runs every check of the loop reference (value checks included) before it writes."""
    fn, args, kw = _bad_call(name, REF if impl == "ref" else TWIN)
    state, cache, out_norm = args[1], args[13 if fn in (REF[0], TWIN[0]) else 12], kw["out_norm"]
    before = [t.clone() for t in (state, cache, out_norm)]
    with pytest.raises(ERRORS[name]):
        fn(*args, **kw)
    for t, b in zip((state, cache, out_norm), before):
        assert torch.equal(t, b)


# ----------------------------------------------------------------------------------------------
# kernel: host checks on CPU, sm_90a build check (CPU tier)
# ----------------------------------------------------------------------------------------------


def test_kernel_wrappers_check_before_launch():
    """The wrappers run the shared host checks first (no CUDA needed to reach them), then refuse CPU."""
    from tilelang_ops.compress_store import compress_store_decode, compress_store_prefill

    for name, err in (("fmt_fp4_index", ValueError), ("ratio_3", ValueError),
                      ("ring_too_small_decode", ValueError), ("projected_dtype", TypeError)):
        fn, args, kw = _bad_call(name, (compress_store_prefill, compress_store_decode))
        with pytest.raises(err):
            fn(*args, **kw)
    fn, args, kw = _bad_call("num_rows_mismatch", (compress_store_prefill, compress_store_decode))
    kw["num_rows"] -= 1
    before = args[1].clone()
    with pytest.raises(ValueError, match="CUDA"):
        fn(*args, **kw)
    assert torch.equal(args[1], before)


def test_prefill_launch_rule_and_config_checks():
    """The launch rule (rows per warp by launch size) and the wrapper's config check, before the CUDA
    check (so on CPU here)."""
    assert prefill_config(MANY_ROWS).rows_per_warp == 16 and prefill_config(MANY_ROWS - 1).rows_per_warp == 4
    assert prefill_config(1) == CompressStoreConfig(rows_per_warp=4)
    for bad in ({"rows_per_warp": 0}, {"warps": 0}, {"min_ctas": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            CompressStoreConfig(**bad)
    fn, args, kw = _bad_call("num_rows_mismatch", (compress_store_prefill, compress_store_decode))
    kw["num_rows"] -= 1  # a valid prefill call
    with pytest.raises(TypeError, match="CompressStoreConfig"):
        fn(*args, **kw, config=(16, 4, 3))
    with pytest.raises(ValueError, match="CUDA"):
        fn(*args, **kw, config=CompressStoreConfig())


@tilelang.jit
def expf_probe_kernel(threads: int = 256):
    """y[i] = expf(x[i]) through the fused kernels' ``_expf`` (the GPU test that torch's exp and the
    kernels' expf agree bitwise)."""
    n = T.dynamic("n")

    @T.prim_func
    def kernel(
        x: T.Tensor((n,), "float32"),  # [n] fp32
        y: T.Tensor((n,), "float32"),  # [n] fp32, expf(x)
    ):
        with T.Kernel(T.ceildiv(n, threads), threads=threads) as bx:
            tx = T.get_thread_binding()
            if bx * threads + tx < n:
                y[bx * threads + tx] = _expf(x[bx * threads + tx])

    return kernel


@pytest.mark.build
@pytest.mark.parametrize("fmt_name", list(FORMATS))
def test_kernels_build_for_sm90(fmt_name):
    """Prefill and decode for FP8, prefill for FP4, decode for BF16 (the format code is the shared store
    macro, so one kernel per format covers it)."""
    from tilelang_ops.build import compile_for_sm90

    static = (fmt_name, 2, 64, True, True, "bfloat16", "int32", "int64")
    builds = {"fp8_main": [(compress_store_prefill_kernel, static + (prefill_config(1 << 20),)),
                           (compress_store_decode_kernel, static)],
              "fp4_main": [(compress_store_prefill_kernel, static + (prefill_config(1000),))],
              "bf16": [(compress_store_decode_kernel, static)]}[fmt_name]
    if fmt_name == "fp8_main":
        assert "expf(" in compile_for_sm90(expf_probe_kernel).get_kernel_source()  # the GPU expf test's probe
    for factory, args in builds:
        src = compile_for_sm90(factory, *args).get_kernel_source()
        assert "float4" in src, "inputs and ring must move as 16 B vectors"
        assert "expf(" in src and "__expf" not in src, "accurate expf (torch's and the compress kernel's)"
        assert "__fmul_rn" in src and "__fdiv_rn" in src, "gated mean: no FMA contraction, IEEE division"
        assert "(int64_t)" in src, "offsets must be 64-bit (1M tokens x 1024 floats > 2^31)"
        bf16_params = set(re.findall(r"bfloat16_t\* __restrict__ (\w+)", src))
        assert bf16_params == {"out_norm", "weight"}, "the compressed row must not go through global memory"
        assert "out_norm +" in src
        # ring entries: one 32-bit modulo each, never a 64-bit one per vector access
        assert "% ((int64_t)ring)" not in src and "% ring)" in src


@pytest.mark.parametrize("index", [0, 2, 7, 9], ids=["prefill_fp8", "prefill_fp4_half_i64", "decode_fp8",
                                                   "decode_bf16_half"])
def test_cpu_emulator_runs_the_kernels(index):
    """The generated CUDA of the prefill kernel (the launch rule's config) and the decode kernel, run on
    CPU (tools/check_compress_store_emu.py) with the blocks in reverse order: ring, cache and out_norm
    bitwise equal to the twins."""
    from tools import check_compress_store_emu as emu

    case, configs = emu.CASES[index]
    assert configs[0] is None or configs[0] == prefill_config(1)
    mismatches, line = emu.check_case(case, configs[:1], orders=("reverse",))
    assert mismatches == 0, line


def test_cpu_emulator_catches_a_broken_kernel():
    from tools import check_compress_store_emu as emu

    assert emu.mutation_caught("ring_read_entry", 0) and emu.mutation_caught("weight_off_by_1e-4", 0)


# ----------------------------------------------------------------------------------------------
# kernel vs two-kernel pipeline and vs references (GPU tier)
# ----------------------------------------------------------------------------------------------

GPU = "cuda"  # the GPU tests' device
LOOP_REF_MAX_TOKENS = 256  # the loop reference is slow; above this, the twins (bitwise equal, CPU tests)


def _sync():
    if GPU == "cuda":
        torch.cuda.synchronize()


def _fused(config: CompressStoreConfig | None = None):
    """The fused wrappers, prefill with ``config`` (None: the launch rule's)."""
    return functools.partial(compress_store_prefill, config=config), compress_store_decode


TWO_KERNEL = (two_kernel_prefill, two_kernel_decode)


GPU_CASES = [
    GpuCase("p_fp8_b1_len1", True, "fp8_main", 1, 1, 0, 1, max_before=3),
    GpuCase("p_fp8_b7_len9_min_ring", True, "fp8_main", 7, 9, 0, 2, max_before=9),
    GpuCase("p_fp8_b64_len300_ring7", True, "fp8_main", 64, 300, 7, 3),
    GpuCase("p_fp4_b64_len300_half_w32_i64", True, "fp4_main", 64, 300, 7, 4, interleaved=False,
            weight_fp32=True, index64=True),
    GpuCase("p_bf16_b33_len40_min_ring", True, "bf16", 33, 40, 0, 5),
    GpuCase("p_fp8_b1000_len64", True, "fp8_main", 1000, 64, 7, 6, max_before=2000),
    GpuCase("p_fp4_b1000_len3_odd_min_ring", True, "fp4_main", 1000, 3, 0, 7, odd_starts=True),
    GpuCase("p_fp8_b4_len8192_min_ring_odd", True, "fp8_main", 4, 8192, 0, 8, odd_starts=True),
    GpuCase("p_bf16_b16_len4096_no_norm", True, "bf16", 16, 4096, 7, 9, out_norm=False),
    GpuCase("p_fp8_b256_len4096", True, "fp8_main", 256, 4096, 7, 10),
    GpuCase("d_fp8_b1_q1", False, "fp8_main", 1, 1, 0, 11),
    GpuCase("d_fp8_b64_q6_min_ring", False, "fp8_main", 64, 6, 0, 12),
    GpuCase("d_fp4_b64_q6_ring9", False, "fp4_main", 64, 6, 9, 13),
    GpuCase("d_bf16_b33_q3_half", False, "bf16", 33, 3, 0, 14, interleaved=False),
    GpuCase("d_fp8_b1000_q6_min_ring_i64", False, "fp8_main", 1000, 6, 0, 15, index64=True),
    GpuCase("d_fp4_b4096_q1_w32_no_norm", False, "fp4_main", 4096, 1, 0, 16, weight_fp32=True,
            out_norm=False),
    GpuCase("d_fp8_b4096_q6_min_ring", False, "fp8_main", 4096, 6, 0, 17),
]
# Every prefill launch shape of the benchmark's sweep, so that any of them can become the default, on
# request boundaries inside a warp's rows, ring reads and a long odd-start chunk.
SWEEP_CASES = [dataclasses.replace(c, id=f"{c.id}_rpw{k.rows_per_warp}_w{k.warps}_min{k.min_ctas}", config=k)
               for k in PREFILL_SWEEP for c in GPU_CASES
               if c.id in ("p_fp8_b7_len9_min_ring", "p_fp8_b4_len8192_min_ring_odd")]
# the chunk-boundary test: the launch rule's config and the big launches' 16 rows per warp
BOUNDARY_CONFIGS = (None, CompressStoreConfig(rows_per_warp=16))
BIG_PREFILL_OTHER = CompressStoreConfig(rows_per_warp=4)  # the 1M-token test's second launch shape


def _static_keys(case: GpuCase) -> set[tuple]:
    """(function, static args) of the kernel the case's fused call launches."""
    meta, _, _ = batch_meta(case, torch.Generator().manual_seed(case.seed))
    rows = meta.num_rows["2"]
    if rows == 0:
        return set()
    dt = "int64" if case.index64 else "int32"
    static = (case.fmt, 2, 64, case.interleaved, case.out_norm, "float32" if case.weight_fp32 else "bfloat16",
              dt, dt)
    if case.prefill:
        return {("compress_store_prefill_kernel", static + (case.config or prefill_config(rows),))}
    return {("compress_store_decode_kernel", static)}


def gpu_compile_jobs(props) -> list[tuple[str, str, tuple]]:
    """(module, function, static args) of every kernel specialization this file's GPU tests launch (the
    two-kernel pipeline's compress and store kernels compile at first use)."""
    keys = set().union(*(_static_keys(c) for c in GPU_CASES + SWEEP_CASES))
    fp8 = ("fp8_main", 2, 64, True, True, "bfloat16", "int32", "int32")
    # the chunk-boundary test (one request; 120 tokens) and the 1M-token test
    keys |= {("compress_store_prefill_kernel", fp8 + (k or prefill_config(1),)) for k in BOUNDARY_CONFIGS}
    keys |= {("compress_store_decode_kernel", fp8)}
    keys |= {("compress_store_prefill_kernel", fp8 + (k,))
             for k in (prefill_config(1 << 19), BIG_PREFILL_OTHER)}
    jobs = [("tilelang_ops.compress_store", fn, static) for fn, static in sorted(keys, key=repr)]
    return jobs + [("tests.test_compress_store", "expf_probe_kernel", ())]


def test_gpu_compile_jobs_cover_the_cases():
    jobs = gpu_compile_jobs(None)
    statics = {(fn, static) for _, fn, static in jobs}
    for case in GPU_CASES + SWEEP_CASES:
        assert _static_keys(case) <= statics, case.id
    assert any(static and static[-1] == prefill_config(MANY_ROWS) for _, static in statics)  # big launches
    assert len(jobs) <= 40  # cases share their static shapes


def _run_gpu(fns, case, meta, x, state0, p, cache0):
    state, cache = state0.clone(), cache0.clone()
    out_norm = None
    if case.out_norm:
        out_norm = torch.full((meta.num_rows["2"], D), 7.0, dtype=torch.bfloat16, device=state.device)
    run_step(fns, x, state, meta, 2, p, cache, out_norm)
    _sync()
    return state, cache, out_norm


def _reference_fns(meta):
    return REF if meta.total_q <= LOOP_REF_MAX_TOKENS else TWIN


def _check_gpu_case(case):
    meta, x, state0, p, cache0 = gpu_batch(case, GPU)
    got = _run_gpu(_fused(case.config), case, meta, x, state0, p, cache0)
    tag = f"[{case.config or 'launch rule'}]"
    # vs the references (loop, or the twins for big batches; bitwise equal on CPU): ring, the whole
    # cache (stored rows, scales, untouched bytes) and out_norm (placeholder rows included), bitwise
    want = _run_gpu(_reference_fns(meta), case, meta, x, state0, p, cache0)
    for what, a, b in zip(("ring", "cache", "out_norm"), got, want):
        if a is not None:
            compare_bitwise(f"{what} vs reference {tag}", a, b).check()
    # vs our two-kernel pipeline (compress kernel, then store kernel): bitwise as well
    pipe = _run_gpu(TWO_KERNEL, case, meta, x, state0, p, cache0)
    for what, a, b in zip(("ring", "cache", "out_norm"), got, pipe):
        if a is not None:
            compare_bitwise(f"{what} vs two-kernel {tag}", a, b).check()
    if case.out_norm:
        skipped = meta.slot_mapping_store_ca["2"] < 0
        compare_bitwise("skipped out_norm", got[2][skipped], torch.zeros_like(got[2][skipped])).check()
    # deterministic: a second launch from the same state gives the same bytes
    again = _run_gpu(_fused(case.config), case, meta, x, state0, p, cache0)
    for what, a, b in zip(("ring", "cache", "out_norm"), again, got):
        if a is not None:
            compare_bitwise(f"{what} rerun {tag}", a, b).check()


# Ordered so that a run with -x reports the expf check first.


@requires_cuda
def test_gpu_kernel_expf_is_torch_exp():
    """The gated mean's only transcendental: ``expf(d)`` for d = s_t - max(s) <= 0. Every FP32 value in
    [-104, 0] (below -103.97 both give 0), through a TileLang kernel calling ``expf`` exactly as the
    fused kernel does, against torch.exp on the GPU: bitwise."""
    kernel = expf_probe_kernel()
    lo = 0x80000000  # -0.0; bit patterns rise with magnitude for negative floats
    hi = int(torch.tensor(-104.0).view(torch.int32)) & 0xFFFFFFFF
    chunk = 1 << 26
    mismatches, first = 0, None
    for start in range(lo, hi + 1, chunk):
        bits = torch.arange(start, min(start + chunk, hi + 1), dtype=torch.int64, device="cuda")
        d = (bits - (1 << 32)).to(torch.int32).view(torch.float32)
        got = torch.empty_like(d)
        kernel(d, got)
        diff = got.view(torch.int32) != torch.exp(d).view(torch.int32)
        n = int(diff.sum())
        if n and first is None:
            i = int(diff.nonzero()[0])
            first = (float(d[i]), float(got[i]), float(torch.exp(d[i])))
        mismatches += n
    assert mismatches == 0, f"{mismatches} arguments differ; first (d, expf, torch.exp): {first}"


@requires_cuda
@pytest.mark.parametrize("case", SWEEP_CASES, ids=case_id)
def test_gpu_prefill_launch_configs(case):
    """Prefill at every launch shape of the sweep: bitwise as in the other GPU tests."""
    _check_gpu_case(case)


@requires_cuda
def test_gpu_launch_configs_agree_on_1m_tokens():
    """The benchmark's biggest prefill input (256 requests x 4096 tokens at odd starts), with out_norm:
    the launch rule's config (16 rows per warp) and 4 rows per warp store the same bytes (ring, cache,
    out_norm; the references would take too long here)."""
    args, kw, _ = prefill_batch(256, FP8_MAIN_KV_FORMAT, norm=True)
    outs = []
    for config in (None, BIG_PREFILL_OTHER):
        a = list(args)
        a[1], a[13] = args[1].clone(), args[13].clone()  # ring, cache
        k = {**kw, "out_norm": torch.full_like(kw["out_norm"], 7.0)}
        compress_store_prefill(*a, **k, config=config)
        outs.append((a[1], a[13], k["out_norm"]))
    _sync()
    for what, a, b in zip(("ring", "cache", "out_norm"), outs[1], outs[0]):
        compare_bitwise(f"{what} rows_per_warp 4 vs 16", a, b).check()


@requires_cuda
@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
def test_gpu_kernel_matches_pipeline_and_reference(case):
    """The launch rule's kernels on every case: bitwise vs the references and the two-kernel pipeline."""
    _check_gpu_case(case)


@requires_cuda
@pytest.mark.parametrize("ring", [2, 7])
def test_gpu_chunk_boundaries_at_every_offset(ring):
    """One sequence cut into chunks of 1..9 tokens (every start offset, nc = 0 chunks), then decode and
    verification steps: the fused kernels (prefill with the launch rule's config and with 16 rows per
    warp), step by step, leave the cache, ring and norm rows of the whole-sequence prefill (oracle:
    twins on the GPU), bitwise."""
    gen = torch.Generator().manual_seed(21)
    r, n = 2, 120
    p = make_params("fp8_main", max_position=n + 2, gen=gen).to(GPU)
    x = sequence(n, gen).to(GPU)
    whole = process_gpu([n], x, r, ring, p, TWIN)
    parts = [1 + i % 9 for i in range(18)]  # 1 + 2 + ... 9 twice = 90 tokens
    for config in BOUNDARY_CONFIGS:
        for step in sorted({1, ring - r + 1}):  # single tokens, and verification steps at the ring's capacity
            got = process_gpu(parts, x, r, ring, p, _fused(config), decode_step=step)
            for what, a, b in zip(("cache", "ring", "out_norm"), got, whole):
                compare_bitwise(f"{what} step={step} [{config}]", a, b).check()


def process_gpu(parts, x, r, ring, p, fns, decode_step=None):
    """``process`` on the GPU device (state and cache live there)."""
    n = x.shape[0]
    state = torch.zeros(1, ring, 2, D, device=x.device)
    cache = torch.full((-(-n // GPU_BLOCK) + 1, p.fmt.block_bytes(GPU_BLOCK // r)), SENTINEL,
                       dtype=torch.uint8, device=x.device)
    blocks = list(range(cache.shape[0]))
    norms, e = [], 0
    steps = schedule(parts, decode_step, n)
    for length, is_prefill in steps:
        e += length
        meta = prepare_tensor_input([SeqMetadata(length, e, blocks, 0)], is_prefill=is_prefill,
                                    block_size=GPU_BLOCK, compress_ratios=(r,)).to(x.device)
        out_norm = torch.empty(meta.num_rows[str(r)], D, dtype=torch.bfloat16, device=x.device)
        run_step(fns, x[e - length:e], state, meta, r, p, cache, out_norm)
        norms.append(out_norm[meta.slot_mapping_store_ca[str(r)] >= 0])
    _sync()
    return cache, state, torch.cat(norms)
