"""topk cases for `python -m tilelang_ops diff` (see tilelang_ops/diff.py).

Indices and slots are integers, values are copied score bits: every output compares bitwise. The
kernel's unsorted output is in ascending index order, the same order the references give, so cases
that ask for no order still compare exactly.
"""

from __future__ import annotations

import torch

from metadata.checks import check_choice
from reference.topk import (
    block_max_scores_ref,
    topk_ref,
    topk_to_slots_ref,
    topk_torch,
)
from tilelang_ops.testing import compare_bitwise

OP = "topk"

# id -> (dist, b, n, k, end kind, dtype, sorted)
_CASES = {
    "randn_b7_n2048_k512_end": ("randn", 7, 2048, 512, "random", torch.float32, True),
    "conc_b4_n4096_k1024": ("conc", 4, 4096, 1024, "full", torch.float32, False),
    "few_b8_n1000_k300_end_bf16": ("few", 8, 1000, 300, "random", torch.bfloat16, False),
    "special_b5_n777_k64_short": ("special", 5, 777, 64, "short", torch.float32, True),
    "equal_b3_n500_k100": ("equal", 3, 500, 100, "full", torch.float32, True),
    "slots_few_b4_n512_k64_cand16_bc64": ("few", 4, 512, 64, "random", torch.float32, None),
    "blockmax_special_b4_n300_bs16": ("special", 4, 300, 16, "random", torch.float32, "blockmax"),
}
CASES = list(_CASES)


def _inputs(case_id, device):
    check_choice("case_id", case_id, _CASES)
    from tilelang_ops.testing.topk import make_end, make_scores, poison_beyond_end

    dist, b, n, k, ends, dtype, mode = _CASES[case_id]
    x = make_scores(dist, b, n, dtype, seed=sum(map(ord, case_id)))
    end = make_end(ends, b, n, k)
    if end is not None:
        x = poison_beyond_end(x, end)
    g = torch.Generator().manual_seed(7)
    table = torch.randint(0, 5000, (b, 40), generator=g, dtype=torch.int32)
    blocks = torch.stack([torch.randperm(160, generator=g)[: n // 16] for _ in range(b)]).to(torch.int32)
    mv = lambda t: None if t is None else t.to(device)  # noqa: E731
    return mode, k, mv(x), mv(end), mv(table), mv(blocks)


def _outputs(case_id, device, fns):
    mode, k, x, end, table, blocks = _inputs(case_id, device)
    topk_fn, slots_fn, bmax_fn = fns
    if mode == "blockmax":
        return [("block_max", bmax_fn(x, k, end))]
    if mode is None:
        slots = slots_fn(x, 64, end=end, candidate_blocks=blocks, candidate_block_size=16, block_size_c=64,
                         block_tables=table)
        return [("slots", slots)]
    v, i = topk_fn(x, k, end=end, sorted=mode)
    return [("values", v), ("indices", i)]


def self_check(case_id: str):
    """Loop reference vs vectorized twin on CPU (top-k cases); invariants for the others."""
    mode, k, x, end, table, blocks = _inputs(case_id, "cpu")
    if mode == "blockmax":
        from tilelang_ops.testing.topk import block_max_by_amax, canonical_nans

        out = block_max_scores_ref(x, k, end)
        return [compare_bitwise("block_max vs amax", canonical_nans(out), block_max_by_amax(x, k, end))]
    if mode is None:
        slots = topk_to_slots_ref(x, 64, end=end, candidate_blocks=blocks, candidate_block_size=16,
                                  block_size_c=64, block_tables=table)
        valid = (slots >= 0).sum(1)
        want = end.clamp(max=64).long()
        return [compare_bitwise("valid slot count", valid, want)]
    rv, ri = topk_ref(x, k, end=end, sorted=mode)
    tv, ti = topk_torch(x, k, end=end, sorted=mode)
    return [compare_bitwise("values twin", tv, rv), compare_bitwise("indices twin", ti, ri)]


def run_case(case_id: str, device):
    """Kernel vs loop reference on CUDA, bitwise."""
    from tilelang_ops.topk import block_max_scores, topk, topk_to_slots

    ref = _outputs(case_id, "cpu", (topk_ref, topk_to_slots_ref, block_max_scores_ref))
    got = _outputs(case_id, device, (topk, topk_to_slots, block_max_scores))
    return [compare_bitwise(name, g, r) for (name, g), (_, r) in zip(got, ref, strict=True)]


def build_check():
    from tilelang_ops.topk import build_all

    return build_all()
