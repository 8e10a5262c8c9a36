"""One small launch of every kernel, for compute-sanitizer (tools/sanitize.sh; CUDA only).

    python -m tilelang_ops.testing.sanitize_cases [op ...]

(ops: compress kv_store compress_store topk index_logits gather_rows; default all)

Each case calls a public wrapper on a small seeded batch (``tilelang_ops.testing.bad_input`` builders on
the GPU) and compares it with its reference (the vectorized twins on the GPU), so a race that changes a
result shows up here even where the sanitizer stays quiet. One line per case:
``SAN <op> <case> equal`` or ``SAN <op> <case> MISMATCH <first comparison message>``; the exit status is 1
when a case mismatches. Comparisons: as in the operators' tests (rings, cache bytes, indices bitwise;
compress rows within one BF16 ulp; FP4 index rows with the tensor-core Hadamard by ``compare_store``).
"""

from __future__ import annotations

import sys

import torch

from metadata.cache_format import BF16_KV_FORMAT, FP4_INDEX_KV_FORMAT, FP4_MAIN_KV_FORMAT, FP8_MAIN_KV_FORMAT
from tilelang_ops.testing import bad_input as B
from tilelang_ops.testing import compare_bf16_ulp, compare_bitwise

DEV = "cuda"


def _pair(call: B.Call, kernel, reference):
    """(kernel call, reference call, kernel result, reference result), each on its own copy of the
    tensors the call writes."""
    got, want = call.fresh(), call.fresh()
    out = got(kernel)
    ref = want(reference)
    torch.cuda.synchronize()
    return got, want, out, ref


def _compress():
    from reference.compress import compress_decode_torch, compress_prefill_torch
    from tilelang_ops.compress import compress_decode, compress_prefill

    for name, build, kernel, ref in (("prefill", B.prefill_call, compress_prefill, compress_prefill_torch),
                                     ("decode", B.decode_call, compress_decode, compress_decode_torch)):
        got, want, kv, kv_ref = _pair(build(DEV, dim=512), kernel, ref)
        # rows: the kernel's expf may differ from torch's exp by one FP32 ulp -> <= 1 BF16 ulp; ring: copies
        yield name, [compare_bf16_ulp("kv", kv, kv_ref, max_ulp=1),
                     compare_bitwise("state_cache", got["state_cache"], want["state_cache"])]


def _kv_store():
    from reference.kv_store import norm_rope_hadamard_cast_store_torch
    from tilelang_ops.kv_store import norm_rope_hadamard_cast_store

    for fmt, hadamard, rpb in ((FP8_MAIN_KV_FORMAT, False, 64), (FP4_MAIN_KV_FORMAT, False, 64),
                               (FP4_INDEX_KV_FORMAT, True, 64), (BF16_KV_FORMAT, False, 64)):
        call = B.store_call(DEV, fmt=fmt, rows=300, rows_per_block=rpb, blocks=6, hadamard=hadamard)
        got, want, _, _ = _pair(call, norm_rope_hadamard_cast_store, norm_rope_hadamard_cast_store_torch)
        if hadamard:  # the tensor cores sum the Hadamard in their own FP32 order (kv_store's diff rules)
            from tilelang_ops.diffcases.kv_store import compare_store

            cache = compare_store(got["kv_cache"], want["kv_cache"], fmt, call["slot_mapping"])
        else:
            cache = [compare_bitwise("kv_cache", got["kv_cache"], want["kv_cache"])]
        yield fmt.name, cache + [compare_bitwise("out_norm", got["out_norm"], want["out_norm"])]


def _compress_store():
    from reference.compress_store import compress_store_decode_torch, compress_store_prefill_torch
    from tilelang_ops.compress_store import compress_store_decode, compress_store_prefill

    for name, build, kernel, ref in (
            ("prefill", B.compress_store_prefill_call, compress_store_prefill, compress_store_prefill_torch),
            ("decode", B.compress_store_decode_call, compress_store_decode, compress_store_decode_torch)):
        got, want, _, _ = _pair(build(DEV), kernel, ref)
        yield name, [compare_bitwise(n, got[n], want[n]) for n in ("state_cache", "kv_cache", "out_norm")]


# (b, n, k) that reach the launch rule's kernels on an H200 (tilelang_ops.topk): a few short rows, many
# short rows (a warp per row), one-tile rows, cached rows, a long row split over a cluster
TOPK_SHAPES = ((4, 40, 5), (1024, 600, 64), (8, 3000, 512), (4, 20000, 512), (1, 131072, 2048))


def _topk():
    from reference.topk import (
        block_max_scores_ref,
        convert_kv_index_ref_,
        restore_candidate_indices_ref_,
        topk_to_slots_ref,
        topk_torch,
    )
    from tilelang_ops.topk import (
        block_max_scores,
        convert_kv_index_,
        restore_candidate_indices_,
        topk,
        topk_to_slots,
    )

    for b, n, k in TOPK_SHAPES:
        call = B.topk_call(DEV, b=b, n=n, k=k)
        (v, i), (rv, ri) = call(topk), call(topk_torch)
        yield f"topk_b{b}_n{n}_k{k}", [compare_bitwise("values", v, rv), compare_bitwise("indices", i, ri)]
    # the loop references on the CPU copy of the same seeded inputs
    for name, build, shape, kernel, ref in (
            ("block_max", B.block_max_call, dict(b=4, n=1000, block_size=16), block_max_scores,
             block_max_scores_ref),
            ("topk_to_slots", B.topk_to_slots_call, dict(b=4, n=512, k=64, block_size_c=64), topk_to_slots,
             topk_to_slots_ref)):
        yield name, [compare_bitwise(name, build(DEV, **shape)(kernel).cpu(), build("cpu", **shape)(ref))]
    for name, build, kernel, ref in (("restore", B.restore_call, restore_candidate_indices_,
                                      restore_candidate_indices_ref_),
                                     ("convert", B.convert_call, convert_kv_index_, convert_kv_index_ref_)):
        got, want = build(DEV), build("cpu")
        got(kernel)
        want(ref)
        yield name, [compare_bitwise("index", got["index"].cpu(), want["index"])]


def _diff_cases(op: str, case_ids: tuple[str, ...]):
    """Small cases of ``make diff`` (their comparisons as there)."""
    import importlib

    cases = importlib.import_module(f"tilelang_ops.diffcases.{op}")
    for case_id in case_ids:
        yield case_id, cases.run_case(case_id, DEV)


def _index_logits():
    yield from _diff_cases("index_logits", ("quantize_mixed_rows300", "paged_b3_n2_k150_decode",
                                            "cand_b2_n2_bs8", "ragged_t6_n90_random_clean"))


def _gather_rows():
    yield from _diff_cases("gather_rows", ("rows_d512_m3000_bad", "rows_d520_m999_bad_strided"))


OPS = {"compress": _compress, "kv_store": _kv_store, "compress_store": _compress_store, "topk": _topk,
       "index_logits": _index_logits, "gather_rows": _gather_rows}


def main(argv) -> int:
    ops = argv or list(OPS)
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        print(f"unknown ops {unknown}; choose from {list(OPS)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("sanitize_cases needs CUDA", file=sys.stderr)
        return 2
    failures = 0
    for op in ops:
        for case, comparisons in OPS[op]():
            bad = [c for c in comparisons if not c.passed]
            failures += bool(bad)
            verdict = "equal" if not bad else f"MISMATCH {bad[0].message()[:200]}"
            print(f"SAN {op} {case} {verdict}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
