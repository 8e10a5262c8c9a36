# ruff: noqa: E501
"""Emulate the top-k kernels on the CPU and compare bitwise with the vectorized twin (tested equal to the
loop reference): the generated CUDA (lowered for sm_90a, no nvcc) runs as C++ through tools/fiber_emu.py,
one fiber per CUDA thread with random scheduling at barriers and warp intrinsics, behind the same launch
as the wrappers (`emu_topk`, `emu_topk_to_slots`, `emu_block_max`). Each launch runs the config the
launch rule picks for a device of `--sms` SMs (default 132, the H200), or the case's own config.

Sets: small (short tier), mid (32768 tier), long (uncached rows), big (128K-1M rows), adv (bounds too high
/ too low, candidates beyond the capacity, 50-way ties, k = 1, k = row), misc (options, offsets, strides,
fused slots), bmax (block max, NaN payloads), smoke (one small case of each kernel: what
tests/test_topk.py runs). `--mutate "old=>new"` patches the generated source once (a broken kernel must
be caught). `--threads T` / `--split S` / `--stream` replace those knobs of every row-kernel launch. From
Python, an `EmuSetup` carries these choices (and the `--sms` device) into `run_case`, `misc`, `smoke`.

    PYTHONPATH=. .venv/bin/python tools/check_topk_emu.py [--seeds 0,1] [--schedule warps] [--mutate S] [--sms N]
        [--threads T] [--split S] [--stream] [set ...]
"""
import argparse
import os
import sys
import time
from dataclasses import dataclass, replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

from reference.topk import block_max_scores_ref, topk_torch  # noqa: E402
from tilelang_ops.testing import compare_bitwise  # noqa: E402
from tilelang_ops.testing.topk import (  # noqa: E402
    GpuCase,
    as_pairs_by_index,
    make_end,
    make_scores,
    poison_beyond_end,
    with_nan_payloads,
)
from tilelang_ops.topk import _sort_by_value, exact_fill, kernel_for  # noqa: E402
from tilelang_ops.topk._host import TORCH_TO_TL, flat_scores  # noqa: E402
from tilelang_ops.topk.elementwise import block_max_kernel  # noqa: E402
from tilelang_ops.topk.launch import TopkConfig, topk_config  # noqa: E402
from tilelang_ops.topk.ptx import CLUSTER_PRELUDE, STREAM_PRELUDE  # noqa: E402
from tools.fiber_emu import SCHEDULES, EmuKernel  # noqa: E402

ORDER = ["scores", "end", "offset", "cand", "table", "values", "indices", "n", "ld", "has_end"]
SHAPES = {"total": ("scores", None), "nb_end": ("end", None), "nb_off": ("offset", None),
          "b": ("indices", 0), "k": ("indices", 1), "nc": ("cand", 1), "mb": ("table", 1),
          "nb_val": ("values", 0), "kv": ("values", 1)}
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


# the cluster helpers of tilelang_ops.topk.ptx.CLUSTER_PRELUDE (PTX there) on the emulator's cluster
EMU_CLUSTER = """inline unsigned tl_topk_st_cluster(void* p, unsigned rank, unsigned v) { *emu_cluster_ptr((unsigned*)p, rank) = v; return 0u; }
inline unsigned tl_topk_atomic_add_cluster(void* p, unsigned rank, unsigned v) { unsigned* q = emu_cluster_ptr((unsigned*)p, rank); unsigned o = *q; *q = o + v; return o; }
inline unsigned tl_topk_cluster_arrive() { emu_cluster_arrive(); return 0u; }
inline unsigned tl_topk_cluster_wait() { emu_cluster_wait(); return 0u; }
"""
# the streaming load of tilelang_ops.topk.ptx.STREAM_PRELUDE (PTX there): a plain load
EMU_STREAM = """template <typename Tp> inline unsigned tl_topk_ld_stream(const Tp* p) {
  if constexpr (sizeof(Tp) == 4) { unsigned r; memcpy(&r, p, 4); return r; }
  else { unsigned short r; memcpy(&r, p, 2); return ((unsigned)r) << 16; }
}
"""
def _emu_source(src):
    if CLUSTER_PRELUDE.strip() in src:
        src = src.replace(CLUSTER_PRELUDE.strip(), EMU_CLUSTER)
    if STREAM_PRELUDE.strip() in src:
        src = src.replace(STREAM_PRELUDE.strip(), EMU_STREAM)
    src = src.replace("atomicAdd(", "emu_atomicAdd(").replace("atomicOr(", "emu_atomicOr(")
    at = src.index('extern "C" __global__')
    return src[:at] + EMU_EXTRA + src[at:]


def lower_source(factory, static) -> str:
    """The CUDA source of factory(*static) for sm_90a (lowered only: no nvcc)."""
    import tilelang
    from tilelang import tvm

    target = {"kind": "cuda", "arch": "sm_90a"}
    func = factory.get_tir(*static)
    with tvm.target.Target(target), tvm.transform.PassContext(config=factory.pass_configs or {}):
        return tilelang.lower(func, target=target).kernel_source


_KERNELS = {}


def topk_emu_kernel(static: tuple, n: int, config: TopkConfig, seed: int = 0,
                    schedule: str = "random", mutate: str | None = None) -> EmuKernel:
    """The emulated top-k kernel of `config` for rows of n entries (static: as for kernel_for), run with the
    scheduler `schedule` (fiber_emu: "random" or "warps") seeded by `seed`; `mutate` ("old=>new") patches
    its generated source once (fiber_emu.build)."""
    factory, args = kernel_for(static, n, config)
    key = (config.kernel, args, mutate)
    if key not in _KERNELS:
        kern = EmuKernel(_emu_source(lower_source(factory, args)), f"topk_{config.kernel}", ORDER, SHAPES,
                         mutate=mutate)
        if config.kernel == "warp":
            rpc = config.rows_per_cta
            kern.threads, kern.cluster = rpc * 32, 1
            kern.grid_of = lambda kw: -(-kw["indices"].shape[0] // rpc)
        else:
            split = config.split if config.kernel == "row" else 1
            kern.threads, kern.cluster = config.threads, split
            kern.grid_of = lambda kw: kw["indices"].shape[0] * split
        _KERNELS[key] = kern
    _KERNELS[key].seed, _KERNELS[key].schedule = seed, schedule
    return _KERNELS[key]


def _zeros(dtype, shape=(1,)):
    return torch.zeros(shape, dtype=dtype)


def emu_topk(x, k, *, end=None, sorted=False, indices_type=torch.int32, idx_oob_fill_value=-1,
             value_oob_fill_value=float("-inf"), output_idx_offset=None, return_value=True, config, seed=0,
             sorted_index=False, schedule="random", mutate=None):
    """tilelang_ops.topk.topk on the emulator (CPU tensors): the wrapper's launch with `config`."""
    b, n = x.shape
    need_values = return_value or sorted
    values = torch.empty((b, k), dtype=x.dtype) if need_values else None
    indices = torch.empty((b, k), dtype=indices_type)
    off_dtype = output_idx_offset.dtype if output_idx_offset is not None else torch.int32
    static = (TORCH_TO_TL[x.dtype], TORCH_TO_TL[indices_type], TORCH_TO_TL[off_dtype], need_values,
              output_idx_offset is not None, int(idx_oob_fill_value), exact_fill(value_oob_fill_value), "topk", 0, 1)
    flat, ld = flat_scores(x)
    topk_emu_kernel(static, n, config, seed, schedule, mutate)(
        flat.contiguous(), end if end is not None else _zeros(torch.int32),
        output_idx_offset if output_idx_offset is not None else _zeros(off_dtype),
        _zeros(torch.int32, (b, 1)), _zeros(torch.int32, (b, 1)),
        values if need_values else _zeros(x.dtype, (1, 1)), indices, n, ld, int(end is not None))
    if sorted:
        values, indices = _sort_by_value(values, indices, end, n, k)
    return (values if return_value else None), indices


def emu_topk_to_slots(x, k, *, end=None, candidate_blocks=None, candidate_block_size=None, block_size_c,
                      block_tables, config, seed=0, schedule="random", mutate=None):
    """tilelang_ops.topk.topk_to_slots on the emulator (CPU tensors): the wrapper's launch with `config`."""
    b, n = x.shape
    slots = torch.empty((b, k), dtype=torch.int32)
    static = (TORCH_TO_TL[x.dtype], "int32", "int32", False, False, -1, float("-inf"), "slots",
              candidate_block_size or 0, block_size_c)
    flat, ld = flat_scores(x)
    cand = candidate_blocks if candidate_blocks is not None else _zeros(torch.int32, (b, 1))
    topk_emu_kernel(static, n, config, seed, schedule, mutate)(
        flat.contiguous(), end if end is not None else _zeros(torch.int32), _zeros(torch.int32), cand,
        block_tables, _zeros(x.dtype, (1, 1)), slots, n, ld, int(end is not None))
    return slots


_BMAX = {}


def emu_block_max(x, block_size, end=None, mutate=None):
    """tilelang_ops.topk.block_max_scores on the emulator (CPU tensors)."""
    static = (block_size, TORCH_TO_TL[x.dtype])
    key = (*static, mutate)
    if key not in _BMAX:
        src = lower_source(block_max_kernel, static)
        kern = EmuKernel(src, f"bmax{block_size}{static[1]}", ["scores", "end", "out", "n", "ld", "has_end"],
                         {"total": ("scores", None), "nb_end": ("end", None), "b": ("out", 0),
                          "nblk": ("out", 1)}, mutate=mutate)
        kern.threads = 256
        kern.grid_of = lambda kw: ((kw["out"].shape[1] + 255) // 256, kw["out"].shape[0])
        _BMAX[key] = kern
    b, n = x.shape
    out = torch.empty((b, -(-n // block_size)), dtype=x.dtype)
    flat, ld = flat_scores(x)
    _BMAX[key](flat.contiguous(), end if end is not None else _zeros(torch.int32), out, n, ld,
               int(end is not None))
    return out


@dataclass(frozen=True)
class EmuSetup:
    """What the checks emulate (the command line's choices): the launch rule's device (`sms` SMs, an `l2`
    of that many bytes), knobs that replace the rule's choice on row-kernel launches (`threads`, `split`,
    `stream`; 0 / False: the rule's), and `mutate` ("old=>new": patched once into the generated source of
    every kernel the checks build)."""
    sms: int = 132
    l2: int = 60 << 20
    threads: int = 0
    split: int = 0
    stream: bool = False
    mutate: str | None = None

    def override(self) -> dict:
        return {k: v for k, v in (("stream", self.stream), ("threads", self.threads), ("split", self.split)) if v}


DEFAULT_SETUP = EmuSetup()  # the launch rule on the H200 (132 SMs), no knob replaced, no mutation


def config_of(case, setup: EmuSetup = DEFAULT_SETUP) -> TopkConfig:
    """The case's config, else the launch rule's for setup's device (with its knobs on row launches)."""
    if case.config is not None:
        return case.config
    config = topk_config(case.b, case.n, 4 if case.dtype == "fp32" else 2, setup.sms, setup.l2)
    if config.kernel == "row" and setup.override():
        config = replace(config, **setup.override())
    return config


def run_case(case, seed=0, schedule="random", setup: EmuSetup = DEFAULT_SETUP):
    """(indices, values) comparisons of one case on the emulator against the twin."""
    dtype = torch.float32 if case.dtype == "fp32" else torch.bfloat16
    x = make_scores(case.dist, case.b, case.n, dtype)
    end = make_end(case.ends, case.b, case.n, case.k)
    if end is not None:
        x = poison_beyond_end(x, end)
    kw = dict(end=end, sorted=case.mode == "sorted", sorted_index=case.mode == "sorted_index")
    v, i = emu_topk(x, case.k, **kw, config=config_of(case, setup), seed=seed, schedule=schedule,
                    mutate=setup.mutate)
    rv, ri = topk_torch(x, case.k, **kw)
    if case.mode == "any":
        v, i = as_pairs_by_index(v, i)
        rv, ri = as_pairs_by_index(rv, ri)
    return compare_bitwise("indices", i, ri), compare_bitwise("values", v, rv)


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
    "mid": [  # 32768 tier, rows > 2 * TILE: sampled, candidates compacted
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
    "long": [  # uncached rows (n > 32768): sampling, compaction, re-read compaction
        GpuCase("randn", 2, 65536, 2048, "random"), GpuCase("conc", 1, 40000, 2048),
        GpuCase("few", 1, 40000, 2048), GpuCase("equal", 1, 40000, 2048),
        GpuCase("sorted", 1, 65536, 2048), GpuCase("ascending", 1, 40000, 4096, mode="sorted"),
        GpuCase("special", 2, 50000, 3000, "random", "bf16"), GpuCase("tiny", 1, 70000, 4096),
        GpuCase("randn", 2, 40000, 100, "short"),
    ],
    "adv": [  # against the sampled estimate and the candidate capacity (the row kernel's fallbacks), ties, small k / rows
        GpuCase("pairs", 16, 8192, 512, "random"), GpuCase("pairs", 2, 32768, 2048),
        GpuCase("pairs", 1, 131072, 2048, "random", "bf16"),
        GpuCase("sampled", 2, 65536, 2048), GpuCase("unsampled", 2, 65536, 2048),
        GpuCase("unsampled", 1, 32768, 2048), GpuCase("sampled", 1, 40000, 4096, mode="sorted"),
        GpuCase("ties50", 2, 131072, 2048), GpuCase("ties50", 2, 20000, 512, "random", mode="sorted_index"),
        GpuCase("equal", 2, 50000, 1), GpuCase("equal", 2, 4096, 4096, "random", mode="sorted"),
        GpuCase("randn", 2, 8192, 512), GpuCase("few", 2, 8192, 512, "random"),
        GpuCase("special", 2, 9000, 4096, "random", "bf16"), GpuCase("unsampled", 1, 1 << 18, 4096, "random"),
        # one-tile rows (keys in registers, 12-bit radix passes over them)
        GpuCase("special", 3, 8192, 1000, "random", "bf16"), GpuCase("ties50", 2, 8192, 300, "random", mode="sorted_index"),
        GpuCase("ascending", 2, 8192, 4095, "random", mode="sorted"), GpuCase("tiny", 2, 8192, 2, "random"),
        # the k-th largest far above the sample (the pre-binned list's last bin) or below the outliers
        GpuCase("outliers", 2, 131072, 300), GpuCase("outliers", 1, 131072, 2048),
        GpuCase("outliers", 2, 32768, 300, mode="sorted"),
    ],
}


def misc(seed=0, schedule="random", setup: EmuSetup = DEFAULT_SETUP):
    """Options, fills, offsets, non-contiguous rows and the fused slots path (both modes)."""

    out = []
    base = make_scores("few", 6, 5000)
    x = base[:, 7:4007]
    end = make_end("random", 6, 4000, 300)
    off = torch.arange(6, dtype=torch.int64) * 100000
    kw = dict(end=end, indices_type=torch.int64, idx_oob_fill_value=-9, value_oob_fill_value=7.5,
              output_idx_offset=off, sorted_index=True)
    v, i = emu_topk(x, 300, **kw, config=config_of(GpuCase("few", 6, 4000, 300), setup), seed=seed,
                    schedule=schedule, mutate=setup.mutate)
    rv, ri = topk_torch(x.contiguous(), 300, **kw)
    out += [compare_bitwise("opt indices", i, ri), compare_bitwise("opt values", v, rv)]
    # long non-contiguous rows with offsets (the uncached tier)
    base = make_scores("randn", 3, 50000)
    x = base[:, 3:45003]
    end = make_end("random", 3, 45000, 2048)
    off = torch.arange(3, dtype=torch.int32) * 7
    kw = dict(end=end, output_idx_offset=off, sorted=True)
    v, i = emu_topk(x, 2048, **kw, config=config_of(GpuCase("randn", 3, 45000, 2048), setup), seed=seed,
                    schedule=schedule, mutate=setup.mutate)
    rv, ri = topk_torch(x.contiguous(), 2048, **kw)
    out += [compare_bitwise("long indices", i, ri), compare_bitwise("long values", v, rv)]
    for with_c, (dist, n, k) in ((False, ("randn", 40000, 2048)), (True, ("few", 4096, 512)),
                                 (True, ("randn", 30000, 2048)), (False, ("conc", 32768, 2048)),
                                 (False, ("special", 4096, 512))):
        out.append(slots_case(dist, 3, n, k, with_c, config_of(GpuCase(dist, 3, n, k), setup), seed, schedule,
                              setup.mutate))
    return out


def slots_case(dist, b, n, k, with_c, config, seed=0, schedule="random", mutate=None):
    """The fused slots path on the emulator against the twin's top-k and the loop restore / convert."""
    from reference.topk import convert_kv_index_ref_, restore_candidate_indices_ref_

    bs, bc, mb = 16, 64, 1000
    g = torch.Generator().manual_seed(seed)
    x = make_scores(dist, b, n)
    end = make_end("random", b, n, k)
    x = poison_beyond_end(x, end)
    table = torch.randint(0, 100000, (b, mb), dtype=torch.int32, generator=g)
    blocks = torch.stack([torch.randperm(mb * bc // bs, generator=g)[: n // bs] for _ in range(b)]).to(
        torch.int32) if with_c else None
    got = emu_topk_to_slots(x, k, end=end, candidate_blocks=blocks, candidate_block_size=bs if with_c else None,
                            block_size_c=bc, block_tables=table, config=config, seed=seed,
                            schedule=schedule, mutate=mutate)
    _, idx = topk_torch(x, k, end=end)
    if with_c:
        restore_candidate_indices_ref_(idx, blocks, bs)
    want = convert_kv_index_ref_(idx.reshape(b, 1, k), bc, end.clamp(max=k).reshape(b, 1), table).reshape(b, k)
    return compare_bitwise(f"slots {dist} n{n} cand={with_c} {config}", got, want)


def bmax_case(dtype, dist, b=7, n=1000, block_sizes=(8, 16, 7), mutate=None):
    x = make_scores(dist, b, n, dtype)
    end = make_end("random", b, n, 0)
    end[1] = 0
    x = with_nan_payloads(poison_beyond_end(x, end), step=37)
    out = [compare_bitwise(f"block_max {dtype} {dist} bs{bs}", emu_block_max(x, bs, end, mutate),
                           block_max_scores_ref(x, bs, end)) for bs in block_sizes]
    out.append(compare_bitwise(f"block_max full {dtype} {dist}", emu_block_max(x, 16, mutate=mutate),
                               block_max_scores_ref(x, 16)))
    return out


def bmax(seed=0, schedule="random", setup: EmuSetup = DEFAULT_SETUP):
    return [c for dtype in (torch.float32, torch.bfloat16) for dist in ("randn", "special", "equal")
            for c in bmax_case(dtype, dist, mutate=setup.mutate)]


# One small case of each kernel (tests/test_topk.py runs them): the row kernel sampling a 32768-tier row on
# 256 threads and on a cluster of 2, the tile kernel, the warp kernel, the fused slots path, block max.
SMOKE = [
    GpuCase("ties50", 2, 9000, 300, "random", config=TopkConfig(threads=256)),
    GpuCase("pairs", 2, 9000, 300, "random", mode="sorted", config=TopkConfig(split=2)),
    GpuCase("special", 3, 1500, 200, "random", "bf16", "sorted_index", config=TopkConfig("tile", 256)),
    GpuCase("few", 6, 300, 40, "random", config=TopkConfig("warp")),
]


def smoke(seed=0, schedule="random", setup: EmuSetup = DEFAULT_SETUP):
    out = [c for case in SMOKE for c in run_case(case, seed, schedule, setup)]
    out.append(slots_case("randn", 2, 3000, 100, True, TopkConfig("tile", 256, unroll=16), seed, schedule,
                          setup.mutate))
    return out + bmax_case(torch.bfloat16, "special", b=3, n=200, block_sizes=(16,), mutate=setup.mutate)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("sets", nargs="*", default=["small", "mid", "long", "misc", "bmax"])
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--schedule", default="random", choices=SCHEDULES,
                    help="fiber_emu's scheduler: random switches, or warp-serial (exposes races between barriers)")
    ap.add_argument("--mutate", default=None, metavar="OLD=>NEW",
                    help="patch the generated source of every kernel once (a broken kernel must be caught)")
    ap.add_argument("--sms", type=int, default=DEFAULT_SETUP.sms, help="SMs of the device the launch rule plans for")
    ap.add_argument("--stream", action="store_true", help="streaming reads on every row-kernel launch")
    ap.add_argument("--threads", type=int, default=0, help="threads per CTA of every row-kernel launch")
    ap.add_argument("--split", type=int, default=0, help="CTAs per row of every row-kernel launch")
    a = ap.parse_args(argv)
    setup = EmuSetup(sms=a.sms, threads=a.threads, split=a.split, stream=a.stream, mutate=a.mutate)
    bad = 0
    for which in a.sets:
        for seed in [int(s) for s in a.seeds.split(",")]:
            if which in ("misc", "bmax", "smoke"):
                t = time.time()
                res = {"misc": misc, "bmax": bmax, "smoke": smoke}[which](seed, a.schedule, setup)
                fails = [c.message() for c in res if not c.passed]
                bad += len(fails)
                print(f"{which} seed{seed}: {'OK' if not fails else 'FAIL'} {time.time() - t:.1f}s {fails}", flush=True)
                continue
            for case in SETS[which]:
                t = time.time()
                c1, c2 = run_case(case, seed, a.schedule, setup)
                ok = c1.passed and c2.passed
                bad += not ok
                msg = "" if ok else " ".join(c.message() for c in (c1, c2) if not c.passed)
                print(f"{case.id} seed{seed}: {'OK' if ok else 'FAIL'} {time.time() - t:.1f}s {msg}", flush=True)
    print("FAILURES", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
