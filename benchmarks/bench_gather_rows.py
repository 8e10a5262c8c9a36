"""gather_rows: the TileLang kernel beside ``torch.index_select`` (eager and torch.compile) and the copy
roofline. Bytes = rows read + rows written + the int32 index.

Cases at D = 512 (the C1 row): ``perm``, a random permutation of 1M rows (every read a random row);
``cp8``, the mirror reverse index of 8 requests of 128K tokens under 8 context-parallel ranks (what the C1
bypass gathers: runs of 8K consecutive rows); 64K rows (L2 flushed before each launch) and 64 rows
(CUDA-graph replays: launch-bound). The 1M cases also time the other launch shapes in ``SWEEP`` as peers
(``t<threads>v<vectors>``), tuning data for ``tilelang_ops.gather_rows.DEFAULT_CONFIG``.
"""

from __future__ import annotations

import torch

from benchmarks.harness import Harness, compile_peer, time_graph_us, time_peer, time_us
from reference.gather_rows import gather_rows_torch_unchecked
from tilelang_ops.testing.context_parallel import reverse_index_twin

OP = "gather_rows"
DIM = 512
TINY = 64  # at or below this many rows, time CUDA-graph replays
FLUSH_BYTES = 256 << 20  # cases smaller than this get the L2 overwritten before each launch


def _sweep():
    from tilelang_ops.gather_rows import GatherRowsConfig

    return (GatherRowsConfig(256, 8), GatherRowsConfig(128, 4), GatherRowsConfig(512, 2),
            GatherRowsConfig(256, 2))


def _index(case: str, rows: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rows)
    if case == "cp8":
        return reverse_index_twin([rows // 8] * 8, 8)
    return torch.randperm(rows, generator=g).int()


def run(h: Harness) -> None:
    compiled = compile_peer(gather_rows_torch_unchecked)
    for rows, case in ((1 << 20, "perm"), (1 << 20, "cp8"), (65536, "perm"), (TINY, "perm")):
        _case(h, rows, case, compiled)
        torch.cuda.empty_cache()


def _case(h: Harness, rows: int, case: str, compiled) -> None:
    from tilelang_ops.gather_rows import gather_rows

    x = torch.randn(rows, DIM, device="cuda").bfloat16()
    index = _index(case, rows).cuda()
    nbytes = 2 * rows * DIM * 2 + rows * 4
    if rows <= TINY:
        timer = time_graph_us
    elif nbytes < FLUSH_BYTES:
        timer = lambda fn: time_us(fn, flush_bytes=FLUSH_BYTES)  # noqa: E731
    else:
        timer = time_us
    us = timer(lambda: gather_rows(x, index))
    eager_us = timer(lambda: gather_rows_torch_unchecked(x, index))
    compile_us = None if compiled is None else time_peer(f"compile rows{rows}", lambda: compiled(x, index),
                                                         timer)
    peers = {"index_select": eager_us}
    if rows == 1 << 20:
        for config in _sweep():
            name = f"t{config.threads}v{config.vectors_per_thread}"
            peers[name] = time_peer(name, lambda c=config: gather_rows(x, index, config=c), timer)
    h.report(OP, f"rows{rows}_d{DIM}_{case}", nbytes, us, eager_us=eager_us, compile_us=compile_us,
             peers={k: v for k, v in peers.items() if v is not None})
