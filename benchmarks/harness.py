"""Shared timing harness: CUDA-event medians, the copy roofline, the BENCH line format, the results file.

Every op's benchmark module (benchmarks/bench_<op>.py) exposes ``run(harness) -> None`` and calls
``Harness.report`` once per case. Timings are never asserted anywhere.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field

import torch

RESULTS_DIR = "bench_results"


def device_slug(name: str) -> str:
    """``NVIDIA H200`` -> ``h200``: the results file's name for a device."""
    name = re.sub(r"^nvidia\s+", "", name.strip().lower())
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "gpu"


def current_commit() -> str:
    """The commit being measured: TILELANG_OPS_COMMIT where the tree travels without its .git, else git's
    HEAD (``+dirty`` with uncommitted changes), else ``unknown``."""
    if os.environ.get("TILELANG_OPS_COMMIT"):
        return os.environ["TILELANG_OPS_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


HOST_HIDE_CYCLES = 1_000_000  # ~0.5 ms of GPU spin before each timed launch (see time_us)


def time_us(fn, *, warmup: int = 5, rep: int = 30, flush_bytes: int = 0) -> float:
    """Median microseconds of ``fn()`` over ``rep`` launches timed with CUDA events: device time of
    what ``fn`` enqueues, not the host's Python work.

    Before each start event the GPU gets a spin kernel that outlasts the host side of ``fn`` (queued
    after the L2 flush when there is one: the flush alone can take less time than the host work): the
    start event is then stamped when the spin ends, after ``fn``'s kernels are already queued. Without
    it the GPU idles from the start event until the wrapper has validated its arguments and launched
    (measured on the H200: ~60 us per kv_store call, 10% of a 1M-row launch).
    With ``flush_bytes`` an L2-sized buffer is overwritten before each launch so inputs smaller than
    the cache are not timed from it (the H200 L2 is 60 MiB).
    """
    flush = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda") if flush_bytes else None
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rep):
        if flush is not None:
            flush.zero_()
        torch.cuda._sleep(HOST_HIDE_CYCLES)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def time_graph_us(fn, *, rep: int = 200) -> float:
    """Median microseconds per launch of ``fn`` replayed from a CUDA graph, for tiny launches where
    Python overhead would dominate a plain loop; falls back to plain timing if capture fails."""
    try:
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            fn()
            torch.cuda.synchronize()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(10):
                    fn()
        torch.cuda.synchronize()
        return time_us(graph.replay, warmup=3, rep=max(3, rep // 10)) / 10
    except Exception:  # some peers (torch.compile) may refuse capture
        return time_us(fn, warmup=10, rep=rep)


def compile_peer(fn):
    """``torch.compile(fn, dynamic=False)``, or None (reported) where torch.compile is unavailable."""
    try:
        return torch.compile(fn, dynamic=False)
    except Exception as exc:  # noqa: BLE001 - a peer that cannot compile is reported, not fatal
        print(f"torch.compile unavailable: {exc}")
        return None


def time_peer(name: str, fn, timer) -> float | None:
    """Median us of a peer, run once first (so compiling stays outside the timed region); a peer that
    fails (compile errors, OOM) or is None is reported and gives None, never a crash."""
    if fn is None:
        return None
    try:
        fn()
        torch.cuda.synchronize()
        return timer(fn)
    except Exception as exc:  # noqa: BLE001
        print(f"peer {name} failed: {type(exc).__name__}: {str(exc)[:200]}")
        torch.cuda.empty_cache()
        return None


@dataclass
class Harness:
    """Measures the copy roofline once and collects one row per case."""

    rows: list = field(default_factory=list)
    host_rows: list = field(default_factory=list)
    copy_gbps: float = 0.0
    only: str | None = None  # run only ops whose name contains this

    def measure_roofline(self, nbytes: int = 2 << 30) -> float:
        """Device-to-device copy GB/s, counting bytes read plus bytes written."""
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        us = time_us(lambda: dst.copy_(src), warmup=3, rep=20)
        self.copy_gbps = 2 * src.numel() / (us * 1e-6) / 1e9
        print(f"copy roofline: {self.copy_gbps:,.0f} GB/s (read + write of {nbytes >> 20} MiB)")
        return self.copy_gbps

    def report(self, op: str, case: str, nbytes: int, us: float, *, eager_us: float | None = None,
               compile_us: float | None = None, peers: dict[str, float] | None = None) -> None:
        """One BENCH line: median us, GB/s over ``nbytes``, fraction of the copy roofline, speedups."""
        gbps = nbytes / (us * 1e-6) / 1e9
        roof = gbps / self.copy_gbps if self.copy_gbps else float("nan")
        x_eager = eager_us / us if eager_us else float("nan")
        x_compile = compile_us / us if compile_us else float("nan")
        extra = "".join(f" {k}_us={v:.1f} x_{k}={v / us:.2f}" for k, v in (peers or {}).items())
        line = (f"BENCH op={op} case={case} us={us:.1f} GBps={gbps:.0f} roofline={roof:.2f} "
                f"x_eager={x_eager:.2f} x_compile={x_compile:.2f}{extra}")
        print(line)
        sys.stdout.flush()
        self.rows.append(dict(op=op, case=case, us=us, gbps=gbps, roofline=roof, eager_us=eager_us,
                              compile_us=compile_us, peers=peers or {}, nbytes=nbytes, line=line))

    def report_host(self, case: str, us: float, device_us: float, x_torch_add: float) -> None:
        """One host-cost line (benchmarks/bench_host.py): eager wall us per call, graph-replay us."""
        line = (f"BENCH op=host case={case} us={us:.1f} device_us={device_us:.1f} "
                f"x_torch_add={x_torch_add:.2f}")
        print(line)
        sys.stdout.flush()
        self.host_rows.append(dict(op="host", case=case, us=us, device_us=device_us, x_torch_add=x_torch_add,
                                   line=line))

    def records(self, device: str, commit: str, date: str) -> list[dict]:
        """One JSON-ready record per case: ours, GB/s, roofline fraction, and every peer's us (eager and
        torch.compile of the reference twin included) with its roofline fraction over the same bytes."""
        out = []
        for r in self.rows:
            peers = dict(r["peers"])
            if r["eager_us"]:
                peers["torch_eager"] = r["eager_us"]
            if r["compile_us"]:
                peers["torch_compile"] = r["compile_us"]
            def frac(us, nbytes=r["nbytes"]):
                return nbytes / (us * 1e-6) / 1e9 / self.copy_gbps if us and self.copy_gbps else None
            out.append(dict(op=r["op"], case=r["case"], us=round(r["us"], 2), gbps=round(r["gbps"], 1),
                            roofline=None if r["roofline"] != r["roofline"] else round(r["roofline"], 4),
                            peers={k: dict(us=round(v, 2), roofline=frac(v) and round(frac(v), 4))
                                   for k, v in peers.items() if v},
                            copy_gbps=round(self.copy_gbps, 1), device=device, commit=commit, date=date))
        for r in self.host_rows:
            out.append(dict(op="host", case=r["case"], us=round(r["us"], 2),
                            device_us=round(r["device_us"], 2), x_torch_add=round(r["x_torch_add"], 2),
                            device=device, commit=commit, date=date))
        return out

    def table(self) -> str:
        from tilelang_ops.testing import format_table

        header = ["op", "case", "us", "GB/s", "roofline", "eager us", "compile us", "x eager",
                  "x compile"]
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        rows = [[r["op"], r["case"], f"{r['us']:.1f}", f"{r['gbps']:.0f}", f"{r['roofline']:.2f}",
                 fmt(r["eager_us"], ".1f"), fmt(r["compile_us"], ".1f"),
                 fmt(r["eager_us"] and r["eager_us"] / r["us"], ".2f"),
                 fmt(r["compile_us"] and r["compile_us"] / r["us"], ".2f")] for r in self.rows]
        text = format_table(f"benchmarks (copy roofline {self.copy_gbps:,.0f} GB/s)", header, rows)
        if self.host_rows:
            host = [[r["case"], f"{r['us']:.1f}", f"{r['device_us']:.1f}", f"{r['x_torch_add']:.2f}"]
                    for r in self.host_rows]
            text += "\n\n" + format_table("host cost per eager call", ["case", "eager us", "device us",
                                                                        "x torch.add"], host)
        return text
