"""The host cost of each op's eager call, on the CPU: every host layer of a call (the Python API, the
compiled eager path or, with ``--python-path``, the scalar checks and the launch plan's lookup; the output
allocation, the version bumps) with each kernel replaced by a no-op TVM-FFI function
(``tilelang_ops.testing.cpu_launch``), on the small calls of the torch-integration tests. No GPU is needed;
a GPU host adds the launch itself (``python -m benchmarks host`` measures the whole call there).
Prints microseconds per call (the best of ``--repeats`` rounds of ``--calls`` back-to-back calls, the cases
taking turns: ``benchmarks.bench_host.rounds_us``), beside ``torch.add`` and ``torch.empty`` on the same
host for scale.

    PYTHONPATH=. .venv/bin/python tools/host_cost.py [CASE ...] [--calls 1000] [--repeats 30] [--python-path]
"""

import argparse
import os
import sys
from contextlib import ExitStack

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.bench_host import rounds_us  # noqa: E402
from tilelang_ops.testing.cpu_launch import eager_on_the_cpu, patcher  # noqa: E402
from tilelang_ops.testing.torch_ops import CASES  # noqa: E402


def measure(case_ids=(), calls: int = 1000, repeats: int = 30, python_path: bool = False) -> dict[str, float]:
    """{case id: us per call} of the torch-integration cases (all, or those named), and of ``torch.add``
    ([64, 64] fp32) and ``torch.empty`` ([64, 512] bf16) for scale. ``python_path``: the calls take the
    Python path (no recipes)."""
    import tvm_ffi

    from tilelang_ops import _fast

    ext = _fast.extension()
    ext.probe("tilelang_ops.testing.noop", None)
    noop = tvm_ffi.get_global_func("tilelang_ops.testing.noop")
    unknown = set(case_ids) - {c.id for c in CASES}
    if unknown:
        raise ValueError(f"unknown cases {sorted(unknown)}; known: {[c.id for c in CASES]}")

    x = torch.randn(64, 64)
    fns = {"torch.add": lambda: torch.add(x, x),
           "torch.empty": lambda: torch.empty(64, 512, dtype=torch.bfloat16)}
    with ExitStack() as stack, eager_on_the_cpu(lambda factory, *static: noop, patcher(stack),
                                               record=not python_path):
        for case in CASES:
            if case_ids and case.id not in case_ids:
                continue
            call = case.call("cpu")
            args = tuple(call.args.values())
            fns[case.id] = lambda fn=case.fn, a=args, kw=call.kwargs: fn(*a, **kw)
        # nothing runs on a device: no sync
        out = rounds_us(fns, calls, rounds=repeats, warmup=min(calls, 100), sync=lambda: None)
    return out


def main(argv) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cases", nargs="*", help="case ids of tilelang_ops.testing.torch_ops (default: all)")
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--python-path", action="store_true", help="time the Python path (no recipes)")
    args = p.parse_args(argv)
    for name, us in measure(args.cases, args.calls, args.repeats, args.python_path).items():
        print(f"{name:32s} {us:7.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
