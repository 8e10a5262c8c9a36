"""Device helpers of the index-logits kernels (CUDA / inline PTX), declared in the kernels' prelude.

``tools/index_logits_emu.py`` replaces this text by a C++ emulation (the mma and wgmma as exact integer
math, the cp.async copies deferred to their wait) to run the generated kernels on the CPU.
"""

WGMMA_N = (32, 64, 128)  # the wgmma widths the kernels use: the heads of one or two query rows (H 32 / 64)


def _mma(name: str, atype: str) -> str:
    """``name``: mma.m16n8k32 with A of ``atype`` (u8 / s8), B s8, s32 accumulation."""
    return (
        f"// D = A B + C, A 16 x 32 {atype} (row), B 32 x 8 s8 (col), C / D 16 x 8 s32: exact integer "
        "arithmetic\n"
        f"__device__ __forceinline__ void {name}(int* d, const unsigned* a, const unsigned* b, int c0,\n"
        "                                       int c1,"
        " int c2, int c3) {\n"
        f'  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.{atype}.s8.s32 '
        '{%0, %1, %2, %3}, {%4, %5, %6, %7}, "\n'
        '               "{%8, %9}, {%10, %11, %12, %13};"\n'
        '               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])\n'
        '               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(c0),\n'
        '                 "r"(c1), "r"(c2), "r"(c3));\n'
        "}\n")


def _rows(items: list, per_line: int, sep: str) -> str:
    return sep.join(", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line))


def _wgmma(n: int) -> str:
    """``il_wgmma_n{n}``: one wgmma.m64nNk32.s32.s8.s8 with A from registers; ``il_wg_regs_n{n}``: its
    accumulator registers ordered after the wait (no read of them moves above it)."""
    nd = n // 2
    regs = _rows([f"%{i}" for i in range(nd)], 16, ', "\n               "')
    outs = _rows([f'"+r"(d[{i}])' for i in range(nd)], 6, ",\n                 ")
    return (
        "// D (+)= A B over the warpgroup: A 64 x 32 s8 from registers (warp w: rows 16 w .., the m16n8k32\n"
        f"// A layout), B 32 x {n} s8 from shared memory (desc), D 64 x {n} s32 ({nd} registers); "
        "scale_d 0: D = A B\n"
        f"__device__ __forceinline__ void il_wgmma_n{n}(int* d, const unsigned* a, unsigned long long desc,\n"
        "                                             int scale_d) {\n"
        f'  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{nd + 5}, 0;\\n"\n'
        f'               "wgmma.mma_async.sync.aligned.m64n{n}k32.s32.s8.s8 "\n'
        f'               "{{{regs}}}, "\n'
        f'               "{{%{nd}, %{nd + 1}, %{nd + 2}, %{nd + 3}}}, %{nd + 4}, p;\\n}}\\n"\n'
        f"               : {outs}\n"
        '               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));\n'
        "}\n"
        f"__device__ __forceinline__ void il_wg_regs_n{n}(int* d) {{\n"
        f'  asm volatile("" : {outs} :: "memory");\n'
        "}\n")


PRELUDE = r"""
// byte permute, default mode: byte n of the result is byte (c >> 4n) & 7 of {b, a}, or its sign
// replicated over 8 bits when bit 4n + 3 of c is set
__device__ __forceinline__ unsigned il_prmt(unsigned a, unsigned b, unsigned c) {
  unsigned d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
""" + _mma("il_mma", "u8") + _mma("il_mma_ss", "s8") + r"""
// a wgmma shared-memory descriptor: K-major without swizzle, core matrices of 8 rows x 16 bytes (row r
// at 16 r); lbo: bytes between the two core matrices of a k32 step (K), sbo: between groups of 8 rows
__device__ __forceinline__ unsigned long long il_wg_desc(const void* smem, unsigned lbo, unsigned sbo) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  return (unsigned long long)((s & 0x3FFFF) >> 4) | ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16) |
         ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32);
}
__device__ __forceinline__ void il_wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void il_wg_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void il_wg_wait0() {
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
// generic-proxy shared-memory writes made visible to the wgmma's (async proxy) reads
__device__ __forceinline__ void il_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
""" + "".join(_wgmma(n) for n in WGMMA_N) + r"""
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
