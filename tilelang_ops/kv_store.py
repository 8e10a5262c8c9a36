"""TileLang kernel: fused RMSNorm -> RoPE -> [Hadamard] -> cast -> paged-cache store (SPEC 1.5, 2).

Work split (v1 / v2; v3 below holds two or four such chunks per lane): a row of ``dim`` elements is
spread over ``dim / 16`` consecutive lanes of one warp (32
lanes for the 512-wide main rows, 8 for the 128-wide index rows), each lane holding 16 consecutive
elements in registers; a CTA of 128 threads handles 4 main or 16 index rows at a time, R times
(``rows_per_thread``: all R rows' loads are issued first; large launches only). Reductions (sum of
squares, group amax), the half-split RoPE partner and the cross-lane Hadamard stages use warp
shuffles, so there is no shared memory and no barrier. Each lane writes its 16 FP8 codes (one 16-byte
store), 8 packed FP4 bytes (8-byte store) or 32 BF16 bytes (two 16-byte stores); scale bytes follow.

Arithmetic matches ``reference.kv_store`` operation by operation: RoPE products/sums and the scale
divisions use IEEE round-to-nearest intrinsics so nvcc cannot contract them into FMAs; the Hadamard
butterflies run in the reference's order (h = 1, 2, 4, ... with lo + hi / lo - hi; except with v3's
``hadamard_mma``, on by default for FP4 index rows: see ``make_row_store``); FP32 constants are
built from their bit patterns. The RMS sum of squares runs in the contract's fixed order
(``reference.kv_store.rms_sum_of_squares``): each lane sums its 16 products left to right, then the
xor-butterfly shuffles 16, 8, 4, 2, 1 (index rows: 4, 2, 1) are exactly the reference's pairwise
halving ``p[i] + p[i + h]`` (lane i and lane i ^ h add the same two values; FP32 addition commutes), and
``inv = 1 / sqrt(ss / dim + eps)`` uses IEEE sqrt and division: results are bitwise equal. e4m3
codes come from the native conversion (``cvt.rn.satfinite``: RNE, saturates to +-448 exactly like the
SPEC's clamp, keeps the sign of zero); e2m1 codes (sm_90 has no e2m1 conversion instruction) come from
one RNE add of a magic constant (see the cast stage; proved equal to the threshold reference on every
FP32 value of interest in tests/test_kv_store.py).

Variants (``VARIANT``, or ``variant=`` per call; same bytes, except v3's ``hadamard_mma``, on by default
for FP4 index rows with the Hadamard: within issue #4's one-step tolerance): "v3" (default) is v2 with
``chunks`` (C, 2 by default, ``CHUNKS``) 16-element chunks per lane, chunk c of a lane being row chunk
``lane + c * lanes``: 16 lanes per main row, 4 per index row. The RMS halving steps at a distance of
at least ``lanes`` chunks and the widest Hadamard butterflies then run inside the lane, in the same
order as before (so the bytes stay bitwise), and everything paid per lane-row (sqrt and division,
shuffles, scale arithmetic, index math, the idle lanes of the RoPE branch, which now serves two rows
per warp) is paid once per C chunks. Its store guard takes the slot count as an argument (no 64-bit
division per thread). Main-body SASS per 32 elements (sm_90a, from cuobjdump): fp8 1000 (v2, R = 2)
-> 704 (C = 2) -> 524 (C = 4), fp4 ~1500 -> 1032 -> 856, fp4 index ~1900 -> 1360 -> 1192; registers
78 -> 90 -> 157 (C = 4 trades occupancy for fewer instructions and lost on the H200: see
``ROWS_PER_THREAD_V3``). Device time at 1M rows on the H200, v2 -> v3 (us): fp8 602 -> 542 (0.72 of
the copy roofline), fp4 703 -> 553 (0.59), fp4 index 246 -> 210 (0.39), bf16 597 -> 594 (0.86). The
time fell less than the instruction count: the fp8 kernel is now partly latency-bound (ncu: 22%
achieved occupancy, a warp eligible 64% of cycles), fp4 still issue-bound (77%). A persistent grid
(a fixed grid striding over the row groups, loading group i + 1 before storing group i) was tried,
GPU-verified and measured no better (bench_results/h200.txt), and removed. ``MIN_CTAS_V3`` caps the
registers, first at 96 (five CTAs per SM): 2-8% faster at 1M rows (fp8 539 us, fp4 516, fp4 index 200, bf16
581); FP4 main rows now run 6 CTAs per SM (80 registers) and FP8 main rows 7 (72), with the options below.
v3's cast options (``V3_OPTIONS``, on by default since their H200 run; ``make_row_store``'s
``e2m1_bf16x2`` for FP4 index rows: division-free UE8M0 scale and a BF16x2-FMA e2m1 encode on the packed
BF16 row, 1272 -> 1096 SASS per thread at R = 1, no stack; ``scale_mul`` for FP4 main rows: amax * RN(1/6)
instead of amax / 6, 1736 -> 1680 at R = 2; both 96 registers at ``MIN_CTAS_V3``) keep the bytes (CPU
emulation and the GPU tests bitwise) and save time at 1M rows: fp4 index 198.8 -> 179.5 us, fp4 main
517.3 -> 499.8 us. Later options (same bytes unless noted; ``V3_OPTIONS``): ``inv_table`` and ``e2m1_noclamp``
(FP4 main's scale reciprocal from a table, the e2m1 clamp skipped where it cannot bind), ``weight_smem`` (FP32
weights staged in shared memory once per CTA, every format) and ``rope_spread`` (a main row's RoPE spread over
all of its lanes through shared memory), ``amax_bf16x2`` (a chunk's amax from its packed BF16 words) and
``rcp_norm`` (the norm's reciprocal as rcp.rn), ``hadamard_mma`` (FP4 index rows: 5 of the Hadamard's 7 levels
on the tensor cores; the one option that may move a byte, by one step, within the issue's tolerance) and
``pred_store`` (predicated stores); with the defaults (``V3_OPTIONS``, ``MIN_CTAS_V3``) 1M rows take fp8 427
us (0.90 of the copy roofline), fp4 main 435 (0.747), fp4 index 147-150 (0.54-0.55, two rows per thread;
142.8 with the cast's (k, k + 4) pairing after the Hadamard, session 24: 0.56; with 32-bit slot, position and
row math in the pred_store kernels fp4 main 424.6 (0.76) and fp4 index 139.2 (0.58); with the Hadamard's bit 2
summed by chained MMAs, ``HMMA_CHAIN``, session 25: fp4 index 138.8 -> 135.5, 0.59), bf16 569 (0.89).
"v2" is v1 with fewer SASS instructions (``make_row_store(fast=True)``): the sum of squares as FFMAs
(x is BF16-valued, so x*x is exact in FP32 and ``ss + x*x`` rounds once either way; only products
below 2^-126, |x| < 2^-63, are inexact as FMULs, which can matter only when eps ~ 0 and a whole
16-element chunk is that tiny), e4m3 codes stored straight from the cvt words, e2m1 codes from an
exponent-bits magic constant (no compares / selects) packed 8 per 32-bit word, BF16 rows stored from
the already rounded words.
"v1" is the first kernel; compress_store calls the macro in its v1 form (unchanged generated code).
``tools/check_kv_store_emu.py`` runs all three on CPU (emulated CUDA) against the twin, bitwise.

Reuse: ``make_row_store`` returns the per-row pipeline as a ``@T.macro`` that takes one row already in
registers (16 FP32 values per lane in the layout above) and does norm -> rope -> [hadamard] -> cast ->
store; ``compress_store`` can call it on its compressed row.
"""



import functools
import os
import struct

import tilelang
import tilelang.language as T
import torch

from metadata.cache_format import ALL_FORMATS, KVCacheFormat
from metadata.checks import check_cuda, debug_checks_enabled
from metadata.kv_store_args import check_store_args, check_store_values

VEC = 16  # row elements per lane
THREADS = 128  # threads per CTA

_FORMATS = {f.name: f for f in ALL_FORMATS}
_TORCH_TO_TL = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.int32: "int32",
                torch.int64: "int64"}


def _f32(v: float):
    """An FP32 constant from its bit pattern (so no decimal printing can change it)."""
    return T.reinterpret(T.uint32(struct.unpack("<I", struct.pack("<f", v))[0]), "float32")


def _smem_weight_index(q, v, j, dim: int):
    """Where v3's weight_smem layout keeps weight element q * 16 + v * 4 + j (chunk q, 16-byte piece v):
    the pieces v of consecutive chunks are adjacent, so the lanes of a row read without bank conflicts."""
    return (v * (dim // VEC) + q) * 4 + j


def kernel_supports(fmt: KVCacheFormat, rope_dim: int, interleaved: bool) -> str | None:
    """None when the kernel handles this configuration, else why not (the wrapper raises it)."""
    dim = fmt.dim
    if dim % VEC or (dim // VEC) & (dim // VEC - 1) or dim // VEC > 32:
        return f"dim={dim} must be 16 x a power of two <= 32"
    if fmt.group_size not in (0, VEC, 2 * VEC):
        return f"group_size={fmt.group_size} must be {VEC} or {2 * VEC}"
    if rope_dim % (2 * VEC if not interleaved else VEC):
        return f"rope_dim={rope_dim} must be a multiple of {2 * VEC if not interleaved else VEC}"
    if not interleaved and (dim - rope_dim) % rope_dim:
        return f"half-split RoPE needs (dim - rope_dim) % rope_dim == 0, got dim={dim} rope_dim={rope_dim}"
    return None


def make_row_store(fmt: KVCacheFormat, rope_dim: int, interleaved: bool, hadamard: bool,
                   has_out_norm: bool, rows_per_block: int, weight_dtype: str,
                   weight_in_registers: bool = False, fast: bool = False, chunks: int = 1,
                   e2m1_fma: bool = False, e2m1_bf16x2: bool = False, scale_mul: bool = False,
                   inv_table: bool = False, e2m1_noclamp: bool = False, weight_in_shared: bool = False,
                   rope_spread: bool = False, amax_bf16x2: bool = False, rcp_norm: bool = False,
                   hadamard_mma: bool = False, pred_store: bool = False, rstd_first: bool = False):
    """The per-row pipeline as a ``@T.macro`` (see the module docstring for the lane layout).

    Macro arguments: ``x`` local FP32 [chunks * 16]: this lane's chunks of the BF16 input row, chunk
    ``c`` (elements ``q*16 .. q*16+15`` with ``q = lane + c * lanes``, ``lanes = dim / 16 / chunks``) at
    ``x[c*16 : c*16+16]``; ``lane`` in [0, lanes), the tensors ``weight`` [dim], ``cos``/``sin``
    [max_pos, rope_dim/2] fp32, ``cache`` flat uint8 [cache_bytes], ``out_norm`` [*, dim] bf16,
    scalars ``position``, ``slot`` (int64), ``row_ok`` (the row exists), ``out_row``, ``max_pos``,
    ``capacity`` (slots in the cache), ``eps`` (fp32). Every lane of the row must call it (it
    shuffles); rows with a bad slot or position are not stored (out_norm is still written).
    With ``weight_in_registers`` the ``weight`` argument is instead a local FP32 [chunks * 16] buffer
    already holding ``float(w)`` of this lane's channels (a kernel that stores several rows per thread
    loads and converts it once). With ``weight_in_shared`` it is a shared FP32 [dim] buffer holding
    ``float(w)`` in the layout of ``_smem_weight_index``, read where the norm uses it.
    ``fast`` (kv_store's v2 / v3; compress_store keeps the default, v1's exact code): the sum of squares
    lets nvcc contract ``ss + x*x`` into one FFMA (bitwise the same: x is BF16-valued, so x*x has at
    most 16 significant bits and is exact in FP32), and a BF16 row stores the BF16 words that the last
    stage already rounded (no widen / re-round / byte split).
    ``chunks`` > 1 (kv_store's v3): a lane holds ``chunks`` chunks ``lanes`` apart, so the pairwise
    halving of the RMS partial sums (and the Hadamard's widest butterflies) with a distance of at least
    ``lanes`` chunks happen inside the lane, in the contract's order, and the per-lane costs (norm
    scalars, index math, the RoPE lanes' idle time) are paid once per ``chunks`` chunks.
    ``e2m1_fma`` (v3): e2m1 codes from one FFMA on z2 = 2z and funnel-shift packing (7 SASS per
    element instead of 10; see the cast stage).
    ``e2m1_bf16x2`` (v3 option, UE8M0 e2m1 only, i.e. FP4 index rows; the kernel must declare
    ``BF16X2_PRELUDE``): the cast reads the last stage's packed BF16 pairs. A power-of-two scale makes
    z = y / sf exact, so the scale comes from amax's bits (no division), the codes from one BF16x2 FMA
    per pair, and 8 codes pack into a word with 3 byte permutes (see the cast stage). After the Hadamard,
    whose last rounding may pair any two values, a word holds elements (k, k + 4) of an 8-element group
    (k = 0, 2, 1, 3 in its four words) and 8 codes pack with 2 byte permutes, 2 sign-replicating permutes
    (``tl_kvs_sign_bytes``) and 4 logic ops (1446 -> 1376 SASS per thread at R = 2, the same bytes).
    ``scale_mul`` (v3 option, e4m3 scales, i.e. FP4 main rows): ``amax * RN(1/6)`` instead of the IEEE
    division ``amax / 6`` before the e4m3 rounding (equal for every BF16-valued amax, which the cast
    input always is: tests/test_kv_store.py checks all of them).
    ``inv_table`` (v3 option, e4m3 scales with ``e2m1_fma``, i.e. FP4 main rows; the kernel must declare
    ``INV_E4M3_PRELUDE``): 2 / sf read from a 128-entry table indexed by the scale's e4m3 byte (the
    IEEE quotient, computed on the host) instead of an IEEE division per scale group: no reciprocal
    fix-up and no call into the division's slow path (which made nvcc spill registers around it).
    ``e2m1_noclamp`` (v3 option with ``inv_table``): the e2m1 encode skips the clamp of |2z| to 12 when
    every lane of the warp has a normal, unclamped scale (see the cast stage), one instruction less
    per element.
    ``rope_spread`` (v3 option; rows whose rotated chunks sit in fewer lanes than the row has, i.e. the
    512-wide main rows): the lanes holding rotated chunks put them in shared memory, every lane of the
    row rotates ``rope_dim / 2 / lanes`` pairs (the same IEEE products and sum, then the BF16 rounding)
    and the holders read the results back (__syncwarp between): the warp pays a few pairs of RoPE per
    row instead of a whole 16-element chunk while three quarters of its lanes wait. The kernel must not
    insert block barriers of its own (TL_DISABLE_THREAD_STORAGE_SYNC).
    ``amax_bf16x2`` (v3 option, main rows cast to e4m3 / e2m1; the kernel must declare
    ``AMAX_PRELUDE``): a chunk's amax from its packed BF16 words (7 max.xorsign.abs.bf16x2, then the two
    halves) instead of 16 FP32 maxima: the same number (the cast input is BF16, a max picks one of them).
    ``rcp_norm`` (v3 option): the norm's 1 / sqrt(.) as rcp.rn instead of the IEEE division 1 / s (both
    RN(1 / s)).
    ``hadamard_mma`` (v3 option, index rows with the Hadamard, 4 lanes a row; the kernel must declare
    ``HMMA_PRELUDE``): the Hadamard's sums over 4 of the 7 index bits on the tensor cores (16 BF16 x +-1
    products a sum, FP32 accumulate, no shuffles), chained over 1 or 2 more (``HMMA_CHAIN``: each MMA adds
    to the last one's FP32 result), the other bits as FP32 butterflies in the lane. The
    SPEC fixes FP32 sums but not their order, and the tensor core's accumulator is not IEEE FP32 addition,
    so the sums may differ from the reference's butterflies in their last bits; issue #4 allows the codes
    and scales that this moves one step, in at most 0.1% of them (the GPU tests check that). On the H200,
    1M rows: randn rows no byte apart, rows spread over 24 binades 18 of 67M. Exact sums are bitwise.
    ``tests.test_kv_store.hadamard_mma_model`` (the 16-term sums exact, rounded once) approximates the
    order: the CPU emulator's stand-in for the MMA, not the hardware's rounding.
    ``pred_store`` (v3 option; the kernel must declare ``PRED_STORE_PRELUDE``): the cache stores as
    predicated st.global (inline PTX) instead of a branch around them, so that a thread's R rows are one
    basic block and ptxas may overlap one row's latencies with the next row's work.
    ``rstd_first`` (with ``pred_store``): the caller computes every row's rstd with ``norm_rstd`` (returned
    as ``row_store.norm_rstd``) before the first ``row_store`` and passes it in place of ``eps``: the IEEE
    sqrt / division (branches to their slow paths) then come before the rows' work, which stays one block.
    """
    C = chunks
    dim = fmt.dim
    lanes = dim // VEC // C  # lanes per row
    log_lanes = lanes.bit_length() - 1
    rope0 = dim - rope_dim  # first rotated channel
    half = rope_dim // 2
    kind = fmt.data_dtype
    e2m1_fma = e2m1_fma and kind == "e2m1"
    group = fmt.group_size
    lanes_per_group = max(1, group // VEC)  # chunks per scale group (a group pair is lanes q, q ^ 1)
    e2m1_bf16x2 = e2m1_bf16x2 and option_applies("e2m1_bf16x2", fmt)
    scale_mul = scale_mul and option_applies("scale_mul", fmt)
    inv_table = inv_table and option_applies("inv_table", fmt)
    e2m1_noclamp = e2m1_noclamp and option_applies("e2m1_noclamp", fmt)
    amax_bf16x2 = amax_bf16x2 and option_applies("amax_bf16x2", fmt)
    hadamard_mma = hadamard and hadamard_mma and hadamard_mma_fits(fmt, C)
    assert not hadamard_mma or HMMA_CHAIN in (1, 2, 4), HMMA_CHAIN  # whole groups of the 4 A-tiles
    assert not e2m1_noclamp or inv_table, "e2m1_noclamp tests the scale byte and amax / 6 of inv_table"
    assert not inv_table or e2m1_fma, "the table holds 2 / sf, the scale e2m1_fma multiplies by"
    # e2m1_bf16x2 after the Hadamard: its final BF16 rounding pairs elements (k, k + 4) (see the docstring)
    cast_pairs_k4 = e2m1_bf16x2 and hadamard
    if e2m1_bf16x2:
        floor16 = struct.unpack("<I", struct.pack("<f", fmt.amax_floor))[0]
        assert fmt.qmax == 6.0 and lanes_per_group == 2 and floor16 & 0xFFFF == 0, fmt  # a BF16 floor
        floor16 >>= 16
    out_bytes = {"e4m3": VEC, "e2m1": VEC // 2, "bf16": 2 * VEC}[kind]  # bytes per chunk
    store_vec = min(16, out_bytes)  # bytes per vector store
    if fmt.block_sections and (rows_per_block * fmt.row_bytes) % store_vec:
        store_vec = 4  # e.g. FP4 index blocks of an odd row count are only 4-byte aligned (68 B rows)
    wvec = 8 if weight_dtype == "bfloat16" else 4  # 16-byte loads
    # chunks c that hold rotated channels in some lane (the others never branch into RoPE)
    rope_c0 = min(c for c in range(C) if (c + 1) * lanes * VEC > rope0)
    npl = half // lanes  # rope_spread: pairs per lane
    # (a rope_dim whose pairs do not split evenly over the row's lanes, e.g. 48, keeps the chunk-wise RoPE)
    rope_spread = rope_spread and option_applies("rope_spread", fmt) and half >= lanes and half % lanes == 0
    assert not rope_spread or fast, "rope_spread is a v3 option"
    pred_store = pred_store and fast and C > 1  # (v3's layouts)
    assert C in (1, 2, 4) and (C == 1 or (fast and lanes >= 2 and (interleaved or half // VEC < lanes))), \
        (C, lanes, fast)

    @T.macro
    def round_to_bf16(z, y, yb, c0, nc):
        """y[j] = float(bf16_rne(z[j])) for chunks c0 .. c0+nc-1, leaving the BF16 values in yb. One
        cvt.rn.bf16x2.f32 per pair; each half widens back from the packed 32-bit word with one shift or
        one mask (instead of a 16-bit extract, a mask and a shift per element)."""
        for c in T.unroll(nc):
            for j in T.vectorized(VEC):
                yb[(c0 + c) * VEC + j] = T.Cast("bfloat16", z[(c0 + c) * VEC + j])
        pk = T.view(yb, [C * VEC // 2], "uint32")
        for j in T.unroll(nc * VEC // 2):
            y[c0 * VEC + 2 * j] = T.reinterpret(pk[c0 * VEC // 2 + j] << T.uint32(16), "float32")
            y[c0 * VEC + 2 * j + 1] = T.reinterpret(pk[c0 * VEC // 2 + j] & T.uint32(0xFFFF0000), "float32")

    def slot_bases(s):
        """(data, scale) byte offsets of slot s's row in the flat cache (SPEC 2: per-row formats keep the
        scales after the row's data, block-section formats after the block's rows)."""
        if fmt.block_sections:
            blk = T.Cast("int64", s // rows_per_block) * (rows_per_block * fmt.row_bytes)
            return (blk + (s % rows_per_block) * fmt.data_bytes,
                    blk + rows_per_block * fmt.data_bytes + (s % rows_per_block) * fmt.scale_bytes)
        return T.Cast("int64", s) * fmt.row_bytes, T.Cast("int64", s) * fmt.row_bytes + fmt.data_bytes

    def rope_pair_channels(p):
        """rope_spread: the channels (less rope0) of RoPE pair p, a and b: (2p, 2p + 1) interleaved, (p, p +
        half) half-split."""
        return (2 * p, 2 * p + 1) if interleaved else (p, p + half)

    def amax_over_6(amax):
        """An e4m3 scale's quotient before its rounding: RN(amax * RN(1/6)) with scale_mul, else amax / 6."""
        return T.ieee_mul(amax, _f32(1.0 / 6.0)) if scale_mul else T.ieee_fdiv(amax, _f32(6.0))

    def reciprocal(v):
        """The norm's RN(1 / v): rcp.rn with rcp_norm (the shorter sequence, no general division), else the
        IEEE division."""
        return T.ieee_frcp(v) if rcp_norm else T.ieee_fdiv(_f32(1.0), v)

    def make_encode_e2m1(clamp):
        @T.macro
        def encode(y, words, c, inv):
            """e2m1_fma's codes of chunk c (8 per word): clamp |z2| to 12 unless ``clamp`` is off."""
            for w in T.unroll(VEC // 8):
                for k in T.unroll(8):
                    z2 = T.ieee_mul(y[c * VEC + 8 * w + k], inv)
                    mag2 = T.min(T.abs(z2), _f32(12.0)) if clamp else T.abs(z2)
                    fb = T.max(T.reinterpret(mag2 if clamp else z2, "uint32") & T.uint32(0x7F800000),
                               T.uint32(0x40000010))
                    tb = T.reinterpret(T.ieee_fmaf(
                        T.reinterpret(fb + (fb >> T.uint32(22)), "float32"), _f32(2.0 ** 22),
                        mag2), "uint32")
                    if k == 0:
                        words[c * (VEC // 8) + w] = tb << T.uint32(28)
                    else:
                        words[c * (VEC // 8) + w] = T.call_extern(
                            "uint32", "__funnelshift_r", words[c * (VEC // 8) + w], tb, 4)
                    words[c * (VEC // 8) + w] = (words[c * (VEC // 8) + w] | (
                        T.reinterpret(z2, "uint32") & T.uint32(0x80000000)))
        return encode

    encode_e2m1 = make_encode_e2m1(True)
    encode_e2m1_noclamp = make_encode_e2m1(False)

    @T.macro
    def norm_rstd(x, out, idx, eps):
        """out[idx] = 1 / sqrt(sum(x^2) / dim + eps) of the row in x (every lane of the row calls it)."""
        ps = T.alloc_local([C], "float32")
        ss = T.alloc_var("float32")
        for c in T.unroll(C):
            ps[c] = T.float32(0)
            for i in T.unroll(VEC):
                if fast:
                    # exact product (BF16 x): an FFMA rounds like FMUL + FADD
                    ps[c] = ps[c] + x[c * VEC + i] * x[c * VEC + i]
                else:
                    ps[c] = ps[c] + T.ieee_mul(x[c * VEC + i], x[c * VEC + i])  # no FMA (torch's x * x)
        # pairwise halving at chunk distances >= lanes happens inside the lane (chunk c + C/2 is q + n/2)
        if C == 4:
            ps[0] = ps[0] + ps[2]
            ps[1] = ps[1] + ps[3]
        if C >= 2:
            ps[0] = ps[0] + ps[1]
        ss = ps[0]
        for k in T.unroll(log_lanes):
            ss = ss + T.shfl_xor(ss, lanes >> (k + 1))  # a + b == b + a: every lane gets the same sum
        out[idx] = reciprocal(T.ieee_fsqrt(T.ieee_add(T.ieee_mul(ss, _f32(1.0 / dim)), eps)))

    @T.macro
    def row_store(x, lane, weight, cos, sin, cache, out_norm, position, slot, row_ok, out_row, max_pos,
                  capacity, eps):
        wl = T.alloc_local([VEC], weight_dtype)
        y = T.alloc_local([C * VEC], "float32")
        z = T.alloc_local([C * VEC], "float32")
        oth = T.alloc_local([C * VEC], "float32")
        cs = T.alloc_local([C * VEC], "float32")
        sn = T.alloc_local([C * VEC], "float32")
        yb = T.alloc_local([C * VEC], "bfloat16")
        codes = T.alloc_local([VEC], "uint8")
        c32 = T.alloc_local([VEC], "uint32")
        words = T.alloc_local([C * VEC // 8], "uint32")
        if e2m1_bf16x2:
            aw = T.alloc_local([VEC // 2], "uint32")  # |y| pairs of one chunk (BF16 bits)
            tw = T.alloc_local([VEC // 2], "uint32")  # FMA results: code in the low nibble of each half
            e8 = T.alloc_var("uint32")
        if e2m1_bf16x2 or amax_bf16x2:
            a16 = T.alloc_var("uint32")
        f8 = T.alloc_local([C * VEC], "float8_e4m3fn")
        packed = T.alloc_local([out_bytes], "uint8")
        ps = T.alloc_local([C], "float32")
        sbv = T.alloc_local([C], "uint8")
        rstd = T.alloc_var("float32")
        amax = T.alloc_var("float32")
        sf = T.alloc_var("float32")
        inv = T.alloc_var("float32")
        sbyte = T.alloc_var("uint8")
        bits = T.alloc_var("uint32")

        # ---- cos / sin of the rotated chunks, loaded first so their latency overlaps the norm. The
        # position is clamped for the loads only (a bad position's row is not stored).
        if pred_store:  # (v3) one unsigned compare; the row is stored only when it holds
            pos = T.if_then_else(T.Cast("uint64", position) < T.Cast("uint64", max_pos),
                                 T.Cast("int32", position), 0)
        else:
            pos = T.min(T.max(T.Cast("int32", position), 0), max_pos - 1)
        if rope_spread:  # this lane's pairs lane * npl .. + npl - 1 (either convention: pair p, frequency p)
            for j in T.vectorized(npl):
                cs[j] = cos[pos, lane * npl + j]
            for j in T.vectorized(npl):
                sn[j] = sin[pos, lane * npl + j]
        for c in T.unroll(0 if rope_spread else C):
            if lane + c * lanes >= rope0 // VEC:
                if interleaved:  # this chunk's 8 pairs start at pair (q * 16 - rope0) / 2
                    for j in T.vectorized(VEC // 2):
                        cs[c * VEC + j] = cos[pos, ((lane + c * lanes) * VEC - rope0) // 2 + j]
                    for j in T.vectorized(VEC // 2):
                        sn[c * VEC + j] = sin[pos, ((lane + c * lanes) * VEC - rope0) // 2 + j]
                else:  # a chunk of either half uses pairs (q * 16 - rope0) % half .. + 15
                    for j in T.vectorized(VEC):
                        cs[c * VEC + j] = cos[pos, ((lane + c * lanes) % (half // VEC)) * VEC + j]
                    for j in T.vectorized(VEC):
                        sn[c * VEC + j] = sin[pos, ((lane + c * lanes) % (half // VEC)) * VEC + j]

        # ---- RMSNorm: FP32 sum of squares in the contract's order, y = bf16(x * rstd * w)
        if rstd_first:
            rstd = eps  # the caller ran norm_rstd first: the eps argument is this row's rstd
        else:
            rinv = T.alloc_local([1], "float32")
            norm_rstd(x, rinv, 0, eps)
            rstd = rinv[0]
        if weight_in_shared:
            for c in T.unroll(C):
                for v in T.unroll(VEC // 4):
                    for j in T.unroll(4):
                        z[c * VEC + v * 4 + j] = T.ieee_mul(T.ieee_mul(x[c * VEC + v * 4 + j], rstd), weight[
                            _smem_weight_index(lane + c * lanes, v, j, dim)])
        elif weight_in_registers:
            for i in T.unroll(C * VEC):
                z[i] = T.ieee_mul(T.ieee_mul(x[i], rstd), weight[i])
        else:
            for c in T.unroll(C):
                for v in T.unroll(VEC // wvec):
                    for i in T.vectorized(wvec):
                        wl[v * wvec + i] = weight[(lane + c * lanes) * VEC + v * wvec + i]
                for i in T.unroll(VEC):
                    z[c * VEC + i] = T.ieee_mul(T.ieee_mul(x[c * VEC + i], rstd), T.Cast("float32", wl[i]))
        round_to_bf16(z, y, yb, 0, C)
        if has_out_norm:
            if row_ok:
                for c in T.unroll(C):
                    for v in T.unroll(2):
                        for i in T.vectorized(8):
                            out_norm[out_row, (lane + c * lanes) * VEC + v * 8 + i] = yb[c * VEC + v * 8 + i]

        # ---- RoPE on channels [rope0, dim)
        if rope_spread:
            rbuf = T.alloc_shared([THREADS // lanes, rope_dim], "float32")  # the rotated channels by row
            rr = T.get_thread_binding() // lanes
            for ci in T.unroll(C - rope_c0):
                if lane + (rope_c0 + ci) * lanes >= rope0 // VEC:
                    for j in T.vectorized(VEC):
                        rbuf[rr, (lane + (rope_c0 + ci) * lanes) * VEC - rope0 + j] = y[
                            (rope_c0 + ci) * VEC + j]
            T.sync_warp()
            # pair p = lane * npl + j: channels (2p, 2p + 1) interleaved, (p, p + half) half-split; a * cos -
            # b * sin and a * sin + b * cos as IEEE products and sum (the two layouts' formulas), then BF16
            for j in T.unroll(npl):
                ia, ib = rope_pair_channels(lane * npl + j)
                z[2 * j] = T.ieee_sub(T.ieee_mul(rbuf[rr, ia], cs[j]), T.ieee_mul(rbuf[rr, ib], sn[j]))
                z[2 * j + 1] = T.ieee_add(T.ieee_mul(rbuf[rr, ia], sn[j]), T.ieee_mul(rbuf[rr, ib], cs[j]))
            for j in T.unroll(npl):
                ia, ib = rope_pair_channels(lane * npl + j)
                rbuf[rr, ia] = T.Cast("float32", T.Cast("bfloat16", z[2 * j]))
                rbuf[rr, ib] = T.Cast("float32", T.Cast("bfloat16", z[2 * j + 1]))
            T.sync_warp()
            for ci in T.unroll(C - rope_c0):
                if lane + (rope_c0 + ci) * lanes >= rope0 // VEC:
                    for j in T.vectorized(VEC):
                        y[(rope_c0 + ci) * VEC + j] = rbuf[
                            rr, (lane + (rope_c0 + ci) * lanes) * VEC - rope0 + j]
                    for j in T.vectorized(VEC):
                        yb[(rope_c0 + ci) * VEC + j] = T.Cast("bfloat16", y[(rope_c0 + ci) * VEC + j])
        for ci in T.unroll(0 if rope_spread else C - rope_c0):
            c = rope_c0 + ci
            if not interleaved:
                for k in T.unroll(VEC):  # every lane shuffles (no divergence before a shuffle)
                    oth[c * VEC + k] = T.shfl_xor(y[c * VEC + k], half // VEC)
            if lane + c * lanes >= rope0 // VEC:
                if interleaved:
                    for j in T.unroll(VEC // 2):
                        z[c * VEC + 2 * j] = T.ieee_sub(T.ieee_mul(y[c * VEC + 2 * j], cs[c * VEC + j]),
                                                        T.ieee_mul(y[c * VEC + 2 * j + 1], sn[c * VEC + j]))
                        z[c * VEC + 2 * j + 1] = T.ieee_add(
                            T.ieee_mul(y[c * VEC + 2 * j], sn[c * VEC + j]),
                            T.ieee_mul(y[c * VEC + 2 * j + 1], cs[c * VEC + j]))
                else:
                    if ((lane + c * lanes) * VEC - rope0) < half:  # this chunk holds a, the partner b
                        for j in T.unroll(VEC):
                            z[c * VEC + j] = T.ieee_sub(T.ieee_mul(y[c * VEC + j], cs[c * VEC + j]),
                                                        T.ieee_mul(oth[c * VEC + j], sn[c * VEC + j]))
                    else:  # this chunk holds b, the partner a
                        for j in T.unroll(VEC):
                            z[c * VEC + j] = T.ieee_add(T.ieee_mul(oth[c * VEC + j], sn[c * VEC + j]),
                                                        T.ieee_mul(y[c * VEC + j], cs[c * VEC + j]))
                round_to_bf16(z, y, yb, c, 1)

        # ---- Hadamard (H_n x) * n**-0.5: butterflies h = 1..8 inside a chunk, then across lanes, then
        # (chunks > 1) across this lane's chunks: ascending h, the reference's order
        if hadamard and hadamard_mma:
            # Element e = 64 c + 16 lane + j of the row sits in this lane's chunk c at j; H_128's sign
            # (-1)^popcount(e & f) factors over e's bits. mma.m16n8k16 (B: H_16) sums over 4 bits: its k
            # (and n) bits 0, 1-2, 3 are e's bits 0 (the BF16 pair), 4-5 (the lane: A's and D's column
            # quad), 1 (a0 / a2 of A, the n-tile t of D), with the same sign (-1)^popcount(k & n), so B is
            # H_16 as it stands. A tile fixes e's bits 2, 3, 6: bits 2, 3 are a (pairs 2 a, 2 a + 1 of a
            # chunk), bit 6 the chunk, which is the MMA row: chunk 0 in row g (the quad's index), chunk 1 in
            # row g + 8 (A's independent rows: one MMA serves both chunks). D's d0, d1 (d2, d3) are elements
            # j = 4 a + 2 t + 0 / 1 of chunk 0 (1). Chaining HMMA_CHAIN tiles (B's sign per tile) sums bit 2
            # (and 3) in the MMAs too; the butterflies h = 4, 8, 16 over y then finish the rest of bits 2, 3,
            # 6 (ascending, as the reference).
            hw = T.view(yb, [C * VEC // 2], "uint32")
            for t in T.unroll(2):
                T.call_extern("handle", f"tl_kvs_hmma_chain<{HMMA_CHAIN}>", T.address_of(y[0]),
                              T.address_of(hw[0]), t)
            for s in T.unroll(HMMA_CHAIN.bit_length() - 1, 3):
                for q in T.unroll(C * VEC // 2):
                    z[(q >> (s + 2)) * (8 << s) + (q & ((4 << s) - 1))] = (
                        y[(q >> (s + 2)) * (8 << s) + (q & ((4 << s) - 1))]
                        + y[(q >> (s + 2)) * (8 << s) + (q & ((4 << s) - 1)) + (4 << s)])
                    z[(q >> (s + 2)) * (8 << s) + (q & ((4 << s) - 1)) + (4 << s)] = (
                        y[(q >> (s + 2)) * (8 << s) + (q & ((4 << s) - 1))]
                        - y[(q >> (s + 2)) * (8 << s) + (q & ((4 << s) - 1)) + (4 << s)])
                for j in T.unroll(C * VEC):
                    y[j] = z[j]
        elif hadamard:
            for c in T.unroll(C):
                for s in T.unroll(4):
                    for q in T.unroll(VEC // 2):
                        z[c * VEC + (q >> s) * (2 << s) + (q & ((1 << s) - 1))] = (
                            y[c * VEC + (q >> s) * (2 << s) + (q & ((1 << s) - 1))]
                            + y[c * VEC + (q >> s) * (2 << s) + (q & ((1 << s) - 1)) + (1 << s)])
                        z[c * VEC + (q >> s) * (2 << s) + (q & ((1 << s) - 1)) + (1 << s)] = (
                            y[c * VEC + (q >> s) * (2 << s) + (q & ((1 << s) - 1))]
                            - y[c * VEC + (q >> s) * (2 << s) + (q & ((1 << s) - 1)) + (1 << s)])
                    for j in T.unroll(VEC):
                        y[c * VEC + j] = z[c * VEC + j]
            for s in T.unroll(log_lanes):
                for j in T.unroll(C * VEC):
                    oth[j] = T.shfl_xor(y[j], 1 << s)
                # lo lane: y + oth; hi lane: oth - y. Written as oth + y * (+-1): y * (+-1) is exact,
                # so even a contracted FMA gives the reference's rounded sum (FP32 add commutes)
                sgn = T.if_then_else((lane & (1 << s)) == 0, _f32(1.0), _f32(-1.0))
                for j in T.unroll(C * VEC):
                    y[j] = oth[j] + y[j] * sgn
            for s in T.unroll(C.bit_length() - 1):  # chunk c pairs with c + 2^s (distance 2^s * lanes)
                for q in T.unroll(C // 2):
                    for j in T.unroll(VEC):
                        z[((q >> s) * (2 << s) + (q & ((1 << s) - 1))) * VEC + j] = (
                            y[((q >> s) * (2 << s) + (q & ((1 << s) - 1))) * VEC + j]
                            + y[((q >> s) * (2 << s) + (q & ((1 << s) - 1)) + (1 << s)) * VEC + j])
                        z[((q >> s) * (2 << s) + (q & ((1 << s) - 1)) + (1 << s)) * VEC + j] = (
                            y[((q >> s) * (2 << s) + (q & ((1 << s) - 1))) * VEC + j]
                            - y[((q >> s) * (2 << s) + (q & ((1 << s) - 1)) + (1 << s)) * VEC + j])
                for j in T.unroll(C * VEC):
                    y[j] = z[j]
        if hadamard:  # either form: times the FP32 constant n**-0.5, then BF16
            for j in T.unroll(C * VEC):
                z[j] = T.ieee_mul(y[j], _f32(dim ** -0.5))
            if cast_pairs_k4:
                # only the cast reads the result, from yb's words: word 4 w + q of a chunk holds elements
                # (k, k + 4) of its 8-group w, k = 0, 2, 1, 3 for q = 0 .. 3 (one cvt.rn.bf16x2 each)
                kw = T.view(yb, [C * VEC // 2], "uint32")
                for c in T.unroll(C):
                    for w in T.unroll(VEC // 8):
                        for q in T.unroll(4):  # k = 0, 2, 1, 3 = (q % 2) * 2 + q // 2
                            kw[c * VEC // 2 + 4 * w + q] = T.call_extern(
                                "uint32", "tl_kvs_f2bf16x2", z[c * VEC + 8 * w + (q % 2) * 2 + q // 2],
                                z[c * VEC + 8 * w + (q % 2) * 2 + q // 2 + 4])
            else:
                round_to_bf16(z, y, yb, 0, C)

        # ---- cast: one scale per group (a group spans 2 chunks q, q ^ 1 of lanes lane, lane ^ 1, or
        # is one 16-element chunk)
        for c in T.unroll(C):
            if kind == "bf16" and fast:
                pass  # yb already holds the last stage's BF16 row (stored from yb below)
            elif e2m1_bf16x2:
                # The cast input y is BF16 and sf = 2^(e - 127) (UE8M0), so z2 = 2 y / sf is exact in
                # BF16 (the reference's FP32 z = y * (1 / sf) is the same number; a z below 2^-126 has
                # code 0 with its sign either way) and |z| <= 6: RN(amax / 6) of a BF16 amax is never
                # rounded down onto a power of two, so sf >= amax / 6 and the clamp to 6 is a no-op.
                yw = T.view(yb, [C * VEC // 2], "uint32")
                for j in T.unroll(VEC // 2):
                    aw[j] = yw[c * VEC // 2 + j] & T.uint32(0x7FFF7FFF)
                # amax over the chunk's pairs (BF16 max of non-negative values), then of the 2 halves
                a16 = aw[0]
                for j in T.unroll(VEC // 2 - 1):
                    a16 = T.call_extern("uint32", "tl_kvs_bf16x2_max", a16, aw[j + 1])
                a16 = T.max(a16 & T.uint32(0xFFFF), a16 >> T.uint32(16))
                a16 = T.max(a16, T.shfl_xor(a16, 1))  # the group's other half is the next lane
                a16 = T.max(a16, T.uint32(floor16))
                # bits(sf) = (bits(RN(amax / 6)) + 0x7FFFFF) & 0x7F800000 equals, for every FP32 amax,
                # ((bits(amax) + 0x3FFFFF) & 0x7F800000) - (2 << 23): amax / 6 = 2^(E-3) * 4m/3 rounds up
                # to 2^(E-2) when m <= 1.5, else to 2^(E-1) (tests: every BF16 amax). In BF16 bits:
                e8 = ((a16 + T.uint32(0x3F)) >> T.uint32(7)) - T.uint32(2)  # biased exponent of sf
                if C > 1:
                    sbv[c] = T.Cast("uint8", e8)
                else:
                    sbyte = T.Cast("uint8", e8)
                # t = |y| * (2 / sf) + M in one BF16x2 FMA (exact product, one RNE) with M's bits
                # (E' + 6) << 7 | 2 (E' - 128), E' = max(exponent of z2, 128): ulp(M) = 1 / 2 / 4 is the
                # e2m1 grid on |z2| (|z| < 2 / < 4 / >= 4) and M's mantissa 0 / 2 / 4 adds the codes of
                # |z| = 0 / 2 / 4, so t's mantissa (<= 7) is the code (ties to even: M's is even).
                # With G = max(bits(|y|) & 0x7F80, e << 7) = (E' - 128 + e) << 7 per half: bits(M) =
                # G + (G >> 6) + (128 - e) * 130 + 512 (the per-half sums stay in [0, 2^16), so one
                # 32-bit add serves both halves even when the constant is negative)
                for j in T.unroll(VEC // 2):
                    g2 = T.call_extern("uint32", "__vmaxu2", aw[j] & T.uint32(0x7F807F80),
                                       (e8 << T.uint32(7)) * T.uint32(0x10001))
                    tw[j] = T.call_extern(
                        "uint32", "tl_kvs_bf16x2_fma", aw[j], ((T.uint32(255) - e8) << T.uint32(7))
                        * T.uint32(0x10001),
                        g2 + (g2 >> T.uint32(6)) + (T.uint32(17152) - e8 * T.uint32(130)) * T.uint32(0x10001))
                if cast_pairs_k4:
                    # pack (words q = 0 .. 3 of group w hold elements (0, 4), (2, 6), (1, 5), (3, 7)): the
                    # code bytes of elements 0, 2, 4, 6 and of 1, 3, 5, 7 (PRMT), each OR the signs of y
                    # (sign-replicating PRMT of its BF16 high bytes, bit 3 kept), then nibble k = element k
                    for w in T.unroll(VEC // 8):
                        pe = T.call_extern("uint32", "__byte_perm", tw[4 * w], tw[4 * w + 1],
                                           T.uint32(0x6240))
                        po = T.call_extern("uint32", "__byte_perm", tw[4 * w + 2], tw[4 * w + 3],
                                           T.uint32(0x6240))
                        pe = pe | (T.call_extern("uint32", "tl_kvs_sign_bytes", yw[c * VEC // 2 + 4 * w],
                                                 yw[c * VEC // 2 + 4 * w + 1]) & T.uint32(0x08080808))
                        po = po | (T.call_extern("uint32", "tl_kvs_sign_bytes", yw[c * VEC // 2 + 4 * w + 2],
                                                 yw[c * VEC // 2 + 4 * w + 3]) & T.uint32(0x08080808))
                        words[c * (VEC // 8) + w] = ((pe & T.uint32(0x0F0F0F0F))
                                                     | ((po << T.uint32(4)) & T.uint32(0xF0F0F0F0)))
                else:
                    # pack: bytes [code 2k, code 2k+1, ...] of 2 pairs (PRMT), the signs of y into bit 3 of
                    # each byte, then nibble pairs (byte i | byte i+1 << 4) and bytes 0, 2 of two such words
                    for w in T.unroll(VEC // 8):
                        for h in T.unroll(2):
                            pc = T.call_extern("uint32", "__byte_perm", tw[4 * w + 2 * h],
                                               tw[4 * w + 2 * h + 1], T.uint32(0x6420))
                            ps = T.call_extern("uint32", "__byte_perm", yw[c * VEC // 2 + 4 * w + 2 * h],
                                               yw[c * VEC // 2 + 4 * w + 2 * h + 1], T.uint32(0x7531))
                            pc = pc | ((ps >> T.uint32(4)) & T.uint32(0x08080808))
                            tw[4 * w + h] = ((pc & T.uint32(0x0F0F0F0F))
                                             | ((pc >> T.uint32(4)) & T.uint32(0xF0F0F0F0)))
                        words[c * (VEC // 8) + w] = T.call_extern("uint32", "__byte_perm", tw[4 * w],
                                                                  tw[4 * w + 1], T.uint32(0x6420))
            elif kind == "bf16":
                for j in T.unroll(VEC):
                    yb[j] = T.Cast("bfloat16", y[j])
                for j in T.unroll(VEC):
                    packed[2 * j] = T.Cast("uint8", T.reinterpret(yb[j], "uint16") & T.uint16(0xFF))
                    packed[2 * j + 1] = T.Cast("uint8", T.reinterpret(yb[j], "uint16") >> T.uint16(8))
            else:
                if amax_bf16x2:  # yb holds y's BF16 words (every stage leaves them there)
                    yw = T.view(yb, [C * VEC // 2], "uint32")
                    a16 = yw[c * VEC // 2]
                    for j in T.unroll(VEC // 2 - 1):  # max(|a|, |b|) per half (the sign is a ^ b: dropped)
                        a16 = T.call_extern("uint32", "tl_kvs_bf16x2_maxabs", a16, yw[c * VEC // 2 + j + 1])
                    amax = T.max(T.abs(T.reinterpret(a16 << T.uint32(16), "float32")),
                                 T.abs(T.reinterpret(a16 & T.uint32(0xFFFF0000), "float32")))
                else:
                    amax = T.float32(0)
                    for j in T.unroll(VEC):
                        amax = T.max(amax, T.abs(y[c * VEC + j]))
                if lanes_per_group == 2:
                    amax = T.max(amax, T.shfl_xor(amax, 1))  # the group's other half is the next lane
                amax = T.max(amax, _f32(fmt.amax_floor))
                if fmt.scale_dtype == "ue8m0":
                    # round amax / qmax up to a power of two by its bits; the byte is the biased exponent
                    bits = (T.reinterpret(T.ieee_fdiv(amax, _f32(fmt.qmax)), "uint32") + T.uint32(0x7FFFFF)
                            ) & T.uint32(0x7F800000)
                    sf = T.reinterpret(bits, "float32")
                    sbyte = T.Cast("uint8", bits >> T.uint32(23))
                    # 1 / 2^(e - 127) = 2^(127 - e): biased exponent 254 - e, exact (no division). The
                    # amax floor keeps e >= 1 and a BF16 amax keeps e <= 253, so the result is normal.
                    inv = T.reinterpret(T.uint32(0x7F000000 if not e2m1_fma else 0x7F800000) - bits,
                                        "float32")
                elif inv_table:
                    sf = amax_over_6(amax)
                    sbyte = T.reinterpret(T.Cast("float8_e4m3fn", T.min(sf, _f32(448.0))), "uint8")
                    inv = T.call_extern("float32", "tl_kvs_inv_e4m3", T.Cast("uint32", sbyte))  # 2 / sf
                else:
                    sf = T.Cast("float32", T.Cast("float8_e4m3fn", T.min(amax_over_6(amax), _f32(448.0))))
                    sbyte = T.reinterpret(T.Cast("float8_e4m3fn", sf), "uint8")
                    inv = T.ieee_fdiv(_f32(1.0 if not e2m1_fma else 2.0), sf)  # e2m1_fma: 2 / sf
                if C > 1:
                    sbv[c] = sbyte
                if kind == "e4m3":
                    # cvt.rn.satfinite saturates to +-448 (= the clamp of SPEC 2 for every non-NaN value)
                    # and keeps the sign of a zero result
                    for j in T.unroll(VEC):
                        z[c * VEC + j] = T.ieee_mul(y[c * VEC + j], inv)
                    for j in T.vectorized(VEC):  # pairs: cvt.rn.satfinite.e4m3x2.f32
                        f8[c * VEC + j] = T.Cast("float8_e4m3fn", z[c * VEC + j])
                    if not fast:  # (fast: stored straight from f8's words, no byte split / reassembly)
                        for j in T.unroll(VEC):
                            packed[j] = T.reinterpret(f8[j], "uint8")
                elif e2m1_fma:
                    # inv = 2 / sf (exactly 2 * RN(1 / sf)), so z2 = RN(y * inv) = 2z (both codes are 0
                    # with z's sign where 2z would differ, z subnormal). a = min(|z2|, 12); F =
                    # max(bits(a) & 0x7F800000, bits(2.0) | 16); t = float(F + (F >> 22)) * 2^22 + a in
                    # one FFMA (exact product, one RNE): float(F) * 2^22 has ulp 1 / 2 / 4, the e2m1
                    # grid on 2|z| for |z| < 2 / < 4 / >= 4, and F >> 22 adds whole grid steps equal to
                    # 0 / 2 / 4 mod 16, the codes of |z| = 0 / 2 / 4: bits(t) mod 16 is the code (ties
                    # to even: bits(F * 2^22) is even; the "| 16" is 0 mod 16 and keeps F + (F >> 22)
                    # one LEA.HI). Packing: word = (word >> 4) | (bits(t) << 28) as one funnel shift,
                    # then the sign into bit 31; after 8 elements nibble k is element k (tests: the
                    # torch port e2m1_words_kernel_expression_v3, exhaustive).
                    # e2m1_noclamp: when every lane of the warp has a normal e4m3 scale (byte >= 8) from an
                    # unclamped amax / 6 (<= 448), sf >= (amax / 6) (1 - 2^-4) bounds |z2| below 13 < 14,
                    # which the FFMA rounds to at most 12 (code 7): the clamp is a no-op and is skipped
                    # (a warp-uniform branch; tiny or huge groups take the clamped encode)
                    if e2m1_noclamp:
                        if T.call_extern("int32", "__all_sync", T.uint32(0xFFFFFFFF), T.Cast(
                                "int32", (sbyte >= T.uint8(8)) & (sf <= _f32(448.0)))) != 0:
                            encode_e2m1_noclamp(y, words, c, inv)
                        else:
                            encode_e2m1(y, words, c, inv)
                    else:
                        encode_e2m1(y, words, c, inv)
                else:
                    # e2m1 RNE without thresholds: a = min(|x|, 6); t = a + M rounds a to the grid of
                    # ulp(M) (RNE, one IEEE add): M = 2^22 (grid 0.5) below 2, 2^23 (grid 1) below 4,
                    # 2^24 (grid 2) above; then code = bits(t) - K with K = bits(M) - {0, 2, 4} (codes
                    # 0..4 = 0..2 in steps of .5, 5..6 = 3..4, 7 = 6). The sign bit is the input's.
                    for j in T.unroll(VEC):
                        z[c * VEC + j] = T.ieee_mul(y[c * VEC + j], inv)
                    if fast:
                        # the same M from a's exponent bits (no compares / selects): M = max(bits(a) &
                        # 0x7F800000, bits(1.0)) + (22 << 23) is 2^22 / 2^23 / 2^24 for a < 2 / < 4 / >= 4,
                        # and {0, 2, 4} = (bits(M) >> 22) - 298 (tests: exhaustive vs the reference codes)
                        for j in T.unroll(VEC):
                            mag = T.min(T.abs(z[c * VEC + j]), _f32(6.0))
                            mbits = T.max(T.reinterpret(mag, "uint32") & T.uint32(0x7F800000),
                                          T.uint32(0x3F800000)) + T.uint32(22 << 23)
                            c32[j] = (
                                (T.reinterpret(T.ieee_add(mag, T.reinterpret(mbits, "float32")), "uint32")
                                 - mbits + ((mbits >> T.uint32(22)) - T.uint32(298)))
                                | ((T.reinterpret(z[c * VEC + j], "uint32") >> T.uint32(28)) & T.uint32(8)))
                        # 8 codes per 32-bit word (disjoint nibbles: multiply-add == shift-or)
                        for w in T.unroll(VEC // 8):
                            words[c * (VEC // 8) + w] = c32[8 * w]
                            for k in T.unroll(7):
                                words[c * (VEC // 8) + w] = (
                                    words[c * (VEC // 8) + w]
                                    + c32[8 * w + k + 1] * T.uint32(1 << (4 * (k + 1))))
                    else:
                        for j in T.unroll(VEC):
                            mag = T.min(T.abs(z[j]), _f32(6.0))
                            codes[j] = T.Cast("uint8", (
                                T.reinterpret(T.ieee_add(mag, T.if_then_else(
                                    mag < _f32(2.0), _f32(2.0 ** 22),
                                    T.if_then_else(mag < _f32(4.0), _f32(2.0 ** 23), _f32(2.0 ** 24)))),
                                    "uint32")
                                - T.if_then_else(mag < _f32(2.0), T.uint32(0x4A800000),
                                                 T.if_then_else(mag < _f32(4.0), T.uint32(0x4B000000 - 2),
                                                                T.uint32(0x4B800000 - 4))))
                                | ((T.reinterpret(z[j], "uint32") >> T.uint32(28)) & T.uint32(8)))
                        for j in T.unroll(VEC // 2):
                            packed[j] = codes[2 * j] | (codes[2 * j + 1] << T.uint8(4))

        # ---- store at the slot (bad slots / positions are skipped, never written out of bounds)
        if pred_store:
            # predicated stores (no branch): the row's address from slot 0 when it is not stored
            # (unsigned compares: a negative slot or position is out of range; the wrapper keeps capacity
            # below 2^31, so a stored slot fits an int32 and only the block's byte offset needs 64 bits)
            ok = T.alloc_var("int32")  # one definition (the stores' predicates and the address)
            ok = T.Cast("int32", row_ok and T.Cast("uint64", slot) < T.Cast("uint64", capacity)
                        and T.Cast("uint64", position) < T.Cast("uint64", max_pos))
            ps32 = T.alloc_var("int32")
            ps32 = T.if_then_else(ok != 0, T.Cast("int32", slot), 0)
            pdata, pscale = slot_bases(ps32)
            src32 = T.view({"bf16": yb, "e4m3": f8}.get(kind, words), [C * out_bytes // 4], "uint32")
            for c in T.unroll(C):
                for v in T.unroll(out_bytes // store_vec):
                    # store_vec / 4 words (one st.global.v4 / v2 / b32)
                    T.call_extern("handle", f"tl_kvs_st{store_vec}_if",
                                  T.address_of(cache[pdata + (lane + c * lanes) * out_bytes + v * store_vec]),
                                  *[src32[(c * out_bytes + v * store_vec) // 4 + i]
                                    for i in range(store_vec // 4)],
                                  ok)
                if kind != "bf16":
                    if lanes_per_group == 2:
                        T.call_extern("handle", "tl_kvs_st1_if",
                                      T.address_of(cache[pscale + (lane + c * lanes) // 2]),
                                      sbv[c], ok & T.Cast("int32", lane % 2 == 0))
                    else:
                        T.call_extern("handle", "tl_kvs_st1_if",
                                      T.address_of(cache[pscale + lane + c * lanes]),
                                      sbv[c], ok)
        elif row_ok and slot >= 0 and slot < capacity and position >= 0 and position < max_pos:
            data_base, scale_base = slot_bases(slot)
            for c in T.unroll(C):
                if fast:
                    if kind == "bf16":
                        src8 = T.view(yb, [C * out_bytes], "uint8")
                    elif kind == "e4m3":
                        src8 = T.view(f8, [C * out_bytes], "uint8")
                    else:
                        src8 = T.view(words, [C * out_bytes], "uint8")
                    for v in T.unroll(out_bytes // store_vec):
                        for i in T.vectorized(store_vec):
                            cache[data_base + (lane + c * lanes) * out_bytes + v * store_vec + i] = \
                                src8[c * out_bytes + v * store_vec + i]
                else:
                    for v in T.unroll(out_bytes // store_vec):
                        for i in T.vectorized(store_vec):
                            cache[data_base + lane * out_bytes + v * store_vec + i] = \
                                packed[v * store_vec + i]
                if kind != "bf16":
                    if lanes_per_group == 2:
                        if lane % 2 == 0:
                            cache[scale_base + (lane + c * lanes) // 2] = sbv[c] if C > 1 else sbyte
                    else:
                        cache[scale_base + lane + c * lanes] = sbv[c] if C > 1 else sbyte

    row_store.norm_rstd = norm_rstd
    return row_store

@tilelang.jit
def kv_store_kernel(fmt_name: str, rope_dim: int, interleaved: bool, hadamard: bool, has_out_norm: bool,
                    rows_per_block: int, weight_dtype: str, pos_dtype: str, slot_dtype: str,
                    rows_per_thread: int = 1):
    """Variant v1 (see ``_kv_store_prim``)."""
    return _kv_store_prim(fmt_name, rope_dim, interleaved, hadamard, has_out_norm, rows_per_block,
                          weight_dtype, pos_dtype, slot_dtype, rows_per_thread, fast=False)


@tilelang.jit
def kv_store_kernel_v2(fmt_name: str, rope_dim: int, interleaved: bool, hadamard: bool, has_out_norm: bool,
                       rows_per_block: int, weight_dtype: str, pos_dtype: str, slot_dtype: str,
                       rows_per_thread: int = 1):
    """Variant v2: v1's layout with ``make_row_store(fast=True)`` (fewer instructions, same bytes)."""
    return _kv_store_prim(fmt_name, rope_dim, interleaved, hadamard, has_out_norm, rows_per_block,
                          weight_dtype, pos_dtype, slot_dtype, rows_per_thread, fast=True)


# v3's store guard is `slot < capacity` (a host-computed argument), which TileLang cannot relate to the
# cache's extent: its safe-memory pass would then split every vector store into guarded byte stores.
# Every access is guarded or clamped by hand (see make_row_store), so the pass is off for v3. Its shared
# memory (weight_smem, rope_spread) is synchronized by hand too (one __syncthreads after the weights,
# __syncwarp around a row's RoPE exchange), so TileLang's automatic barriers are off as well, and so is its
# shared-memory reuse: the weights' last read in one warp is no barrier for the others (with R = 1 the
# planner put the RoPE buffer over the weights while other warps still read them; CPU emulator).
@tilelang.jit(pass_configs={tilelang.PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True,
                             tilelang.PassConfigKey.TL_DISABLE_THREAD_STORAGE_SYNC: True,
                             tilelang.PassConfigKey.TL_DISABLE_SHARED_MEMORY_REUSE: True})
def kv_store_kernel_v3(fmt_name: str, rope_dim: int, interleaved: bool, hadamard: bool, has_out_norm: bool,
                       rows_per_block: int, weight_dtype: str, pos_dtype: str, slot_dtype: str,
                       rows_per_thread: int = 1, chunks: int = 2, min_ctas: int = 0,
                       e2m1_bf16x2: bool = False, scale_mul: bool = False, inv_table: bool = False,
                       e2m1_noclamp: bool = False, weight_smem: bool = False, rope_spread: bool = False,
                       amax_bf16x2: bool = False, rcp_norm: bool = False, hadamard_mma: bool = False,
                       pred_store: bool = False, rstd_first: bool = False):
    """Variant v3: v2's arithmetic with ``chunks`` 16-element chunks per lane (``make_row_store``);
    ``min_ctas`` > 1 caps registers so that many CTAs fit an SM (``__launch_bounds__``).
    ``e2m1_bf16x2`` / ``scale_mul`` / ``inv_table`` / ``e2m1_noclamp``: the cast options of
    ``make_row_store``; ``weight_smem``: FP32 weights in shared memory (``_kv_store_prim``);
    ``rope_spread``: RoPE spread over the row's lanes; ``amax_bf16x2`` / ``rcp_norm`` / ``hadamard_mma`` /
    ``pred_store`` / ``rstd_first``: see
    ``make_row_store`` (False here; the wrapper passes ``V3_OPTIONS``; same bytes except hadamard_mma's
    order; formats they do not apply to ignore them)."""
    return _kv_store_prim(fmt_name, rope_dim, interleaved, hadamard, has_out_norm, rows_per_block,
                          weight_dtype, pos_dtype, slot_dtype, rows_per_thread, fast=True, chunks=chunks,
                          e2m1_fma=True, min_ctas=min_ctas, e2m1_bf16x2=e2m1_bf16x2, scale_mul=scale_mul,
                          inv_table=inv_table, e2m1_noclamp=e2m1_noclamp, weight_smem=weight_smem,
                          rope_spread=rope_spread, amax_bf16x2=amax_bf16x2, rcp_norm=rcp_norm,
                          hadamard_mma=hadamard_mma, pred_store=pred_store, rstd_first=rstd_first)


# Device helpers of make_row_store(pred_store=True): st.global of 1 byte / 1, 2, 4 words under a predicate
# (volatile: they have no outputs; no memory clobber: the kernel never reads what it stores).
# tools/check_kv_store_emu.py swaps this text for a C++ emulation.
PRED_STORE_PRELUDE = """
__device__ __forceinline__ void tl_kvs_st1_if(unsigned char* p, unsigned char b, int ok) {
  asm volatile("{.reg .pred q; setp.ne.s32 q, %2, 0; @q st.global.u8 [%0], %1;}"
               :: "l"(p), "h"((unsigned short)b), "r"(ok));
}
__device__ __forceinline__ void tl_kvs_st4_if(unsigned char* p, unsigned a, int ok) {
  asm volatile("{.reg .pred q; setp.ne.s32 q, %2, 0; @q st.global.b32 [%0], %1;}" :: "l"(p), "r"(a), "r"(ok));
}
__device__ __forceinline__ void tl_kvs_st8_if(unsigned char* p, unsigned a, unsigned b, int ok) {
  asm volatile("{.reg .pred q; setp.ne.s32 q, %3, 0; @q st.global.v2.b32 [%0], {%1, %2};}"
               :: "l"(p), "r"(a), "r"(b), "r"(ok));
}
__device__ __forceinline__ void tl_kvs_st16_if(unsigned char* p, unsigned a, unsigned b, unsigned c,
                                               unsigned d, int ok) {
  asm volatile("{.reg .pred q; setp.ne.s32 q, %5, 0; @q st.global.v4.b32 [%0], {%1, %2, %3, %4};}"
               :: "l"(p), "r"(a), "r"(b), "r"(c), "r"(d), "r"(ok));
}
"""


# Device helper of make_row_store(amax_bf16x2=True): max(|a|, |b|) per BF16 half, the sign a ^ b (one
# HMNMX2; tools/check_kv_store_emu.py swaps this text for a C++ emulation).
AMAX_PRELUDE = """
__device__ __forceinline__ unsigned tl_kvs_bf16x2_maxabs(unsigned a, unsigned b) {
  unsigned r;
  asm("max.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
"""


# Device helpers of make_row_store(e2m1_bf16x2=True) (unsigned words holding two BF16 values): one
# BF16x2 FMA (fma.rn.bf16x2: exact product and sum, one RNE) and a BF16x2 max (nvcc fuses a chain of
# them into 3-input VHMNMX). tools/check_kv_store_emu.py swaps this text for a C++ emulation.
BF16X2_PRELUDE = """
#include <cuda_bf16.h>
__device__ __forceinline__ unsigned tl_kvs_bf16x2_fma(unsigned a, unsigned b, unsigned c) {
  __nv_bfloat162 r = __hfma2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b),
                             *reinterpret_cast<__nv_bfloat162*>(&c));
  return *reinterpret_cast<unsigned*>(&r);
}
__device__ __forceinline__ unsigned tl_kvs_bf16x2_max(unsigned a, unsigned b) {
  __nv_bfloat162 r = __hmax2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
  return *reinterpret_cast<unsigned*>(&r);
}
__device__ __forceinline__ unsigned tl_kvs_f2bf16x2(float lo, float hi) {
  __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&r);
}
__device__ __forceinline__ unsigned tl_kvs_sign_bytes(unsigned a, unsigned b) {
  unsigned r;
  asm("prmt.b32 %0, %1, %2, 0xFBD9;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
"""


# Device helper of make_row_store(hadamard_mma=True): the row's sums over H_16 on the tensor cores, D's n-tile
# t of every A-tile a (mma.sync.m16n8k16, BF16 in, FP32 accumulate). A-tile a = [row g (= lane / 4): a0 = word
# 2 a (k = 2 (lane % 4) + 0 / 1), a2 = word 2 a + 1 (k + 8); row g + 8: a1, a3 = words 8 + 2 a, 9 + 2 a], i.e.
# the lane's chunk 0 in row g and chunk 1 in row g + 8. B's fragment (k = 2 (lane % 4) + 0 / 1 and + 8, n = g
# + 8 t) is H_16 = (-1)^popc(k & n) as BF16 +-1, built from the lane (nvcc hoists it out of the row loop). L
# (HMMA_CHAIN) A-tiles chain: output tile o of group gg sums tiles a = gg L + l, l < L, with B negated
# (-1)^popc(l & o) (an XOR of the sign bits), each MMA adding to the previous one's FP32 result, the first
# from 0; nvcc shares a chain's common first MMA between the outputs. D's d0, d1 (d2, d3) go to y[4 a' + 2 t +
# 0 / 1] (y[16 + ...]) for output tile a' = gg L + o. Warp-collective: every lane calls it with the same t.
# tools/check_kv_store_emu.py swaps this text for a C++ emulation.
HMMA_PRELUDE = """
__device__ __forceinline__ unsigned tl_kvs_h16_b(unsigned k, unsigned n) {
  return (0x3F80u | ((__popc(k & n) & 1u) << 15)) | ((0x3F80u | ((__popc((k + 1u) & n) & 1u) << 15)) << 16);
}
template <int L>
__device__ __forceinline__ void tl_kvs_hmma_chain(float* y, const unsigned* hw, int t) {
  unsigned lane = threadIdx.x & 31u, n = (lane >> 2) + 8u * (unsigned)t, k = 2u * (lane & 3u);
  unsigned b0 = tl_kvs_h16_b(k, n), b1 = tl_kvs_h16_b(k + 8u, n);
#pragma unroll
  for (int g = 0; g < 4 / L; ++g) {
#pragma unroll
    for (int o = 0; o < L; ++o) {
      float c0 = 0.0f, c1 = 0.0f, c2 = 0.0f, c3 = 0.0f;
#pragma unroll
      for (int l = 0; l < L; ++l) {
        unsigned sg = (__popc(l & o) & 1) ? 0x80008000u : 0u;
        int a = g * L + l;
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
            "{%8, %9}, {%0, %1, %2, %3};"
            : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
            : "r"(hw[2 * a]), "r"(hw[8 + 2 * a]), "r"(hw[2 * a + 1]), "r"(hw[9 + 2 * a]), "r"(b0 ^ sg),
              "r"(b1 ^ sg));
      }
      int q = 4 * (g * L + o) + 2 * t;
      y[q] = c0; y[q + 1] = c1; y[16 + q] = c2; y[17 + q] = c3;
    }
  }
}
"""
# A-tiles chained per MMA output (tl_kvs_hmma_chain's L): 1 sums 4 of the Hadamard's 7 index bits on the
# tensor cores (0, 1, 4, 5), 2 also bit 2 (3 MMAs a tile pair instead of 2, one FP32 butterfly level fewer:
# SASS per thread 1488 -> 1440 static, 16 -> 24 HMMA), 4 bits 2 and 3 (11 MMAs per 4 tiles; 1392, 44 HMMA, 128
# registers). H200, 1M rows, us (tools/ab_kv_store.py, 7 rounds in turn; the same bytes as L = 1 on the
# benchmark's rows): L = 1 / 2 / 4: 138.8 / 135.5 / 136.6 (a first run 139.7 / 136.6 / -); 65536 rows 12.5 /
# 12.5 / 12.4. The whole Hadamard as MMAs (two rows' A-tiles in one MMA, 8 chained k-steps per n-tile, 86 HMMA
# after nvcc shares the chains' prefixes, 1400 SASS; 1 of 67M bytes apart from L = 1) measured 147.5 us
# against 138.9: the MMA chains' latency, at 4 CTAs per SM (at 3: 165.9 us), costs more than the FP32 adds
# they replace. Read when a kernel is built and not part of _kernel's cache key: edit it, do not patch it at
# run time (tests' hadamard_mma_model follows it).
HMMA_CHAIN = 2


def inv_e4m3_table() -> torch.Tensor:
    """[128] fp32: 2 / float(sf) for every e4m3 byte sf (IEEE FP32 division; byte 0 gives inf and 0x7F
    NaN, bytes the cast never stores: the amax floor keeps sf >= 2^-9 and sf <= 448)."""
    sf = torch.arange(128, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return torch.full((128,), 2.0, dtype=torch.float32) / sf


def inv_e4m3_prelude(device: bool = True) -> str:
    """The table of ``inv_e4m3_table`` and its reader ``tl_kvs_inv_e4m3(byte)`` as CUDA (``device``;
    read through the read-only cache) or as plain C++ (tools/check_kv_store_emu.py)."""
    bits = inv_e4m3_table().view(torch.int32).tolist()
    table = ", ".join(f"0x{b & 0xFFFFFFFF:08X}u" for b in bits)
    if device:
        return (f"\n__device__ const unsigned tl_kvs_inv_e4m3_bits[128] = {{{table}}};\n"
                "__device__ __forceinline__ float tl_kvs_inv_e4m3(unsigned b) {\n"
                "  return __uint_as_float(__ldg(&tl_kvs_inv_e4m3_bits[b]));\n}\n")
    return (f"\nstatic const uint tl_kvs_inv_e4m3_bits[128] = {{{table}}};\n"
            "inline float tl_kvs_inv_e4m3(uint b) {\n"
            "  float f; memcpy(&f, &tl_kvs_inv_e4m3_bits[b], 4); return f;\n}\n")


# Device helper of make_row_store(inv_table=True): 2 / sf by the scale's e4m3 byte.
INV_E4M3_PRELUDE = inv_e4m3_prelude()


def _kv_store_prim(fmt_name, rope_dim, interleaved, hadamard, has_out_norm, rows_per_block, weight_dtype,
                   pos_dtype, slot_dtype, rows_per_thread, fast, chunks=1, e2m1_fma=False, min_ctas=0,
                   e2m1_bf16x2=False, scale_mul=False, inv_table=False, e2m1_noclamp=False,
                   weight_smem=False, rope_spread=False, amax_bf16x2=False, rcp_norm=False,
                   hadamard_mma=False, pred_store=False, rstd_first=False):
    """``rows_per_thread`` (R): each thread stores R rows, ``rows_per_cta`` apart, so a CTA covers
    R * rows_per_cta consecutive rows; all R rows' loads are issued before the first row's math
    (R times the bytes in flight) and the lane's weights are loaded and converted once. ``chunks`` (C):
    a lane holds chunks ``lane + c * lanes`` (c < C) of its row (see ``make_row_store``).
    ``weight_smem`` (v3 option): the CTA converts the weights to FP32 once into shared memory and the
    norm reads each row's weights there (4 conflict-free 16-byte loads a chunk) instead of keeping the
    BF16 weights in registers and widening them for every row (under the register cap nvcc redid the
    16 shifts / masks a chunk per row)."""
    fmt = _FORMATS[fmt_name]
    dim = fmt.dim
    C = chunks
    lanes = dim // VEC // C
    rows_per_cta = THREADS // lanes
    R = rows_per_thread
    half = rope_dim // 2
    wvec = 8 if weight_dtype == "bfloat16" else 4  # 16-byte loads
    row_store = make_row_store(fmt, rope_dim, interleaved, hadamard, has_out_norm, rows_per_block,
                               weight_dtype, weight_in_registers=not weight_smem, fast=fast, chunks=C,
                               weight_in_shared=weight_smem, rope_spread=rope_spread,
                               e2m1_fma=e2m1_fma, e2m1_bf16x2=e2m1_bf16x2, scale_mul=scale_mul,
                               inv_table=inv_table, e2m1_noclamp=e2m1_noclamp, amax_bf16x2=amax_bf16x2,
                               rcp_norm=rcp_norm, hadamard_mma=hadamard_mma, pred_store=pred_store,
                               rstd_first=rstd_first)
    # the helpers are declared only where they are called (other kernels' sources stay as they were)
    prelude = "".join(text for on, name, text in ((e2m1_bf16x2, "e2m1_bf16x2", BF16X2_PRELUDE),
                                                  (inv_table, "inv_table", INV_E4M3_PRELUDE),
                                                  (amax_bf16x2, "amax_bf16x2", AMAX_PRELUDE),
                                                  (hadamard_mma and hadamard and hadamard_mma_fits(fmt, C),
                                                   "hadamard_mma", HMMA_PRELUDE),
                                                  (pred_store and chunks > 1, "pred_store",
                                                   PRED_STORE_PRELUDE))
                      if on and option_applies(name, fmt)) or None
    rows, norm_rows, max_pos = T.dynamic("rows, norm_rows, max_pos")
    cache_bytes = T.dynamic("cache_bytes", "int64")
    block_bytes = rows_per_block * fmt.row_bytes

    # v3 with pred_store (FP4 rows) keeps each row index in an int32 local (rix, filled by load_rows), so its
    # clamp is not widened to 64 bits at every use as a buffer index. H200, 1M rows, us (together with
    # pred_store's 32-bit slot and position checks, session 24): fp4 main 435.1 -> 424.6, fp4 index 142.3 ->
    # 139.1; but on FP8 main 426.6 -> 437.2 and BF16 570.3 -> 590.8 (no pred_store there), so not for them.
    rows32 = pred_store and C > 1

    def row_of(rix, g, k, tx):
        """Row k of group g for this thread, clamped to the last row."""
        return rix[k] if rows32 else T.min((g * R + k) * rows_per_cta + tx // lanes, rows - 1)

    @T.macro
    def load_rows(kv, positions, slots, xb, posv, slotv, rix, g, tx, lane, rows):
        """Row group g's R rows (this lane's chunks), positions and slots (rows clamped to the last)."""
        if rows32:
            for k in T.unroll(R):
                rix[k] = T.min((g * R + k) * rows_per_cta + tx // lanes, rows - 1)
        for k in T.unroll(R):
            for c in T.unroll(C):
                for v in T.unroll(2):
                    for i in T.vectorized(8):
                        xb[(k * C + c) * VEC + v * 8 + i] = kv[row_of(rix, g, k, tx),
                                                               (lane + c * lanes) * VEC + v * 8 + i]
        for k in T.unroll(R):
            posv[k] = T.Cast("int64", positions[row_of(rix, g, k, tx)])
            slotv[k] = T.Cast("int64", slots[row_of(rix, g, k, tx)])

    @T.macro
    def widen_row(xw, x, k):
        """x = float(row k of the loaded rows) (BF16 pairs widen with one shift / one mask)."""
        for i in T.unroll(C * VEC // 2):
            x[2 * i] = T.reinterpret(xw[k * C * VEC // 2 + i] << T.uint32(16), "float32")
            x[2 * i + 1] = T.reinterpret(xw[k * C * VEC // 2 + i] & T.uint32(0xFFFF0000), "float32")

    @T.macro
    def store_rows(xb, x, weights, posv, slotv, rix, g, tx, lane, rows, cos, sin, cache, out_norm, max_pos,
                   capacity, eps):
        """Widen row group g's loaded rows and run the row pipeline on each (``weights``: the lane's FP32
        weights in registers, or with ``weight_smem`` the CTA's shared copy)."""
        xw = T.view(xb, [R * C * VEC // 2], "uint32")
        if rstd_first:  # every row's rstd (the branchy IEEE sqrt / division) before the rows' work
            rs = T.alloc_local([R], "float32")
            for k in T.unroll(R):
                widen_row(xw, x, k)
                row_store.norm_rstd(x, rs, k, eps)
        for k in T.unroll(R):
            widen_row(xw, x, k)
            row_store(x, lane, weights, cos, sin, cache, out_norm, posv[k], slotv[k],
                      (g * R + k) * rows_per_cta + tx // lanes < rows, row_of(rix, g, k, tx), max_pos,
                      capacity,
                      rs[k] if rstd_first else eps)

    @T.prim_func
    def kernel(
        kv: T.Tensor((rows, dim), "bfloat16"),  # [rows, dim] bf16
        weight: T.Tensor((dim,), weight_dtype),  # [dim] bf16 or fp32
        cos: T.Tensor((max_pos, half), "float32"),  # [max_position, rope_dim / 2] fp32
        sin: T.Tensor((max_pos, half), "float32"),  # [max_position, rope_dim / 2] fp32
        positions: T.Tensor((rows,), pos_dtype),  # [rows] int32/int64
        slots: T.Tensor((rows,), slot_dtype),  # [rows] int32/int64, < 0: skip
        cache: T.Tensor((cache_bytes,), "uint8"),  # [num_blocks * block_bytes] uint8, flat view
        out_norm: T.Tensor((norm_rows, dim), "bfloat16"),  # [rows, dim] bf16 (or [1, dim] dummy)
        eps: T.float32,
        capacity: T.int64,  # slots in the cache (v3; v1 / v2 derive it from cache_bytes, as verified)
    ):
        with T.Kernel(T.ceildiv(rows, rows_per_cta * R), threads=THREADS, prelude=prelude) as bx:
            if min_ctas > 1:
                T.annotate_min_blocks_per_sm(min_ctas)
            tx = T.get_thread_binding()
            lane = tx % lanes
            xb = T.alloc_local([R * C * VEC], "bfloat16")
            x = T.alloc_local([C * VEC], "float32")
            wl = T.alloc_local([C * VEC], weight_dtype)
            wf = T.alloc_local([C * VEC], "float32")
            posv = T.alloc_local([R], "int64")
            slotv = T.alloc_local([R], "int64")
            rix = T.alloc_local([R], "int32")  # (rows32) the rows, clamped
            # every load first: R rows (tail rows redo the last row: they must shuffle, store nothing)
            load_rows(kv, positions, slots, xb, posv, slotv, rix, bx, tx, lane, rows)
            if weight_smem:
                assert dim % THREADS == 0, (dim, THREADS)  # every thread fills dim / THREADS weights
                s_w = T.alloc_shared([dim], "float32")
                for e in T.unroll(dim // THREADS):  # weight element e * THREADS + tx
                    s_w[_smem_weight_index((e * THREADS + tx) // VEC, (e * THREADS + tx) % VEC // 4,
                                           (e * THREADS + tx) % 4, dim)] = T.Cast("float32",
                                                                                  weight[e * THREADS + tx])
                T.sync_threads()
            else:
                for c in T.unroll(C):
                    for v in T.unroll(VEC // wvec):
                        for i in T.vectorized(wvec):
                            wl[c * VEC + v * wvec + i] = weight[(lane + c * lanes) * VEC + v * wvec + i]
                if weight_dtype == "bfloat16":
                    ww = T.view(wl, [C * VEC // 2], "uint32")
                    for i in T.unroll(C * VEC // 2):
                        wf[2 * i] = T.reinterpret(ww[i] << T.uint32(16), "float32")
                        wf[2 * i + 1] = T.reinterpret(ww[i] & T.uint32(0xFFFF0000), "float32")
                else:
                    for i in T.unroll(C * VEC):
                        wf[i] = T.Cast("float32", wl[i])
            store_rows(xb, x, s_w if weight_smem else wf, posv, slotv, rix, bx, tx, lane, rows, cos, sin,
                       cache, out_norm, max_pos,
                       capacity if C > 1 else (cache_bytes // block_bytes) * rows_per_block, eps)

    return kernel


VARIANTS = ("v1", "v2", "v3")
VARIANT = "v3"
KERNELS = {"v1": kv_store_kernel, "v2": kv_store_kernel_v2, "v3": kv_store_kernel_v3}
# v3: 16-element chunks per lane (KV_STORE_CHUNKS overrides, for the benchmark's sweep)
CHUNKS = {"fp8_main": 2, "fp4_main": 2, "fp4_index": 2, "bf16": 2}
# v3: minimum CTAs per SM for __launch_bounds__ (0: the compiler's register choice; KV_STORE_MIN_CTAS
# overrides, for the benchmark's sweep). 5 caps registers at 96 (20 warps per SM instead of 16); at 1M
# rows on the H200 (us, none -> 5): fp8 R=2 547 -> 539, fp4 R=1 559 -> R=2 516, fp4 index R=1 212 -> 200,
# bf16 R=2 602 -> 581. 6 or 7 (80 / 72 registers) spill more and were slower except fp4 R=1.
# With weight_smem and rope_spread (fewer live registers) FP4 main rows run best at 6 (80 registers): 1M rows
# 457.2 us at 5 -> 437.0-438.0 at 6 (0.74 of the copy roofline; 451.6 at 7; without rope_spread 6 gave 466.3).
# FP8 main rows (session 18): 1M rows 458.0 us at 5 -> 437.4 at 6 with rope_spread (0.87 of the copy
# roofline; 6 without it 463.6, 7 with it 445.9), and with amax_bf16x2 and rcp_norm too at 7: 426.3-428.0
# (0.90; GPU-tested at 7). BF16 stays at 5 (6 with rope_spread 566.6, without 613.2, against 565.6).
# FP4 index rows with hadamard_mma and pred_store (session 19) run best at 4 (122 registers, no spill): 1M
# rows 151.2 us at 4, 154.2 at 3; R = 4 at 4 / 3: 168.4 / 165.3. With one MMA for both chunks (below): 147.3 /
# 146.9 at 4, 148.0 at 5. With the cast's (k, k + 4) pairing (session 24, 124 registers): 147.1 -> 142.8 us
# (65536 rows 13.0 -> 12.5; tools/ab_kv_store.py, 7 rounds in turn).
MIN_CTAS_V3 = {"fp8_main": 7, "fp4_main": 6, "fp4_index": 4, "bf16": 5}
# Tried on the H200 and dropped: CTA bx prefetching into L2 (prefetch.global.L2) the rows of CTA bx + one /
# two waves (SMs x MIN_CTAS_V3 CTAs); at 1M rows, us without -> one wave / two waves: fp8 538 -> 541 / 690,
# fp4 500 -> 505 / 577, fp4 index 180 -> 184 / 187, bf16 581 -> 632 / 779.


# v3 cast options (make_row_store's e2m1_bf16x2: FP4 index rows; scale_mul, inv_table, e2m1_noclamp: FP4
# main rows; same bytes, fewer instructions: SASS per thread fp4 index R=1 1272 -> 1096, fp4 main R=2 1736 ->
# 1680 (scale_mul) -> 1616 (inv_table: no scale division, no call into its slow path) -> ~1564 executed
# (e2m1_noclamp; 2072 static: both encodes), min_ctas 5). On since timed on the H200 (1M rows: fp4 index
# 198.8 -> 179.5 us; fp4 main 517.3 -> 499.8 us (scale_mul), then 495.2 -> 497.0 (inv_table: fewer
# instructions, the same time) -> 476.7 us (e2m1_noclamp), 0.68 of the copy roofline);
# weight_smem (every format, _kv_store_prim): the per-row weight widening under the register cap is gone;
# SASS per thread fp8 1288 -> 1240 (stack 48 -> 8 B), fp4 main ~1564 -> ~1508 executed (stack 16 -> 0), fp4
# index 1096 -> 1072, bf16 920 -> 872 (stack 16 -> 0). H200, 1M rows, us without -> with: fp8 493.5 -> 462.9
# (0.83 of the copy roofline), fp4 main 476.3 -> 457.1 (0.71), fp4 index 174.9 -> 173.0 and, with the
# weights out of the registers, R = 2 for index rows: 159.2 (0.50), bf16 579.9 -> 569.6.
# rope_spread (512-wide rows; on for FP4 main rows at 6 and FP8 main at 7 CTAs per SM): SASS fp4 main
# 2016 -> 1984 static; at 5 CTAs per SM 1M rows us without -> with: fp8 462.8 -> 466.3, fp4 main 457.2 ->
# 457.2, bf16 569.3 -> 576.5; it pays through the registers it frees: at 6 CTAs per SM fp4 main 466.3 ->
# 437.0, fp8 463.6 -> 437.4 (see MIN_CTAS_V3).
# amax_bf16x2 and rcp_norm (session 18; SASS fp4 main static 1984 -> 1936 (rcp_norm: -24 a row) -> 1968
# (amax_bf16x2: 60 FMNMX -> 28 HMNMX2 + 8, but the RoPE lanes re-pack their BF16 words and nvcc moves the
# widening around)). Fewer instructions did not mean less time; 1M rows, us, one run, each timed twice:
#   fp8 main at 6: 438.5 -> rcp_norm 440.5; at 7: 445.9 -> rcp_norm 468.4, amax_bf16x2 469.1, both 426.5
#   fp4 main at 6: 438.6 -> rcp_norm 441.3, amax_bf16x2 451.1, both 448.5 (next run); at 7 rcp_norm 451.6
#   fp4 index: 160.2 -> rcp_norm 159.9; bf16: 565.6 -> rcp_norm 576.6
# so only FP8 main rows take them (both, at 7 CTAs per SM); the register allocation and schedule nvcc
# lands on moves these kernels by more than the instructions saved.
# hadamard_mma, pred_store and rstd_first (session 19). hadamard_mma (FP4 index rows): the Hadamard's sums
# over 4 of its 7 index bits on the tensor cores (SASS per thread, R = 2: 1992 -> 1688 at 5 CTAs per SM; with
# pred_store at 4, the default, 1656; one MMA serving both chunks (rows g and g + 8 of A) instead of one per
# chunk with half of A zero: 1600, 16 HMMA per two rows instead of 32, 1M rows 151.2 -> 147.3 / 146.9 us, the
# same bytes (H200: the same 12 / 18 differing bytes on the 24-binade rows); the bytes may differ
# from the reference's by the one-step tolerance: none on randn rows, 18 of 67M bytes on rows spread
# over 24 binades). pred_store: predicated stores instead of a branch around them; rstd_first: both rows' norm
# reciprocals (IEEE sqrt / division, which branch to slow paths) first. With both, nothing splits a thread's
# two rows into separate basic blocks and ptxas interleaves them (SASS, FP4 index). 1M rows, us, two H200
# runs (each line timed twice):
#   fp4 index (R = 2): defaults at 5 160.1 / 160.9; hadamard_mma at 5 156.4, at 4 154.6 / 156.5; + pred_store
#     at 4 151.2 (+ rstd_first 151.7 / 151.3, at 5 159.0, at 6 200.6 (spills)); pred_store alone at 4 163.0
#   fp4 main at 6: defaults 438.5 / 439.0; pred_store 434.6 / 436.6 / 436.5 (+ rcp_norm 439.7, + amax_bf16x2
#     450.5; at 7 463.5); pred_store + rstd_first 450.1 (at 5 462.2)
#   fp8 main at 7: 426.4 / 427.6; pred_store 459.0 (at 6 440.1), + rstd_first 460.9 (at 6 437.9)
#   bf16 at 5: 565.4 / 569.6; pred_store 576.1 (at 4 609.7), + rstd_first 574.3 (at 4 570.0)
# so FP4 index rows take hadamard_mma + pred_store (at 4 CTAs per SM), FP4 main rows pred_store; rstd_first
# stays an option (it bought nothing on top of pred_store).
# Tried and dropped (session 19): every row's cos / sin loaded right after the rows (before any row's work)
# instead of at the start of its own row: bitwise on the GPU, slower everywhere (registers): 1M rows, us,
# fp4 main 435.8 -> 448.0, fp4 index 150.9 -> 153.2, fp8 427.3 -> 468.0, bf16 569.7 -> 615.3.
# KV_STORE_V3_OPTIONS="e2m1_bf16x2,scale_mul" or "none" overrides this table for every format (the
# benchmark's peer and sweep, the GPU tests). An option that does not apply to a format is dropped.
# MIN_CTAS_V3 is tuned for these defaults: other options want their own KV_STORE_MIN_CTAS (FP8 main at 7
# without amax_bf16x2 + rcp_norm: 446-469 us, worse than 6; the benchmark's v3plain peer runs at 5).
V3_OPTION_NAMES = ("e2m1_bf16x2", "scale_mul", "inv_table", "e2m1_noclamp", "weight_smem", "rope_spread",
                   "amax_bf16x2", "rcp_norm", "hadamard_mma", "pred_store", "rstd_first")
V3_OPTIONS = {"fp8_main": ("weight_smem", "rope_spread", "amax_bf16x2", "rcp_norm"),
              "fp4_main": ("scale_mul", "inv_table", "e2m1_noclamp", "weight_smem", "rope_spread",
                           "pred_store"),
              "fp4_index": ("e2m1_bf16x2", "weight_smem", "hadamard_mma", "pred_store"),
              "bf16": ("weight_smem",)}
_OPTION_APPLIES = {"e2m1_bf16x2": ("e2m1", "ue8m0"), "scale_mul": ("e2m1", "e4m3"),
                   "inv_table": ("e2m1", "e4m3"), "e2m1_noclamp": ("e2m1", "e4m3"), "weight_smem": None,
                   "rope_spread": "main", "amax_bf16x2": "main_cast", "rcp_norm": None,
                   "hadamard_mma": ("e2m1", "ue8m0"), "pred_store": None, "rstd_first": None}


def option_applies(name: str, fmt: KVCacheFormat) -> bool:
    """Whether v3 cast option ``name`` changes ``fmt``'s kernel (its (data, scale) dtypes are the
    option's); the others ignore it."""
    applies = _OPTION_APPLIES[name]  # (data, scale) dtypes; None: every format; "main": the 512-wide rows
    if applies == "main":
        return fmt.dim == 512
    if applies == "main_cast":  # 512-wide rows with scales (not BF16)
        return fmt.dim == 512 and fmt.scale_dtype is not None
    return applies in (None, (fmt.data_dtype, fmt.scale_dtype))


def v3_options(fmt: KVCacheFormat, names: tuple | None = None) -> tuple:
    """v3's option flags for ``fmt`` (``names``: the options asked for; None: the environment override,
    else ``V3_OPTIONS``), in ``V3_OPTION_NAMES`` order; () when none applies (the default kernel)."""
    if names is None:
        env = os.environ.get("KV_STORE_V3_OPTIONS")
        names = V3_OPTIONS[fmt.name] if env is None else tuple(n for n in env.split(",") if n and n != "none")
    unknown = set(names) - set(V3_OPTION_NAMES)
    if unknown:
        raise ValueError(f"kv_store v3 options must be among {V3_OPTION_NAMES}, got {sorted(unknown)}")
    if "e2m1_noclamp" in names and "inv_table" not in names:
        raise ValueError(f"kv_store v3 option e2m1_noclamp needs inv_table, got {sorted(names)}")
    flags = tuple(n in names and option_applies(n, fmt) for n in V3_OPTION_NAMES)
    return flags if any(flags) else ()


def hadamard_mma_fits(fmt: KVCacheFormat, chunks: int) -> bool:
    """Whether v3's ``hadamard_mma`` layout holds: index rows (the option's format) with a row on one quad of
    the warp, 4 lanes x 2 chunks of 16."""
    return option_applies("hadamard_mma", fmt) and chunks == 2 and fmt.dim // VEC // chunks == 4


def uses_hadamard_mma(variant: str, fmt: KVCacheFormat, hadamard: bool, rope_dim: int = 64,
                      interleaved: bool = True, names: tuple | None = None) -> bool:
    """Whether the kernel for this call sums the Hadamard on the tensor cores (v3 with ``hadamard_mma``
    among its options, ``names`` as in ``v3_options``, and two chunks per lane), i.e. in the order of
    ``tests.test_kv_store.hadamard_mma_model`` (approximately) instead of the reference's butterflies.
    ``variant`` None: the module's ``VARIANT``."""
    variant = VARIANT if variant is None else variant
    if variant != "v3" or not hadamard or not hadamard_mma_fits(fmt, chunks_for(variant, fmt, rope_dim,
                                                                                 interleaved)):
        return False
    flags = v3_options(fmt, names)
    return bool(flags) and flags[V3_OPTION_NAMES.index("hadamard_mma")]


def chunks_for(variant: str, fmt: KVCacheFormat, rope_dim: int = 64, interleaved: bool = True) -> int:
    """Chunks per lane: 1 for v1 / v2; v3's choice where its layout supports the configuration (a
    half-split RoPE partner must sit in another lane: rope_dim / 32 < lanes)."""
    if variant != "v3":
        return 1
    c = int(os.environ.get("KV_STORE_CHUNKS", CHUNKS[fmt.name]))
    while c > 1:
        lanes = fmt.dim // VEC // c
        if lanes >= 2 and (interleaved or rope_dim // 2 // VEC < lanes):
            break
        c //= 2
    return c


def rows_per_cta(variant: str, fmt: KVCacheFormat, rope_dim: int = 64, interleaved: bool = True) -> int:
    """Rows one CTA covers per rows-per-thread step."""
    return THREADS // (fmt.dim // VEC // chunks_for(variant, fmt, rope_dim, interleaved))


def static_args(variant: str, fmt: KVCacheFormat, static: tuple, rope_dim: int = 64,
                interleaved: bool = True) -> tuple:
    """The kernel factory's static arguments: ``static`` (format .. rows per thread) plus v3's chunks,
    minimum CTAs per SM and (when any is on) cast options."""
    if variant == "v3":
        min_ctas = int(os.environ.get("KV_STORE_MIN_CTAS", MIN_CTAS_V3[fmt.name]))
        return static + (chunks_for(variant, fmt, rope_dim, interleaved), min_ctas) + v3_options(fmt)
    return static


# Rows per thread for large launches (R > 1 puts R rows' loads in flight per thread, at the price of
# registers: fp8 / bf16 59 -> 85, fp4 60 -> 116, fp4 index 71 -> 114 per thread at R = 2). Small
# launches (latency-bound: every row's chain is serial within a thread) always use 1. The benchmark's
# KV_STORE_SWEEP=1 times R = 1, 2, 4 through KV_STORE_ROWS_PER_THREAD (read here, for that sweep).
ROWS_PER_THREAD = {"fp8_main": 2, "fp4_main": 1, "fp4_index": 1, "bf16": 2}
# v3 at 1M rows on the H200 (us, chunks 2, R = 1 / 2, old harness): fp8 644 / 609, fp4 623 / 628, fp4 index
# 260 / 288, bf16 717 / 657 (4 chunks, R = 1: 754, 641, 340, 688); with MIN_CTAS_V3 fp4 prefers R = 2.
ROWS_PER_THREAD_V3 = {"fp8_main": 2, "fp4_main": 2, "fp4_index": 2, "bf16": 2}  # index: 2 since weight_smem
MULTI_ROW_MIN_ROWS = 32768


def rows_per_thread(fmt: KVCacheFormat, rows: int, variant: str = "v2") -> int:
    forced = os.environ.get("KV_STORE_ROWS_PER_THREAD")
    if forced:
        return int(forced)
    table = ROWS_PER_THREAD_V3 if variant == "v3" else ROWS_PER_THREAD
    return table.get(fmt.name, 1) if rows >= MULTI_ROW_MIN_ROWS else 1


_DUMMY_NORM: dict = {}


def _dummy_norm(dim: int, device) -> torch.Tensor:
    key = (dim, str(device))
    if key not in _DUMMY_NORM:
        _DUMMY_NORM[key] = torch.empty(1, dim, dtype=torch.bfloat16, device=device)
    return _DUMMY_NORM[key]


@functools.lru_cache(maxsize=None)
def _kernel(variant, *static):
    return KERNELS[variant](*static)


def norm_rope_hadamard_cast_store(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt, *,
                                  rope_dim=64, interleaved=True, hadamard=False, out_norm=None,
                                  variant=None) -> None:
    """Per row i: y = rmsnorm(kv[i]); [out_norm[i] = y]; if slot >= 0: cache[slot] = cast(H(rope(y))).

    Same arguments and results as ``reference.kv_store.norm_rope_hadamard_cast_store_ref``:
    kv [rows, fmt.dim] bf16, norm_weight [fmt.dim] bf16/fp32, cos/sin [max_position, rope_dim/2] fp32,
    positions/slot_mapping [rows] int32/int64, kv_cache [num_blocks, fmt.block_bytes(rpb)] uint8
    (written in place), out_norm optional [rows, fmt.dim] bf16. kv may be non-contiguous (copied).
    ``variant``: "v1" / "v2" / "v3" (None: the module's ``VARIANT``); same bytes, different instruction mix
    (except v3's tensor-core Hadamard on FP4 index rows: see ``make_row_store``'s ``hadamard_mma``).
    """
    variant = VARIANT if variant is None else variant
    if variant not in VARIANTS:
        raise ValueError(f"norm_rope_hadamard_cast_store: variant must be one of {VARIANTS}, got {variant!r}")
    geom = check_store_args(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
                            rope_dim=rope_dim, interleaved=interleaved, hadamard=hadamard, out_norm=out_norm)
    check_cuda(kv=kv, kv_cache=kv_cache)
    why = kernel_supports(fmt, rope_dim, interleaved)
    if why is not None or fmt.name not in _FORMATS or _FORMATS[fmt.name] != fmt:
        raise ValueError(f"norm_rope_hadamard_cast_store kernel: unsupported configuration for "
                         f"{fmt.name}: {why or 'not one of the four cache formats'}")
    # vector loads/stores assume 16-byte aligned bases (true for any fresh or block-sliced tensor)
    for name, t in (("kv_cache", kv_cache), ("norm_weight", norm_weight), ("cos", cos), ("sin", sin),
                    ("out_norm", out_norm)):
        if t is not None and t.is_contiguous() and t.data_ptr() % 16:
            raise ValueError(f"{name} must start at a 16-byte aligned address, got {t.data_ptr():#x}")
    if geom.num_slots >= 1 << 31:  # (v3 computes a stored slot's address from its int32 value)
        raise ValueError(f"norm_rope_hadamard_cast_store: kv_cache holds {geom.num_slots} slots, the kernels "
                         f"address at most 2^31 - 1")
    if debug_checks_enabled():
        check_store_values(positions, slot_mapping, geom)
    if geom.rows == 0:
        return
    static = (fmt.name, rope_dim, interleaved, hadamard, out_norm is not None,
              geom.rows_per_block if fmt.block_sections else 1, _TORCH_TO_TL[norm_weight.dtype],
              _TORCH_TO_TL[positions.dtype], _TORCH_TO_TL[slot_mapping.dtype],
              rows_per_thread(fmt, geom.rows, variant))
    static = static_args(variant, fmt, static, rope_dim, interleaved)
    norm = out_norm if out_norm is not None else _dummy_norm(fmt.dim, kv.device)
    kv = kv.contiguous()
    if kv.data_ptr() % 16:
        kv = kv.clone()
    _kernel(variant, *static)(kv, norm_weight.contiguous(), cos.contiguous(), sin.contiguous(),
                              positions.contiguous(), slot_mapping.contiguous(), kv_cache.view(-1), norm,
                              float(eps), geom.num_slots)

