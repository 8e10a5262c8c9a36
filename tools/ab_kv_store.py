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
import contextlib
import importlib.util
import multiprocessing as mp
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
OUT_DIR = os.path.join(ROOT, ".cache", "ab_kv_store")


def parse_variant(spec: str) -> tuple:
    """(tag, module file or None, {env: value}) of a --variant argument."""
    head, _, sets = spec.partition(":")
    tag, _, path = head.partition("@")
    env = dict(s.split("=", 1) for s in sets.split(",") if s)
    if not re.fullmatch(r"[A-Za-z0-9_]+", tag):
        raise SystemExit(f"bad --variant {spec!r}: TAG[@PATH][:ENV=VALUE,...]")
    if path:  # a real file under .cache (TileLang reads a prim_func's source)
        os.makedirs(OUT_DIR, exist_ok=True)
        out = os.path.join(OUT_DIR, f"kv_store_ab_{tag}.py")
        text = open(path).read()
        if not os.path.exists(out) or open(out).read() != text:
            with open(out, "w") as f:
                f.write(text)
        path = out
    return tag, path or None, env


def load(tag: str, path: str | None):
    if path is None:
        import tilelang_ops.kv_store as mod

        return mod
    name = f"tilelang_ops.kv_store_ab_{tag}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


@contextlib.contextmanager
def environ(env: dict):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


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
    with environ(env):
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
            with environ(env):
                call(mod, fmt, hadamard, data, cache)
            if want is None:
                want = cache
            elif not torch.equal(cache, want):
                print(f"{tag}: {int((cache != want).sum())} cache bytes differ from base on {case}")
        for _ in range(args.rounds):
            for tag, (mod, env) in mods.items():
                with environ(env):
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
