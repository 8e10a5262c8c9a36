"""Argument checks of the compress operator (SPEC 1.2-1.4), shared by the reference and the kernel.

``check_*_args`` read only dtypes, shapes, devices and Python ints (no device sync); they run first in
both the reference and the kernel wrapper, so bad input raises before anything is written.
``check_*_values`` read the metadata tensors (a device sync); the references always run them, the
wrappers only under ``metadata.checks.debug_checks_enabled()``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from metadata.cache_engine import check_compress_ratio, check_ring_capacity, check_state_ratio
from metadata.checks import check_int, check_same_device, check_tensor, describe, is_int
from metadata.gather_rows_args import c1_prefill_rows, c1_reverse_index


@dataclass(frozen=True)
class CompressDims:
    num_tokens: int
    dim: int  # D, the latent width; projected_kv is [num_tokens, 2 * D]
    num_slots: int
    ring: int  # S
    num_reqs: int  # prefill: requests; decode: query tokens


def _check_common(projected_kv, state_cache, compress_ratio):
    check_state_ratio(compress_ratio)
    check_tensor("projected_kv", projected_kv, dtype=torch.float32, ndim=2)
    check_tensor("state_cache", state_cache, dtype=torch.float32, ndim=4, contiguous=True)
    num_tokens, two_d = projected_kv.shape
    num_slots, ring, two, dim = state_cache.shape
    if two != 2:
        raise ValueError(f"state_cache must be [num_state_slots, S, 2, D] (axis 2: score, latent), got "
                         f"shape {tuple(state_cache.shape)}")
    if dim < 1 or two_d != 2 * dim:
        raise ValueError(f"projected_kv must be [num_tokens, 2 * D] with D={dim} from state_cache "
                         f"{tuple(state_cache.shape)}, got {tuple(projected_kv.shape)}")
    return num_tokens, dim, num_slots, ring


def _check_count(name: str, t, n: int, source: str, source_t, what: str) -> None:
    """A 1-D int32 tensor of ``n`` entries, ``n`` being what tensor ``source`` implies (``what``); the
    message names both."""
    check_tensor(name, t, dtype=torch.int32, ndim=1)
    if t.shape[0] != n:
        raise ValueError(f"{name} has {t.shape[0]} entries but {source} of shape {tuple(source_t.shape)} "
                         f"({what}) needs {n}")


def check_prefill_args(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                       cu_compressed, compress_ratio, num_rows=None) -> CompressDims:
    """Host checks of ``compress_prefill``; returns the dimensions."""
    num_tokens, dim, num_slots, ring = _check_common(projected_kv, state_cache, compress_ratio)
    check_tensor("cu_seqlens_q", cu_seqlens_q, dtype=torch.int32, ndim=1)
    num_reqs = cu_seqlens_q.shape[0] - 1
    if num_reqs < 0:
        raise ValueError("cu_seqlens_q must hold num_reqs + 1 >= 1 offsets, got an empty tensor")
    what = f"num_reqs={num_reqs}"
    _check_count("context_lens", context_lens, num_reqs, "cu_seqlens_q", cu_seqlens_q, what)
    _check_count("state_block_idx", state_block_idx, num_reqs, "cu_seqlens_q", cu_seqlens_q, what)
    _check_count("cu_compressed", cu_compressed, num_reqs + 1, "cu_seqlens_q", cu_seqlens_q, what)
    check_same_device(projected_kv=projected_kv, state_cache=state_cache, cu_seqlens_q=cu_seqlens_q,
                      context_lens=context_lens, state_block_idx=state_block_idx,
                      cu_compressed=cu_compressed)
    # A prefill chunk reads at most r - 1 earlier inputs from the ring and a following decode step
    # needs r of them, so the ring must hold at least one whole group (max_seqlen_q = 1).
    check_ring_capacity(ring, compress_ratio, 1)
    if num_rows is not None:
        num_rows = check_int("num_rows", num_rows)
        if num_rows < num_reqs:
            raise ValueError(f"num_rows={num_rows} is below num_reqs={num_reqs} (every request "
                             f"reserves at least one row)")
    return CompressDims(num_tokens, dim, num_slots, ring, num_reqs)


def check_decode_args(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                      compress_ratio) -> CompressDims:
    """Host checks of ``compress_decode`` (incl. the capacity rule); returns the dimensions."""
    num_tokens, dim, num_slots, ring = _check_common(projected_kv, state_cache, compress_ratio)
    what = "one entry per query token"
    _check_count("context_lens", context_lens, num_tokens, "projected_kv", projected_kv, what)
    _check_count("state_block_idx", state_block_idx, num_tokens, "projected_kv", projected_kv, what)
    check_same_device(projected_kv=projected_kv, state_cache=state_cache, context_lens=context_lens,
                      state_block_idx=state_block_idx)
    check_int("max_seqlen_q", max_seqlen_q, lo=1)
    check_ring_capacity(ring, compress_ratio, max_seqlen_q)
    return CompressDims(num_tokens, dim, num_slots, ring, num_tokens)


def prefill_row_counts(cu_seqlens_q: list[int], context_lens: list[int], compress_ratio: int):
    """Per request: (chunk start s, completed rows nc); host lists in, host lists out."""
    starts, ncs = [], []
    for i, e in enumerate(context_lens):
        s = e - (cu_seqlens_q[i + 1] - cu_seqlens_q[i])
        starts.append(s)
        ncs.append(e // compress_ratio - s // compress_ratio)
    return starts, ncs


def check_prefill_values(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                         cu_compressed, compress_ratio, num_rows=None) -> int:
    """Metadata consistency of a prefill batch (reads device values); returns the output row count."""
    num_tokens = projected_kv.shape[0]
    num_slots = state_cache.shape[0]
    cu_q = cu_seqlens_q.tolist()
    ctx = context_lens.tolist()
    slots = state_block_idx.tolist()
    cu_c = cu_compressed.tolist()
    if cu_q[0] != 0 or cu_q[-1] != num_tokens or any(a > b for a, b in zip(cu_q[:-1], cu_q[1:], strict=True)):
        raise ValueError(f"cu_seqlens_q must rise from 0 to num_tokens={num_tokens}, got {cu_q}")
    owner = {}
    for i, (e, slot) in enumerate(zip(ctx, slots, strict=True)):
        length = cu_q[i + 1] - cu_q[i]
        if e < length:
            raise ValueError(f"request {i}: context_lens={e} is below its chunk length {length}")
        if not 0 <= slot < num_slots:
            raise ValueError(f"request {i}: state_block_idx={slot} is outside [0, {num_slots})")
        if length > 0:  # an empty chunk neither reads nor writes its ring
            if slot in owner:
                raise ValueError(f"requests {owner[slot]} and {i} share state slot {slot} "
                                 f"(state_block_idx[{owner[slot]}] = state_block_idx[{i}] = {slot}); "
                                 f"two chunks would write one ring")
            owner[slot] = i
    _, ncs = prefill_row_counts(cu_q, ctx, compress_ratio)
    want = [0]
    for nc in ncs:
        want.append(want[-1] + max(1, nc))
    if cu_c != want:
        raise ValueError(f"cu_compressed={cu_c} does not match max(1, nc) rows per request "
                         f"(expected {want} for compress_ratio={compress_ratio})")
    if num_rows is not None and num_rows != want[-1]:
        raise ValueError(f"num_rows={num_rows} but cu_compressed[-1]={want[-1]}")
    return want[-1]


def check_decode_values(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q) -> None:
    """Metadata consistency of a decode step (reads device values).

    Tokens that share a slot must be adjacent with consecutive positions, at most ``max_seqlen_q``
    of them: that is what a draft-verification step looks like, and it is what lets a kernel take
    a group's in-step inputs from neighbouring tokens instead of racing on the ring.
    """
    num_slots = state_cache.shape[0]
    ctx = context_lens.tolist()
    slots = state_block_idx.tolist()
    seen = set()
    run = 0
    for i, (c, slot) in enumerate(zip(ctx, slots, strict=True)):
        if c < 1:
            raise ValueError(f"token {i}: context_lens={c} must be >= 1 (position + 1)")
        if not 0 <= slot < num_slots:
            raise ValueError(f"token {i}: state_block_idx={slot} is outside [0, {num_slots})")
        if i > 0 and slot == slots[i - 1]:
            if c != ctx[i - 1] + 1:
                raise ValueError(f"tokens {i - 1} and {i} share state_block_idx={slot} but have context_lens "
                                 f"{ctx[i - 1]} and {c} (must be consecutive)")
            run += 1
        else:
            if slot in seen:
                raise ValueError(f"token {i}: state_block_idx={slot} was used by an earlier, non-adjacent "
                                 f"token")
            seen.add(slot)
            run = 1
        if run > max_seqlen_q:
            raise ValueError(f"state_block_idx={slot} has more than max_seqlen_q={max_seqlen_q} tokens in "
                             f"this step")


def _field(metadata, name: str):
    try:
        return getattr(metadata, name)
    except AttributeError:
        raise TypeError(f"metadata must carry {name} (an InputMetadata, duck-typed), got "
                        f"{type(metadata).__name__} without it") from None


def _metadata_rows(metadata, compress_ratio: int):
    """The builder's host row count ``num_rows[str(r)]`` when present (saves a device sync)."""
    num = getattr(metadata, "num_rows", None)
    num = num.get(str(compress_ratio)) if isinstance(num, dict) else None
    return num if is_int(num) else None


def dispatch_compress(prefill_fn, decode_fn, gather_fn, projected_kv, state_cache, metadata,
                      compress_ratio: int, is_prefill: bool, *, compress_overlap: bool = False,
                      use_ape: bool = False):
    """The engine's ``compress`` entry point, shared by the reference and the kernel wrapper.

    C1 passes its BF16 input through (no state): under context parallelism (the metadata carries
    ``mirror_cp_reverse_index``) as ``gather_fn(projected_kv, mirror_cp_reverse_index)``, the batch's
    order (SPEC 6), and a prefill request with no new token gets its zero placeholder row
    (``c1_prefill_rows``). C2 calls ``prefill_fn`` or ``decode_fn`` with the fields of ``metadata`` (an
    ``InputMetadata``, duck-typed: ``cu_seqlens_q, context_lens, state_block_idx, max_seqlen_q`` and
    ``cu_compressed[str(r)]``, optionally ``num_rows[str(r)]``).
    """
    index = c1_reverse_index(projected_kv, metadata, compress_ratio)
    check_compress_ratio(compress_ratio, compress_overlap=compress_overlap, use_ape=use_ape)
    if not isinstance(is_prefill, bool):
        raise TypeError(f"is_prefill must be a bool, got {describe(is_prefill)}")
    if compress_ratio == 1:
        check_tensor("projected_kv", projected_kv, dtype=torch.bfloat16, ndim=2)
        kv = projected_kv if index is None else gather_fn(projected_kv, index)
        return c1_prefill_rows(kv, metadata, is_prefill)
    if is_prefill:
        cu_compressed = _field(metadata, "cu_compressed")
        key = str(compress_ratio)
        if not isinstance(cu_compressed, dict) or key not in cu_compressed:
            have = list(cu_compressed) if isinstance(cu_compressed, dict) else type(cu_compressed).__name__
            raise ValueError(f"metadata.cu_compressed has no entry {key!r} for "
                             f"compress_ratio={compress_ratio} (it holds {have})")
        return prefill_fn(projected_kv, state_cache, _field(metadata, "cu_seqlens_q"),
                          _field(metadata, "context_lens"), _field(metadata, "state_block_idx"),
                          cu_compressed[key], compress_ratio,
                          num_rows=_metadata_rows(metadata, compress_ratio))
    max_seqlen_q = check_int("metadata.max_seqlen_q", _field(metadata, "max_seqlen_q"))
    return decode_fn(projected_kv, state_cache, _field(metadata, "context_lens"),
                     _field(metadata, "state_block_idx"), max_seqlen_q, compress_ratio)
