"""Reference for the fused store: RMSNorm -> RoPE -> [Hadamard] -> cast -> paged-cache store.

SPEC 1.5 (stages, each rounded to BF16) and SPEC 2 (cache formats and cast arithmetic). The loop
reference ``norm_rope_hadamard_cast_store_ref`` walks rows one by one and scale blocks one by one;
``norm_rope_hadamard_cast_store_torch`` is its vectorized twin (tested bitwise equal, same checks), the
oracle for large GPU shapes; ``norm_rope_hadamard_cast_store_torch_unchecked`` is the twin's arithmetic
alone, the torch eager / torch.compile benchmark peer (validated once outside the timed call).

Decisions: ``out_norm`` (when given) receives the norm stage of *every* row, including rows whose
slot is < 0 (the indexer projects every row's latent; a placeholder row of zeros gives zeros).
Rows with slot < 0 never read their position. Two rows with the same slot: the later row wins here;
kernels leave that undefined (the engine never maps two rows to one slot). NaN inputs are not part of
the contract (their codes are unspecified).
"""

from __future__ import annotations

import torch

from metadata.cache_format import E2M1_MAX, E4M3_MAX, KVCacheFormat
from metadata.checks import check_int_sequence, check_tensor, describe
from metadata.kv_store_args import check_store_args, check_store_values

# e2m1 magnitudes of codes 0..7; bit 3 (value 8) is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


# ----------------------------------------------------------------------------------------------
# Cast arithmetic (SPEC section 2), FP32 tensors of any shape, bit-exact.
# ----------------------------------------------------------------------------------------------

def cast_to_e4m3_bits(x: torch.Tensor) -> torch.Tensor:
    """FP32 -> e4m3fn bit patterns (uint8): clamp to [-448, 448], then round to nearest even."""
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def cast_to_e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """FP32 -> e2m1 codes (uint8 in [0, 16)): clamp to [-6, 6], round to nearest even code.

    The thresholds are the midpoints between neighbouring magnitudes; a midpoint goes to the even
    code (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4). The sign bit (8)
    is copied from the input, so -0.1 becomes code 8 (negative zero), as the FP8 cast does.
    """
    x = x.float().clamp(-E2M1_MAX, E2M1_MAX)
    mag = x.abs()
    code = ((mag > 0.25).to(torch.uint8) + (mag >= 0.75).to(torch.uint8) + (mag > 1.25).to(torch.uint8)
            + (mag >= 1.75).to(torch.uint8) + (mag > 2.5).to(torch.uint8) + (mag >= 3.5).to(torch.uint8)
            + (mag > 5.0).to(torch.uint8))
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def ue8m0_scale(amax: torch.Tensor, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Power-of-two scale ``>= amax / qmax``: returns (scale fp32, stored byte uint8).

    ``bits(sf) = (bits(sf) + 0x7FFFFF) & 0x7F800000`` rounds the FP32 quotient up to a power of two
    by its bits (an exact power of two stays); the byte is the biased exponent ``bits >> 23``.
    """
    # the divisor lives on amax's device: CUDA torch turns a division by a CPU scalar into a multiply
    # by its reciprocal (not correctly rounded), a tensor divisor gets IEEE division
    sf = amax.float() / torch.tensor(qmax, dtype=torch.float32, device=amax.device)
    bits = (sf.view(torch.int32).long() + 0x7FFFFF) & 0x7F800000
    return bits.to(torch.int32).view(torch.float32), (bits >> 23).to(torch.uint8)


def e4m3_scale(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 scale of FP4 main rows: ``sf = e4m3_rne(amax / 6)``; returns (float(sf), its byte)."""
    byte = cast_to_e4m3_bits(amax.float() / torch.tensor(E2M1_MAX, dtype=torch.float32, device=amax.device))
    return byte.view(torch.float8_e4m3fn).float(), byte


def quantize_row(row: torch.Tensor, fmt: KVCacheFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """One row (FP32 [dim], values already BF16) -> (data bytes [data_bytes], scale bytes [scale_bytes])."""
    assert row.shape == (fmt.dim,)
    if fmt.data_dtype == "bf16":
        return row.to(torch.bfloat16).view(torch.uint8).clone(), torch.empty(0, dtype=torch.uint8)
    g = fmt.group_size
    one = torch.tensor(1.0, dtype=torch.float32)
    codes = torch.empty(fmt.dim, dtype=torch.uint8)
    scales = torch.empty(fmt.num_scales, dtype=torch.uint8)
    for b in range(fmt.num_scales):
        block = row[b * g:(b + 1) * g].float()
        amax = block.abs().max().clamp_min(torch.tensor(fmt.amax_floor, dtype=torch.float32))
        if fmt.scale_dtype == "ue8m0":
            sf, scales[b] = ue8m0_scale(amax, fmt.qmax)
        else:
            sf, scales[b] = e4m3_scale(amax)
        scaled = block * (one / sf)
        if fmt.data_dtype == "e4m3":
            codes[b * g:(b + 1) * g] = cast_to_e4m3_bits(scaled)
        else:
            codes[b * g:(b + 1) * g] = cast_to_e2m1_codes(scaled)
    if fmt.data_dtype == "e2m1":
        # element 2i in the low nibble, 2i+1 in the high nibble
        data = torch.empty(fmt.dim // 2, dtype=torch.uint8)
        for i in range(fmt.dim // 2):
            data[i] = codes[2 * i] | (codes[2 * i + 1] << 4)
        return data, scales
    return codes, scales


# ----------------------------------------------------------------------------------------------
# Stages (each returns BF16), on [..., dim] so the twin can call them on a batch.
# ----------------------------------------------------------------------------------------------

RMS_CHUNK = 16  # elements per partial sum of squares (one kernel lane's registers)


def rms_sum_of_squares(row: torch.Tensor) -> torch.Tensor:
    """sum(x[k]^2) of one row [dim] in the fixed FP32 order that the kernel computes (0-d fp32).

    1. Chunks of 16 consecutive elements: ``p = x0*x0; p = p + x1*x1; ...; p = p + x15*x15``, left
       to right, every product rounded to FP32 before its add (no FMA).
    2. The ``dim/16`` partial sums are combined by pairwise halving,
       ``p = [p[i] + p[i + h] for i in range(h)]`` with h = n/2, n/4, ..., 1 (the kernel's
       xor-butterfly shuffles 16, 8, 4, 2, 1 across the lanes of a row).
    The order is part of the contract: a different order changes the sum's last bit now and then,
    which can flip a BF16 rounding of the norm stage (and RoPE's a*cos - b*sin amplifies that).
    """
    xf = row.float()
    dim = xf.shape[0]
    assert dim % RMS_CHUNK == 0 and (dim // RMS_CHUNK) & (dim // RMS_CHUNK - 1) == 0, dim
    partial = []
    for c in range(0, dim, RMS_CHUNK):
        p = xf[c] * xf[c]
        for k in range(c + 1, c + RMS_CHUNK):
            p = p + xf[k] * xf[k]
        partial.append(p)
    while len(partial) > 1:
        h = len(partial) // 2
        partial = [partial[i] + partial[i + h] for i in range(h)]
    return partial[0]


def rms_sum_of_squares_torch(x: torch.Tensor) -> torch.Tensor:
    """``rms_sum_of_squares`` for every row of [..., dim] at once (same FP32 operations, same order);
    returns [..., 1] fp32."""
    xf = x.float()
    sq = (xf * xf).reshape(*x.shape[:-1], x.shape[-1] // RMS_CHUNK, RMS_CHUNK)
    p = sq[..., 0]
    for k in range(1, RMS_CHUNK):
        p = p + sq[..., k]
    while p.shape[-1] > 1:
        h = p.shape[-1] // 2
        p = p[..., :h] + p[..., h:]
    return p


def rms_inverse(ss: torch.Tensor, dim: int, eps: float) -> torch.Tensor:
    """inv = 1 / sqrt(ss / dim + eps) in IEEE FP32 (each operation rounded once; not rsqrt, which is
    approximate on CUDA); ``ss / dim`` is exact scaling for a power-of-two dim.

    The FP32 sqrt is taken in FP64 and rounded once to FP32, which is the correctly rounded FP32 sqrt
    (53 >= 2 * 24 + 2 bits, so the double rounding is harmless): torch's vectorized CPU sqrt is not
    correctly rounded (about 0.6% of random inputs are off by one ulp), CUDA's sqrtf is."""
    one = torch.ones((), dtype=torch.float32, device=ss.device)
    return one / torch.sqrt((ss / dim + eps).double()).float()


def _rms_scale(xf: torch.Tensor, ss: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = bf16((x * inv) * w) with inv = ``rms_inverse(ss, dim, eps)``."""
    return (xf * rms_inverse(ss, xf.shape[-1], eps) * weight.float()).to(torch.bfloat16)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """One row [dim]: y = x * (1 / sqrt(mean(x^2) + eps)) * float(w), FP32 math in the fixed order of
    ``rms_sum_of_squares``, BF16 result."""
    xf = x.float()
    return _rms_scale(xf, rms_sum_of_squares(xf), weight, eps)


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_norm_ref`` for every row of [..., dim] at once (same operations, same order)."""
    xf = x.float()
    return _rms_scale(xf, rms_sum_of_squares_torch(xf), weight, eps)


def apply_rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope_dim: int,
                   interleaved: bool) -> torch.Tensor:
    """Rotate the last ``rope_dim`` channels: a' = a*cos - b*sin, b' = a*sin + b*cos (FP32, BF16 out).

    Pairs are (2i, 2i+1) when interleaved, else (i, i + rope_dim/2); cos/sin: [..., rope_dim/2].
    """
    out = x.float().clone()
    rot = out[..., x.shape[-1] - rope_dim:]
    half = rope_dim // 2
    if interleaved:
        a, b = rot[..., 0::2].clone(), rot[..., 1::2].clone()
        rot[..., 0::2] = a * cos - b * sin
        rot[..., 1::2] = a * sin + b * cos
    else:
        a, b = rot[..., :half].clone(), rot[..., half:].clone()
        rot[..., :half] = a * cos - b * sin
        rot[..., half:] = a * sin + b * cos
    return out.to(torch.bfloat16)


def hadamard_ref(x: torch.Tensor) -> torch.Tensor:
    """(H_n x) * n**-0.5 with Sylvester-ordered H_n: FP32 butterflies (h = 1, 2, 4, ...: x[j], x[j+h]
    -> x[j] + x[j+h], x[j] - x[j+h]), then times the FP32 constant; BF16 result."""
    n = x.shape[-1]
    assert n & (n - 1) == 0, n
    y = x.float()
    h = 1
    while h < n:
        y = y.reshape(*x.shape[:-1], n // (2 * h), 2, h)
        lo, hi = y[..., 0, :], y[..., 1, :]
        y = torch.stack((lo + hi, lo - hi), dim=-2).reshape(x.shape)
        h *= 2
    return (y * torch.tensor(n ** -0.5, dtype=torch.float32)).to(torch.bfloat16)


def _hadamard_matrix(n: int) -> torch.Tensor:
    """Sylvester H_n (float64), for tests: H_1 = [1], H_2n = [[H, H], [H, -H]]."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


# ----------------------------------------------------------------------------------------------
# The operator: loop reference.
# ----------------------------------------------------------------------------------------------

def norm_rope_hadamard_cast_store_ref(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache,
                                      fmt, *, rope_dim=64, interleaved=True, hadamard=False,
                                      out_norm=None) -> None:
    """Per row i: y = rmsnorm(kv[i]); [out_norm[i] = y]; if slot >= 0: cache[slot] = cast(H(rope(y))).

    kv:           [rows, fmt.dim] bf16
    norm_weight:  [fmt.dim] bf16 or fp32
    cos, sin:     [max_position, rope_dim / 2] fp32
    positions:    [rows] int32/int64 (read only for rows with slot >= 0)
    slot_mapping: [rows] int32/int64, < 0 skips the row's store
    kv_cache:     [num_blocks, fmt.block_bytes(rows_per_block)] uint8, written in place
    out_norm:     optional [rows, fmt.dim] bf16, receives the norm stage of every row
    """
    geom = check_store_args(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
                            rope_dim=rope_dim, interleaved=interleaved, hadamard=hadamard,
                            out_norm=out_norm)
    check_store_values(positions, slot_mapping, geom)
    rpb = geom.rows_per_block
    for i in range(geom.rows):
        y = rms_norm_ref(kv[i].cpu(), norm_weight.cpu(), eps)
        if out_norm is not None:
            out_norm[i] = y.to(out_norm.device)
        slot = int(slot_mapping[i])
        if slot < 0:
            continue
        p = int(positions[i])
        y = apply_rope_ref(y, cos[p].cpu(), sin[p].cpu(), rope_dim, interleaved)
        if hadamard:
            y = hadamard_ref(y)
        data, scales = quantize_row(y.float(), fmt)
        block, row = divmod(slot, rpb)
        d0, s0 = fmt.data_offset(row, rpb), fmt.scale_offset(row, rpb)
        kv_cache[block, d0:d0 + fmt.data_bytes] = data.to(kv_cache.device)
        if fmt.scale_bytes:
            kv_cache[block, s0:s0 + fmt.scale_bytes] = scales.to(kv_cache.device)


def dequantize_rows(kv_cache: torch.Tensor, slots, fmt: KVCacheFormat) -> torch.Tensor:
    """Decode cache rows back to FP32 [len(slots), dim] (code * scale), for diffing and tests.

    kv_cache: [num_blocks, fmt.block_bytes(rows_per_block)] uint8; slots: ints (a sequence or a 1-D
    integer tensor) in ``[0, num_blocks * rows_per_block)``.
    """
    if not isinstance(fmt, KVCacheFormat):
        raise TypeError(f"fmt must be a KVCacheFormat, got {describe(fmt)}")
    check_tensor("kv_cache", kv_cache, dtype=torch.uint8, ndim=2)
    rpb = fmt.rows_per_block(kv_cache.shape[1])
    if isinstance(slots, torch.Tensor):
        slots = slots.cpu()
    slots = check_int_sequence("slots", slots)
    num_slots = kv_cache.shape[0] * rpb
    for n, slot in enumerate(slots):
        if not 0 <= slot < num_slots:
            raise ValueError(f"slots[{n}]={slot} is outside the cache [0, {num_slots}) ({kv_cache.shape[0]} "
                             f"blocks x {rpb} rows; a negative slot is an unstored row and has no bytes)")
    cache = kv_cache.cpu()
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32)
    out = torch.empty(len(slots), fmt.dim, dtype=torch.float32)
    for n, slot in enumerate(slots):
        block, row = divmod(slot, rpb)
        d0, s0 = fmt.data_offset(row, rpb), fmt.scale_offset(row, rpb)
        data = cache[block, d0:d0 + fmt.data_bytes]
        if fmt.data_dtype == "bf16":
            out[n] = data.view(torch.bfloat16).float()
            continue
        if fmt.data_dtype == "e4m3":
            vals = data.view(torch.float8_e4m3fn).float()
        else:
            vals = torch.stack((table[(data & 0xF).long()], table[(data >> 4).long()]), -1).reshape(-1)
        sbytes = cache[block, s0:s0 + fmt.scale_bytes]
        if fmt.scale_dtype == "ue8m0":
            sf = (sbytes.to(torch.int32) << 23).view(torch.float32)
        else:
            sf = sbytes.view(torch.float8_e4m3fn).float()
        out[n] = vals * sf.repeat_interleave(fmt.group_size)
    return out


# ----------------------------------------------------------------------------------------------
# Vectorized twin (same arithmetic, whole batch at once).
# ----------------------------------------------------------------------------------------------

def quantize_rows_torch(rows: torch.Tensor, fmt: KVCacheFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, dim] FP32 -> (data [n, data_bytes], scales [n, scale_bytes]) uint8, all rows at once."""
    n = rows.shape[0]
    if fmt.data_dtype == "bf16":
        return rows.to(torch.bfloat16).view(torch.uint8), rows.new_empty(n, 0, dtype=torch.uint8)
    blocks = rows.float().reshape(n, fmt.num_scales, fmt.group_size)
    floor = torch.tensor(fmt.amax_floor, dtype=torch.float32, device=rows.device)
    amax = blocks.abs().amax(-1, keepdim=True).clamp_min(floor)
    if fmt.scale_dtype == "ue8m0":
        sf, sbytes = ue8m0_scale(amax, fmt.qmax)
    else:
        sf, sbytes = e4m3_scale(amax)
    scaled = blocks * (torch.tensor(1.0, dtype=torch.float32, device=rows.device) / sf)
    if fmt.data_dtype == "e4m3":
        data = cast_to_e4m3_bits(scaled).reshape(n, fmt.dim)
    else:
        codes = cast_to_e2m1_codes(scaled).reshape(n, fmt.dim // 2, 2)
        data = codes[..., 0] | (codes[..., 1] << 4)
    return data, sbytes.reshape(n, fmt.num_scales)


def store_stages_torch(kv, norm_weight, eps, cos, sin, positions, fmt, *, rope_dim=64, interleaved=True,
                       hadamard=False, hadamard_fn=None):
    """The compute part for every row: (norm stage bf16 [rows, dim], data, scales). Positions must be
    valid for every row (callers clamp skipped rows' positions). ``hadamard_fn`` (tests: a kernel's other
    summation order) replaces ``hadamard_ref``."""
    y = rms_norm_torch(kv, norm_weight, eps)
    pos = positions.long()
    z = apply_rope_ref(y, cos[pos], sin[pos], rope_dim, interleaved)
    if hadamard:
        z = (hadamard_fn or hadamard_ref)(z)
    data, scales = quantize_rows_torch(z.float(), fmt)
    return y, data, scales


def norm_rope_hadamard_cast_store_torch(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache,
                                        fmt, *, rope_dim=64, interleaved=True, hadamard=False,
                                        out_norm=None, hadamard_fn=None) -> None:
    """Vectorized twin of the loop reference (same checks, same bits). ``hadamard_fn``: see
    ``store_stages_torch``."""
    geom = check_store_args(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
                            rope_dim=rope_dim, interleaved=interleaved, hadamard=hadamard,
                            out_norm=out_norm)
    check_store_values(positions, slot_mapping, geom)
    norm_rope_hadamard_cast_store_torch_unchecked(kv, norm_weight, eps, cos, sin, positions, slot_mapping,
                                                  kv_cache, fmt, rope_dim=rope_dim, interleaved=interleaved,
                                                  hadamard=hadamard, out_norm=out_norm,
                                                  hadamard_fn=hadamard_fn)


def norm_rope_hadamard_cast_store_torch_unchecked(kv, norm_weight, eps, cos, sin, positions, slot_mapping,
                                                  kv_cache, fmt, *, rope_dim=64, interleaved=True,
                                                  hadamard=False, out_norm=None, hadamard_fn=None) -> None:
    """The arithmetic of ``norm_rope_hadamard_cast_store_torch`` (host checks only). Like a kernel without
    TILELANG_OPS_DEBUG, it skips rows whose slot is beyond the cache or whose position is outside the
    table instead of raising."""
    geom = check_store_args(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
                            rope_dim=rope_dim, interleaved=interleaved, hadamard=hadamard,
                            out_norm=out_norm)
    slots, pos = slot_mapping.long(), positions.long()
    valid = (slots >= 0) & (slots < geom.num_slots) & (pos >= 0) & (pos < geom.max_position)
    y, data, scales = store_stages_torch(kv, norm_weight, eps, cos, sin, torch.where(valid, pos, 0), fmt,
                                         rope_dim=rope_dim, interleaved=interleaved, hadamard=hadamard,
                                         hadamard_fn=hadamard_fn)
    if out_norm is not None:
        out_norm.copy_(y)
    rpb, width = geom.rows_per_block, kv_cache.shape[1]
    slots, data, scales = slots[valid], data[valid], scales[valid]
    block, row = slots // rpb, slots % rpb
    base = block * width
    if fmt.block_sections:
        d0, s0 = base + row * fmt.data_bytes, base + rpb * fmt.data_bytes + row * fmt.scale_bytes
    else:
        d0, s0 = base + row * fmt.row_bytes, base + row * fmt.row_bytes + fmt.data_bytes
    flat = kv_cache.view(-1)
    ar = torch.arange(fmt.data_bytes, device=kv_cache.device)
    flat.index_put_(((d0[:, None] + ar).reshape(-1),), data.reshape(-1))
    if fmt.scale_bytes:
        ar = torch.arange(fmt.scale_bytes, device=kv_cache.device)
        flat.index_put_(((s0[:, None] + ar).reshape(-1),), scales.reshape(-1))
