"""gather_rows inputs shared by tests/test_gather_rows.py, `make diff` and tools/check_gather_rows_emu.py.

Rows are random 16-bit patterns (NaN payloads, infinities, subnormals, signed zeros), so only a bitwise
copy matches. x's rows sit between rows (and, when strided, beside columns) of a sentinel NaN that the
inputs never contain: a read just outside x shows up as that pattern in the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.gather_rows import gather_rows_ref, gather_rows_torch

SENTINEL_BITS = 0x7FC1
BAD_ENTRIES = (-1, -2, -(1 << 31), (1 << 31) - 1, 1 << 20)  # with N and N + 1 (just past the end)
LOOP_REFERENCE_MAX_ROWS = 5000  # beyond this the twin (tested equal to the loop) gives the rows


@dataclass(frozen=True)
class GatherCase:
    id: str
    n: int  # rows of x
    d: int
    m: int  # rows gathered
    pattern: str = "random"  # random | repeat (one row every time) | perm | bad (out-of-range entries)
    layout: str = "contiguous"  # contiguous | strided (row stride D + 64: in place) | odd_stride (D + 4:
    #                             the wrapper copies) | transposed (inner stride != 1: copied)
    config: object = None  # a GatherRowsConfig, or None for the launch rule's choice


def bit_rows(n: int, d: int, seed: int, device="cpu") -> torch.Tensor:
    """[n, d] bf16 of random bit patterns, none of them the sentinel."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(1 << 15), 1 << 15, (n, d), dtype=torch.int32, generator=g).to(torch.int16)
    bits[bits == SENTINEL_BITS] = 0
    return bits.view(torch.bfloat16).to(device)


def gather_inputs(case: GatherCase, device="cpu"):
    """(x, index, bad): x framed by sentinel rows (and columns when strided), index [M] int32, bad [M]
    bool (entries outside [0, N))."""
    g = torch.Generator().manual_seed(case.n * 7 + case.m)
    d, n = case.d, case.n
    width = {"strided": d + 64, "odd_stride": d + 4}.get(case.layout, d)
    frame = bit_rows(n + 2, width, seed=case.m + d)
    bits = frame.view(torch.int16)
    bits[0] = bits[-1] = SENTINEL_BITS
    bits[:, d:] = SENTINEL_BITS
    x = frame.to(device)[1:-1, :d]
    if case.layout == "transposed":
        x = x.t().contiguous().t()
    if case.pattern == "repeat":
        index = torch.full((case.m,), n // 2, dtype=torch.int32)
    elif case.pattern == "perm":
        index = torch.randperm(n, generator=g)[: case.m].int()
    else:
        index = torch.randint(0, max(1, n), (case.m,), generator=g, dtype=torch.int32)
    bad = torch.zeros(case.m, dtype=torch.bool)
    if case.pattern == "bad":
        entries = torch.tensor(BAD_ENTRIES + (n, n + 1), dtype=torch.int32)
        pick = torch.randperm(case.m, generator=g)[: max(1, case.m // 5)]
        index[pick] = entries[torch.arange(pick.numel()) % entries.numel()]
        bad[pick] = True
    return x, index.to(device), bad.to(device)


def expected_rows(x: torch.Tensor, index: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    """What the kernel must write without the debug switch: the reference's rows where the index is
    in range (the loop reference, or its twin for big cases), zero rows where it is not."""
    ref = gather_rows_ref if index.numel() <= LOOP_REFERENCE_MAX_ROWS else gather_rows_torch
    want = ref(x, torch.where(bad, 0, index))
    want[bad] = 0
    return want


def sentinel_reads(out: torch.Tensor) -> int:
    """Elements of ``out`` holding the sentinel: reads outside x."""
    return int((out.view(torch.int16) == SENTINEL_BITS).sum())
