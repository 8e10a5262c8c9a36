"""compress cases for `python -m tilelang_ops diff` (see tilelang_ops/diff.py).

Rows are compared within one BF16 ulp kernel vs reference (the kernel's expf may differ from torch's
exp by one FP32 ulp), bitwise loop reference vs twin (same FP32 operations in the same order); rings
always bitwise (copies).
"""

from __future__ import annotations

import torch

from metadata.checks import check_choice
from reference.compress import (
    compress_decode_ref,
    compress_decode_torch,
    compress_prefill_ref,
    compress_prefill_torch,
)
from tilelang_ops.testing import compare_bf16_ulp, compare_bitwise

OP = "compress"

# id -> (kind, r, D, ring, batch): prefill batch = [(chunk_len, context_len, slot)],
# decode batch = [(slot, context before the step, tokens in the step)]
_CASES = {
    "prefill_r2_d512_mixed": ("prefill", 2, 512, 7,
                              [(5, 9, 6), (0, 4, 1), (1, 3, 0), (37, 37, 3), (64, 200, 2), (1, 1, 7)]),
    "prefill_r2_d512_chunk_over_ring": ("prefill", 2, 512, 2, [(301, 1000, 0), (2, 3, 1)]),
    "prefill_r2_d64_min_ring": ("prefill", 2, 64, 2, [(13, 15, 3), (3, 3, 0), (2, 6, 1), (40, 41, 2)]),
    "decode_r2_d512_b8_q1": ("decode", 2, 512, 7, [(s, 2 * s + 3, 1) for s in range(8)]),
    "decode_r2_d512_q6_min_ring": ("decode", 2, 512, 7, [(0, 10, 6), (3, 1, 6), (1, 0, 5), (2, 4, 1)]),
    "decode_r2_d64_q3_min_ring": ("decode", 2, 64, 4, [(0, 2, 3), (1, 5, 3), (4, 0, 2)]),
}
CASES = list(_CASES)


def make_inputs(case_id: str, device):
    """Seeded inputs of one case; returns (kind, r, args tuple without the ratio, extra)."""
    check_choice("case_id", case_id, _CASES)
    kind, r, dim, ring, batch = _CASES[case_id]
    g = torch.Generator().manual_seed(sum(map(ord, case_id)))
    i32 = dict(dtype=torch.int32)
    if kind == "prefill":
        num_slots = max(slot for *_, slot in batch) + 1
        cu_q, cu_c = [0], [0]
        for length, e, _ in batch:
            cu_q.append(cu_q[-1] + length)
            cu_c.append(cu_c[-1] + max(1, e // r - (e - length) // r))
        x = torch.randn(cu_q[-1], 2 * dim, generator=g)
        x[:, :dim] *= 4
        meta = (torch.tensor(cu_q, **i32), torch.tensor([e for _, e, _ in batch], **i32),
                torch.tensor([s for *_, s in batch], **i32), torch.tensor(cu_c, **i32))
        extra = dict(num_rows=cu_c[-1])
    else:
        num_slots = max(slot for slot, *_ in batch) + 1
        tokens = [(c + i + 1, slot) for slot, c, q in batch for i in range(q)]
        x = torch.randn(len(tokens), 2 * dim, generator=g)
        x[:, :dim] *= 4
        meta = (torch.tensor([c for c, _ in tokens], **i32), torch.tensor([s for _, s in tokens], **i32),
                max(q for *_, q in batch))
        extra = {}
    state = torch.randn(num_slots, ring, 2, dim, generator=g) * 3
    move = lambda t: t.to(device) if isinstance(t, torch.Tensor) else t  # noqa: E731
    return kind, r, (move(x), move(state), *map(move, meta)), extra


def _run(fns, case_id, device):
    kind, r, args, extra = make_inputs(case_id, device)
    outs = []
    for fn in fns[kind]:
        state = args[1].clone()
        kv = fn(args[0], state, *args[2:], r, **extra)
        outs.append((kv, state))
    return outs


def self_check(case_id: str):
    """Loop reference vs vectorized twin on CPU: rows and ring bitwise."""
    fns = {"prefill": (compress_prefill_ref, compress_prefill_torch),
           "decode": (compress_decode_ref, compress_decode_torch)}
    (kv_ref, st_ref), (kv_twin, st_twin) = _run(fns, case_id, "cpu")
    return [compare_bitwise("kv twin", kv_twin, kv_ref), compare_bitwise("state twin", st_twin, st_ref)]


def run_case(case_id: str, device):
    """Kernel vs loop reference on CUDA."""
    from tilelang_ops.compress import compress_decode, compress_prefill

    fns = {"prefill": (compress_prefill_ref, compress_prefill),
           "decode": (compress_decode_ref, compress_decode)}
    (kv_ref, st_ref), (kv, st) = _run(fns, case_id, device)
    return [compare_bf16_ulp("kv", kv, kv_ref, max_ulp=1), compare_bitwise("state", st, st_ref)]


def build_check():
    from tilelang_ops.build import compile_for_sm90
    from tilelang_ops.compress import BUILD_SHAPES, compress_decode_kernel, compress_prefill_kernel

    built = []
    for dim, r in BUILD_SHAPES:
        compile_for_sm90(compress_prefill_kernel, dim, r)
        compile_for_sm90(compress_decode_kernel, dim, r)
        built += [f"prefill_d{dim}_r{r}", f"decode_d{dim}_r{r}"]
    return built
