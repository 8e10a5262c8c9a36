"""TileLang kernel: fused RMSNorm -> RoPE -> [Hadamard] -> cast -> paged-cache store (SPEC 1.5, 2).

``norm_rope_hadamard_cast_store`` validates, picks a ``KVStoreConfig`` (``launch_config``, or the caller's
``config=``) and launches ``kernel.kv_store_kernel``. The per-row pipeline is ``row_store.make_row_store``,
a ``@T.macro`` that compress_store's kernels call too. Layout, arithmetic and options: those modules'
docstrings; the launch rule's reasons and measured bounds: docs/design.md, "## kv_store".
"""

import torch

from metadata.checks import check_aligned, check_cuda, debug_checks_enabled
from metadata.kv_store_args import check_out_norm_apart, check_store_args, check_store_values
from tilelang_ops._library import Plans, call_op, dense, dummy, register_op
from tilelang_ops._library import kernel as compiled  # (the package's own `kernel` is its kernel module)
from tilelang_ops.kv_store.config import (
    DEFAULT_CONFIGS,
    FORMATS,
    MULTI_ROW_MIN_ROWS,
    OPTION_NAMES,
    THREADS,
    VEC,
    KVStoreConfig,
    check_config,
    chunks_fit,
    hadamard_mma_fits,
    kernel_supports,
    launch_config,
    option_applies,
    rows_per_cta,
    uses_hadamard_mma,
)
from tilelang_ops.kv_store.kernel import kv_store_kernel
from tilelang_ops.kv_store.preludes import (
    AMAX_PRELUDE,
    BF16X2_PRELUDE,
    HMMA_PRELUDE,
    INV_E4M3_PRELUDE,
    PRED_STORE_PRELUDE,
    inv_e4m3_prelude,
    inv_e4m3_table,
)
from tilelang_ops.kv_store.row_store import _f32, make_row_store

__all__ = [
    "AMAX_PRELUDE", "BF16X2_PRELUDE", "DEFAULT_CONFIGS", "FORMATS", "HMMA_PRELUDE", "INV_E4M3_PRELUDE",
    "MULTI_ROW_MIN_ROWS", "OPTION_NAMES", "PRED_STORE_PRELUDE", "THREADS", "VEC", "KVStoreConfig",
    "cache_format", "call_format_op", "check_config", "chunks_fit", "hadamard_mma_fits",
    "inv_e4m3_prelude", "inv_e4m3_table", "kernel_supports", "kv_store_kernel", "launch_config",
    "make_row_store", "norm_rope_hadamard_cast_store", "option_applies", "rows_per_cta", "static_args",
    "uses_hadamard_mma", "_f32",
]

_TORCH_TO_TL = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.int32: "int32",
                torch.int64: "int64"}
Tensor = torch.Tensor


def static_args(fmt, rope_dim: int, interleaved: bool, hadamard: bool, has_out_norm: bool,
                rows_per_block: int, weight_dtype: str, pos_dtype: str, slot_dtype: str,
                config: KVStoreConfig) -> tuple:
    """``kv_store_kernel``'s static arguments for a call (``rows_per_block`` matters only to block-section
    formats: the others pass 1)."""
    return (fmt.name, rope_dim, interleaved, hadamard, has_out_norm,
            rows_per_block if fmt.block_sections else 1, weight_dtype, pos_dtype, slot_dtype, config)


def cache_format(name: str):
    """The cache format of the name a registered op takes (``fmt.name`` of one of the four formats)."""
    if name not in FORMATS:
        raise ValueError(f"fmt={name!r} is not one of the cache formats {list(FORMATS)}")
    return FORMATS[name]


def call_format_op(op, check, args: tuple, at: int):
    """``op`` on ``args`` with the cache format at position ``at`` passed by its name; where the format is
    not one of the four, or the dispatcher rejects an argument, ``check`` (the Python API's host checks)
    raises on the caller's own arguments."""
    fmt = args[at]
    name = getattr(fmt, "name", None)
    known = FORMATS.get(name) if isinstance(name, str) else None
    if not (known is fmt or (known is not None and known == fmt)):  # (`is` first: the dataclass == is slow)
        check(*args)  # names what is wrong with fmt
        raise ValueError(f"fmt={fmt!r} is not one of the cache formats {list(FORMATS)}")
    return call_op(op, lambda *a: check(*a[:at], fmt, *a[at + 1:]), *args[:at], name, *args[at + 1:])


def _store_check(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt, rope_dim,
                 interleaved, hadamard, out_norm, config=None):
    """Every host check of a call (``config``: the caller's tuning, if any; none reads a device value, and
    the fake runs them on fake tensors); returns the geometry."""
    geom = check_store_args(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
                            rope_dim=rope_dim, interleaved=interleaved, hadamard=hadamard, out_norm=out_norm)
    why = kernel_supports(fmt, rope_dim, interleaved)
    if why is not None or FORMATS.get(fmt.name) != fmt:
        raise ValueError(f"norm_rope_hadamard_cast_store kernel: unsupported configuration for "
                         f"{fmt.name}: {why or 'not one of the four cache formats'}")
    if config is not None:
        if not isinstance(config, KVStoreConfig):
            raise TypeError(f"norm_rope_hadamard_cast_store: config must be a KVStoreConfig, got "
                            f"{type(config).__name__}")
        check_config(fmt, config)
        if not chunks_fit(fmt, config.chunks, rope_dim, interleaved):
            raise ValueError(f"norm_rope_hadamard_cast_store: config.chunks={config.chunks} does not lay out "
                             f"{fmt.name} rows with rope_dim={rope_dim} interleaved={interleaved}")
    check_cuda(kv=kv, kv_cache=kv_cache)
    check_aligned(kv_cache=kv_cache, norm_weight=norm_weight, cos=cos, sin=sin, out_norm=out_norm)
    if geom.num_slots >= 1 << 31:  # (a stored slot's address comes from its int32 value)
        raise ValueError(f"norm_rope_hadamard_cast_store: kv_cache holds {geom.num_slots} slots, the kernel "
                         f"addresses at most 2^31 - 1")
    return geom


def _store_plan(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt, rope_dim, interleaved,
                hadamard, out_norm, config=None):
    """(geometry, compiled kernel or None for an empty call, out_norm placeholder, whether the read
    tensors are contiguous) of a call's static key."""
    geom = _store_check(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt, rope_dim,
                        interleaved, hadamard, out_norm, config)
    if geom.rows == 0:
        return geom, None, None, True
    static = static_args(fmt, rope_dim, interleaved, hadamard, out_norm is not None, geom.rows_per_block,
                         _TORCH_TO_TL[norm_weight.dtype], _TORCH_TO_TL[positions.dtype],
                         _TORCH_TO_TL[slot_mapping.dtype],
                         config or launch_config(fmt, geom.rows, rope_dim, interleaved))
    return (geom, compiled(kv_store_kernel, *static), dummy(kv.device, torch.bfloat16, (1, geom.dim)),
            dense(kv, norm_weight, cos, sin, positions, slot_mapping))


def _store_launch(plan_, kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, out_norm):
    geom, fn, no_norm, contiguous = plan_
    check_out_norm_apart(out_norm, kv, launch=True)
    if debug_checks_enabled():
        check_store_values(positions, slot_mapping, geom)
    if fn is None:
        return
    if not contiguous:
        kv, norm_weight, cos, sin, positions, slot_mapping = (
            t.contiguous() for t in (kv, norm_weight, cos, sin, positions, slot_mapping))
    if kv.data_ptr() % 16:
        kv = kv.clone()
    fn(kv, norm_weight, cos, sin, positions, slot_mapping, kv_cache,
       out_norm if out_norm is not None else no_norm, float(eps), geom.num_slots)


_PLANS = Plans(_store_plan)


def _store_impl(kv: Tensor, norm_weight: Tensor, eps: float, cos: Tensor, sin: Tensor, positions: Tensor,
                slot_mapping: Tensor, kv_cache: Tensor, fmt: str, rope_dim: int = 64,
                interleaved: bool = True, hadamard: bool = False, out_norm: Tensor | None = None) -> None:
    args = (kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, cache_format(fmt), rope_dim,
            interleaved, hadamard, out_norm)
    _store_launch(_PLANS(args), kv, norm_weight, eps, cos, sin, positions, slot_mapping,
                  kv_cache, out_norm)


def _store_fake(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt, rope_dim=64,
                interleaved=True, hadamard=False, out_norm=None):
    _store_check(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, cache_format(fmt),
                 rope_dim, interleaved, hadamard, out_norm)


_STORE_OP = register_op("norm_rope_hadamard_cast_store", _store_impl, _store_fake,
                        mutates_args=("kv_cache", "out_norm"))


def norm_rope_hadamard_cast_store(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt, *,
                                  rope_dim=64, interleaved=True, hadamard=False, out_norm=None,
                                  config: KVStoreConfig | None = None) -> None:
    """Per row i: y = rmsnorm(kv[i]); [out_norm[i] = y]; if slot >= 0: cache[slot] = cast(H(rope(y))).

    Same arguments and results as ``reference.kv_store.norm_rope_hadamard_cast_store_ref``:
    kv [rows, fmt.dim] bf16 (may be non-contiguous: copied), norm_weight [fmt.dim] bf16/fp32, cos/sin
    [max_position, rope_dim / 2] fp32, positions/slot_mapping [rows] int32/int64, kv_cache [num_blocks,
    fmt.block_bytes(rpb)] uint8 (written in place), out_norm optional [rows, fmt.dim] bf16 (written).
    ``torch.ops.tilelang_ops.norm_rope_hadamard_cast_store`` (it takes the format's name, ``fmt.name``).
    ``config``: the kernel's tuning (None: ``launch_config(fmt, rows, rope_dim, interleaved)``), launched
    directly, outside the registered op; every config stores the same bytes, except ``hadamard_mma``'s
    order (see ``make_row_store``).
    """
    args = (kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt, rope_dim, interleaved,
            hadamard, out_norm)
    if config is not None:
        _store_launch(_store_plan(*args, config), kv, norm_weight, eps, cos, sin, positions, slot_mapping,
                      kv_cache, out_norm)
        return
    call_format_op(_STORE_OP, _store_check, args, 8)
