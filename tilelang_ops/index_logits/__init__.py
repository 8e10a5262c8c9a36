"""Index logits over the FP4 index cache (SPEC 5): the query-side cast and the scoring kernels.

* ``quantize_index_rows(x)``: x [..., 128] bf16 -> (codes [..., 64] uint8, scales [..., 4] uint8).
* ``paged_index_logits(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen, *,
  candidate_blocks=None, candidate_block_size=None, clean=False, out=None, config=None)``: decode.
* ``ragged_index_logits(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, *, clean=False,
  out=None, config=None)``: prefill over gathered keys.

Results are bitwise those of ``reference.index_logits`` (its docstring fixes the FP32 order). Tuning is an
``IndexLogitsConfig`` chosen by ``launch_config`` (a pure function of shapes and the SM count), or passed
as ``config=``. The wrappers read no device value on the host (``TILELANG_OPS_DEBUG=1`` adds the
references' value checks).
"""

import functools
import math
from dataclasses import dataclass, replace

import torch

from metadata.checks import check_cuda, debug_checks_enabled
from metadata.index_logits_args import (
    check_paged_args,
    check_paged_values,
    check_quantize_args,
    check_ragged_args,
    check_ragged_values,
)
from tilelang_ops._library import Plans, call_op, dense, dummy, kernel, register_op

CODE_BYTES, SCALE_BYTES, INDEX_DIM = 64, 4, 128
ROW_CHOICES = (1, 2, 4, 8)  # query rows per CTA the kernels are built for (n rounds up)


@dataclass(frozen=True)
class IndexLogitsConfig:
    """One launch of a scoring kernel. ``rows``: query rows per CTA (paged: n rounded up to 1, 2, 4, 8;
    candidates: 1; ragged: a block of consecutive rows); ``warps``: per CTA (a multiple of ``rows``, whose
    warps split each step's tiles); ``keys_per_step``: keys through shared memory per step (16 per tile;
    ``keys_per_step / 16`` a multiple of ``warps / rows``); ``stages``: cp.async ring depth; ``keys_per_cta``:
    columns one CTA scores (a multiple of ``keys_per_step``; the grid's second dimension splits the width
    by it); ``min_ctas``: CTAs per SM the registers are capped for (0: no cap; ``__launch_bounds__``);
    ``wgmma``: the warpgroup scores each step's 64 keys against pairs of query rows (or the
    one row) with ``wgmma`` (B: the rows' heads in shared memory) instead of per-warp ``mma.sync``."""

    rows: int = 1
    warps: int = 4
    keys_per_step: int = 64
    stages: int = 4
    keys_per_cta: int = 4096
    min_ctas: int = 3
    wgmma: bool = False  # at most 4 rows, 4 warps, 64 keys per step

    def validate(self) -> None:
        ok = (self.rows in ROW_CHOICES and self.warps in (1, 2, 4, 8, 16) and self.warps % self.rows == 0
              and self.keys_per_step % 16 == 0 and (self.keys_per_step // 16) % (self.warps // self.rows) == 0
              and self.stages >= 2 and self.keys_per_cta > 0 and self.keys_per_cta % self.keys_per_step == 0
              and 0 <= self.min_ctas <= 8
              and (not self.wgmma or (self.rows <= 4 and self.warps == 4 and self.keys_per_step == 64)))
        if not ok:
            raise ValueError(f"inconsistent IndexLogitsConfig {self}")


# split the key range into whole waves: at most WAVES x (resident CTAs per SM) CTAs per SM, never a partial
# wave beyond them (with equal klen every CTA has the same work, so a 5th wave of a few CTAs would cost a
# whole wave's time)
WAVES = 4
MAX_KEYS_PER_CTA = 16384


def _split(work_rows: int, width: int, kc: int, sms: int, resident: int = 3) -> int:
    """Columns per CTA: the fewest for which work_rows x splits stays within WAVES x ``resident`` CTAs per
    SM (at least one split per row)."""
    target = WAVES * resident * max(sms, 1)
    splits = max(1, target // max(work_rows, 1))
    kps = -(-max(width, 1) // splits)
    kps = -(-kps // kc) * kc
    return max(kc, min(kps, max(MAX_KEYS_PER_CTA, kc)))


def launch_config(op: str, *, rows: int, width: int, n: int = 1, sms: int = 132,
                  wgmma: bool = False) -> IndexLogitsConfig:
    """The launch rule. ``op``: "paged" (rows = requests b, n query rows each), "cand" (rows = b * n query
    rows, one per CTA) or "ragged" (rows = T query rows); ``width``: max_klen / max_width; ``sms``: the
    device's SM count. ``wgmma``: the scores on wgmma (at most 4 query rows per CTA): one row at 128
    registers (4 CTAs per SM), more at 168 (3 per SM)."""
    if op not in ("paged", "cand", "ragged"):
        raise ValueError(f"launch_config: op must be 'paged', 'cand' or 'ragged', got {op!r}")
    r = next(c for c in ROW_CHOICES if c >= n) if op == "paged" else 1 if op == "cand" else 4
    if wgmma:
        if r > 4:
            raise ValueError(f"launch_config: wgmma takes at most 4 query rows per CTA, got n={n}")
        cfg = IndexLogitsConfig(rows=r, warps=4, keys_per_step=64, stages=4, min_ctas=4 if r == 1 else 3,
                                wgmma=True)
    elif r == 8:  # 8 rows take a warp each (one CTA per SM, 255 registers)
        cfg = IndexLogitsConfig(rows=r, warps=8, keys_per_step=64, stages=4, min_ctas=0)
    else:  # 4 warps at 168 registers (3 CTAs per SM)
        cfg = IndexLogitsConfig(rows=r, warps=4, keys_per_step=64, stages=4, min_ctas=3)
    work_rows = -(-rows // cfg.rows) if op == "ragged" else rows
    return replace(cfg, keys_per_cta=_split(work_rows, width, cfg.keys_per_step, sms, max(cfg.min_ctas, 3)))


_PROPS: dict = {}


def _sm_count(device) -> int:
    """SMs of a CUDA device (a CPU tensor's wrapper call fails its device check after the launch plan)."""
    if device.type != "cuda":
        return 132
    if device not in _PROPS:
        _PROPS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _PROPS[device]


def kernel_static(mode: str, heads: int, cfg: IndexLogitsConfig, vec16: bool) -> tuple:
    """The scoring kernel's static arguments (``get_kernel``'s, also the disk-cache key)."""
    if cfg.wgmma:
        mode += "_wg"
    return (mode, heads, cfg.rows, cfg.warps, cfg.keys_per_step, cfg.stages, bool(vec16), cfg.min_ctas)


@functools.lru_cache(maxsize=None)
def get_kernel(mode: str, heads: int, rows: int, warps: int, kc: int, stages: int, vec16: bool,
               min_ctas: int = 0):
    """The compiled scoring kernel (TileLang JIT; cached per static key)."""
    from tilelang_ops.index_logits.scores import scores_kernel

    return scores_kernel(mode, heads, rows, warps, kc, stages, vec16, min_ctas)


def scores_factory():
    """The scoring kernels' ``@tilelang.jit`` factory (imported on first use: the package imports
    without TileLang's compile stack)."""
    from tilelang_ops.index_logits.scores import scores_kernel

    return scores_kernel


def quantize_factory():
    from tilelang_ops.index_logits.quantize import quantize_kernel

    return quantize_kernel


@functools.lru_cache(maxsize=None)
def get_quantize_kernel(threads: int = 128, lead_rank: int = 1):
    from tilelang_ops.index_logits.quantize import quantize_kernel

    return quantize_kernel(threads, lead_rank)


def _aligned(*tensors) -> bool:
    return all(t.data_ptr() % 16 == 0 for t in tensors)


# ----------------------------------------------------------------------------------------------
# Launch plans: the static key, the kernel's arguments and its grid, shared with the CPU emulator.
# ----------------------------------------------------------------------------------------------

def _paged_static(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen, candidate_blocks,
                  candidate_block_size, clean, out, config=None, sms=None):
    """(geometry, config, kernel static key) of a ``paged_index_logits`` call after its host checks."""
    geom = check_paged_args(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen,
                            candidate_blocks=candidate_blocks, candidate_block_size=candidate_block_size,
                            clean=clean, out=out)
    cand = candidate_blocks is not None
    mode = "cand" if cand else "paged"
    b, n = geom.b, geom.n
    if config is None:
        config = launch_config(mode, rows=b if not cand else b * n, width=max_klen, n=n,
                               sms=sms if sms is not None else _sm_count(q_codes.device))
    config.validate()
    if not cand and config.rows < n:
        raise ValueError(f"config.rows={config.rows} is below the {n} query rows per request")
    if cand and config.rows != 1:
        raise ValueError(f"candidate restriction scores one row per CTA: config.rows must be 1, got "
                         f"{config.rows}")
    vec16 = geom.rows_per_block % 4 == 0 and _aligned(index_cache)
    return geom, config, kernel_static(mode, geom.heads, config, vec16)


def _paged_logits(geom, max_klen, device) -> torch.Tensor:
    """A paged call's new output: [b, n, max_klen] fp32."""
    return torch.empty((geom.b, geom.n, max_klen), dtype=torch.float32, device=device)


def _ragged_logits(geom, max_width, device) -> torch.Tensor:
    """A ragged call's new output: [T, max_width] fp32."""
    return torch.empty((geom.t, max_width), dtype=torch.float32, device=device)


def _no_candidates(geom, q_codes) -> torch.Tensor:
    """The candidate-blocks argument of a call without candidates (the kernel reads none of it)."""
    return dummy(q_codes.device, torch.int32, (geom.b, geom.n, 1), fill=-1)


def _paged_args(geom, config, q_codes, q_scales, weights, index_cache, block_tables, klen, candidate_blocks,
                candidate_block_size, clean, logits, no_candidates, contiguous):
    """(kernel arguments, grid) of a checked ``paged_index_logits`` call; ``no_candidates``: the
    placeholder passed for absent candidates (``_no_candidates``), ``contiguous``: whether no input needs
    a copy (a plan holds both: they follow from its key)."""
    cand = candidate_blocks is not None
    if not contiguous:
        q_codes, q_scales, weights, block_tables, klen = (
            t.contiguous() for t in (q_codes, q_scales, weights, block_tables, klen))
        if cand:
            candidate_blocks = candidate_blocks.contiguous()
    # the kernel takes every tensor in the caller's own shape (no views to make)
    args = (q_codes, q_scales, weights, index_cache, block_tables, klen,
            candidate_blocks if cand else no_candidates, logits, geom.n, geom.rows_per_block, geom.num_blocks,
            candidate_block_size or 1, config.keys_per_cta, int(clean))
    grid = (geom.b if not cand else geom.b * geom.n, -(-geom.max_klen // config.keys_per_cta))
    return args, grid


def paged_plan(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen, *,
               candidate_blocks=None, candidate_block_size=None, clean=False, out=None, config=None,
               sms=None):
    """(static key, kernel arguments, grid, logits, geometry) of a ``paged_index_logits`` call; the
    arguments are checked (host-side only)."""
    geom, config, static = _paged_static(q_codes, q_scales, weights, index_cache, block_tables, klen,
                                         max_klen, candidate_blocks, candidate_block_size, clean, out,
                                         config, sms)
    logits = out if out is not None else _paged_logits(geom, max_klen, q_codes.device)
    no_candidates = _no_candidates(geom, q_codes) if candidate_blocks is None else None
    args, grid = _paged_args(geom, config, q_codes, q_scales, weights, index_cache, block_tables, klen,
                             candidate_blocks, candidate_block_size, clean, logits, no_candidates,
                             contiguous=False)
    return static, args, grid, logits, geom


def _ragged_static(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, clean, out, config=None,
                   sms=None):
    """(geometry, config, kernel static key) of a ``ragged_index_logits`` call after its host checks."""
    geom = check_ragged_args(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, clean=clean,
                             out=out)
    if config is None:
        config = launch_config("ragged", rows=geom.t, width=max_width,
                               sms=sms if sms is not None else _sm_count(q_codes.device))
    config.validate()
    aligned = _aligned(k_codes) if k_codes.is_contiguous() else True  # a copy is a fresh allocation
    return geom, config, kernel_static("ragged", geom.heads, config, aligned)


def _ragged_args(geom, config, q_codes, q_scales, weights, k_codes, k_scales, ks, ke, clean, logits,
                 contiguous):
    """(kernel arguments, grid) of a checked ``ragged_index_logits`` call; ``contiguous``: a plan's
    knowledge that no input needs a copy."""
    if not contiguous:
        q_codes, q_scales, weights, k_codes, k_scales, ks, ke = (
            t.contiguous() for t in (q_codes, q_scales, weights, k_codes, k_scales, ks, ke))
    args = (q_codes, q_scales, weights, k_codes, k_scales, ks, ke, logits, geom.max_width,
            config.keys_per_cta, int(clean))
    grid = (-(-geom.t // config.rows), -(-geom.max_width // config.keys_per_cta))
    return args, grid


def ragged_plan(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, *, clean=False, out=None,
                config=None, sms=None):
    """(static key, kernel arguments, grid, logits, geometry) of a ``ragged_index_logits`` call."""
    geom, config, static = _ragged_static(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width,
                                          clean, out, config, sms)
    logits = out if out is not None else _ragged_logits(geom, max_width, q_codes.device)
    args, grid = _ragged_args(geom, config, q_codes, q_scales, weights, k_codes, k_scales, ks, ke, clean,
                              logits, contiguous=False)
    return static, args, grid, logits, geom


# ----------------------------------------------------------------------------------------------
# Registered ops (SPEC 7) and the public wrappers.
# ----------------------------------------------------------------------------------------------

Tensor = torch.Tensor


def _quantize_check(x):
    lead = check_quantize_args(x)
    check_cuda(x=x)
    return lead


def _quantize_plan(x):
    """(leading shape, compiled kernel or None when there are no rows) of a call's static key."""
    lead = _quantize_check(x)
    # the kernel takes x, codes and scales in the caller's shape ([*lead, 128] ...): no views to make
    return lead, (kernel(quantize_factory(), 128, max(1, len(lead))) if math.prod(lead) else None)


_QUANTIZE_PLANS = Plans(_quantize_plan)


def _quantize_impl(x: Tensor) -> tuple[Tensor, Tensor]:
    lead, fn = _QUANTIZE_PLANS((x,))
    codes = torch.empty((*lead, CODE_BYTES), dtype=torch.uint8, device=x.device)
    scales = torch.empty((*lead, SCALE_BYTES), dtype=torch.uint8, device=x.device)
    if fn is not None:
        if lead:
            fn(x.contiguous(), codes, scales)
        else:  # one row, x [128]: the kernel takes at least one leading dimension
            fn(x.reshape(1, INDEX_DIM), codes.view(1, CODE_BYTES), scales.view(1, SCALE_BYTES))
    return codes, scales


def _quantize_fake(x):
    lead = _quantize_check(x)
    return (x.new_empty(*lead, CODE_BYTES, dtype=torch.uint8),
            x.new_empty(*lead, SCALE_BYTES, dtype=torch.uint8))


def _paged_check(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen, candidate_blocks,
                 candidate_block_size, clean, out=None, config=None):
    """Every host check of a paged call; returns (geometry, config, static key); ``config``: the caller's
    tuning (None: the launch rule's)."""
    geom, config, static = _paged_static(q_codes, q_scales, weights, index_cache, block_tables, klen,
                                         max_klen, candidate_blocks, candidate_block_size, clean, out, config)
    check_cuda(q_codes=q_codes, index_cache=index_cache, block_tables=block_tables, klen=klen,
               **({} if out is None else {"out": out}))
    return geom, config, static


def _paged_plan(*args, config=None):
    """(geometry, config, compiled kernel, placeholder for absent candidates or None, whether the read
    tensors are contiguous) of a call's static key."""
    geom, config, static = _paged_check(*args, config=config)
    q_codes, cand = args[0], args[7]
    return (geom, config, kernel(scores_factory(), *static),
            _no_candidates(geom, q_codes) if cand is None else None, dense(*args[:6], cand))


_PAGED_PLANS = Plans(_paged_plan)
_PAGED_OUT_PLANS = Plans(_paged_plan)


def _paged_launch(logits, plan_, q_codes, q_scales, weights, index_cache, block_tables, klen,
                  candidate_blocks, candidate_block_size, clean):
    geom, config, fn, no_candidates, contiguous = plan_
    if debug_checks_enabled():
        check_paged_values(block_tables, klen, geom, candidate_blocks)
    if geom.b and geom.max_klen:
        args, _ = _paged_args(geom, config, q_codes, q_scales, weights, index_cache, block_tables, klen,
                              candidate_blocks, candidate_block_size, clean, logits, no_candidates,
                              contiguous)
        fn(*args)


def _paged_impl(q_codes: Tensor, q_scales: Tensor, weights: Tensor, index_cache: Tensor,
                block_tables: Tensor, klen: Tensor, max_klen: int, candidate_blocks: Tensor | None = None,
                candidate_block_size: int | None = None, clean: bool = False) -> Tensor:
    args = (q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen, candidate_blocks,
            candidate_block_size, clean)
    plan_ = _PAGED_PLANS(args)
    logits = _paged_logits(plan_[0], max_klen, q_codes.device)
    _paged_launch(logits, plan_, *args[:6], *args[7:])
    return logits


def _paged_out_impl(q_codes: Tensor, q_scales: Tensor, weights: Tensor, index_cache: Tensor,
                    block_tables: Tensor, klen: Tensor, max_klen: int, out: Tensor,
                    candidate_blocks: Tensor | None = None, candidate_block_size: int | None = None,
                    clean: bool = False) -> None:
    args = (q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen, candidate_blocks,
            candidate_block_size, clean, out)
    _paged_launch(out, _PAGED_OUT_PLANS(args), *args[:6], *args[7:10])


def _paged_out_check(*args):
    """``_paged_check`` of the ``_out`` op's argument order (``out`` after ``max_klen``)."""
    return _paged_check(*args[:7], *args[8:], args[7])


def _paged_fake(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen, candidate_blocks=None,
                candidate_block_size=None, clean=False, out=None):
    geom = check_paged_args(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen,
                            candidate_blocks=candidate_blocks, candidate_block_size=candidate_block_size,
                            clean=clean, out=out)
    check_cuda(q_codes=q_codes, index_cache=index_cache, block_tables=block_tables, klen=klen,
               **({} if out is None else {"out": out}))
    return q_codes.new_empty((geom.b, geom.n, max_klen), dtype=torch.float32)


def _paged_out_fake(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen, out,
                    candidate_blocks=None, candidate_block_size=None, clean=False):
    _paged_fake(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen, candidate_blocks,
                candidate_block_size, clean, out)


def _ragged_check(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, clean, out=None,
                  config=None):
    """Every host check of a ragged call; returns (geometry, config, static key); ``config``: the caller's
    tuning (None: the launch rule's)."""
    geom, config, static = _ragged_static(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width,
                                          clean, out, config)
    check_cuda(q_codes=q_codes, k_codes=k_codes, ks=ks, ke=ke, **({} if out is None else {"out": out}))
    return geom, config, static


def _ragged_plan(*args, config=None):
    """(geometry, config, compiled kernel, whether the read tensors are contiguous) of a call's static key."""
    geom, config, static = _ragged_check(*args, config=config)
    return geom, config, kernel(scores_factory(), *static), dense(*args[:7])


_RAGGED_PLANS = Plans(_ragged_plan)
_RAGGED_OUT_PLANS = Plans(_ragged_plan)


def _ragged_launch(logits, plan_, q_codes, q_scales, weights, k_codes, k_scales, ks, ke, clean):
    geom, config, fn, contiguous = plan_
    if debug_checks_enabled():
        check_ragged_values(ks, ke, geom)
    if geom.t == 0 or geom.max_width == 0 or geom.num_keys == 0 and not clean:
        return
    if geom.num_keys == 0:  # nothing to score; the kernels need a key tensor to point at
        logits.fill_(float("-inf"))
        return
    args, _ = _ragged_args(geom, config, q_codes, q_scales, weights, k_codes, k_scales, ks, ke, clean, logits,
                           contiguous)
    fn(*args)


def _ragged_impl(q_codes: Tensor, q_scales: Tensor, weights: Tensor, k_codes: Tensor,
                 k_scales: Tensor, ks: Tensor, ke: Tensor, max_width: int,
                 clean: bool = False) -> Tensor:
    args = (q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, clean)
    plan_ = _RAGGED_PLANS(args)
    logits = _ragged_logits(plan_[0], max_width, q_codes.device)
    _ragged_launch(logits, plan_, *args[:7], clean)
    return logits


def _ragged_out_impl(q_codes: Tensor, q_scales: Tensor, weights: Tensor, k_codes: Tensor, k_scales: Tensor,
                     ks: Tensor, ke: Tensor, max_width: int, out: Tensor, clean: bool = False) -> None:
    args = (q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, clean, out)
    _ragged_launch(out, _RAGGED_OUT_PLANS(args), *args[:7], clean)


def _ragged_out_check(*args):
    """``_ragged_check`` of the ``_out`` op's argument order (``out`` after ``max_width``)."""
    return _ragged_check(*args[:8], *args[9:], args[8])


def _ragged_fake(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, clean=False, out=None):
    geom = check_ragged_args(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, clean=clean,
                             out=out)
    check_cuda(q_codes=q_codes, k_codes=k_codes, ks=ks, ke=ke, **({} if out is None else {"out": out}))
    return q_codes.new_empty((geom.t, max_width), dtype=torch.float32)


def _ragged_out_fake(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, out, clean=False):
    _ragged_fake(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, clean, out)


_QUANTIZE_OP = register_op("quantize_index_rows", _quantize_impl, _quantize_fake)
_PAGED_OP = register_op("paged_index_logits", _paged_impl, _paged_fake)
_PAGED_OUT_OP = register_op("paged_index_logits_out", _paged_out_impl, _paged_out_fake, mutates_args=("out",))
_RAGGED_OP = register_op("ragged_index_logits", _ragged_impl, _ragged_fake)
_RAGGED_OUT_OP = register_op("ragged_index_logits_out", _ragged_out_impl, _ragged_out_fake,
                             mutates_args=("out",))


def quantize_index_rows(x):
    """x [..., 128] bf16 -> (codes [..., 64] uint8, scales [..., 4] uint8): the index format's e2m1 /
    UE8M0 / group-32 cast (SPEC 2), bitwise ``reference.index_logits.quantize_index_rows_ref``
    (``torch.ops.tilelang_ops.quantize_index_rows``)."""
    return call_op(_QUANTIZE_OP, _quantize_check, x)


def paged_index_logits(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen, *,
                       candidate_blocks=None, candidate_block_size=None, clean=False, out=None, config=None):
    """logits[r, t, j] = sum_h w[r, t, h] relu(q[r, t, h] . k[row j of request r]) for j < klen[r, t].

    q_codes [b, n, H, 64] uint8, q_scales [b, n, H, 4] uint8, weights [b, n, H] fp32 (H 32 or 64, n 1-8),
    index_cache [num_blocks, Bc * 68] uint8, block_tables [b, max_blocks] int32, klen [b, n] int32,
    max_klen host int; candidate_blocks [b, n, c] int32 and candidate_block_size 8 / 16: column i scores
    logical row blocks[i // bs] * bs + i % bs (-inf for a block of -1). Columns >= klen are left unwritten
    unless clean (-inf). Returns logits [b, n, max_klen] fp32 (``out`` when given).
    ``torch.ops.tilelang_ops.paged_index_logits`` (``paged_index_logits_out`` writes ``out``); a call with
    ``config`` launches directly, outside the registered ops (tests, benchmarks, tools).
    """
    args = (q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen, candidate_blocks,
            candidate_block_size, clean)
    if config is not None:
        plan_ = _paged_plan(*args, out, config=config)
        logits = out if out is not None else _paged_logits(plan_[0], max_klen, q_codes.device)
        _paged_launch(logits, plan_, *args[:6], *args[7:])
        return logits
    if out is None:
        return call_op(_PAGED_OP, _paged_check, *args)
    call_op(_PAGED_OUT_OP, _paged_out_check, *args[:7], out, *args[7:])
    return out


def ragged_index_logits(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, *, clean=False,
                        out=None, config=None):
    """logits[t, i] = sum_h w[t, h] relu(q[t, h] . k[ks[t] + i]) for i < ke[t] - ks[t].

    q_codes [T, H, 64] uint8, q_scales [T, H, 4] uint8, weights [T, H] fp32, k_codes [N, 64] uint8,
    k_scales [N, 4] uint8, ks / ke [T] int32, max_width host int. Columns >= ke - ks are left unwritten
    unless clean (-inf). Returns logits [T, max_width] fp32; top-k takes end = ke - ks and
    output_idx_offset = ks. ``torch.ops.tilelang_ops.ragged_index_logits`` (``ragged_index_logits_out``
    writes ``out``); a call with ``config`` launches directly, outside the registered ops.
    """
    args = (q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, clean)
    if config is not None:
        plan_ = _ragged_plan(*args, out, config=config)
        logits = out if out is not None else _ragged_logits(plan_[0], max_width, q_codes.device)
        _ragged_launch(logits, plan_, *args[:7], clean)
        return logits
    if out is None:
        return call_op(_RAGGED_OP, _ragged_check, *args)
    call_op(_RAGGED_OUT_OP, _ragged_out_check, *args[:8], out, clean)
    return out


def build_configs() -> list[tuple]:
    """(name, factory, static arguments) of the kernel configurations the sm_90a build check compiles:
    every mode the launch rule picks, both head counts, the 4-byte copy path."""
    from tilelang_ops.index_logits.quantize import quantize_kernel
    from tilelang_ops.index_logits.scores import scores_kernel

    configs = [("quantize", quantize_kernel, (128,))]
    for name, mode, heads, n, vec16 in (("paged H64 n1", "paged", 64, 1, True),
                                        ("paged H64 n4", "paged", 64, 4, True),
                                        ("paged H32 n8", "paged", 32, 8, True),
                                        ("paged H64 n2 vec4", "paged", 64, 2, False),
                                        ("cand H64", "cand", 64, 1, True),
                                        ("ragged H64", "ragged", 64, 1, True)):
        cfg = launch_config(mode, rows=64, width=65536, n=n)
        configs.append((name, scores_kernel, kernel_static(mode, heads, cfg, vec16)))
    for name, mode, heads, n in (("ragged H64 wgmma", "ragged", 64, 1),
                                 ("ragged H32 wgmma", "ragged", 32, 1),
                                 ("paged H64 n1 wgmma", "paged", 64, 1),
                                 ("paged H64 n4 wgmma", "paged", 64, 4),
                                 ("cand H64 wgmma", "cand", 64, 1)):
        cfg = launch_config(mode, rows=64, width=65536, n=n, wgmma=True)
        configs.append((name, scores_kernel, kernel_static(mode, heads, cfg, True)))
    return configs
