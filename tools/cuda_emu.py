# ruff: noqa: E501  (embedded C++ and case tables)
"""CPU emulation of generated TileLang CUDA kernels (written for compress_store; warp shuffles, BF16/e4m3): one std::thread per CUDA thread, the
32 threads of a warp meet at a barrier for every __shfl_xor_sync, blocks run one after another in a
chosen order (forward, reverse, or a permutation). FP32 ops are IEEE (-ffp-contract=off), BF16 and
e4m3 conversions are RNE (e4m3 satfinite, as cvt.rn.satfinite)."""
import ctypes
import hashlib
import os
import re
import subprocess

WORK = os.environ.get("CUDA_EMU_DIR", "/tmp/cuda_emu")

SHIM = r'''
#include <cmath>
#include <cstdint>
#include <cstring>
#include <barrier>
#include <thread>
#include <vector>
#include <algorithm>
#include <type_traits>
typedef unsigned char uchar; typedef unsigned int uint; typedef unsigned short ushort;
struct dim3_ { int x, y, z; };
static thread_local dim3_ threadIdx;
static dim3_ blockIdx;
struct Warp { std::barrier<>* bar; uint64_t slot[32]; };
static thread_local Warp* t_warp;
// a block's threads meet at __syncthreads; dynamic shared memory is one buffer (blocks run one by one),
// poisoned (0xFF bytes: NaN floats, -1 ints) before every block
static std::barrier<>* g_block_bar;
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
alignas(1024) static uchar buf_dyn_shmem[1 << 17];
#define __global__
#define __launch_bounds__(...)
#define __restrict__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
struct uint2 { uint32_t x, y; };
struct uint4 { uint32_t x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
struct bfloat16_t { uint16_t bits; bfloat16_t() = default;
  explicit bfloat16_t(float f) { uint32_t u = fbits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) bits = (u >> 16) | 0x40; else { u += 0x7fffu + ((u >> 16) & 1u); bits = u >> 16; } }
  explicit operator float() const { uint32_t u = uint32_t(bits) << 16; float f; memcpy(&f, &u, 4); return f; } };
struct __nv_bfloat162 { bfloat16_t x, y; };
inline __nv_bfloat162 __float22bfloat162_rn(float2 v) { return {bfloat16_t(v.x), bfloat16_t(v.y)}; }
static uint8_t e4m3(float f) {
  uint32_t u = fbits(f); uint8_t sign = (u >> 24) & 0x80;
  if (std::isnan(f)) return 0x7f;
  double a = std::fabs((double)f);
  uint8_t code;
  if (a < std::ldexp(1.0, -6)) { code = (uint8_t)std::nearbyint(a * 512.0); }
  else { int e; std::frexp(a, &e); e -= 1;  /* a in [2^e, 2^(e+1)) */
    double q = std::nearbyint(std::ldexp(a, 3 - e));
    if (q == 16.0) { q = 8.0; e += 1; }
    if (e + 7 > 15) code = 0x7e; else { int c = ((e + 7) << 3) | ((int)q - 8); code = c > 0x7e ? 0x7e : (uint8_t)c; } }
  return sign | code; }
struct fp8_e4_t { uint8_t bits; fp8_e4_t() = default; explicit fp8_e4_t(float f) : bits(e4m3(f)) {}
  explicit operator float() const { int e = (bits >> 3) & 15, m = bits & 7; double v = e ? std::ldexp(1.0 + m / 8.0, e - 7) : std::ldexp((double)m, -9);
    return (float)((bits & 0x80) ? -v : v); } };
struct fp8_e4_4_t { fp8_e4_t v[4]; };
typedef uint16_t __nv_fp8x2_storage_t;
#define __NV_SATFINITE 1
#define __NV_E4M3 0
inline __nv_fp8x2_storage_t __nv_cvt_float2_to_fp8x2(float2 v, int, int) { return (uint16_t)e4m3(v.x) | ((uint16_t)e4m3(v.y) << 8); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float max(float a, float b) { return std::fmax(a, b); }
inline float min(float a, float b) { return std::fmin(a, b); }
template <class A, class B> inline typename std::common_type<A, B>::type max(A a, B b) { typedef typename std::common_type<A, B>::type C; return (C)a > (C)b ? (C)a : (C)b; }
template <class A, class B> inline typename std::common_type<A, B>::type min(A a, B b) { typedef typename std::common_type<A, B>::type C; return (C)a < (C)b ? (C)a : (C)b; }
// the store macro's fast paths (make_row_store(fast=True, e2m1_fma=True))
inline uint __pack_nv_bfloat162(bfloat16_t a, bfloat16_t b) { return (uint)a.bits | ((uint)b.bits << 16); }
inline uint4 make_uint4(uint a, uint b, uint c, uint d) { return {a, b, c, d}; }
inline uint2 make_uint2(uint a, uint b) { return {a, b}; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline uint __funnelshift_r(uint lo, uint hi, uint sh) {
  return (uint)((((unsigned long long)hi << 32) | lo) >> (sh & 31));
}
template <class T> inline T __shfl_xor_sync(uint, T v, int m, int) {
  static_assert(sizeof(T) <= 8, ""); Warp* w = t_warp; int lane = threadIdx.x & 31;
  uint64_t b = 0; memcpy(&b, &v, sizeof(T)); w->slot[lane] = b; w->bar->arrive_and_wait();
  uint64_t o = w->slot[lane ^ m]; w->bar->arrive_and_wait(); T r; memcpy(&r, &o, sizeof(T)); return r; }
inline void __syncwarp(uint = 0xFFFFFFFFu) { t_warp->bar->arrive_and_wait(); }
inline int __all_sync(uint, int p) {
  Warp* w = t_warp; int lane = threadIdx.x & 31; w->slot[lane] = p != 0; w->bar->arrive_and_wait();
  int r = 1; for (int i = 0; i < 32; ++i) r &= (int)(w->slot[i] != 0); w->bar->arrive_and_wait(); return r; }
'''


def _launcher(kname, params, names):
    return f'''
extern "C" void launch(int grid, int threads, const int* order, {params}) {{
  int warps = threads / 32;
  for (int bi = 0; bi < grid; ++bi) {{
    blockIdx.x = order[bi];
    std::barrier<> block_bar(threads); g_block_bar = &block_bar;
    memset(buf_dyn_shmem, 0xFF, sizeof(buf_dyn_shmem));
    std::vector<std::barrier<>*> bars; std::vector<Warp> ws(warps);
    for (int w = 0; w < warps; ++w) {{ ws[w].bar = new std::barrier<>(32); }}
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) ts.emplace_back([&, t] {{ threadIdx.x = t; t_warp = &ws[t / 32]; {kname}({", ".join(names)}); }});
    for (auto& th : ts) th.join();
    for (int w = 0; w < warps; ++w) delete ws[w].bar;
  }}
}}
'''


def build(src):
    body = "\n".join(l for l in src.splitlines() if not l.startswith("#"))
    # dynamic shared memory: the shim's buffer, whatever the kernel names it
    body = re.sub(r"extern __shared__ (?:__align__\(\d+\) )?(\w+) (\w+)\[\];",
                  lambda m: "" if m.group(2) == "buf_dyn_shmem" else f"{m.group(1)}* {m.group(2)} = ({m.group(1)}*)buf_dyn_shmem;",
                  body)
    sig = re.search(r'extern "C" __global__ void (\w+)\((.*?)\);', src)
    kname, params = sig.group(1), sig.group(2)
    params_c = params.replace("__restrict__", "")
    names = [p.strip().split()[-1] for p in params_c.split(",")]
    types = [" ".join(p.strip().split()[:-1]) for p in params_c.split(",")]
    code = SHIM + body + _launcher(kname, params_c, names)
    so = shared_library(code, WORK, "emu", ["-O1", "-std=c++20", "-ffp-contract=off", "-fno-strict-aliasing",
                                             "-pthread"])
    return ctypes.CDLL(so), names, types


def report_mutations(names, caught) -> int:
    """``--mutate`` of the emulator checks: one line per mutation (``caught(name)`` runs it against the
    unbroken reference); returns how many went unnoticed."""
    missed = 0
    for name in names:
        ok = caught(name)
        missed += not ok
        print(f"mutation {name}: {'caught' if ok else 'MISSED'}")
    return missed


def cached_text(path: str, make) -> str:
    """The text at ``path``, made by ``make()`` and written once (a temporary file renamed into place, so a
    parallel test worker never reads a half-written file)."""
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        text = make()
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
        return text
    with open(path) as f:
        return f.read()


def shared_library(code: str, work: str, stem: str, flags: list[str]) -> str:
    """The path of ``code`` built by g++ with ``flags`` into ``work/<stem>_<hash>.so`` (its source beside it),
    built once.

    Parallel test workers build the same kernel at the same time: each writes its own temporary files and
    renames the library into place, so no process loads a library another is still writing."""
    h = hashlib.md5((code + " ".join(flags)).encode()).hexdigest()[:12]
    so = f"{work}/{stem}_{h}.so"
    if not os.path.exists(so):
        os.makedirs(work, exist_ok=True)
        tmp = f"{so}.{os.getpid()}.tmp"
        with open(f"{tmp}.cpp", "w") as f:
            f.write(code)
        try:
            subprocess.check_call(["g++", *flags, "-shared", "-fPIC", "-w", f"{tmp}.cpp", "-o", tmp])
            os.replace(f"{tmp}.cpp", so[:-3] + ".cpp")  # kept beside the library, for reading
            os.replace(tmp, so)
        finally:
            for leftover in (tmp, f"{tmp}.cpp"):
                if os.path.exists(leftover):
                    os.remove(leftover)
    return so


class Emu:
    def __init__(self, src):
        self.lib, self.names, self.types = build(src)

    def __call__(self, grid, threads, order, **kw):
        import torch

        cargs = []
        for n, t in zip(self.names, self.types):
            v = kw[n]
            if "*" in t:
                assert v.is_contiguous() and v.device.type == "cpu", n
                cargs.append(ctypes.c_void_p(v.data_ptr()))
            elif "int64" in t:
                cargs.append(ctypes.c_int64(int(v)))
            elif t == "float":
                cargs.append(ctypes.c_float(float(v)))
            else:
                cargs.append(ctypes.c_int(int(v)))
        order = torch.tensor(order, dtype=torch.int32)
        assert sorted(order.tolist()) == list(range(grid))
        self.lib.launch(ctypes.c_int(grid), ctypes.c_int(threads), ctypes.c_void_p(order.data_ptr()), *cargs)
