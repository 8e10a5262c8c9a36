"""Host-side validation of ``norm_rope_hadamard_cast_store`` arguments (SPEC 1.5, 2, 3).

Shared by the loop reference and the TileLang wrapper. ``check_store_args`` reads only shapes,
dtypes, devices and Python scalars (no device sync); ``check_store_values`` reads slot and position
values (the reference always runs it, the wrapper only under ``debug_checks_enabled()``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from metadata.cache_format import KVCacheFormat
from metadata.checks import check_same_device, check_tensor, describe, is_int, is_real, same_start

INDEX_DTYPES = (torch.int32, torch.int64)
WEIGHT_DTYPES = (torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class StoreGeometry:
    rows: int  # rows of kv
    dim: int  # fmt.dim
    rows_per_block: int  # cache rows per allocator block, from the cache width
    num_slots: int  # num_blocks * rows_per_block: slots >= this are out of the cache
    max_position: int  # rows of the cos/sin tables


def check_store_args(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt, *,
                     rope_dim=64, interleaved=True, hadamard=False, out_norm=None) -> StoreGeometry:
    """Raise TypeError/ValueError on any malformed argument; return the derived geometry."""
    if not isinstance(fmt, KVCacheFormat):
        raise TypeError(f"fmt must be a KVCacheFormat, got {describe(fmt)}")
    dim = fmt.dim
    check_tensor("kv", kv, dtype=torch.bfloat16, ndim=2)
    if kv.shape[1] != dim:
        raise ValueError(f"kv must have shape (rows, {dim}) for {fmt.name}, got {tuple(kv.shape)}")
    rows = kv.shape[0]
    check_tensor("norm_weight", norm_weight, dtype=WEIGHT_DTYPES, shape=(dim,))
    if not is_real(eps):
        raise TypeError(f"eps must be a Python float, got {describe(eps)}")
    if not (eps >= 0 and eps < math.inf):  # NaN fails both
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    if not is_int(rope_dim):
        raise TypeError(f"rope_dim must be an int, got {describe(rope_dim)}")
    if rope_dim <= 0 or rope_dim % 2 or rope_dim > dim:
        raise ValueError(f"rope_dim must be even and in [2, {dim}], got {rope_dim}")
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved must be a bool, got {describe(interleaved)}")
    if not isinstance(hadamard, bool):
        raise TypeError(f"hadamard must be a bool, got {describe(hadamard)}")
    if hadamard and dim & (dim - 1):
        raise ValueError(f"hadamard needs a power-of-two row width, got dim={dim}")
    check_tensor("cos", cos, dtype=torch.float32, ndim=2)
    if cos.shape[1] != rope_dim // 2 or cos.shape[0] < 1:
        raise ValueError(f"cos must have shape (max_position >= 1, rope_dim/2={rope_dim // 2}), "
                         f"got {tuple(cos.shape)}")
    check_tensor("sin", sin, dtype=torch.float32, shape=tuple(cos.shape))
    check_tensor("positions", positions, dtype=INDEX_DTYPES, shape=(rows,))
    check_tensor("slot_mapping", slot_mapping, dtype=INDEX_DTYPES, shape=(rows,))
    check_tensor("kv_cache", kv_cache, dtype=torch.uint8, ndim=2, contiguous=True)
    rows_per_block = fmt.rows_per_block(kv_cache.shape[1])
    if out_norm is not None:
        check_tensor("out_norm", out_norm, dtype=torch.bfloat16, shape=(rows, dim), contiguous=True)
        check_out_norm_apart(out_norm, kv)
    check_same_device(kv=kv, norm_weight=norm_weight, cos=cos, sin=sin, positions=positions,
                      slot_mapping=slot_mapping, kv_cache=kv_cache, out_norm=out_norm)
    return StoreGeometry(rows, dim, rows_per_block, kv_cache.shape[0] * rows_per_block, cos.shape[0])


def check_out_norm_apart(out_norm, kv, *, launch: bool = False) -> None:
    """out_norm must not start where kv does (rows written while others are read). An address, not part
    of a call's static key: the kernel wrapper checks it on every call, cached plans included.
    ``launch``: the tensors are a launch's, which have memory, so their addresses compare directly (the host
    checks also see meta and fake tensors: ``same_start``)."""
    if out_norm is None or kv.shape[0] == 0:
        return
    if out_norm.data_ptr() == kv.data_ptr() if launch else same_start(out_norm, kv):
        raise ValueError("out_norm must not alias kv")


def check_store_values(positions, slot_mapping, geom: StoreGeometry) -> None:
    """Slots must address the cache; rows that are stored (slot >= 0) need a position in the table.

    Reads device values (a sync on CUDA): the reference runs it always, the wrapper in debug mode.
    """
    if geom.rows == 0:
        return
    slots = slot_mapping.long()
    bad = slots >= geom.num_slots
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"slot_mapping[{i}]={int(slots[i])} is beyond the cache "
                         f"({geom.num_slots} slots = blocks x {geom.rows_per_block} rows)")
    pos = positions.long()
    bad = (slots >= 0) & ((pos < 0) | (pos >= geom.max_position))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"positions[{i}]={int(pos[i])} is outside the cos/sin table "
                         f"[0, {geom.max_position})")
