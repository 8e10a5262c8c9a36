"""Device helpers of the index-logits kernels (CUDA / inline PTX), declared in the kernels' prelude.

``tools/index_logits_emu.py`` replaces this text by a C++ emulation (the mma as exact integer math, the
cp.async copies deferred to their wait) to run the generated kernels on the CPU.
"""

PRELUDE = r"""
// byte permute, default mode: byte n of the result is byte (c >> 4n) & 7 of {b, a}, or its sign
// replicated over 8 bits when bit 4n + 3 of c is set
__device__ __forceinline__ unsigned il_prmt(unsigned a, unsigned b, unsigned c) {
  unsigned d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
// D = A B + C, A 16 x 32 u8 (row), B 32 x 8 s8 (col), C / D 16 x 8 s32: exact integer arithmetic
__device__ __forceinline__ void il_mma(int* d, const unsigned* a, const unsigned* b, int c0, int c1, int c2,
                                       int c3) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%10, %11, %12, %13};"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(c0), "r"(c1),
                 "r"(c2), "r"(c3));
}
// global -> shared copies of 16 / 4 bytes (src_bytes 0: zero fill, nothing read)
__device__ __forceinline__ void il_cp16(void* smem, const void* gmem, int src_bytes) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void il_cp4(void* smem, const void* gmem, int src_bytes) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void il_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void il_cp_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
__device__ __forceinline__ unsigned il_ld32(const unsigned char* p) {
  return *reinterpret_cast<const unsigned*>(p);
}
__device__ __forceinline__ int il_dp4a(unsigned a, unsigned b) {
  return __dp4a((int)a, (int)b, 0);
}
__device__ __forceinline__ int il_any(int p) { return __any_sync(0xFFFFFFFFu, p); }
__device__ __forceinline__ int il_all(int p) { return __all_sync(0xFFFFFFFFu, p); }
// fp32(x * 2^e), one rounding (the double product is exact; |e| < 1000)
__device__ __forceinline__ float il_pow2_scale(double x, int e) {
  return __double2float_rn(x * __longlong_as_double((long long)(e + 1023) << 52));
}
// 2^149 W, exact unless it overflows (two steps: 2^149 is no FP32 number)
__device__ __forceinline__ float il_w_denorm(float w) {
  return __fmul_rn(__fmul_rn(w, 18889465931478580854784.0f), 37778931862957161709568.0f);
}
// fp32(s * 2^e) for e in [-102, 153], one rounding: 2^e is an FP32 number up to e = 127; beyond it the
// first step, s * 2^64, is exact (or overflows, as the result does)
__device__ __forceinline__ float il_key_scale(float s, int e) {
  float lo = __int_as_float((e > 127 ? e - 64 + 127 : e + 127) << 23);
  return __fmul_rn(e > 127 ? __fmul_rn(s, 18446744073709551616.0f) : s, lo);
}
"""
