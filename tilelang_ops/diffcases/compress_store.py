"""compress_store cases for `python -m tilelang_ops diff` (see tilelang_ops/diff.py).

Comparison rules (SPEC 4): everything bitwise. Kernel (the launch rule's config; prefill also at 16 rows
per warp, the big launches' shape) vs loop reference: ring,
whole cache tensor and out_norm (same FP32 operations: the references run on the GPU, where torch's exp
is the kernels' expf, and the RMS sum of squares has one fixed order; tests/test_compress_store.py).
Kernel vs our two-kernel pipeline (compress kernel then store kernel): bitwise. Loop reference vs twin
(CPU self-check): bitwise.
"""

from __future__ import annotations

import torch

from metadata.cache_format import BF16_KV_FORMAT, FP4_MAIN_KV_FORMAT, FP8_MAIN_KV_FORMAT
from metadata.checks import check_choice
from metadata.prepare_tensor_input import SeqMetadata, prepare_tensor_input
from reference.compress_store import (
    compress_store_decode_ref,
    compress_store_decode_torch,
    compress_store_prefill_ref,
    compress_store_prefill_torch,
)
from tilelang_ops.testing import compare_bitwise

OP = "compress_store"
SENTINEL = 0xA5
BLOCK = 128  # token positions per allocator block (64 C2 rows)
R = 2
_FMT = {f.name: f for f in (FP8_MAIN_KV_FORMAT, FP4_MAIN_KV_FORMAT, BF16_KV_FORMAT)}

# id -> (prefill?, format, ring, [(seqlen_q, seqlen_k, state_slot)], interleaved)
_CASES = {
    # straddling groups, nc = 0 chunks, an empty chunk, a chunk longer than the ring
    "prefill_fp8_mixed": (True, "fp8_main", 7, [(5, 9, 6), (0, 4, 1), (1, 5, 0), (37, 37, 3), (64, 201, 2),
                                                (1, 1, 7)], True),
    "prefill_fp4_min_ring_half": (True, "fp4_main", 2, [(13, 15, 3), (3, 3, 0), (2, 6, 1), (40, 41, 2)],
                                  False),
    "prefill_bf16_chunk_over_ring": (True, "bf16", 2, [(301, 1000, 0), (2, 3, 1)], True),
    "decode_fp8_b8_q1": (False, "fp8_main", 7, [(1, 2 * s + 4, s) for s in range(8)], True),
    "decode_fp8_q6_min_ring": (False, "fp8_main", 7, [(6, 16, 0), (6, 7, 3), (5, 5, 1), (1, 6, 2)], True),
    "decode_fp4_q3_half": (False, "fp4_main", 4, [(3, 5, 0), (3, 8, 1), (2, 2, 4)], False),
}
CASES = list(_CASES)


def make_inputs(case_id: str, device):
    """Seeded inputs of one case: (prefill?, args without out_norm, keyword args, slot_mapping)."""
    check_choice("case_id", case_id, _CASES)
    prefill, name, ring, batch, interleaved = _CASES[case_id]
    fmt = _FMT[name]
    g = torch.Generator().manual_seed(sum(map(ord, case_id)))
    seqs, first = [], 0
    for q, k, slot in batch:
        blocks = max(1, -(-k // BLOCK))
        seqs.append(SeqMetadata(q, k, list(range(first, first + blocks))[::-1], slot))
        first += blocks
    meta = prepare_tensor_input(seqs, is_prefill=prefill, block_size=BLOCK, compress_ratios=(R,))
    dim = fmt.dim
    x = torch.randn(meta.total_q, 2 * dim, generator=g)
    x[:, :dim] *= 4
    state = torch.randn(max(s for *_, s in batch) + 1, ring, 2, dim, generator=g) * 3
    w = (torch.rand(dim, generator=g) + 0.5).bfloat16()
    ang = torch.rand(meta.max_seqlen_k + 1, 32, generator=g) * 6.3
    cache = torch.full((first + 1, fmt.block_bytes(BLOCK // R)), SENTINEL, dtype=torch.uint8)
    rows = meta.num_rows[str(R)]
    out_norm = torch.zeros(rows, dim, dtype=torch.bfloat16)
    m = meta.to(device)
    to = lambda t: t.to(device)  # noqa: E731
    store = (to(w), 1e-6, to(torch.cos(ang)), to(torch.sin(ang)), m.compressed_positions[str(R)],
             m.slot_mapping_store_ca[str(R)], to(cache), fmt)
    if prefill:
        head = (to(x), to(state), m.cu_seqlens_q, m.context_lens, m.state_block_idx, m.cu_compressed[str(R)],
                R)
        kw = dict(num_rows=rows)
    else:
        head = (to(x), to(state), m.context_lens, m.state_block_idx, m.max_seqlen_q, R)
        kw = {}
    kw.update(out_norm=to(out_norm), interleaved=interleaved)
    return prefill, head + store, kw, m.slot_mapping_store_ca[str(R)]


def _run(fns, case_id, device):
    """Runs each function on fresh copies of the ring, the cache and out_norm: [(ring, cache, norm)]."""
    prefill, args, kw, slots = make_inputs(case_id, device)
    state_at, cache_at = 1, len(args) - 2
    outs = []
    for fn in fns[0 if prefill else 1]:
        a = list(args)
        a[state_at], a[cache_at] = args[state_at].clone(), args[cache_at].clone()
        k = {**kw, "out_norm": kw["out_norm"].clone()}
        fn(*a, **k)
        outs.append((a[state_at], a[cache_at], k["out_norm"]))
    return outs, args[-1], slots


def self_check(case_id: str):
    """Loop reference vs vectorized twin on CPU: ring, cache and out_norm bitwise."""
    fns = ((compress_store_prefill_ref, compress_store_prefill_torch),
           (compress_store_decode_ref, compress_store_decode_torch))
    (ref, twin), _, _ = _run(fns, case_id, "cpu")
    return [compare_bitwise(f"{w} twin", b, a) for w, a, b in zip(("ring", "cache", "out_norm"), ref, twin)]


def run_case(case_id: str, device):
    """Fused kernel vs loop reference and vs the two-kernel pipeline, on CUDA (prefill at the launch rule's
    config and at 16 rows per warp)."""
    import functools

    from tilelang_ops.compress_store import (
        CompressStoreConfig,
        compress_store_decode,
        compress_store_prefill,
        two_kernel_decode,
        two_kernel_prefill,
    )

    rpw16 = functools.partial(compress_store_prefill, config=CompressStoreConfig(rows_per_warp=16))
    fns = ((compress_store_prefill_ref, compress_store_prefill, two_kernel_prefill, rpw16),
           (compress_store_decode_ref, compress_store_decode, two_kernel_decode))
    (ref, got, pipe, *other), _, _ = _run(fns, case_id, device)
    torch.cuda.synchronize()
    names = ("ring", "cache", "out_norm")
    return ([compare_bitwise(w, a, b) for w, a, b in zip(names, got, ref)]
            + [compare_bitwise(f"{w} vs two-kernel", a, b) for w, a, b in zip(names, got, pipe)]
            + [compare_bitwise(f"{w} rows_per_warp=16", a, b)
               for o in other for w, a, b in zip(names, o, ref)])


def build_check():
    from tilelang_ops.build import compile_for_sm90
    from tilelang_ops.compress_store import (
        BUILD_SHAPES,
        compress_store_decode_kernel,
        compress_store_prefill_kernel,
        prefill_config,
    )

    built = []
    for name, r in BUILD_SHAPES:
        static = (name, r, 64, True, True, "bfloat16", "int32", "int32")
        compile_for_sm90(compress_store_prefill_kernel, *static, prefill_config(1 << 20))
        compile_for_sm90(compress_store_decode_kernel, *static)
        built += [f"prefill_{name}_r{r}", f"decode_{name}_r{r}"]
    return built
