"""Host-side metadata builder: per-step index tensors for compression, store and top-k (SPEC 1.2-1.6).

A Python port, loop by loop, of the engine's C++ metadata builder. The caller describes each request
of a batch with a ``SeqMetadata``; ``prepare_tensor_input`` returns an ``InputMetadata`` of int32 CPU
tensors (move them with ``.to(device)``) that the references and the kernels consume unchanged.

Conventions this module fixes where the SPEC leaves them open:

* ``max_seqlen_q`` is ``max(seqlen_q)`` over the requests in both modes (the flash-attention
  convention in prefill; in decode it is the tokens per request that the ring capacity rule
  ``S >= r + max_seqlen_q - 1`` is checked against). ``max_seqlen_k`` is ``max(seqlen_k)``.
* ``block_tables`` has ``max(1, longest block table)`` columns, padded with -1, in both modes;
  ``block_tables_per_token`` repeats a request's row for each of its query tokens (decode top-k
  addresses are per query row, SPEC 3 ``convert_kv_index_``) and is built in prefill too.
* A decode step needs ``seqlen_q >= 1`` for every request; a prefill request may have
  ``seqlen_q == 0`` (it still reserves one placeholder row per ratio).
* State slots must be distinct within a batch whenever a ratio >= 2 keeps state (two requests writing
  one ring would race); C1-only batches do not check them.
* Ratio-``r`` rows per allocator block ``Bc = block_size // r``; ``block_size % r != 0`` is rejected.
* Context parallelism (``cp_size > 1``, SPEC 6; prefill only): ``mirror_cp_chunks`` cuts each request's
  chunk into ``2 * cp_size`` pieces and rank ``r`` holds pieces ``r`` and ``2 * cp_size - 1 - r``. The
  per-token fields (``total_q``, ``max_seqlen_q``, ``positions``, ``req_idx``, ``cu_seqlens_q``,
  ``block_tables_per_token``, ``slot_mapping_swa``, ``klen``, ``output_idx_offset``) describe the tokens
  this rank holds, each request's in position order. The per-request fields and the per-ratio row fields
  (``cu_compressed``, ``num_compressed``, ``num_rows``, ``compressed_positions``,
  ``slot_mapping_store_ca``) describe the whole batch, equal on every rank to the ``cp_size=1`` values:
  the compressed KV is built from the all-gathered rows in the batch's order (the C1 bypass returns
  every row in that order), and every rank holds all of it. ``mirror_cp_reverse_index`` maps the
  gathered rows back to that order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import torch

from metadata.cache_engine import check_compress_ratio
from metadata.checks import check_int, describe

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class SeqMetadata:
    """One request of a step: query positions ``[seqlen_k - seqlen_q, seqlen_k)``."""

    seqlen_q: int
    """Query tokens of this step (chunk length in prefill, 1..max_seqlen_q in decode)."""
    seqlen_k: int
    """Context length after this step, ``e`` (the step covers positions ``[e - seqlen_q, e)``)."""
    block_table: Sequence[int]
    """Physical allocator block of token positions ``[i * B, (i + 1) * B)`` at index ``i``."""
    state_slot: int
    """The request's compression-state ring slot (first index of ``ca_state``)."""


@dataclass
class InputMetadata:
    """Index tensors of one step; int32 on CPU unless moved. Per-ratio dicts are keyed by ``str(r)``."""

    is_prefill: bool
    """Chunked prefill (True) or decode / speculative verification (False)."""
    block_size: int
    """B: token positions per allocator block."""
    compress_ratios: tuple[int, ...]
    """Ratios the per-ratio dicts hold."""
    num_reqs: int
    """Number of requests."""
    total_q: int
    """``sum(seqlen_q)``: query tokens in the step."""
    max_seqlen_q: int
    """``max(seqlen_q)`` over requests (both modes; under context parallelism, of the rank's tokens)."""
    max_seqlen_k: int
    """``max(seqlen_k)`` over requests."""
    positions: torch.Tensor
    """[total_q] int32: ``positions[i] = seqlen_k - seqlen_q + t`` for token ``t`` of its request (under
    context parallelism: the positions this rank holds, ascending within a request)."""
    req_idx: torch.Tensor
    """[total_q] int32: request index of each query token."""
    cu_seqlens_q: torch.Tensor
    """[num_reqs + 1] int32: ``cu_seqlens_q[b + 1] = cu_seqlens_q[b] + seqlen_q[b]``, starting at 0."""
    seqlens_k: torch.Tensor
    """[num_reqs] int32: ``seqlens_k[b] = seqlen_k[b]`` (e)."""
    context_lens: torch.Tensor
    """Prefill: [num_reqs] int32 ``= seqlen_k``; decode: [total_q] int32 ``= positions + 1``."""
    state_block_idx: torch.Tensor
    """Prefill: [num_reqs] int32 ``= state_slot``; decode: [total_q] int32 ``= state_slot[req_idx]``."""
    block_tables: torch.Tensor
    """[num_reqs, max_blocks] int32: ``block_table[b][i]``, -1 past the request's table."""
    block_tables_per_token: torch.Tensor
    """[total_q, max_blocks] int32: ``block_tables[req_idx[i]]``."""
    slot_mapping_swa: torch.Tensor
    """[total_q] int32: ``block_table[p // B] * B + p % B`` for ``p = positions[i]``."""
    klen: dict[str, torch.Tensor] = field(default_factory=dict)
    """r -> [total_q] int32: ``floor((p + 1) / r)`` completed rows a query at ``p`` may select."""
    cu_compressed: dict[str, torch.Tensor] = field(default_factory=dict)
    """r -> [num_reqs + 1] int32: prefill ``cumsum(max(1, nc))``; decode ``= cu_seqlens_q``."""
    num_compressed: dict[str, torch.Tensor] = field(default_factory=dict)
    """r -> prefill [num_reqs] ``nc = e//r - s//r``; decode [total_q] ``1 if p % r == r - 1 else 0``."""
    num_rows: dict[str, int] = field(default_factory=dict)
    """r -> output rows: prefill ``sum(max(1, nc))``; decode ``total_q``."""
    compressed_positions: dict[str, torch.Tensor] = field(default_factory=dict)
    """r -> [num_rows] int32: ``j * r`` for completed row ``j``; 0 for placeholder/non-completing rows."""
    slot_mapping_store_ca: dict[str, torch.Tensor] = field(default_factory=dict)
    """r -> [num_rows] int32: ``block_table[j // Bc] * Bc + j % Bc`` (``Bc = B // r``); -1 if none."""
    output_idx_offset: dict[str, torch.Tensor] = field(default_factory=dict)
    """r -> [total_q] int32: ``sum(seqlen_k[b'] // r for b' < req_idx[i])`` (prefill gathered-key offset)."""
    cp_size: int = 1
    """Context-parallel ranks the batch is split over (1: none)."""
    cp_rank: int = 0
    """The rank this metadata describes."""
    cp_tokens_per_rank: tuple[int, ...] = ()
    """Tokens each rank holds (rank order; the same on every rank): the all-gather's row counts."""
    mirror_cp_reverse_index: torch.Tensor | None = None
    """[sum(seqlen_q)] int32, or None when ``cp_size`` is 1: for each token of the batch in its original
    order, its row in the all-gathered buffer (rank 0's rows first, each rank's in this builder's order)."""

    def to(self, device: torch.device | str) -> InputMetadata:
        """A copy whose tensors (including those inside the per-ratio dicts) live on ``device``."""
        moved = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                value = value.to(device)
            elif isinstance(value, dict):
                value = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in value.items()}
            moved[f.name] = value
        return InputMetadata(**moved)


def _as_int(name: str, value) -> int:
    return check_int(name, value)


def _check_args(seqs, is_prefill: bool, block_size: int, compress_ratios) -> tuple[int, ...]:
    """Validate everything before building; returns the ratios as a tuple of ints."""
    if not isinstance(is_prefill, bool):
        raise TypeError(f"is_prefill must be a bool, got {describe(is_prefill)}")
    block_size = _as_int("block_size", block_size)
    if block_size <= 0:
        raise ValueError(f"block_size={block_size} must be positive")
    if isinstance(compress_ratios, (str, bytes)) or not hasattr(compress_ratios, "__iter__"):
        raise TypeError(f"compress_ratios must be a sequence of ints, got {describe(compress_ratios)}")
    ratios = tuple(_as_int("compress_ratios entry", r) for r in compress_ratios)
    for r in ratios:
        check_compress_ratio(r)
        if block_size % r:
            raise ValueError(f"block_size={block_size} is not divisible by compress_ratio={r}")
    if len(set(ratios)) != len(ratios):
        raise ValueError(f"compress_ratios={ratios} has duplicates")
    if isinstance(seqs, (str, bytes)) or not hasattr(seqs, "__len__") or not hasattr(seqs, "__getitem__"):
        raise TypeError(f"seqs must be a sequence of SeqMetadata, got {describe(seqs)}")
    if len(seqs) == 0:
        raise ValueError("seqs is empty: a step needs at least one request")

    keeps_state = any(r > 1 for r in ratios)
    slot_owner: dict[int, int] = {}
    for b, seq in enumerate(seqs):
        if not isinstance(seq, SeqMetadata):
            raise TypeError(f"seqs[{b}] must be a SeqMetadata, got {describe(seq)}")
        q = _as_int(f"seqs[{b}].seqlen_q", seq.seqlen_q)
        k = _as_int(f"seqs[{b}].seqlen_k", seq.seqlen_k)
        slot = _as_int(f"seqs[{b}].state_slot", seq.state_slot)
        if isinstance(seq.block_table, (str, bytes)) or not hasattr(seq.block_table, "__iter__"):
            raise TypeError(f"seqs[{b}].block_table must be a sequence of ints, got "
                            f"{describe(seq.block_table)}")
        table = [_as_int(f"seqs[{b}].block_table[{i}]", x) for i, x in enumerate(seq.block_table)]
        if q < 0 or k < 0 or slot < 0:
            raise ValueError(
                f"seqs[{b}]: seqlen_q={q}, seqlen_k={k}, state_slot={slot} must all be >= 0"
            )
        if q > k:
            raise ValueError(f"seqs[{b}]: seqlen_q={q} > seqlen_k={k} (the step would start before 0)")
        if not is_prefill and q == 0:
            raise ValueError(f"seqs[{b}]: seqlen_q=0 in a decode step (each request needs >= 1 token)")
        for i, block in enumerate(table):
            if block < 0:
                raise ValueError(f"seqs[{b}].block_table[{i}]={block} is negative")
            if block * block_size + block_size - 1 > INT32_MAX:
                raise ValueError(
                    f"seqs[{b}].block_table[{i}]={block}: slots of block_size={block_size} "
                    f"overflow int32"
                )
        if len(table) * block_size < k:
            raise ValueError(
                f"seqs[{b}]: block_table has {len(table)} blocks of {block_size} positions "
                f"= {len(table) * block_size} < seqlen_k={k}"
            )
        if keeps_state:
            if slot in slot_owner:
                raise ValueError(
                    f"seqs[{slot_owner[slot]}] and seqs[{b}] share state_slot={slot}; "
                    f"each request needs its own ring"
                )
            slot_owner[slot] = b
    return ratios


def _check_cp(cp_size, cp_rank, is_prefill: bool) -> tuple[int, int]:
    cp_size, cp_rank = _as_int("cp_size", cp_size), _as_int("cp_rank", cp_rank)
    if cp_size < 1:
        raise ValueError(f"cp_size={cp_size} must be >= 1 (1: no context parallelism)")
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank={cp_rank} must be in [0, cp_size={cp_size})")
    if cp_size > 1 and not is_prefill:
        raise ValueError(f"cp_size={cp_size} with is_prefill=False: the mirror split cuts prefill chunks "
                         f"(SPEC 6); build decode metadata with cp_size=1")
    return cp_size, cp_rank


def mirror_cp_chunks(length: int, cp_size: int) -> list[tuple[int, int]]:
    """The mirror split of ``range(length)``: ``2 * cp_size`` consecutive ``[lo, hi)`` pieces of
    near-equal length, the first ``length % (2 * cp_size)`` one longer (later pieces may be empty)."""
    length = _as_int("length", length)
    if length < 0:
        raise ValueError(f"length={length} must be >= 0")
    cp_size, _ = _check_cp(cp_size, 0, True)
    pieces = 2 * cp_size
    base, longer = divmod(length, pieces)
    chunks, lo = [], 0
    for c in range(pieces):
        hi = lo + base + (1 if c < longer else 0)
        chunks.append((lo, hi))
        lo = hi
    return chunks


def mirror_cp_positions(start: int, end: int, cp_size: int, cp_rank: int) -> list[int]:
    """Positions of the chunk ``[start, end)`` that rank ``cp_rank`` holds: pieces ``cp_rank`` and
    ``2 * cp_size - 1 - cp_rank`` of ``mirror_cp_chunks``, ascending (all of them when cp_size is 1)."""
    start, end = _as_int("start", start), _as_int("end", end)
    if not 0 <= start <= end:
        raise ValueError(f"start={start}, end={end} must satisfy 0 <= start <= end")
    cp_size, cp_rank = _check_cp(cp_size, cp_rank, True)
    chunks = mirror_cp_chunks(end - start, cp_size)
    held: list[int] = []
    for c in (cp_rank, 2 * cp_size - 1 - cp_rank):
        lo, hi = chunks[c]
        held.extend(range(start + lo, start + hi))
    return held


def prepare_tensor_input(seqs: Sequence[SeqMetadata], *, is_prefill: bool, block_size: int = 128,
                         compress_ratios: Sequence[int] = (2,), cp_size: int = 1,
                         cp_rank: int = 0) -> InputMetadata:
    """Build the step's ``InputMetadata`` from per-request ``SeqMetadata`` (see the field docstrings);
    with ``cp_size > 1``, rank ``cp_rank``'s metadata under the mirror split (module docstring)."""
    ratios = _check_args(seqs, is_prefill, block_size, compress_ratios)
    cp_size, cp_rank = _check_cp(cp_size, cp_rank, is_prefill)
    B = block_size
    num_reqs = len(seqs)
    max_blocks = max(1, max(len(seq.block_table) for seq in seqs))

    # Per-request and per-token tensors shared by every ratio.
    cu_seqlens_q = [0] * (num_reqs + 1)
    seqlens_k = [0] * num_reqs
    block_tables = [[-1] * max_blocks for _ in range(num_reqs)]
    positions: list[int] = []
    req_idx: list[int] = []
    slot_mapping_swa: list[int] = []
    for b, seq in enumerate(seqs):
        held = mirror_cp_positions(seq.seqlen_k - seq.seqlen_q, seq.seqlen_k, cp_size, cp_rank)
        cu_seqlens_q[b + 1] = cu_seqlens_q[b] + len(held)
        seqlens_k[b] = seq.seqlen_k
        for i, block in enumerate(seq.block_table):
            block_tables[b][i] = int(block)
        for p in held:
            positions.append(p)
            req_idx.append(b)
            slot_mapping_swa.append(block_tables[b][p // B] * B + p % B)
    total_q = cu_seqlens_q[num_reqs]
    cp_tokens_per_rank, reverse_index = _mirror_cp_gather_order(seqs, cp_size)
    block_tables_per_token = [block_tables[req_idx[i]] for i in range(total_q)]

    if is_prefill:
        context_lens = list(seqlens_k)
        state_block_idx = [seq.state_slot for seq in seqs]
    else:
        context_lens = [p + 1 for p in positions]
        state_block_idx = [seqs[req_idx[i]].state_slot for i in range(total_q)]

    meta = InputMetadata(
        is_prefill=is_prefill,
        block_size=B,
        compress_ratios=ratios,
        num_reqs=num_reqs,
        total_q=total_q,
        max_seqlen_q=max(cu_seqlens_q[b + 1] - cu_seqlens_q[b] for b in range(num_reqs)),
        max_seqlen_k=max(seq.seqlen_k for seq in seqs),
        positions=_i32(positions),
        req_idx=_i32(req_idx),
        cu_seqlens_q=_i32(cu_seqlens_q),
        seqlens_k=_i32(seqlens_k),
        context_lens=_i32(context_lens),
        state_block_idx=_i32(state_block_idx),
        block_tables=_i32(block_tables, (num_reqs, max_blocks)),
        block_tables_per_token=_i32(block_tables_per_token, (total_q, max_blocks)),
        slot_mapping_swa=_i32(slot_mapping_swa),
        cp_size=cp_size,
        cp_rank=cp_rank,
        cp_tokens_per_rank=cp_tokens_per_rank,
        mirror_cp_reverse_index=reverse_index,
    )

    for r in ratios:
        key = str(r)
        Bc = B // r  # ratio-r cache rows per allocator block

        klen = [(p + 1) // r for p in positions]
        # Prefill gathers each request's rows 0 .. e//r - 1 into one buffer, request after request.
        ctx_offset = [0] * num_reqs
        for b in range(1, num_reqs):
            ctx_offset[b] = ctx_offset[b - 1] + seqlens_k[b - 1] // r
        output_idx_offset = [ctx_offset[req_idx[i]] for i in range(total_q)]

        cu_compressed = [0] * (num_reqs + 1)
        num_compressed: list[int] = []
        compressed_positions: list[int] = []
        slot_mapping_store_ca: list[int] = []
        if is_prefill:
            for b, seq in enumerate(seqs):
                s, e = seq.seqlen_k - seq.seqlen_q, seq.seqlen_k
                first, end = s // r, e // r  # completed rows first .. end - 1
                nc = end - first
                num_compressed.append(nc)
                if nc == 0:  # placeholder row: zero filled, position 0, never stored
                    compressed_positions.append(0)
                    slot_mapping_store_ca.append(-1)
                for j in range(first, end):
                    compressed_positions.append(j * r)
                    slot_mapping_store_ca.append(_store_slot(block_tables[b], j, Bc))
                cu_compressed[b + 1] = cu_compressed[b] + max(1, nc)
        else:
            for i in range(total_q):
                p, b = positions[i], req_idx[i]
                if p % r == r - 1:  # token p closes group j = p // r
                    j = p // r
                    num_compressed.append(1)
                    compressed_positions.append(j * r)
                    slot_mapping_store_ca.append(_store_slot(block_tables[b], j, Bc))
                else:
                    num_compressed.append(0)
                    compressed_positions.append(0)
                    slot_mapping_store_ca.append(-1)
            cu_compressed = list(cu_seqlens_q)

        meta.klen[key] = _i32(klen)
        meta.cu_compressed[key] = _i32(cu_compressed)
        meta.num_compressed[key] = _i32(num_compressed)
        meta.num_rows[key] = len(compressed_positions)
        meta.compressed_positions[key] = _i32(compressed_positions)
        meta.slot_mapping_store_ca[key] = _i32(slot_mapping_store_ca)
        meta.output_idx_offset[key] = _i32(output_idx_offset)
    return meta


def _mirror_cp_gather_order(seqs, cp_size: int) -> tuple[tuple[int, ...], torch.Tensor | None]:
    """Tokens per rank, and for each token of the batch in its original order its row in the
    all-gathered buffer (rank after rank, each rank's tokens in the builder's order); None for cp 1."""
    if cp_size == 1:
        return (sum(seq.seqlen_q for seq in seqs),), None
    first_token = [0] * len(seqs)  # index of each request's first token in the original order
    for b in range(1, len(seqs)):
        first_token[b] = first_token[b - 1] + seqs[b - 1].seqlen_q
    reverse = [-1] * sum(seq.seqlen_q for seq in seqs)
    tokens_per_rank: list[int] = []
    row = 0
    for rank in range(cp_size):
        rank_first = row
        for b, seq in enumerate(seqs):
            start = seq.seqlen_k - seq.seqlen_q
            for p in mirror_cp_positions(start, seq.seqlen_k, cp_size, rank):
                reverse[first_token[b] + p - start] = row
                row += 1
        tokens_per_rank.append(row - rank_first)
    return tuple(tokens_per_rank), _i32(reverse)


def _store_slot(block_table: list[int], j: int, Bc: int) -> int:
    """Paged slot of compressed row ``j``: ``block_table[j // Bc] * Bc + j % Bc``."""
    return block_table[j // Bc] * Bc + j % Bc


def _i32(values, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.int32)
    return t.reshape(shape) if shape is not None else t
