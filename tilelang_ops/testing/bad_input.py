"""Small valid calls of every entry point, for the bad-input tests, their GPU tier and the sanitizer driver.

Each builder returns a ``Call``: the arguments in signature order (passed positionally), the keyword
arguments, and the names of the tensors the entry point writes in place (the ones a bad call must leave
byte-for-byte unchanged). A test breaks one argument with ``Call.with_`` and checks that the call raises
a ``TypeError`` / ``ValueError`` naming it, with every written tensor unchanged (``snapshot`` /
``changed``). ``guarded`` places a tensor inside a larger buffer of canary bytes, so a GPU test can see a
write outside the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from metadata.cache_format import FP8_MAIN_KV_FORMAT, KVCacheFormat
from metadata.prepare_tensor_input import SeqMetadata, prepare_tensor_input

CANARY = 0xA5  # guard and untouched cache bytes
RATIO = 2


@dataclass
class Call:
    """One call of an entry point: ``fn(*args.values(), **kwargs)``; ``writes`` names what it writes."""

    args: dict
    kwargs: dict = field(default_factory=dict)
    writes: tuple[str, ...] = ()

    def __getitem__(self, name):
        return self.args[name] if name in self.args else self.kwargs[name]

    def with_(self, **changes) -> Call:
        """A copy with some arguments (positional or keyword, by name) replaced."""
        args, kwargs = dict(self.args), dict(self.kwargs)
        for name, value in changes.items():
            if name in args:
                args[name] = value
            elif name in kwargs:
                kwargs[name] = value
            else:
                raise KeyError(f"no argument {name!r} in this call (have {list(args) + list(kwargs)})")
        return replace(self, args=args, kwargs=kwargs)

    def fresh(self) -> Call:
        """A copy whose written tensors are clones (so repeated calls start from the same bytes)."""
        return self.with_(**{n: self[n].clone() for n in self.writes if self[n] is not None})

    def __call__(self, fn):
        return fn(*self.args.values(), **self.kwargs)

    def written(self) -> dict[str, torch.Tensor]:
        return {n: self[n] for n in self.writes if isinstance(self[n], torch.Tensor)}


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8).reshape(-1).clone()


def snapshot(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The bytes of each tensor (for ``changed``)."""
    return {n: _bytes(t) for n, t in tensors.items()}


def changed(tensors: dict[str, torch.Tensor], before: dict[str, torch.Tensor]) -> list[str]:
    """Names of the tensors whose bytes differ from ``before`` (first differing byte offset shown)."""
    out = []
    for n, t in tensors.items():
        now = _bytes(t)
        if now.shape != before[n].shape or not torch.equal(now, before[n]):
            diff = (now != before[n]).nonzero() if now.shape == before[n].shape else None
            out.append(n if diff is None else f"{n} (first byte {int(diff[0, 0])}, {diff.shape[0]} bytes)")
    return out


@dataclass
class Guarded:
    """``view`` (shaped like the original) lies inside ``buffer`` with ``pad`` canary bytes on each side."""

    buffer: torch.Tensor  # flat uint8
    view: torch.Tensor
    pad: int

    def guards_intact(self) -> bool:
        n = self.buffer.numel()
        head, tail = self.buffer[:self.pad], self.buffer[n - self.pad:]
        return bool((head == CANARY).all()) and bool((tail == CANARY).all())


def guarded(t: torch.Tensor, pad: int = 4096) -> Guarded:
    """A copy of ``t`` (contiguous) inside a flat byte buffer with ``pad`` canary bytes before and after
    (``pad`` a multiple of 16 keeps the copy 16-byte aligned)."""
    nbytes = t.numel() * t.element_size()
    buf = torch.full((nbytes + 2 * pad,), CANARY, dtype=torch.uint8, device=t.device)
    view = buf[pad:pad + nbytes].view(t.dtype).view(t.shape)
    view.copy_(t)
    return Guarded(buf, view, pad)


def _i32(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


def _projected(n, dim, g, device):
    x = torch.randn(n, 2 * dim, generator=g)
    x[:, :dim] *= 4
    return x.to(device)


# ----------------------------------------------------------------------------------------------
# compress
# ----------------------------------------------------------------------------------------------

# (chunk length, context length after the chunk, state slot): a straddling group, a whole chunk, an
# empty chunk (a placeholder row) and a chunk that completes one row
PREFILL_CHUNKS = ((5, 9, 1), (3, 3, 0), (0, 4, 2), (2, 6, 3))
PREFILL_SLOTS, PREFILL_RING = 5, 3
# (state slot, context before the step, tokens): a 3-token verification step and two single tokens
DECODE_STEPS = ((1, 9, 3), (0, 4, 1), (3, 1, 1))
DECODE_SLOTS = 5
SPARE_SLOT = 4  # a ring slot no request of either batch owns


def prefill_call(device="cpu", dim=64, seed=0) -> Call:
    """``compress_prefill(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
    cu_compressed, compress_ratio, *, num_rows)`` on ``PREFILL_CHUNKS``."""
    g = torch.Generator().manual_seed(seed)
    cu_q, cu_c = [0], [0]
    for length, e, _ in PREFILL_CHUNKS:
        cu_q.append(cu_q[-1] + length)
        cu_c.append(cu_c[-1] + max(1, e // RATIO - (e - length) // RATIO))
    args = dict(projected_kv=_projected(cu_q[-1], dim, g, device),
                state_cache=(torch.randn(PREFILL_SLOTS, PREFILL_RING, 2, dim, generator=g) * 3).to(device),
                cu_seqlens_q=_i32(cu_q, device),
                context_lens=_i32([e for _, e, _ in PREFILL_CHUNKS], device),
                state_block_idx=_i32([s for *_, s in PREFILL_CHUNKS], device),
                cu_compressed=_i32(cu_c, device), compress_ratio=RATIO)
    return Call(args, dict(num_rows=None), ("state_cache",))


def decode_call(device="cpu", dim=64, seed=0) -> Call:
    """``compress_decode(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
    compress_ratio)`` on ``DECODE_STEPS`` with the smallest ring the step allows."""
    g = torch.Generator().manual_seed(seed)
    tokens = [(c + i + 1, slot) for slot, c, q in DECODE_STEPS for i in range(q)]
    max_q = max(q for *_, q in DECODE_STEPS)
    ring = RATIO + max_q - 1
    args = dict(projected_kv=_projected(len(tokens), dim, g, device),
                state_cache=(torch.randn(DECODE_SLOTS, ring, 2, dim, generator=g) * 3).to(device),
                context_lens=_i32([c for c, _ in tokens], device),
                state_block_idx=_i32([s for _, s in tokens], device), max_seqlen_q=max_q,
                compress_ratio=RATIO)
    return Call(args, {}, ("state_cache",))


# ----------------------------------------------------------------------------------------------
# kv_store
# ----------------------------------------------------------------------------------------------

MAX_POSITION = 16  # rows of the cos/sin tables


def _tables(g, device, half=32, max_position=MAX_POSITION):
    ang = torch.rand(max_position, half, generator=g) * 6.3
    return torch.cos(ang).to(device), torch.sin(ang).to(device)


def store_call(device="cpu", fmt: KVCacheFormat = FP8_MAIN_KV_FORMAT, rows=6, rows_per_block=4, blocks=3,
               hadamard=False, seed=0) -> Call:
    """``norm_rope_hadamard_cast_store(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache,
    fmt, *, hadamard, out_norm)``: ``rows`` rows to distinct slots of a ``blocks``-block cache, one
    row skipped (slot -1)."""
    g = torch.Generator().manual_seed(seed)
    cos, sin = _tables(g, device)
    slots = torch.randperm(blocks * rows_per_block, generator=g)[:rows]
    slots[min(2, rows - 1)] = -1
    args = dict(kv=(torch.randn(rows, fmt.dim, generator=g) * 2).bfloat16().to(device),
                norm_weight=(torch.rand(fmt.dim, generator=g) + 0.5).bfloat16().to(device), eps=1e-6,
                cos=cos, sin=sin,
                positions=torch.randint(0, MAX_POSITION, (rows,), generator=g).to(device),
                slot_mapping=slots.to(device),
                kv_cache=torch.full((blocks, fmt.block_bytes(rows_per_block)), CANARY, dtype=torch.uint8,
                                    device=device),
                fmt=fmt)
    kwargs = dict(rope_dim=64, interleaved=True, hadamard=hadamard,
                  out_norm=torch.zeros(rows, fmt.dim, dtype=torch.bfloat16, device=device))
    return Call(args, kwargs, ("kv_cache", "out_norm"))


# ----------------------------------------------------------------------------------------------
# compress_store (metadata from the builder: D = 512, the main formats' row width)
# ----------------------------------------------------------------------------------------------

CS_BLOCK = 16  # token positions per allocator block: 8 C2 rows per cache block
CS_DIM = 512


def _compress_store_call(seqs, prefill, ring, num_slots, device, fmt, seed) -> Call:
    g = torch.Generator().manual_seed(seed)
    meta = prepare_tensor_input(seqs, is_prefill=prefill, block_size=CS_BLOCK, compress_ratios=(RATIO,))
    k = str(RATIO)
    blocks = max(b for s in seqs for b in s.block_table) + 2  # one block no request owns
    cos, sin = _tables(g, device, max_position=meta.max_seqlen_k + 1)
    m = meta.to(device)
    head = dict(projected_kv=_projected(meta.total_q, CS_DIM, g, device),
                state_cache=(torch.randn(num_slots, ring, 2, CS_DIM, generator=g) * 3).to(device))
    if prefill:
        head.update(cu_seqlens_q=m.cu_seqlens_q, context_lens=m.context_lens,
                    state_block_idx=m.state_block_idx, cu_compressed=m.cu_compressed[k], compress_ratio=RATIO)
    else:
        head.update(context_lens=m.context_lens, state_block_idx=m.state_block_idx,
                    max_seqlen_q=meta.max_seqlen_q, compress_ratio=RATIO)
    head.update(norm_weight=(torch.rand(CS_DIM, generator=g) + 0.5).bfloat16().to(device), eps=1e-6, cos=cos,
                sin=sin, positions=m.compressed_positions[k], slot_mapping=m.slot_mapping_store_ca[k],
                kv_cache=torch.full((blocks, fmt.block_bytes(CS_BLOCK // RATIO)), CANARY, dtype=torch.uint8,
                                    device=device),
                fmt=fmt)
    rows = meta.num_rows[k]
    kwargs = dict(rope_dim=64, interleaved=True,
                  out_norm=torch.zeros(rows, CS_DIM, dtype=torch.bfloat16, device=device))
    if prefill:
        kwargs["num_rows"] = rows
    return Call(head, kwargs, ("state_cache", "kv_cache", "out_norm"))


def compress_store_prefill_call(device="cpu", fmt: KVCacheFormat = FP8_MAIN_KV_FORMAT, seed=0) -> Call:
    """``compress_store_prefill(...)`` on the chunks of ``PREFILL_CHUNKS`` (builder metadata)."""
    seqs = [SeqMetadata(q, e, [b], slot) for b, (q, e, slot) in enumerate(PREFILL_CHUNKS)]
    return _compress_store_call(seqs, True, PREFILL_RING, PREFILL_SLOTS, device, fmt, seed)


def compress_store_decode_call(device="cpu", fmt: KVCacheFormat = FP8_MAIN_KV_FORMAT, seed=0) -> Call:
    """``compress_store_decode(...)`` on the steps of ``DECODE_STEPS`` (builder metadata)."""
    seqs = [SeqMetadata(q, c + q, [b], slot) for b, (slot, c, q) in enumerate(DECODE_STEPS)]
    max_q = max(q for *_, q in DECODE_STEPS)
    return _compress_store_call(seqs, False, RATIO + max_q - 1, DECODE_SLOTS, device, fmt, seed)


# ----------------------------------------------------------------------------------------------
# topk family
# ----------------------------------------------------------------------------------------------

def _ends(b, n, device):
    """end per row, cycling: the whole row, a short row (7), an empty row."""
    return _i32([(n, min(7, n), 0)[r % 3] for r in range(b)], device)


def topk_call(device="cpu", b=3, n=40, k=5, seed=0) -> Call:
    """``topk(scores, k, *, end)``: fills its own outputs, writes nothing of the caller's."""
    g = torch.Generator().manual_seed(seed)
    return Call(dict(scores=torch.randn(b, n, generator=g).to(device), k=k), dict(end=_ends(b, n, device)))


def block_max_call(device="cpu", b=3, n=40, block_size=8, seed=0) -> Call:
    """``block_max_scores(scores, block_size, end)``."""
    g = torch.Generator().manual_seed(seed)
    return Call(dict(scores=torch.randn(b, n, generator=g).to(device), block_size=block_size,
                     end=_ends(b, n, device)))


def restore_call(device="cpu", b=3, k=5, c=4, block_size=8, seed=0) -> Call:
    """``restore_candidate_indices_(index, candidate_blocks, block_size)``, in place on ``index``."""
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(-1, c * block_size, (b, k), generator=g, dtype=torch.int32)
    blocks = torch.stack([torch.randperm(4 * c, generator=g)[:c] for _ in range(b)]).to(torch.int32)
    blocks[-1, -1] = -1  # a padding candidate block
    return Call(dict(index=index.to(device), candidate_blocks=blocks.to(device), block_size=block_size),
                {}, ("index",))


def convert_call(device="cpu", b=3, L=1, k=5, block_size_c=4, max_blocks=6, seed=0) -> Call:
    """``convert_kv_index_(index, block_size_c, valid_lens, block_tables)``, in place on ``index``."""
    g = torch.Generator().manual_seed(seed)
    index = torch.randint(-1, max_blocks * block_size_c, (b, L, k), generator=g, dtype=torch.int32)
    lens = torch.randint(0, k + 1, (b, L), generator=g, dtype=torch.int32)
    table = torch.randint(0, 1000, (b, max_blocks), generator=g, dtype=torch.int32)
    return Call(dict(index=index.to(device), block_size_c=block_size_c, valid_lens=lens.to(device),
                     block_tables=table.to(device)), {}, ("index",))


def topk_to_slots_call(device="cpu", b=3, n=40, k=5, block_size_c=8, seed=0) -> Call:
    """``topk_to_slots(scores, k, *, end, block_size_c, block_tables)``, tables covering every row."""
    g = torch.Generator().manual_seed(seed)
    blocks = -(-n // block_size_c)
    table = torch.stack([torch.randperm(4 * blocks, generator=g)[:blocks] for _ in range(b)]).to(torch.int32)
    return Call(dict(scores=torch.randn(b, n, generator=g).to(device), k=k),
                dict(end=_ends(b, n, device), block_size_c=block_size_c, block_tables=table.to(device)))
