"""Random malformed metadata at every CPU entry point (hypothesis), issue 36.

Each example takes a valid call of one entry point (``tilelang_ops.testing.bad_input``), breaks exactly one
argument in a way that is invalid by construction (a wrong dtype, a non-tensor, a tensor on another
device, a wrong length, a non-integer or out-of-range scalar, or a metadata value that addresses outside
the ring, the cache, the tables or the row), and checks what tests/test_bad_input.py checks per path:
a TypeError / ValueError whose message names the broken argument and the value passed, and every tensor
the entry point writes byte-for-byte unchanged. Kernel wrappers get the host-side breakages only (their
value checks need TILELANG_OPS_DEBUG=1 and CUDA); references and twins get all of them.

Derandomized and without an example database, so every run draws the same examples.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metadata import (
    FP4_INDEX_KV_FORMAT,
    FP8_MAIN_KV_FORMAT,
    KVCacheFormat,
    SeqMetadata,
    check_compress_ratio,
    check_ring_capacity,
    compress_state_bytes,
    compress_state_ring_size,
    needs_index_state,
    prepare_tensor_input,
    validate_map_refines,
)
from metadata.cache_engine import min_ring_size
from metadata.cache_format import slot_location
from reference.kv_store import dequantize_rows
from tilelang_ops.testing import bad_input as B
from tilelang_ops.testing.torch_ops import OP_CASES

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])
DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64)
I32 = torch.int32
INDEX = (torch.int32, torch.int64)
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# junk for an integer (or bool / float) scalar argument: never an int
NOT_INT = st.one_of(st.floats(allow_nan=True), st.text(max_size=3), st.none(), st.just([2]),
                    st.just(torch.tensor(2)), st.complex_numbers(max_magnitude=4))
NOT_BOOL = st.one_of(st.integers(-3, 3), st.text(max_size=2), st.none(), st.just(torch.tensor(True)))


def shown(value) -> str:
    """What a message must contain of a scalar the caller passed (tensors: just that it is one)."""
    return "tensor" if isinstance(value, torch.Tensor) else repr(value)


@dataclass
class Broken:
    call: B.Call
    exc: type | tuple
    needles: list  # each a str, or a tuple of alternatives


def check(fn, broken: Broken) -> None:
    watched = broken.call.written()
    before = B.snapshot(watched)
    try:
        broken.call(fn)
    except broken.exc as e:
        msg = str(e)
    except Exception as e:  # the wrong kind of failure (IndexError, RuntimeError, ...)
        raise AssertionError(f"{getattr(fn, '__name__', fn)} raised {type(e).__name__}: {e}; want "
                             f"{broken.exc} naming {broken.needles}") from e
    else:
        raise AssertionError(f"{getattr(fn, '__name__', fn)} accepted {broken.needles}")
    for needle in broken.needles:
        options = needle if isinstance(needle, tuple) else (needle,)
        assert any(o in msg for o in options), f"message {msg!r} lacks {needle!r}"
    assert not B.changed(watched, before), f"{getattr(fn, '__name__', fn)} wrote before raising: {msg}"


# ----------------------------------------------------------------------------------------------
# generic breakages: dtype, type, device, length, scalars
# ----------------------------------------------------------------------------------------------


def break_dtype(data, call, tensors):
    name = data.draw(st.sampled_from(sorted(tensors)), label="tensor")
    dtype = data.draw(st.sampled_from([d for d in DTYPES if d not in tensors[name]]), label="dtype")
    return Broken(call.with_(**{name: call[name].to(dtype)}), TypeError,
                  [f"{name} must have dtype", str(dtype)])


def break_type(data, call, tensors):
    name = data.draw(st.sampled_from(sorted(tensors)), label="tensor")
    return Broken(call.with_(**{name: call[name].tolist()}), TypeError,
                  [f"{name} must be a torch.Tensor", "list"])


def break_device(data, call, tensors):
    names = sorted(n for n in tensors if n not in call.writes)
    name = data.draw(st.sampled_from(names), label="tensor")
    return Broken(call.with_(**{name: call[name].to("meta")}), ValueError, [f"{name}=meta"])


def break_length(data, call, shaped):
    name = data.draw(st.sampled_from(sorted(shaped)), label="tensor")
    t = call[name]
    how = data.draw(st.sampled_from(["drop", "add", "ndim"]), label="how")
    if how == "drop" and t.shape[0] > 0:
        new = t[:-1]
    elif how == "add" or t.shape[0] == 0:
        new = torch.cat([t, t[:1] if t.shape[0] else t.new_zeros((1, *t.shape[1:]))])
    else:
        new = t[None]
    want = (str(tuple(new.shape)), f"{name} has {new.shape[0]}")
    return Broken(call.with_(**{name: new.contiguous()}), ValueError, [name, want])


def not_int(name, none_ok=False):
    """A non-integer for int argument ``name`` (None too, unless it means "not given"): TypeError naming
    it and showing the value."""
    def breaker(data, call):
        v = data.draw(NOT_INT.filter(lambda x: x is not None) if none_ok else NOT_INT, label=name)
        return Broken(call.with_(**{name: v}), TypeError, [f"{name} must be", shown(v)])
    return breaker


def int_outside(name, bad: st.SearchStrategy, needle="{name}={v}"):
    """An int that is invalid by itself for ``name``: ValueError showing it."""
    def breaker(data, call):
        v = data.draw(bad, label=name)
        return Broken(call.with_(**{name: v}), ValueError, [needle.format(name=name, v=v)])
    return breaker


def not_bool(name):
    def breaker(data, call):
        v = data.draw(NOT_BOOL, label=name)
        return Broken(call.with_(**{name: v}), TypeError, [f"{name} must be a bool", shown(v)])
    return breaker


RATIO_INTS = st.integers(-8, 64).filter(lambda r: r not in (1, 2))
bad_ratio = [not_int("compress_ratio"),
             int_outside("compress_ratio", RATIO_INTS, "compress_ratio={v} is not supported"),
             int_outside("compress_ratio", st.just(1), "compress_ratio=1 keeps no compression state")]


def bad_fmt(data, call):
    v = data.draw(st.one_of(st.text(max_size=8), st.none(), st.just(FP8_MAIN_KV_FORMAT.name)), label="fmt")
    return Broken(call.with_(fmt=v), TypeError, ["fmt must be a KVCacheFormat", repr(v)])


def bad_eps(data, call):
    v = data.draw(st.one_of(st.text(max_size=3), st.none(), st.booleans(), st.just(torch.tensor(1e-6)),
                            st.sampled_from([float("nan"), float("inf"), -1e-6, -2.0])), label="eps")
    exc = ValueError if isinstance(v, float) else TypeError
    return Broken(call.with_(eps=v), exc, ["eps must be", shown(v)])


def bad_rope_dim(data, call):
    invalid = st.integers(1, 600).filter(lambda d: d % 2 or d > 512)  # odd or wider than the row
    v = data.draw(st.one_of(NOT_INT, st.integers(-70, 0), invalid), label="rope_dim")
    exc = ValueError if isinstance(v, int) else TypeError
    return Broken(call.with_(rope_dim=v), exc, ["rope_dim must be", shown(v)])


# ----------------------------------------------------------------------------------------------
# value breakages (device values: references and twins only)
# ----------------------------------------------------------------------------------------------

def entry_outside(name: str, size_of: Callable, needle: str):
    """One entry ``i`` of the 1-D tensor ``name`` set to a value ``v`` outside ``[0, size_of(call))``:
    ValueError with ``needle.format(i=i, v=v)``."""
    def breaker(data, call):
        t = call[name].clone()
        n = size_of(call)
        i = data.draw(st.integers(0, t.shape[0] - 1), label="i")
        v = data.draw(st.one_of(st.integers(INT32_MIN, -1), st.integers(n, INT32_MAX)), label=name)
        t[i] = v
        return Broken(call.with_(**{name: t}), ValueError, [needle.format(i=i, v=v)])
    return breaker


slot_beyond_ring = entry_outside("state_block_idx", lambda call: call["state_cache"].shape[0],
                                 "state_block_idx={v}")


def prefill_context_below_chunk(data, call):
    cu = call["cu_seqlens_q"].tolist()
    ctx = call["context_lens"].clone()
    i = data.draw(st.integers(0, ctx.shape[0] - 1), label="i")
    v = data.draw(st.integers(INT32_MIN, cu[i + 1] - cu[i] - 1), label="context")
    ctx[i] = v
    return Broken(call.with_(context_lens=ctx), ValueError, [f"context_lens={v}"])


def prefill_shared_slot(data, call):
    cu = call["cu_seqlens_q"].tolist()
    busy = [i for i in range(len(cu) - 1) if cu[i + 1] > cu[i]]  # requests with tokens write their ring
    i, j = data.draw(st.permutations(busy), label="pair")[:2]
    idx = call["state_block_idx"].clone()
    idx[j] = idx[i]
    return Broken(call.with_(state_block_idx=idx), ValueError, ["share state slot", f"= {int(idx[i])}"])


def prefill_cu_compressed(data, call):
    cu = call["cu_compressed"].clone()
    i = data.draw(st.integers(0, cu.shape[0] - 1), label="i")
    cu[i] += data.draw(st.integers(-50, 50).filter(bool), label="delta")
    return Broken(call.with_(cu_compressed=cu, num_rows=None), ValueError, [f"cu_compressed={cu.tolist()}"])


def prefill_cu_seqlens(data, call):
    cu = call["cu_seqlens_q"].clone()
    i = data.draw(st.sampled_from([0, cu.shape[0] - 1]), label="end")  # the first or the last offset
    cu[i] += data.draw(st.integers(-50, 50).filter(bool), label="delta")
    return Broken(call.with_(cu_seqlens_q=cu), ValueError, ["cu_seqlens_q must rise", str(cu.tolist())])


def decode_context(data, call):
    ctx = call["context_lens"].clone()
    i = data.draw(st.integers(0, ctx.shape[0] - 1), label="i")
    v = data.draw(st.integers(INT32_MIN, 0), label="context")
    ctx[i] = v
    return Broken(call.with_(context_lens=ctx), ValueError, [f"context_lens={v}"])


def decode_too_many_tokens(data, call):
    v = data.draw(st.integers(1, 2), label="max_seqlen_q")  # the 3-token step needs 3
    return Broken(call.with_(max_seqlen_q=v), ValueError, [f"max_seqlen_q={v}"])


def decode_non_adjacent(data, call):
    idx = call["state_block_idx"].clone()
    idx[-1] = idx[0]  # the last request's token reuses the first request's ring
    return Broken(call.with_(state_block_idx=idx), ValueError,
                  [f"state_block_idx={int(idx[0])}", "non-adjacent"])


def slot_beyond_cache(data, call):
    slots = call["slot_mapping"].clone()
    geom_slots = call["kv_cache"].shape[0] * call["fmt"].rows_per_block(call["kv_cache"].shape[1])
    i = data.draw(st.integers(0, slots.shape[0] - 1), label="i")
    hi = INT32_MAX if slots.dtype == torch.int32 else 2**62
    v = data.draw(st.integers(geom_slots, hi), label="slot")
    slots[i] = v
    return Broken(call.with_(slot_mapping=slots), ValueError, [f"slot_mapping[{i}]={v}"])


def position_beyond_table(data, call):
    slots, pos = call["slot_mapping"], call["positions"].clone()
    stored = [i for i in range(slots.shape[0]) if int(slots[i]) >= 0]  # skipped rows never read theirs
    i = data.draw(st.sampled_from(stored), label="i")
    hi = INT32_MAX if pos.dtype == torch.int32 else 2**62
    v = data.draw(st.one_of(st.integers(INT32_MIN, -1), st.integers(call["cos"].shape[0], hi)), label="pos")
    pos[i] = v
    return Broken(call.with_(positions=pos), ValueError, [f"positions[{i}]={v}"])


def end_beyond_row(data, call):
    end = call["end"].clone()
    n = call["scores"].shape[1]
    i = data.draw(st.integers(0, end.shape[0] - 1), label="i")
    v = data.draw(st.one_of(st.integers(INT32_MIN, -1), st.integers(n + 1, INT32_MAX)), label="end")
    end[i] = v
    return Broken(call.with_(end=end), ValueError, [f"end[{i}] = {v}"])


def restore_index(data, call):
    index = call["index"].clone()
    limit = call["candidate_blocks"].shape[1] * call["block_size"]
    r = data.draw(st.integers(0, index.shape[0] - 1), label="r")
    c = data.draw(st.integers(0, index.shape[1] - 1), label="c")
    v = data.draw(st.one_of(st.integers(INT32_MIN, -2), st.integers(limit, INT32_MAX)), label="v")
    index[r, c] = v
    return Broken(call.with_(index=index), ValueError, [f"index[{r}, {c}] = {v}"])


def convert_valid_lens(data, call):
    lens = call["valid_lens"].clone()
    r = data.draw(st.integers(0, lens.shape[0] - 1), label="r")
    v = data.draw(st.integers(INT32_MIN, -1), label="v")
    lens[r, 0] = v
    return Broken(call.with_(valid_lens=lens), ValueError, [f"valid_lens[{r}, 0] = {v}"])


def convert_index(data, call):
    index, lens = call["index"].clone(), call["valid_lens"].clone()
    r = data.draw(st.integers(0, index.shape[0] - 1), label="r")
    lens[r, 0] = index.shape[2]  # every lane of row r is valid
    limit = call["block_tables"].shape[1] * call["block_size_c"]
    v = data.draw(st.one_of(st.integers(INT32_MIN, -2), st.integers(limit, INT32_MAX)), label="v")
    index[r, 0, 0] = v
    return Broken(call.with_(index=index, valid_lens=lens), ValueError, [f"index[{r}, 0, 0] = {v}"])


def slots_short_table(data, call):
    keep = data.draw(st.integers(0, 4), label="blocks")  # end[0] = 40 needs all 5 blocks of 8 rows
    table = call["block_tables"][:, :keep].contiguous()
    return Broken(call.with_(block_tables=table), ValueError,
                  [f"block_tables has {keep} blocks", "end[0]=40"])


def slots_unallocated(data, call):
    table = call["block_tables"].clone()
    table[0, data.draw(st.integers(0, 4), label="block")] = data.draw(st.integers(INT32_MIN, -1), label="v")
    return Broken(call.with_(block_tables=table), ValueError,
                  ["is not an allocated block", "block_tables[0, "])


gather_index = entry_outside("index", lambda call: call["x"].shape[0], "index[{i}]={v}")


def paged_klen(data, call):
    klen = call["klen"].clone()
    r = data.draw(st.integers(0, klen.shape[0] - 1), label="r")
    t = data.draw(st.integers(0, klen.shape[1] - 1), label="t")
    v = data.draw(st.one_of(st.integers(INT32_MIN, -1), st.integers(call["max_klen"] + 1, INT32_MAX)),
                  label="klen")
    klen[r, t] = v
    # the first bad entry in row-major order is the one named
    return Broken(call.with_(klen=klen), ValueError, [f"klen[{r}, {t}] = {v}"])


def paged_table(data, call):
    table, klen = call["block_tables"].clone(), call["klen"]
    blocks = call["index_cache"].shape[0]
    r = data.draw(st.integers(0, table.shape[0] - 1), label="r")
    table[r, 0] = data.draw(st.one_of(st.integers(INT32_MIN, -1), st.integers(blocks, INT32_MAX)), label="v")
    klen = klen.clone()
    klen[r, 0] = max(int(klen[r, 0]), 1)  # the row reads block 0 of its table
    return Broken(call.with_(block_tables=table, klen=klen), ValueError,
                  [f"= {int(table[r, 0])}", "outside the cache"])


def ragged_range(data, call):
    ks, ke = call["ks"].clone(), call["ke"].clone()
    n = call["k_codes"].shape[0]
    t = data.draw(st.integers(0, ks.shape[0] - 1), label="t")
    how = data.draw(st.sampled_from(["ks below 0", "ke below ks", "ke beyond N"]), label="how")
    if how == "ks below 0":
        ks[t] = data.draw(st.integers(INT32_MIN, -1), label="ks")
    elif how == "ke below ks":
        ke[t] = int(ks[t]) - data.draw(st.integers(1, 5), label="by")
    else:
        ke[t] = data.draw(st.integers(n + 1, INT32_MAX), label="ke")
    bad = (ks < 0) | (ke < ks) | (ke > n) | (ke.long() - ks.long() > call["max_width"])
    first = int(bad.int().argmax())
    return Broken(call.with_(ks=ks, ke=ke), ValueError,
                  [f"row {first}: ks = {int(ks[first])}, ke = {int(ke[first])}"])


# ----------------------------------------------------------------------------------------------
# the entry points
# ----------------------------------------------------------------------------------------------


@dataclass
class Spec:
    id: str
    fn: str  # "module:function", imported when the case runs
    build: Callable[[], B.Call]
    tensors: dict  # name -> allowed dtypes (dtype / type / device breakages)
    shaped: tuple = ()  # tensors whose length the message must blame on them
    host: list = field(default_factory=list)  # scalar breakages any implementation rejects on the host
    values: list = field(default_factory=list)  # device-value breakages (references and twins)

    def resolve(self):
        module, name = self.fn.split(":")
        return getattr(importlib.import_module(module), name)


PREFILL_T = dict(projected_kv=(torch.float32,), state_cache=(torch.float32,), cu_seqlens_q=(I32,),
                 context_lens=(I32,), state_block_idx=(I32,), cu_compressed=(I32,))
DECODE_T = dict(projected_kv=(torch.float32,), state_cache=(torch.float32,), context_lens=(I32,),
                state_block_idx=(I32,))
STORE_T = dict(norm_weight=(torch.bfloat16, torch.float32), cos=(torch.float32,), sin=(torch.float32,),
               positions=INDEX, slot_mapping=INDEX, kv_cache=(torch.uint8,))
PREFILL_VALUES = [slot_beyond_ring, prefill_context_below_chunk, prefill_shared_slot, prefill_cu_compressed,
                  prefill_cu_seqlens]
DECODE_VALUES = [slot_beyond_ring, decode_context, decode_too_many_tokens, decode_non_adjacent]
STORE_VALUES = [slot_beyond_cache, position_beyond_table]
MAX_Q_HOST = [not_int("max_seqlen_q"), int_outside("max_seqlen_q", st.integers(-5, 0)),
              int_outside("max_seqlen_q", st.integers(4, 1000), "max_seqlen_q={v} needs at least")]
STORE_HOST = [bad_fmt, bad_eps, bad_rope_dim, not_bool("interleaved")]


def _family(op, ref_mod, ref, twin, wrap_mod, wrapper, **spec):
    values = spec.pop("values", [])
    out = []
    for impl, mod, fn in (("ref", ref_mod, ref), ("twin", ref_mod, twin), ("wrapper", wrap_mod, wrapper)):
        if fn is None:
            continue
        out.append(Spec(f"{op}_{impl}", f"{mod}:{fn}", values=values if impl != "wrapper" else [], **spec))
    return out


SPECS = [
    *_family("compress_prefill", "reference.compress", "compress_prefill_ref", "compress_prefill_torch",
             "tilelang_ops.compress", "compress_prefill", build=B.prefill_call, tensors=PREFILL_T,
             shaped=("context_lens", "state_block_idx", "cu_compressed"),
             host=bad_ratio + [not_int("num_rows", none_ok=True), int_outside("num_rows", st.integers(-5, 3),
                                                                "num_rows={v} is below")],
             values=PREFILL_VALUES),
    *_family("compress_decode", "reference.compress", "compress_decode_ref", "compress_decode_torch",
             "tilelang_ops.compress", "compress_decode", build=B.decode_call, tensors=DECODE_T,
             shaped=("context_lens", "state_block_idx"), host=bad_ratio + MAX_Q_HOST, values=DECODE_VALUES),
    *_family("compress_store_prefill", "reference.compress_store", "compress_store_prefill_ref",
             "compress_store_prefill_torch", "tilelang_ops.compress_store", "compress_store_prefill",
             build=B.compress_store_prefill_call, tensors={**PREFILL_T, **STORE_T},
             shaped=("positions", "slot_mapping", "out_norm", "norm_weight", "sin"),
             host=bad_ratio + STORE_HOST + [
                 not_int("num_rows", none_ok=True),
                 int_outside("num_rows", st.integers(-5, 100).filter(lambda v: v != 5), "num_rows={v}")],
             values=PREFILL_VALUES + STORE_VALUES),
    *_family("compress_store_decode", "reference.compress_store", "compress_store_decode_ref",
             "compress_store_decode_torch", "tilelang_ops.compress_store", "compress_store_decode",
             build=B.compress_store_decode_call, tensors={**DECODE_T, **STORE_T},
             shaped=("positions", "slot_mapping", "out_norm", "norm_weight", "sin"),
             host=bad_ratio + MAX_Q_HOST + STORE_HOST, values=DECODE_VALUES + STORE_VALUES),
    *_family("store", "reference.kv_store", "norm_rope_hadamard_cast_store_ref",
             "norm_rope_hadamard_cast_store_torch", "tilelang_ops.kv_store", "norm_rope_hadamard_cast_store",
             build=B.store_call, tensors=dict(kv=(torch.bfloat16,), **STORE_T),
             shaped=("positions", "slot_mapping", "out_norm", "norm_weight", "sin"),
             host=STORE_HOST + [not_bool("hadamard")], values=STORE_VALUES),
    *_family("topk", "reference.topk", "topk_ref", "topk_torch", "tilelang_ops.topk", "topk",
             build=B.topk_call, tensors=dict(scores=(torch.float32, torch.bfloat16), end=(I32,)),
             shaped=("end",), host=[not_int("k"), int_outside("k", st.integers(-5, 0)),
                                    int_outside("k", st.integers(4097, 10**6), "got {v}")],
             values=[end_beyond_row]),
    *_family("block_max", "reference.topk", "block_max_scores_ref", None, "tilelang_ops.topk",
             "block_max_scores", build=B.block_max_call,
             tensors=dict(scores=(torch.float32, torch.bfloat16), end=(I32,)), shaped=("end",),
             host=[not_int("block_size"), int_outside("block_size", st.integers(-5, 0))],
             values=[end_beyond_row]),
    *_family("restore", "reference.topk", "restore_candidate_indices_ref_", None, "tilelang_ops.topk",
             "restore_candidate_indices_", build=B.restore_call,
             tensors=dict(index=(I32,), candidate_blocks=(I32,)),
             host=[not_int("block_size"), int_outside("block_size", st.integers(-5, 0))],
             values=[restore_index]),
    *_family("convert", "reference.topk", "convert_kv_index_ref_", None, "tilelang_ops.topk",
             "convert_kv_index_", build=B.convert_call,
             tensors=dict(index=(I32,), valid_lens=(I32,), block_tables=(I32,)),
             host=[not_int("block_size_c"), int_outside("block_size_c", st.integers(-5, 0))],
             values=[convert_valid_lens, convert_index]),
    *_family("topk_to_slots", "reference.topk", "topk_to_slots_ref", None, "tilelang_ops.topk",
             "topk_to_slots", build=B.topk_to_slots_call,
             tensors=dict(scores=(torch.float32, torch.bfloat16), end=(I32,), block_tables=(I32,)),
             shaped=("end",), host=[not_int("k"), not_int("block_size_c"),
                                    int_outside("block_size_c", st.integers(-5, 0))],
             values=[end_beyond_row, slots_short_table, slots_unallocated]),
    *_family("gather_rows", "reference.gather_rows", "gather_rows_ref", "gather_rows_torch",
             "tilelang_ops.gather_rows", "gather_rows", build=lambda: OP_CASES["gather_rows"].call("cpu"),
             tensors=dict(x=(torch.bfloat16,), index=(I32,)), values=[gather_index]),
    *_family("quantize_index_rows", "reference.index_logits", "quantize_index_rows_ref",
             "quantize_index_rows_torch", "tilelang_ops.index_logits", "quantize_index_rows",
             build=lambda: OP_CASES["quantize_index_rows"].call("cpu"), tensors=dict(x=(torch.bfloat16,))),
    *_family("paged_index_logits", "reference.index_logits", "paged_index_logits_ref",
             "paged_index_logits_torch", "tilelang_ops.index_logits", "paged_index_logits",
             build=lambda: OP_CASES["paged_index_logits_out"].call("cpu"),
             tensors=dict(q_codes=(torch.uint8,), q_scales=(torch.uint8,), weights=(torch.float32,),
                          index_cache=(torch.uint8,), block_tables=(I32,), klen=(I32,),
                          out=(torch.float32,)),
             host=[not_int("max_klen"), not_bool("clean")], values=[paged_klen, paged_table]),
    *_family("ragged_index_logits", "reference.index_logits", "ragged_index_logits_ref",
             "ragged_index_logits_torch", "tilelang_ops.index_logits", "ragged_index_logits",
             build=lambda: OP_CASES["ragged_index_logits_out"].call("cpu"),
             tensors=dict(q_codes=(torch.uint8,), q_scales=(torch.uint8,), weights=(torch.float32,),
                          k_codes=(torch.uint8,), k_scales=(torch.uint8,), ks=(I32,), ke=(I32,),
                          out=(torch.float32,)),
             shaped=("ks", "ke"), host=[not_int("max_width"), not_bool("clean")], values=[ragged_range]),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
@SETTINGS
@given(data=st.data())
def test_malformed_call_raises_and_writes_nothing(spec: Spec, data):
    call = spec.build()
    # a device mismatch needs two tensors read (a single input has no other device to differ from)
    apart = len([n for n in spec.tensors if n not in call.writes]) > 1
    kinds = ["dtype", "type"] + ["device"] * apart + (["length"] if spec.shaped else []) \
        + ["host"] * bool(spec.host) + ["value"] * bool(spec.values)
    kind = data.draw(st.sampled_from(kinds), label="kind")
    if kind == "dtype":
        broken = break_dtype(data, call, spec.tensors)
    elif kind == "type":
        broken = break_type(data, call, spec.tensors)
    elif kind == "device":
        broken = break_device(data, call, spec.tensors)
    elif kind == "length":
        broken = break_length(data, call, spec.shaped)
    else:
        breaker = data.draw(st.sampled_from(spec.host if kind == "host" else spec.values), label="breaker")
        broken = breaker(data, call)
    check(spec.resolve(), broken)


# ----------------------------------------------------------------------------------------------
# metadata helpers, cache formats, the metadata builder, the diff and benchmark input builders
# ----------------------------------------------------------------------------------------------

ANY_SCALAR = st.one_of(st.integers(-10**6, 10**6), NOT_INT, st.booleans())


def _expect_scalar(name, v, lo):
    """TypeError for a non-int, ValueError for an int below ``lo``; None when ``v`` is acceptable."""
    if isinstance(v, bool) or not isinstance(v, int):
        return TypeError, [f"{name} must be an int", shown(v)]
    if v < lo:
        return ValueError, [f"{name}={v}"]
    return None


def _ratio_expect(r, *, state=False):
    if isinstance(r, bool) or not isinstance(r, int):
        return TypeError, ["compress_ratio must be an int", shown(r)]
    if r not in (1, 2):
        return ValueError, [f"compress_ratio={r} is not supported"]
    if state and r == 1:
        return ValueError, ["compress_ratio=1 keeps no compression state"]
    return None


def _run_helper(fn, args, expect):
    """``expect`` None: the call must succeed; else (exc, needles) as in ``check``."""
    if expect is None:
        fn(*args)
        return
    check(lambda: fn(*args), Broken(B.Call({}), *expect))


@SETTINGS
@given(r=st.one_of(st.sampled_from([1, 2]), ANY_SCALAR), mbt=st.one_of(st.integers(0, 10), ANY_SCALAR),
       dim=st.one_of(st.integers(1, 1024), ANY_SCALAR))
def test_sizing_helpers(r, mbt, dim):
    expect = _ratio_expect(r) or _expect_scalar("max_backtracking_tokens", mbt, 0)
    _run_helper(compress_state_ring_size, (r, mbt), expect)
    _run_helper(compress_state_bytes, (r, dim, mbt), expect or _expect_scalar("head_dim", dim, 1))
    _run_helper(needs_index_state, (r,), _ratio_expect(r))
    _run_helper(check_compress_ratio, (r,), _ratio_expect(r))


@SETTINGS
@given(ring=st.one_of(st.integers(-3, 12), ANY_SCALAR), r=st.one_of(st.just(2), ANY_SCALAR),
       q=st.one_of(st.integers(-2, 8), ANY_SCALAR))
def test_ring_capacity(ring, r, q):
    expect = _expect_scalar("ring_size", ring, 0) or _ratio_expect(r, state=True) \
        or _expect_scalar("max_seqlen_q", q, 1)
    if expect is None and ring < r + q - 1:
        expect = ValueError, [f"state ring of {ring} slots is too small", f"max_seqlen_q={q}"]
    _run_helper(check_ring_capacity, (ring, r, q), expect)
    if expect is None:
        assert min_ring_size(r, q) <= ring


@SETTINGS
@given(data=st.data())
def test_validate_map_refines(data):
    n = data.draw(st.integers(1, 6), label="layers")
    fine = list(range(n))  # every layer its own source refines any map
    coarse = [0] * n
    kind = data.draw(st.sampled_from(["not_sequence", "entry_type", "entry_range", "length", "crosses"]))
    which = data.draw(st.sampled_from(["fine", "coarse"]), label="which")
    maps = dict(fine=fine, coarse=coarse)
    name = f"{which}_map"
    if kind == "not_sequence":
        v = data.draw(st.one_of(st.none(), st.integers(), st.floats(), st.text(min_size=1, max_size=3)))
        maps[which] = v
        expect = TypeError, [f"{name} must be a sequence of ints", shown(v)]
    elif kind == "entry_type":
        i = data.draw(st.integers(0, n - 1))
        v = data.draw(st.one_of(st.floats(), st.text(max_size=2), st.none(), st.booleans()))
        maps[which] = maps[which][:i] + [v] + maps[which][i + 1:]
        expect = TypeError, [f"{name}[{i}] must be an int", shown(v)]
    elif kind == "entry_range":
        i = data.draw(st.integers(0, n - 1))
        v = data.draw(st.one_of(st.integers(-10**9, -1), st.integers(n, 10**9)))
        maps[which] = maps[which][:i] + [v] + maps[which][i + 1:]
        expect = ValueError, [f"{name}[{i}]={v} is outside"]
    elif kind == "length":
        maps[which] = maps[which] + [0]
        expect = ValueError, [f"{name} has {n + 1}"]
    else:
        if n < 2:
            return
        maps = dict(fine=[0] * n, coarse=list(range(n)))  # fine groups layers the coarse map keeps apart
        expect = ValueError, ["fine_map[1]=0 but coarse_map[0]=0 != coarse_map[1]=1"]
    _run_helper(validate_map_refines, ("fine_map", maps["fine"], "coarse_map", maps["coarse"]), expect)


SEQ_FIELDS = ("seqlen_q", "seqlen_k", "state_slot")


@SETTINGS
@given(data=st.data())
def test_prepare_tensor_input(data):
    seqs = [SeqMetadata(5, 9, [0], 1), SeqMetadata(3, 3, [1], 0), SeqMetadata(1, 4, [2], 2)]
    kw = dict(is_prefill=data.draw(st.booleans(), label="prefill"), block_size=16, compress_ratios=(2,))
    b = data.draw(st.integers(0, 2), label="request")
    kind = data.draw(st.sampled_from(["field_type", "field_negative", "q_above_k", "table_short",
                                      "table_negative", "table_type", "shared_slot", "block_size", "ratios",
                                      "ratios_type", "is_prefill", "seqs_type"]), label="kind")
    s = seqs[b]
    if kind == "field_type":
        f = data.draw(st.sampled_from(SEQ_FIELDS))
        v = data.draw(NOT_INT.filter(lambda x: not isinstance(x, torch.Tensor)) | st.booleans())
        seqs[b] = SeqMetadata(**{**s.__dict__, f: v})
        expect = TypeError, [f"seqs[{b}].{f} must be an int", shown(v)]
    elif kind == "field_negative":
        f = data.draw(st.sampled_from(SEQ_FIELDS))
        v = data.draw(st.integers(-10**6, -1))
        seqs[b] = SeqMetadata(**{**s.__dict__, f: v})
        expect = ValueError, [f"seqs[{b}]", f"{f}={v}"]
    elif kind == "q_above_k":
        q = s.seqlen_k + data.draw(st.integers(1, 100))
        seqs[b] = SeqMetadata(q, s.seqlen_k, s.block_table, s.state_slot)
        expect = ValueError, [f"seqs[{b}]: seqlen_q={q} > seqlen_k={s.seqlen_k}"]
    elif kind == "table_short":
        k = data.draw(st.integers(17, 1000))
        seqs[b] = SeqMetadata(min(s.seqlen_q, k), k, s.block_table, s.state_slot)
        expect = ValueError, [f"seqs[{b}]: block_table has 1 blocks", f"seqlen_k={k}"]
    elif kind == "table_negative":
        v = data.draw(st.integers(-10**6, -1))
        seqs[b] = SeqMetadata(s.seqlen_q, s.seqlen_k, [v], s.state_slot)
        expect = ValueError, [f"seqs[{b}].block_table[0]={v}"]
    elif kind == "table_type":
        v = data.draw(st.one_of(st.none(), st.integers(), st.text(min_size=1, max_size=2)))
        seqs[b] = SeqMetadata(s.seqlen_q, s.seqlen_k, v, s.state_slot)
        expect = TypeError, [f"seqs[{b}].block_table", shown(v)]
    elif kind == "shared_slot":
        other = (b + 1) % 3
        seqs[other] = SeqMetadata(**{**seqs[other].__dict__, "state_slot": s.state_slot})
        lo, hi = sorted((b, other))
        expect = ValueError, [f"seqs[{lo}] and seqs[{hi}] share state_slot={s.state_slot}"]
    elif kind == "block_size":
        v = data.draw(st.one_of(st.integers(-100, 0), st.integers(1, 99).filter(lambda x: x % 2), NOT_INT))
        kw["block_size"] = v
        expect = (TypeError, ["block_size must be an int", shown(v)]) if not isinstance(v, int) else \
            (ValueError, [f"block_size={v}"])
    elif kind == "ratios":
        v = data.draw(RATIO_INTS)
        kw["compress_ratios"] = (2, v)
        expect = ValueError, [f"compress_ratio={v} is not supported"]
    elif kind == "ratios_type":
        v = data.draw(st.one_of(st.integers(), st.none(), st.floats()))
        kw["compress_ratios"] = v
        expect = TypeError, ["compress_ratios must be a sequence of ints", shown(v)]
    elif kind == "is_prefill":
        v = data.draw(NOT_BOOL)
        kw["is_prefill"] = v
        expect = TypeError, ["is_prefill must be a bool", shown(v)]
    else:
        v = data.draw(st.one_of(st.none(), st.integers(), st.text(min_size=1, max_size=2)))
        seqs = v
        expect = TypeError, ["seqs", shown(v)]
    check(lambda: prepare_tensor_input(seqs, **kw), Broken(B.Call({}), *expect))
    # the benchmark input builder takes the same seqs and validates them before any CUDA tensor exists
    from tilelang_ops.testing.compress_store import bench_inputs

    if kind in ("field_type", "field_negative", "q_above_k", "table_negative", "table_type", "shared_slot"):
        check(lambda: bench_inputs(seqs, kw["is_prefill"], FP8_MAIN_KV_FORMAT),
              Broken(B.Call({}), *expect))


FORMAT_FIELDS = dict(name="x", dim=512, data_dtype="e4m3", scale_dtype="ue8m0", group_size=32)


@SETTINGS
@given(data=st.data())
def test_cache_formats(data):
    fmt = data.draw(st.sampled_from([FP8_MAIN_KV_FORMAT, FP4_INDEX_KV_FORMAT]), label="fmt")
    kind = data.draw(st.sampled_from(["block_bytes", "rows_per_block", "offset", "slot_location", "construct",
                                      "dequantize"]), label="kind")
    if kind == "block_bytes":
        v = data.draw(ANY_SCALAR)
        _run_helper(fmt.block_bytes, (v,), _expect_scalar("rows", v, 1))
    elif kind == "rows_per_block":
        v = data.draw(ANY_SCALAR)
        expect = _expect_scalar("block_width", v, -10**9)
        if expect is None and (v <= 0 or v % fmt.row_bytes):
            expect = ValueError, [f"cache block width {v} B"]
        _run_helper(fmt.rows_per_block, (v,), expect)
    elif kind == "offset":
        row, rows = data.draw(ANY_SCALAR), data.draw(st.one_of(st.integers(-3, 70), NOT_INT))
        expect = _expect_scalar("rows", rows, 1) or _expect_scalar("row", row, -10**9)
        if expect is None and not 0 <= row < rows:
            expect = ValueError, [f"row={row}"]
        _run_helper(fmt.data_offset, (row, rows), expect)
        _run_helper(fmt.scale_offset, (row, rows), expect)
    elif kind == "slot_location":
        slot, rpb = data.draw(ANY_SCALAR), data.draw(st.one_of(st.integers(-3, 70), NOT_INT))
        expect = _expect_scalar("slot", slot, 0) or _expect_scalar("rows_per_block", rpb, 1)
        _run_helper(slot_location, (slot, rpb), expect)
    elif kind == "construct":
        f = data.draw(st.sampled_from(["dim", "data_dtype", "scale_dtype", "group_size"]))
        text = st.one_of(st.text(max_size=4), st.none())
        v = data.draw({"dim": st.one_of(st.integers(-600, 0), NOT_INT),
                       "data_dtype": text.filter(lambda d: d not in ("e4m3", "e2m1", "bf16")),
                       "scale_dtype": st.one_of(st.sampled_from(["e4m3", "e2m1"]), text).filter(
                           lambda d: d != "ue8m0"),
                       "group_size": st.one_of(st.integers(-4, 0), NOT_INT,
                                               st.integers(1, 600).filter(lambda g: 512 % g))}[f])
        fields = {**FORMAT_FIELDS, f: v}
        exc = TypeError if f in ("dim", "group_size") and not isinstance(v, int) else ValueError
        check(lambda: KVCacheFormat(**fields), Broken(B.Call({}), exc, [f"x: {f}", shown(v)]))
    else:
        rpb = 4
        cache = torch.full((2, fmt.block_bytes(rpb)), B.CANARY, dtype=torch.uint8)
        v = data.draw(st.one_of(st.integers(-10**12, -1), st.integers(2 * rpb, 10**12)))
        call = B.Call(dict(kv_cache=cache, slots=[0, v], fmt=fmt), {}, ("kv_cache",))
        check(dequantize_rows, Broken(call, ValueError, [f"slots[1]={v}"]))


@pytest.mark.parametrize("op", ["compress", "kv_store", "compress_store", "topk"])
@SETTINGS
@given(case=st.one_of(st.text(max_size=12), st.none(), st.integers()))
def test_diff_input_builders(op, case):
    mod = importlib.import_module(f"tilelang_ops.diffcases.{op}")
    if case in mod.CASES:
        return
    check(mod.self_check, Broken(B.Call(dict(case_id=case)), ValueError, [f"case_id={case!r}"]))
