"""Where a v3 top-k row's time goes, phase by phase, on a GPU: with tools/topk_phase_stamps.patch applied
(``git apply tools/topk_phase_stamps.patch``; never commit it applied), thread 0 of each row's CTA takes
clock64() at the kernel's start, after the sample / first read (before the rounds), after each of the
V3_ROUNDS rounds (kind 1 compaction, 2 resolve, 3 radix pass, 0 nothing) and at the end, and writes them
over output lanes 1..7 (the outputs are then wrong: a probe only; each stamped round adds a barrier,
~280 cycles), and the low 32 bits of %globaltimer (ns, one clock for all SMs) at its start and end over
lanes 8 and 9. Prints the median cycles per phase over the rows, then, for a launch after the benchmark's
L2 flush, when the rows start and how long they take against the CUDA-event time (the harness's):

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


def global_times(b: int, n: int, k: int, dist: str) -> None:
    from benchmarks.harness import HOST_HIDE_CYCLES, time_us

    x = make_scores(dist, b, n, device="cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    topk(x, k, return_value=False)
    flush.zero_()
    torch.cuda._sleep(HOST_HIDE_CYCLES)
    _, idx = topk(x, k, return_value=False)
    g = idx[:, 8:10].cpu().long() & 0xFFFFFFFF
    t0 = g[:, 0].min()
    start, stop = (g[:, 0] - t0) % (1 << 32), (g[:, 1] - t0) % (1 << 32)  # ns after the first row's start
    dur = (stop - start).float()
    event = time_us(lambda: topk(x, k, return_value=False), flush_bytes=256 << 20)
    print(f"GLOBAL b{b}n{n}k{k} {dist}: rows start within {start.max()} ns; row us min / median / max "
          f"{dur.min() / 1e3:.1f} / {dur.median() / 1e3:.1f} / {dur.max() / 1e3:.1f}; last row ends "
          f"{stop.max() / 1e3:.1f} us after the first starts; CUDA events {event:.1f} us")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(","))
    for dist in sys.argv[4].split(","):
        global_times(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), dist)
