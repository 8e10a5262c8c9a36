"""python -m benchmarks [OP ...]: run the benchmark modules (all by default) on CUDA."""

import importlib
import os
import sys

import torch

from benchmarks.harness import RESULTS_DIR, Harness

BENCH_MODULES = ("compress", "kv_store", "compress_store", "topk")


def main(argv):
    if not torch.cuda.is_available():
        print("make bench needs CUDA; no GPU here, nothing was timed.")
        return 0
    wanted = argv or list(BENCH_MODULES)
    # Every case is a new static shape for the torch.compile peers: without a higher limit dynamo
    # stops recompiling after 8 and silently runs later cases eagerly (the "compile" column would
    # then time eager code).
    torch._dynamo.config.recompile_limit = max(256, torch._dynamo.config.recompile_limit)
    h = Harness()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    h.measure_roofline()
    for name in wanted:
        try:
            mod = importlib.import_module(f"benchmarks.bench_{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"benchmarks.bench_{name}":
                raise
            print(f"{name}: no benchmark yet")
            continue
        mod.run(h)
    table = h.table()
    print("\n" + table)
    os.makedirs(RESULTS_DIR, exist_ok=True)
    with open(os.path.join(RESULTS_DIR, "latest.txt"), "w") as f:
        f.write(table + "\n\n" + "\n".join(r["line"] for r in h.rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
