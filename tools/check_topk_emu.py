# ruff: noqa: E501
"""Emulate the top-k kernels on CPU (generated CUDA -> C++ with tools/fiber_emu.py, one fiber per CUDA
thread, random scheduling at barriers / warp intrinsics) through the real wrappers, and compare bitwise
with the vectorized twin (tested equal to the loop reference). Sets: small (row-cache tiers), mid (32768
tier, rows > 2 * TILE), long (uncached rows), big (128K-1M rows), misc (options, offsets, strides,
fused slots), bmax (block max, NaN payloads), adv (estimate too high / too low, candidates beyond the
capacity, 50-way ties, k = 1, k = row). Every variant in tilelang_ops.topk.VARIANTS runs (v1, and v3 with
its own factory topk_kernel_v3); `--variant v3` (or a comma list) picks some. `--mutate "old=>new"` patches
the generated source once (to check that a broken kernel is caught). v3 splits rows over a cluster as the
wrapper would on a device of `--sms` SMs (default 132, the H200: rows of b <= 33 split, the clusters taking
at most half the SMs; `--sms 1` never splits), with at most `--max-split` CTAs per row (default
tilelang_ops.topk.MAX_SPLIT).

    PYTHONPATH=. .venv/bin/python tools/check_topk_emu.py [--variant v1,v3] [--seeds 0,1] [--mutate S]
        [--sms N] [--max-split S] [--threads T] [--stream] [set ...]

`--threads T` runs v3 with T threads per CTA on every row it does not split (the wrapper picks 256 only
for many short rows; `--sms 1` keeps every row unsplit). `--stream` builds v3's streaming-read kernel for
every launch of uncached rows in one CTA each (the wrapper does so only for such launches that read half
the L2 or more).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TILELANG_CACHE_DIR", "/tmp/tlcache")
import torch  # noqa: E402

import tilelang_ops.topk as tk  # noqa: E402
from reference.topk import block_max_scores_ref, topk_torch  # noqa: E402
from tests.test_topk import (  # noqa: E402
    GpuCase,
    _mode_kwargs,
    as_pairs_by_index,
    make_end,
    make_scores,
    poison_beyond_end,
    with_nan_payloads,
)
from tilelang_ops.build import compile_for_sm90  # noqa: E402
from tilelang_ops.testing import compare_bitwise  # noqa: E402
from tools.fiber_emu import EmuKernel  # noqa: E402

_real_factory = tk.topk_kernel
_real_v3 = tk.topk_kernel_v3
_real_warp = tk.topk_kernel_warp
_real_tile = tk.topk_kernel_tile
ORDER = ["scores", "end", "offset", "cand", "table", "values", "indices", "n", "ld", "has_end"]
SHAPES = {"total": ("scores", None), "nb_end": ("end", None), "nb_off": ("offset", None),
          "b": ("indices", 0), "k": ("indices", 1), "nc": ("cand", 1), "mb": ("table", 1),
          "nb_val": ("values", 0), "kv": ("values", 1)}
_kernels = {}
SEED = [0]
# CUDA intrinsics v3 calls directly (shared counter add returning the old value, bitmap or, warp reductions)
EMU_EXTRA = """inline int emu_atomicAdd(int* a, int v) { int o = *a; *a = o + v; return o; }
inline uint emu_atomicOr(uint* a, uint v) { uint o = *a; *a = o | v; return o; }
// warp reductions (REDUX): all 32 lanes meet at the call site, as for the shuffles
template <class T> inline T emu_redux(int line, T v, int op) {
  return from_u64<T>(warp_xchg(line, to_u64(v), [&](int q, uint64_t* s) {
    T r = from_u64<T>(s[0]);
    for (int j = 1; j < 32; ++j) { T x = from_u64<T>(s[j]); r = op == 0 ? (x < r ? x : r) : op == 1 ? (x > r ? x : r) : (T)((uint)r + (uint)x); }
    return to_u64(r); }));
}
// (functions, not macros: the emulator drops preprocessor lines; __builtin_LINE() is the call site)
inline uint __reduce_min_sync(uint, uint v, int line = __builtin_LINE()) { return emu_redux(line, v, 0); }
inline uint __reduce_max_sync(uint, uint v, int line = __builtin_LINE()) { return emu_redux(line, v, 1); }
inline int __reduce_add_sync(uint, int v, int line = __builtin_LINE()) { return emu_redux(line, v, 2); }
"""


# the cluster helpers of tilelang_ops.topk.CLUSTER_PRELUDE (PTX there) on the emulator's cluster
EMU_CLUSTER = """inline unsigned tl_topk_st_cluster(void* p, unsigned rank, unsigned v) { *emu_cluster_ptr((unsigned*)p, rank) = v; return 0u; }
inline unsigned tl_topk_atomic_add_cluster(void* p, unsigned rank, unsigned v) { unsigned* q = emu_cluster_ptr((unsigned*)p, rank); unsigned o = *q; *q = o + v; return o; }
inline unsigned tl_topk_cluster_arrive() { emu_cluster_arrive(); return 0u; }
inline unsigned tl_topk_cluster_wait() { emu_cluster_wait(); return 0u; }
"""
# the streaming load of tilelang_ops.topk.STREAM_PRELUDE (PTX there): a plain load
EMU_STREAM = """template <typename Tp> inline unsigned tl_topk_ld_stream(const Tp* p) {
  if constexpr (sizeof(Tp) == 4) { unsigned r; memcpy(&r, p, 4); return r; }
  else { unsigned short r; memcpy(&r, p, 2); return ((unsigned)r) << 16; }
}
"""
SMS = [132]
L2 = [0]  # the L2 bytes the wrapper sees: 0 never streams, 1 (--stream) streams every unsplit uncached launch


def _emu_source(src):
    if tk.CLUSTER_PRELUDE.strip() in src:
        src = src.replace(tk.CLUSTER_PRELUDE.strip(), EMU_CLUSTER)
    if tk.STREAM_PRELUDE.strip() in src:
        src = src.replace(tk.STREAM_PRELUDE.strip(), EMU_STREAM)
    src = src.replace("atomicAdd(", "emu_atomicAdd(").replace("atomicOr(", "emu_atomicOr(")
    at = src.index('extern "C" __global__')
    return src[:at] + EMU_EXTRA + src[at:]


def fake_v3(*static):
    return fake_factory(*static, real=_real_v3)


def fake_warp(*static):
    key = repr(("warp",) + static)
    if key not in _kernels:
        src = _emu_source(compile_for_sm90(_real_warp, *static).get_kernel_source())
        kern = EmuKernel(src, "topk", ORDER, SHAPES)
        rpc = static[10] if len(static) > 10 else tk.WARP_ROWS
        kern.threads = rpc * 32
        kern.cluster = 1
        kern.grid_of = lambda kw: -(-kw["indices"].shape[0] // rpc)
        _kernels[key] = kern
    k = _kernels[key]
    k.seed = SEED[0]
    return k


def fake_tile(*static):
    key = repr(("tile",) + static)
    if key not in _kernels:
        src = _emu_source(compile_for_sm90(_real_tile, *static).get_kernel_source())
        kern = EmuKernel(src, "topk", ORDER, SHAPES)
        kern.threads = static[10] if len(static) > 10 else tk.THREADS
        kern.cluster = 1
        kern.grid_of = lambda kw: kw["indices"].shape[0]
        _kernels[key] = kern
    k = _kernels[key]
    k.seed = SEED[0]
    return k


def fake_factory(*static, real=None):
    real = real or _real_factory
    key = repr((real is _real_v3,) + static)
    if key not in _kernels:
        src = _emu_source(compile_for_sm90(real, *static).get_kernel_source())
        kern = EmuKernel(src, "topk", ORDER, SHAPES)
        split = static[11] if real is _real_v3 and len(static) > 11 else 1
        kern.threads = static[12] if real is _real_v3 and len(static) > 12 else tk.THREADS
        kern.cluster = split
        kern.grid_of = lambda kw: kw["indices"].shape[0] * split
        _kernels[key] = kern
    k = _kernels[key]
    k.seed = SEED[0]
    return k


tk.topk_kernel = fake_factory
tk.topk_kernel_v3 = fake_v3
tk.topk_kernel_warp = fake_warp
tk.topk_kernel_tile = fake_tile
tk.check_cuda = lambda **kw: torch.device("cpu")
tk._sm_count = lambda device: SMS[0]
tk._l2_bytes = lambda device: L2[0]


def run_case(case, variant, seed):
    tk.TOPK_VARIANT = variant
    SEED[0] = seed
    dtype = torch.float32 if case.dtype == "fp32" else torch.bfloat16
    x = make_scores(case.dist, case.b, case.n, dtype)
    end = make_end(case.ends, case.b, case.n, case.k)
    if end is not None:
        x = poison_beyond_end(x, end)
    kw = dict(end=end, **_mode_kwargs(case.mode))
    v, i = tk.topk(x, case.k, **kw)
    rv, ri = topk_torch(x, case.k, **kw)
    if case.mode == "any":
        v, i = as_pairs_by_index(v, i)
        rv, ri = as_pairs_by_index(rv, ri)
    c1 = compare_bitwise("indices", i, ri)
    c2 = compare_bitwise("values", v, rv)
    return c1, c2


SETS = {
    "big": [
        GpuCase("randn", 2, 131072, 2048), GpuCase("equal", 1, 131072, 2048), GpuCase("few", 1, 131072, 2048),
        GpuCase("sorted", 2, 131072, 2048, "random"), GpuCase("ascending", 1, 131072, 4096, mode="sorted"),
        GpuCase("few", 1, 1 << 20, 4096, "random", "bf16"), GpuCase("conc", 1, 1 << 20, 2048),
        GpuCase("tiny", 1, 1 << 20, 4096, "random"), GpuCase("randn", 2, 1 << 20, 2048),
        GpuCase("special", 6, 16384, 1, "random"),
        GpuCase("special", 6, 16385, 7, "random"), GpuCase("randn", 2, 1 << 17, 100, "zero"),
        GpuCase("special", 2, 200000, 3000, "random", "bf16"), GpuCase("randn", 6, 2048, 64, "random"),
        GpuCase("randn", 2, 4097, 4096, "random"), GpuCase("few", 16, 100, 8, "random", mode="sorted_index"),
    ],
    "mid": [  # 32768 tier, rows > 2 * TILE: v1 caches the row, v3 samples and compacts candidates
        GpuCase("randn", 3, 32768, 2048, "random"), GpuCase("conc", 2, 20000, 2048),
        GpuCase("few", 2, 32768, 2048), GpuCase("equal", 1, 32768, 2048, "random"),
        GpuCase("sorted", 2, 32768, 2048), GpuCase("ascending", 1, 30000, 4096, mode="sorted"),
        GpuCase("special", 2, 32768, 3000, "random", "bf16"), GpuCase("tiny", 1, 32768, 4096),
        GpuCase("randn", 2, 32768, 4096, "random"), GpuCase("randn", 2, 32768, 1, "random"),
        GpuCase("randn", 2, 25000, 100, "short"), GpuCase("special", 2, 17000, 512, "random", mode="sorted_index"),
    ],
    "small": [
        GpuCase("randn", 3, 2048, 512, "random"), GpuCase("special", 3, 2048, 512, "random"),
        GpuCase("few", 3, 2048, 512, "random"), GpuCase("equal", 3, 2048, 512, "random"),
        GpuCase("conc", 2, 2048, 512, "random", "bf16"), GpuCase("tiny", 2, 8192, 4096, "random", mode="sorted"),
        GpuCase("randn", 2, 1, 4), GpuCase("special", 3, 100, 16, "random", "bf16", "sorted"),
        GpuCase("ascending", 2, 5000, 300, "random", mode="sorted_index"),
        GpuCase("sorted", 2, 20000, 1000, "random"),
    ],
    "long": [  # cache_cap == 0 path (n > 32768): sampling, spec compaction, re-read compaction
        GpuCase("randn", 2, 65536, 2048, "random"), GpuCase("conc", 1, 40000, 2048),
        GpuCase("few", 1, 40000, 2048), GpuCase("equal", 1, 40000, 2048),
        GpuCase("sorted", 1, 65536, 2048), GpuCase("ascending", 1, 40000, 4096, mode="sorted"),
        GpuCase("special", 2, 50000, 3000, "random", "bf16"), GpuCase("tiny", 1, 70000, 4096),
        GpuCase("randn", 2, 40000, 100, "short"),
    ],
    "adv": [  # against the sampled estimate and the candidate capacity (v3's fallbacks), ties, small k / rows
        GpuCase("pairs", 16, 8192, 512, "random"), GpuCase("pairs", 2, 32768, 2048),
        GpuCase("pairs", 1, 131072, 2048, "random", "bf16"),
        GpuCase("sampled", 2, 65536, 2048), GpuCase("unsampled", 2, 65536, 2048),
        GpuCase("unsampled", 1, 32768, 2048), GpuCase("sampled", 1, 40000, 4096, mode="sorted"),
        GpuCase("ties50", 2, 131072, 2048), GpuCase("ties50", 2, 20000, 512, "random", mode="sorted_index"),
        GpuCase("equal", 2, 50000, 1), GpuCase("equal", 2, 4096, 4096, "random", mode="sorted"),
        GpuCase("randn", 2, 8192, 512), GpuCase("few", 2, 8192, 512, "random"),
        GpuCase("special", 2, 9000, 4096, "random", "bf16"), GpuCase("unsampled", 1, 1 << 18, 4096, "random"),
        # v3's one-tile rows (keys in registers, 12-bit radix passes over them)
        GpuCase("special", 3, 8192, 1000, "random", "bf16"), GpuCase("ties50", 2, 8192, 300, "random", mode="sorted_index"),
        GpuCase("ascending", 2, 8192, 4095, "random", mode="sorted"), GpuCase("tiny", 2, 8192, 2, "random"),
        # the k-th largest far above the sample (the pre-binned list's last bin) or below the outliers
        GpuCase("outliers", 2, 131072, 300), GpuCase("outliers", 1, 131072, 2048),
        GpuCase("outliers", 2, 32768, 300, mode="sorted"),
    ],
}


def misc(variant, seed=0):
    """Options, fills, offsets, non-contiguous rows and the fused slots path (both modes)."""
    from reference.topk import convert_kv_index_ref_, restore_candidate_indices_ref_
    tk.TOPK_VARIANT = variant
    SEED[0] = seed
    out = []
    base = make_scores("few", 6, 5000)
    x = base[:, 7:4007]
    end = make_end("random", 6, 4000, 300)
    off = torch.arange(6, dtype=torch.int64) * 100000
    kw = dict(end=end, indices_type=torch.int64, idx_oob_fill_value=-9, value_oob_fill_value=7.5,
              output_idx_offset=off, sorted_index=True)
    v, i = tk.topk(x, 300, **kw)
    rv, ri = topk_torch(x.contiguous(), 300, **kw)
    out += [compare_bitwise("opt indices", i, ri), compare_bitwise("opt values", v, rv)]
    # long non-contiguous rows with offsets (cache_cap 0)
    base = make_scores("randn", 3, 50000)
    x = base[:, 3:45003]
    end = make_end("random", 3, 45000, 2048)
    off = torch.arange(3, dtype=torch.int32) * 7
    kw = dict(end=end, output_idx_offset=off, sorted=True)
    v, i = tk.topk(x, 2048, **kw)
    rv, ri = topk_torch(x.contiguous(), 2048, **kw)
    out += [compare_bitwise("long indices", i, ri), compare_bitwise("long values", v, rv)]
    for with_c, (dist, n, k) in ((False, ("randn", 40000, 2048)), (True, ("few", 4096, 512)),
                                 (True, ("randn", 30000, 2048)), (False, ("conc", 32768, 2048)),
                                 (False, ("special", 4096, 512))):
        b, bs, bc, mb = 3, 16, 64, 1000
        x = make_scores(dist, b, n)
        end = make_end("random", b, n, k)
        x = poison_beyond_end(x, end)
        table = torch.randint(0, 100000, (b, mb), dtype=torch.int32)
        blocks = torch.stack([torch.randperm(mb * bc // bs)[: n // bs] for _ in range(b)]).to(
            torch.int32) if with_c else None
        got = tk.topk_to_slots(x, k, end=end, candidate_blocks=blocks, candidate_block_size=bs if with_c else None,
                               block_size_c=bc, block_tables=table)
        _, idx = topk_torch(x, k, end=end)
        if with_c:
            restore_candidate_indices_ref_(idx, blocks, bs)
        want = convert_kv_index_ref_(idx.reshape(b, 1, k), bc, end.clamp(max=k).reshape(b, 1), table).reshape(b, k)
        out.append(compare_bitwise(f"slots {dist} cand={with_c}", got, want))
    return out


_real_bmax = tk.block_max_kernel
_bmax_cache = {}


def fake_bmax(block_size, dt):
    key = (block_size, dt)
    if key not in _bmax_cache:
        src = compile_for_sm90(_real_bmax, block_size, dt).get_kernel_source()
        k = EmuKernel(src, f"bmax{block_size}{dt}", ["scores", "end", "out", "n", "ld", "has_end"],
                      {"total": ("scores", None), "nb_end": ("end", None), "b": ("out", 0), "nblk": ("out", 1)})
        k.threads = 256
        k.grid_of = lambda kw: ((kw["out"].shape[1] + 255) // 256, kw["out"].shape[0])
        _bmax_cache[key] = k
    return _bmax_cache[key]


tk.block_max_kernel = fake_bmax


def bmax():
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        for dist in ("randn", "special", "equal"):
            x = make_scores(dist, 7, 1000, dtype)
            end = make_end("random", 7, 1000, 0)
            end[1] = 0
            x = with_nan_payloads(poison_beyond_end(x, end), step=37)
            for bs in (8, 16, 7):
                out.append(compare_bitwise(f"block_max {dtype} {dist} bs{bs}", tk.block_max_scores(x, bs, end),
                                           block_max_scores_ref(x, bs, end)))
            out.append(compare_bitwise(f"block_max full {dtype} {dist}", tk.block_max_scores(x, 16),
                                       block_max_scores_ref(x, 16)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sets", nargs="*", default=["small", "mid", "long", "misc", "bmax"])
    ap.add_argument("--variant", default=",".join(tk.VARIANTS), help="comma-separated variants")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--mutate", default=None)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--max-split", type=int, default=tk.MAX_SPLIT)
    ap.add_argument("--stream", action="store_true", help="v3's streaming reads on every launch of "
                    "uncached rows in one CTA each (the wrapper: such launches of half the L2 or more)")
    ap.add_argument("--threads", type=int, default=0, help="v3's threads per CTA on every unsplit row "
                    "(default: the wrapper's choice)")
    a = ap.parse_args()
    SMS[0] = a.sms
    L2[0] = 1 if a.stream else 0
    tk.MAX_SPLIT = a.max_split
    if a.threads:
        tk._v3_threads = lambda b, n, cache_cap, sms: a.threads
    if a.mutate:
        os.environ["EMU_MUTATE"] = a.mutate
    seeds = [int(s) for s in a.seeds.split(",")]
    variants = a.variant.split(",")
    unknown = [v for v in variants if v not in tk.VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; choose from {tk.VARIANTS}")
    bad = 0
    for variant in variants:
        for which in a.sets:
            for seed in seeds:
                if which == "bmax" and variant != variants[0]:
                    continue  # block max has no variants
                if which in ("misc", "bmax"):
                    t = time.time()
                    res = misc(variant, seed) if which == "misc" else bmax()
                    fails = [c.message() for c in res if not c.passed]
                    bad += len(fails)
                    print(f"{variant} {which} seed{seed}: {'OK' if not fails else 'FAIL'} {time.time() - t:.1f}s {fails}", flush=True)
                    continue
                for case in SETS[which]:
                    t = time.time()
                    c1, c2 = run_case(case, variant, seed)
                    ok = c1.passed and c2.passed
                    bad += not ok
                    msg = "" if ok else " ".join(c.message() for c in (c1, c2) if not c.passed)
                    print(f"{variant} {case.id} seed{seed}: {'OK' if ok else 'FAIL'} {time.time() - t:.1f}s {msg}", flush=True)
    print("FAILURES", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
