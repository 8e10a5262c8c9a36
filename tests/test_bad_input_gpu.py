"""GPU tier of issue 36: every kernel on bad metadata, without TILELANG_OPS_DEBUG (no device-value checks),
never changes a byte outside the rows its metadata validly addresses.

Bad metadata per kernel: slots beyond the cache and positions beyond the cos/sin tables (kv_store,
compress_store), state_block_idx beyond the ring or negative and chunks beyond the tokens (compress,
compress_store), ``end`` beyond the row or negative (topk, block_max_scores, topk_to_slots), block tables
too short or unallocated (topk_to_slots, convert_kv_index_), compact indices beyond the candidates
(restore_candidate_indices_).

How "no byte outside" is checked:
* every tensor a kernel writes in place (ring, cache, out_norm, index) lies inside a larger buffer of
  canary bytes (``tilelang_ops.testing.bad_input.guarded``); the canaries must survive;
* the whole written tensor is compared with the expected one: the reference run on the same batch with
  the bad rows turned into skipped rows (slot -1) and a bad request moved to a spare ring slot, whose
  bytes are then put back: so rows with bad metadata must keep their old bytes, the others must be right;
* tensors a kernel reads are laid out with canaries behind them that would show up in the result if
  read (scores rows followed by +inf / NaN, block tables followed by block ids that give other slots).

Comparisons: cache bytes, rings, slots and indices bitwise; top-k values bitwise (copies of scores);
compress rows within one BF16 ulp (the kernel's expf vs torch's exp, tests/test_compress.py), compress_store
rows bitwise (tests/test_compress_store.py: the references on the GPU use the same expf).

These tests call the public wrappers only. Kernels they launch (for the warm-up list): compress prefill and
decode (D = 64, r = 2); norm_rope_hadamard_cast_store for the four formats (12 rows, int64 positions and
slots, BF16 weight, out_norm, no Hadamard); compress_store prefill and decode (FP8 main, int32 metadata,
out_norm); topk (fp32, int32, end, values, n = 40 and 20000), block_max_scores (block 8), topk_to_slots
(Bc 8, with and without 8-row candidates), restore_candidate_indices_ (block 8), convert_kv_index_ (Bc 4),
paged / ragged index logits (the torch-ops cases' shapes, tilelang_ops.testing.torch_ops).
"""

from __future__ import annotations

import re

import pytest
import torch

from metadata.cache_format import BF16_KV_FORMAT, FP4_INDEX_KV_FORMAT, FP4_MAIN_KV_FORMAT, FP8_MAIN_KV_FORMAT
from reference.compress import compress_decode_torch, compress_prefill_torch
from reference.compress_store import compress_store_decode_torch, compress_store_prefill_torch
from reference.kv_store import norm_rope_hadamard_cast_store_torch
from reference.topk import block_max_scores_ref, topk_torch
from tests.conftest import requires_cuda
from tilelang_ops.testing import bad_input as B
from tilelang_ops.testing import compare_bf16_ulp, compare_bitwise
from tilelang_ops.testing.torch_ops import OP_CASES

DEV = "cuda"
INT32_MAX = 2**31 - 1


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("TILELANG_OPS_DEBUG", raising=False)


def guard_written(call: B.Call) -> tuple[B.Call, dict]:
    """``call`` with each tensor it writes moved inside a canary buffer; returns (call, guards)."""
    guards = {n: B.guarded(t) for n, t in call.written().items()}
    return call.with_(**{n: g.view for n, g in guards.items()}), guards


def check_guards(guards: dict) -> None:
    broken = [n for n, g in guards.items() if not g.guards_intact()]
    assert not broken, f"bytes written outside {broken}"


def skip_rows(slots: torch.Tensor, rows) -> torch.Tensor:
    out = slots.clone()
    out[list(rows)] = -1
    return out


# ----------------------------------------------------------------------------------------------
# kv_store: slots beyond the cache, positions beyond the tables
# ----------------------------------------------------------------------------------------------

STORE_FORMATS = (FP8_MAIN_KV_FORMAT, FP4_MAIN_KV_FORMAT, FP4_INDEX_KV_FORMAT, BF16_KV_FORMAT)


def bad_store_metadata(call: B.Call, num_slots: int):
    """Rows 0, 1, 3: slots at, past and far past the cache; rows 4, 5, 6: positions at the table end,
    negative and far past it (row 2 is a legal skip, slot -1). Returns (slots, positions, bad rows)."""
    slots, pos = call["slot_mapping"].clone(), call["positions"].clone()
    slots[0], slots[1], slots[3] = num_slots, num_slots + 1000, 1 << 40
    pos[4], pos[5], pos[6] = call["cos"].shape[0], -1, 1 << 40
    return slots, pos, (0, 1, 3, 4, 5, 6)


@requires_cuda
@pytest.mark.parametrize("fmt", STORE_FORMATS, ids=lambda f: f.name)
def test_store_skips_rows_with_bad_metadata(fmt):
    from tilelang_ops.kv_store import norm_rope_hadamard_cast_store

    call = B.store_call(DEV, fmt=fmt, rows=12, rows_per_block=4, blocks=6)
    slots, pos, bad = bad_store_metadata(call, 6 * 4)
    call = call.with_(slot_mapping=slots, positions=pos)
    # the reference stores the same batch with the bad rows skipped (slot -1; their position is then unread)
    want = call.fresh().with_(slot_mapping=skip_rows(slots, bad), positions=torch.where(
        torch.isin(torch.arange(12, device=DEV), torch.tensor(bad, device=DEV)), 0, pos))
    want(norm_rope_hadamard_cast_store_torch)
    got, guards = guard_written(call)
    got(norm_rope_hadamard_cast_store)
    torch.cuda.synchronize()
    check_guards(guards)
    # the whole cache bitwise: valid rows stored exactly (no Hadamard: one FP32 order), the rows of bad
    # slots / positions and every other slot keep their sentinel bytes
    compare_bitwise("kv_cache", got["kv_cache"], want["kv_cache"]).check()
    good = [i for i in range(12) if i not in bad]
    compare_bitwise("out_norm (rows with good metadata)", got["out_norm"][good],
                    want["out_norm"][good]).check()


# ----------------------------------------------------------------------------------------------
# compress_store: bad slots, positions, state slots
# ----------------------------------------------------------------------------------------------

CS = {"prefill": (B.compress_store_prefill_call, compress_store_prefill_torch, 3),
      "decode": (B.compress_store_decode_call, compress_store_decode_torch, 4)}


def _rows_of(call, prefill, req):
    """Output rows of request (prefill) or token (decode) ``req``."""
    if not prefill:
        return [req]
    cu = call["cu_compressed"].tolist()
    return list(range(cu[req], cu[req + 1]))


@requires_cuda
@pytest.mark.parametrize("what", ["slot_beyond_cache", "position_beyond_table", "state_beyond_ring",
                                  "state_negative"])
@pytest.mark.parametrize("op", list(CS))
def test_compress_store_skips_bad_metadata(op, what):
    from tilelang_ops.compress_store import compress_store_decode, compress_store_prefill

    build, twin, victim = CS[op]  # victim: a request (prefill) / single-token request (decode)
    wrapper = compress_store_prefill if op == "prefill" else compress_store_decode
    call = build(DEV)
    slots, pos = call["slot_mapping"].clone(), call["positions"].clone()
    stored = [i for i in range(slots.shape[0]) if int(slots[i]) >= 0]
    want = call.fresh()
    state0 = call["state_cache"].clone()
    if what in ("slot_beyond_cache", "position_beyond_table"):
        row = stored[0]
        if what == "slot_beyond_cache":
            slots[row] = call["kv_cache"].shape[0] * (B.CS_BLOCK // B.RATIO)
        else:
            pos[row] = call["cos"].shape[0]
        call = call.with_(slot_mapping=slots, positions=pos)
        want = want.with_(slot_mapping=skip_rows(slots, [row]), positions=torch.where(
            torch.arange(pos.shape[0], device=DEV) == row, 0, pos))
        spare = None
    else:
        idx = call["state_block_idx"].clone()
        idx[victim] = call["state_cache"].shape[0] + 60 if what == "state_beyond_ring" else -1
        call = call.with_(state_block_idx=idx)
        # the reference moves the bad request to the spare slot and skips its rows
        ref_idx = idx.clone()
        ref_idx[victim] = B.SPARE_SLOT
        rows = _rows_of(call, op == "prefill", victim)
        want = want.with_(state_block_idx=ref_idx, slot_mapping=skip_rows(slots, rows))
        spare = B.SPARE_SLOT
    want(twin)
    if spare is not None:  # the kernel must not have touched the spare slot: it is not addressed
        want["state_cache"][spare] = state0[spare]
    got, guards = guard_written(call)
    got(wrapper)
    torch.cuda.synchronize()
    check_guards(guards)
    compare_bitwise("state_cache", got["state_cache"], want["state_cache"]).check()
    compare_bitwise("kv_cache", got["kv_cache"], want["kv_cache"]).check()


# ----------------------------------------------------------------------------------------------
# compress: bad state slots, chunks beyond the tokens, a bad context length
# ----------------------------------------------------------------------------------------------


@requires_cuda
@pytest.mark.parametrize("what", ["state_beyond_ring", "state_negative", "chunk_beyond_tokens"])
def test_compress_prefill_skips_bad_requests(what):
    from tilelang_ops.compress import compress_prefill

    call = B.prefill_call(DEV)
    victim = 3  # chunk (2, 6, 3): the last request
    state0 = call["state_cache"].clone()
    cu_c = call["cu_compressed"].tolist()
    if what == "chunk_beyond_tokens":
        # the last chunk claims 5 tokens (only 2 exist): positions [4, 9), 2 rows
        cu_q, ctx = call["cu_seqlens_q"].clone(), call["context_lens"].clone()
        cu_q[-1] += 3
        ctx[-1] += 3
        bad_cu_c = torch.tensor(cu_c[:-1] + [cu_c[-2] + 2], dtype=torch.int32, device=DEV)
        bad = call.with_(cu_seqlens_q=cu_q, context_lens=ctx, cu_compressed=bad_cu_c)
        want = call.fresh()  # the valid batch: requests 0..2 as given
        bad_rows = range(cu_c[-2], cu_c[-2] + 2)
        spare = int(call["state_block_idx"][victim])  # the claimed request's ring must stay as it was
    else:
        idx = call["state_block_idx"].clone()
        idx[victim] = call["state_cache"].shape[0] + 60 if what == "state_beyond_ring" else -1
        bad = call.with_(state_block_idx=idx)
        ref_idx = idx.clone()
        ref_idx[victim] = B.SPARE_SLOT
        want = call.fresh().with_(state_block_idx=ref_idx)
        bad_rows = range(cu_c[victim], cu_c[victim + 1])
        spare = B.SPARE_SLOT
    kv_want = want(compress_prefill_torch)
    want["state_cache"][spare] = state0[spare]
    got, guards = guard_written(bad)
    kv = got(compress_prefill)
    torch.cuda.synchronize()
    check_guards(guards)
    compare_bitwise("state_cache", got["state_cache"], want["state_cache"]).check()
    good = list(range(cu_c[victim]))  # rows of the valid requests
    # rows: <= 1 BF16 ulp (expf vs torch exp); the skipped request's rows are zero
    compare_bf16_ulp("kv (valid requests)", kv[good], kv_want[good], max_ulp=1).check()
    rows = list(bad_rows)
    compare_bitwise("kv (skipped request)", kv[rows], torch.zeros_like(kv[rows])).check()


@requires_cuda
@pytest.mark.parametrize("what", ["state_beyond_ring", "state_negative", "context_zero"])
def test_compress_decode_skips_bad_tokens(what):
    from tilelang_ops.compress import compress_decode

    call = B.decode_call(DEV)
    victim = 4 if what != "context_zero" else 3  # single-token requests (slots 3 and 0)
    state0 = call["state_cache"].clone()
    idx = call["state_block_idx"].clone()
    if what == "context_zero":
        ctx = call["context_lens"].clone()
        ctx[victim] = 0
        bad = call.with_(context_lens=ctx)
        spare = int(idx[victim])  # its ring must stay as it was
        want = call.fresh()
    else:
        idx[victim] = call["state_cache"].shape[0] + 60 if what == "state_beyond_ring" else -1
        bad = call.with_(state_block_idx=idx)
        ref_idx = idx.clone()
        ref_idx[victim] = B.SPARE_SLOT
        want = call.fresh().with_(state_block_idx=ref_idx)
        spare = B.SPARE_SLOT
    kv_want = want(compress_decode_torch)
    want["state_cache"][spare] = state0[spare]
    got, guards = guard_written(bad)
    kv = got(compress_decode)
    torch.cuda.synchronize()
    check_guards(guards)
    compare_bitwise("state_cache", got["state_cache"], want["state_cache"]).check()
    good = [i for i in range(kv.shape[0]) if i != victim]
    compare_bf16_ulp("kv (valid tokens)", kv[good], kv_want[good], max_ulp=1).check()
    compare_bitwise("kv (skipped token)", kv[victim], torch.zeros_like(kv[victim])).check()


# ----------------------------------------------------------------------------------------------
# topk family: end beyond the row, short or unallocated block tables, indices beyond the candidates
# ----------------------------------------------------------------------------------------------


def fenced_scores(b, n, seed=0):
    """[b, n] fp32 scores whose rows are followed by +inf and NaN (row stride n + 64): a kernel that read
    past ``n`` would select them."""
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(b, n + 64, generator=g)
    wide[:, n::2], wide[:, n + 1::2] = float("inf"), float("nan")
    return wide.to(DEV)[:, :n]


def fenced_table(table: torch.Tensor, fill=7777):
    """A contiguous copy of ``table`` followed in memory by block ids ``fill`` (reads past its last row
    give slots of block 7777)."""
    buf = torch.full((table.numel() + 256,), fill, dtype=torch.int32, device=DEV)
    view = buf[:table.numel()].view(table.shape)
    view.copy_(table)
    return view


BAD_ENDS = (lambda n: [n + 5, -3, INT32_MAX, 7], lambda n: [-(2**31), n, n + 1, 0])


@requires_cuda
@pytest.mark.parametrize("n,k", [(40, 5), (20000, 512)], ids=["n40", "n20000"])
@pytest.mark.parametrize("ends", [0, 1], ids=["ends_a", "ends_b"])
def test_topk_clamps_bad_end(n, k, ends):
    from tilelang_ops.topk import block_max_scores, topk

    scores = fenced_scores(4, n)
    end = torch.tensor(BAD_ENDS[ends](n), dtype=torch.int32, device=DEV)
    clamped = end.long().clamp(0, n).int()
    v, i = topk(scores, k, end=end)
    wv, wi = topk_torch(scores, k, end=clamped)
    compare_bitwise("indices", i, wi).check()
    compare_bitwise("values", v, wv).check()
    got = block_max_scores(scores, 8, end)
    compare_bitwise("block max", got.cpu(), block_max_scores_ref(scores.cpu(), 8, clamped.cpu())).check()


def expected_slots(local, k, table, block_size_c, candidate_blocks=None, candidate_block_size=None):
    """The kernels' contract without debug checks: a lane whose row the table (or a candidate block)
    cannot resolve is -1."""
    b = local.shape[0]
    out = torch.full((b, k), -1, dtype=torch.int32)
    mb = table.shape[1]
    for r in range(b):
        for lane in range(k):
            i = int(local[r, lane])
            if i < 0:
                continue
            j = i
            if candidate_blocks is not None:
                blk = int(candidate_blocks[r, i // candidate_block_size])
                if blk < 0:
                    continue
                j = blk * candidate_block_size + i % candidate_block_size
            if j // block_size_c >= mb or int(table[r, j // block_size_c]) < 0:
                continue
            out[r, lane] = int(table[r, j // block_size_c]) * block_size_c + j % block_size_c
    return out


@requires_cuda
@pytest.mark.parametrize("candidates", [False, True], ids=["rows", "candidates"])
def test_topk_to_slots_short_tables_give_minus_one(candidates):
    from tilelang_ops.topk import topk_to_slots

    b, n, k, bc, cbs = 4, 64, 16, 8, 8
    scores = fenced_scores(b, n, seed=1)
    end = torch.tensor([n + 9, 50, -1, 20], dtype=torch.int32, device=DEV)
    g = torch.Generator().manual_seed(2)
    table = torch.randint(0, 1000, (b, 5), generator=g, dtype=torch.int32)  # 5 blocks: rows >= 40 unresolved
    table[1, 2] = -1  # an unallocated block
    cand = None
    if candidates:
        # candidate blocks 5 and 6 lie beyond the table
        cand = torch.randint(0, 7, (b, n // cbs), generator=g, dtype=torch.int32)
        cand[0, 1] = -1
        cand = cand.to(DEV)
    got = topk_to_slots(scores, k, end=end, candidate_blocks=cand,
                        candidate_block_size=cbs if candidates else None, block_size_c=bc,
                        block_tables=fenced_table(table.to(DEV)))
    _, local = topk_torch(scores, k, end=end.long().clamp(0, n).int())
    want = expected_slots(local.cpu(), k, table, bc, None if cand is None else cand.cpu(), cbs)
    compare_bitwise("slots", got.cpu(), want).check()


@requires_cuda
def test_convert_and_restore_unresolvable_lanes():
    from tilelang_ops.topk import convert_kv_index_, restore_candidate_indices_

    g = torch.Generator().manual_seed(3)
    b, L, k, bc = 3, 2, 8, 4
    index = torch.randint(-3, 40, (b, L, k), generator=g, dtype=torch.int32)  # rows >= 24: beyond 6 blocks
    lens = torch.tensor([[8, 3], [-2, 20], [0, 5]], dtype=torch.int32)  # negative and beyond k too
    table = torch.randint(0, 1000, (b, 6), generator=g, dtype=torch.int32)
    table[2, 1] = -1
    want = torch.full_like(index, -1)
    for r in range(b):
        for t in range(L):
            for lane in range(k):
                j = int(index[r, t, lane])
                if lane < int(lens[r, t]) and j >= 0 and j // bc < 6 and int(table[r, j // bc]) >= 0:
                    want[r, t, lane] = int(table[r, j // bc]) * bc + j % bc
    g_index = B.guarded(index.to(DEV))
    convert_kv_index_(g_index.view, bc, lens.to(DEV), fenced_table(table.to(DEV)))
    torch.cuda.synchronize()
    assert g_index.guards_intact()
    compare_bitwise("convert", g_index.view.cpu(), want).check()

    bs, c = 8, 3
    index = torch.randint(-4, 40, (b, k), generator=g, dtype=torch.int32)  # >= 24: beyond the candidates
    blocks = torch.randint(-1, 50, (b, c), generator=g, dtype=torch.int32)
    want = torch.full_like(index, -1)
    for r in range(b):
        for lane in range(k):
            i = int(index[r, lane])
            if i >= 0 and i // bs < c and int(blocks[r, i // bs]) >= 0:
                want[r, lane] = int(blocks[r, i // bs]) * bs + i % bs
    g_index = B.guarded(index.to(DEV))
    restore_candidate_indices_(g_index.view, fenced_table(blocks.to(DEV), fill=9999), bs)
    torch.cuda.synchronize()
    assert g_index.guards_intact()
    compare_bitwise("restore", g_index.view.cpu(), want).check()


# ----------------------------------------------------------------------------------------------
# index logits: klen beyond max_klen or negative, block-table entries outside the cache, candidate
# blocks beyond the table, key ranges outside [0, N) or wider than max_width
# ----------------------------------------------------------------------------------------------

def _paged_bad(what: str) -> B.Call:
    """The torch-ops paged case (its kernel compiled ahead) with bad metadata of kind ``what``."""
    case = "paged_index_logits_out" if what != "candidates" else "paged_index_logits_candidates"
    call = OP_CASES[case].call(DEV)
    if what == "candidates":
        call = B.Call(call.args, {**call.kwargs, "out": torch.full(
            (3, 2, call["max_klen"]), 12345.0, device=DEV)}, ("out",))
    klen, table = call["klen"].clone(), call["block_tables"].clone()
    if what == "klen":
        klen[0, 0], klen[1, 1], klen[2, 0] = call["max_klen"] + 7, -3, INT32_MAX
    elif what == "table":
        num_blocks = call["index_cache"].shape[0]
        table[0, 0], table[1, 0], table[2, 1] = num_blocks, -5, INT32_MAX
    else:  # candidate blocks whose rows lie beyond the block table, and one below -1
        cand = call["candidate_blocks"].clone()
        cand[0, 0, 0], cand[1, 1, 1], cand[2, 0, 0] = 1 << 20, INT32_MAX // 16, -7
        return call.with_(candidate_blocks=cand)
    return call.with_(klen=klen, block_tables=table)


@requires_cuda
@pytest.mark.parametrize("what", ["klen", "table", "candidates"])
def test_paged_index_logits_on_bad_metadata(what):
    """Without the debug switch the kernel scores a column it cannot resolve -inf and cuts klen to
    [0, max_klen] (the unchecked twin's contract), and writes nothing outside ``out``."""
    from reference.index_logits import paged_index_logits_torch_unchecked
    from tilelang_ops.index_logits import paged_index_logits

    _logits_as_unchecked_twin(_paged_bad(what), paged_index_logits, paged_index_logits_torch_unchecked)


def _logits_as_unchecked_twin(call: B.Call, kernel_fn, twin_fn) -> None:
    """``kernel_fn`` on ``call`` (``out`` inside canaries) writes the logits ``twin_fn`` does, bitwise,
    and nothing outside ``out``."""
    want = call.fresh()
    want(twin_fn)
    got, guards = guard_written(call.fresh())
    got(kernel_fn)
    torch.cuda.synchronize()
    check_guards(guards)
    compare_bitwise("logits", got["out"], want["out"]).check()


@requires_cuda
def test_ragged_index_logits_on_bad_ranges():
    """ks below 0, ke below ks, ke beyond N, a range wider than max_width: keys outside [0, N) score
    -inf, widths are cut to [0, max_width], nothing outside ``out`` is written."""
    from reference.index_logits import ragged_index_logits_torch_unchecked
    from tilelang_ops.index_logits import ragged_index_logits

    call = OP_CASES["ragged_index_logits_out"].call(DEV)
    ks, ke = call["ks"].clone(), call["ke"].clone()
    n = call["k_codes"].shape[0]
    ks[0], ke[0] = -4, 6
    ks[1], ke[1] = 10, 3
    ks[2], ke[2] = n - 5, n + 40
    ks[3], ke[3] = -5, n  # wider than max_width (the case's widest range is N)
    assert ke[3] - ks[3] > call["max_width"]
    _logits_as_unchecked_twin(call.with_(ks=ks, ke=ke), ragged_index_logits,
                              ragged_index_logits_torch_unchecked)


@requires_cuda
def test_index_logits_debug_switch_raises_and_writes_nothing(monkeypatch):
    """Under TILELANG_OPS_DEBUG=1 the wrappers run the references' value checks before the launch."""
    from tilelang_ops.index_logits import paged_index_logits, ragged_index_logits

    monkeypatch.setenv("TILELANG_OPS_DEBUG", "1")
    paged = _paged_bad("klen")
    ragged = OP_CASES["ragged_index_logits_out"].call(DEV)
    ke = ragged["ke"].clone()
    ke[1] = ragged["k_codes"].shape[0] + 3
    for call, fn, text in ((paged, paged_index_logits, f"klen[0, 0] = {paged['max_klen'] + 7}"),
                           (ragged.with_(ke=ke), ragged_index_logits, f"ke = {int(ke[1])}")):
        before = call["out"].clone()
        with pytest.raises(ValueError, match=re.escape(text)):
            call(fn)
        torch.cuda.synchronize()
        assert torch.equal(call["out"], before), f"{fn.__name__} wrote before raising"
