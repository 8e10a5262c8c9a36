# ruff: noqa: E501  (embedded C++)
"""Run the index-logits kernels' generated CUDA on the CPU (tools/fiber_emu.py: one fiber per thread,
random scheduling at barriers and warp intrinsics, shared memory poisoned, blocks in random order).

The kernels' device helpers (``tilelang_ops.index_logits.ptx.PRELUDE``) are replaced by C++:
* ``mma.m16n8k32.{u8,s8}.s8.s32``: the lanes publish their A / B / C fragments, each lane computes its four
  D elements as exact integer sums (the instruction's arithmetic is integer, so this is the hardware result),
  with the fragment layouts of the PTX ISA (A row g / g + 8, k 4 q .. 4 q + 3 (+16); B k 4 q .. (+16),
  column g; D rows g / g + 8, columns 2 q, 2 q + 1);
* ``wgmma.m64nNk32.s32.s8.s8`` (A from registers, B through a K-major descriptor without swizzle): the
  warpgroup (the whole CTA) meets at a block barrier, and each thread computes its D elements from every
  thread's A fragment and the B bytes the descriptor addresses; they reach the registers at the
  ``wgmma.wait_group`` that covers their commit group (poison before it);
* ``prmt.b32`` byte by byte, including the sign-replicate mode;
* ``cp.async``: deferred. A copy is recorded when issued and performed only at the ``cp.async.wait_group``
  that covers it, so shared memory read before its wait (and barrier) still holds the poison; a copy never
  waited for is reported;
* ``dp4a``, the votes, and the FP32 / FP64 helpers as IEEE C++ (double products exact, one rounding);
* ``__shfl_sync`` with a per-lane source lane (fiber_emu's own shuffle takes one source for all lanes).

Kernels are lowered with ``tilelang.lower`` (no nvcc) through the wrappers' launch plans
(``paged_plan`` / ``ragged_plan``), so the emulated launch is the one the wrapper makes.

    emulate_paged(**kwargs_of_paged_index_logits, config=..., sms=...) -> logits (CPU tensors)

``mutate="old=>new"`` (every ``emulate_*``) patches the generated source once, as ``fiber_emu.build``'s
argument; kernels without ``old`` (other static configurations) run unchanged.
"""

import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from tools.cuda_emu import cached_text  # noqa: E402
from tools.fiber_emu import SCHEDULES, WORK, build  # noqa: E402

EMU_PRELUDE = r"""
struct uint4 { uint x, y, z, w; };
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
inline unsigned il_prmt(unsigned a, unsigned b, unsigned c) {
  unsigned long long v = ((unsigned long long)b << 32) | a; unsigned r = 0;
  for (int n = 0; n < 4; ++n) {
    unsigned s = (c >> (4 * n)) & 0xFu, byte = (unsigned)(v >> (8 * (s & 7u))) & 0xFFu;
    if (s & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    r |= byte << (8 * n);
  }
  return r;
}
struct EmuMmaWarp { unsigned a[32][4]; unsigned b[32][2]; int c[32][4]; };
static EmuMmaWarp g_emu_mma[64];
template <bool SignedA> inline void emu_mma(int* d, const unsigned* a, const unsigned* b, int c0, int c1, int c2, int c3) {
  int w = g_cur / 32, l = g_cur % 32;
  EmuMmaWarp& M = g_emu_mma[w];
  for (int i = 0; i < 4; ++i) M.a[l][i] = a[i];
  M.b[l][0] = b[0]; M.b[l][1] = b[1];
  M.c[l][0] = c0; M.c[l][1] = c1; M.c[l][2] = c2; M.c[l][3] = c3;
  emu_syncwarp(__LINE__);
  int g = l / 4, q = l % 4, res[4];
  for (int i = 0; i < 4; ++i) {
    int row = g + 8 * (i / 2), col = 2 * q + (i % 2);
    long long acc = M.c[l][i];
    for (int k = 0; k < 32; ++k) {
      unsigned ab = (M.a[4 * (row % 8) + (k % 16) / 4][(row / 8) + 2 * (k / 16)] >> (8 * (k % 4))) & 0xFFu;
      int av = SignedA ? (int)(signed char)ab : (int)ab;
      int bv = (int)(signed char)((M.b[4 * col + (k % 16) / 4][k / 16] >> (8 * (k % 4))) & 0xFFu);
      acc += (long long)av * bv;
    }
    res[i] = (int)acc;
  }
  emu_syncwarp(__LINE__);
  for (int i = 0; i < 4; ++i) d[i] = res[i];
}
inline void il_mma(int* d, const unsigned* a, const unsigned* b, int c0, int c1, int c2, int c3) { emu_mma<false>(d, a, b, c0, c1, c2, c3); }
inline void il_mma_ss(int* d, const unsigned* a, const unsigned* b, int c0, int c1, int c2, int c3) { emu_mma<true>(d, a, b, c0, c1, c2, c3); }
// wgmma: the CTA is one warpgroup (128 threads); at issue the threads publish their A fragments, meet at
// a block barrier, and each computes its own D elements from every A fragment and the B bytes its
// descriptor addresses (start, lbo: K direction between the two core matrices of a k32 step, sbo: between
// groups of 8 B rows; core matrix = 8 rows x 16 bytes, row r at 16 r). The result reaches the registers only
// at the wait_group that covers its commit group; until then they hold poison, so a read before the wait
// gives wrong results (a chained wgmma accumulates onto the pending result, as the hardware does).
static unsigned g_emu_wga[16][128][4];
struct EmuWgPending { int* d; int group; std::vector<int> v; };
static std::vector<EmuWgPending> g_emu_wgp[2048];
static int g_emu_wg_group[2048];
static unsigned g_emu_wg_bx[2048], g_emu_wg_by[2048];
// a thread's asynchronous operations belong to its block: at the first one of a new block, none may be left
template <class P> static void emu_owner(std::vector<P>* pend, int* group, unsigned* bx, unsigned* by, const char* what) {
  int t = g_cur;
  if (bx[t] != blockIdx.x || by[t] != (unsigned)blockIdx.y) {
    if (!pend[t].empty()) { fprintf(stderr, "EMU ERROR: %s never waited for (thread %d)\n", what, t); exit(3); }
    bx[t] = blockIdx.x; by[t] = blockIdx.y; group[t] = 0;
  }
}
static void emu_wg_owner() { emu_owner(g_emu_wgp, g_emu_wg_group, g_emu_wg_bx, g_emu_wg_by, "wgmma"); }
inline unsigned long long il_wg_desc(const void* p, unsigned lbo, unsigned sbo) {
  unsigned s = (unsigned)((const uchar*)p - (const uchar*)buf_dyn_shmem);
  return (unsigned long long)((s & 0x3FFFF) >> 4) | ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16) |
         ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32);
}
inline void il_wg_fence() {}
inline void il_wg_commit() { emu_wg_owner(); g_emu_wg_group[g_cur]++; }
inline void il_wg_wait0() {
  emu_wg_owner();
  std::vector<EmuWgPending>& v = g_emu_wgp[g_cur];
  for (auto& p : v) {
    if (p.group >= g_emu_wg_group[g_cur]) { fprintf(stderr, "EMU ERROR: wgmma waited for before its commit\n"); exit(3); }
    for (size_t i = 0; i < p.v.size(); ++i) p.d[i] = p.v[i];
  }
  v.clear();
}
inline void il_fence_proxy_async() {}
inline void il_wg_regs_n32(int*) {}
inline void il_wg_regs_n64(int*) {}
inline void il_wg_regs_n128(int*) {}
template <int N> inline void emu_wgmma(int* d, const unsigned* a, unsigned long long desc, int scale_d) {
  if (g_bt != 128) { fprintf(stderr, "EMU ERROR: wgmma needs a CTA of one warpgroup\n"); exit(3); }
  emu_wg_owner();
  int blk = g_cur / g_bt, t = g_cur % g_bt, w = t / 32, l = t % 32, g = l / 4, q = l % 4;
  for (int i = 0; i < 4; ++i) g_emu_wga[blk][t][i] = a[i];
  __syncthreads();
  const uchar* sm = (const uchar*)buf_dyn_shmem;
  unsigned start = (unsigned)(desc & 0x3FFF) << 4, lbo = (unsigned)((desc >> 16) & 0x3FFF) << 4,
           sbo = (unsigned)((desc >> 32) & 0x3FFF) << 4;
  const int* base = d;  // the accumulator: the newest pending result into d, else the registers
  std::vector<EmuWgPending>& pend = g_emu_wgp[g_cur];
  for (auto& p : pend) if (p.d == d) base = p.v.data();
  std::vector<int> res(N / 2);
  for (int j = 0; j < N / 8; ++j)
    for (int i = 0; i < 4; ++i) {
      int row = 16 * w + g + 8 * (i / 2), col = 8 * j + 2 * q + (i % 2);
      long long acc = scale_d ? base[4 * j + i] : 0;
      for (int k = 0; k < 32; ++k) {
        int r = row % 16;
        unsigned reg = g_emu_wga[blk][32 * w + 4 * (r % 8) + (k % 16) / 4][(r / 8) + 2 * (k / 16)];
        int av = (int)(signed char)((reg >> (8 * (k % 4))) & 0xFFu);
        int bv = (int)(signed char)sm[start + (col / 8) * sbo + (k / 16) * lbo + (col % 8) * 16 + k % 16];
        acc += (long long)av * bv;
      }
      res[4 * j + i] = (int)acc;
    }
  __syncthreads();
  pend.push_back({d, g_emu_wg_group[g_cur], res});
  for (int i = 0; i < N / 2; ++i) d[i] = (int)0x7FC00000 + i;  // poison until the wait
}
inline void il_wgmma_n32(int* d, const unsigned* a, unsigned long long desc, int s) { emu_wgmma<32>(d, a, desc, s); }
inline void il_wgmma_n64(int* d, const unsigned* a, unsigned long long desc, int s) { emu_wgmma<64>(d, a, desc, s); }
inline void il_wgmma_n128(int* d, const unsigned* a, unsigned long long desc, int s) { emu_wgmma<128>(d, a, desc, s); }
struct EmuCp { void* dst; const void* src; int n, bytes, group; unsigned bx, by; };
static std::vector<EmuCp> g_emu_cp[2048];
static int g_emu_group[2048];
static unsigned g_emu_bx[2048], g_emu_by[2048];
static void emu_cp_owner() { emu_owner(g_emu_cp, g_emu_group, g_emu_bx, g_emu_by, "cp.async"); }
inline void il_cp16(void* s, const void* g, int bytes) { emu_cp_owner(); g_emu_cp[g_cur].push_back({s, g, 16, bytes, g_emu_group[g_cur], 0, 0}); }
inline void il_cp4(void* s, const void* g, int bytes) { emu_cp_owner(); g_emu_cp[g_cur].push_back({s, g, 4, bytes, g_emu_group[g_cur], 0, 0}); }
inline void il_cp_commit() { emu_cp_owner(); g_emu_group[g_cur]++; }
template <int N> inline void il_cp_wait() {
  emu_cp_owner();
  std::vector<EmuCp>& v = g_emu_cp[g_cur];
  int done = g_emu_group[g_cur] - 1 - N;
  std::vector<EmuCp> keep;
  for (auto& c : v) {
    if (c.group <= done) { memcpy(c.dst, c.src, c.bytes); memset((char*)c.dst + c.bytes, 0, c.n - c.bytes); }
    else keep.push_back(c);
  }
  v.swap(keep);
}
inline unsigned il_ld32(const unsigned char* p) { unsigned r; memcpy(&r, p, 4); return r; }
inline int il_dp4a(unsigned a, unsigned b) {
  int s = 0;
  for (int i = 0; i < 4; ++i) s += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
  return s;
}
inline int emu_any(int line, bool p) {
  return (int)warp_xchg(line, p ? 1 : 0, [&](int q, uint64_t* s) { for (int j = 0; j < 32; ++j) if (s[j]) return (uint64_t)1; return (uint64_t)0; });
}
// __shfl_sync with a lane-dependent source (fiber_emu's emu_shfl evaluates the source lane of the last
// lane to arrive for every lane): values through a per-warp table between two warp barriers
static uint64_t g_emu_shfl[64][32];
template <class T> inline T il_emu_shfl_sync(unsigned, T v, int src, int) {
  int w = g_cur / 32, l = g_cur % 32;
  g_emu_shfl[w][l] = to_u64(v);
  emu_syncwarp(__LINE__);
  T r = from_u64<T>(g_emu_shfl[w][src & 31]);
  emu_syncwarp(__LINE__);
  return r;
}
inline int il_any(int p) { return emu_any(__LINE__, p != 0); }
inline int il_all(int p) { return emu_all(__LINE__, p != 0); }
inline float il_pow2_scale(double x, int e) { return (float)(x * std::ldexp(1.0, e)); }
inline float il_w_denorm(float w) { return (w * 18889465931478580854784.0f) * 37778931862957161709568.0f; }
inline float il_key_scale(float s, int e) {
  float lo = __int_as_float((e > 127 ? e - 64 + 127 : e + 127) << 23);
  return (e > 127 ? s * 18446744073709551616.0f : s) * lo;
}
"""

SRC_DIR = os.path.join(WORK, "index_logits_src")


def _module_hash() -> str:
    import tilelang_ops.index_logits.ptx as P
    import tilelang_ops.index_logits.quantize as Q
    import tilelang_ops.index_logits.scores as S

    h = hashlib.md5()
    for m in (P, Q, S):
        h.update(open(m.__file__, "rb").read())
    return h.hexdigest()[:10]


def lowered_source(factory, *static) -> str:
    """The kernel's CUDA source from tilelang.lower (no nvcc), cached on disk."""
    key = os.path.join(SRC_DIR, f"{factory.__name__ if hasattr(factory, '__name__') else 'k'}_{_module_hash()}_"
                       + hashlib.md5(repr(static).encode()).hexdigest()[:10] + ".cu")

    def lower() -> str:
        import tilelang
        from tilelang import tvm

        func = factory.get_tir(*static)
        target = {"kind": "cuda", "arch": "sm_90a"}
        with tvm.target.Target(target), tvm.transform.PassContext(config=factory.pass_configs or {}):
            return tilelang.lower(func, target=target).kernel_source

    return cached_text(key, lower)


def emu_source(src: str) -> str:
    from tilelang_ops.index_logits.ptx import PRELUDE

    src = src.replace(PRELUDE, "").replace("__shfl_sync(", "il_emu_shfl_sync(")
    at = src.index('extern "C"')
    src = src[:at] + EMU_PRELUDE + src[at:]
    src = src.replace("extern __shared__ __align__(1024) uint sm[];", "uint* sm = (uint*)buf_dyn_shmem;")
    return src


_LIBS: dict = {}


def _library(factory, static, name, mutate=None):
    k = (name, static, mutate)
    if k not in _LIBS:
        _LIBS[k] = build(emu_source(lowered_source(factory, *static)), name, mutate=mutate, mutate_any=True)
    return _LIBS[k]


def _run(lib_names_types, values: dict, grid, threads: int, seed: int, schedule: str = "random") -> None:
    import ctypes

    lib, names, types = lib_names_types
    cargs = []
    for n, t in zip(names, types):
        if n not in values:
            raise KeyError(f"emulator: no value for kernel parameter {n!r} ({t}); known {sorted(values)}")
        v = values[n]
        if "*" in t:
            assert v.is_contiguous() and v.device.type == "cpu", n
            cargs.append(ctypes.c_void_p(v.data_ptr()))
        elif "int64" in t:
            cargs.append(ctypes.c_int64(int(v)))
        else:
            cargs.append(ctypes.c_int(int(v)))
    rc = lib.launch(ctypes.c_int(grid[0]), ctypes.c_int(grid[1]), ctypes.c_int(threads), ctypes.c_int(1),
                    ctypes.c_uint(seed), ctypes.c_int(SCHEDULES.index(schedule)), ctypes.c_int(1), *cargs)
    if rc != 0:
        raise RuntimeError("emulated kernel failed")


def emulate_paged(*, config=None, sms=132, seed=0, schedule="random", mutate=None, **kw):
    """``paged_index_logits(**kw)`` run on the CPU emulator (CPU tensors); returns the logits."""
    from tilelang_ops.index_logits import paged_plan
    from tilelang_ops.index_logits.scores import scores_kernel

    static, args, grid, logits, geom = paged_plan(**kw, config=config, sms=sms)
    if geom.b == 0 or kw["max_klen"] == 0:
        return logits
    q, qs, w, cache, table, klen, cand, out, n, bc, nblk, cbs, kps, clean = args
    # the tensors come in the callers' shapes: q [b, n, H, 64], cand [b, n, c], out [b, n, max_klen]
    vals = dict(q_codes=q, q_scales=qs, weights=w, cache=cache, table=table, klen=klen, cand=cand, out=out,
                n=n, nrows=n, bc=bc, num_blocks=nblk, cbs=cbs, kps=kps, clean=clean, nper=q.shape[1],
                nb_rows=table.shape[0], mb=table.shape[1], max_blocks=table.shape[1], ncol=out.shape[-1],
                ld_out=out.shape[-1], ncand=cand.shape[-1])
    _run(_library(scores_kernel, static, "il_" + static[0], mutate), vals, grid, 32 * static[3], seed, schedule)
    return logits


def emulate_ragged(*, config=None, sms=132, seed=0, schedule="random", mutate=None, **kw):
    """``ragged_index_logits(**kw)`` run on the CPU emulator (CPU tensors); returns the logits."""
    from tilelang_ops.index_logits import ragged_plan
    from tilelang_ops.index_logits.scores import scores_kernel

    static, args, grid, logits, geom = ragged_plan(**kw, config=config, sms=sms)
    if geom.t == 0 or kw["max_width"] == 0 or geom.num_keys == 0:
        if geom.num_keys == 0 and kw.get("clean") and geom.t and kw["max_width"]:
            logits.fill_(float("-inf"))
        return logits
    q, qs, w, kc, ksc, ks, ke, out, max_width, kps, clean = args
    vals = dict(q_codes=q, q_scales=qs, weights=w, k_codes=kc, k_scales=ksc, ks=ks, ke=ke, out=out,
                max_width=max_width, kps=kps, clean=clean, nq=q.shape[0], nkeys=kc.shape[0], nkey_total=kc.shape[0],
                ncol=out.shape[1],
                ld_out=out.shape[1])
    _run(_library(scores_kernel, static, "il_ragged", mutate), vals, grid, 32 * static[3], seed, schedule)
    return logits


def emulate_quantize(x, seed=0, schedule="random", mutate=None):
    """``quantize_index_rows(x)`` on the CPU emulator; returns (codes, scales)."""
    from tilelang_ops.index_logits.quantize import THREADS, quantize_kernel

    rows = x.reshape(-1, 128).contiguous()
    codes = torch.empty((rows.shape[0], 64), dtype=torch.uint8)
    scales = torch.empty((rows.shape[0], 4), dtype=torch.uint8)
    if rows.shape[0]:
        vals = dict(x=rows, codes=codes, scales=scales, rows=rows.shape[0])
        grid = (-(-rows.shape[0] * 4 // THREADS), 1)
        _run(_library(quantize_kernel, (THREADS,), "il_quantize", mutate), vals, grid, THREADS, seed, schedule)
    return codes.reshape(*x.shape[:-1], 64), scales.reshape(*x.shape[:-1], 4)
