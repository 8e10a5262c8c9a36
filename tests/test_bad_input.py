"""Bad input never writes and never passes silently (issue 36), one test per path.

Every call here is malformed on purpose. Each test asserts three things: the call raises a TypeError or
ValueError (never an IndexError or a silently wrong result), the message names the argument and the
value the caller passed, and every tensor the entry point writes is byte-for-byte what it was
(``tilelang_ops.testing.bad_input.changed``: a byte comparison, so NaN payloads and signed zeros count).
The random counterpart is tests/test_bad_input_fuzz.py; the GPU tier (kernels on bad metadata without
the debug switch) is tests/test_bad_input_gpu.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from metadata import (
    FP8_MAIN_KV_FORMAT,
    SUPPORTED_COMPRESS_RATIOS,
    KVCacheFormat,
    SeqMetadata,
    check_ring_capacity,
    compress_state_bytes,
    compress_state_ring_size,
    needs_index_state,
    prepare_tensor_input,
    validate_map_refines,
)
from reference.compress import (
    compress_decode_ref,
    compress_decode_torch,
    compress_prefill_ref,
    compress_prefill_torch,
    compress_ref,
)
from reference.compress_store import (
    compress_store_decode_ref,
    compress_store_decode_torch,
    compress_store_prefill_ref,
    compress_store_prefill_torch,
)
from reference.kv_store import (
    dequantize_rows,
    norm_rope_hadamard_cast_store_ref,
    norm_rope_hadamard_cast_store_torch,
)
from reference.topk import topk_to_slots_ref
from tilelang_ops.testing import bad_input as B


def assert_rejects(fn, call: B.Call, exc, *needles):
    """``call(fn)`` raises ``exc`` whose message holds every needle; nothing the call writes changes."""
    watched = call.written()
    before = B.snapshot(watched)
    with pytest.raises(exc) as info:
        call(fn)
    msg = str(info.value)
    missing = [n for n in needles if n not in msg]
    assert not missing, f"{getattr(fn, '__name__', fn)}: message {msg!r} lacks {missing}"
    assert not B.changed(watched, before), f"{getattr(fn, '__name__', fn)} wrote before raising: {msg}"
    return msg


def i32(values):
    return torch.tensor(values, dtype=torch.int32)


def _wrappers():
    """The kernel wrappers (their host checks run before the CUDA check, so a CPU machine reaches them)."""
    from tilelang_ops.compress import compress_decode, compress_prefill
    from tilelang_ops.compress_store import compress_store_decode, compress_store_prefill

    return dict(compress_prefill=compress_prefill, compress_decode=compress_decode,
                compress_store_prefill=compress_store_prefill, compress_store_decode=compress_store_decode)


PREFILL_FNS = dict(ref=compress_prefill_ref, twin=compress_prefill_torch)
DECODE_FNS = dict(ref=compress_decode_ref, twin=compress_decode_torch)
CS_PREFILL_FNS = dict(ref=compress_store_prefill_ref, twin=compress_store_prefill_torch)
CS_DECODE_FNS = dict(ref=compress_store_decode_ref, twin=compress_store_decode_torch)
STORE_FNS = dict(ref=norm_rope_hadamard_cast_store_ref, twin=norm_rope_hadamard_cast_store_torch)


# ----------------------------------------------------------------------------------------------
# "Wrote before failing": a state_block_idx beyond the ring, in the twins (and their loops)
# ----------------------------------------------------------------------------------------------

# (entry points, builder, index of the request / token whose slot goes beyond the ring)
BEYOND_RING = {
    "compress_prefill": (PREFILL_FNS, B.prefill_call, 3),
    "compress_decode": (DECODE_FNS, B.decode_call, 4),
    "compress_store_prefill": (CS_PREFILL_FNS, B.compress_store_prefill_call, 3),
    "compress_store_decode": (CS_DECODE_FNS, B.compress_store_decode_call, 4),
}


@pytest.mark.parametrize("impl", ["ref", "twin"])
@pytest.mark.parametrize("op", list(BEYOND_RING))
@pytest.mark.parametrize("slot", [68, -1], ids=["slot68", "slot_negative"])
def test_state_block_idx_beyond_the_ring(op, impl, slot):
    fns, build, i = BEYOND_RING[op]
    call = build()
    idx = call["state_block_idx"].clone()
    idx[i] = slot
    assert_rejects(fns[impl], call.with_(state_block_idx=idx), ValueError, f"state_block_idx={slot}",
                   "is outside")


# ----------------------------------------------------------------------------------------------
# "Accepted silently" by the twins: negative context_lens, a wrong cu_compressed, a shared slot
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["ref", "twin"])
@pytest.mark.parametrize("op", ["compress_prefill", "compress_store_prefill"])
def test_prefill_negative_context_lens(op, impl):
    fns, build, _ = BEYOND_RING[op]
    call = build()
    ctx = call["context_lens"].clone()
    ctx[2] = -3
    assert_rejects(fns[impl], call.with_(context_lens=ctx), ValueError, "context_lens=-3")


@pytest.mark.parametrize("impl", ["ref", "twin"])
@pytest.mark.parametrize("op", ["compress_decode", "compress_store_decode"])
def test_decode_negative_context_lens(op, impl):
    fns, build, _ = BEYOND_RING[op]
    call = build()
    ctx = call["context_lens"].clone()
    ctx[3] = -2
    assert_rejects(fns[impl], call.with_(context_lens=ctx), ValueError, "context_lens=-2")


@pytest.mark.parametrize("impl", ["ref", "twin"])
@pytest.mark.parametrize("op", ["compress_prefill", "compress_store_prefill"])
def test_prefill_wrong_cu_compressed(op, impl):
    fns, build, _ = BEYOND_RING[op]
    call = build()
    cu = call["cu_compressed"].clone()
    cu[1] += 1
    kw = {} if "num_rows" not in call.kwargs or call.kwargs["num_rows"] is None else dict(num_rows=None)
    assert_rejects(fns[impl], call.with_(cu_compressed=cu, **kw), ValueError,
                   f"cu_compressed={cu.tolist()}")


@pytest.mark.parametrize("impl", ["ref", "twin"])
@pytest.mark.parametrize("op", ["compress_prefill", "compress_store_prefill"])
def test_prefill_two_requests_share_a_slot(op, impl):
    fns, build, _ = BEYOND_RING[op]
    call = build()
    idx = call["state_block_idx"].clone()
    idx[3] = idx[0]  # requests 0 and 3 both have tokens: two chunks would write one ring
    assert_rejects(fns[impl], call.with_(state_block_idx=idx), ValueError, "share state slot",
                   f"state_block_idx[3] = {int(idx[0])}")


@pytest.mark.parametrize("impl", ["ref", "twin"])
@pytest.mark.parametrize("op", ["compress_decode", "compress_store_decode"])
def test_decode_two_requests_share_a_slot(op, impl):
    fns, build, _ = BEYOND_RING[op]
    call = build()
    idx = call["state_block_idx"].clone()
    idx[4] = idx[0]  # the last token's request reuses the first request's ring, not next to it
    assert_rejects(fns[impl], call.with_(state_block_idx=idx), ValueError,
                   f"state_block_idx={int(idx[0])} was used by an earlier, non-adjacent token")


@pytest.mark.parametrize("impl", ["ref", "twin"])
@pytest.mark.parametrize("what", ["slot_beyond_cache", "position_beyond_table", "position_negative"])
def test_store_twin_checks_like_the_loop(impl, what):
    """The store twin used to skip such rows (as a kernel without the debug switch does); it raises now,
    like the loop reference."""
    call = B.store_call()
    slots, pos = call["slot_mapping"].clone(), call["positions"].clone()
    num_slots = call["kv_cache"].shape[0] * 4
    if what == "slot_beyond_cache":
        slots[0] = num_slots
        needle = f"slot_mapping[0]={num_slots}"
    else:
        pos[1] = B.MAX_POSITION if what == "position_beyond_table" else -1
        needle = f"positions[1]={int(pos[1])}"
    assert_rejects(STORE_FNS[impl], call.with_(slot_mapping=slots, positions=pos), ValueError, needle)


# ----------------------------------------------------------------------------------------------
# "Unclear errors": the message names the argument the caller got wrong
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["ref", "twin"])
@pytest.mark.parametrize("with_num_rows", [True, False], ids=["num_rows", "no_num_rows"])
def test_compress_store_prefill_positions_of_the_wrong_length(impl, with_num_rows):
    call = B.compress_store_prefill_call()
    rows = call["positions"].shape[0]
    bad = call.with_(positions=call["positions"][:-1], **({} if with_num_rows else dict(num_rows=None)))
    msg = assert_rejects(CS_PREFILL_FNS[impl], bad, ValueError, f"positions has {rows - 1} rows")
    assert "slot_mapping must have shape" not in msg


@pytest.mark.parametrize("impl", ["ref", "twin"])
def test_compress_store_prefill_positions_and_slots_both_short(impl):
    """Both row tensors agree with each other but not with cu_compressed (a device value)."""
    call = B.compress_store_prefill_call()
    rows = call["positions"].shape[0]
    bad = call.with_(positions=call["positions"][:-1], slot_mapping=call["slot_mapping"][:-1],
                     out_norm=call["out_norm"][:-1], num_rows=None)
    assert_rejects(CS_PREFILL_FNS[impl], bad, ValueError, f"have {rows - 1} rows",
                   f"cu_compressed[-1]={rows}")


def test_prepare_tensor_input_ratios_not_a_sequence():
    call = B.Call(dict(seqs=[SeqMetadata(2, 4, [0], 0)]), dict(is_prefill=True, compress_ratios=2))
    assert_rejects(prepare_tensor_input, call, TypeError, "compress_ratios must be a sequence", "int 2")


def test_check_ring_capacity_ring_size_str():
    assert_rejects(check_ring_capacity, B.Call(dict(ring_size="7", compress_ratio=2, max_seqlen_q=1)),
                   TypeError, "ring_size must be an int", "'7'")


def test_validate_map_refines_none():
    call = B.Call(dict(fine_name="topk_map", fine=[0, 0], coarse_name="cache_map", coarse=None))
    assert_rejects(validate_map_refines, call, TypeError, "cache_map must be a sequence", "None")


@pytest.mark.parametrize("slot", [8, -1, 1 << 40])
def test_dequantize_rows_slot_outside_the_cache(slot):
    cache = torch.full((2, FP8_MAIN_KV_FORMAT.block_bytes(4)), B.CANARY, dtype=torch.uint8)  # 8 slots
    call = B.Call(dict(kv_cache=cache, slots=[0, slot], fmt=FP8_MAIN_KV_FORMAT), {}, ("kv_cache",))
    assert_rejects(dequantize_rows, call, ValueError, f"slots[1]={slot}", "outside the cache [0, 8)")


def test_dequantize_rows_slots_not_ints():
    cache = torch.zeros(2, FP8_MAIN_KV_FORMAT.block_bytes(4), dtype=torch.uint8)
    assert_rejects(dequantize_rows, B.Call(dict(kv_cache=cache, slots=[0, 1.5], fmt=FP8_MAIN_KV_FORMAT)),
                   TypeError, "slots[1] must be an int", "1.5")


@pytest.mark.parametrize("candidates", [False, True])
def test_topk_to_slots_ref_short_block_table(candidates):
    """The message names block_tables (and end), never the internal index the composition builds."""
    call = B.topk_to_slots_call()
    short = call["block_tables"][:, :3].contiguous()  # 3 blocks of 8 rows; end[0] = 40 needs 5
    kw = dict(block_tables=short)
    if candidates:
        call = B.Call(call.args, dict(call.kwargs, candidate_blocks=i32([[0, 1, 2, 3, 9]] * 3),
                                      candidate_block_size=8))
        kw["block_tables"] = call["block_tables"]  # 5 blocks, but candidate block 9 needs block 9
    msg = assert_rejects(topk_to_slots_ref, call.with_(**kw), ValueError, "block_tables has")
    assert "index[" not in msg, msg
    want = ["candidate_blocks[0, 4]=9"] if candidates else ["has 3 blocks", "end[0]=40"]
    assert all(w in msg for w in want), msg


def test_topk_to_slots_ref_unallocated_block():
    call = B.topk_to_slots_call()
    table = call["block_tables"].clone()
    table[1, 0] = -1  # end[1] = 7: rows 0..6 live in block 0
    assert_rejects(topk_to_slots_ref, call.with_(block_tables=table), ValueError,
                   "block_tables[1, 0]=-1 is not an allocated block", "end[1]=7")


def _metadata(call, key):
    """The fields ``compress`` reads of an InputMetadata, from a prefill call (cu_compressed at ``key``)."""
    return SimpleNamespace(cu_seqlens_q=call["cu_seqlens_q"], context_lens=call["context_lens"],
                           state_block_idx=call["state_block_idx"],
                           cu_compressed={key: call["cu_compressed"]})


def test_compress_dispatch_metadata_without_fields():
    call = B.prefill_call()
    bad = B.Call(dict(projected_kv=call["projected_kv"], state_cache=call["state_cache"],
                      metadata=SimpleNamespace(), compress_ratio=2, is_prefill=True), {}, ("state_cache",))
    assert_rejects(compress_ref, bad, TypeError, "metadata must carry cu_compressed", "SimpleNamespace")
    meta = _metadata(call, "4")
    assert_rejects(compress_ref, bad.with_(metadata=meta), ValueError,
                   "metadata.cu_compressed has no entry '2'")


# ----------------------------------------------------------------------------------------------
# "Accepted silently": sizing helpers and cache formats reject non-integers and negative sizes
# ----------------------------------------------------------------------------------------------

HELPER_CASES = {
    "ring_size_float_backtracking": (compress_state_ring_size,
                                     dict(compress_ratio=2, max_backtracking_tokens=2.5), TypeError,
                                     ("max_backtracking_tokens must be an int", "2.5")),
    "ring_size_c1_negative": (compress_state_ring_size, dict(compress_ratio=1, max_backtracking_tokens=-5),
                              ValueError, ("max_backtracking_tokens=-5",)),
    "state_bytes_negative_dim": (compress_state_bytes, dict(compress_ratio=2, head_dim=-512),
                                 ValueError, ("head_dim=-512",)),
    "state_bytes_str_dim": (compress_state_bytes, dict(compress_ratio=2, head_dim="512"),
                            TypeError, ("head_dim must be an int", "'512'")),
    "capacity_zero_tokens": (check_ring_capacity, dict(ring_size=7, compress_ratio=2, max_seqlen_q=0),
                             ValueError, ("max_seqlen_q=0",)),
    "capacity_negative_ring": (check_ring_capacity, dict(ring_size=-1, compress_ratio=2, max_seqlen_q=1),
                               ValueError, ("ring_size=-1",)),
    "block_bytes_negative": (FP8_MAIN_KV_FORMAT.block_bytes, dict(rows=-1), ValueError, ("rows=-1",)),
    "block_bytes_float": (FP8_MAIN_KV_FORMAT.block_bytes, dict(rows=64.0), TypeError,
                          ("rows must be an int", "64.0")),
    "rows_per_block_str": (FP8_MAIN_KV_FORMAT.rows_per_block, dict(block_width="528"), TypeError,
                           ("block_width must be an int", "'528'")),
    "data_offset_beyond_block": (FP8_MAIN_KV_FORMAT.data_offset, dict(row=64, rows=64), ValueError,
                                 ("row=64 is outside [0, 63]",)),
    "scale_offset_negative_row": (FP8_MAIN_KV_FORMAT.scale_offset, dict(row=-1, rows=64), ValueError,
                                  ("row=-1",)),
    "format_zero_group": (KVCacheFormat, dict(name="x", dim=512, data_dtype="e4m3", scale_dtype="ue8m0",
                                              group_size=0), ValueError, ("group_size=0",)),
    "format_negative_dim": (KVCacheFormat, dict(name="x", dim=-512, data_dtype="e4m3", scale_dtype="ue8m0",
                                                group_size=32), ValueError, ("dim=-512",)),
    "format_unknown_dtype": (KVCacheFormat, dict(name="x", dim=512, data_dtype="fp6", scale_dtype="ue8m0",
                                                 group_size=32), ValueError, ("data_dtype='fp6'",)),
}


@pytest.mark.parametrize("name", list(HELPER_CASES))
def test_helpers_reject(name):
    fn, kwargs, exc, needles = HELPER_CASES[name]
    assert_rejects(fn, B.Call({}, kwargs), exc, *needles)


def test_slot_location_rejects_negative_slots():
    from metadata.cache_format import slot_location

    assert_rejects(slot_location, B.Call(dict(slot=-1, rows_per_block=64)), ValueError, "slot=-1")


# ----------------------------------------------------------------------------------------------
# One ratio rule: the public API takes ratios 1 and 2 (entry points with a ring take 2)
# ----------------------------------------------------------------------------------------------

RING_ENTRY_POINTS = {
    **{f"compress_prefill_{k}": (f, B.prefill_call) for k, f in PREFILL_FNS.items()},
    **{f"compress_decode_{k}": (f, B.decode_call) for k, f in DECODE_FNS.items()},
    **{f"compress_store_prefill_{k}": (f, B.compress_store_prefill_call) for k, f in CS_PREFILL_FNS.items()},
    **{f"compress_store_decode_{k}": (f, B.compress_store_decode_call) for k, f in CS_DECODE_FNS.items()},
}
WRAPPER_BUILDERS = dict(compress_prefill=B.prefill_call, compress_decode=B.decode_call,
                        compress_store_prefill=B.compress_store_prefill_call,
                        compress_store_decode=B.compress_store_decode_call)


def test_supported_ratios_are_the_engine_ratios():
    assert SUPPORTED_COMPRESS_RATIOS == (1, 2)


@pytest.mark.parametrize("ratio", [4, 8, 3, 0])
@pytest.mark.parametrize("name", list(RING_ENTRY_POINTS) + [f"wrapper_{n}" for n in WRAPPER_BUILDERS])
def test_one_ratio_rule_for_ring_entry_points(name, ratio):
    """References, twins and kernel wrappers reject what the metadata builder and ``compress`` reject
    (the kernels' general powers of two stay internal to their factories)."""
    if name.startswith("wrapper_"):
        fn, build = _wrappers()[name[8:]], WRAPPER_BUILDERS[name[8:]]
    else:
        fn, build = RING_ENTRY_POINTS[name]
    call = build()
    assert_rejects(fn, call.with_(compress_ratio=ratio), ValueError,
                   f"compress_ratio={ratio} is not supported")


@pytest.mark.parametrize("name", list(RING_ENTRY_POINTS))
def test_ring_entry_points_reject_c1(name):
    fn, build = RING_ENTRY_POINTS[name]
    assert_rejects(fn, build().with_(compress_ratio=1), ValueError,
                   "compress_ratio=1 keeps no compression state")


@pytest.mark.parametrize("ratio", [4, 8])
def test_one_ratio_rule_elsewhere(ratio):
    call = B.prefill_call()
    needle = f"compress_ratio={ratio} is not supported"
    dispatch = B.Call(dict(projected_kv=call["projected_kv"], state_cache=call["state_cache"],
                           metadata=_metadata(call, str(ratio)), compress_ratio=ratio, is_prefill=True), {},
                      ("state_cache",))
    assert_rejects(compress_ref, dispatch, ValueError, needle)
    builder = B.Call(dict(seqs=[SeqMetadata(2, 4, [0], 0)]), dict(is_prefill=True, compress_ratios=(ratio,)))
    assert_rejects(prepare_tensor_input, builder, ValueError, needle)
    assert_rejects(compress_state_ring_size, B.Call(dict(compress_ratio=ratio)), ValueError, needle)
    assert_rejects(compress_state_bytes, B.Call(dict(compress_ratio=ratio, head_dim=512)), ValueError, needle)
    assert_rejects(needs_index_state, B.Call(dict(compress_ratio=ratio)), ValueError, needle)


# ----------------------------------------------------------------------------------------------
# The diff input builders
# ----------------------------------------------------------------------------------------------

DIFF_MODULES = ("compress", "kv_store", "compress_store", "topk", "gather_rows", "index_logits")


@pytest.mark.parametrize("op", DIFF_MODULES)
def test_diff_cases_reject_unknown_case_ids(op):
    import importlib

    mod = importlib.import_module(f"tilelang_ops.diffcases.{op}")
    for bad in ("nope", None, 3):
        assert_rejects(mod.self_check, B.Call(dict(case_id=bad)), ValueError, f"case_id={bad!r}",
                       "is not one of")


@pytest.mark.parametrize("op", ["compress", "compress_store"])
def test_diff_cases_are_valid_metadata(op):
    """Every case of the ratio-bearing diff modules passes the references' checks (they are C2 now)."""
    import importlib

    mod = importlib.import_module(f"tilelang_ops.diffcases.{op}")
    for case in mod.CASES:
        assert all(c.passed for c in mod.self_check(case)), case
