# ruff: noqa: E501  (case tables)
"""Emulate the kv_store kernel on CPU (generated CUDA -> C++ via tools/cuda_emu.py, one std::thread per
CUDA thread) and compare its cache bytes and out_norm bitwise with the vectorized twin (and, on cases
with only in-range slots, the loop reference). Every format, both RoPE conventions, Hadamard, rows per
thread R = 1 / 2, out_norm on / off, BF16 / FP32 weights, int32 / int64 indices, odd row counts, slot -1,
slots beyond the cache and positions beyond the table. Each config of ``CONFIGS`` is checked: "default"
(the launch rule's, R forced), "all" (every option that applies on) and "plain" (none; both only where
they differ from the default). The BF16x2 helpers of e2m1_bf16x2 and amax_bf16x2 run as C++ emulations
(``EMU_PRELUDE``: exact FMA, one RNE to BF16; prmt / vmax on the bytes / halves; ``EMU_AMAX_PRELUDE``:
max.xorsign.abs on the halves). `--mutate` checks that deliberately broken sources are caught.
tests/test_kv_store_kernel.py runs one small case per format through it (CPU tier).

    PYTHONPATH=. .venv/bin/python tools/check_kv_store_emu.py [case-substring ...] [--config all] [--mutate]
"""
import functools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TILELANG_CACHE_DIR", "/tmp/tlcache")
import torch  # noqa: E402

import tilelang_ops.kv_store as K  # noqa: E402
from reference.kv_store import (  # noqa: E402
    norm_rope_hadamard_cast_store_ref,
    norm_rope_hadamard_cast_store_torch_unchecked,
)
from tilelang_ops.build import compile_for_sm90  # noqa: E402
from tilelang_ops.testing.kv_store import (  # noqa: E402
    FORMATS,
    StoreCase,
    all_options,
    hadamard_mma_model,
    make_inputs,
    no_options,
)
from tools.cuda_emu import WORK, Emu, cached_text  # noqa: E402

SRC = f"{WORK}/kv_src"  # generated sources, keyed by a hash of the static arguments and the package's code
_KHASH = __import__("hashlib").md5(b"".join(
    open(os.path.join(os.path.dirname(K.__file__), f), "rb").read()
    for f in sorted(os.listdir(os.path.dirname(K.__file__))) if f.endswith(".py"))).hexdigest()[:8]
HMMA_CHAIN = K.DEFAULT_CONFIGS["fp4_index"].hmma_chain

CONFIGS = ("default", "all", "plain")

# C++ stand-ins for kv_store.BF16X2_PRELUDE and the CUDA integer intrinsics it is used with. The FMA:
# BF16 x BF16 is exact in double, the double FMA rounds once (exact for the encode's operands, whose
# sum has < 30 significant bits), then one RNE to BF16 on a grid of 8 significant bits.
EMU_PRELUDE = r"""
static inline double kvs_bf(uint h) { uint u = (h & 0xFFFFu) << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint kvs_to_bf(double d) {
  uint sign = std::signbit(d) ? 0x8000u : 0u; double a = std::fabs(d);
  if (a == 0) return sign;
  int e = std::max(std::ilogb(a), -126);
  double ulp = std::ldexp(1.0, e - 7);
  float f = (float)(std::nearbyint(a / ulp) * ulp); uint u; memcpy(&u, &f, 4);
  return sign | (u >> 16); }
inline uint tl_kvs_bf16x2_fma(uint a, uint b, uint c) {
  uint r = 0;
  for (int h = 0; h < 32; h += 16) r |= kvs_to_bf(std::fma(kvs_bf(a >> h), kvs_bf(b >> h), kvs_bf(c >> h))) << h;
  return r; }
inline uint tl_kvs_bf16x2_max(uint a, uint b) {
  uint r = 0;
  for (int h = 0; h < 32; h += 16) r |= (kvs_bf(a >> h) >= kvs_bf(b >> h) ? (a >> h) & 0xFFFFu : (b >> h) & 0xFFFFu) << h;
  return r; }
inline uint __vmaxu2(uint a, uint b) {
  return std::max(a & 0xFFFFu, b & 0xFFFFu) | (std::max(a >> 16, b >> 16) << 16); }
inline uint kvs_f2bf(float f) {  // cvt.rn.bf16.f32 (RNE; a NaN stays a quiet NaN)
  uint u; memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 0x40u;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16; }
inline uint tl_kvs_f2bf16x2(float lo, float hi) { return kvs_f2bf(lo) | (kvs_f2bf(hi) << 16); }
// prmt.b32 with selector 0xFBD9: bytes 1, 5, 3, 7 of {b, a} sign-replicated (0x00 / 0xFF)
inline uint tl_kvs_sign_bytes(uint a, uint b) {
  unsigned long long v = ((unsigned long long)b << 32) | a; uint r = 0; const int sel[4] = {1, 5, 3, 7};
  for (int n = 0; n < 4; ++n) r |= (((v >> (8 * sel[n] + 7)) & 1ull) ? 0xFFu : 0u) << (8 * n);
  return r; }
inline uint __byte_perm(uint x, uint y, uint s) {
  unsigned long long v = ((unsigned long long)y << 32) | x; uint r = 0;
  for (int n = 0; n < 4; ++n) r |= (uint)((v >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
  return r; }
"""


def source(static):
    key = f"{SRC}/{_KHASH}_{__import__('hashlib').md5(repr(static).encode()).hexdigest()[:16]}.cu"
    return cached_text(key, lambda: compile_for_sm90(K.kv_store_kernel, *static).get_kernel_source())

# kv_store.AMAX_PRELUDE's max.xorsign.abs.bf16x2: per half the larger magnitude (as integers: the same order
# for finite non-negative BF16), the sign a ^ b
EMU_AMAX_PRELUDE = r"""
inline uint tl_kvs_bf16x2_maxabs(uint a, uint b) {
  uint r = 0;
  for (int h = 0; h < 32; h += 16)
    r |= ((std::max((a >> h) & 0x7FFFu, (b >> h) & 0x7FFFu)) | (((a ^ b) >> h) & 0x8000u)) << h;
  return r; }
"""

# kv_store.HMMA_PRELUDE's chains of mma.m16n8k16 (B = +-H_16): the lanes publish their 16 words, each lane sums
# its row's 16 products of an A-tile exactly (double), adds them to the previous MMA's FP32 result and rounds
# once (tests' hadamard_mma_model)
EMU_HMMA_PRELUDE = r"""
template <int L>
inline void tl_kvs_hmma_chain(float* y, const uint* hw, int t) {
  Warp* w = t_warp; int lane = threadIdx.x & 31, g = lane >> 2, l = lane & 3;
  uint words[32][16];
  for (int p = 0; p < 8; ++p) {
    w->slot[lane] = (uint64_t)hw[2 * p] | ((uint64_t)hw[2 * p + 1] << 32); w->bar->arrive_and_wait();
    for (int i = 0; i < 32; ++i) { words[i][2 * p] = (uint)w->slot[i]; words[i][2 * p + 1] = (uint)(w->slot[i] >> 32); }
    w->bar->arrive_and_wait();
  }
  for (int gg = 0; gg < 4 / L; ++gg)
    for (int o = 0; o < L; ++o) {
      float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // [A row: chunk 0 / 1][D column 2 l + c]
      for (int li = 0; li < L; ++li) {
        int a = gg * L + li; bool neg = __builtin_popcount(li & o) & 1;
        for (int r = 0; r < 2; ++r)
          for (int c = 0; c < 2; ++c) {
            double s = acc[r][c];
            for (int k = 0; k < 16; ++k) {  // A[row][k] from lane 4 g + (k % 8) / 2: word 2 a (+1 for k >= 8)
              uint word = words[4 * g + ((k & 7) >> 1)][8 * r + 2 * a + ((k & 8) ? 1 : 0)];
              uint u = ((k & 1) ? word >> 16 : word & 0xFFFFu) << 16; float x; memcpy(&x, &u, 4);
              bool m = ((__builtin_popcount(k & (2 * l + c + 8 * t)) & 1) != 0) != neg;
              s += m ? -(double)x : (double)x;
            }
            acc[r][c] = (float)s;
          }
      }
      int q = 4 * (gg * L + o) + 2 * t;
      y[q] = acc[0][0]; y[q + 1] = acc[0][1]; y[16 + q] = acc[1][0]; y[17 + q] = acc[1][1];
    }
}
"""

# kv_store.PRED_STORE_PRELUDE's predicated stores
EMU_PRED_STORE_PRELUDE = r"""
inline void tl_kvs_st1_if(uchar* p, uchar b, int ok) { if (ok) *p = b; }
inline void tl_kvs_st4_if(uchar* p, uint a, int ok) { if (ok) memcpy(p, &a, 4); }
inline void tl_kvs_st8_if(uchar* p, uint a, uint b, int ok) { uint v[2] = {a, b}; if (ok) memcpy(p, v, 8); }
inline void tl_kvs_st16_if(uchar* p, uint a, uint b, uint c, uint d, int ok) {
  uint v[4] = {a, b, c, d}; if (ok) memcpy(p, v, 16); }
"""

_emus = {}


def emu_for(static, edit=None):
    k = (static, edit)
    if k not in _emus:
        src = source(static)
        if edit is not None:
            assert edit[0] in src, edit[0]
            src = src.replace(edit[0], edit[1], 1)
        if K.BF16X2_PRELUDE in src:
            src = src.replace(K.BF16X2_PRELUDE, EMU_PRELUDE)
        if K.AMAX_PRELUDE in src:
            src = src.replace(K.AMAX_PRELUDE, EMU_AMAX_PRELUDE)
        if K.PRED_STORE_PRELUDE in src:
            src = src.replace(K.PRED_STORE_PRELUDE, EMU_PRED_STORE_PRELUDE)
        if K.HMMA_PRELUDE in src:
            src = src.replace(K.HMMA_PRELUDE, EMU_HMMA_PRELUDE)
        if K.INV_E4M3_PRELUDE in src:
            src = src.replace(K.INV_E4M3_PRELUDE, K.inv_e4m3_prelude(device=False))
        _emus[k] = Emu(src)
    return _emus[k]


# (StoreCase, R values, out_norm, extra bad rows: slots beyond the cache / positions beyond the table)
CASES = [
    (StoreCase("fp8_13", "fp8_main", 13), (1, 2), True, True),
    (StoreCase("fp8_half_w32_9", "fp8_main", 9, interleaved=False, weight_fp32=True), (1, 2), False, True),
    (StoreCase("fp8_tiny_i32_6", "fp8_main", 6, scale=1e-8, index_dtype=torch.int32), (2,), True, False),
    (StoreCase("fp8_shift100_5", "fp8_main", 5, offset=100.0), (1,), True, False),
    (StoreCase("fp4_11", "fp4_main", 11), (1, 2), True, True),
    (StoreCase("fp4_half_big_7", "fp4_main", 7, interleaved=False, scale=3e4, weight_fp32=True), (1, 2), False, False),
    (StoreCase("fp4_tiny_i32_9", "fp4_main", 9, scale=1e-6, index_dtype=torch.int32), (2,), True, True),
    (StoreCase("idx_had_37", "fp4_index", 37, hadamard=True, rows_per_block=16), (1, 2), True, True),
    (StoreCase("idx_had_half_rpb5_21", "fp4_index", 21, interleaved=False, hadamard=True, rows_per_block=5), (1, 2), False, True),
    (StoreCase("idx_plain_half_rpb5_10", "fp4_index", 10, interleaved=False, rows_per_block=5), (1,), True, False),
    (StoreCase("idx_had_tiny_i32_19", "fp4_index", 19, hadamard=True, scale=1e-30, index_dtype=torch.int32), (2,), True, False),
    (StoreCase("idx_plain_w32_17", "fp4_index", 17, weight_fp32=True, rows_per_block=4), (1, 2), False, True),
    (StoreCase("bf16_7", "bf16", 7), (1, 2), True, True),
    (StoreCase("bf16_half_w32_9", "bf16", 9, interleaved=False, weight_fp32=True), (1, 2), False, False),
    # amax / 6 just above a subnormal e4m3 scale (rounded down by up to a third): |z| up to 9, where the
    # e2m1 clamp matters (e2m1_noclamp must take its clamped encode)
    (StoreCase("fp4_subnormal_scale_9", "fp4_main", 9, scale=5e-6), (2,), False, False),
    # other RoPE widths (rope_spread: 48 / 16 keep the chunk-wise RoPE, 128 spreads 4 pairs a lane)
    (StoreCase("fp4_rope48_11", "fp4_main", 11, rope_dim=48), (1, 2), True, False),
    (StoreCase("fp8_rope16_7", "fp8_main", 7, rope_dim=16), (2,), False, False),
    (StoreCase("fp4_rope128_9", "fp4_main", 9, rope_dim=128), (1, 2), True, False),
    (StoreCase("fp8_rope128_half_9", "fp8_main", 9, interleaved=False, rope_dim=128), (1, 2), False, False),
    (StoreCase("bf16_rope32_half_5", "bf16", 5, interleaved=False, rope_dim=32), (2,), True, False),
    # the Hadamard on 512-wide rows (amax_bf16x2 reads the words its last rounding leaves)
    (StoreCase("fp8_had_9", "fp8_main", 9, hadamard=True), (1, 2), True, False),
    (StoreCase("fp4_had_half_7", "fp4_main", 7, interleaved=False, hadamard=True), (2,), False, False),
    (StoreCase("idx_had_rope32_half_13", "fp4_index", 13, interleaved=False, hadamard=True, rope_dim=32),
     (1, 2), True, False),
]


def inputs(case, bad):
    g = torch.Generator().manual_seed(case.rows * 7 + len(case.id))
    fmt, kv, w, cos, sin, pos, slots, cache = make_inputs(case, gen=g)
    if bad and case.rows > 4:
        slots[2] = cache.shape[0] * case.rows_per_block + 3  # beyond the cache: skipped, nothing written
        pos[3] = cos.shape[0] + 5  # beyond the table: skipped
        slots[4] = cache.shape[0] * case.rows_per_block  # first slot past the end
    return fmt, kv, w, cos, sin, pos, slots, cache


def config_for(name, case, R):
    """Config ``name`` of CONFIGS for ``case`` at R rows per thread."""
    fmt = FORMATS[case.fmt]
    config = K.launch_config(fmt, 1, case.rope_dim, case.interleaved).replace(rows_per_thread=R)
    if name == "all":
        return all_options(case.fmt, chunks=config.chunks, rows_per_thread=R)
    if name == "plain":
        return no_options(case.fmt, chunks=config.chunks, rows_per_thread=R)
    return config


def static_args(case, fmt, w, pos, slots, has_norm, config):
    tl = K._TORCH_TO_TL
    return K.static_args(fmt, case.rope_dim, case.interleaved, case.hadamard, has_norm, case.rows_per_block,
                         tl[w.dtype], tl[pos.dtype], tl[slots.dtype], config)


def applies(name, case):
    """False for "all" / "plain" where that config is the case's default."""
    return name == "default" or config_for(name, case, 1) != config_for("default", case, 1)


def run_emu(config, case, has_norm, data, edit=None, order="forward"):
    fmt, kv, w, cos, sin, pos, slots, cache = data
    cache = cache.clone()
    e = emu_for(static_args(case, fmt, w, pos, slots, has_norm, config), edit)
    out_norm = torch.full((case.rows, fmt.dim), 7.0, dtype=torch.bfloat16) if has_norm else torch.empty(1, fmt.dim, dtype=torch.bfloat16)
    grid = -(-case.rows // (K.rows_per_cta(fmt, config) * config.rows_per_thread))
    order_l = list(range(grid))[::-1] if order == "reverse" else list(range(grid))
    e(grid, K.THREADS, order_l, cache=cache, cos_1=cos, sin_1=sin, cos=cos, sin=sin, kv=kv, out_norm=out_norm,
      positions=pos, slots=slots, weight=w, num_blocks=cache.shape[0], cache_block_bytes=cache.shape[1], eps=1e-6, max_pos=cos.shape[0],
      norm_rows=out_norm.shape[0], rows=case.rows,
      capacity=cache.shape[0] * case.rows_per_block)
    return cache, (out_norm if has_norm else None)


def hadamard_fn(config, case):
    """The Hadamard order of the kernel built with ``config`` on ``case`` (every kernel must equal its own
    order bitwise here; the tolerance between the orders is the GPU tests' business)."""
    if not K.uses_hadamard_mma(FORMATS[case.fmt], case.hadamard, config):
        return None
    return functools.partial(hadamard_mma_model, chain=config.hmma_chain)


def oracle(case, has_norm, data, loop, had=None):
    fmt, kv, w, cos, sin, pos, slots, cache = data
    cache = cache.clone()
    out_norm = torch.full((case.rows, fmt.dim), 7.0, dtype=torch.bfloat16) if has_norm else None
    if loop:
        norm_rope_hadamard_cast_store_ref(kv, w, 1e-6, cos, sin, pos, slots, cache, fmt, rope_dim=case.rope_dim,
                                          interleaved=case.interleaved, hadamard=case.hadamard, out_norm=out_norm)
    else:
        norm_rope_hadamard_cast_store_torch_unchecked(kv, w, 1e-6, cos, sin, pos, slots, cache, fmt, rope_dim=case.rope_dim,
                                            interleaved=case.interleaved, hadamard=case.hadamard,
                                            out_norm=out_norm, hadamard_fn=had)
    return cache, out_norm


def ndiff(a, b):
    if a is None:
        return 0
    return int((a.view(torch.uint8) != b.view(torch.uint8)).sum())


MUTATIONS = {  # generated-source edits (first occurrence) that must make the kernel disagree
    "rstd_scaled": ("__fsqrt_rn(", "1.001f * __fsqrt_rn("),  # the norm's sqrt (its only one)
    "bad_position_stored": ("(position < ((int64_t)max_pos))", "true"),
}
# the options' cast with every option on (case index in CASES, edit): a broken encode, scale or packing must be caught
OPTION_MUTATIONS = {
    "bf16x2_code_offset": (7, ("(uint)17152", "(uint)17280")),  # M's mantissa off by one grid step
    "bf16x2_grid_floor": (7, ("((e8 << (uint)7) * (uint)65537)", "(((e8 - (uint)1) << (uint)7) * (uint)65537)")),
    "bf16x2_fma_truncates": (7, ("tl_kvs_bf16x2_fma(aw", "tl_kvs_bf16x2_fma_rz(aw")),
    # the sign bytes of the wrong pair of words (the k4 packing: words (k, k + 4) for k = 0, 2 give the signs)
    "bf16x2_sign_bytes": (7, ("tl_kvs_sign_bytes(yw[((c_7 * 8) + (w_1 * 4))], yw[(((c_7 * 8) + (w_1 * 4)) + 1)])",
                              "tl_kvs_sign_bytes(yw[(((c_7 * 8) + (w_1 * 4)) + 1)], yw[((c_7 * 8) + (w_1 * 4))])")),
    "bf16x2_scale_round": (7, ("(uint)63)", "(uint)64)")),
    "bf16x2_amax_half": (7, ("a16 = max((a16 & (uint)65535), (a16 >> (uint)16));", "a16 = (a16 & (uint)65535);")),
    "scale_mul_constant": (4, ("(uint)1042983595;", "(uint)1042983594;")),  # RN(1/6) - 1 ulp
    "inv_table_index": (4, ("inv = tl_kvs_inv_e4m3(((uint)sbyte));", "inv = tl_kvs_inv_e4m3(((uint)sbyte) + 1u);")),
    "noclamp_always": (14, ("if (__all_sync((uint)4294967295,", "if (1 | __all_sync((uint)4294967295,")),
    # hadamard_mma (the fragments' layout lives in the helper, which the emulator replaces: the GPU tests check
    # it): one n-tile computed twice, the other left out; the butterflies after another chain length's MMAs
    "hmma_one_tile": (7, (f"tl_kvs_hmma_chain<{HMMA_CHAIN}>((&(y[0])), (&(yw[0])), t)",
                          f"tl_kvs_hmma_chain<{HMMA_CHAIN}>((&(y[0])), (&(yw[0])), 0)")),
    "hmma_chain_levels": (7, (f"tl_kvs_hmma_chain<{HMMA_CHAIN}>(",
                              f"tl_kvs_hmma_chain<{2 if HMMA_CHAIN == 1 else 1}>(")),
    "amax_bf16x2_odd_half": (4, ("a16 & (uint)4294901760", "(uint)0")),  # the odd elements' maximum dropped
    "amax_bf16x2_last_word": (0, ("tl_kvs_bf16x2_maxabs(a16, yw[(((c_5 * 8) + j_8) + 1)])",
                                  "tl_kvs_bf16x2_maxabs(a16, yw[((c_5 * 8) + j_8)])")),
}
# the FMA rounded toward zero (the grid rounding is the encode's RNE: truncation must be caught). An
# unfused multiply-add would not be: |y| * 2 / sf is exact in BF16, so it is the same number.
EMU_PRELUDE += r"""
inline uint tl_kvs_bf16x2_fma_rz(uint a, uint b, uint c) {
  uint r = 0;
  for (int h = 0; h < 32; h += 16) {
    uint t = kvs_to_bf(std::fma(kvs_bf(a >> h), kvs_bf(b >> h), kvs_bf(c >> h)));
    double exact = std::fma(kvs_bf(a >> h), kvs_bf(b >> h), kvs_bf(c >> h));
    if (std::fabs(kvs_bf(t)) > std::fabs(exact)) t -= 1;  // one step toward zero
    r |= (t & 0xFFFFu) << h; }
  return r; }
"""


def check_case(case, Rs, has_norm, bad, configs=CONFIGS, orders=("forward", "reverse")):
    """Emulates ``case`` under each config and R: (mismatches (cache bytes + out_norm elements), line)."""
    data = inputs(case, bad)
    want = oracle(case, has_norm, data, loop=False)
    line, total = [case.id], 0
    if not bad:  # the loop reference raises on out-of-range slots: compare it where it applies
        loopw = oracle(case, has_norm, data, loop=True)
        d = [ndiff(a, b) for a, b in zip(loopw, want)]
        total += sum(d)
        line.append(f"loop~twin {d}")
    for name in configs:
        if not applies(name, case):
            continue
        for R in Rs:
            config = config_for(name, case, R)
            had = hadamard_fn(config, case)
            want_c = want if had is None else oracle(case, has_norm, data, loop=False, had=had)
            for order in orders:
                got = run_emu(config, case, has_norm, data, order=order)
                d = [ndiff(a, b) for a, b in zip(got, want_c)]
                total += sum(d)
                line.append(f"{name} R={R} {order[0]}: {d}")
    return total, " | ".join(line)


def mutation_caught(case_index, edit, name="default"):
    """Whether the emulated kernel of CASES[case_index] (config ``name``, first R) with source edit ``edit``
    disagrees with the twin (None: the edit's pattern is not in that kernel's source)."""
    case, Rs, has_norm, bad = CASES[case_index]
    data = inputs(case, bad)
    config = config_for(name, case, Rs[0])
    if edit[0] not in source(static_args(case, data[0], data[2], data[5], data[6], has_norm, config)):
        return None
    want = oracle(case, has_norm, data, loop=False, had=hadamard_fn(config, case))
    got = run_emu(config, case, has_norm, data, edit=edit)
    return any(ndiff(a, b) for a, b in zip(got, want))


def main():
    args = sys.argv[1:]
    configs = list(CONFIGS)
    if "--config" in args:
        i = args.index("--config")
        configs = [args[i + 1]]
        del args[i:i + 2]
    mutate = "--mutate" in args
    missed = 0
    only = [a for a in args if not a.startswith("--")]
    bad_total = 0
    for case, Rs, has_norm, bad in CASES:
        if only and not any(o in case.id for o in only):
            continue
        t0 = time.time()
        n, line = check_case(case, Rs, has_norm, bad, configs)
        bad_total += n
        print(line, f"{time.time() - t0:.1f}s", flush=True)
    print("MISMATCHES (cache bytes, out_norm elements) total:", bad_total)
    if mutate:
        for name in configs:
            if not applies(name, CASES[0][0]):
                continue
            for mname, edit in MUTATIONS.items():
                caught = mutation_caught(0, edit, name)
                if caught is None:
                    print(f"mutation {name} {mname}: pattern not in this config's source")
                    continue
                missed += not caught
                print(f"mutation {name} {mname}: {'caught' if caught else 'MISSED'}")
        if "all" in configs:  # the options' code
            for mname, (ci, edit) in OPTION_MUTATIONS.items():
                caught = mutation_caught(ci, edit, "all")
                missed += not caught
                print(f"mutation all {mname} ({CASES[ci][0].id}): {'caught' if caught else 'MISSED'}")
    return bad_total + missed


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
