"""kv_store cases for `python -m tilelang_ops diff` (see tilelang_ops/diff.py).

Comparison rules (SPEC 4): kernel vs loop reference **bitwise**: the whole cache (payload, scales, and
the sentinel bytes outside the stored rows) and out_norm. Both run the same FP32 operations in the same
order (the sum of squares in ``reference.kv_store.rms_sum_of_squares``' fixed order, IEEE sqrt and
division, RoPE / scale arithmetic without FMA). One exception: where the kernel sums the Hadamard on the
tensor cores (``tilelang_ops.kv_store.uses_hadamard_mma``: FP4 index rows, by default), another FP32
order, the cache is compared with ``compare_store``, the tolerance issue #4 grants the Hadamard sums
(out_norm, before the Hadamard, stays bitwise). Loop reference vs twin (CPU self-check): bitwise.

``compare_store`` / ``compare_norm`` (one step at most, in at most 0.1% of codes / scales / elements;
unwritten bytes bitwise) are also the tolerant rules of ``compress_store``'s tests, whose gated mean
(expf) may move a rounding before the store.
"""

from __future__ import annotations

import torch

from metadata.cache_format import (
    BF16_KV_FORMAT,
    FP4_INDEX_KV_FORMAT,
    FP4_MAIN_KV_FORMAT,
    FP8_MAIN_KV_FORMAT,
    KVCacheFormat,
)
from metadata.checks import check_choice
from reference.kv_store import norm_rope_hadamard_cast_store_ref, norm_rope_hadamard_cast_store_torch
from tilelang_ops.testing import Comparison, bf16_ulp_distance, compare_bitwise

OP = "kv_store"
SENTINEL = 0xA5
MAX_FRAC = 1e-3  # share of codes / scales / out_norm elements allowed one step off

_FMT = {f.name: f for f in (FP8_MAIN_KV_FORMAT, FP4_MAIN_KV_FORMAT, FP4_INDEX_KV_FORMAT, BF16_KV_FORMAT)}
# id -> (format, rows, interleaved, hadamard, rows_per_block, exact)
_CASES = {
    "fp8_main_rows300": ("fp8_main", 300, True, False, 64, False),
    "fp8_main_half_rows37": ("fp8_main", 37, False, False, 64, False),
    "fp4_main_rows300": ("fp4_main", 300, True, False, 64, False),
    "fp4_index_hadamard_rows300": ("fp4_index", 300, True, True, 64, False),
    "fp4_index_half_rpb5": ("fp4_index", 41, False, False, 5, False),
    "bf16_rows100": ("bf16", 100, True, False, 64, False),
    "fp8_main_exact": ("fp8_main", 64, True, False, 64, True),
    "fp4_index_hadamard_exact": ("fp4_index", 64, False, True, 64, True),
}
CASES = list(_CASES)


def make_inputs(case_id: str, device):
    check_choice("case_id", case_id, _CASES)
    name, rows, interleaved, hadamard, rpb, exact = _CASES[case_id]
    fmt = _FMT[name]
    g = torch.Generator().manual_seed(sum(map(ord, case_id)))
    if exact:
        kv = torch.where(torch.rand(rows, fmt.dim, generator=g) < 0.5, -1.0, 1.0).bfloat16()
        w = (torch.randn(fmt.dim, generator=g) * 4).bfloat16()
        pos = torch.zeros(rows, dtype=torch.int64)
        eps = 0.0
    else:
        kv = (torch.randn(rows, fmt.dim, generator=g) * 2).bfloat16()
        w = torch.rand(fmt.dim, generator=g) + 0.5
        pos = torch.randint(0, 256, (rows,), generator=g)
        eps = 1e-6
    ang = torch.rand(256, 32, generator=g) * 6.3
    cos, sin = torch.cos(ang), torch.sin(ang)
    cos[0], sin[0] = 1.0, 0.0
    num_blocks = (3 * rows) // rpb + 1
    slots = torch.randperm(num_blocks * rpb, generator=g)[:rows]
    slots[::9] = -1
    cache = torch.full((num_blocks, fmt.block_bytes(rpb)), SENTINEL, dtype=torch.uint8)
    out_norm = torch.zeros(rows, fmt.dim, dtype=torch.bfloat16)
    to = lambda t: t.to(device)  # noqa: E731
    args = (to(kv), to(w), eps, to(cos), to(sin), to(pos), to(slots), to(cache), fmt)
    return args, dict(interleaved=interleaved, hadamard=hadamard, out_norm=to(out_norm)), exact


def _ordered_code(codes: torch.Tensor, kind: str) -> torch.Tensor:
    """Sign-magnitude codes -> integers in value order (adjacent values differ by one)."""
    c = codes.to(torch.int32)
    sign, mag = (c >> 7, c & 0x7F) if kind == "e4m3" else (c >> 3, c & 0x7)
    return torch.where(sign.bool(), -mag, mag)


def _step_comparison(output: str, dist: torch.Tensor, max_frac: float) -> Comparison:
    """Pass iff every entry is within one step and at most ``max_frac`` of them (at least 1) differ."""
    n_off = int((dist > 0).sum())
    budget = max(1, int(max_frac * dist.numel()))
    far = dist > 1
    bad = int(far.sum()) + max(0, n_off - budget)
    where = (far if far.any() else dist > 0).nonzero()[:5].tolist()
    first = [f"{tuple(c)}: {int(dist[tuple(c)])} steps" for c in where]
    return Comparison(output, f"<=1 step, <={budget} differ", dist.numel(), bad,
                      float(dist.max()) if dist.numel() else 0.0, first if bad else [])


def compare_store(got: torch.Tensor, want: torch.Tensor, fmt: KVCacheFormat, slots: torch.Tensor,
                  max_frac: float = MAX_FRAC) -> list[Comparison]:
    """Kernel cache vs reference cache (rules in the module docstring). Runs on got's device."""
    dev = got.device
    want = want.to(dev)
    rpb = fmt.rows_per_block(got.shape[1])
    stored = slots.to(dev).long()
    stored = stored[stored >= 0]
    blk, row = stored // rpb, stored % rpb
    if fmt.block_sections:
        d0, s0 = row * fmt.data_bytes, rpb * fmt.data_bytes + row * fmt.scale_bytes
    else:
        d0, s0 = row * fmt.row_bytes, row * fmt.row_bytes + fmt.data_bytes
    width = got.shape[1]
    idx = lambda off, n: (blk * width + off)[:, None] + torch.arange(n, device=dev)  # noqa: E731
    mask = torch.zeros(got.numel(), dtype=torch.bool, device=dev)
    mask[idx(d0, fmt.data_bytes).reshape(-1)] = True
    mask[idx(s0, fmt.scale_bytes).reshape(-1)] = True
    mask = mask.view_as(got)
    out = [compare_bitwise("unwritten bytes", torch.where(mask, 0, got), torch.where(mask, 0, want))]
    if stored.numel() == 0:
        return out
    take = lambda c, off, n: c.view(-1)[idx(off, n)]  # noqa: E731
    gd, wd = take(got, d0, fmt.data_bytes), take(want, d0, fmt.data_bytes)
    if fmt.data_dtype == "bf16":
        dist = bf16_ulp_distance(gd.view(torch.bfloat16), wd.view(torch.bfloat16))
        return out + [_step_comparison("rows (bf16 ulp)", dist, max_frac)]
    gs, ws = take(got, s0, fmt.scale_bytes), take(want, s0, fmt.scale_bytes)
    sdist = (_ordered_code(gs, "e4m3") - _ordered_code(ws, "e4m3")).abs() if fmt.scale_dtype == "e4m3" \
        else (gs.to(torch.int32) - ws.to(torch.int32)).abs()
    if fmt.data_dtype == "e2m1":
        gd = torch.stack((gd & 0xF, gd >> 4), -1).reshape(len(stored), fmt.dim)
        wd = torch.stack((wd & 0xF, wd >> 4), -1).reshape(len(stored), fmt.dim)
    cd = (_ordered_code(gd, fmt.data_dtype) - _ordered_code(wd, fmt.data_dtype)).abs()
    # a group whose scale moved re-scales all its codes: judged by its scale only
    cd = torch.where((sdist == 0).repeat_interleave(fmt.group_size, dim=1), cd, torch.zeros_like(cd))
    return out + [_step_comparison("scales", sdist, max_frac), _step_comparison("codes", cd, max_frac)]


def compare_norm(got: torch.Tensor, want: torch.Tensor, max_frac: float = MAX_FRAC) -> Comparison:
    return _step_comparison("out_norm (bf16 ulp)", bf16_ulp_distance(got.cpu(), want.cpu()), max_frac)


def self_check(case_id: str):
    """Loop reference vs vectorized twin on CPU: cache bytes and out_norm bitwise."""
    (kv, w, eps, cos, sin, pos, slots, cache, fmt), kw, _ = make_inputs(case_id, "cpu")
    c2, n2 = cache.clone(), kw["out_norm"].clone()
    norm_rope_hadamard_cast_store_ref(kv, w, eps, cos, sin, pos, slots, cache, fmt, **kw)
    norm_rope_hadamard_cast_store_torch(kv, w, eps, cos, sin, pos, slots, c2, fmt, **{**kw, "out_norm": n2})
    return [compare_bitwise("kv_cache twin", c2, cache), compare_bitwise("out_norm twin", n2, kw["out_norm"])]


def run_case(case_id: str, device):
    """Kernel vs loop reference on CUDA."""
    from tilelang_ops.kv_store import launch_config, norm_rope_hadamard_cast_store, uses_hadamard_mma

    (kv, w, eps, cos, sin, pos, slots, cache, fmt), kw, _exact = make_inputs(case_id, device)
    want, want_norm = cache.clone(), kw["out_norm"].clone()
    norm_rope_hadamard_cast_store_ref(kv, w, eps, cos, sin, pos, slots, want, fmt,
                                      **{**kw, "out_norm": want_norm})
    config = launch_config(fmt, kv.shape[0], 64, kw["interleaved"])  # (rope_dim: the default)
    norm_rope_hadamard_cast_store(kv, w, eps, cos, sin, pos, slots, cache, fmt, **kw, config=config)
    torch.cuda.synchronize()
    # bitwise (module docstring; `exact` cases additionally need no rounding at all), except the
    # tensor-core Hadamard's order
    norm = compare_bitwise("out_norm", kw["out_norm"], want_norm)
    if uses_hadamard_mma(fmt, kw["hadamard"], config):
        return compare_store(cache, want, fmt, slots) + [norm]
    return [compare_bitwise("kv_cache", cache, want), norm]


def build_check():
    """The launch rule's kernel of a large launch for every format and RoPE layout."""
    from tilelang_ops.build import compile_for_sm90
    from tilelang_ops.kv_store import kv_store_kernel, launch_config, static_args

    built = []
    for name, hadamard, rpb in (("fp8_main", False, 1), ("fp4_main", False, 1), ("fp4_index", True, 64),
                                ("bf16", False, 1)):
        fmt = _FMT[name]
        for interleaved in (True, False):
            config = launch_config(fmt, 1 << 20, 64, interleaved)
            static = static_args(fmt, 64, interleaved, hadamard, True, rpb, "bfloat16", "int64", "int64",
                                 config)
            compile_for_sm90(kv_store_kernel, *static)
            built.append(f"{name}_{'il' if interleaved else 'half'}")
    return built
