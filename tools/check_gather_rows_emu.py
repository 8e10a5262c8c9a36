"""Emulate the gather_rows kernel on the CPU (its generated CUDA as C++, one thread per CUDA thread,
blocks forward and reversed) against the loop reference, bitwise: configurations of the build check,
odd M, repeated rows, a row stride > D, and out-of-range entries (zero rows; x sits between rows of a
sentinel NaN, so a read just outside it would show). ``--mutate`` checks that a broken bound is caught.

    PYTHONPATH=. .venv/bin/python tools/check_gather_rows_emu.py [--mutate]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TILELANG_CACHE_DIR", "/tmp/tlcache")
import torch  # noqa: E402

from tilelang_ops.build import compile_for_sm90  # noqa: E402
from tilelang_ops.gather_rows import (  # noqa: E402
    DEFAULT_CONFIG,
    SMALL_CONFIG,
    VEC,
    _flat_rows,
    gather_rows_kernel,
    rows_per_cta,
)
from tilelang_ops.testing.gather_rows import GatherCase, expected_rows, gather_inputs  # noqa: E402
from tools.cuda_emu import Emu  # noqa: E402

CASES = [
    GatherCase("d512_m37_default", 50, 512, 37, config=DEFAULT_CONFIG),
    GatherCase("d512_m37_small", 50, 512, 37, config=SMALL_CONFIG),
    GatherCase("d512_m21_repeat", 3, 512, 21, "repeat", config=DEFAULT_CONFIG),
    GatherCase("d512_m40_bad_strided", 30, 512, 40, "bad", "strided", config=DEFAULT_CONFIG),
    GatherCase("d520_m33_ragged_bad", 20, 520, 33, "bad", config=DEFAULT_CONFIG),
    GatherCase("d8_m1500_bad", 9, 8, 1500, "bad", config=DEFAULT_CONFIG),
    GatherCase("d16384_m3_strided", 4, 16384, 3, layout="strided", config=DEFAULT_CONFIG),
]
MUTATIONS = {"upper_bound": ("< num_src", "<= num_src"), "lower_bound": ("0 <= src", "-1 <= src")}

_sources: dict = {}


def source(d, config):
    key = (d, config)
    if key not in _sources:
        _sources[key] = compile_for_sm90(gather_rows_kernel, d, config.threads,
                                         config.vectors_per_thread).get_kernel_source()
    return _sources[key]


def run(src, x, index, config, order):
    n, d = x.shape
    m = index.numel()
    flat, stride = _flat_rows(x)
    assert stride == x.stride(0), "the strided cases must run in place"
    out = torch.full((m, d), 7.0, dtype=torch.bfloat16)
    grid = -(-m // rows_per_cta(d, config))
    blocks = list(range(grid)) if order == "forward" else list(range(grid))[::-1]
    Emu(src)(grid, config.threads, blocks, x_flat=flat.contiguous(), index=index, out=out,
             num_rows=m, num_src=n, stride8=stride // VEC)
    return out


def mismatches(src, case, order):
    x, index, bad = gather_inputs(case)
    got = run(src, x, index, case.config, order)
    return int((got.view(torch.int16) != expected_rows(x, index, bad).view(torch.int16)).sum())


if __name__ == "__main__":
    total = 0
    if "--mutate" in sys.argv:
        case = CASES[3]
        for mut, (a, b) in MUTATIONS.items():
            src = source(case.d, case.config)
            assert a in src, a
            bad = mismatches(src.replace(a, b), case, "forward")
            print(f"mutation {mut}: {bad} mismatches ({'caught' if bad else 'MISSED'})")
            total += bad == 0
        sys.exit(1 if total else 0)
    for case in CASES:
        for order in ("forward", "reverse"):
            bad = mismatches(source(case.d, case.config), case, order)
            total += bad
            print(f"{case.id} {order}: {bad} mismatches", flush=True)
    print("MISMATCHES:", total)
    sys.exit(1 if total else 0)
