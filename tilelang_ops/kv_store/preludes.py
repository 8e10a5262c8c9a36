"""CUDA helpers that ``make_row_store``'s options call (each kernel declares only the ones it calls, so
the other kernels' sources stay free of them). ``tools/cuda_emu`` swaps each text for a C++ emulation."""

import torch

# Device helpers of make_row_store(pred_store=True): st.global of 1 byte / 1, 2, 4 words under a predicate
# (volatile: they have no outputs; no memory clobber: the kernel never reads what it stores).
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
# HMNMX2).
AMAX_PRELUDE = """
__device__ __forceinline__ unsigned tl_kvs_bf16x2_maxabs(unsigned a, unsigned b) {
  unsigned r;
  asm("max.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
"""


# Device helpers of make_row_store(e2m1_bf16x2=True) (unsigned words holding two BF16 values): one
# BF16x2 FMA (fma.rn.bf16x2: exact product and sum, one RNE) and a BF16x2 max (nvcc fuses a chain of
# them into 3-input VHMNMX).
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
# (KVStoreConfig.hmma_chain) A-tiles chain: output tile o of group gg sums tiles a = gg L + l, l < L, with B
# negated (-1)^popc(l & o) (an XOR of the sign bits), each MMA adding to the previous one's FP32 result, the
# first from 0; nvcc shares a chain's common first MMA between the outputs. D's d0, d1 (d2, d3) go to
# y[4 a' + 2 t + 0 / 1] (y[16 + ...]) for output tile a' = gg L + o.
# Warp-collective: every lane calls it with the same t.
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


def inv_e4m3_table() -> torch.Tensor:
    """[128] fp32: 2 / float(sf) for every e4m3 byte sf (IEEE FP32 division; byte 0 gives inf and 0x7F
    NaN, bytes the cast never stores: the amax floor keeps sf >= 2^-9 and sf <= 448)."""
    sf = torch.arange(128, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return torch.full((128,), 2.0, dtype=torch.float32) / sf


def inv_e4m3_prelude(device: bool = True) -> str:
    """The table of ``inv_e4m3_table`` and its reader ``tl_kvs_inv_e4m3(byte)`` as CUDA (``device``;
    read through the read-only cache) or as plain C++ (the CPU emulator)."""
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
