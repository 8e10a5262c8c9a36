# ruff: noqa: E501  (embedded C++ and case tables)
"""Emulate the compress_store kernels on CPU (generated CUDA -> C++, one thread per CUDA thread, blocks
forward / reversed / shuffled): prefill at several launch configs and decode must equal the twins bitwise
(ring, cache, out_norm). `--mutate` checks that deliberately broken prefill sources are caught.
tests/test_compress_store.py runs one small case of each kernel through it (CPU tier).

    PYTHONPATH=. .venv/bin/python tools/check_compress_store_emu.py [case-substring ...] [--mutate]
"""
import hashlib
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TILELANG_CACHE_DIR", "/tmp/tlcache")
import torch  # noqa: E402

import tilelang_ops.compress_store as cs  # noqa: E402
from reference.compress_store import compress_store_decode_torch, compress_store_prefill_torch  # noqa: E402
from tilelang_ops.build import compile_for_sm90  # noqa: E402
from tilelang_ops.kv_store import _TORCH_TO_TL  # noqa: E402
from tilelang_ops.testing.compress_store import GpuCase, gpu_batch, run_step  # noqa: E402
from tools.cuda_emu import WORK, Emu, cached_text, report_mutations  # noqa: E402

SRC = f"{WORK}/cs_src"  # generated sources, keyed by a hash of the static arguments and the kernels' code
_KHASH = hashlib.md5(open(cs.__file__, "rb").read()).hexdigest()[:8]
TWIN = (compress_store_prefill_torch, compress_store_decode_torch)
C = cs.CompressStoreConfig


def source(static):
    """Generated CUDA of the prefill kernel (static ends in its config) or the decode kernel."""
    prefill = isinstance(static[-1], cs.CompressStoreConfig)
    key = f"{SRC}/{_KHASH}_{hashlib.md5(repr(static).encode()).hexdigest()[:16]}.cu"
    factory = cs.compress_store_prefill_kernel if prefill else cs.compress_store_decode_kernel
    return cached_text(key, lambda: compile_for_sm90(factory, *static).get_kernel_source())


_emus = {}


def emu_for(static, edit=None):
    if (static, edit) not in _emus:
        src = source(static)
        if edit is not None:
            assert edit[0] in src, edit[0]
            src = src.replace(edit[0], edit[1], 1)
        _emus[(static, edit)] = Emu(src)
    return _emus[(static, edit)]


def run_emu(case, meta, x, state0, p, cache0, config, order_kind="forward", seed=0, edit=None):
    """One fused call emulated (``config``: the prefill launch shape; None for decode)."""
    state, cache = state0.clone(), cache0.clone()
    rows = meta.num_rows["2"]
    out_norm = torch.full((rows, 512), 7.0, dtype=torch.bfloat16) if case.out_norm else torch.empty(1, 512, dtype=torch.bfloat16)
    pos, slots = meta.compressed_positions["2"].contiguous(), meta.slot_mapping_store_ca["2"].contiguous()
    static = (p.fmt.name, 2, 64, p.interleaved, case.out_norm, _TORCH_TO_TL[p.w.dtype], _TORCH_TO_TL[pos.dtype],
              _TORCH_TO_TL[slots.dtype]) + ((config,) if case.prefill else ())
    e = emu_for(static, edit)
    kw = dict(cache=cache, cos=p.cos.contiguous(), sin=p.sin.contiguous(), out_norm=out_norm,
              positions=pos, slots=slots, projected_kv=x.contiguous(), state=state, weight=p.w.contiguous(),
              num_blocks=cache.shape[0], cache_block_bytes=cache.shape[1], eps=p.eps, max_pos=p.cos.shape[0],
              num_slots=state.shape[0], num_tokens=x.shape[0], ring=state.shape[1], norm_rows=out_norm.shape[0])
    if case.prefill:
        nreq = meta.context_lens.numel()
        kw.update(cu_q=meta.cu_seqlens_q.contiguous(), ctx=meta.context_lens.contiguous(),
                  sbi=meta.state_block_idx.contiguous(), cu_c=meta.cu_compressed["2"].contiguous(),
                  num_reqs=nreq, nreq1=nreq + 1, rows=rows, search_steps=cs._search_steps(nreq))
        per_cta, threads = config.rows_per_warp * config.warps, config.warps * 32
    else:
        kw.update(ctx=meta.context_lens.contiguous(), sbi=meta.state_block_idx.contiguous())
        per_cta = cs.DECODE_ROWS
        threads = per_cta * 32
        rows = x.shape[0]
    grid = -(-rows // per_cta)
    order = list(range(grid))
    if order_kind == "reverse":
        order = order[::-1]
    elif order_kind == "random":
        random.Random(seed).shuffle(order)
    e(grid, threads, order, **kw)
    return state, cache, (out_norm if case.out_norm else None)


def reference(case, meta, x, state0, p, cache0):
    state, cache = state0.clone(), cache0.clone()
    out_norm = torch.full((meta.num_rows["2"], 512), 7.0, dtype=torch.bfloat16) if case.out_norm else None
    run_step(TWIN, x, state, meta, 2, p, cache, out_norm)
    return state, cache, out_norm


def diff(a, b):
    if a is None:
        return 0
    return int((a.view(torch.uint8) != b.view(torch.uint8)).sum()) if a.dtype != torch.uint8 else int((a != b).sum())


# (case, prefill configs: the launch rule's first, then other shapes)
CASES = [
    (GpuCase("p_fp8_b7_len9_min_ring", True, "fp8_main", 7, 9, 0, 2, max_before=9), [C(4), C(2, 2, 1), C(8, 4, 3), C(1, 4, 3), C(16, 4, 3)]),
    (GpuCase("p_fp8_b40_len30_ring7", True, "fp8_main", 40, 30, 7, 3, max_before=40), [C(4), C(8, 4, 3), C(3, 2, 1)]),
    (GpuCase("p_fp4_b20_len25_half_w32_i64", True, "fp4_main", 20, 25, 7, 4, interleaved=False, weight_fp32=True, index64=True), [C(4), C(8, 4, 3)]),
    (GpuCase("p_bf16_b33_len12_min_ring_nonorm", True, "bf16", 33, 12, 0, 5, out_norm=False), [C(4), C(8, 4, 3), C(2, 4, 3)]),
    (GpuCase("p_fp8_b3_len40_odd_min_ring", True, "fp8_main", 3, 40, 0, 8, odd_starts=True), [C(4), C(8, 4, 3), C(5, 2, 3)]),
    (GpuCase("p_fp8_b200_len3_odd", True, "fp8_main", 200, 3, 0, 7, odd_starts=True), [C(4), C(8, 4, 3)]),
    (GpuCase("d_fp8_b1_q1", False, "fp8_main", 1, 1, 0, 11), [None]),
    (GpuCase("d_fp8_b20_q6_min_ring", False, "fp8_main", 20, 6, 0, 12), [None]),
    (GpuCase("d_fp4_b20_q6_ring9", False, "fp4_main", 20, 6, 9, 13), [None]),
    (GpuCase("d_bf16_b33_q3_half", False, "bf16", 33, 3, 0, 14, interleaved=False), [None]),
    (GpuCase("d_fp8_b50_q6_min_ring_i64", False, "fp8_main", 50, 6, 0, 15, index64=True), [None]),
    (GpuCase("d_fp4_b60_q1_w32_no_norm", False, "fp4_main", 60, 1, 0, 16, weight_fp32=True, out_norm=False), [None]),
]

MUTATIONS = {  # generated-source edits (first occurrence) of the prefill kernel that must be caught
    "weight_off_by_1e-4": ("float e_1 = expf(", "float e_1 = 1.0001f * expf("),
    "diff_sign": ("diff[i_1] = __fsub_rn(sc[i_1], sc[(i_1 + 16)]);", "diff[i_1] = __fsub_rn(sc[(i_1 + 16)], sc[i_1]);"),
    "ring_read_entry": ("% ring);", "+ 1) % ring;"),
    "stale_request_row_offset": ("c0 = c1;", "c0 = c0;"),
}


def check_case(case, configs, orders=("forward", "reverse", "random")):
    """Emulates ``case`` at each config and block order: (mismatches vs the twins, line)."""
    meta, x, state0, p, cache0 = gpu_batch(case, "cpu")
    want = reference(case, meta, x, state0, p, cache0)
    line, total = [f"{case.id}: rows={meta.num_rows['2']}"], 0
    for config in configs:
        for order in orders:
            got = run_emu(case, meta, x, state0, p, cache0, config, order, seed=len(line))
            d = [diff(a, b) for a, b in zip(got, want)]
            total += sum(d)
            shape = "" if config is None else f"({config.rows_per_warp}, {config.warps}, {config.min_ctas})"
            line.append(f"{shape}/{order}: {d}")
    return total, " | ".join(line)


def mutation_caught(name, case_index=1):
    case, configs = CASES[case_index]
    meta, x, state0, p, cache0 = gpu_batch(case, "cpu")
    want = reference(case, meta, x, state0, p, cache0)
    got = run_emu(case, meta, x, state0, p, cache0, configs[0], edit=MUTATIONS[name])
    return any(diff(g, w) for g, w in zip(got, want))


def main():
    if "--mutate" in sys.argv:
        return report_mutations(MUTATIONS, mutation_caught)
    only = sys.argv[1:]
    bad = 0
    for case, configs in CASES:
        if only and not any(o in case.id for o in only):
            continue
        t0 = time.time()
        n, line = check_case(case, configs)
        bad += n
        print(line, f"{time.time() - t0:.1f}s", flush=True)
    print("MISMATCHES vs the twins:", bad)
    return bad


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
