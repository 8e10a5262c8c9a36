# ruff: noqa: E501  (embedded C++ and case tables)
"""Emulate the compress_store kernels on CPU (generated CUDA -> C++, one thread per CUDA thread, blocks
forward / reversed / shuffled): v1 (both operations), prefill v2 and decode v3 (the defaults) must equal
v1 bitwise; v1 and v2 are compared with the twins (bitwise as well here). `--mutate` checks that
deliberately broken v2 prefill sources are caught.

    PYTHONPATH=. .venv/bin/python tools/check_compress_store_emu.py [case-substring ...] [--mutate]
"""
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TILELANG_CACHE_DIR", "/tmp/tlcache")
import torch  # noqa: E402

import tests.test_compress_store as tcs  # noqa: E402
import tilelang_ops.compress_store as cs  # noqa: E402
from tests.test_compress_store import TWIN, GpuCase, gpu_batch, run_step  # noqa: E402
from tilelang_ops.build import compile_for_sm90  # noqa: E402
from tilelang_ops.kv_store import _TORCH_TO_TL  # noqa: E402
from tools.cuda_emu import WORK, Emu  # noqa: E402

SRC = f"{WORK}/src"  # generated sources, cached by static arguments: clear it after editing a kernel
os.makedirs(SRC, exist_ok=True)

F = {"p1": cs.compress_store_prefill_kernel, "d1": cs.compress_store_decode_kernel,
     "p2": cs.compress_store_prefill_kernel_v2, "d3": cs.compress_store_decode_kernel_v3}

def source(kind, fmt, interleaved=True, norm=True, wdt="bfloat16", pdt="int32", sdt="int64", extra=()):
    key = f"{SRC}/{kind}_{fmt}_{int(interleaved)}_{int(norm)}_{wdt}_{pdt}_{sdt}_{'_'.join(map(str, extra))}.cu"
    if not os.path.exists(key):
        src = compile_for_sm90(F[kind], fmt, 2, 64, interleaved, norm, wdt, pdt, sdt, *extra).get_kernel_source()
        open(key, "w").write(src)
    return open(key).read()


tcs.GPU = "cpu"
_emus = {}

def emu_for(kind, fmt, p, norm, pdt, sdt, extra):
    key = (kind, fmt, p.interleaved, norm, _TORCH_TO_TL[p.w.dtype], pdt, sdt, extra)
    if key not in _emus:
        _emus[key] = Emu(source(kind, fmt, p.interleaved, norm, _TORCH_TO_TL[p.w.dtype], pdt, sdt, extra))
    return _emus[key]

def run_emu(variant, case, meta, x, state0, p, cache0, extra, order_kind, seed=0):
    state, cache = state0.clone(), cache0.clone()
    rows = meta.num_rows["2"]
    out_norm = torch.full((rows, 512), 7.0, dtype=torch.bfloat16) if case.out_norm else torch.empty(1, 512, dtype=torch.bfloat16)
    pos, slots = meta.compressed_positions["2"].contiguous(), meta.slot_mapping_store_ca["2"].contiguous()
    pdt, sdt = _TORCH_TO_TL[pos.dtype], _TORCH_TO_TL[slots.dtype]
    kind = ("p" if case.prefill else "d") + variant[1]
    e = emu_for(kind, p.fmt.name, p, case.out_norm, pdt, sdt, extra)
    kw = dict(cache=cache.view(-1), cos=p.cos.contiguous(), sin=p.sin.contiguous(), out_norm=out_norm,
              positions=pos, slots=slots, projected_kv=x.contiguous(), state=state, weight=p.w.contiguous(),
              cache_bytes=cache.numel(), eps=p.eps, max_pos=p.cos.shape[0], num_slots=state.shape[0],
              num_tokens=x.shape[0], ring=state.shape[1], norm_rows=out_norm.shape[0])
    if case.prefill:
        nreq = meta.context_lens.numel()
        kw.update(cu_q=meta.cu_seqlens_q.contiguous(), ctx=meta.context_lens.contiguous(),
                  sbi=meta.state_block_idx.contiguous(), cu_c=meta.cu_compressed["2"].contiguous(),
                  num_reqs=nreq, nreq1=nreq + 1, rows=rows, search_steps=cs._search_steps(nreq))
        per_cta = extra[0] * extra[1]
        threads = extra[1] * 32
    else:
        kw.update(ctx=meta.context_lens.contiguous(), sbi=meta.state_block_idx.contiguous())
        per_cta = cs.V3_ROWS if kind == "d3" else extra[0]
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

CASES = [
    (GpuCase("p_fp8_b7_len9_min_ring", True, "fp8_main", 7, 9, 0, 2, max_before=9), [(2, 2, 1), (8, 4, 3), (1, 4, 3), (16, 4, 3)], (4, 4)),
    (GpuCase("p_fp8_b40_len30_ring7", True, "fp8_main", 40, 30, 7, 3, max_before=40), [(8, 4, 3), (3, 2, 1)], (4, 4)),
    (GpuCase("p_fp4_b20_len25_half_w32_i64", True, "fp4_main", 20, 25, 7, 4, interleaved=False, weight_fp32=True, index64=True), [(8, 4, 3), (4, 4, 3)], (4, 4)),
    (GpuCase("p_bf16_b33_len12_min_ring_nonorm", True, "bf16", 33, 12, 0, 5, out_norm=False), [(8, 4, 3), (2, 4, 3)], (4, 4)),
    (GpuCase("p_fp8_b3_len40_odd_min_ring", True, "fp8_main", 3, 40, 0, 8, odd_starts=True), [(8, 4, 3), (5, 2, 3)], (4, 4)),
    (GpuCase("p_fp8_b200_len3_odd", True, "fp8_main", 200, 3, 0, 7, odd_starts=True), [(8, 4, 3)], (4, 4)),
    (GpuCase("d_fp8_b1_q1", False, "fp8_main", 1, 1, 0, 11), [], (4,)),
    (GpuCase("d_fp8_b20_q6_min_ring", False, "fp8_main", 20, 6, 0, 12), [], (4,)),
    (GpuCase("d_fp4_b20_q6_ring9", False, "fp4_main", 20, 6, 9, 13), [], (4,)),
    (GpuCase("d_bf16_b33_q3_half", False, "bf16", 33, 3, 0, 14, interleaved=False), [], (4,)),
    (GpuCase("d_fp8_b50_q6_min_ring_i64", False, "fp8_main", 50, 6, 0, 15, index64=True), [], (4,)),
    (GpuCase("d_fp4_b60_q1_w32_no_norm", False, "fp4_main", 60, 1, 0, 16, weight_fp32=True, out_norm=False), [], (4,)),
]



MUTATIONS = {  # generated-source edits (first occurrence) that must make v2 disagree with the reference
    "weight_off_by_1e-4": ("float e_1 = expf(", "float e_1 = 1.0001f * expf("),
    "diff_sign": ("diff[i_1] = __fsub_rn(sc[i_1], sc[(i_1 + 16)]);", "diff[i_1] = __fsub_rn(sc[(i_1 + 16)], sc[i_1]);"),
    "ring_read_entry": ("% ring);", "+ 1) % ring;"),
    "stale_request_row_offset": ("c0 = c1;", "c0 = c0;"),
}


def mutation_check():
    global source
    case, _, _ = CASES[1]
    meta, x, state0, p, cache0 = gpu_batch(case)
    want = reference(case, meta, x, state0, p, cache0)
    orig = source
    caught = 0
    for name, (a, b) in MUTATIONS.items():
        def mutated(*args, a=a, b=b, **kw):
            s = orig(*args, **kw)
            if args[0] == "p2":
                assert a in s, a
                s = s.replace(a, b, 1)
            return s
        source = mutated
        _emus.clear()
        got = run_emu("v2", case, meta, x, state0, p, cache0, (8, 4, 3), "forward")
        d = [diff(g, w) for g, w in zip(got, want)]
        caught += any(d)
        print(f"mutation {name}: mismatches (ring, cache, out_norm) {d}")
    source = orig
    _emus.clear()
    print(f"{caught}/{len(MUTATIONS)} mutations caught")


if __name__ == "__main__":
    if "--mutate" in sys.argv:
        mutation_check()
        sys.exit(0)
    only = sys.argv[1:]
    bad = 0
    for case, p2_shapes, v1_shape in CASES:
        if only and not any(o in case.id for o in only):
            continue
        t0 = time.time()
        meta, x, state0, p, cache0 = gpu_batch(case)
        want = reference(case, meta, x, state0, p, cache0)
        v1 = run_emu("v1", case, meta, x, state0, p, cache0, v1_shape, "forward")
        d_ref1 = [diff(a, b) for a, b in zip(v1, want)]
        line = [f"{case.id}: rows={meta.num_rows['2']} v1~ref={d_ref1}"]
        f = not cs.V2_FAST  # the other store arithmetic (make_row_store(fast=...)) than the default's
        other = [(8, 4, 3, f)] if case.prefill else []
        for shape in p2_shapes + other:  # prefill v2 launch shapes (none for decode)
            for order in ("forward", "reverse", "random"):
                got = run_emu("v2", case, meta, x, state0, p, cache0, shape, order, seed=len(line))
                d1 = [diff(a, b) for a, b in zip(got, v1)]
                dr = [diff(a, b) for a, b in zip(got, want)]
                bad += sum(d1)
                line.append(f"v2{shape}/{order}: vs v1 {d1} vs ref {dr}")
        # decode v3 vs v1 (fast arithmetic on and off)
        v3_shapes = [] if case.prefill else [(True,), (False,)]
        for shape in v3_shapes:
            for order in ("forward", "reverse", "random"):
                got = run_emu("v3", case, meta, x, state0, p, cache0, shape, order, seed=len(line))
                d1 = [diff(a, b) for a, b in zip(got, v1)]
                bad += sum(d1)
                line.append(f"v3{shape}/{order}: vs v1 {d1}")
        print(" | ".join(line), f"{time.time() - t0:.1f}s", flush=True)
    print("MISMATCHES v2 / v3 vs v1:", bad)
