"""python -m benchmarks [OP ...]: run the benchmark modules (all by default) on CUDA.

Prints a table and one BENCH line per case, writes them to bench_results/latest.txt, and merges each
operator's records into bench_results/<device>.jsonl (+ its plot) as soon as its module finishes.
``python -m benchmarks --plot FILE.jsonl`` redraws a plot from a results file.
"""

import datetime
import importlib
import json
import os
import sys

import torch

from benchmarks.harness import RESULTS_DIR, Harness, current_commit, device_slug
from benchmarks.results import plot, save

BENCH_MODULES = ("compress", "kv_store", "compress_store", "topk", "gather_rows", "index_logits", "host")


def main(argv):
    if argv[:1] == ["--plot"]:
        with open(argv[1]) as f:
            records = [json.loads(line) for line in f if line.strip()]
        png = os.path.splitext(argv[1])[0] + ".png"
        return 0 if plot(records, png) else 1
    if not torch.cuda.is_available():
        print("make bench needs CUDA; no GPU here, nothing was timed.")
        return 0
    unknown = [a for a in argv if a not in BENCH_MODULES]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; known: {list(BENCH_MODULES)}")
        return 2
    wanted = argv or list(BENCH_MODULES)
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
        importlib.import_module(f"benchmarks.bench_{op}").run(h)
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
