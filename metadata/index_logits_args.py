"""Host-side argument checks for the index-logits operators (SPEC section 5), shared by
`reference.index_logits` and `tilelang_ops.index_logits`.

The ``check_*_args`` functions read shapes, dtypes, devices and host integers only (no device sync);
the ``check_*_values`` functions read tensor values: the references always call them, the kernel
wrappers only under ``metadata.checks.debug_checks_enabled()``. Without them a kernel still never reads
or writes outside its tensors: a key it cannot resolve (a block-table entry outside the cache, a
logical row beyond the table, a ragged key outside ``[0, N)``) scores -inf, and a ``klen`` above
``max_klen`` is cut at ``max_klen``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from metadata.cache_format import FP4_INDEX_KV_FORMAT
from metadata.checks import check_same_device, check_tensor, is_int

INDEX_DIM = FP4_INDEX_KV_FORMAT.dim  # 128 elements per index row
CODE_BYTES = FP4_INDEX_KV_FORMAT.data_bytes  # 64: two e2m1 codes per byte
SCALE_BYTES = FP4_INDEX_KV_FORMAT.scale_bytes  # 4: one UE8M0 byte per 32 elements
HEADS = (32, 64)  # index heads the kernels take
MAX_ROWS = 8  # query rows per request in a decode / verification step
CANDIDATE_BLOCK_SIZES = (8, 16)


@dataclass(frozen=True)
class PagedGeometry:
    b: int  # requests
    n: int  # query rows per request
    heads: int
    rows_per_block: int  # Bc: index rows per cache block
    num_blocks: int
    max_blocks: int  # block-table width
    max_klen: int  # logits width
    num_candidates: int  # c (0 without candidate restriction)
    candidate_block_size: int  # bs (0 without candidate restriction)


@dataclass(frozen=True)
class RaggedGeometry:
    t: int  # query rows
    heads: int
    num_keys: int  # N gathered keys
    max_width: int  # logits width


def _check_host_int(name: str, v, lo: int = 0) -> int:
    if not is_int(v):
        raise TypeError(f"{name} must be a host int, got {type(v).__name__} {v!r}")
    if v < lo:
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    return v


def _check_bool(name: str, v) -> None:
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, got {type(v).__name__} {v!r}")


def check_quantize_args(x) -> tuple[int, ...]:
    """x: [..., 128] bf16. Returns the leading shape."""
    check_tensor("x", x, dtype=torch.bfloat16)
    if x.dim() < 1 or x.shape[-1] != INDEX_DIM:
        raise ValueError(f"x must have shape [..., {INDEX_DIM}], got {tuple(x.shape)}")
    return tuple(x.shape[:-1])


def _check_queries(lead: tuple, q_codes, q_scales, weights) -> int:
    """q_codes [*lead, H, 64] uint8, q_scales [*lead, H, 4] uint8, weights [*lead, H] fp32; returns H."""
    nd = len(lead) + 2
    check_tensor("q_codes", q_codes, dtype=torch.uint8, ndim=nd)
    heads = q_codes.shape[-2]
    if tuple(q_codes.shape) != (*lead, heads, CODE_BYTES) or heads not in HEADS:
        raise ValueError(f"q_codes must have shape {(*lead, 'H', CODE_BYTES)} with H in {HEADS}, "
                         f"got {tuple(q_codes.shape)}")
    check_tensor("q_scales", q_scales, dtype=torch.uint8, shape=(*lead, heads, SCALE_BYTES))
    check_tensor("weights", weights, dtype=torch.float32, shape=(*lead, heads))
    return heads


def _check_out(out, shape, device) -> None:
    if out is None:
        return
    check_tensor("out", out, dtype=torch.float32, shape=shape, contiguous=True)
    check_same_device(out=out, reference=torch.empty(0, device=device))


def check_paged_args(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen, *,
                     candidate_blocks=None, candidate_block_size=None, clean=False,
                     out=None) -> PagedGeometry:
    """All shape / dtype / device / host-int rules of `paged_index_logits`; returns its geometry."""
    check_tensor("q_codes", q_codes, dtype=torch.uint8, ndim=4)
    b, n = q_codes.shape[:2]
    if not 1 <= n <= MAX_ROWS:
        raise ValueError(f"q_codes must have 1 to {MAX_ROWS} query rows per request (dim 1), got "
                         f"shape {tuple(q_codes.shape)}")
    heads = _check_queries((b, n), q_codes, q_scales, weights)
    check_tensor("index_cache", index_cache, dtype=torch.uint8, ndim=2, contiguous=True)
    rpb = FP4_INDEX_KV_FORMAT.rows_per_block(index_cache.shape[1])
    check_tensor("block_tables", block_tables, dtype=torch.int32, ndim=2)
    if block_tables.shape[0] != b:
        raise ValueError(f"block_tables must have {b} rows (one per request), got "
                         f"{tuple(block_tables.shape)}")
    check_tensor("klen", klen, dtype=torch.int32, shape=(b, n))
    _check_host_int("max_klen", max_klen)
    _check_bool("clean", clean)
    max_blocks = block_tables.shape[1]
    if (candidate_blocks is None) != (candidate_block_size is None):
        raise ValueError("candidate_blocks and candidate_block_size go together (both or neither), got "
                         f"candidate_blocks={'None' if candidate_blocks is None else 'a tensor'}, "
                         f"candidate_block_size={candidate_block_size!r}")
    c = bs = 0
    if candidate_blocks is not None:
        check_tensor("candidate_blocks", candidate_blocks, dtype=torch.int32, ndim=3)
        if tuple(candidate_blocks.shape[:2]) != (b, n):
            raise ValueError(f"candidate_blocks must have shape ({b}, {n}, c), got "
                             f"{tuple(candidate_blocks.shape)}")
        if isinstance(candidate_block_size, bool) or candidate_block_size not in CANDIDATE_BLOCK_SIZES:
            raise ValueError(f"candidate_block_size must be one of {CANDIDATE_BLOCK_SIZES}, got "
                             f"{candidate_block_size!r}")
        c, bs = candidate_blocks.shape[2], candidate_block_size
        if max_klen > c * bs:
            raise ValueError(f"max_klen={max_klen} exceeds the {c} candidate blocks x "
                             f"candidate_block_size {bs} = {c * bs} compact columns")
    elif max_blocks * rpb < max_klen:
        raise ValueError(f"block_tables has {max_blocks} blocks of {rpb} rows = {max_blocks * rpb} rows, "
                         f"too short for max_klen={max_klen}")
    dev = check_same_device(q_codes=q_codes, q_scales=q_scales, weights=weights, index_cache=index_cache,
                            block_tables=block_tables, klen=klen, candidate_blocks=candidate_blocks)
    _check_out(out, (b, n, max_klen), dev)
    return PagedGeometry(b, n, heads, rpb, index_cache.shape[0], max_blocks, max_klen, c, bs)


def _first_bad(mask: torch.Tensor) -> tuple:
    return tuple(mask.nonzero()[0].tolist())


def check_paged_values(block_tables, klen, geom: PagedGeometry, candidate_blocks=None) -> None:
    """Value checks (device sync): 0 <= klen <= max_klen; every column below klen resolves to a cache
    row: its candidate block is -1 or has rows inside the block table, and the table entry of every
    logical row it reads lies in [0, num_blocks)."""
    if klen.numel():
        bad = (klen < 0) | (klen > geom.max_klen)
        if bool(bad.any()):
            r, t = _first_bad(bad)
            raise ValueError(f"klen[{r}, {t}] = {int(klen[r, t])} is outside [0, max_klen={geom.max_klen}]")
    if geom.max_klen == 0 or klen.numel() == 0:
        return
    dev = klen.device
    col = torch.arange(geom.max_klen, device=dev)
    live = col[None, None, :] < klen[:, :, None].long()  # [b, n, max_klen]
    if candidate_blocks is not None:
        bs = geom.candidate_block_size
        blk = candidate_blocks.long()[:, :, col // bs]  # [b, n, max_klen]
        if bool((live & (blk < -1)).any()):
            r, t, i = _first_bad(live & (blk < -1))
            raise ValueError(f"candidate_blocks[{r}, {t}, {i // bs}] = {int(blk[r, t, i])} is below -1")
        live = live & (blk >= 0)
        logical = blk * bs + col % bs
    else:
        logical = col[None, None, :].expand(live.shape)
    tblk = torch.div(logical, geom.rows_per_block, rounding_mode="floor")
    bad = live & (tblk >= geom.max_blocks)
    if bool(bad.any()):
        r, t, i = _first_bad(bad)
        raise ValueError(f"column {i} of row ({r}, {t}) reads logical row {int(logical[r, t, i])}, beyond "
                         f"block_tables' {geom.max_blocks} blocks of {geom.rows_per_block} rows")
    ids = block_tables.long().gather(1, tblk.clamp(0, geom.max_blocks - 1).reshape(geom.b, -1))
    ids = ids.reshape(live.shape)
    bad = live & ((ids < 0) | (ids >= geom.num_blocks))
    if bool(bad.any()):
        r, t, i = _first_bad(bad)
        raise ValueError(f"block_tables[{r}, {int(tblk[r, t, i])}] = {int(ids[r, t, i])} (read by column {i} "
                         f"of row ({r}, {t})) is outside the cache's {geom.num_blocks} blocks")


def check_ragged_args(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, *, clean=False,
                      out=None) -> RaggedGeometry:
    """All shape / dtype / device / host-int rules of `ragged_index_logits`; returns its geometry."""
    check_tensor("q_codes", q_codes, dtype=torch.uint8, ndim=3)
    t = q_codes.shape[0]
    heads = _check_queries((t,), q_codes, q_scales, weights)
    check_tensor("k_codes", k_codes, dtype=torch.uint8, ndim=2)
    num_keys = k_codes.shape[0]
    if k_codes.shape[1] != CODE_BYTES:
        raise ValueError(f"k_codes must have shape (N, {CODE_BYTES}), got {tuple(k_codes.shape)}")
    check_tensor("k_scales", k_scales, dtype=torch.uint8, shape=(num_keys, SCALE_BYTES))
    check_tensor("ks", ks, dtype=torch.int32, shape=(t,))
    check_tensor("ke", ke, dtype=torch.int32, shape=(t,))
    _check_host_int("max_width", max_width)
    _check_bool("clean", clean)
    dev = check_same_device(q_codes=q_codes, q_scales=q_scales, weights=weights, k_codes=k_codes,
                            k_scales=k_scales, ks=ks, ke=ke)
    _check_out(out, (t, max_width), dev)
    return RaggedGeometry(t, heads, num_keys, max_width)


def check_ragged_values(ks, ke, geom: RaggedGeometry) -> None:
    """Value checks (device sync): 0 <= ks <= ke <= N and ke - ks <= max_width."""
    if ks.numel() == 0:
        return
    bad = (ks < 0) | (ke < ks) | (ke > geom.num_keys) | (ke.long() - ks.long() > geom.max_width)
    if bool(bad.any()):
        (t,) = _first_bad(bad)
        raise ValueError(f"row {t}: ks = {int(ks[t])}, ke = {int(ke[t])} must satisfy 0 <= ks <= ke <= "
                         f"N = {geom.num_keys} and ke - ks <= max_width = {geom.max_width}")
