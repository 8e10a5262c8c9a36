"""compress (SPEC 1.1-1.4): loop references, vectorized twins, and the TileLang kernels.

Comparison rules (SPEC 4):
* state rings and placeholder rows: bitwise (pure copies / zero fills);
* reference vs twin: BF16 rows bitwise as well, both evaluate the same FP32 operations in the same
  order (reference/compress.py docstring);
* kernel vs reference: rows within one BF16 ulp, because the kernel's ``expf`` and torch's exp may
  differ by one FP32 ulp, which can move a BF16 rounding; everything else bitwise.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from metadata.cache_engine import min_ring_size
from reference.compress import (
    compress_decode_ref,
    compress_decode_torch,
    compress_prefill_ref,
    compress_prefill_torch,
    compress_ref,
    gated_mean,
)
from tests.conftest import case_id, requires_cuda
from tilelang_ops.testing import compare_bf16_ulp, compare_bitwise

D_CPU = 64  # small latent width keeps the loop references fast on CPU


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def prefill_metadata(chunks, r, device="cpu"):
    """chunks: [(chunk_len, context_len_after, slot)] -> metadata tensors and the row count."""
    cu_q, cu_c = [0], [0]
    for length, e, _ in chunks:
        s = e - length
        cu_q.append(cu_q[-1] + length)
        cu_c.append(cu_c[-1] + max(1, e // r - s // r))
    i32 = dict(dtype=torch.int32, device=device)
    return SimpleNamespace(
        cu_seqlens_q=torch.tensor(cu_q, **i32),
        context_lens=torch.tensor([e for _, e, _ in chunks], **i32),
        state_block_idx=torch.tensor([slot for _, _, slot in chunks], **i32),
        cu_compressed=torch.tensor(cu_c, **i32),
        num_rows=cu_c[-1],
    )


def run_prefill(fn, x, state, chunks, r, **kw):
    m = prefill_metadata(chunks, r, x.device)
    return fn(x, state, m.cu_seqlens_q, m.context_lens, m.state_block_idx, m.cu_compressed, r, **kw)


def decode_metadata(tokens, device="cpu"):
    """tokens: [(context_len, slot)] per query token."""
    i32 = dict(dtype=torch.int32, device=device)
    return (torch.tensor([c for c, _ in tokens], **i32), torch.tensor([s for _, s in tokens], **i32))


def random_state(slots, ring, dim=D_CPU, device="cpu"):
    # Garbage in never-written ring entries must never reach a row.
    return torch.randn(slots, ring, 2, dim, device=device) * 3


def sequence(n, dim=D_CPU, device="cpu"):
    """Projected inputs of n positions; scores spread wide so softmax weights are far from uniform."""
    x = torch.randn(n, 2 * dim, device=device)
    x[:, :dim] *= 4
    return x


def compositions(n):
    """Every way to cut n positions into consecutive non-empty chunks."""
    for cuts in itertools.product((0, 1), repeat=n - 1):
        parts, run = [], 1
        for c in cuts:
            if c:
                parts.append(run)
                run = 1
            else:
                run += 1
        parts.append(run)
        yield parts


def completed_rows(kv, chunks, r):
    """Drop placeholder rows (nc = 0) of a prefill output."""
    keep, row = [], 0
    for length, e, _ in chunks:
        nc = e // r - (e - length) // r
        keep += range(row, row + nc)
        row += max(1, nc)
    return kv[keep]


def process_in_chunks(fn, x, state, parts, r, slot=0):
    rows, e = [], 0
    for length in parts:
        chunk = [(length, e + length, slot)]
        kv = run_prefill(fn, x[e:e + length], state, chunk, r)
        rows.append(completed_rows(kv, chunk, r))
        e += length
    return torch.cat(rows)


# ----------------------------------------------------------------------------------------------
# gated mean
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("r", [2, 4, 8])
def test_gated_mean_is_per_channel_softmax_weighted_sum(r):
    s, v = torch.randn(r, 256) * 5, torch.randn(r, 256)
    z = gated_mean(list(s), list(v))
    want = (torch.softmax(s.double(), dim=0) * v.double()).sum(0)
    torch.testing.assert_close(z.double(), want, rtol=1e-5, atol=1e-6)
    # equal scores: a plain mean; this is not an unweighted average in general
    torch.testing.assert_close(gated_mean([s[0]] * r, list(v)), v.mean(0), rtol=1e-6, atol=1e-6)
    assert not torch.allclose(z, v.mean(0), atol=1e-3)


def test_gated_mean_is_shift_safe():
    # +100 scores do not overflow (max subtraction); 1e-8 scales give the plain mean
    s, v = torch.randn(2, 64), torch.randn(2, 64)
    z = gated_mean([s[0] + 100, s[1] + 100], list(v))
    assert torch.isfinite(z).all()
    torch.testing.assert_close(z, gated_mean(list(s), list(v)), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gated_mean(list(s * 1e-8), list(v)), v.mean(0), rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# chunked prefill invariants
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("r,max_len,extra_ring", [(2, 8, 0), (2, 8, 3), (2, 9, 1)], ids=lambda v: str(v))
def test_prefill_chunk_partition_invariance(r, max_len, extra_ring):
    """Every way of cutting every sequence of 1..max_len tokens gives the rows and the ring of the
    whole-sequence prefill, bitwise (rows: same FP32 ops; ring: copies)."""
    ring = r + extra_ring  # the prefill minimum and a larger ring
    for n in range(1, max_len + 1):
        x = sequence(n)
        init = random_state(1, ring)
        whole_state = init.clone()
        whole = process_in_chunks(compress_prefill_torch, x, whole_state, [n], r)
        assert whole.shape[0] == n // r
        for parts in compositions(n):
            state = init.clone()
            rows = process_in_chunks(compress_prefill_ref, x, state, parts, r)
            compare_bitwise(f"rows n={n} parts={parts}", rows, whole).check()
            compare_bitwise(f"ring n={n} parts={parts}", state, whole_state).check()


def test_prefill_whole_matches_direct_gated_mean():
    r, n = 2, 13
    x = sequence(n)
    state = random_state(2, 5)
    kv = run_prefill(compress_prefill_ref, x, state, [(n, n, 1)], r)
    s, v = x.chunk(2, -1)
    for j in range(n // r):
        g = range(j * r, j * r + r)
        want = gated_mean([s[p] for p in g], [v[p] for p in g]).to(torch.bfloat16)
        compare_bitwise(f"row {j}", kv[j], want).check()
    # ring keeps the last S positions at p % S
    for p in range(n - 5, n):
        compare_bitwise(f"ring p={p}", state[1, p % 5].flatten(), torch.stack([s[p], v[p]]).flatten()).check()


def test_prefill_placeholder_rows_are_zero():
    r = 2
    x = sequence(2) * 1e30  # huge inputs: a placeholder must not be computed from anything
    state = random_state(3, 4)
    before = state.clone()
    # request 0: position 6 (no group closes); request 1: empty chunk; request 2: position 8
    chunks = [(1, 7, 2), (0, 9, 0), (1, 9, 1)]
    kv = run_prefill(compress_prefill_ref, x, state, chunks, r)
    assert kv.shape == (3, D_CPU)
    compare_bitwise("placeholders", kv, torch.zeros_like(kv)).check()
    compare_bitwise("ring slot 2 p=6", state[2, 2], x[0].view(2, D_CPU)).check()
    compare_bitwise("ring slot 0 untouched", state[0], before[0]).check()
    compare_bitwise("ring slot 1 p=8", state[1, 0], x[1].view(2, D_CPU)).check()


def test_prefill_chunk_longer_than_ring_reads_old_state_first():
    """A group that began before the chunk reads the ring although the chunk overwrites it."""
    r, ring = 2, 2
    x = sequence(20)
    state = random_state(1, ring)
    whole_state = state.clone()
    whole = process_in_chunks(compress_prefill_ref, x, whole_state, [20], r)
    rows = process_in_chunks(compress_prefill_ref, x, state, [3, 17], r)  # group 0 spans the cut
    compare_bitwise("rows", rows, whole).check()
    compare_bitwise("ring", state, whole_state).check()


def test_prefill_multi_request_batch_matches_separate_calls():
    """Non-contiguous slots, odd lengths, an empty request and a placeholder in one batch."""
    r, ring, slots = 2, 7, 9
    # (chunk_len, e, slot)
    chunks = [(5, 9, 7), (0, 4, 3), (1, 3, 0), (11, 11, 5), (6, 20, 2), (1, 1, 8)]
    x = sequence(sum(c[0] for c in chunks))
    init = random_state(slots, ring)
    state = init.clone()
    kv = run_prefill(compress_prefill_ref, x, state, chunks, r)
    sep_state = init.clone()
    off, parts = 0, []
    for c in chunks:
        parts.append(run_prefill(compress_prefill_ref, x[off:off + c[0]], sep_state, [c], r))
        off += c[0]
    compare_bitwise("rows", kv, torch.cat(parts)).check()
    compare_bitwise("ring", state, sep_state).check()


# ----------------------------------------------------------------------------------------------
# prefill vs decode vs verification
# ----------------------------------------------------------------------------------------------


def process_decode(fn, x, state, first_chunk, step, r, slot=0, max_seqlen_q=None):
    """Prefill ``first_chunk`` tokens, then decode steps of ``step`` tokens; returns completed rows."""
    n = x.shape[0]
    rows = [process_in_chunks(compress_prefill_ref, x[:first_chunk], state, [first_chunk], r, slot)]
    p = first_chunk
    while p < n:
        q = min(step, n - p)
        ctx, slots = decode_metadata([(p + i + 1, slot) for i in range(q)])
        kv = fn(x[p:p + q], state, ctx, slots, max_seqlen_q or step, r)
        closes = [i for i in range(q) if (p + i) % r == r - 1]
        others = [i for i in range(q) if i not in closes]
        compare_bitwise("non-closing decode rows", kv[others], torch.zeros_like(kv[others])).check()
        rows.append(kv[closes])
        p += q
    return torch.cat(rows)


@pytest.mark.parametrize("r", [2])
@pytest.mark.parametrize("step", [1, 2, 3, 4, 5, 6])
def test_prefill_decode_and_verification_agree(r, step):
    """The same sequence as prefill, as single-token decode and as verification steps of
    ``step`` tokens gives identical rows and rings, with the minimum ring for the step size."""
    n = 23
    ring = min_ring_size(r, step)
    x = sequence(n)
    init = random_state(2, ring)
    pre_state = init.clone()
    pre = process_in_chunks(compress_prefill_ref, x, pre_state, [n], r)
    for first in (1, 2, r + 1):
        state = init.clone()
        rows = process_decode(compress_decode_ref, x, state, first, step, r)
        compare_bitwise(f"rows first={first}", rows, pre).check()
        compare_bitwise(f"ring first={first}", state, pre_state).check()
        state = init.clone()
        rows = process_decode(compress_decode_torch, x, state, first, step, r)
        compare_bitwise(f"twin rows first={first}", rows, pre).check()
        compare_bitwise(f"twin ring first={first}", state, pre_state).check()


def test_decode_batch_of_requests_with_different_step_sizes():
    r, ring, max_q = 2, 7, 6
    slots = 12
    init = random_state(slots, ring)
    # (slot, context before the step, tokens in the step)
    reqs = [(11, 5, 6), (0, 0, 1), (4, 9, 3), (7, 2, 2), (2, 14, 6)]
    tokens = [(c + i + 1, slot) for slot, c, q in reqs for i in range(q)]
    ctx, sl = decode_metadata(tokens)
    x = sequence(len(tokens))
    st_ref, st_twin = init.clone(), init.clone()
    kv = compress_decode_ref(x, st_ref, ctx, sl, max_q, r)
    compare_bitwise("rows", compress_decode_torch(x, st_twin, ctx, sl, max_q, r), kv).check()
    compare_bitwise("ring", st_twin, st_ref).check()
    # one request per call gives the same
    st_sep, off, parts = init.clone(), 0, []
    for slot, c, q in reqs:
        ctx1, sl1 = decode_metadata([(c + i + 1, slot) for i in range(q)])
        parts.append(compress_decode_ref(x[off:off + q], st_sep, ctx1, sl1, max_q, r))
        off += q
    compare_bitwise("rows vs separate", kv, torch.cat(parts)).check()
    compare_bitwise("ring vs separate", st_ref, st_sep).check()


# ----------------------------------------------------------------------------------------------
# loop reference == vectorized twin on seeded random batches
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RandomBatch:
    id: str
    r: int
    num_reqs: int
    max_len: int
    extra_ring: int
    seed: int


RANDOM_BATCHES = [
    RandomBatch("r2_b6_len9_min", 2, 6, 9, 0, 1),
    RandomBatch("r2_b12_len17_ring7", 2, 12, 17, 5, 2),
    RandomBatch("r2_b8_len13_min", 2, 8, 13, 0, 3),
    RandomBatch("r2_b5_len30_ring11", 2, 5, 30, 9, 4),
    RandomBatch("r2_b4_len40_min", 2, 4, 40, 0, 5),
]


def random_prefill_batch(case: RandomBatch, device="cpu"):
    g = torch.Generator().manual_seed(case.seed)
    slots = torch.randperm(3 * case.num_reqs, generator=g)[:case.num_reqs].tolist()
    chunks = []
    for slot in slots:
        length = int(torch.randint(0, case.max_len + 1, (1,), generator=g))
        before = int(torch.randint(0, 3 * case.r, (1,), generator=g))
        chunks.append((length, before + length, slot))
    ring = case.r + case.extra_ring
    x = sequence(sum(c[0] for c in chunks), device=device)
    return chunks, ring, 3 * case.num_reqs, x


@pytest.mark.parametrize("case", RANDOM_BATCHES, ids=case_id)
def test_prefill_loop_reference_equals_twin(case):
    chunks, ring, slots, x = random_prefill_batch(case)
    init = random_state(slots, ring)
    st_ref, st_twin = init.clone(), init.clone()
    kv = run_prefill(compress_prefill_ref, x, st_ref, chunks, case.r)
    m = prefill_metadata(chunks, case.r)
    for num_rows in (None, m.num_rows):
        st_twin.copy_(init)
        kv_twin = run_prefill(compress_prefill_torch, x, st_twin, chunks, case.r, num_rows=num_rows)
        compare_bitwise("rows", kv_twin, kv).check()
        compare_bitwise("ring", st_twin, st_ref).check()


def test_prefill_accepts_strided_projected_kv():
    r = 2
    chunks = [(5, 7, 1), (4, 4, 0)]
    wide = sequence(9, dim=2 * D_CPU)
    x = wide[:, D_CPU:3 * D_CPU]  # row stride 4D: a view into a wider projection output
    assert not x.is_contiguous()
    init = random_state(2, 3)
    s1, s2 = init.clone(), init.clone()
    kv = run_prefill(compress_prefill_ref, x, s1, chunks, r)
    compare_bitwise("rows", run_prefill(compress_prefill_torch, x.contiguous(), s2, chunks, r), kv).check()
    compare_bitwise("ring", s2, s1).check()


# ----------------------------------------------------------------------------------------------
# dispatch, C1 bypass, engine API
# ----------------------------------------------------------------------------------------------


def test_compress_dispatch_and_c1_bypass():
    r = 2
    chunks = [(5, 9, 1), (3, 3, 0)]
    m = prefill_metadata(chunks, r)
    meta = SimpleNamespace(cu_seqlens_q=m.cu_seqlens_q, context_lens=m.context_lens,
                           state_block_idx=m.state_block_idx, max_seqlen_q=5,
                           cu_compressed={"2": m.cu_compressed})
    x = sequence(8)
    init = random_state(2, 7)
    s1, s2 = init.clone(), init.clone()
    compare_bitwise("prefill", compress_ref(x, s1, meta, 2, True),
                    run_prefill(compress_prefill_ref, x, s2, chunks, r)).check()
    compare_bitwise("prefill ring", s1, s2).check()
    dmeta = SimpleNamespace(context_lens=torch.tensor([10, 4], dtype=torch.int32),
                            state_block_idx=torch.tensor([1, 0], dtype=torch.int32), max_seqlen_q=1)
    xd = sequence(2)
    kv = compress_ref(xd, s1, dmeta, 2, False)
    compare_bitwise("decode", kv, compress_decode_ref(xd, s2, dmeta.context_lens, dmeta.state_block_idx,
                                                      1, 2)).check()
    compare_bitwise("decode ring", s1, s2).check()
    c1 = torch.randn(4, D_CPU).to(torch.bfloat16)
    assert compress_ref(c1, None, meta, 1, True) is c1
    assert compress_ref(c1, None, dmeta, 1, False) is c1
    with pytest.raises(TypeError, match="bfloat16"):
        compress_ref(c1.float(), None, meta, 1, True)


def test_c1_prefill_rows_line_up_with_the_ratio1_metadata():
    """A prefill request with no new token reserves a ratio-1 placeholder row (SPEC 1.2): the C1 rows come
    back in the metadata's layout (one row per token, a zero row for each placeholder), so row i goes
    with slot_mapping_store_ca["1"][i]; without empty requests they are the input itself."""
    from metadata import SeqMetadata, prepare_tensor_input

    seqs = [SeqMetadata(0, 4, [0], 0), SeqMetadata(2, 2, [1], 1), SeqMetadata(0, 3, [2], 2),
            SeqMetadata(0, 3, [3], 3), SeqMetadata(1, 6, [4], 4)]
    meta = prepare_tensor_input(seqs, is_prefill=True, block_size=16, compress_ratios=(1,))
    x = torch.randn(3, D_CPU).to(torch.bfloat16)
    got = compress_ref(x, None, meta, 1, True)
    assert got.shape == (meta.num_rows["1"], D_CPU) == (6, D_CPU)
    zero = torch.zeros(D_CPU, dtype=torch.bfloat16)
    want = torch.stack([zero, x[0], x[1], zero, zero, x[2]])
    compare_bitwise("c1 rows", got, want).check()
    assert meta.slot_mapping_store_ca["1"].tolist() == [-1, 16, 17, -1, -1, 69]
    full = prepare_tensor_input(seqs[1:2] + seqs[4:], is_prefill=True, block_size=16, compress_ratios=(1,))
    assert compress_ref(x, None, full, 1, True) is x


def test_compress_with_builder_metadata():
    """The metadata builder's InputMetadata drives prefill and decode (duck-typed, imported here)."""
    pti = pytest.importorskip("metadata.prepare_tensor_input")
    r, ring = 2, 7
    init = random_state(4, ring)
    # prefill: chunks [3, 9) slot 2, [0, 4) slot 0, [5, 6) slot 3 (a placeholder)
    seqs = [pti.SeqMetadata(6, 9, [0], 2), pti.SeqMetadata(4, 4, [1], 0), pti.SeqMetadata(1, 6, [2], 3)]
    meta = pti.prepare_tensor_input(seqs, is_prefill=True, compress_ratios=(2,))
    x = sequence(11)
    s1, s2 = init.clone(), init.clone()
    kv = compress_ref(x, s1, meta, r, True)
    chunks = [(6, 9, 2), (4, 4, 0), (1, 6, 3)]
    compare_bitwise("prefill", kv, run_prefill(compress_prefill_ref, x, s2, chunks, r)).check()
    compare_bitwise("prefill ring", s1, s2).check()
    # decode: request in slot 2 verifies 3 tokens, slot 0 decodes 1
    seqs = [pti.SeqMetadata(3, 12, [0], 2), pti.SeqMetadata(1, 5, [1], 0)]
    meta = pti.prepare_tensor_input(seqs, is_prefill=False, compress_ratios=(2,))
    xd = sequence(4)
    kv = compress_ref(xd, s1, meta, r, False)
    ctx, sl = decode_metadata([(10, 2), (11, 2), (12, 2), (5, 0)])
    compare_bitwise("decode", kv, compress_decode_ref(xd, s2, ctx, sl, 3, r)).check()
    compare_bitwise("decode ring", s1, s2).check()


@pytest.mark.parametrize("kwargs,match", [
    (dict(compress_ratio=4), "compress_ratio=4"),
    (dict(compress_ratio=3), "compress_ratio=3"),
    (dict(compress_ratio=2, compress_overlap=True), "compress_overlap"),
    (dict(compress_ratio=2, use_ape=True), "use_ape"),
], ids=["r4", "r3", "overlap", "ape"])
def test_compress_engine_api_rejects(kwargs, match):
    m = prefill_metadata([(4, 4, 0)], 2)
    meta = SimpleNamespace(cu_seqlens_q=m.cu_seqlens_q, context_lens=m.context_lens,
                           state_block_idx=m.state_block_idx, max_seqlen_q=4,
                           cu_compressed={"2": m.cu_compressed, "4": m.cu_compressed})
    state = random_state(1, 7)
    before = state.clone()
    r = kwargs.pop("compress_ratio")
    with pytest.raises(ValueError, match=match):
        compress_ref(sequence(4), state, meta, r, True, **kwargs)
    compare_bitwise("state untouched", state, before).check()


# ----------------------------------------------------------------------------------------------
# error paths: raise before anything is written
# ----------------------------------------------------------------------------------------------


def _prefill_args(**over):
    r = over.pop("r", 2)
    chunks = over.pop("chunks", [(5, 9, 1), (3, 3, 0)])
    ring = over.pop("ring", 3)
    m = prefill_metadata(chunks, r)
    args = dict(projected_kv=sequence(sum(c[0] for c in chunks)), state_cache=random_state(2, ring),
                cu_seqlens_q=m.cu_seqlens_q, context_lens=m.context_lens,
                state_block_idx=m.state_block_idx, cu_compressed=m.cu_compressed, compress_ratio=r)
    args.update(over)
    return args


PREFILL_ERRORS = {
    "bf16_input": (TypeError, "projected_kv must have dtype", lambda a: dict(
        projected_kv=a["projected_kv"].to(torch.bfloat16))),
    "odd_width": (ValueError, "2 \\* D", lambda a: dict(projected_kv=a["projected_kv"][:, 1:])),
    "state_fp16": (TypeError, "state_cache must have dtype", lambda a: dict(
        state_cache=a["state_cache"].half())),
    "state_axis2": (ValueError, "axis 2", lambda a: dict(
        state_cache=torch.zeros(2, 3, 3, D_CPU))),
    "state_strided": (ValueError, "contiguous", lambda a: dict(
        state_cache=a["state_cache"].transpose(0, 1))),
    "int64_meta": (TypeError, "context_lens must have dtype", lambda a: dict(
        context_lens=a["context_lens"].long())),
    "cu_compressed_len": (ValueError, "cu_compressed has 2 entries but cu_seqlens_q", lambda a: dict(
        cu_compressed=a["cu_compressed"][:-1])),
    "ratio3": (ValueError, "compress_ratio=3 is not supported", lambda a: dict(compress_ratio=3)),
    "ratio4": (ValueError, "compress_ratio=4 is not supported", lambda a: dict(compress_ratio=4)),
    "ratio1": (ValueError, "compress_ratio=1 keeps no compression state", lambda a: dict(compress_ratio=1)),
    "ratio_float": (TypeError, "must be an int", lambda a: dict(compress_ratio=2.0)),
    "ring_too_small": (ValueError, "needs at least 2", lambda a: dict(state_cache=random_state(2, 1))),
    "device": (ValueError, "share one device", lambda a: dict(
        context_lens=a["context_lens"].to("meta"))),
    "slot_out_of_range": (ValueError, "state_block_idx=2 is outside", lambda a: dict(
        state_block_idx=torch.tensor([2, 0], dtype=torch.int32))),
    "slot_negative": (ValueError, "state_block_idx=-1 is outside", lambda a: dict(
        state_block_idx=torch.tensor([1, -1], dtype=torch.int32))),
    "shared_slot": (ValueError, "share state slot", lambda a: dict(
        state_block_idx=torch.tensor([0, 0], dtype=torch.int32))),
    "context_below_chunk": (ValueError, "below its chunk length", lambda a: dict(
        context_lens=torch.tensor([4, 3], dtype=torch.int32))),
    "cu_seqlens_end": (ValueError, "cu_seqlens_q must rise", lambda a: dict(
        cu_seqlens_q=torch.tensor([0, 5, 7], dtype=torch.int32))),
    "cu_compressed_values": (ValueError, "does not match", lambda a: dict(
        cu_compressed=torch.tensor([0, 3, 5], dtype=torch.int32))),
    "num_rows_mismatch": (ValueError, "num_rows=5", lambda a: dict(num_rows=5)),
    "num_rows_below_reqs": (ValueError, "below num_reqs", lambda a: dict(num_rows=1)),
}


@pytest.mark.parametrize("fn", [compress_prefill_ref, compress_prefill_torch], ids=["ref", "twin"])
@pytest.mark.parametrize("name", list(PREFILL_ERRORS))
def test_prefill_errors_write_nothing(fn, name):
    """The twin runs every check of the loop reference (value checks included) before it writes."""
    exc, match, change = PREFILL_ERRORS[name]
    args = _prefill_args()
    args.update(change(args))
    state = args["state_cache"]
    before = state.clone()
    num_rows = args.pop("num_rows", None)
    with pytest.raises(exc, match=match):
        fn(*args.values(), num_rows=num_rows)
    compare_bitwise("state untouched", state, before).check()


def test_prefill_minimum_ring_and_one_less():
    """S = r is enough for every prefill group; S = r - 1 raises before writing."""
    r = 2
    x = sequence(11)
    for ring in (r, r - 1):
        state = random_state(1, ring)
        before = state.clone()
        if ring < r:
            with pytest.raises(ValueError, match=f"ring of {ring} slots is too small"):
                process_in_chunks(compress_prefill_ref, x, state, [3, 8], r)
            compare_bitwise("state untouched", state, before).check()
        else:
            rows = process_in_chunks(compress_prefill_ref, x, state, [3, 5, 3], r)
            whole = process_in_chunks(compress_prefill_ref, x, random_state(1, 16), [11], r)
            compare_bitwise("rows", rows, whole).check()


@pytest.mark.parametrize("fn", [compress_decode_ref, compress_decode_torch], ids=["ref", "twin"])
@pytest.mark.parametrize("r,q", [(2, 1), (2, 3), (2, 6)])
def test_decode_ring_one_slot_short_raises_before_writing(fn, r, q):
    ring = min_ring_size(r, q) - 1
    state = random_state(1, ring)
    before = state.clone()
    ctx, sl = decode_metadata([(10 + i, 0) for i in range(q)])
    with pytest.raises(ValueError, match=f"compress_ratio={r} with max_seqlen_q={q} needs at least"):
        fn(sequence(q), state, ctx, sl, q, r)
    compare_bitwise("state untouched", state, before).check()


DECODE_ERRORS = {
    "context_zero": ([(0, 0)], 1, "must be >= 1"),
    "slot_out_of_range": ([(4, 3)], 1, "state_block_idx=3 is outside"),
    "slot_negative": ([(4, -1)], 1, "state_block_idx=-1 is outside"),
    "non_consecutive": ([(4, 0), (6, 0)], 2, "must be consecutive"),
    "non_adjacent": ([(4, 0), (4, 1), (5, 0)], 2, "non-adjacent"),
    "too_many_tokens": ([(4, 0), (5, 0), (6, 0)], 2, "more than max_seqlen_q=2"),
}


@pytest.mark.parametrize("fn", [compress_decode_ref, compress_decode_torch], ids=["ref", "twin"])
@pytest.mark.parametrize("name", list(DECODE_ERRORS))
def test_decode_value_errors_write_nothing(fn, name):
    tokens, max_q, match = DECODE_ERRORS[name]
    state = random_state(3, 8)
    before = state.clone()
    ctx, sl = decode_metadata(tokens)
    with pytest.raises(ValueError, match=match):
        fn(sequence(len(tokens)), state, ctx, sl, max_q, 2)
    compare_bitwise("state untouched", state, before).check()


def test_decode_argument_errors():
    state = random_state(2, 8)
    ctx, sl = decode_metadata([(4, 0), (9, 1)])
    x = sequence(2)
    for fn in (compress_decode_ref, compress_decode_torch):
        with pytest.raises(ValueError, match=r"context_lens has 1 entries but projected_kv of shape \(2, "):
            fn(x, state, ctx[:1], sl, 1, 2)
        with pytest.raises(TypeError, match="max_seqlen_q must be an int"):
            fn(x, state, ctx, sl, torch.tensor(1), 2)
        with pytest.raises(ValueError, match="max_seqlen_q=0"):
            fn(x, state, ctx, sl, 0, 2)
        with pytest.raises(TypeError, match="state_block_idx must have dtype"):
            fn(x, state, ctx, sl.long(), 1, 2)


# ----------------------------------------------------------------------------------------------
# kernels: sm_90a build check (CPU tier)
# ----------------------------------------------------------------------------------------------


@pytest.mark.build
@pytest.mark.parametrize("dim,r", [(512, 2), (512, 4), (64, 2), (64, 4)], ids=lambda v: str(v))
def test_kernels_build_for_sm90(dim, r):
    from tilelang_ops.build import compile_for_sm90
    from tilelang_ops.compress import COMPILE_FLAGS, compress_decode_kernel, compress_prefill_kernel

    assert "--fmad=false" in COMPILE_FLAGS  # bitwise FP32 order needs separate multiply and add
    for factory in (compress_prefill_kernel, compress_decode_kernel):
        src = compile_for_sm90(factory, dim, r).get_kernel_source()
        assert "float4" in src, "inputs and ring must move as 16 B vectors"
        assert "expf(" in src and "__expf" not in src, "accurate expf, not the fast approximation"
        assert "(int64_t)" in src, "row offsets must be 64-bit (1M tokens x 1024 floats > 2^31)"


@pytest.mark.parametrize("case_id", ["prefill_r2_d512_chunk_over_ring", "decode_r2_d512_q6_min_ring"])
def test_cpu_emulator_runs_the_kernels(case_id):
    """The generated CUDA of each kernel run on the CPU (tools/check_compress_emu.py, one thread per CUDA
    thread), blocks in reverse order, on a ``make diff`` case: rows within one BF16 ulp of the loop
    reference (the C library's expf against torch's exp), ring bitwise. The prefill case starts a chunk
    inside a group (its first row reads the ring) and is longer than the ring; the decode case has
    six-token steps at the minimum ring."""
    from tools import check_compress_emu as emu

    for comparison in emu.check_case(case_id, orders=("reverse",)):
        comparison.check()


@pytest.mark.parametrize("name", ["prefill_ring_read_of_the_next_slot",
                                  "decode_latent_of_the_other_position"])
def test_cpu_emulator_catches_a_broken_kernel(name):
    from tools import check_compress_emu as emu

    assert emu.mutation_caught(name)


def test_kernel_wrappers_reject_bad_input_on_cpu():
    """Host checks run before any launch, also on a CPU-only machine."""
    from tilelang_ops.compress import compress, compress_decode, compress_prefill

    m = prefill_metadata([(4, 4, 0)], 2)
    x, state = sequence(4), random_state(1, 7)
    before = state.clone()
    with pytest.raises(ValueError, match="CUDA"):
        compress_prefill(x, state, m.cu_seqlens_q, m.context_lens, m.state_block_idx, m.cu_compressed, 2)
    ctx, sl = decode_metadata([(4, 0)])
    with pytest.raises(ValueError, match="needs at least 8"):
        compress_decode(x[:1], state, ctx, sl, 7, 2)
    with pytest.raises(ValueError, match="compress_ratio=4"):
        compress(x, state, SimpleNamespace(), 4, True)
    compare_bitwise("state untouched", state, before).check()


# ----------------------------------------------------------------------------------------------
# kernels vs references (GPU tier)
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuPrefillCase:
    id: str
    r: int
    dim: int
    ring: int
    num_reqs: int
    max_len: int
    seed: int
    odd_only: bool = False


GPU_PREFILL = [
    GpuPrefillCase("r2_d512_b1_len1", 2, 512, 7, 1, 1, 0),
    GpuPrefillCase("r2_d512_b5_all_empty", 2, 512, 7, 5, 0, 9),  # zero tokens, placeholders only
    GpuPrefillCase("r2_d512_b7_len37_ring7", 2, 512, 7, 7, 37, 1),
    GpuPrefillCase("r2_d512_b9_odd_min_ring", 2, 512, 2, 9, 61, 2, odd_only=True),
    GpuPrefillCase("r2_d64_b64_len20_min_ring", 2, 64, 2, 64, 20, 3),
    GpuPrefillCase("r2_d192_b16_len70_ring11", 2, 192, 11, 16, 70, 4),
    GpuPrefillCase("r2_d512_b4_len8192_min_ring", 2, 512, 2, 4, 8192, 5, odd_only=True),
    GpuPrefillCase("r2_d512_b16_len4096_ring7", 2, 512, 7, 16, 4096, 6),
    GpuPrefillCase("r2_d512_b4096_len8", 2, 512, 7, 4096, 8, 7),
    GpuPrefillCase("r2_d512_b300_len300_ring9", 2, 512, 9, 300, 300, 8),
]
# the loop reference is exact but slow: above this many tokens compare against the twin, which
# is bitwise equal to the loop (CPU tests above)
LOOP_REF_MAX_TOKENS = 2048


def gpu_prefill_batch(case: GpuPrefillCase):
    g = torch.Generator().manual_seed(case.seed)
    num_slots = 2 * case.num_reqs + 1
    slots = torch.randperm(num_slots, generator=g)[:case.num_reqs].tolist()
    chunks = []
    for slot in slots:
        length = int(torch.randint(0, case.max_len + 1, (1,), generator=g))
        if case.odd_only:
            length |= 1
        before = int(torch.randint(0, 4 * case.r + 3, (1,), generator=g))
        chunks.append((length, before + length, slot))
    x = sequence(sum(c[0] for c in chunks), case.dim, device="cuda")
    state = random_state(num_slots, case.ring, case.dim, device="cuda")
    return chunks, x, state


@requires_cuda
@pytest.mark.parametrize("case", GPU_PREFILL, ids=case_id)
def test_gpu_prefill_matches_reference(case):
    from tilelang_ops.compress import compress_prefill

    chunks, x, init = gpu_prefill_batch(case)
    ref_fn = compress_prefill_ref if x.shape[0] <= LOOP_REF_MAX_TOKENS else compress_prefill_torch
    st_ref, st = init.clone(), init.clone()
    kv_ref = run_prefill(ref_fn, x, st_ref, chunks, case.r)
    m = prefill_metadata(chunks, case.r, "cuda")
    for num_rows in (m.num_rows, None):
        st.copy_(init)
        kv = run_prefill(compress_prefill, x, st, chunks, case.r, num_rows=num_rows)
        # rows: <= 1 BF16 ulp (expf vs torch exp may differ by one FP32 ulp); ring: bitwise copies
        compare_bf16_ulp("kv", kv, kv_ref, max_ulp=1).check()
        compare_bitwise("state", st, st_ref).check()
    # placeholder rows are exact zeros
    holes = [i for i, n in enumerate(torch.diff(m.cu_compressed).tolist()) if n == 1 and
             chunks[i][1] // case.r == (chunks[i][1] - chunks[i][0]) // case.r]
    rows = m.cu_compressed[holes].long()
    compare_bitwise("placeholders", kv[rows], torch.zeros_like(kv[rows])).check()


@dataclass(frozen=True)
class GpuDecodeCase:
    id: str
    r: int
    dim: int
    num_reqs: int
    max_q: int
    extra_ring: int
    seed: int


GPU_DECODE = [
    GpuDecodeCase("r2_d512_b1_q1_min", 2, 512, 1, 1, 0, 10),
    GpuDecodeCase("r2_d512_b64_q1", 2, 512, 64, 1, 5, 11),
    GpuDecodeCase("r2_d512_b64_q6_min", 2, 512, 64, 6, 0, 12),
    GpuDecodeCase("r2_d512_b4096_q6_min", 2, 512, 4096, 6, 0, 13),
    GpuDecodeCase("r2_d64_b33_q3_ring9", 2, 64, 33, 3, 5, 14),
    GpuDecodeCase("r2_d192_b17_q5_min", 2, 192, 17, 5, 0, 15),
    GpuDecodeCase("r2_d512_b4096_q1", 2, 512, 4096, 1, 0, 16),
]


def gpu_decode_batch(case: GpuDecodeCase):
    g = torch.Generator().manual_seed(case.seed)
    num_slots = 2 * case.num_reqs + 1
    slots = torch.randperm(num_slots, generator=g)[:case.num_reqs].tolist()
    tokens = []
    for slot in slots:
        q = int(torch.randint(1, case.max_q + 1, (1,), generator=g))
        before = int(torch.randint(0, 40, (1,), generator=g))
        tokens += [(before + i + 1, slot) for i in range(q)]
    ring = min_ring_size(case.r, case.max_q) + case.extra_ring
    x = sequence(len(tokens), case.dim, device="cuda")
    state = random_state(num_slots, ring, case.dim, device="cuda")
    ctx, sl = decode_metadata(tokens, "cuda")
    return x, state, ctx, sl


@requires_cuda
@pytest.mark.parametrize("case", GPU_DECODE, ids=case_id)
def test_gpu_decode_matches_reference(case):
    from tilelang_ops.compress import compress_decode

    x, init, ctx, sl = gpu_decode_batch(case)
    ref_fn = compress_decode_ref if x.shape[0] <= LOOP_REF_MAX_TOKENS else compress_decode_torch
    st_ref, st = init.clone(), init.clone()
    kv_ref = ref_fn(x, st_ref, ctx, sl, case.max_q, case.r)
    kv = compress_decode(x, st, ctx, sl, case.max_q, case.r)
    compare_bf16_ulp("kv", kv, kv_ref, max_ulp=1).check()  # expf vs torch exp: one FP32 ulp
    compare_bitwise("state", st, st_ref).check()
    idle = ((ctx - 1) % case.r != case.r - 1).nonzero().flatten()
    compare_bitwise("non-closing rows", kv[idle], torch.zeros_like(kv[idle])).check()


@requires_cuda
@pytest.mark.parametrize("r", [2])
def test_gpu_kernel_chunking_and_decode_invariance(r):
    """Kernel alone: one long prefill == random chunks == prefill + verification steps, bitwise
    (the same kernel arithmetic on the same inputs, whatever the cut; chunks longer than the ring)."""
    from tilelang_ops.compress import compress_decode, compress_prefill

    n, dim, step = 3001, 512, 6
    ring = min_ring_size(r, step)
    x = sequence(n, dim, device="cuda")
    init = random_state(1, ring, dim, device="cuda")
    whole_state = init.clone()
    whole = process_in_chunks(compress_prefill, x, whole_state, [n], r)
    g = torch.Generator().manual_seed(r)
    parts, left = [], n
    while left:
        parts.append(min(left, int(torch.randint(1, 700, (1,), generator=g))))
        left -= parts[-1]
    state = init.clone()
    compare_bitwise("chunked rows", process_in_chunks(compress_prefill, x, state, parts, r), whole).check()
    compare_bitwise("chunked ring", state, whole_state).check()
    state = init.clone()
    rows = [process_in_chunks(compress_prefill, x[:2001], state, [2001], r)]
    p = 2001
    while p < n:
        q = min(1 + (p % step), n - p)
        ctx, sl = decode_metadata([(p + i + 1, 0) for i in range(q)], "cuda")
        kv = compress_decode(x[p:p + q], state, ctx, sl, step, r)
        rows.append(kv[[i for i in range(q) if (p + i) % r == r - 1]])
        p += q
    compare_bitwise("decode rows", torch.cat(rows), whole).check()
    compare_bitwise("decode ring", state, whole_state).check()


@requires_cuda
def test_gpu_deterministic():
    from tilelang_ops.compress import compress_decode, compress_prefill

    case = GPU_PREFILL[6]
    chunks, x, init = gpu_prefill_batch(case)
    outs = []
    for _ in range(2):
        st = init.clone()
        outs.append((run_prefill(compress_prefill, x, st, chunks, case.r), st))
    compare_bitwise("kv", outs[0][0], outs[1][0]).check()
    compare_bitwise("state", outs[0][1], outs[1][1]).check()
    dcase = GPU_DECODE[3]
    x, init, ctx, sl = gpu_decode_batch(dcase)
    outs = []
    for _ in range(2):
        st = init.clone()
        outs.append((compress_decode(x, st, ctx, sl, dcase.max_q, dcase.r), st))
    compare_bitwise("decode kv", outs[0][0], outs[1][0]).check()
    compare_bitwise("decode state", outs[0][1], outs[1][1]).check()


@requires_cuda
def test_gpu_bad_slots_are_skipped_or_raise_under_debug(monkeypatch):
    from tilelang_ops.compress import compress_decode, compress_prefill

    monkeypatch.delenv("TILELANG_OPS_DEBUG", raising=False)
    r, dim = 2, 512
    chunks = [(5, 9, 1), (6, 6, 7), (3, 3, -1)]  # slots 7 and -1 are outside a 2-slot cache
    x = sequence(14, dim, device="cuda")
    init = random_state(2, 7, dim, device="cuda")
    st = init.clone()
    kv = run_prefill(compress_prefill, x, st, chunks, r)
    st_ref = init.clone()
    kv_ref = run_prefill(compress_prefill_ref, x[:5], st_ref, chunks[:1], r)
    compare_bf16_ulp("valid request", kv[:2], kv_ref, max_ulp=1).check()
    compare_bitwise("skipped rows", kv[2:], torch.zeros_like(kv[2:])).check()
    compare_bitwise("state", st, st_ref).check()
    ctx, sl = decode_metadata([(4, 0), (8, 5), (6, -3)], "cuda")
    st = init.clone()
    kv = compress_decode(x[:3], st, ctx, sl, 1, r)
    compare_bitwise("skipped decode rows", kv[1:], torch.zeros_like(kv[1:])).check()
    monkeypatch.setenv("TILELANG_OPS_DEBUG", "1")
    st = init.clone()
    with pytest.raises(ValueError, match="state_block_idx=7 is outside"):
        run_prefill(compress_prefill, x, st, chunks, r)
    with pytest.raises(ValueError, match="state_block_idx=5 is outside"):
        compress_decode(x[:3], st, ctx, sl, 1, r)
    compare_bitwise("state untouched", st, init).check()


@requires_cuda
def test_gpu_wrapper_errors_and_dispatch():
    from tilelang_ops.compress import compress, compress_decode, compress_prefill

    r = 2
    chunks = [(5, 9, 1), (3, 3, 0)]
    m = prefill_metadata(chunks, r, "cuda")
    x = sequence(8, 512, device="cuda")
    state = random_state(2, 7, 512, device="cuda")
    before = state.clone()
    with pytest.raises(ValueError, match="multiple of 64"):
        compress_prefill(sequence(8, 96, device="cuda"), random_state(2, 7, 96, device="cuda"),
                         m.cu_seqlens_q, m.context_lens, m.state_block_idx, m.cu_compressed, r)
    with pytest.raises(ValueError, match="share one device"):
        compress_prefill(x, state, m.cu_seqlens_q.cpu(), m.context_lens, m.state_block_idx,
                         m.cu_compressed, r)
    ctx, sl = decode_metadata([(4, 0), (5, 0)], "cuda")
    with pytest.raises(ValueError, match="needs at least 8"):
        compress_decode(x[:2], state, ctx, sl, 7, r)
    compare_bitwise("state untouched", state, before).check()
    meta = SimpleNamespace(cu_seqlens_q=m.cu_seqlens_q, context_lens=m.context_lens,
                           state_block_idx=m.state_block_idx, max_seqlen_q=5,
                           cu_compressed={"2": m.cu_compressed}, num_rows={"2": m.num_rows})
    s1, s2 = state.clone(), state.clone()
    compare_bf16_ulp("dispatch", compress(x, s1, meta, 2, True),
                     run_prefill(compress_prefill_ref, x, s2, chunks, r), max_ulp=1).check()
    compare_bitwise("dispatch ring", s1, s2).check()
    # a strided projection output is accepted (the wrapper makes it contiguous)
    wide = sequence(8, 1024, device="cuda")[:, 512:1536]
    s1, s2 = state.clone(), state.clone()
    compare_bf16_ulp("strided", run_prefill(compress_prefill, wide, s1, chunks, r),
                     run_prefill(compress_prefill_ref, wide, s2, chunks, r), max_ulp=1).check()
    compare_bitwise("strided ring", s1, s2).check()
    c1 = torch.randn(3, 512, device="cuda").to(torch.bfloat16)
    assert compress(c1, None, meta, 1, False) is c1
    # a ring view that starts 4 bytes into its storage cannot take 16 B vector accesses
    flat = torch.zeros(1 + state.numel(), device="cuda")
    shifted = flat[1:].view(state.shape)
    with pytest.raises(ValueError, match="16-byte aligned"):
        compress_prefill(x, shifted, m.cu_seqlens_q, m.context_lens, m.state_block_idx, m.cu_compressed, r)
    assert not flat.any()

