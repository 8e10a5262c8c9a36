"""compress benchmarks: kernel vs the vectorized torch twin (eager and torch.compile).

The twin peers time the twin's arithmetic alone (``*_torch_unchecked``): each case's metadata is
validated once, outside the timed calls, by the checks the checked twin runs.

Bytes = reads of projected_kv and of the ring entries a group takes from it + writes of the BF16
rows and of the ring entries (SPEC 1.4), computed from the case's metadata on the host.
"""

from __future__ import annotations

import torch

from benchmarks.harness import compile_peer, time_graph_us, time_peer, time_us
from metadata.compress_args import check_decode_values, check_prefill_values
from reference.compress import compress_decode_torch_unchecked, compress_prefill_torch_unchecked
from tilelang_ops.compress import compress_decode, compress_prefill

OP = "compress"
DIM, RATIO, RING = 512, 2, 7  # C2 with the default ring (5 draft tokens + 1)
CHUNK = 4096
PREFILL_CASES = {"tokens65536": 16, "tokens1048576": 256}  # requests of CHUNK tokens each
DECODE_CASES = [(b, q) for q in (1, 6) for b in (1, 64, 512, 4096)]


def _prefill_inputs(num_reqs):
    i32 = dict(dtype=torch.int32, device="cuda")
    # chunks start at an odd position, so every request's first group reads one ring entry
    starts = [2 * CHUNK + 1 + 2 * i for i in range(num_reqs)]
    ends = [s + CHUNK for s in starts]
    rows = [e // RATIO - s // RATIO for s, e in zip(starts, ends, strict=True)]
    cu_c = [0]
    for n in rows:
        cu_c.append(cu_c[-1] + max(1, n))
    x = torch.randn(num_reqs * CHUNK, 2 * DIM, device="cuda")
    state = torch.randn(num_reqs, RING, 2, DIM, device="cuda")
    meta = (torch.arange(0, num_reqs * CHUNK + 1, CHUNK, **i32), torch.tensor(ends, **i32),
            torch.arange(num_reqs, **i32), torch.tensor(cu_c, **i32))
    ring_reads = sum(s % RATIO for s in starts)
    ring_writes = num_reqs * min(CHUNK, RING)
    row_bytes_in = 2 * DIM * 4
    nbytes = (x.shape[0] + ring_reads + ring_writes) * row_bytes_in + cu_c[-1] * DIM * 2
    return x, state, meta, cu_c[-1], nbytes


def _decode_inputs(batch, q):
    i32 = dict(dtype=torch.int32, device="cuda")
    before = [100 + 3 * b for b in range(batch)]  # mixed parities: different tokens close groups
    ctx = [c + i + 1 for c in before for i in range(q)]
    slots = [b for b in range(batch) for _ in range(q)]
    x = torch.randn(batch * q, 2 * DIM, device="cuda")
    state = torch.randn(batch, RING, 2, DIM, device="cuda")
    # ring reads: group positions of closing tokens that are not in this step
    ring_reads = 0
    for c in before:
        for i in range(q):
            p = c + i
            if p % RATIO == RATIO - 1:
                ring_reads += sum(1 for t in range(p - RATIO + 1, p + 1) if t < c)
    nbytes = (2 * x.shape[0] + ring_reads) * 2 * DIM * 4 + x.shape[0] * DIM * 2
    return x, state, torch.tensor(ctx, **i32), torch.tensor(slots, **i32), nbytes


def run(h) -> None:
    compiled_prefill = compile_peer(compress_prefill_torch_unchecked)
    for case, num_reqs in PREFILL_CASES.items():
        x, state, meta, rows, nbytes = _prefill_inputs(num_reqs)
        args = (x, state, *meta, RATIO)
        check_prefill_values(*args, num_rows=rows)
        us = time_us(lambda: compress_prefill(*args, num_rows=rows))  # noqa: B023
        eager = time_peer("eager", lambda: compress_prefill_torch_unchecked(*args, num_rows=rows),  # noqa: B023
                          time_us)
        comp = None
        if compiled_prefill is not None:
            comp = time_peer("compile", lambda: compiled_prefill(*args, num_rows=rows), time_us)  # noqa: B023
        h.report(OP, case, nbytes, us, eager_us=eager, compile_us=comp)
        del x, state, args
        torch.cuda.empty_cache()

    compiled_decode = compile_peer(compress_decode_torch_unchecked)
    for batch, q in DECODE_CASES:
        x, state, ctx, slots, nbytes = _decode_inputs(batch, q)
        args = (x, state, ctx, slots, q, RATIO)
        check_decode_values(*args[:5])
        us = time_graph_us(lambda: compress_decode(*args))  # noqa: B023
        eager = time_peer("eager", lambda: compress_decode_torch_unchecked(*args), time_graph_us)  # noqa: B023
        comp = None
        if compiled_decode is not None:
            comp = time_peer("compile", lambda: compiled_decode(*args), time_graph_us)  # noqa: B023
        h.report(OP, f"b{batch}q{q}", nbytes, us, eager_us=eager, compile_us=comp)
