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

from reference.gather_rows import gather_rows_ref  # noqa: E402
from tilelang_ops.build import compile_for_sm90  # noqa: E402
from tilelang_ops.gather_rows import (  # noqa: E402
    DEFAULT_CONFIG,
    SMALL_CONFIG,
    VEC,
    _flat_rows,
    gather_rows_kernel,
    rows_per_cta,
)
from tools.cuda_emu import Emu  # noqa: E402

SENTINEL = 0x7FC1
# (name, N, D, M, config, pattern, row stride)
CASES = [
    ("d512_m37_default", 50, 512, 37, DEFAULT_CONFIG, "random", 512),
    ("d512_m37_small", 50, 512, 37, SMALL_CONFIG, "random", 512),
    ("d512_m21_repeat", 3, 512, 21, DEFAULT_CONFIG, "repeat", 512),
    ("d512_m40_bad_strided", 30, 512, 40, DEFAULT_CONFIG, "bad", 576),
    ("d520_m33_ragged_bad", 20, 520, 33, DEFAULT_CONFIG, "bad", 520),
    ("d8_m1500_bad", 9, 8, 1500, DEFAULT_CONFIG, "bad", 8),
    ("d16384_m3", 4, 16384, 3, DEFAULT_CONFIG, "random", 16384 + 8),
]
MUTATIONS = {"upper_bound": ("< num_src", "<= num_src"), "lower_bound": ("0 <= src", "-1 <= src")}

_sources: dict = {}


def source(d, config):
    key = (d, config)
    if key not in _sources:
        _sources[key] = compile_for_sm90(gather_rows_kernel, d, config.threads,
                                         config.vectors_per_thread).get_kernel_source()
    return _sources[key]


def inputs(n, d, m, pattern, stride, seed):
    g = torch.Generator().manual_seed(seed)
    frame = torch.randint(-(1 << 15), 1 << 15, (n + 2, stride), generator=g, dtype=torch.int32)
    frame = frame.to(torch.int16)
    frame[frame == SENTINEL] = 0
    frame[0], frame[-1], frame[:, d:] = SENTINEL, SENTINEL, SENTINEL
    x = frame.view(torch.bfloat16)[1:-1, :d]
    index = torch.randint(0, n, (m,), generator=g, dtype=torch.int32)
    bad = torch.zeros(m, dtype=torch.bool)
    if pattern == "repeat":
        index[:] = n - 1
    elif pattern == "bad":
        entries = torch.tensor([-1, n, n + 1, -(1 << 31), (1 << 31) - 1], dtype=torch.int32)
        pick = torch.randperm(m, generator=g)[: max(1, m // 4)]
        index[pick] = entries[torch.arange(pick.numel()) % entries.numel()]
        bad[pick] = True
    return x, index, bad


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


def mismatches(src, name, n, d, m, config, pattern, stride, order):
    x, index, bad = inputs(n, d, m, pattern, stride, seed=n + m)
    got = run(src, x, index, config, order)
    want = gather_rows_ref(x, torch.where(bad, 0, index))
    want[bad] = 0
    return int((got.view(torch.int16) != want.view(torch.int16)).sum())


if __name__ == "__main__":
    total = 0
    if "--mutate" in sys.argv:
        name, n, d, m, config, pattern, stride = CASES[3]
        for mut, (a, b) in MUTATIONS.items():
            src = source(d, config)
            assert a in src, a
            bad = mismatches(src.replace(a, b), name, n, d, m, config, pattern, stride, "forward")
            print(f"mutation {mut}: {bad} mismatches ({'caught' if bad else 'MISSED'})")
            total += bad == 0
        sys.exit(1 if total else 0)
    for name, n, d, m, config, pattern, stride in CASES:
        for order in ("forward", "reverse"):
            bad = mismatches(source(d, config), name, n, d, m, config, pattern, stride, order)
            total += bad
            print(f"{name} {order}: {bad} mismatches", flush=True)
    print("MISMATCHES:", total)
    sys.exit(1 if total else 0)
