"""Where a v3 top-k row's time goes, phase by phase, on a GPU: with tools/topk_phase_stamps.patch applied
(``git apply tools/topk_phase_stamps.patch``; never commit it applied), thread 0 of each row's CTA takes
clock64() at the kernel's start, after the sample / first read (before the rounds), after each of the
V3_ROUNDS rounds (kind 1 compaction, 2 resolve, 3 radix pass, 0 nothing) and at the end, and writes them
over output lanes 1..7 (the outputs are then wrong: a probe only; each stamped round adds a barrier,
~280 cycles). Prints the median cycles per phase over the rows:

    python tools/topk_phase_stamps.py B N K randn,equal
"""

import sys

import torch

from tests.test_topk import make_scores
from tilelang_ops.topk import topk

NAMES = ["start->prep", "r0", "r1", "r2", "r3", "r4", "final"]


def main(b: int, n: int, k: int, dists: list[str]) -> None:
    for dist in dists:
        x = make_scores(dist, b, n, device="cuda")
        for _ in range(3):
            _, idx = topk(x, k, return_value=False)
        torch.cuda.synchronize()
        st = idx[:, 1:8].cpu().long()
        kinds = [v & 3 for v in (st[0] >> 28).tolist()]
        cyc = (st & ((1 << 28) - 1)).float()
        d = torch.diff(torch.cat([torch.zeros(b, 1), cyc], 1), dim=1).median(0).values.tolist()
        print(f"STAMP b{b}n{n}k{k} {dist}: kinds (row 0) {kinds}, median cycles per phase: "
              + ", ".join(f"{nm} {v:.0f}" for nm, v in zip(NAMES, d)) + f" | total {cyc[:, 6].median():.0f}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(","))
