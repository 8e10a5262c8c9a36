"""norm_rope_hadamard_cast_store: the TileLang kernel vs the vectorized torch twin (eager and
torch.compile). Bytes = BF16 rows read + cache bytes written (no out_norm in these cases).

Slot order: the main cases store like the engine does for a prefill (``paged``: consecutive rows fill
consecutive slots of a block, the blocks in a random order, as a block table hands them out); the
``_rowperm`` cases at 1M rows scatter every row to a random slot (a random permutation of all slots).
The two differ in what the memory system sees, not in the kernel's work: a FP8 main row (528 B) or a
FP4 index row's 4 scale bytes cover only part of a 32-byte sector, and with random rows the other part
of that sector is written much later, after the sector has left L2 (a partial-sector write back).

The default variant (v3) is reported with the previous one (v2) as peer ``v2`` and v3 with its options off
as peer ``v3plain`` (``PLAIN_ENV``, at 5 CTAs per SM; the default turns weight_smem on, e2m1_bf16x2 for
FP4 index rows, scale_mul, inv_table, e2m1_noclamp for FP4 main rows, rope_spread for FP4 / FP8 main rows,
amax_bf16x2 and rcp_norm for FP8 main rows). KV_STORE_SWEEP=1 also times v3's launch shapes in ``SWEEP``
(chunks, rows per thread, min CTAs per SM, options) at 1M rows (KV_STORE_SWEEP=fp4_main,...: those formats
only; lines ``SWEEP kv_store ...``; tuning data for ``tilelang_ops.kv_store.CHUNKS`` /
``ROWS_PER_THREAD_V3`` / ``V3_OPTIONS``, not reported)."""

from __future__ import annotations

import contextlib
import os

import torch

from benchmarks.harness import Harness, compile_peer, time_graph_us, time_peer, time_us
from metadata.cache_format import BF16_KV_FORMAT, FP4_INDEX_KV_FORMAT, FP4_MAIN_KV_FORMAT, FP8_MAIN_KV_FORMAT
from metadata.kv_store_args import check_store_args, check_store_values
from reference.kv_store import norm_rope_hadamard_cast_store_torch_unchecked

OP = "kv_store"
ROWS = (1 << 20, 65536, 64, 1)
FORMATS = ((FP8_MAIN_KV_FORMAT, False), (FP4_MAIN_KV_FORMAT, False), (FP4_INDEX_KV_FORMAT, True),
           (BF16_KV_FORMAT, False))
ROWS_PER_BLOCK = 64
MAX_POSITION = 8192
TINY = 64  # at or below this many rows, time CUDA-graph replays (launch-bound)
# peer v3plain (every format): v3 with its options off, at the 5 CTAs per SM its registers were tuned for
# (at 6 CTAs per SM it spills: 1M rows FP8 / FP4 main 925.9 / 665.9 us)
PLAIN_ENV = {"KV_STORE_V3_OPTIONS": "none", "KV_STORE_MIN_CTAS": 5}
ORDERS = {1 << 20: ("paged", "rowperm")}  # slot orders per row count (default: paged only)


def _inputs(fmt, rows, order="paged"):
    """Inputs of one case; ``order``: "paged" (blocks in random order, rows in order inside a block)
    or "rowperm" (every row to a random slot)."""
    g = torch.Generator(device="cuda").manual_seed(rows)
    kv = (torch.randn(rows, fmt.dim, device="cuda", generator=g) * 2).bfloat16()
    w = (torch.rand(fmt.dim, device="cuda", generator=g) + 0.5).bfloat16()
    ang = torch.rand(MAX_POSITION, 32, device="cuda", generator=g) * 6.3
    cos, sin = torch.cos(ang), torch.sin(ang)
    pos = torch.randint(0, MAX_POSITION, (rows,), device="cuda", generator=g)
    blocks = -(-rows // ROWS_PER_BLOCK)
    if order == "rowperm":
        slots = torch.randperm(blocks * ROWS_PER_BLOCK, device="cuda", generator=g)[:rows]
    else:
        row = torch.arange(rows, device="cuda")
        block = torch.randperm(blocks, device="cuda", generator=g)
        slots = block[row // ROWS_PER_BLOCK] * ROWS_PER_BLOCK + row % ROWS_PER_BLOCK
    cache = torch.zeros(blocks, fmt.block_bytes(ROWS_PER_BLOCK), dtype=torch.uint8, device="cuda")
    return kv, w, cos, sin, pos, slots, cache


def run(h: Harness) -> None:
    from tilelang_ops.kv_store import norm_rope_hadamard_cast_store

    compiled = compile_peer(norm_rope_hadamard_cast_store_torch_unchecked)
    for fmt, hadamard in FORMATS:
        for rows, order in ((r, o) for r in ROWS for o in ORDERS.get(r, ("paged",))):
            kv, w, cos, sin, pos, slots, cache = _inputs(fmt, rows, order)
            args = (kv, w, 1e-6, cos, sin, pos, slots, cache, fmt)
            kw = dict(hadamard=hadamard)
            # the twin peer is timed on its arithmetic alone: the inputs are validated once, here
            check_store_values(pos, slots, check_store_args(*args, **kw))
            timer = time_graph_us if rows <= TINY else time_us
            us = timer(lambda: norm_rope_hadamard_cast_store(*args, **kw))  # noqa: B023
            eager_us = timer(lambda: norm_rope_hadamard_cast_store_torch_unchecked(*args, **kw))  # noqa: B023
            compile_us = None if compiled is None else time_peer(
                f"compile {fmt.name} rows{rows}", lambda: compiled(*args, **kw), timer)  # noqa: B023
            v2_us = timer(lambda: norm_rope_hadamard_cast_store(*args, **kw, variant="v2"))  # noqa: B023
            peers = {"v2": v2_us}
            with _env(**PLAIN_ENV):
                peers["v3plain"] = timer(
                    lambda: norm_rope_hadamard_cast_store(*args, **kw, variant="v3"))  # noqa: B023
            nbytes = rows * fmt.dim * 2 + rows * fmt.row_bytes
            case = f"{fmt.name}_rows{rows}" + ("" if order == "paged" else f"_{order}")
            h.report(OP, case, nbytes, us, eager_us=eager_us, compile_us=compile_us,
                     peers=peers)
            del kv, cache
            torch.cuda.empty_cache()
    if os.environ.get("KV_STORE_SWEEP", "0") != "0":
        sweep(None if os.environ["KV_STORE_SWEEP"] == "1" else os.environ["KV_STORE_SWEEP"].split(","))


# (chunks per lane, rows per thread, min CTAs per SM[, v3 options]) per format: the session-18 sweep around
# the defaults (earlier sweeps and their register / stack notes: bench_results/h200.txt and the comments at
# MIN_CTAS_V3 / V3_OPTIONS in tilelang_ops/kv_store.py).
_FP4_MAIN_OPTS = "scale_mul,inv_table,e2m1_noclamp,weight_smem,rope_spread"
_IDX_OPTS = "e2m1_bf16x2,weight_smem"
_FP8_OPTS = "weight_smem,rope_spread"
_A = ",amax_bf16x2"
_R = ",rcp_norm"
_M = ",hadamard_mma"
_S = ",pred_store"
_F = ",rstd_first"
SWEEP = {"fp8_main": ((2, 2, 7, _FP8_OPTS + _A + _R), (2, 2, 7, _FP8_OPTS + _A + _R + _S),
                      (2, 2, 6, _FP8_OPTS + _A + _R + _S)),
         "fp4_main": ((2, 2, 6, _FP4_MAIN_OPTS), (2, 2, 6, _FP4_MAIN_OPTS + _S),
                      (2, 2, 6, _FP4_MAIN_OPTS + _S + _R),
                      (2, 2, 6, _FP4_MAIN_OPTS + _S + _A), (2, 2, 7, _FP4_MAIN_OPTS + _S),
                      (2, 2, 6, _FP4_MAIN_OPTS + _S)),
         "fp4_index": ((2, 2, 5, _IDX_OPTS), (2, 2, 4, _IDX_OPTS + _M + _S), (2, 2, 5, _IDX_OPTS + _M + _S),
                       (2, 2, 4, _IDX_OPTS + _M + _S + _F), (2, 2, 4, _IDX_OPTS + _M + _S)),
         "bf16": ((2, 2, 5, "weight_smem"), (2, 2, 5, "weight_smem" + _S), (2, 2, 4, "weight_smem" + _S))}


@contextlib.contextmanager
def _env(**env):
    """Set environment variables for the block (the kernel wrapper reads its overrides per call)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


def sweep(names=None) -> None:
    """v3's launch shapes in SWEEP at 1M rows (kernels compiled first, in parallel processes), for the
    formats named in ``names`` (KV_STORE_SWEEP=fp4_main,...; None: every format)."""
    from tilelang_ops.build import compile_in_processes
    from tilelang_ops.kv_store import norm_rope_hadamard_cast_store, v3_options

    rows = 1 << 20
    items = [(fmt.name, 64, True, hadamard, False, ROWS_PER_BLOCK if fmt.block_sections else 1, "bfloat16",
              "int64", "int64", e[1], e[0], e[2]) + v3_options(fmt, _opts(e))
             for fmt, hadamard in FORMATS for e in SWEEP[fmt.name] if names is None or fmt.name in names]
    compile_in_processes([("tilelang_ops.kv_store", "kv_store_kernel_v3", item) for item in items],
                         report=lambda line: None)
    for fmt, hadamard in FORMATS:
        if names is not None and fmt.name not in names:
            continue
        kv, w, cos, sin, pos, slots, cache = _inputs(fmt, rows)
        args = (kv, w, 1e-6, cos, sin, pos, slots, cache, fmt)
        del kv, cache
        nbytes = rows * fmt.dim * 2 + rows * fmt.row_bytes
        for e in SWEEP[fmt.name]:
            chunks, rpt, mc = e[:3]
            opts = ",".join(_opts(e)) or "none"
            with _env(KV_STORE_ROWS_PER_THREAD=rpt, KV_STORE_CHUNKS=chunks, KV_STORE_MIN_CTAS=mc,
                      KV_STORE_V3_OPTIONS=opts):
                us = _time_kernel(norm_rope_hadamard_cast_store, args, hadamard)
            print(f"SWEEP {OP} {fmt.name}_rows{rows} chunks={chunks} rows_per_thread={rpt} min_ctas={mc} "
                  f"options={opts} us={us:.1f} GBps={nbytes / us / 1e3:.0f}", flush=True)
        args = None  # free the cache before the next case's allocation
        torch.cuda.empty_cache()


def _opts(entry) -> tuple:
    """A SWEEP entry's v3 cast option names (the optional fourth field, comma-separated)."""
    return tuple(n for n in (entry[3] if len(entry) > 3 else "").split(",") if n)


def _time_kernel(fn, args, hadamard) -> float:
    return time_us(lambda: fn(*args, hadamard=hadamard, variant="v3"))
