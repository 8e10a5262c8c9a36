"""Emulate the compress kernels on the CPU (their generated CUDA as C++, one thread per CUDA thread, blocks
forward, reversed and shuffled) against the loop references, on the cases of ``make diff``
(``tilelang_ops.diffcases.compress``): rows within one BF16 ulp (the emulator's expf is the C library's,
the reference's exp torch's: they may differ by one FP32 ulp, as the GPU's may), rings bitwise (copies).
``--mutate`` checks that deliberately broken sources are caught. tests/test_compress.py runs one prefill
and one decode case through it (CPU tier).

    PYTHONPATH=. .venv/bin/python tools/check_compress_emu.py [case-substring ...] [--mutate]
"""

import hashlib
import importlib
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TILELANG_CACHE_DIR", "/tmp/tlcache")
import torch  # noqa: E402

from reference.compress import compress_decode_ref, compress_prefill_ref  # noqa: E402
from tilelang_ops.build import compile_for_sm90  # noqa: E402
from tilelang_ops.diffcases.compress import CASES, make_inputs  # noqa: E402
from tilelang_ops.testing import compare_bf16_ulp, compare_bitwise  # noqa: E402
from tools.cuda_emu import WORK, Emu, cached_text, report_mutations  # noqa: E402

# the module (the package exports the function ``compress`` under the same name)
ck = importlib.import_module("tilelang_ops.compress")
SRC = f"{WORK}/compress_src"  # generated sources, keyed by the static arguments and the kernels' code
_KHASH = hashlib.md5(open(ck.__file__, "rb").read()).hexdigest()[:8]
ORDERS = ("forward", "reverse", "random")
RING_READ = "(((int64_t)slot64) * ((int64_t)ring_size))"  # a ring row's offset, where the kernels read it
RING_READ_NEXT = "(((int64_t)(slot64 ^ 1)) * ((int64_t)ring_size))"
LATENT, LATENT_OTHER = "num = (sc[q] * lat[q]);", "num = (sc[q] * lat[(q + 4)]);"

# generated-source edits (first occurrence) that must be caught: (the case whose kernel is edited, old, new)
MUTATIONS = {
    "prefill_latent_of_the_other_position": ("prefill_r2_d512_mixed", LATENT, LATENT_OTHER),
    "decode_latent_of_the_other_position": ("decode_r2_d512_b8_q1", LATENT, LATENT_OTHER),
    # the case whose chunk starts inside a group: its first row reads the ring
    "prefill_ring_read_of_the_next_slot": ("prefill_r2_d512_chunk_over_ring", RING_READ, RING_READ_NEXT),
    "decode_ring_read_of_the_next_slot": ("decode_r2_d512_b8_q1", RING_READ, RING_READ_NEXT),
}


def source(kind: str, dim: int, r: int) -> str:
    """Generated CUDA of the prefill or decode kernel for (D, r) (S a runtime value, as the wrapper's)."""
    key = f"{SRC}/{_KHASH}_{kind}_d{dim}_r{r}.cu"
    factory = ck.compress_prefill_kernel if kind == "prefill" else ck.compress_decode_kernel
    return cached_text(key, lambda: compile_for_sm90(factory, dim, r).get_kernel_source())


_emus: dict = {}


def emu_for(kind: str, dim: int, r: int, edit=None) -> Emu:
    if (kind, dim, r, edit) not in _emus:
        src = source(kind, dim, r)
        if edit is not None:
            assert edit[0] in src, edit[0]
            src = src.replace(edit[0], edit[1], 1)
        _emus[(kind, dim, r, edit)] = Emu(src)
    return _emus[(kind, dim, r, edit)]


def run_emu(case_id: str, order_kind: str = "forward", seed: int = 0, edit=None):
    """One emulated call of the kernel of a ``make diff`` case: (kv [rows, D] bf16, state after)."""
    kind, r, args, extra = make_inputs(case_id, "cpu")
    x, state = args[0], args[1].clone()
    dim = x.shape[1] // 2
    kw = dict(projected_kv=x.contiguous(), state_cache=state, num_slots=state.shape[0],
              num_tokens=x.shape[0], ring_size=state.shape[1])
    if kind == "prefill":
        cu_q, ctx, sbi, cu_c = args[2:]
        rows = extra["num_rows"]
        kw.update(cu_seqlens_q=cu_q, context_lens=ctx, state_block_idx=sbi, cu_compressed=cu_c,
                  num_reqs=ctx.numel(), num_rows=rows)
    else:
        ctx, sbi, _ = args[2:]
        rows = x.shape[0]
        kw.update(context_lens=ctx, state_block_idx=sbi)
    kv = torch.full((rows, dim), 7.0, dtype=torch.bfloat16)  # every row is written
    grid = -(-rows // ck.rows_per_block(dim, kind == "prefill"))
    order = list(range(grid))
    if order_kind == "reverse":
        order.reverse()
    elif order_kind == "random":
        random.Random(seed).shuffle(order)
    emu_for(kind, dim, r, edit)(grid, ck.THREADS, order, kv=kv, **kw)
    return kv, state


def reference(case_id: str):
    """(kv, state after) of the loop reference on the case."""
    kind, r, args, extra = make_inputs(case_id, "cpu")
    state = args[1].clone()
    fn = compress_prefill_ref if kind == "prefill" else compress_decode_ref
    return fn(args[0], state, *args[2:], r, **extra), state


def check_case(case_id: str, orders=ORDERS) -> list:
    """The comparisons of the case's emulated kernel against the reference, one pair per block order."""
    kv_ref, st_ref = reference(case_id)
    out = []
    for i, order in enumerate(orders):
        kv, st = run_emu(case_id, order, seed=i)
        out += [compare_bf16_ulp(f"kv {order}", kv, kv_ref, max_ulp=1),
                compare_bitwise(f"state {order}", st, st_ref)]
    return out


def mutation_caught(name: str) -> bool:
    case_id, old, new = MUTATIONS[name]
    kv_ref, st_ref = reference(case_id)
    kv, st = run_emu(case_id, edit=(old, new))
    kv_ok = compare_bf16_ulp("kv", kv, kv_ref, max_ulp=1).passed
    return not (kv_ok and compare_bitwise("state", st, st_ref).passed)


def main() -> int:
    if "--mutate" in sys.argv:
        return report_mutations(MUTATIONS, mutation_caught)
    only = sys.argv[1:]
    bad = 0
    for case_id in CASES:
        if only and not any(o in case_id for o in only):
            continue
        results = check_case(case_id)
        failed = [c for c in results if not c.passed]
        bad += len(failed)
        print(f"{case_id}: {len(results) - len(failed)}/{len(results)} comparisons pass", flush=True)
        for c in failed:
            print("  ", c.message())
    print("FAILING comparisons:", bad)
    return bad


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
