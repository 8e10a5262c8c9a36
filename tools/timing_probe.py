"""Where does a launch's measured time go? Times one kv_store case four ways on CUDA: the harness's
time_us (events around one call, the host work hidden behind a GPU spin), the same without the spin
(host wrapper included), CUDA-graph replays (no host work) and ten back-to-back calls between two
events (host work overlapped with the GPU).

    python tools/timing_probe.py [fmt_name] [rows]"""

import sys

import torch

import benchmarks.harness as harness
from benchmarks.bench_kv_store import _inputs
from benchmarks.harness import time_graph_us, time_us
from metadata.cache_format import ALL_FORMATS
from tilelang_ops.kv_store import norm_rope_hadamard_cast_store


def back_to_back_us(fn, n=10, rep=10):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(rep):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            fn()
        e.record()
        e.synchronize()
        out.append(s.elapsed_time(e) * 1e3 / n)
    return sorted(out)[len(out) // 2]


def main(name="fp8_main", rows=1 << 20):
    fmt = {f.name: f for f in ALL_FORMATS}[name]
    kv, w, cos, sin, pos, slots, cache = _inputs(fmt, rows)
    for variant in ("v3", "v2"):
        def fn(variant=variant):
            norm_rope_hadamard_cast_store(kv, w, 1e-6, cos, sin, pos, slots, cache, fmt,
                                          hadamard=name == "fp4_index", variant=variant)

        hidden = time_us(fn)
        saved, harness.HOST_HIDE_CYCLES = harness.HOST_HIDE_CYCLES, 0
        try:
            exposed = time_us(fn)
        finally:
            harness.HOST_HIDE_CYCLES = saved
        print(f"{name} rows={rows} {variant}: time_us={hidden:.1f} without_spin={exposed:.1f} "
              f"graph={time_graph_us(fn, rep=30):.1f} back_to_back={back_to_back_us(fn):.1f}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:2], *map(int, sys.argv[2:3]))
