"""gather_rows cases for `python -m tilelang_ops diff` (see tilelang_ops/diff.py).

Every comparison is bitwise (a copy). ``rows_*`` cases: the kernel against the loop reference, with zero
rows where the index is out of range (no debug switch) and no sentinel read from outside x. ``cp*``
cases: the C1 path under context parallelism with the ranks simulated in one process (every rank's
share concatenated in rank order, then ``compress(gathered, None, rank_metadata, 1, True)``) against the
single-process rows, and each rank's C1 row metadata against the single-process metadata. On the CPU the
self-check runs the same cases through the loop reference and its twin (``rows_*``) or ``compress_ref``
(``cp*``).
"""

from __future__ import annotations

import torch

from metadata.checks import check_choice
from reference.compress import compress_ref
from reference.gather_rows import gather_rows_ref, gather_rows_torch
from tilelang_ops.testing import Comparison, compare_bitwise
from tilelang_ops.testing.context_parallel import BATCHES, CP_SIZES, check_c1, simulate_c1
from tilelang_ops.testing.gather_rows import GatherCase, expected_rows, gather_inputs, sentinel_reads

OP = "gather_rows"

_ROWS = {c.id: c for c in (
    GatherCase("rows_d512_m1001_random", 300, 512, 1001),
    GatherCase("rows_d512_m65537_perm", 65537, 512, 65537, "perm"),
    GatherCase("rows_d512_m4099_repeat", 3, 512, 4099, "repeat"),
    GatherCase("rows_d512_m3001_strided", 2000, 512, 3001, layout="strided"),
    GatherCase("rows_d512_m3000_bad", 500, 512, 3000, "bad"),
    GatherCase("rows_d520_m999_bad_strided", 100, 520, 999, "bad", "strided"),
    GatherCase("rows_d8_m5003", 1000, 8, 5003),
)}
_CP = {f"cp{cp}_{batch_id}": (cp, batch_id) for cp in CP_SIZES for batch_id in BATCHES}
CASES = list(_ROWS) + list(_CP)


def _cp_comparisons(case_id: str, compress_fn, device) -> list[Comparison]:
    cp, batch_id = _CP[case_id]
    x, single, outs = simulate_c1(BATCHES[batch_id], cp, compress_fn, device)
    return check_c1(x, single, outs)


def _sentinel(out: torch.Tensor) -> Comparison:
    reads = sentinel_reads(out)
    return Comparison("reads outside x", "none", out.numel(), reads, 0.0,
                      [f"{reads} sentinel elements in the output"] if reads else [])


def run_case(case_id: str, device):
    """Kernel vs reference on CUDA."""
    check_choice("case_id", case_id, CASES)
    if case_id in _CP:
        from tilelang_ops.compress import compress

        return _cp_comparisons(case_id, compress, device)
    from tilelang_ops.gather_rows import gather_rows

    x, index, bad = gather_inputs(_ROWS[case_id], device)
    out = gather_rows(x, index)
    torch.cuda.synchronize()
    return [compare_bitwise("out", out, expected_rows(x, index, bad)), _sentinel(out)]


def self_check(case_id: str):
    """CPU: loop reference vs twin (rows cases), the reference C1 path with simulated ranks (cp cases)."""
    check_choice("case_id", case_id, CASES)
    if case_id in _CP:
        return _cp_comparisons(case_id, compress_ref, "cpu")
    case = _ROWS[case_id]
    if case.m > 5000:  # the loop reference over 65537 rows takes seconds on the CPU: a slice of them
        case = GatherCase(case.id, case.n, case.d, 5000, case.pattern, case.layout)
    x, index, bad = gather_inputs(case)
    good = torch.where(bad, 0, index)
    return [compare_bitwise("ref vs twin", gather_rows_ref(x, good), gather_rows_torch(x, good))]


def build_check():
    from tilelang_ops.build import compile_for_sm90
    from tilelang_ops.gather_rows import build_configs

    built = []
    for name, factory, static in build_configs():
        compile_for_sm90(factory, *static)
        built.append(name)
    return built
