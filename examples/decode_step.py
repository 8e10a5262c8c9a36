"""The index read path of a decode step (and of a prefill chunk), end to end, with each stage's device time.

decode: projected inputs -> compress_store_decode (FP8 main cache) -> index branch: the norm-stage rows
(out_norm) -> torch linear to 128 -> norm_rope_hadamard_cast_store (Hadamard) into the FP4 index cache ->
quantize_index_rows of the queries -> paged_index_logits -> topk_to_slots (physical main-cache slots);
prefill: compress_store_prefill -> the same index branch -> the request's index rows gathered ->
ragged_index_logits -> topk with output_idx_offset.

The chain after the index store is checked bitwise against the references run on the stored index cache
(the store's default FP4 index kernel sums part of the Hadamard on tensor cores, so its codes may sit one
step from its reference's; everything before the store is checked bitwise too). Prints a table of stage
times and writes a bar chart (PNG, where matplotlib is installed).

    python examples/decode_step.py [--requests 64] [--tokens 1] [--context 65536] [--k 2048]
        [--prefill-chunk 4096] [--png index_path.png]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from tilelang_ops.testing import compare_bitwise  # noqa: E402
from tilelang_ops.testing.index_path import (  # noqa: E402
    CudaStageTimer,
    PathCase,
    build_path,
    kernel_ops,
    reference_ops,
    run,
)


def timed_step(case: PathCase):
    """Build the step, run it once (JIT compiles), check it, run it again under the stage timer."""
    p = build_path(case, device="cuda")
    ops = kernel_ops()
    got = run(p, ops)
    ref = run(p, reference_ops(), index_cache=got["index_cache"])
    key = "indices" if case.prefill else "slots"
    out = got[key] if not case.prefill else torch.sort(got[key], 1).values
    want = ref[key] if not case.prefill else torch.sort(ref[key], 1).values
    checks = [compare_bitwise(key, out, want), compare_bitwise("q_codes", got["q_codes"], ref["q_codes"])]
    timer = CudaStageTimer()
    run(p, ops, timer=timer)
    return timer.times_us(), checks


def report(title, times):
    total = sum(times.values())
    print(f"\n{title}: {total:,.1f} us of device time")
    width = max(len(k) for k in times)
    for name, us in times.items():
        print(f"  {name.ljust(width)}  {us:10,.1f} us  {100 * us / total:5.1f}%")


def bar_chart(results, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no chart written ({path})")
        return
    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.2 + 0.45 * sum(len(t) for _, t in results)))
    axes = axes if len(results) > 1 else [axes]
    for ax, (title, times) in zip(axes, results):
        names = list(times)[::-1]
        ax.barh(names, [times[n] for n in names], color="#4a7ab8")
        ax.set_title(f"{title}: {sum(times.values()):,.0f} us")
        ax.set_xlabel("device time (us)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"chart: {path}")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1, help="query tokens per request (1-8)")
    ap.add_argument("--context", type=int, default=65536, help="context length of every request")
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--prefill-chunk", type=int, default=4096, help="0: no prefill step")
    ap.add_argument("--png", default="index_path.png")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("the example runs the TileLang kernels: it needs a CUDA device")
        return 0
    results, failed = [], 0
    steps = [(f"decode b={a.requests} n={a.tokens} context={a.context}",
              PathCase("decode", False, (a.context,) * a.requests, a.tokens, k=a.k))]
    if a.prefill_chunk:
        steps.append((f"prefill chunk {a.prefill_chunk} of context {a.context}",
                      PathCase("prefill", True, (a.context,), a.prefill_chunk, k=a.k)))
    for title, case in steps:
        times, checks = timed_step(case)
        report(title, times)
        for c in checks:
            verdict = "bitwise equal to the reference chain" if c.passed else c.message()
            print(f"  check {c.output}: {verdict}")
            failed += not c.passed
        results.append((title, times))
    bar_chart(results, a.png)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
