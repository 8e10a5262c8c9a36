"""Context-parallel batches for the C1 path (SPEC 6), shared by tests/test_context_parallel.py and
`make diff`: random prefill batches, each rank's share of their rows, the simulated all-gather (ranks
in one process) and one rank of a real torch.distributed group.

The C1 path under context parallelism must return exactly the single-process rows: every rank
projects its own tokens, the ranks' rows are all-gathered (rank 0's first), and
``compress(gathered, None, rank_metadata, 1, True)`` restores the batch's order with the reverse index.
Rows are random 16-bit patterns (NaN payloads, infinities, subnormals, signed zeros), so only a bitwise
copy passes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from metadata import InputMetadata, SeqMetadata, prepare_tensor_input
from metadata.gather_rows_args import c1_prefill_rows
from metadata.prepare_tensor_input import mirror_cp_chunks
from tilelang_ops.testing import Comparison, compare_bitwise

CP_SIZES = (2, 4)
MAX_LEN = 300  # new tokens of a request's chunk: 1 .. MAX_LEN
BLOCK_SIZE = 64
C1_ROW_FIELDS = ("cu_compressed", "num_compressed", "compressed_positions", "slot_mapping_store_ca")


@dataclass(frozen=True)
class CPBatch:
    """A random prefill batch: ``short`` chunk lengths (below ``2 * cp`` for the sizes tested, so some
    mirror pieces are empty) and ``num_random`` lengths in [1, MAX_LEN], in a shuffled order."""

    id: str
    seed: int
    num_random: int
    short: tuple[int, ...] = (1, 3, 7)
    dim: int = 512


CP_BATCHES = (
    CPBatch("seqs8_short", 1, 5),
    CPBatch("seqs4_long", 2, 4, short=()),
    CPBatch("seqs10_empty_and_exact", 3, 5, short=(0, 2, 4, 8, 16)),  # an empty chunk; L = 2 * cp
)
BATCHES = {b.id: b for b in CP_BATCHES}


def cp_seqs(batch: CPBatch) -> list[SeqMetadata]:
    """The batch's requests: chunked prefill (some start after earlier context), distinct blocks."""
    rng = random.Random(batch.seed)
    lengths = list(batch.short) + [rng.randint(1, MAX_LEN) for _ in range(batch.num_random)]
    rng.shuffle(lengths)
    seqs, next_block = [], 0
    for b, q in enumerate(lengths):
        before = rng.choice((0, 0, rng.randint(1, 2 * BLOCK_SIZE)))  # earlier context of the request
        k = before + q
        blocks = max(1, -(-k // BLOCK_SIZE))
        table = list(range(next_block, next_block + blocks))
        rng.shuffle(table)
        next_block += blocks
        seqs.append(SeqMetadata(q, k, table, b))
    return seqs


def cp_rows(batch: CPBatch, num_tokens: int, device="cpu") -> torch.Tensor:
    """[num_tokens, D] bf16 of random bit patterns: the batch's projected C1 rows in original order."""
    g = torch.Generator().manual_seed(batch.seed)
    bits = torch.randint(-(1 << 15), 1 << 15, (num_tokens, batch.dim), dtype=torch.int32, generator=g)
    return bits.to(torch.int16).view(torch.bfloat16).to(device)


def cp_metadata(seqs, cp_size: int, cp_rank: int) -> InputMetadata:
    return prepare_tensor_input(seqs, is_prefill=True, block_size=BLOCK_SIZE, compress_ratios=(1,),
                                cp_size=cp_size, cp_rank=cp_rank)


def rank_token_index(seqs, meta: InputMetadata) -> torch.Tensor:
    """[meta.total_q] int64: each of the rank's tokens' index in the batch's original order, from the
    rank's ``req_idx`` and ``positions`` (token ``p`` of request ``b`` is ``first[b] + p - start[b]``)."""
    q = torch.tensor([s.seqlen_q for s in seqs], dtype=torch.int64)
    start = torch.tensor([s.seqlen_k - s.seqlen_q for s in seqs], dtype=torch.int64)
    first = torch.cumsum(q, 0) - q
    req = meta.req_idx.long()
    return first[req] + meta.positions.long() - start[req]


def simulate_c1(batch: CPBatch, cp_size: int, compress_fn, device="cpu", corrupt_rank: int | None = None):
    """The C1 path with ``cp_size`` ranks in one process: every rank's share, concatenated in rank order
    (the all-gather), through ``compress_fn(gathered, None, rank_meta, 1, True)`` on each rank.
    ``corrupt_rank``: that rank's reverse index gets two entries swapped (the check must then fail).
    Returns the single-process rows and, per rank, (metadata, output)."""
    seqs = cp_seqs(batch)
    single = cp_metadata(seqs, 1, 0)
    x = cp_rows(batch, single.total_q)
    metas = [cp_metadata(seqs, cp_size, r) for r in range(cp_size)]
    gathered = torch.cat([x[rank_token_index(seqs, m)] for m in metas]).to(device)
    outs = []
    for r, meta in enumerate(metas):
        if r == corrupt_rank:
            meta.mirror_cp_reverse_index = _swap_two(meta.mirror_cp_reverse_index)
        outs.append((meta, compress_fn(gathered, None, meta.to(device), 1, True)))
    return x, single, outs


def reverse_index_twin(lengths, cp_size: int) -> torch.Tensor:
    """Vectorized twin of ``mirror_cp_reverse_index`` for chunks of ``lengths`` tokens (one arange per
    piece instead of a loop per token; big batches for the benchmark)."""
    first = [0]
    for n in lengths:
        first.append(first[-1] + n)
    pieces = [mirror_cp_chunks(n, cp_size) for n in lengths]
    order = [torch.arange(first[b] + lo, first[b] + hi)
             for rank in range(cp_size) for b in range(len(lengths))
             for lo, hi in (pieces[b][rank], pieces[b][2 * cp_size - 1 - rank])]
    gathered = torch.cat(order)  # original token of each gathered row
    reverse = torch.empty(first[-1], dtype=torch.int32)
    reverse[gathered] = torch.arange(first[-1], dtype=torch.int32)
    return reverse


def _swap_two(index: torch.Tensor) -> torch.Tensor:
    index = index.clone()
    index[[0, -1]] = index[[-1, 0]]
    return index


def check_c1(x: torch.Tensor, single: InputMetadata, outs) -> list[Comparison]:
    """The C1 outputs of ranks ``outs`` ((metadata, output) each) against the single-process rows ``x``
    laid out as its ratio-1 rows (a zero placeholder row for a request with no token; bitwise: a copy),
    and their C1 row metadata (``C1_ROW_FIELDS`` concatenated: the rows the store writes) against the
    single-process metadata (bitwise: indices). Coordinates start with the rank's place in ``outs``."""
    ranks = ",".join(str(meta.cp_rank) for meta, _ in outs)
    got = torch.stack([out.cpu() for _, out in outs])
    want = c1_prefill_rows(x.cpu(), single, True)
    rows = compare_bitwise(f"c1 rows, ranks {ranks}", got, want.expand(len(outs), *want.shape))
    got = torch.stack([torch.cat([getattr(meta, f)["1"].cpu() for f in C1_ROW_FIELDS]) for meta, _ in outs])
    want = torch.cat([getattr(single, f)["1"] for f in C1_ROW_FIELDS])
    return [rows, compare_bitwise(f"c1 row metadata, ranks {ranks}", got, want.expand_as(got))]


def all_gather_rows(mine: torch.Tensor, counts) -> torch.Tensor:
    """torch.distributed all-gather of the ranks' rows (``counts[r]`` rows from rank ``r``), rank 0's
    first: each rank's rows travel padded to the longest share, and the padding is dropped."""
    import torch.distributed as dist

    width = max(counts)
    padded = mine.new_zeros(width, mine.shape[1])
    padded[: mine.shape[0]] = mine
    bufs = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(bufs, padded)
    return torch.cat([buf[:c] for buf, c in zip(bufs, counts)])


def distributed_c1_rank(rank: int, world_size: int, init_method: str, backend: str, batch_ids) -> None:
    """One rank of a real process group (``torch.multiprocessing`` target): for each batch, build this
    rank's metadata and share, all-gather, run the C1 path (gloo: ``compress_ref`` on the CPU; nccl:
    the ``compress`` kernel wrapper on ``cuda:rank``), and raise AssertionError unless the rows equal the
    single-process rows bitwise and the reverse index is the same on every rank."""
    import torch.distributed as dist

    if backend == "nccl":
        from tilelang_ops.compress import compress as compress_fn

        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        from reference.compress import compress_ref as compress_fn

        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    try:
        for batch_id in batch_ids:
            batch = BATCHES[batch_id]
            seqs = cp_seqs(batch)
            single = cp_metadata(seqs, 1, 0)
            meta = cp_metadata(seqs, world_size, rank)
            x = cp_rows(batch, single.total_q)
            mine = x[rank_token_index(seqs, meta)].to(device)
            gathered = all_gather_rows(mine, meta.cp_tokens_per_rank)
            out = compress_fn(gathered, None, meta.to(device), 1, True)
            comps = check_c1(x, single, [(meta, out)])
            index = meta.mirror_cp_reverse_index.to(device)
            indices = [torch.empty_like(index) for _ in range(world_size)]
            dist.all_gather(indices, index)
            comps += [compare_bitwise(f"rank {rank} reverse index vs rank {r}", indices[r], index)
                      for r in range(world_size)]
            for c in comps:
                if not c.passed:
                    raise AssertionError(f"{batch_id}, {world_size} ranks ({backend}): {c.message()}")
    finally:
        dist.destroy_process_group()
