"""python -m benchmarks [OP ...] [--sweep] [--sweep-formats F,...] [--cases C,...] [--no-torch-peers]: run
the benchmark modules (all by default) on CUDA.

Prints a table and one BENCH line per case, writes them to bench_results/latest.txt, and merges each
operator's records into bench_results/<device>.jsonl (+ its plot) as soon as its module finishes.
``python -m benchmarks --plot FILE.jsonl`` redraws a plot from a results file.

Options (``make bench BENCH_ARGS="..."`` passes them on). Each goes, as a keyword of ``run(h, ...)``, to the
modules of ``MODULE_OPTIONS`` that take it; an option that no chosen module takes is an error:

    --sweep               kv_store, compress_store: also time the configs of their tuning sweeps (lines
                          ``SWEEP <op> ...``: tuning data for the default configs, not BENCH lines);
                          index_logits: also time other IndexLogitsConfig choices as peers
    --no-torch-peers      index_logits: skip the torch twins (eager and compiled; minutes at 65,536 keys)
    --sweep-formats F,..  kv_store: sweep only these formats (fp8_main, fp4_main, fp4_index, bf16);
                          implies --sweep
    --cases C,..          compress_store: only the cases whose id contains one of these (e.g. b1q1,b64q6)
"""

import argparse
import datetime
import importlib
import json
import os
import sys

import torch

from benchmarks.harness import RESULTS_DIR, Harness, current_commit, device_slug
from benchmarks.results import plot, save

BENCH_MODULES = ("compress", "kv_store", "compress_store", "topk", "gather_rows", "index_logits", "host")
# the command-line options each module's run(h, ...) takes as keywords (the others take the harness alone)
MODULE_OPTIONS = {"kv_store": ("sweep", "sweep_formats"), "compress_store": ("sweep", "cases"),
                  "index_logits": ("sweep", "no_torch_peers")}


def _names(text: str) -> tuple[str, ...]:
    return tuple(n for n in text.split(",") if n)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Time each operator's kernels beside their peers and the copy roofline (CUDA).",
        epilog=f"operators: {', '.join(BENCH_MODULES)}")
    p.add_argument("ops", nargs="*", metavar="OP", help="benchmark modules to run (default: all)")
    p.add_argument("--plot", metavar="FILE", help="redraw the plot of a results file (.jsonl) and exit")
    p.add_argument("--sweep", action="store_true",
                   help="kv_store, compress_store: also time the configs of their tuning sweeps; "
                        "index_logits: also time other tuning configs as peers")
    p.add_argument("--sweep-formats", type=_names, default=None, metavar="F,...",
                   help="kv_store: sweep only these cache formats (implies --sweep)")
    p.add_argument("--cases", type=_names, default=None, metavar="C,...",
                   help="compress_store: only the cases whose id contains one of these substrings")
    p.add_argument("--no-torch-peers", action="store_true",
                   help="index_logits: skip the torch twins (eager and compiled)")
    return p


def main(argv):
    args = _parser().parse_intermixed_args(argv)
    if args.plot is not None:
        with open(args.plot) as f:
            records = [json.loads(line) for line in f if line.strip()]
        png = os.path.splitext(args.plot)[0] + ".png"
        return 0 if plot(records, png) else 1
    unknown = [a for a in args.ops if a not in BENCH_MODULES]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; known: {list(BENCH_MODULES)}")
        return 2
    wanted = args.ops or list(BENCH_MODULES)
    options = {"sweep": args.sweep, "sweep_formats": args.sweep_formats, "cases": args.cases,
               "no_torch_peers": args.no_torch_peers}
    for key, value in options.items():
        takers = [op for op, keys in MODULE_OPTIONS.items() if key in keys]
        if value and not any(op in takers for op in wanted):
            print(f"--{key.replace('_', '-')} applies to {', '.join(takers)} only")
            return 2
    if not torch.cuda.is_available():
        print("make bench needs CUDA; no GPU here, nothing was timed.")
        return 0
    # Every case is a new static shape for the torch.compile peers: without a higher limit dynamo
    # stops recompiling after 8 and silently runs later cases eagerly (the "compile" column would
    # then time eager code).
    torch._dynamo.config.recompile_limit = max(256, torch._dynamo.config.recompile_limit)
    h = Harness()
    name = torch.cuda.get_device_name()
    print(f"device: {name}, torch {torch.__version__}")
    h.measure_roofline()
    slug, commit, date = device_slug(name), current_commit(), datetime.date.today().isoformat()
    for op in wanted:
        kw = {key: options[key] for key in MODULE_OPTIONS.get(op, ())}
        importlib.import_module(f"benchmarks.bench_{op}").run(h, **kw)
        path = save(h.records(slug, commit, date), slug)  # an operator's records are kept once it finishes
    table = h.table()
    print("\n" + table)
    os.makedirs(RESULTS_DIR, exist_ok=True)
    with open(os.path.join(RESULTS_DIR, "latest.txt"), "w") as f:
        f.write(table + "\n\n" + "\n".join(r["line"] for r in h.rows) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
