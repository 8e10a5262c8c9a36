"""Static SASS of a kernel the benchmarks launch, without a GPU: lower it and nvcc-compile its CUDA for
sm_90a with TileLang's flags, then disassemble it. Prints ptxas's registers / spills, the instruction
count, the opcode mix and the barriers, and writes <case>.cu / .sass to --out (default /tmp/sass). The
kernels bound by issued instructions (docs/design.md: the FP4 index store, index logits) can have a
candidate change counted here before it costs device time; the counts are static (every path of
the kernel once), not what one launch executes.

Needs a cuobjdump: $CUOBJDUMP, one on PATH, or the one Triton's wheel carries (no GPU needed):
    pip download --no-deps --only-binary=:all: triton -d /tmp/trw
    unzip -o -q /tmp/trw/triton-*.whl 'triton/backends/nvidia/bin/*' -d /tmp/trx
    export CUOBJDUMP=/tmp/trx/triton/backends/nvidia/bin/cuobjdump

    PYTHONPATH=. python tools/sass_mix.py topk:64x8192 kv_store:fp4_index index_logits:paged:4 [--out DIR]

Cases: topk:BxN (FP32 scores, topk(x, k, return_value=False), the launch rule's config for B rows of N on the
H200: 132 SMs, a 60 MiB L2), kv_store:FORMAT[:ROWS] (the benchmark's launch, default 1M rows),
index_logits:MODE[:N] (the scoring kernel of paged / cand / ragged with 64 heads, N query rows per request,
the launch rule's config for 64 requests over 65536 keys; paged_wg / cand_wg / ragged_wg: its wgmma
configuration).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

H200_SMS, H200_L2 = 132, 60 << 20


def kernel_args(case: str) -> tuple:
    """(factory, static arguments) of a case."""
    op, spec = case.split(":", 1)
    if op == "topk":
        from tilelang_ops.topk import kernel_for
        from tilelang_ops.topk.launch import topk_config

        b, n = (int(v) for v in spec.split("x"))
        static = ("float32", "int32", "int32", False, False, -1, float("-inf"), "topk", 0, 1)
        return kernel_for(static, n, topk_config(b, n, 4, H200_SMS, H200_L2))
    if op == "kv_store":
        import tilelang_ops.kv_store as K
        from benchmarks.bench_kv_store import FORMATS, ROWS_PER_BLOCK

        fmt_name, _, rows = spec.partition(":")
        fmt, hadamard = next((f, h) for f, h in FORMATS if f.name == fmt_name)
        config = K.launch_config(fmt, int(rows or 1 << 20))
        return K.kv_store_kernel, K.static_args(fmt, 64, True, hadamard, False, ROWS_PER_BLOCK, "bfloat16",
                                                "int64", "int64", config)
    if op == "index_logits":
        import tilelang_ops.index_logits as IL

        mode, _, n = spec.partition(":")  # paged / cand / ragged [+ _wg: on wgmma], query rows per request
        n = int(n or 1)
        wg = mode.endswith("_wg")
        mode = mode.removesuffix("_wg")
        rows = 64 if mode == "paged" else 64 * n
        config = IL.launch_config(mode, rows=rows, width=65536, n=n, sms=H200_SMS, wgmma=wg)
        return IL.scores_factory(), IL.kernel_static(mode, 64, config, True)
    raise ValueError(f"unknown case {case!r} (topk:BxN, kv_store:FORMAT[:ROWS] or index_logits:MODE[:N])")


def cuobjdump() -> str:
    path = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not path:
        raise SystemExit("no cuobjdump: set CUOBJDUMP (see this file's docstring)")
    return path


def sass_of(case: str, out: str) -> str:
    """Compile the case and return its SASS text (also written to out)."""
    import tilelang
    from tilelang.env import CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH

    from tilelang_ops.build import compile_for_sm90

    factory, args = kernel_args(case)
    src = compile_for_sm90(factory, *args).get_kernel_source()
    stem = os.path.join(out, re.sub(r"[^A-Za-z0-9_]+", "_", case))
    with open(stem + ".cu", "w") as f:
        f.write(src)
    tvm_inc = os.path.join(os.path.dirname(tilelang.__file__), "3rdparty", "tvm", "include")
    cmd = ["nvcc", "-std=c++20", "-lineinfo", "-cubin", "-gencode", "arch=compute_90a,code=sm_90a",
           "--ptxas-options=--verbose", "-I" + TILELANG_TEMPLATE_PATH, "-I" + CUTLASS_INCLUDE_DIR,
           "-I" + tvm_inc, "-o", stem + ".cubin", stem + ".cu"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    for line in res.stderr.splitlines():
        if "registers" in line or "spill" in line or "wgmma" in line.lower():
            print(f"{case}: {line.strip()}")
    sass = subprocess.run([cuobjdump(), "-sass", stem + ".cubin"], capture_output=True, text=True,
                          check=True).stdout
    with open(stem + ".sass", "w") as f:
        f.write(sass)
    return sass


def mix(sass: str) -> collections.Counter:
    """Opcode (without modifiers) of every instruction, predicated or not."""
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if m:
            ops[m.group(1)] += 1
    return ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--out", default="/tmp/sass")
    ap.add_argument("--top", type=int, default=16)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for case in a.cases:
        ops = mix(sass_of(case, a.out))
        total = sum(ops.values())
        print(f"{case}: {total} SASS instructions, {ops['BAR']} barriers; "
              + ", ".join(f"{op} {100 * c / total:.1f}%" for op, c in ops.most_common(a.top)), flush=True)


if __name__ == "__main__":
    main()
