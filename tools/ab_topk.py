"""A/B timing of top-k variants on the GPU: the module as it stands ("base") against copies of
tilelang_ops/topk.py with top-level constants overridden, or another file of the same module, all
timed interleaved in one process with the benchmark's harness (time_us, the 256 MiB L2 flush), so a
change of ~1% is not lost in the drift between runs. Each variant's kernels are compiled first, in
parallel processes, into TileLang's disk cache (TILELANG_CACHE_DIR).

    PYTHONPATH=. python tools/ab_topk.py --case b64n32768k2048 --dist randn,few \
        --variant s1:V3_SAMPLE_SHORT=1 --variant sd35:V3_SAMPLE_SD=3.5 --variant old@/tmp/topk_old.py

A variant is TAG:NAME=VALUE[,NAME=VALUE...] (overrides of `NAME = ...` lines of topk.py) or
TAG@PATH (a whole file) or both (TAG@PATH:NAME=VALUE). Every variant's output is checked against
base's (the same index set); the table gives the median over --rounds of each round's median.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
SRC = os.path.join(ROOT, "tilelang_ops", "topk.py")
OUT_DIR = os.path.join(ROOT, ".cache", "ab")  # module copies of this tool and tools/ab_kv_store.py


def parse_variant(spec: str) -> tuple:
    """(tag, source path, [(name, value)]) of a --variant argument."""
    head, _, sets = spec.partition(":")
    tag, _, path = head.partition("@")
    overrides = [tuple(s.split("=", 1)) for s in sets.split(",") if s]
    if not re.fullmatch(r"[A-Za-z0-9_]+", tag) or any(len(o) != 2 for o in overrides):
        raise SystemExit(f"bad --variant {spec!r}: TAG[@PATH][:NAME=VALUE,...]")
    return tag, path or SRC, overrides


def module_file(op: str, tag: str, path: str, overrides=()) -> str:
    """A copy of `path` (a version of tilelang_ops/<op>.py) with the overrides applied, for variant `tag`
    (a real file: TileLang reads a prim_func's source)."""
    text = open(path).read()
    for name, value in overrides:
        text, n = re.subn(rf"^{name} = .*$", f"{name} = {value}", text, count=1, flags=re.M)
        if n != 1:
            raise SystemExit(f"{name}: no top-level `{name} = ...` line in {path}")
    os.makedirs(OUT_DIR, exist_ok=True)
    out = os.path.join(OUT_DIR, f"{op}_ab_{tag}.py")
    if not os.path.exists(out) or open(out).read() != text:
        with open(out, "w") as f:
            f.write(text)
    return out


def load(op: str, tag: str, path: str | None):
    """tilelang_ops.<op> itself (path None), else the module copy at `path` as tilelang_ops.<op>_ab_<tag>."""
    if path is None:
        return importlib.import_module(f"tilelang_ops.{op}")
    name = f"tilelang_ops.{op}_ab_{tag}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def parse_case(case: str) -> tuple:
    m = re.fullmatch(r"b(\d+)n(\d+)k(\d+)", case)
    if not m:
        raise SystemExit(f"bad --case {case!r}: like b64n32768k2048")
    return tuple(int(v) for v in m.groups())


def _scores(dist, b, n):
    import torch

    from tests.test_topk import make_scores

    torch.manual_seed(0)
    return make_scores(dist, b, n, device="cuda")


def warm(job) -> str:
    """Compile (into the disk cache) what variant `tag` launches on every case."""
    tag, path, cases, dists = job
    mod = load("topk", tag, path)
    for case in cases:
        b, n, k = parse_case(case)
        for dist in dists:
            mod.topk(_scores(dist, b, n), k, return_value=False)
    return tag


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", required=True, help="bBnNkK, repeatable")
    ap.add_argument("--dist", default="randn", help="comma-separated distributions of tests.test_topk")
    ap.add_argument("--variant", action="append", default=[], help="TAG[@PATH][:NAME=VALUE,...]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    import torch

    from benchmarks.harness import time_us

    dists = args.dist.split(",")
    variants = [("base", None)]
    for spec in args.variant:
        tag, path, overrides = parse_variant(spec)
        variants.append((tag, module_file("topk", tag, path, overrides)))
    jobs = [(tag, path, args.case, dists) for tag, path in variants]
    with mp.get_context("spawn").Pool(min(args.workers, len(jobs))) as pool:
        for tag in pool.imap_unordered(warm, jobs):
            print(f"compiled {tag}", flush=True)
    mods = {tag: load("topk", tag, path) for tag, path in variants}
    times = {}
    for case in args.case:
        b, n, k = parse_case(case)
        for dist in dists:
            x = _scores(dist, b, n)
            want = mods["base"].topk(x, k, return_value=False)[1]
            for tag, mod in mods.items():
                got = mod.topk(x, k, return_value=False)[1]
                if not torch.equal(got.sort(dim=1).values, want.sort(dim=1).values):
                    raise SystemExit(f"{tag} differs from base on {case} {dist}")
            for _ in range(args.rounds):
                for tag, mod in mods.items():
                    us = time_us(lambda mod=mod, x=x, k=k: mod.topk(x, k, return_value=False),
                                 flush_bytes=256 << 20)
                    times.setdefault((case, dist, tag), []).append(us)
    tags = [tag for tag, _ in variants]
    print(f"{'case':<18} {'dist':<8} " + " ".join(f"{t:>10}" for t in tags))
    for case in args.case:
        for dist in dists:
            row = [statistics.median(times[(case, dist, t)]) for t in tags]
            print(f"{case:<18} {dist:<8} " + " ".join(f"{v:>10.2f}" for v in row))
    print("(us, median of the rounds' medians; every round times the variants in turn)")


if __name__ == "__main__":
    main()
