"""compress_store: the fused kernel vs our two-kernel pipeline (compress kernel, then store kernel) and
the twin composition (torch eager and torch.compile).

Bytes (what a perfect fused kernel must move): projected_kv read + ring entries read (groups that
began before the step) + ring entries written + cache rows written (stored rows x fmt.row_bytes) +
out_norm written (rows x D x 2). The two-kernel pipeline additionally writes and re-reads the BF16
rows. Metadata comes from the builder; the ring is the engine's default (7 for C2).

``run(h, sweep=True)`` (``python -m benchmarks compress_store --sweep``) also times the prefill kernel at the
launch shapes of ``PREFILL_SWEEP`` on 1M FP8 tokens (lines ``SWEEP compress_store ...``: tuning data, not
BENCH lines); ``cases=("b1q1", ...)`` (``--cases b1q1,...``) runs only the cases whose id contains one.
"""

from __future__ import annotations

import torch

from benchmarks.harness import Harness, compile_peer, time_graph_us, time_peer, time_us
from metadata.cache_format import FP4_MAIN_KV_FORMAT, FP8_MAIN_KV_FORMAT
from reference.compress_store import (
    compress_store_decode_torch,
    compress_store_decode_torch_unchecked,
    compress_store_prefill_torch,
    compress_store_prefill_torch_unchecked,
)
from tilelang_ops.testing.compress_store import PREFILL_SWEEP
from tilelang_ops.testing.compress_store import decode_batch as _decode
from tilelang_ops.testing.compress_store import prefill_batch as _prefill

OP = "compress_store"
# (requests, format, out_norm). Cases without out_norm do the work of vLLM's fused kernel (compress,
# RMSNorm, RoPE, FP8 insert), the peer the issue names; `_norm` cases also write the indexer's BF16 rows.
PREFILL_CASES = {"tokens1048576_fp8": (256, FP8_MAIN_KV_FORMAT, False),
                 "tokens1048576_fp8_norm": (256, FP8_MAIN_KV_FORMAT, True),
                 "tokens65536_fp8": (16, FP8_MAIN_KV_FORMAT, False),
                 "tokens1048576_fp4": (256, FP4_MAIN_KV_FORMAT, False),
                 "tokens65536_fp4": (16, FP4_MAIN_KV_FORMAT, False)}
DECODE_CASES = {"b1q1_fp8": (1, 1), "b64q6_fp8": (64, 6), "b4096q6_fp8": (4096, 6)}
TINY_TOKENS = 512  # at or below this many query tokens, time CUDA-graph replays (launch-bound)


def _case(h, case, args, kw, nbytes, fused, two_kernel, twin, compiled, tiny):
    """One BENCH line: ``fused`` (the prefill or decode wrapper) at the launch rule's config; the two-kernel
    pipeline and the twin (eager, compiled) as peers."""
    timer = time_graph_us if tiny else time_us
    us = timer(lambda: fused(*args, **kw))
    peers = {"two_kernel": time_peer("two_kernel", lambda: two_kernel(*args, **kw), timer)}
    eager = time_peer("eager", lambda: twin(*args, **kw), timer)
    comp = time_peer("compile", lambda: compiled(*args, **kw), timer) if compiled is not None else None
    h.report(OP, case, nbytes, us, eager_us=eager, compile_us=comp,
             peers={k: v for k, v in peers.items() if v is not None} or None)


def run(h: Harness, sweep: bool = False, cases: tuple[str, ...] | None = None) -> None:
    from tilelang_ops.compress_store import (
        compress_store_decode,
        compress_store_prefill,
        two_kernel_decode,
        two_kernel_prefill,
    )

    if sweep:
        run_sweep()
    # the twin peers time the twins' arithmetic alone; each case is validated once by the checked twin
    cp = compile_peer(compress_store_prefill_torch_unchecked)
    cd = compile_peer(compress_store_decode_torch_unchecked)
    only = cases or ()
    for case, (num_reqs, fmt, norm) in PREFILL_CASES.items():
        if only and not any(o in case for o in only):
            continue
        args, kw, nbytes = _prefill(num_reqs, fmt, norm)
        compress_store_prefill_torch(*args, **kw)
        _case(h, case, args, kw, nbytes, compress_store_prefill, two_kernel_prefill,
              compress_store_prefill_torch_unchecked, cp, tiny=False)
        del args, kw
        torch.cuda.empty_cache()
    for case, (batch, q) in DECODE_CASES.items():
        if only and not any(o in case for o in only):
            continue
        args, kw, nbytes = _decode(batch, q, FP8_MAIN_KV_FORMAT)
        compress_store_decode_torch(*args, **kw)
        _case(h, case, args, kw, nbytes, compress_store_decode, two_kernel_decode,
              compress_store_decode_torch_unchecked, cd, tiny=batch * q <= TINY_TOKENS)
        del args, kw
        torch.cuda.empty_cache()


def run_sweep() -> None:
    """The prefill kernel at every config of PREFILL_SWEEP (``--sweep``)."""
    from tilelang_ops.compress_store import compress_store_prefill

    args, kw, nbytes = _prefill(256, FP8_MAIN_KV_FORMAT, norm=False)
    for config in PREFILL_SWEEP:
        us = time_us(lambda: compress_store_prefill(*args, **kw, config=config))  # noqa: B023
        print(f"SWEEP {OP} tokens1048576_fp8 rows_per_warp={config.rows_per_warp} warps={config.warps} "
              f"min_ctas={config.min_ctas} us={us:.1f} GBps={nbytes / us / 1e3:.0f}")
