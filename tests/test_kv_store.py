"""norm_rope_hadamard_cast_store: cast arithmetic, byte layouts, stages, loop reference vs twin, errors
(CPU tier). The kernel's tests: tests/test_kv_store_kernel.py."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from metadata.cache_format import (
    BF16_KV_FORMAT,
    FP4_INDEX_KV_FORMAT,
    FP4_MAIN_KV_FORMAT,
    FP8_MAIN_KV_FORMAT,
    KVCacheFormat,
)
from reference.kv_store import (
    E2M1_VALUES,
    _hadamard_matrix,
    apply_rope_ref,
    cast_to_e2m1_codes,
    cast_to_e4m3_bits,
    dequantize_rows,
    e4m3_scale,
    hadamard_ref,
    norm_rope_hadamard_cast_store_ref,
    norm_rope_hadamard_cast_store_torch,
    quantize_row,
    rms_inverse,
    rms_norm_ref,
    rms_norm_torch,
    rms_sum_of_squares,
    rms_sum_of_squares_torch,
    ue8m0_scale,
)
from tests.conftest import case_id
from tilelang_ops.testing import compare_bitwise
from tilelang_ops.testing.kv_store import (
    FORMATS,
    SENTINEL,
    StoreCase,
    hadamard_mma_model,
    make_inputs,
)


def f32(v):
    return torch.tensor(v, dtype=torch.float32)


def f32_from_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b))[0]


# ------------------------------------------------------------------------------------------------
# Cast arithmetic on hand-built values (bitwise: these are the SPEC section 2 bit patterns).
# ------------------------------------------------------------------------------------------------

E4M3_HAND = [
    (0.0, 0x00), (-0.0, 0x80), (1.0, 0x38), (-1.0, 0xB8), (448.0, 0x7E), (-448.0, 0xFE),
    (449.0, 0x7E), (464.0, 0x7E), (1e30, 0x7E), (-1e30, 0xFE),  # saturation beyond qmax
    (1.0625, 0x38), (1.1875, 0x3A), (1.0625 + 2**-20, 0x39),  # ties to even mantissa, just above
    (2.0**-9, 0x01), (2.0**-10, 0x00), (1.5 * 2.0**-10, 0x01), (3 * 2.0**-10, 0x02),  # subnormals
    (-(2.0**-11), 0x80), (-(2.0**-10), 0x80),  # negative values rounding to zero keep the sign
    (2.0**-6, 0x08), (7 * 2.0**-9, 0x07), (7.5 * 2.0**-9, 0x08),  # subnormal/normal border (tie->even)
]


@pytest.mark.parametrize("value,bits", E4M3_HAND, ids=[f"{v!r}" for v, _ in E4M3_HAND])
def test_e4m3_hand_values(value, bits):
    assert int(cast_to_e4m3_bits(f32([value]))[0]) == bits


E2M1_HAND = [
    (0.0, 0), (-0.0, 8), (0.25, 0), (0.2500001, 1), (0.5, 1), (0.75, 2), (0.7499999, 1), (1.0, 2),
    (1.25, 2), (1.2500001, 3), (1.5, 3), (1.75, 4), (2.0, 4), (2.5, 4), (2.5000002, 5), (3.0, 5),
    (3.5, 6), (3.4999998, 5), (4.0, 6), (5.0, 6), (5.0000005, 7), (6.0, 7), (7.0, 7), (1e30, 7),
    (-0.1, 8), (-0.25, 8), (-0.3, 9), (-6.0, 15), (-1e30, 15), (-2.5, 12), (-3.5, 14),
]


@pytest.mark.parametrize("value,code", E2M1_HAND, ids=[f"{v!r}" for v, _ in E2M1_HAND])
def test_e2m1_hand_values(value, code):
    assert int(cast_to_e2m1_codes(f32([value]))[0]) == code


def test_ue8m0_scale_rounding():
    next_up = lambda v: f32_from_bits(struct.unpack("<I", struct.pack("<f", v))[0] + 1)  # noqa: E731
    cases = [  # amax, qmax, expected scale
        (448.0, 448.0, 1.0),  # exact power of two stays
        (next_up(448.0), 448.0, 2.0),  # one FP32 step above rounds up
        (336.0, 448.0, 1.0), (896.0, 448.0, 2.0), (6.0, 6.0, 1.0), (12.0, 6.0, 2.0), (6.5, 6.0, 2.0),
        (6.0 * 2.0**-126, 6.0, 2.0**-126),  # the e2m1 amax floor: smallest normal scale
        (3.0, 6.0, 0.5), (3.0000002, 6.0, 1.0),
    ]
    for amax, qmax, want in cases:
        sf, byte = ue8m0_scale(f32(amax), qmax)
        assert float(sf) == want, (amax, qmax, float(sf))
        assert int(byte) == int(math.log2(want)) + 127


def test_e4m3_scale():
    cases = [(6.0, 1.0, 0x38), (6.0 * 1.0625, 1.0, 0x38), (6.0 * 1.1875, 1.25, 0x3A),
             (6.0 * 2.0**-9, 2.0**-9, 0x01), (6.0 * 1000.0, 448.0, 0x7E), (6.0 * 448.0, 448.0, 0x7E)]
    for amax, want, bits in cases:
        sf, byte = e4m3_scale(f32(amax))
        assert float(sf) == want and int(byte) == bits, (amax, float(sf), int(byte))


def _e4m3_table():
    """All finite e4m3fn values by code, decoded from the bit fields (not through torch's cast)."""
    vals = {}
    for code in range(256):
        s, e, m = code >> 7, (code >> 3) & 0xF, code & 7
        if e == 15 and m == 7:
            continue  # NaN
        mag = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        vals[code] = -mag if s else mag
    return vals


def _nearest_even(x: float, table: dict[int, float], qmax: float) -> int:
    """Independent RNE: nearest code by exhaustive search; a tie goes to the even code; the sign
    bit comes from x (so negative values rounding to zero keep it)."""
    x = max(-qmax, min(qmax, x))
    neg = math.copysign(1.0, x) < 0
    cands = [(abs(abs(x) - v), c & 1, c) for c, v in table.items() if v >= 0 and not (v == 0 and c != 0)]
    code = min(cands)[2]
    sign_bit = 0x80 if len(table) > 16 else 0x8
    return code | sign_bit if neg else code


def test_e4m3_random_vs_exhaustive_rne():
    table = _e4m3_table()
    x = torch.cat([torch.randn(3000) * s for s in (1e-3, 0.1, 3.0, 100.0, 600.0)])
    got = cast_to_e4m3_bits(x)
    for v, g in zip(x.tolist(), got.tolist(), strict=True):
        assert g == _nearest_even(v, table, 448.0), v


def test_e2m1_random_vs_exhaustive_rne():
    table = {c: v for c, v in enumerate(E2M1_VALUES)}
    x = torch.cat([torch.randn(4000) * s for s in (0.3, 2.0, 8.0)])
    # add every midpoint and its FP32 neighbours
    mids = [(a + b) / 2 for a, b in zip(E2M1_VALUES, E2M1_VALUES[1:], strict=False)]
    extra = []
    for m in mids:
        extra += [m, torch.nextafter(f32(m), f32(0.0)).item(), torch.nextafter(f32(m), f32(9.0)).item()]
    x = torch.cat([x, f32(extra), -f32(extra)])
    got = cast_to_e2m1_codes(x)
    for v, g in zip(x.tolist(), got.tolist(), strict=True):
        assert g == _nearest_even(v, table, 6.0), v


def e2m1_words_kernel_expression(x: torch.Tensor) -> torch.Tensor:
    """The kernel's e2m1 encode + packing, op for op (x [..., 8] fp32 -> [...] int64 holding uint32 words,
    nibble k = element k). It works on z2 = 2 z (the kernel folds the 2 into the scale: inv2 = 2 / sf),
    where one FMA rounds onto the e2m1 grid and leaves the code in the low nibble of the result's bits:
    F = max(bits(a) & 0x7F800000, bits(2.0) | 16) with a = min(|z2|, 12) (exponent 2 / 4 / 8 for
    |z| < 2 / < 4 / >= 4), t = float(F + (F >> 22)) * 2^22 + a. float(F) * 2^22 is 2^22 F (grid
    ulp = 1 / 2 / 4 on a, the e2m1 grid on |z|); the added F >> 22 = 2 * exponent = 256 / 258 / 260
    (and the 16) are whole grid steps, = 0 / 2 / 4 mod 16: the codes of 0 / 2 / 4 (0 / 2 / 4 for
    |z| = 0 / 2 / 4), so bits(t) mod 16 = the code (RNE: bits(F * 2^22) is even). Packing: w = (w >> 4)
    | (bits(t) << 28) (one funnel shift), then the sign: w |= bits(z2) & 0x80000000."""
    z2 = x * 2.0  # exact (z2 differs from the kernel's y * inv2 only for subnormal z: code 0 either way)
    mag = z2.abs().clamp_max(12.0)
    f = (mag.view(torch.int32) & 0x7F800000).clamp_min(0x40000010)  # non-negative: int32 is uint32 here
    # the product is exact (a power-of-two scale of a small float), so mul + add == the kernel's FFMA
    t = (f + (f >> 22)).view(torch.float32) * 2.0**22 + mag
    tb = t.view(torch.int32).long() & 0xFFFFFFFF
    sign = z2.view(torch.int32).long() & 0x80000000
    w = ((tb[..., 0] << 28) & 0xFFFFFFFF) | sign[..., 0]
    for k in range(1, 8):
        w = (w >> 4) | ((tb[..., k] << 28) & 0xFFFFFFFF) | sign[..., k]
    return w


def _pack_e2m1_words(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., 8] -> int64 words, nibble k = code k (the cache's FP4 byte order)."""
    return sum(codes[..., k].long() << (4 * k) for k in range(8))


def test_e2m1_kernel_expression_exhaustive():
    """Every FP32 value with 2^-3 <= |x| < 8 (all 2^23 mantissas of each exponent, both signs), every
    tiny magnitude class below that (a stride through the patterns) and the specials: the kernel's
    threshold-free encode equals the midpoint-threshold reference code for code (it packs 8 codes per
    word: compared word for word with the reference codes packed)."""
    lo, hi = 0x3E000000, 0x41000000  # bits of 2^-3 and 8.0
    chunk = 1 << 23
    for start in range(lo, hi, chunk):
        bits = torch.arange(start, min(start + chunk, hi), dtype=torch.int64)
        for sign in (0, -(1 << 31)):
            x = (bits + sign).to(torch.int32).view(torch.float32)
            want = cast_to_e2m1_codes(x)
            got, want = e2m1_words_kernel_expression(x.view(-1, 8)), _pack_e2m1_words(want.view(-1, 8))
            assert torch.equal(got, want), x.view(-1, 8)[(got != want).nonzero()[:2].flatten()].tolist()
    small = torch.arange(0, lo, 997, dtype=torch.int64)  # 0 and subnormals up to 2^-3 (all code 0)
    big = torch.arange(hi, 0x7F800001, 1009, dtype=torch.int64)  # 8 .. inf (all code 7)
    x = torch.cat([small, big]).to(torch.int32).view(torch.float32)
    x = torch.cat([x, -x, f32([0.0, -0.0, float("inf"), -float("inf"), 6.0, -6.0, 2.0**-149])])
    x = torch.cat([x, torch.zeros(-x.numel() % 8)]).view(-1, 8)
    assert torch.equal(e2m1_words_kernel_expression(x), _pack_e2m1_words(cast_to_e2m1_codes(x)))


# ---- the cast options (make_row_store's e2m1_bf16x2 and scale_mul), ported op for op ----

_ALL_BF16 = torch.arange(0, 0x7F80, dtype=torch.int32)  # every finite non-negative BF16 bit pattern


def test_option_scales_equal_reference_on_every_bf16_amax():
    """The cast input is BF16, so amax is BF16-valued (or the BF16 floor): on every such amax, the
    division-free scales equal the reference's. e2m1_bf16x2 (UE8M0): biased exponent
    ((bits16(amax) + 0x3F) >> 7) - 2 (amax / 6 rounds up to 2^(E-2) when its mantissa m <= 1.5, else
    2^(E-1)); scale_mul (e4m3): e4m3(min(RN(amax * RN(1/6)), 448)) instead of e4m3(min(RN(amax / 6), 448))."""
    idx, main = FORMATS["fp4_index"], FORMATS["fp4_main"]
    amax = (_ALL_BF16 << 16).view(torch.float32)
    a = amax.clamp_min(idx.amax_floor)
    _, want = ue8m0_scale(a, 6.0)
    got = ((a.view(torch.int32) >> 16) + 0x3F >> 7) - 2
    assert torch.equal(got.to(torch.uint8), want)
    a = amax.clamp_min(main.amax_floor)
    _, want = e4m3_scale(a)
    got = cast_to_e4m3_bits((a * f32(1.0 / 6.0)).clamp_max(448.0))
    assert torch.equal(got, want)
    # a mutant must fail: the quotient rounded up one step more often
    assert not torch.equal((((a.view(torch.int32) >> 16) + 0x40 >> 7) - 2).to(torch.uint8), ue8m0_scale(
        amax.clamp_min(idx.amax_floor), 6.0)[1])


def _nearest_f32(q) -> int:
    """Bits of the FP32 nearest to the positive rational q (ties to an even mantissa), by search."""
    from fractions import Fraction

    b = struct.unpack("<I", struct.pack("<f", float(q)))[0]  # within an ulp or two of the answer
    cands = [c for c in range(b - 2, b + 3) if c & 0x7F800000 != 0x7F800000]
    err = {c: abs(Fraction(struct.unpack("<f", struct.pack("<I", c))[0]) - q) for c in cands}
    best = min(err.values())
    return min((c for c in cands if err[c] == best), key=lambda c: c & 1)


def test_inv_table_and_noclamp_on_every_bf16_amax():
    """FP4 main's inv_table and e2m1_noclamp options. The table holds the IEEE quotient 2 / sf of every
    e4m3 scale byte the cast can store (the nearest FP32 to the exact rational, ties to even). The clamp
    skip: on every BF16 amax whose scale byte is normal (>= 8) from an unclamped amax / 6 (<= 448), the
    largest |2z| = RN(amax * (2 / sf)) stays below 14, and every FP32 in [12, 14) encodes to code 7 without
    the clamp, as with it (the encode is monotone in |y| <= amax). Subnormal scales reach |2z| >= 14: there
    the clamp matters, which is why the kernel tests the byte."""
    from fractions import Fraction

    from tilelang_ops.kv_store import inv_e4m3_table

    table = inv_e4m3_table()
    bits = table.view(torch.int32).tolist()
    values = _e4m3_table()
    for b in range(1, 127):
        assert bits[b] == _nearest_f32(Fraction(2) / Fraction(values[b])), b
    main = FORMATS["fp4_main"]
    amax = (_ALL_BF16 << 16).view(torch.float32).clamp_min(main.amax_floor)
    a6 = amax * f32(1.0 / 6.0)
    byte = cast_to_e4m3_bits(a6.clamp_max(448.0)).long()
    z2 = amax * table[byte]
    fast = (byte >= 8) & (a6 <= 448.0)
    assert float(z2[fast].max()) < 14.0 and float(z2[~fast & (byte < 8)].max()) >= 14.0
    x = torch.arange(0x41400000, 0x41600000, dtype=torch.int32).view(torch.float32)  # [12, 14)
    f = (x.view(torch.int32) & 0x7F800000).clamp_min(0x40000010)
    t = (f + (f >> 22)).view(torch.float32) * 2.0**22 + x
    assert bool(((t.view(torch.int32) & 15) == 7).all())


def e2m1_bf16x2_codes(y: torch.Tensor, e: int) -> torch.Tensor:
    """make_row_store(e2m1_bf16x2=True)'s code of BF16 y under the UE8M0 scale 2^(e - 127), op for op
    (one half of a pair): G = max(bits(|y|) & 0x7F80, e << 7); M = G + (G >> 6) + (128 - e) * 130 + 512;
    t = RN_bf16(|y| * 2^(128 - e) + M) (the FMA: exact product; FP32 here, exact for these operands
    before the one BF16 rounding that matters); code = bits(t) & 15, sign bit 3 from y."""
    yb = y.view(torch.int16).int() & 0xFFFF
    a = yb & 0x7FFF
    g = torch.clamp_min(a & 0x7F80, e << 7)
    m = g + (g >> 6) + (128 - e) * 130 + 512
    assert int(m.min()) >= 0 and int(m.max()) < 1 << 16  # per-half sums stay in range (one 32-bit add)
    mag = (a << 16).view(torch.float32) * 2.0 ** (128 - e)
    t = (mag + (m << 16).view(torch.float32)).to(torch.bfloat16).view(torch.int16).int() & 0xFFFF
    return ((t & 15) | ((yb >> 12) & 8)).to(torch.uint8)


def _byte_perm(x: torch.Tensor, y: torch.Tensor, sel: int) -> torch.Tensor:
    """CUDA __byte_perm on int64 tensors holding uint32: byte n = byte (sel >> 4n) & 7 of {y, x}."""
    v = (y << 32) | x
    return sum(((v >> (8 * ((sel >> (4 * n)) & 7))) & 0xFF) << (8 * n) for n in range(4))


def test_e2m1_bf16x2_encode_exhaustive():
    """Every BF16 y (both signs) with |y| <= 6 sf, for scale exponents at both ends and around 2^0: the
    option's code equals the reference's cast of the FP32 y * (1 / sf); then its packing (two byte
    permutes of the pair words, the signs of y into bit 3, nibble pairs, a last permute) equals the
    cache's nibble order. A wrong grid offset is caught."""
    fmt = FORMATS["fp4_index"]
    y = torch.cat([_ALL_BF16, _ALL_BF16 | 0x8000]).to(torch.int16).view(torch.bfloat16)
    for e in (1, 2, 3, 60, 124, 125, 126, 127, 128, 129, 130, 200, 251, 252, 253):
        sf = torch.tensor(2.0 ** (e - 127), dtype=torch.float32)
        yv = y[y.float().abs() <= 6 * sf.item()]
        want = cast_to_e2m1_codes(yv.float() * (torch.tensor(1.0) / sf))
        got = e2m1_bf16x2_codes(yv, e)
        bad = (got != want).nonzero().flatten()[:4]
        assert bad.numel() == 0, (e, yv[bad].float().tolist(), got[bad].tolist(), want[bad].tolist())
    assert fmt.qmax == 6.0 and fmt.scale_dtype == "ue8m0"
    # packing: 8 elements = 4 pair words -> one word, nibble k = element k
    g = torch.Generator().manual_seed(5)
    yv = (torch.randn(4096, 8, generator=g) * 3).clamp(-6.0, 6.0).bfloat16()  # |y| <= 6 sf (sf = 1)
    codes = e2m1_bf16x2_codes(yv.view(-1), 127).view(-1, 8).long()
    mag = yv.view(torch.int16).long() & 0x7FFF  # t's low nibble: the code without the sign
    t = ((codes & 7) | (mag & 0xFFF0)).view(-1, 4, 2)  # other bits of t are don't-cares: keep some set
    t = t[..., 0] | (t[..., 1] << 16)
    yw = (yv.view(torch.int16).long() & 0xFFFF).view(-1, 4, 2)
    yw = yw[..., 0] | (yw[..., 1] << 16)
    q = []
    for h in range(2):
        pc = _byte_perm(t[:, 2 * h], t[:, 2 * h + 1], 0x6420)
        ps = _byte_perm(yw[:, 2 * h], yw[:, 2 * h + 1], 0x7531)
        pc = pc | ((ps >> 4) & 0x08080808)
        q.append((pc & 0x0F0F0F0F) | ((pc >> 4) & 0xF0F0F0F0))
    assert torch.equal(_byte_perm(q[0], q[1], 0x6420), _pack_e2m1_words(codes))
    # mutant: M's mantissa one grid step off
    yv = y[y.float().abs() <= 6.0]
    assert not torch.equal(((e2m1_bf16x2_codes(yv, 127) + 1) & 15), cast_to_e2m1_codes(yv.float()))


def test_ue8m0_random_vs_log2():
    amax = torch.rand(2000) * torch.exp2(torch.randint(-60, 60, (2000,)).float())
    for qmax in (448.0, 6.0):
        sf, byte = ue8m0_scale(amax, qmax)
        for a, s, b in zip(amax.tolist(), sf.tolist(), byte.tolist(), strict=True):
            q = (f32(a) / f32(qmax)).item()  # the FP32 quotient, exactly as SPEC rounds it
            m, e = math.frexp(q)  # q = m * 2**e, 0.5 <= m < 1
            want = 2.0 ** (e - 1) if m == 0.5 else 2.0**e
            assert s == want and b == int(math.log2(want)) + 127, (a, qmax, s)


def _quantize_row_independent(row: torch.Tensor, fmt: KVCacheFormat):
    """Bytes of one row from Python floats: the exhaustive RNE search and frexp-based scales."""
    if fmt.data_dtype == "bf16":
        return row.to(torch.bfloat16).view(torch.uint8).tolist(), []
    g = fmt.group_size
    table = _e4m3_table() if fmt.data_dtype == "e4m3" else {c: v for c, v in enumerate(E2M1_VALUES)}
    codes, scales = [], []
    for b in range(fmt.num_scales):
        block = row[b * g:(b + 1) * g].tolist()
        amax = max(max(abs(v) for v in block), f32(fmt.amax_floor).item())
        if fmt.scale_dtype == "ue8m0":
            m, e = math.frexp((f32(amax) / f32(fmt.qmax)).item())
            sf = 2.0 ** (e - 1) if m == 0.5 else 2.0**e
            scales.append(int(math.log2(sf)) + 127)
        else:
            code = _nearest_even((f32(amax) / f32(6.0)).item(), _e4m3_table(), 448.0)
            sf = _e4m3_table()[code]
            scales.append(code)
        inv = (f32(1.0) / f32(sf)).item()
        codes += [_nearest_even((f32(v) * f32(inv)).item(), table, fmt.qmax) for v in block]
    if fmt.data_dtype == "e2m1":
        codes = [codes[2 * i] | (codes[2 * i + 1] << 4) for i in range(len(codes) // 2)]
    return codes, scales


@pytest.mark.parametrize("name", list(FORMATS))
def test_quantize_row_vs_independent(name):
    fmt = FORMATS[name]
    for scale in (1e-6, 1.0, 300.0):
        row = (torch.randn(fmt.dim) * scale).bfloat16().float()
        row[5] = -0.0
        row[fmt.dim // 2:fmt.dim // 2 + 40] = 0.0  # all-zero blocks hit the amax floor
        data, scales = quantize_row(row, fmt)
        want_data, want_scales = _quantize_row_independent(row, fmt)
        assert data.tolist() == want_data
        assert scales.tolist() == want_scales


def test_amax_floor_blocks():
    # A zero block: amax = 1e-4 -> sf = ue8m0(1e-4 / 448) = 2^-22 (byte 105); codes are signed zeros.
    row = torch.zeros(512)
    row[1] = -0.0
    data, scales = quantize_row(row, FP8_MAIN_KV_FORMAT)
    assert scales.tolist() == [105] * 16
    assert data[0] == 0 and data[1] == 0x80 and int(data[2:].sum()) == 0
    # FP4 main: amax floor 6 * 2^-9 -> e4m3 scale 2^-9 (code 0x01)
    data, scales = quantize_row(torch.zeros(512), FP4_MAIN_KV_FORMAT)
    assert scales.tolist() == [0x01] * 32 and int(data.sum()) == 0
    # FP4 index (UE8M0): amax floor 6 * 2^-126 -> scale 2^-126 (byte 1)
    data, scales = quantize_row(torch.zeros(128), FP4_INDEX_KV_FORMAT)
    assert scales.tolist() == [1] * 4 and int(data.sum()) == 0


# ------------------------------------------------------------------------------------------------
# Stages
# ------------------------------------------------------------------------------------------------

def _fp32(v: float) -> float:
    """Round a Python float to FP32 (one IEEE rounding: +, *, / and sqrt of FP32 operands computed in
    double and rounded once are correctly rounded FP32 results)."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def _sum_of_squares_by_hand(row: list[float]) -> float:
    """The documented order, independently: 16-element chunks left to right, then pairwise halving."""
    partial = []
    for c in range(0, len(row), 16):
        p = _fp32(row[c] * row[c])
        for k in range(c + 1, c + 16):
            p = _fp32(p + _fp32(row[k] * row[k]))
        partial.append(p)
    while len(partial) > 1:
        h = len(partial) // 2
        partial = [_fp32(partial[i] + partial[i + h]) for i in range(h)]
    return partial[0]


@pytest.mark.parametrize("dim", [512, 128])
def test_rms_sum_of_squares_order(dim):
    """Loop helper == by-hand FP32 emulation of the documented order == vectorized twin (bitwise)."""
    g = torch.Generator().manual_seed(dim)
    x = (torch.randn(12, dim, generator=g) * torch.exp2(torch.randint(-6, 7, (12, 1), generator=g).float())
         ).bfloat16()
    x[0, ::3] = 0.0
    x[1] = x[1] * 1e-20  # tiny squares (subnormal products)
    x[2, :17] = 3e18  # huge squares next to small ones
    twin = rms_sum_of_squares_torch(x)
    assert twin.shape == (12, 1) and twin.dtype == torch.float32
    for r in range(x.shape[0]):
        loop = rms_sum_of_squares(x[r])
        assert float(loop) == _sum_of_squares_by_hand(x[r].float().tolist()), r
        assert torch.equal(loop.reshape(1), twin[r]), r


def test_rms_sum_of_squares_order_matters():
    """The fixed order is not torch's own reduction order: on some rows the FP32 sums differ (so the
    order must be part of the contract for bitwise results); the difference is rounding only."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(64, 512, generator=g) * 3).bfloat16()
    fixed = rms_sum_of_squares_torch(x)
    naive = (x.float() * x.float()).sum(-1, keepdim=True)
    differ = fixed != naive
    assert int(differ.sum()) > 0
    assert torch.allclose(fixed, naive, rtol=1e-5, atol=0)


def test_rms_norm_formula():
    x = torch.randn(7, 512).bfloat16()
    for w in (torch.rand(512).bfloat16(), torch.rand(512)):
        y = rms_norm_torch(x, w, 1e-6)
        want = x.double() / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-6) * w.double()
        assert y.dtype == torch.bfloat16
        # FP32 math vs float64: the BF16 results differ by at most one step
        assert torch.allclose(y.double(), want, rtol=2**-7, atol=0)
        for r in range(x.shape[0]):  # the loop helper, row by row: bitwise
            assert torch.equal(rms_norm_ref(x[r], w, 1e-6), y[r]), r
    # inv = 1 / sqrt(ms + eps) with IEEE sqrt and division (not an approximate rsqrt)
    row = x[0].float()
    inv = _fp32(1.0 / _fp32(math.sqrt(_fp32(_sum_of_squares_by_hand(row.tolist()) / 512 + _fp32(1e-6)))))
    w = torch.rand(512)
    want = (row * f32(inv) * w).bfloat16()
    assert torch.equal(rms_norm_ref(x[0], w, 1e-6), want)
    ones = torch.tensor([1.0, -1.0] * 256).bfloat16()
    w = torch.randn(512).bfloat16()
    assert torch.equal(rms_norm_ref(ones, w, 0.0), (ones.float() * w.float()).bfloat16())  # exact case


def test_rms_inverse_is_ieee_on_every_row():
    """inv = 1 / sqrt(ms + eps) is the IEEE FP32 result on every row, also where torch's vectorized CPU
    sqrt is an ulp off (about 0.6% of inputs; the GPU run caught one such row as a one-step out_norm
    difference before the reference took the sqrt in FP64 and rounded once)."""
    g = torch.Generator().manual_seed(11)
    ss = torch.rand(20000, 1, generator=g) * 1000
    ms = ss / 128 + 1e-6
    assert int((torch.sqrt(ms) != torch.sqrt(ms.double()).float()).sum()) > 0, "test would prove nothing"
    inv = rms_inverse(ss, 128, 1e-6)
    want = [_fp32(1.0 / _fp32(math.sqrt(_fp32(v / 128 + _fp32(1e-6))))) for v in ss[:, 0].tolist()]
    assert inv[:, 0].tolist() == want


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "half"])
def test_rope_pairs(interleaved):
    dim, rope = 128, 64
    x = torch.randn(dim).bfloat16()
    cos, sin = torch.randn(rope // 2), torch.randn(rope // 2)
    got = apply_rope_ref(x, cos, sin, rope, interleaved)
    want = x.float().clone()
    base = dim - rope
    for i in range(rope // 2):
        ia, ib = (base + 2 * i, base + 2 * i + 1) if interleaved else (base + i, base + i + rope // 2)
        a, b = f32(x[ia].item()), f32(x[ib].item())
        want[ia] = a * cos[i] - b * sin[i]
        want[ib] = a * sin[i] + b * cos[i]
    compare_bitwise("rope", got, want.bfloat16()).check()
    assert torch.equal(got[:base], x[:base])  # channels before the rope slice pass through
    # rotation by angle 0 is the identity; by pi/2 maps (a, b) -> (-b, a)
    assert torch.equal(apply_rope_ref(x, torch.ones(32), torch.zeros(32), rope, interleaved), x)
    r = apply_rope_ref(x, torch.zeros(32), torch.ones(32), rope, interleaved)
    ia, ib = (base, base + 1) if interleaved else (base, base + 32)
    assert r[ia] == -x[ib] and r[ib] == x[ia]


def test_hadamard_matrix_and_transform():
    for n in (2, 4, 8, 128):
        h = _hadamard_matrix(n)
        assert torch.equal(h @ h.T, n * torch.eye(n, dtype=torch.float64))
    h = _hadamard_matrix(128)
    x = torch.randn(5, 128).bfloat16()
    got = hadamard_ref(x)
    want = (x.double() @ h.T) * 128**-0.5
    assert torch.allclose(got.double(), want, rtol=2**-7, atol=1e-6)
    e0 = torch.zeros(128).bfloat16()
    e0[0] = 1
    assert torch.equal(hadamard_ref(e0), torch.full((128,), 128**-0.5).bfloat16())
    e1 = torch.zeros(128).bfloat16()
    e1[1] = 1  # second column of Sylvester H: +1, -1 alternating
    assert torch.equal(hadamard_ref(e1), (h[:, 1] * 128**-0.5).bfloat16())
    small = torch.tensor([1.0, 2.0, 3.0, 4.0]).bfloat16()
    assert hadamard_ref(small).float().tolist() == [5.0, -1.0, -2.0, 0.0]  # [10,-2,-4,0] * 0.5


@pytest.mark.parametrize("chain", (1, 2, 4))
def test_hadamard_mma_model(chain):
    """The model is the Hadamard (exact inputs: equal to hadamard_ref bitwise; random rows: within a
    BF16 rounding of the float64 transform), and its order is not the reference's: on rows that mix
    magnitudes some sums round differently (so a GPU test against it can tell the orders apart)."""
    g = torch.Generator().manual_seed(5)
    ints = torch.randint(-8, 9, (64, 128), generator=g).bfloat16()
    assert torch.equal(hadamard_mma_model(ints, chain), hadamard_ref(ints))
    x = torch.randn(256, 128, generator=g).bfloat16()
    want = (x.double() @ _hadamard_matrix(128).T) * 128 ** -0.5
    assert torch.allclose(hadamard_mma_model(x, chain).double(), want, rtol=2 ** -7, atol=1e-30)
    mixed = (torch.randn(4096, 128, generator=g) * torch.exp2(torch.randint(-20, 4, (4096, 128),
                                                                             generator=g).float())).bfloat16()
    differ = (hadamard_mma_model(mixed, chain) != hadamard_ref(mixed)).sum().item()
    assert 0 < differ < mixed.numel() * 1e-3, differ


# ------------------------------------------------------------------------------------------------
# The operator: layouts, skips, out_norm, repeated calls (loop reference)
# ------------------------------------------------------------------------------------------------

def _exact_inputs(fmt, w_row, slots, rows_per_block=4, num_blocks=3):
    """|x| = 1 rows, eps = 0, position 0 with cos = 1, sin = 0: the stored row is exactly sign * w."""
    rows = len(slots)
    kv = torch.ones(rows, fmt.dim).bfloat16()
    kv[:, 1::3] = -1
    cos, sin = torch.ones(4, 32), torch.zeros(4, 32)
    pos = torch.zeros(rows, dtype=torch.int32)
    cache = torch.full((num_blocks, fmt.block_bytes(rows_per_block)), SENTINEL, dtype=torch.uint8)
    return kv, w_row, cos, sin, pos, torch.tensor(slots, dtype=torch.int64), cache


def test_fp8_main_layout_by_hand():
    fmt = FP8_MAIN_KV_FORMAT
    w = torch.full((512,), 1.0).bfloat16()
    w[0], w[2], w[32], w[33] = 448.0, 0.875, 0.5, 2.0  # group 0 amax 448 -> scale 1; group 1 amax 2
    kv, w, cos, sin, pos, slots, cache = _exact_inputs(fmt, w, [6])
    norm_rope_hadamard_cast_store_ref(kv, w, 0.0, cos, sin, pos, slots, cache, fmt)
    block = cache[1]  # slot 6 = block 1, row 2 (4 rows per block)
    assert block.shape[0] == 4 * 528
    row = block[2 * 528:3 * 528]
    assert row[0] == 0x7E and row[2] == 0x36 and row[1] == 0xB8  # 448, 0.875, -1 (x[1] = -1)
    assert row[512] == 127  # scale of group 0 = 2^0
    assert row[513] == 127 - 7  # group 1: amax 2 -> 2/448 -> 2^-7
    assert row[32] == 0x68 and row[33] == 0x78  # 0.5 * 128 = 64 (0x68); 2 * 128 = 256 (0x78)
    others = torch.cat([cache[0], cache[2], block[:2 * 528], block[3 * 528:]])
    assert bool((others == SENTINEL).all())


def test_fp4_main_layout_and_nibbles_by_hand():
    fmt = FP4_MAIN_KV_FORMAT
    w = torch.full((512,), 1.0).bfloat16()
    w[0], w[1], w[2], w[3] = 0.5, 6.0, 1.5, 3.0  # amax 6 -> e4m3 scale 1.0; x[1] = -1 -> -6
    w[16:32] = 0.25  # group 1: amax 0.25 (x[16] = -0.25) -> scale e4m3(0.25/6)
    kv, w, cos, sin, pos, slots, cache = _exact_inputs(fmt, w, [0])
    norm_rope_hadamard_cast_store_ref(kv, w, 0.0, cos, sin, pos, slots, cache, fmt)
    row = cache[0, :288]
    assert row[0] == (0x1 | (0xF << 4))  # element 0 = +0.5 (code 1) low, element 1 = -6 (code 15) high
    assert row[1] == (0x3 | (0x5 << 4))  # +1.5 (code 3), +3 (code 5)
    sf1 = torch.tensor(0.25 / 6).to(torch.float8_e4m3fn)
    assert row[256] == 0x38 and row[257] == int(sf1.view(torch.uint8))
    assert bool((cache[0, 288:] == SENTINEL).all()) and bool((cache[1:] == SENTINEL).all())


def test_fp4_index_block_sections_by_hand():
    fmt = FP4_INDEX_KV_FORMAT
    w = torch.full((128,), 6.0).bfloat16()  # amax 6 -> UE8M0 scale 1 (byte 127), codes 7 / 15
    kv, w, cos, sin, pos, slots, cache = _exact_inputs(fmt, w, [5, 2], rows_per_block=4)
    norm_rope_hadamard_cast_store_ref(kv, w, 0.0, cos, sin, pos, slots, cache, fmt)
    # slot 5 = block 1, row 1: data at [64, 128), scales at 4*64 + 4 = [260, 264)
    assert cache.shape[1] == 4 * 68
    blk = cache[1]
    want = [0x7 | (0xF << 4), 0x7 | (0x7 << 4), 0xF | (0x7 << 4)]  # x[1], x[4], x[7], ... are -1
    assert blk[64:67].tolist() == want
    assert blk[260:264].tolist() == [127] * 4
    assert bool((blk[:64] == SENTINEL).all()) and bool((blk[128:256] == SENTINEL).all())
    assert bool((blk[256:260] == SENTINEL).all()) and bool((blk[264:] == SENTINEL).all())
    assert cache[0, 128:131].tolist() == want and cache[0, 264:268].tolist() == [127] * 4  # slot 2
    assert bool((cache[2] == SENTINEL).all())


def test_bf16_layout_by_hand():
    fmt = BF16_KV_FORMAT
    w = torch.randn(512).bfloat16()
    kv, w, cos, sin, pos, slots, cache = _exact_inputs(fmt, w, [3])
    norm_rope_hadamard_cast_store_ref(kv, w, 0.0, cos, sin, pos, slots, cache, fmt)
    want = (kv[0].float() * w.float()).bfloat16()
    assert torch.equal(cache[0, 3 * 1024:4 * 1024].view(torch.bfloat16), want)
    assert bool((cache[0, :3 * 1024] == SENTINEL).all())


STORE_CASES = [
    StoreCase("fp8_main", "fp8_main", 13),
    StoreCase("fp8_main_half_w32", "fp8_main", 9, interleaved=False, weight_fp32=True),
    StoreCase("fp8_main_tiny", "fp8_main", 6, scale=1e-8, index_dtype=torch.int32),
    StoreCase("fp8_main_shift100", "fp8_main", 5, offset=100.0),
    StoreCase("fp4_main", "fp4_main", 11),
    StoreCase("fp4_main_half_big", "fp4_main", 7, interleaved=False, scale=3e4),
    StoreCase("fp4_index_hadamard", "fp4_index", 21, hadamard=True, rows_per_block=16),
    StoreCase("fp4_index_plain_half", "fp4_index", 10, interleaved=False, rows_per_block=5),
    StoreCase("fp4_index_hadamard_tiny", "fp4_index", 8, hadamard=True, scale=1e-30, index_dtype=torch.int32),
    StoreCase("bf16", "bf16", 7),
    StoreCase("bf16_half", "bf16", 4, interleaved=False, weight_fp32=True),
    # other RoPE widths: pairs that do not split evenly over a main row's lanes (16, 48), more pairs than
    # lanes (128), a half-split partner chunk further away (128 half), a short index RoPE (32)
    StoreCase("fp4_main_rope48", "fp4_main", 9, rope_dim=48),
    StoreCase("fp8_main_rope16", "fp8_main", 5, rope_dim=16),
    StoreCase("fp4_main_rope128", "fp4_main", 6, rope_dim=128),
    StoreCase("fp8_main_rope128_half", "fp8_main", 7, interleaved=False, rope_dim=128),
    StoreCase("fp4_index_had_rope32_half", "fp4_index", 9, interleaved=False, hadamard=True, rope_dim=32),
    # the Hadamard on 512-wide rows (the contract allows it on any power-of-two width; no engine path uses it)
    StoreCase("fp8_main_hadamard", "fp8_main", 5, hadamard=True),
    StoreCase("fp4_main_hadamard_half", "fp4_main", 6, interleaved=False, hadamard=True),
]


@pytest.mark.parametrize("case", STORE_CASES, ids=case_id)
def test_loop_reference_equals_twin(case):
    fmt, kv, w, cos, sin, pos, slots, cache = make_inputs(case)
    cache2 = cache.clone()
    on1 = torch.full((case.rows, fmt.dim), 7.0).bfloat16()
    on2 = on1.clone()
    kw = dict(rope_dim=case.rope_dim, interleaved=case.interleaved, hadamard=case.hadamard)
    norm_rope_hadamard_cast_store_ref(kv, w, 1e-6, cos, sin, pos, slots, cache, fmt, out_norm=on1, **kw)
    norm_rope_hadamard_cast_store_torch(kv, w, 1e-6, cos, sin, pos, slots, cache2, fmt, out_norm=on2, **kw)
    # both compute with the same FP32 operations in the same order: payload bytes and rows bitwise
    compare_bitwise("kv_cache", cache2, cache).check()
    compare_bitwise("out_norm", on2, on1).check()
    # out_norm is the norm stage for every row, skipped rows included
    compare_bitwise("out_norm_vs_stage", on1, rms_norm_torch(kv, w, 1e-6)).check()
    # untouched slots keep the sentinel; written slots decode close to the pipeline's values
    rpb = case.rows_per_block
    written = torch.zeros(cache.shape[0] * rpb, dtype=torch.bool)
    written[slots[slots >= 0].long()] = True
    for s in torch.nonzero(~written).flatten().tolist()[:20]:
        blk, r = divmod(s, rpb)
        d0 = fmt.data_offset(r, rpb)
        assert bool((cache[blk, d0:d0 + fmt.data_bytes] == SENTINEL).all()), s
    stored = slots[slots >= 0]
    deq = dequantize_rows(cache, stored, fmt)
    y = rms_norm_torch(kv, w, 1e-6)[slots >= 0]
    p = pos[slots >= 0].long()
    z = apply_rope_ref(y, cos[p], sin[p], case.rope_dim, case.interleaved)
    z = hadamard_ref(z) if case.hadamard else z
    err = (deq - z.float()).abs().amax(-1) / z.float().abs().amax(-1).clamp_min(1e-30)
    tol = {"e4m3": 0.07, "e2m1": 0.34, "bf16": 0.0}[fmt.data_dtype]
    assert bool((err <= tol).all()), err


def test_repeated_calls_and_overwrite():
    case = StoreCase("rep", "fp8_main", 6)
    fmt, kv, w, cos, sin, pos, slots, cache = make_inputs(case)
    slots, pos = torch.tensor([0, 1, 2, 3, 4, 5]), pos.clamp(0, 63)
    norm_rope_hadamard_cast_store_ref(kv, w, 1e-6, cos, sin, pos, slots, cache, fmt)
    first = cache.clone()
    kv2 = torch.randn_like(kv.float()).bfloat16()
    slots2 = torch.tensor([5, 9, -1, 10, -1, 11])
    norm_rope_hadamard_cast_store_ref(kv2, w, 1e-6, cos, sin, pos, slots2, cache, fmt)
    assert torch.equal(cache[0, :5 * 528], first[0, :5 * 528])  # slots 0..4 kept
    assert not torch.equal(cache[0, 5 * 528:6 * 528], first[0, 5 * 528:6 * 528])  # slot 5 replaced
    fresh = torch.full_like(cache, SENTINEL)
    norm_rope_hadamard_cast_store_ref(kv2, w, 1e-6, cos, sin, pos, slots2, fresh, fmt)
    assert torch.equal(cache[1], fresh[1])
    assert torch.equal(cache[0, 5 * 528:6 * 528], fresh[0, 5 * 528:6 * 528])


def test_zero_rows():
    case = StoreCase("empty", "fp4_index", 0, rows_per_block=4)
    fmt, kv, w, cos, sin, pos, slots, cache = make_inputs(case)
    before = cache.clone()
    norm_rope_hadamard_cast_store_ref(kv, w, 1e-6, cos, sin, pos, slots, cache, fmt, hadamard=True,
                                      out_norm=torch.empty(0, 128, dtype=torch.bfloat16))
    assert torch.equal(cache, before)


# ------------------------------------------------------------------------------------------------
# Error paths: raised before anything is written
# ------------------------------------------------------------------------------------------------

def _bad(name):
    case = StoreCase("err", "fp8_main", 4)
    fmt, kv, w, cos, sin, pos, slots, cache = make_inputs(case, max_position=16)
    args = dict(kv=kv, norm_weight=w, eps=1e-6, cos=cos, sin=sin, positions=pos, slot_mapping=slots,
                kv_cache=cache, fmt=fmt)
    kw = {}
    if name == "kv_dtype":
        args["kv"] = kv.float()
    elif name == "kv_dim":
        args["kv"] = kv[:, :256]
    elif name == "kv_ndim":
        args["kv"] = kv.reshape(-1)
    elif name == "weight_shape":
        args["norm_weight"] = w[:100]
    elif name == "weight_dtype":
        args["norm_weight"] = w.half()
    elif name == "eps_type":
        args["eps"] = torch.tensor(1e-6)
    elif name == "eps_negative":
        args["eps"] = -1.0
    elif name == "rope_odd":
        kw["rope_dim"] = 63
    elif name == "rope_too_big":
        kw["rope_dim"] = 1024
    elif name == "cos_shape":
        args["cos"] = cos[:, :16]
    elif name == "cos_dtype":
        args["cos"] = cos.double()
    elif name == "sin_shape":
        args["sin"] = sin[:8]
    elif name == "pos_dtype":
        args["positions"] = pos.float()
    elif name == "pos_shape":
        args["positions"] = pos[:2]
    elif name == "slot_dtype":
        args["slot_mapping"] = slots.to(torch.int16)
    elif name == "slot_shape":
        args["slot_mapping"] = slots[None]
    elif name == "cache_dtype":
        args["kv_cache"] = cache.view(torch.int8)
    elif name == "cache_width":
        args["kv_cache"] = cache[:, :1000].contiguous()
    elif name == "cache_noncontig":
        args["kv_cache"] = torch.full((cache.shape[1], cache.shape[0]), 1, dtype=torch.uint8).T
    elif name == "fmt_type":
        args["fmt"] = "fp8_main"
    elif name == "hadamard_non_pow2":
        fmt3 = KVCacheFormat("fp8_384", 384, "e4m3", "ue8m0", 32)
        args.update(kv=torch.zeros(4, 384).bfloat16(), norm_weight=torch.ones(384), fmt=fmt3,
                    kv_cache=torch.zeros(2, fmt3.row_bytes * 4, dtype=torch.uint8))
        kw["hadamard"] = True
    elif name == "interleaved_type":
        kw["interleaved"] = 1
    elif name == "out_norm_shape":
        kw["out_norm"] = torch.empty(3, 512, dtype=torch.bfloat16)
    elif name == "out_norm_dtype":
        kw["out_norm"] = torch.empty(4, 512)
    elif name == "slot_beyond_cache":
        slots[2] = cache.shape[0] * 8
    elif name == "position_beyond_table":
        pos[0], slots[0] = 16, 0
    elif name == "position_negative":
        pos[0], slots[0] = -1, 0
    else:
        raise AssertionError(name)
    return args, kw


ERRORS = {
    "kv_dtype": TypeError, "kv_dim": ValueError, "kv_ndim": ValueError, "weight_shape": ValueError,
    "weight_dtype": TypeError, "eps_type": TypeError, "eps_negative": ValueError, "rope_odd": ValueError,
    "rope_too_big": ValueError, "cos_shape": ValueError, "cos_dtype": TypeError, "sin_shape": ValueError,
    "pos_dtype": TypeError, "pos_shape": ValueError, "slot_dtype": TypeError, "slot_shape": ValueError,
    "cache_dtype": TypeError, "cache_width": ValueError, "cache_noncontig": ValueError,
    "fmt_type": TypeError, "hadamard_non_pow2": ValueError, "interleaved_type": TypeError,
    "out_norm_shape": ValueError, "out_norm_dtype": TypeError, "slot_beyond_cache": ValueError,
    "position_beyond_table": ValueError, "position_negative": ValueError,
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_errors_before_any_write(name):
    args, kw = _bad(name)
    before = args["kv_cache"].clone()
    with pytest.raises(ERRORS[name]):
        norm_rope_hadamard_cast_store_ref(**args, **kw)
    assert torch.equal(args["kv_cache"], before)

