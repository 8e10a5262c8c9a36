"""norm_rope_hadamard_cast_store: the TileLang kernel vs the vectorized torch twin (eager and
torch.compile). Bytes = BF16 rows read + cache bytes written (no out_norm in these cases).

Slot order: the main cases store like the engine does for a prefill (``paged``: consecutive rows fill
consecutive slots of a block, the blocks in a random order, as a block table hands them out); the
``_rowperm`` cases at 1M rows scatter every row to a random slot (a random permutation of all slots).
The two differ in what the memory system sees, not in the kernel's work: a FP8 main row (528 B) or a
FP4 index row's 4 scale bytes cover only part of a 32-byte sector, and with random rows the other part
of that sector is written much later, after the sector has left L2 (a partial-sector write back).

Peer ``plain``: the kernel with every option off at 5 CTAs per SM (``plain_config``), what the options buy.
``run(h, sweep=True)`` (``python -m benchmarks kv_store --sweep``) also times the configs of ``SWEEP`` at 1M
rows (``sweep_formats=("fp4_main", ...)``, ``--sweep-formats fp4_main,...``: those formats only; lines
``SWEEP kv_store ...``: tuning data for ``DEFAULT_CONFIGS``, not reported)."""

from __future__ import annotations

import torch

from benchmarks.harness import Harness, compile_peer, time_graph_us, time_peer, time_us
from metadata.cache_format import BF16_KV_FORMAT, FP4_INDEX_KV_FORMAT, FP4_MAIN_KV_FORMAT, FP8_MAIN_KV_FORMAT
from metadata.kv_store_args import check_store_args, check_store_values
from reference.kv_store import norm_rope_hadamard_cast_store_torch_unchecked
from tilelang_ops.kv_store import DEFAULT_CONFIGS, OPTION_NAMES, launch_config
from tilelang_ops.testing.kv_store import BENCH_ROWS_PER_BLOCK as ROWS_PER_BLOCK
from tilelang_ops.testing.kv_store import bench_inputs as _inputs

OP = "kv_store"
ROWS = (1 << 20, 65536, 64, 1)
FORMATS = ((FP8_MAIN_KV_FORMAT, False), (FP4_MAIN_KV_FORMAT, False), (FP4_INDEX_KV_FORMAT, True),
           (BF16_KV_FORMAT, False))
TINY = 64  # at or below this many rows, time CUDA-graph replays (launch-bound)
ORDERS = {1 << 20: ("paged", "rowperm")}  # slot orders per row count (default: paged only)
_OFF = {n: False for n in OPTION_NAMES}


def plain_config(fmt, rows):
    """The launch rule's config of ``rows`` rows with every option off, at 5 CTAs per SM (the plain
    kernel's register count)."""
    return launch_config(fmt, rows).replace(min_ctas=5, **_OFF)


def run(h: Harness, sweep: bool = False, sweep_formats: tuple[str, ...] | None = None) -> None:
    from tilelang_ops.kv_store import norm_rope_hadamard_cast_store

    unknown = sorted(set(sweep_formats or ()) - set(SWEEP))
    if unknown:  # before the cases, which take minutes
        raise ValueError(f"kv_store sweep: unknown format(s) {unknown}; known: {list(SWEEP)}")
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
            plain = plain_config(fmt, rows)
            peers = {"plain": timer(lambda: norm_rope_hadamard_cast_store(*args, **kw, config=plain))}  # noqa: B023
            nbytes = rows * fmt.dim * 2 + rows * fmt.row_bytes
            case = f"{fmt.name}_rows{rows}" + ("" if order == "paged" else f"_{order}")
            h.report(OP, case, nbytes, us, eager_us=eager_us, compile_us=compile_us,
                     peers=peers)
            del kv, cache
            torch.cuda.empty_cache()
    if sweep or sweep_formats:
        run_sweep(sweep_formats or None)


def _sweep_configs(name):
    """The configs around the format's default that the sweep times: min CTAs per SM one up and down,
    pred_store flipped (where it applies), every option off."""
    d = DEFAULT_CONFIGS[name]
    configs = [d, d.replace(min_ctas=d.min_ctas + 1), d.replace(min_ctas=max(d.min_ctas - 1, 0)),
               d.replace(pred_store=not d.pred_store), d.replace(min_ctas=5, **_OFF)]
    return list(dict.fromkeys(configs))


SWEEP = {fmt.name: _sweep_configs(fmt.name) for fmt, _ in FORMATS}


def run_sweep(names=None) -> None:
    """The configs of SWEEP at 1M rows (kernels compiled first, in parallel processes), for the formats
    named in ``names`` (None: every format)."""
    from tilelang_ops.build import compile_in_processes
    from tilelang_ops.kv_store import norm_rope_hadamard_cast_store, static_args

    rows = 1 << 20
    chosen = [(fmt, hadamard) for fmt, hadamard in FORMATS if names is None or fmt.name in names]
    items = [static_args(fmt, 64, True, hadamard, False, ROWS_PER_BLOCK, "bfloat16", "int64", "int64", c)
             for fmt, hadamard in chosen for c in SWEEP[fmt.name]]
    compile_in_processes([("tilelang_ops.kv_store", "kv_store_kernel", item) for item in items],
                         report=lambda line: None)
    for fmt, hadamard in chosen:
        kv, w, cos, sin, pos, slots, cache = _inputs(fmt, rows)
        args = (kv, w, 1e-6, cos, sin, pos, slots, cache, fmt)
        del kv, cache
        nbytes = rows * fmt.dim * 2 + rows * fmt.row_bytes
        for config in SWEEP[fmt.name]:
            us = time_us(lambda: norm_rope_hadamard_cast_store(*args, hadamard=hadamard,  # noqa: B023
                                                               config=config))  # noqa: B023
            print(f"SWEEP {OP} {fmt.name}_rows{rows} chunks={config.chunks} "
                  f"rows_per_thread={config.rows_per_thread} min_ctas={config.min_ctas} "
                  f"options={','.join(config.options()) or 'none'} us={us:.1f} GBps={nbytes / us / 1e3:.0f}",
                  flush=True)
        args = None  # free the cache before the next case's allocation
        torch.cuda.empty_cache()
