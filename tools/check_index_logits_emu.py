"""Emulate the index-logits kernels on CPU (tools/index_logits_emu.py) through the wrappers' launch plans and
compare them bitwise with the vectorized twins (tested equal to the loop references): quantize, paged decode
(n 1-8, H 32 / 64, cache blocks of 64 / 16 / 5 rows (4-byte copies), klen patterns, garbage beyond the keys,
clean), candidate restriction (bs 8 / 16, -1 blocks), ragged prefill (causal, several sequences, random and
empty ranges), every value distribution (wide blocks take the general path), several launch configurations
and scheduler seeds. ``--mutate "old=>new"`` (patched into every kernel that holds ``old``) checks that a
broken source fails.

    PYTHONPATH=. .venv/bin/python tools/check_index_logits_emu.py [case-substring ...] [--seeds 0,1]
        [--schedule warps]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from reference.index_logits import (  # noqa: E402
    paged_index_logits_torch,
    quantize_index_rows_torch,
    ragged_index_logits_torch,
)
from tilelang_ops.index_logits import IndexLogitsConfig  # noqa: E402
from tilelang_ops.testing import compare_bitwise  # noqa: E402
from tilelang_ops.testing.index_logits import (  # noqa: E402
    DISTS,
    PagedCase,
    RaggedCase,
    index_values,
    make_paged_inputs,
    make_ragged_inputs,
)
from tools.fiber_emu import SCHEDULES  # noqa: E402
from tools.index_logits_emu import emulate_paged, emulate_quantize, emulate_ragged  # noqa: E402

P = PagedCase
R = RaggedCase
C = IndexLogitsConfig
# (case, config or None: the launch rule on 132 SMs)
CASES = [
    (P("n1_b2_k150", 2, 1, 150), None),
    (P("n2_b3_k200_rpb16", 3, 2, 200, rows_per_block=16), None),
    (P("n4_b2_k97_mixed", 2, 4, 97, dist="mixed", clean=True), None),
    (P("n8_b1_k130_h32", 1, 8, 130, heads=32, rows_per_block=32), None),
    (P("n3_b2_k70_ragged_clean", 2, 3, 70, klen="ragged", clean=True), None),
    (P("n1_b2_k45_rpb5_vec4", 2, 1, 45, rows_per_block=5, dist="wide"), None),
    (P("n2_b2_k64_extreme", 2, 2, 64, dist="extreme"), None),
    (P("n1_b1_k1", 1, 1, 1, klen="full", clean=True), None),
    (P("n1_b2_k0", 2, 1, 0), None),
    (P("n1_b1_k300_tiny_split", 1, 1, 300, dist="tiny"), C(rows=1, warps=4, keys_per_step=64, stages=3,
                                                           keys_per_cta=128)),
    (P("n2_b2_k260_big_w8", 2, 2, 260, dist="big"), C(rows=2, warps=8, keys_per_step=128, stages=2,
                                                      keys_per_cta=256, min_ctas=0)),
    (P("n1_b2_k100_zeros", 2, 1, 100, dist="zeros"), None),
    (P("n4_b1_k80_shift_h32", 1, 4, 80, heads=32, dist="shift"), None),
    (P("cand8_n2_b2", 2, 2, 200, rows_per_block=16, candidates=(6, 8)), None),
    (P("cand16_n1_b3_mixed", 3, 1, 300, candidates=(5, 16), dist="mixed", clean=True), None),
    (P("cand16_n4_b1_h32_split", 1, 4, 500, heads=32, candidates=(9, 16)),
     C(rows=1, warps=4, keys_per_step=64, stages=4, keys_per_cta=64)),
    (R("ragged_causal_t9", 9, 120), None),
    (R("ragged_multi_t13_h32", 13, 150, heads=32, ranges="multi", clean=True), None),
    (R("ragged_random_t6_mixed", 6, 90, ranges="ragged", dist="mixed", clean=True), None),
    (R("ragged_causal_t5_split", 5, 200, dist="wide"), C(rows=4, warps=4, keys_per_step=64, stages=3,
                                                         keys_per_cta=64)),
    (R("ragged_causal_t16_r8", 16, 100), C(rows=8, warps=8, keys_per_step=64, stages=4,
                                                           keys_per_cta=128, min_ctas=0)),
    (P("wg_n1_b2_k150", 2, 1, 150), C(rows=1, warps=4, keys_per_step=64, stages=4, wgmma=True)),
    (P("wg_n4_b2_k97_mixed_clean", 2, 4, 97, dist="mixed", clean=True),
     C(rows=4, warps=4, keys_per_step=64, stages=4, keys_per_cta=64, wgmma=True)),
    (P("wg_n3_b2_k130_h32_ragged_wide", 2, 3, 130, heads=32, klen="ragged", dist="wide"),
     C(rows=4, warps=4, keys_per_step=64, stages=3, keys_per_cta=128, min_ctas=2, wgmma=True)),
    (P("wg_n2_b2_k70_rpb5_extreme", 2, 2, 70, rows_per_block=5, dist="extreme"),
     C(rows=2, warps=4, keys_per_step=64, stages=4, wgmma=True)),
    (P("wg_n1_b1_k64_h32_shift", 1, 1, 64, heads=32, dist="shift"),
     C(rows=1, warps=4, keys_per_step=64, stages=2, keys_per_cta=64, wgmma=True)),
    (P("wg_cand16_n2_b2_mixed_clean", 2, 2, 300, candidates=(5, 16), dist="mixed", clean=True),
     C(rows=1, warps=4, keys_per_step=64, stages=4, keys_per_cta=64, min_ctas=4, wgmma=True)),
    (P("wg_cand8_n1_b3_h32", 3, 1, 200, rows_per_block=16, heads=32, candidates=(6, 8)),
     C(rows=1, warps=4, keys_per_step=64, stages=3, wgmma=True)),
    (R("wg_ragged_causal_t9", 9, 120), C(rows=4, warps=4, keys_per_step=64, stages=4, keys_per_cta=4096,
                                         min_ctas=2, wgmma=True)),
    (R("wg_ragged_multi_t13_h32", 13, 150, heads=32, ranges="multi", clean=True),
     C(rows=4, warps=4, keys_per_step=64, stages=4, keys_per_cta=128, min_ctas=2, wgmma=True)),
    (R("wg_ragged_random_t6_mixed", 6, 90, ranges="ragged", dist="mixed", clean=True),
     C(rows=2, warps=4, keys_per_step=64, stages=3, keys_per_cta=64, min_ctas=0, wgmma=True)),
    (R("wg_ragged_causal_t5_wide", 5, 200, dist="wide"), C(rows=4, warps=4, keys_per_step=64, stages=3,
                                                          keys_per_cta=64, wgmma=True)),
    (R("wg_ragged_causal_t7_extreme", 7, 130, dist="extreme"), C(rows=4, warps=4, keys_per_step=64,
                                                                stages=4, keys_per_cta=4096, wgmma=True)),
]


def run_quantize(seed, schedule="random", mutate=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.cat([index_values(24, d, g) for d in DISTS]).to(torch.bfloat16).reshape(2, -1, 128)
    got, want = emulate_quantize(x, seed=seed, schedule=schedule, mutate=mutate), quantize_index_rows_torch(x)
    return [compare_bitwise("codes", got[0], want[0]), compare_bitwise("scales", got[1], want[1])]


def run_case(case, config, seed, schedule="random", mutate=None):
    emu = dict(config=config, seed=seed, schedule=schedule, mutate=mutate)
    if isinstance(case, PagedCase):
        kw = make_paged_inputs(case)
        want = paged_index_logits_torch(**{**kw, "out": kw["out"].clone()})
        got = emulate_paged(**{**kw, "out": kw["out"].clone()}, **emu)
    else:
        kw = make_ragged_inputs(case)
        want = ragged_index_logits_torch(**{**kw, "out": kw["out"].clone()})
        got = emulate_ragged(**{**kw, "out": kw["out"].clone()}, **emu)
    return [compare_bitwise("logits", got, want)]


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("only", nargs="*")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--mutate", default=None, metavar="OLD=>NEW",
                    help="patch every generated source that holds OLD (a broken kernel must fail)")
    ap.add_argument("--schedule", default="random", choices=SCHEDULES,
                    help="fiber_emu's scheduler: random, or warp-serial (exposes races between barriers)")
    a = ap.parse_args(argv)
    failed = 0
    for seed in [int(s) for s in a.seeds.split(",")]:
        jobs = [("quantize", None, None)] + [(c.id, c, cfg) for c, cfg in CASES]
        for name, case, cfg in jobs:
            if a.only and not any(o in name for o in a.only):
                continue
            t0 = time.time()
            comps = (run_quantize(seed, a.schedule, a.mutate) if case is None
                     else run_case(case, cfg, seed, a.schedule, a.mutate))
            bad = [c for c in comps if not c.passed]
            failed += bool(bad)
            print(f"{'FAIL' if bad else 'ok  '} {name} seed {seed} ({time.time() - t0:.1f} s)"
                  + "".join(f"\n     {c.message()}" for c in bad), flush=True)
    print(f"{failed} failing")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
