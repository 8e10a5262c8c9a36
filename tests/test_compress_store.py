"""compress_store (SPEC 1.5 main branch): the fused compress -> RMSNorm -> RoPE -> cast -> store.

Comparison rules (SPEC 4), per output:
* loop reference vs twin vs explicit composition: cache bytes, ring and out_norm **bitwise** (the same
  FP32 operations in the same order: reference/compress.py and reference/kv_store.py docstrings);
* chunking / decode invariances: bitwise as well (a row's arithmetic does not depend on how the
  sequence was cut, only where its inputs come from);
* kernel vs reference and vs the two-kernel pipeline (GPU tier): ring, whole cache tensor (stored and
  untouched bytes) and out_norm **bitwise**, for every kernel variant. Every FP32 operation is the same
  on both sides: the references run on the GPU there, where torch's FP32 exp is the CUDA math
  library's ``expf`` (PyTorch builds without fast math), the function the kernel calls
  (``test_gpu_kernel_expf_is_torch_exp`` checks that on every argument the gated mean can produce);
  the RMS sum of squares follows the fixed order of ``reference.kv_store.rms_sum_of_squares`` on
  both sides; all other steps are IEEE-rounded single operations. (tests/test_compress.py keeps a
  one-ulp allowance for its rows; the expf test above is what lets this file drop it.)
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

import pytest
import torch

from metadata.cache_format import BF16_KV_FORMAT, FP4_INDEX_KV_FORMAT, FP4_MAIN_KV_FORMAT, FP8_MAIN_KV_FORMAT
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
from tilelang_ops.compress_store import V2_PREFILL_SHAPES, VARIANTS
from tilelang_ops.testing import compare_bitwise

SENTINEL = 0xA5
D = 512  # the main-branch formats fix the row width, so the compressed latent is 512 wide
BLOCK = 16  # token positions per allocator block: 16 / r compressed rows per cache block
FORMATS = {f.name: f for f in (FP8_MAIN_KV_FORMAT, FP4_MAIN_KV_FORMAT, BF16_KV_FORMAT)}


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


@dataclass
class Params:
    """The store half's arguments (weights, tables, format) shared by the calls of one test."""

    fmt: object
    w: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    eps: float = 1e-6
    interleaved: bool = True
    rope_dim: int = 64

    def to(self, device):
        return Params(self.fmt, self.w.to(device), self.cos.to(device), self.sin.to(device), self.eps,
                      self.interleaved, self.rope_dim)


def make_params(fmt_name="fp8_main", *, max_position=4096, weight_fp32=False, interleaved=True, gen=None):
    w = torch.rand(D, generator=gen) * 1.5 + 0.25
    ang = torch.rand(max_position, 32, generator=gen) * 6.3
    return Params(FORMATS[fmt_name], w if weight_fp32 else w.bfloat16(), torch.cos(ang), torch.sin(ang),
                  interleaved=interleaved)


def sequence(n, gen=None, scale=1.0):
    """Projected inputs of n positions; scores spread wide so softmax weights are far from uniform."""
    x = torch.randn(n, 2 * D, generator=gen) * scale
    x[:, :D] *= 4
    return x


def new_cache(fmt, num_blocks, r, device="cpu"):
    return torch.full((num_blocks, fmt.block_bytes(BLOCK // r)), SENTINEL, dtype=torch.uint8, device=device)


def seq(q, k, slot, first_block=0):
    """A request with a contiguous block table starting at ``first_block`` (enough for k positions)."""
    blocks = max(1, -(-k // BLOCK))
    return SeqMetadata(q, k, list(range(first_block, first_block + blocks)), slot)


def prefill_args(x, state, meta, r, p: Params, cache):
    k = str(r)
    return (x, state, meta.cu_seqlens_q, meta.context_lens, meta.state_block_idx, meta.cu_compressed[k], r,
            p.w, p.eps, p.cos, p.sin, meta.compressed_positions[k], meta.slot_mapping_store_ca[k], cache,
            p.fmt)


def decode_args(x, state, meta, r, p: Params, cache):
    k = str(r)
    return (x, state, meta.context_lens, meta.state_block_idx, meta.max_seqlen_q, r, p.w, p.eps, p.cos,
            p.sin, meta.compressed_positions[k], meta.slot_mapping_store_ca[k], cache, p.fmt)


def run_step(fn, x, state, meta, r, p, cache, out_norm=None):
    """One prefill or decode call of a fused function (``fn`` = (prefill_fn, decode_fn))."""
    kw = dict(out_norm=out_norm, rope_dim=p.rope_dim, interleaved=p.interleaved)
    if meta.is_prefill:
        fn[0](*prefill_args(x, state, meta, r, p, cache), num_rows=meta.num_rows[str(r)], **kw)
    else:
        fn[1](*decode_args(x, state, meta, r, p, cache), **kw)


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


def test_kernel_variants_per_operation():
    """Prefill has v1 / v2, decode v1 / v3 (the other two were removed): a variant the operation does not
    have is a ValueError naming the allowed ones, raised before the CUDA check (so on CPU here)."""
    from tilelang_ops.compress_store import VARIANT, _variant, compress_store_decode, compress_store_prefill

    assert VARIANTS == {"prefill": ("v1", "v2"), "decode": ("v1", "v3")}
    for op, names in VARIANTS.items():
        assert VARIANT[op] in names and _variant(None, op) == VARIANT[op]
        assert [_variant(v, op) for v in names] == list(names)
    fns = (compress_store_prefill, compress_store_decode)
    fn, args, kw = _bad_call("num_rows_mismatch", fns)
    kw["num_rows"] -= 1  # a valid prefill call
    for bad in ("v3", "v4"):
        with pytest.raises(ValueError, match=r"prefill: variant must be one of \('v1', 'v2'\)"):
            fn(*args, **kw, variant=bad)
    with pytest.raises(ValueError, match="CUDA"):  # v1 gets past the variant check
        fn(*args, **kw, variant="v1")
    fn, args, kw = _bad_call("decode_tokens_not_adjacent", fns)
    args[2], args[3] = args[2].flip(0).contiguous(), args[3].flip(0).contiguous()  # adjacent again
    with pytest.raises(ValueError, match=r"decode: variant must be one of \('v1', 'v3'\)"):
        fn(*args, **kw, variant="v2")
    with pytest.raises(ValueError, match="CUDA"):
        fn(*args, **kw, variant="v3")


@pytest.mark.build
@pytest.mark.parametrize("fmt_name", list(FORMATS))
def test_kernels_build_for_sm90(fmt_name):
    """Every variant's prefill and decode for FP8; v2 prefill for FP4, v3 decode for BF16 (the format code
    is the shared store macro, so one kernel per format covers it; ~4 s per kernel)."""
    from tilelang_ops.build import compile_for_sm90
    from tilelang_ops.compress_store import (
        compress_store_decode_kernel,
        compress_store_decode_kernel_v3,
        compress_store_prefill_kernel,
        compress_store_prefill_kernel_v2,
    )

    factories = {"fp8_main": [compress_store_prefill_kernel_v2, compress_store_decode_kernel_v3],
                 "fp4_main": [compress_store_prefill_kernel_v2],
                 "bf16": [compress_store_decode_kernel_v3]}[fmt_name]
    if fmt_name == "fp8_main":
        from tilelang_ops.compress_store import expf_probe_kernel

        factories += [compress_store_prefill_kernel, compress_store_decode_kernel]
        assert "expf(" in compile_for_sm90(expf_probe_kernel).get_kernel_source()  # the GPU expf test's probe
    for factory in factories:
        src = compile_for_sm90(factory, fmt_name, 2, 64, True, True, "bfloat16", "int32", "int64") \
            .get_kernel_source()
        assert "float4" in src, "inputs and ring must move as 16 B vectors"
        assert "expf(" in src and "__expf" not in src, "accurate expf (torch's and the compress kernel's)"
        assert "__fmul_rn" in src and "__fdiv_rn" in src, "gated mean: no FMA contraction, IEEE division"
        assert "(int64_t)" in src, "offsets must be 64-bit (1M tokens x 1024 floats > 2^31)"
        bf16_params = set(re.findall(r"bfloat16_t\* __restrict__ (\w+)", src))
        assert bf16_params == {"out_norm", "weight"}, "the compressed row must not go through global memory"
        assert "out_norm +" in src
        if factory in (compress_store_prefill_kernel_v2, compress_store_decode_kernel_v3):
            # ring entries: one 32-bit modulo each, never a 64-bit one per vector access
            assert "% ((int64_t)ring)" not in src and "% ring)" in src


# ----------------------------------------------------------------------------------------------
# kernel vs two-kernel pipeline and vs references (GPU tier)
# ----------------------------------------------------------------------------------------------

GPU = "cuda"  # the GPU tests' device (a dry run of their plumbing can point it at "cpu")
GPU_BLOCK = 128  # the engine's block size: 64 C2 rows per cache block
LOOP_REF_MAX_TOKENS = 256  # the loop reference is slow; above this, the twins (bitwise equal, CPU tests)


def _sync():
    if GPU == "cuda":
        torch.cuda.synchronize()


def _fused(variant=None):
    """The fused wrappers, pinned to ``variant`` (None: the module's defaults, ``VARIANT``): a name for
    both operations (only the operation that has it may be called) or a (prefill, decode) pair."""
    from tilelang_ops.compress_store import compress_store_decode, compress_store_prefill

    if variant is None:
        return compress_store_prefill, compress_store_decode
    pv, dv = (variant, variant) if isinstance(variant, str) else variant
    return (functools.partial(compress_store_prefill, variant=pv),
            functools.partial(compress_store_decode, variant=dv))


def _two_kernel():
    from tilelang_ops.compress_store import two_kernel_decode, two_kernel_prefill

    return two_kernel_prefill, two_kernel_decode


@dataclass(frozen=True)
class GpuCase:
    id: str
    prefill: bool
    fmt: str
    num_reqs: int
    max_len: int  # prefill: chunk of 0..max_len tokens; decode: 1..max_len tokens per request
    ring: int  # 0: the minimum (prefill r, decode r + max_len - 1)
    seed: int
    max_before: int = 300  # context before the step: 0..max_before positions
    odd_starts: bool = False  # every chunk starts at an odd position (its first group reads the ring)
    interleaved: bool = True
    weight_fp32: bool = False
    index64: bool = False
    out_norm: bool = True


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


def gpu_batch(case: GpuCase):
    """Builder metadata for a random request mix: shuffled state slots and physical blocks."""
    g = torch.Generator().manual_seed(case.seed)
    r = 2
    num_slots = 2 * case.num_reqs + 1
    slots = torch.randperm(num_slots, generator=g)[:case.num_reqs].tolist()
    shape = []
    for _ in slots:
        before = int(torch.randint(0, case.max_before + 1, (1,), generator=g))
        before = before | 1 if case.odd_starts else before
        q = int(torch.randint(0 if case.prefill else 1, case.max_len + 1, (1,), generator=g))
        shape.append((q, before + q))
    blocks_needed = [max(1, -(-k // GPU_BLOCK)) for _, k in shape]
    physical = torch.randperm(sum(blocks_needed) + 3, generator=g).tolist()
    seqs, used = [], 0
    for (q, k), slot, nb in zip(shape, slots, blocks_needed):
        seqs.append(SeqMetadata(q, k, physical[used:used + nb], slot))
        used += nb
    meta = prepare_tensor_input(seqs, is_prefill=case.prefill, block_size=GPU_BLOCK, compress_ratios=(r,))
    if case.index64:
        for d in (meta.compressed_positions, meta.slot_mapping_store_ca):
            d["2"] = d["2"].long()
    ring = case.ring or (r if case.prefill else r + case.max_len - 1)
    x = sequence(meta.total_q, g)
    state = torch.randn(num_slots, ring, 2, D, generator=g) * 3
    p = make_params(case.fmt, max_position=meta.max_seqlen_k + 2, weight_fp32=case.weight_fp32,
                    interleaved=case.interleaved, gen=g)
    cache = torch.full((len(physical), p.fmt.block_bytes(GPU_BLOCK // r)), SENTINEL, dtype=torch.uint8)
    return meta.to(GPU), x.to(GPU), state.to(GPU), p.to(GPU), cache.to(GPU)


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


def _check_gpu_case(case, variant=None):
    meta, x, state0, p, cache0 = gpu_batch(case)
    got = _run_gpu(_fused(variant), case, meta, x, state0, p, cache0)
    tag = f"[{variant or 'default'}]"
    # vs the references (loop, or the twins for big batches; bitwise equal on CPU): ring, the whole
    # cache (stored rows, scales, untouched bytes) and out_norm (placeholder rows included), bitwise
    want = _run_gpu(_reference_fns(meta), case, meta, x, state0, p, cache0)
    for what, a, b in zip(("ring", "cache", "out_norm"), got, want):
        if a is not None:
            compare_bitwise(f"{what} vs reference {tag}", a, b).check()
    # vs our two-kernel pipeline (compress kernel, then store kernel): bitwise as well
    pipe = _run_gpu(_two_kernel(), case, meta, x, state0, p, cache0)
    for what, a, b in zip(("ring", "cache", "out_norm"), got, pipe):
        if a is not None:
            compare_bitwise(f"{what} vs two-kernel {tag}", a, b).check()
    if case.out_norm:
        skipped = meta.slot_mapping_store_ca["2"] < 0
        compare_bitwise("skipped out_norm", got[2][skipped], torch.zeros_like(got[2][skipped])).check()
    # deterministic: a second launch from the same state gives the same bytes
    again = _run_gpu(_fused(variant), case, meta, x, state0, p, cache0)
    for what, a, b in zip(("ring", "cache", "out_norm"), again, got):
        if a is not None:
            compare_bitwise(f"{what} rerun {tag}", a, b).check()


# Ordered so that a run with -x still reports what each variant does: expf first, then each variant
# on its own, then the default on every case.


@requires_cuda
def test_gpu_kernel_expf_is_torch_exp():
    """The gated mean's only transcendental: ``expf(d)`` for d = s_t - max(s) <= 0. Every FP32 value in
    [-104, 0] (below -103.97 both give 0), through a TileLang kernel calling ``expf`` exactly as the
    fused kernel does, against torch.exp on the GPU: bitwise."""
    from tilelang_ops.compress_store import expf_probe_kernel

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


# Each variant of the case's operation on its own (prefill v1 / v2, decode v1 / v3; a failure names the
# variant: the lead flips ``VARIANT`` back to v1 if only the default fails). Prefill with ring reads,
# straddling groups, nc = 0 chunks, long chunks, request boundaries inside a warp's rows, int64
# metadata; decode q1 / q6 at the minimum ring.
VARIANT_CASE_IDS = ("p_fp8_b7_len9_min_ring", "p_fp4_b64_len300_half_w32_i64",
                    "p_fp4_b1000_len3_odd_min_ring", "p_fp8_b4_len8192_min_ring_odd",
                    "p_bf16_b16_len4096_no_norm", "d_fp8_b1_q1", "d_fp8_b64_q6_min_ring",
                    "d_bf16_b33_q3_half", "d_fp4_b4096_q1_w32_no_norm")


VARIANT_PARAMS = [pytest.param(c, v, id=f"{c.id}-{v}") for c in GPU_CASES if c.id in VARIANT_CASE_IDS
                  for v in VARIANTS["prefill" if c.prefill else "decode"]]


@requires_cuda
@pytest.mark.parametrize("case, variant", VARIANT_PARAMS)
def test_gpu_each_variant_exact(case, variant):
    _check_gpu_case(case, variant)


@requires_cuda
@pytest.mark.parametrize("shape", V2_PREFILL_SHAPES, ids=lambda s: "rpw{}_w{}_min{}".format(*s))
def test_gpu_prefill_v2_launch_shapes(shape, monkeypatch):
    """v2 prefill at every candidate launch shape (``V2_PREFILL_SHAPES``, the benchmark's sweep: rows per
    warp, warps per CTA, min CTAs per SM), so that any of them can become the default: bitwise as in the
    other GPU tests, on request boundaries inside a warp's rows, ring reads and a long odd-start chunk."""
    import tilelang_ops.compress_store as cs

    rpw, warps, min_ctas = shape
    monkeypatch.setattr(cs, "V2_ROWS_PER_WARP", rpw)
    monkeypatch.setattr(cs, "V2_ROWS_PER_WARP_SMALL", rpw)  # these cases are below V2_MANY_ROWS rows
    monkeypatch.setattr(cs, "V2_WARPS", warps)
    monkeypatch.setattr(cs, "V2_MIN_CTAS_PER_SM", min_ctas)
    cases = [c for c in GPU_CASES if c.id in ("p_fp8_b7_len9_min_ring", "p_fp8_b4_len8192_min_ring_odd")]
    assert len(cases) == 2, [c.id for c in cases]
    for case in cases:
        _check_gpu_case(case, "v2")


@requires_cuda
def test_gpu_variants_agree_on_1m_tokens():
    """The benchmark's biggest prefill input (256 requests x 4096 tokens at odd starts, built on the
    GPU by the benchmark's own builder; V2_ROWS_PER_WARP rows per warp in v2), with out_norm: v2 == v1
    bitwise (ring, cache, out_norm). The references would take too long here; v1 is the
    GPU-verified baseline."""
    from benchmarks.bench_compress_store import _prefill

    args, kw, _ = _prefill(256, FP8_MAIN_KV_FORMAT, norm=True)
    outs = []
    for variant in ("v1", "v2"):
        a = list(args)
        a[1], a[13] = args[1].clone(), args[13].clone()  # ring, cache
        k = {**kw, "out_norm": torch.full_like(kw["out_norm"], 7.0)}
        _fused(variant)[0](*a, **k)
        outs.append((a[1], a[13], k["out_norm"]))
    _sync()
    for what, a, b in zip(("ring", "cache", "out_norm"), outs[1], outs[0]):
        compare_bitwise(f"{what} v2 vs v1", a, b).check()


@requires_cuda
@pytest.mark.parametrize("case", GPU_CASES, ids=case_id)
def test_gpu_kernel_matches_pipeline_and_reference(case):
    """The default variant on every case: bitwise vs the references and the two-kernel pipeline."""
    _check_gpu_case(case)


@requires_cuda
@pytest.mark.parametrize("ring", [2, 7])
def test_gpu_chunk_boundaries_at_every_offset(ring):
    """One sequence cut into chunks of 1..9 tokens (every start offset, nc = 0 chunks), then decode and
    verification steps: the fused kernel (v1 throughout, then prefill v2 with decode v3), step by step,
    leaves the cache, ring and norm rows of the whole-sequence prefill (oracle: twins on the GPU),
    bitwise."""
    gen = torch.Generator().manual_seed(21)
    r, n = 2, 120
    p = make_params("fp8_main", max_position=n + 2, gen=gen).to(GPU)
    x = sequence(n, gen).to(GPU)
    whole = process_gpu([n], x, r, ring, p, TWIN)
    parts = [1 + i % 9 for i in range(18)]  # 1 + 2 + ... 9 twice = 90 tokens
    for variant in (("v1", "v1"), ("v2", "v3")):
        for step in sorted({1, ring - r + 1}):  # single tokens, and verification steps at the ring's capacity
            got = process_gpu(parts, x, r, ring, p, _fused(variant), decode_step=step)
            for what, a, b in zip(("cache", "ring", "out_norm"), got, whole):
                compare_bitwise(f"{what} step={step} [{'/'.join(variant)}]", a, b).check()


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
