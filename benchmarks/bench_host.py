"""Host cost of an eager call at decode sizes (issue-33 table): wall time per call of back-to-back calls
(each case's best of 5 rounds, the cases taking turns: ``rounds_us``) beside the device
time of the same call replayed from a CUDA graph, and the ratio to a plain ``torch.add`` on a [64, 8192]
fp32 tensor (the floor of any eager torch op). The floor of any TileLang op comes beside it: a kernel that
does nothing, launched through its TVM-FFI executable with 1 and 10 tensor arguments
(``tilelang_launch_<n>args``). Each op is timed twice: on the Python path, and through the compiled eager
path (``<case>_compiled``, ``tilelang_ops.compiled_eager``).

    BENCH op=host case=<op>_<size> us=<eager wall per call> device_us=<graph replay> x_torch_add=<ratio>
"""

from __future__ import annotations

import time

import torch

from benchmarks.harness import Harness, time_graph_us
from metadata import FP4_INDEX_KV_FORMAT, FP8_MAIN_KV_FORMAT, SeqMetadata, prepare_tensor_input

CALLS = 2000  # back-to-back eager calls per measurement
B = 64  # decode batch


def rounds_us(fns: dict, calls: int = CALLS, *, rounds: int = 5, warmup: int = 500,
              sync=torch.cuda.synchronize) -> dict:
    """{name: wall microseconds per call} of each function: in each of ``rounds`` rounds every function in
    turn runs ``warmup`` untimed calls, then ``calls`` timed back-to-back calls ended by ``sync``; each keeps
    its best round. A slow spell of the host then costs one round of every function instead of every run of
    whichever function it met, and the warm-up before each timed run keeps the other functions' code out of
    its caches."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(warmup):
                fn()
            sync()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            best[name] = min(best[name], (time.perf_counter() - t0) / calls * 1e6)
    return best


def noop_kernel():
    """The factory of a kernel that does nothing (one thread writes one element it read): ``nargs`` 1 or
    10 tensor arguments of one fp32 element each."""
    import tilelang
    import tilelang.language as T

    @tilelang.jit
    def noop(nargs: int):
        if nargs == 1:
            @T.prim_func
            def one(x0: T.Tensor((1,), "float32")):
                with T.Kernel(1, threads=32):
                    if T.get_thread_binding() == 0:
                        x0[0] = x0[0]
            return one

        @T.prim_func
        def ten(x0: T.Tensor((1,), "float32"), x1: T.Tensor((1,), "float32"), x2: T.Tensor((1,), "float32"),
                x3: T.Tensor((1,), "float32"), x4: T.Tensor((1,), "float32"), x5: T.Tensor((1,), "float32"),
                x6: T.Tensor((1,), "float32"), x7: T.Tensor((1,), "float32"), x8: T.Tensor((1,), "float32"),
                x9: T.Tensor((1,), "float32")):
            with T.Kernel(1, threads=32):
                if T.get_thread_binding() == 0:
                    x0[0] = x1[0] + x2[0] + x3[0] + x4[0] + x5[0] + x6[0] + x7[0] + x8[0] + x9[0]
        return ten

    return noop


NOOP_ARGS = (1, 10)


def _decode_meta():
    """Metadata of B single-token decode steps, each completing a compressed row (C2, 16-token blocks)."""
    seqs = [SeqMetadata(1, 16, [r], r) for r in range(B)]
    return prepare_tensor_input(seqs, is_prefill=False, block_size=16, compress_ratios=(2,)).to("cuda")


def _cases():
    import tilelang_ops as ops

    g = torch.Generator(device="cuda").manual_seed(0)
    dev = "cuda"
    d = 512
    cases = {}
    a = torch.randn(64, 8192, device=dev)
    cases["torch_add_64x8192"] = lambda: torch.add(a, a)
    from tilelang_ops._library import direct

    noop = noop_kernel()
    for nargs in NOOP_ARGS:
        launch, ones = direct(noop(nargs)), [torch.zeros(1, device=dev) for _ in range(nargs)]
        cases[f"tilelang_launch_{nargs}args"] = lambda launch=launch, ones=ones: launch(*ones)

    m = _decode_meta()
    x = torch.randn(B, 2 * d, device=dev, generator=g)
    state = torch.randn(B, 2, 2, d, device=dev, generator=g)
    ctx, slot = m.context_lens, m.state_block_idx
    cases["compress_decode_b64"] = lambda: ops.compress_decode(x, state, ctx, slot, 1, 2)

    cos = torch.randn(4096, 32, device=dev, generator=g)
    sin = torch.randn(4096, 32, device=dev, generator=g)
    for name, fmt, hadamard in (("store_fp8_64", FP8_MAIN_KV_FORMAT, False),
                                ("store_fp4_index_64", FP4_INDEX_KV_FORMAT, True)):
        kv = torch.randn(64, fmt.dim, device=dev, generator=g).bfloat16()
        w = torch.rand(fmt.dim, device=dev, generator=g).bfloat16()
        pos = torch.arange(64, device=dev)
        slots = torch.arange(64, device=dev)
        cache = torch.zeros(8, fmt.block_bytes(64), dtype=torch.uint8, device=dev)
        cases[name] = (lambda kv=kv, w=w, pos=pos, slots=slots, cache=cache, fmt=fmt, hadamard=hadamard:
                       ops.norm_rope_hadamard_cast_store(kv, w, 1e-6, cos, sin, pos, slots, cache, fmt,
                                                         rope_dim=64, interleaved=True, hadamard=hadamard))

    k = "2"
    main = torch.zeros(B + 8, FP8_MAIN_KV_FORMAT.block_bytes(8), dtype=torch.uint8, device=dev)
    wcs = torch.rand(d, device=dev, generator=g).bfloat16()
    cases["compress_store_decode_b64"] = lambda: ops.compress_store_decode(
        x, state, ctx, slot, 1, 2, wcs, 1e-6, cos, sin, m.compressed_positions[k],
        m.slot_mapping_store_ca[k], main, FP8_MAIN_KV_FORMAT, rope_dim=64, interleaved=True)

    scores = torch.randn(B, 8192, device=dev, generator=g)
    end = torch.full((B,), 8000, dtype=torch.int32, device=dev)
    cases["topk_b64x8192_k512"] = lambda: ops.topk(scores, 512, end=end)
    tables = torch.randperm(B * 128, device=dev, generator=g).int().reshape(B, 128)  # 64-row blocks
    cases["topk_to_slots_b64x8192_k512"] = lambda: ops.topk_to_slots(scores, 512, end=end, block_size_c=64,
                                                                     block_tables=tables)

    rows = torch.randn(4 * B, d, device=dev, generator=g).bfloat16()
    index = torch.randperm(4 * B, device=dev)[:B].int()
    cases["gather_rows_64x512"] = lambda: ops.gather_rows(rows, index)

    q = torch.randn(B, 1, 64, 128, device=dev, generator=g).bfloat16()
    cases["quantize_index_rows_b64"] = lambda: ops.quantize_index_rows(q)
    codes, qscales = ops.quantize_index_rows(q)
    weights = torch.randn(B, 1, 64, device=dev, generator=g)
    index_cache = torch.randint(0, 256, (B * 16, FP4_INDEX_KV_FORMAT.block_bytes(64)), dtype=torch.uint8,
                                device=dev, generator=g)
    index_cache[:, 64 * 64:] = 127  # scales of 2^0
    index_tables = torch.randperm(B * 16, device=dev, generator=g).int().reshape(B, 16)
    klen = torch.full((B, 1), 1024, dtype=torch.int32, device=dev)
    cases["paged_index_logits_b64n1k1024"] = lambda: ops.paged_index_logits(
        codes, qscales, weights, index_cache, index_tables, klen, 1024)
    return cases


def run(h: Harness) -> None:
    cases = _cases()
    timed = {}
    for name, fn in cases.items():  # a case that fails is reported, the rest still run
        try:
            fn()
            torch.cuda.synchronize()
            timed[name] = fn
        except Exception as exc:  # noqa: BLE001
            print(f"host {name} failed: {type(exc).__name__}: {str(exc)[:300]}")
    wall = rounds_us(timed)
    # the same calls through the compiled eager path (each key recorded during the warm-up)
    import tilelang_ops

    ops = {f"{name}_compiled": fn for name, fn in timed.items()
           if not name.startswith(("torch_", "tilelang_"))}
    before = tilelang_ops.compiled_eager(True)
    try:
        wall.update(rounds_us(ops))
    except Exception as exc:  # noqa: BLE001
        print(f"host compiled eager path failed: {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        tilelang_ops.compiled_eager(before)
    floor = wall["torch_add_64x8192"]
    device = {}
    for name, fn in timed.items():
        try:
            device[name] = time_graph_us(fn)
        except Exception as exc:  # noqa: BLE001
            print(f"host {name}: graph replay failed: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        h.report_host(name, wall[name], device[name], wall[name] / floor)
    for name in ops:
        base = name[:-len("_compiled")]
        if name in wall and base in device:
            h.report_host(name, wall[name], device[base], wall[name] / floor)
