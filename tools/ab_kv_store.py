"""A/B timing of kv_store variants on the GPU, like tools/ab_topk.py: the module as it stands ("base")
against another file of tilelang_ops/kv_store.py and / or environment overrides (KV_STORE_V3_OPTIONS,
KV_STORE_MIN_CTAS, ...), timed in turn in one process on the benchmark's inputs (bench_kv_store._inputs,
engine slot order), with the copy roofline measured in the same run. Every variant's cache bytes are
compared with base's (equal, or the count of differing bytes is printed).

    PYTHONPATH=. python tools/ab_kv_store.py --case fp4_index:1048576 --case fp4_main:1048576 \
        --variant old@/tmp/kv_store_old.py --variant ctas5:KV_STORE_MIN_CTAS=5 [--rounds 5]

A variant is TAG@PATH, TAG:ENV=VALUE[,ENV=VALUE...] or both (TAG@PATH:ENV=VALUE).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.bench_kv_store import _env  # noqa: E402
from tools.ab_topk import load as load_op  # noqa: E402
from tools.ab_topk import module_file  # noqa: E402


def parse_variant(spec: str) -> tuple:
    """(tag, module file or None, {env: value}) of a --variant argument."""
    head, _, sets = spec.partition(":")
    tag, _, path = head.partition("@")
    env = dict(s.split("=", 1) for s in sets.split(",") if s)
    if not re.fullmatch(r"[A-Za-z0-9_]+", tag):
        raise SystemExit(f"bad --variant {spec!r}: TAG[@PATH][:ENV=VALUE,...]")
    return tag, module_file("kv_store", tag, path) if path else None, env


def load(tag: str, path: str | None):
    return load_op("kv_store", tag, path)


def case_inputs(case: str):
    from benchmarks.bench_kv_store import FORMATS, _inputs

    name, rows = case.split(":")
    for fmt, hadamard in FORMATS:
        if fmt.name == name:
            return fmt, hadamard, _inputs(fmt, int(rows))
    raise SystemExit(f"bad --case {case!r}: FORMAT:ROWS, FORMAT in {[f.name for f, _ in FORMATS]}")


def call(mod, fmt, hadamard, data, cache):
    kv, w, cos, sin, pos, slots, _ = data
    mod.norm_rope_hadamard_cast_store(kv, w, 1e-6, cos, sin, pos, slots, cache, fmt, hadamard=hadamard)


def warm(job) -> str:
    tag, path, env, cases = job
    mod = load(tag, path)
    with _env(**env):
        for case in cases:
            fmt, hadamard, data = case_inputs(case)
            call(mod, fmt, hadamard, data, data[-1])
    return tag


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", required=True, help="FORMAT:ROWS, repeatable")
    ap.add_argument("--variant", action="append", default=[], help="TAG[@PATH][:ENV=VALUE,...]")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    import torch

    from benchmarks.harness import Harness, time_us

    variants = [("base", None, {})] + [parse_variant(v) for v in args.variant]
    jobs = [(tag, path, env, args.case) for tag, path, env in variants]
    with mp.get_context("spawn").Pool(min(4, len(jobs))) as pool:
        for tag in pool.imap_unordered(warm, jobs):
            print(f"compiled {tag}", flush=True)
    mods = {tag: (load(tag, path), env) for tag, path, env in variants}
    h = Harness()
    roof = h.measure_roofline()
    times = {}
    for case in args.case:
        fmt, hadamard, data = case_inputs(case)
        rows = data[0].shape[0]
        nbytes = rows * fmt.dim * 2 + rows * fmt.row_bytes
        want = None
        for tag, (mod, env) in mods.items():
            cache = torch.zeros_like(data[-1])
            with _env(**env):
                call(mod, fmt, hadamard, data, cache)
            if want is None:
                want = cache
            elif not torch.equal(cache, want):
                print(f"{tag}: {int((cache != want).sum())} cache bytes differ from base on {case}")
        for _ in range(args.rounds):
            for tag, (mod, env) in mods.items():
                with _env(**env):
                    us = time_us(lambda mod=mod, fmt=fmt, hadamard=hadamard, data=data:
                                 call(mod, fmt, hadamard, data, data[-1]))
                times.setdefault((case, tag), []).append(us)
        for tag in mods:
            us = statistics.median(times[(case, tag)])
            frac = nbytes / us / 1e3 / roof
            print(f"AB kv_store {case} {tag}: {us:.1f} us (rounds {min(times[(case, tag)]):.1f} .. "
                  f"{max(times[(case, tag)]):.1f}), {frac:.3f} of the copy roofline ({roof:.0f} GB/s)",
                  flush=True)


if __name__ == "__main__":
    main()
