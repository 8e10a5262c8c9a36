"""index_logits cases for `python -m tilelang_ops diff` (see tilelang_ops/diff.py).

Every output compares bitwise: query codes and scales are payload bytes; logits follow the FP32 order that
``reference.index_logits`` fixes (the kernels' own), over the whole output (pre-filled with a sentinel, so
unwritten and ``clean`` columns count too).
"""

from __future__ import annotations

import torch

from metadata.checks import check_choice
from reference.index_logits import (
    paged_index_logits_ref,
    paged_index_logits_torch,
    quantize_index_rows_ref,
    quantize_index_rows_torch,
    ragged_index_logits_ref,
    ragged_index_logits_torch,
)
from tilelang_ops.testing import compare_bitwise
from tilelang_ops.testing.index_logits import (
    PagedCase,
    RaggedCase,
    index_values,
    make_paged_inputs,
    make_ragged_inputs,
)

OP = "index_logits"

_CASES = {
    "quantize_mixed_rows300": ("quantize", "mixed"),
    "paged_b3_n2_k150_decode": ("paged", PagedCase("c", 3, 2, 150)),
    "paged_b2_n4_k97_mixed_clean": ("paged", PagedCase("c", 2, 4, 97, dist="mixed", clean=True)),
    "paged_b1_n8_k130_h32_rpb32": ("paged", PagedCase("c", 1, 8, 130, heads=32, rows_per_block=32)),
    "paged_b2_n1_k45_rpb5_wide": ("paged", PagedCase("c", 2, 1, 45, rows_per_block=5, dist="wide")),
    "cand_b2_n2_bs8": ("paged", PagedCase("c", 2, 2, 200, rows_per_block=16, candidates=(6, 8))),
    "ragged_t9_n120_causal": ("ragged", RaggedCase("c", 9, 120)),
    "ragged_t6_n90_random_clean": ("ragged", RaggedCase("c", 6, 90, ranges="ragged", dist="mixed",
                                                        clean=True)),
}
CASES = list(_CASES)


def _run(case_id, device, fns):
    check_choice("case_id", case_id, _CASES)
    kind, case = _CASES[case_id]
    quant, paged, ragged = fns
    if kind == "quantize":
        g = torch.Generator().manual_seed(5)
        x = torch.cat([index_values(50, d, g) for d in ("randn", case, "tiny", "extreme", "zeros", "big")])
        codes, scales = quant(x.to(torch.bfloat16).to(device))
        return [("codes", codes), ("scales", scales)]
    if kind == "paged":
        return [("logits", paged(**make_paged_inputs(case, device)))]
    return [("logits", ragged(**make_ragged_inputs(case, device)))]


def self_check(case_id: str):
    """Loop reference vs vectorized twin on CPU, bitwise."""
    ref = _run(case_id, "cpu", (quantize_index_rows_ref, paged_index_logits_ref, ragged_index_logits_ref))
    twin = _run(case_id, "cpu",
                (quantize_index_rows_torch, paged_index_logits_torch, ragged_index_logits_torch))
    return [compare_bitwise(f"{name} twin", t, r) for (name, t), (_, r) in zip(twin, ref, strict=True)]


def run_case(case_id: str, device):
    """Kernel vs loop reference, bitwise."""
    from tilelang_ops.index_logits import paged_index_logits, quantize_index_rows, ragged_index_logits

    ref = _run(case_id, "cpu", (quantize_index_rows_ref, paged_index_logits_ref, ragged_index_logits_ref))
    got = _run(case_id, device, (quantize_index_rows, paged_index_logits, ragged_index_logits))
    return [compare_bitwise(name, g.cpu(), r) for (name, g), (_, r) in zip(got, ref, strict=True)]


def build_check():
    """Every configuration of ``tilelang_ops.index_logits.build_configs`` for sm_90a (two workers)."""
    from tilelang_ops.build import compile_sm90_in_processes
    from tilelang_ops.index_logits import build_configs

    names = [n for n, _, _ in build_configs()]
    return compile_sm90_in_processes("tilelang_ops.index_logits", names, workers=2)
