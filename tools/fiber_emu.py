# ruff: noqa: E501, E701, E702, E731
"""CPU emulation of a generated TileLang CUDA kernel, for checking indexing and synchronization logic
without a GPU: one fiber (ucontext) per CUDA thread, a seeded random scheduler that switches only at
__syncthreads and warp intrinsics (shfl / ballot / all / match_any; all 32 lanes of a warp must reach the
same call site, else it reports a divergent intrinsic or a deadlock), shared memory poisoned before
every block, blocks run in a random order. Atomics are plain adds (fibers never interleave inside one).
The warp-serial schedule (``EmuKernel.schedule = "warps"``) runs each warp on to its next __syncthreads
before a later warp (random warp order) moves: a shared-memory race between two barriers, which the
random switches rarely hit, then changes the results.
Thread block clusters: with ``cluster`` > 1 the blocks of one cluster run together (their fibers share the
scheduler), each with its own shared memory; ``emu_cluster_arrive`` / ``emu_cluster_wait`` are the cluster
barrier's halves and ``emu_cluster_ptr(p, rank)`` maps a shared-memory pointer into block ``rank`` of the
cluster (the kernel's DSMEM helpers are replaced by these in tools/check_topk_emu.py).
Used by tools/check_topk_emu.py.
"""
import ctypes
import os
import re

from tools.cuda_emu import shared_library

WORK = os.environ.get("FIBER_EMU_DIR", "/tmp/fiber_emu")
# the schedules a launch takes (the shim's g_sched is the position): random switches, warp-serial
SCHEDULES = ("random", "warps")

SHIM = r'''// CPU emulation of a CUDA thread block: one fiber (ucontext) per CUDA thread, a random scheduler,
// __syncthreads and warp intrinsics as barriers (all lanes of a warp must reach the same call site).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
#include <algorithm>
#include <limits>
#include <type_traits>
#include <ucontext.h>
typedef unsigned char uchar;
typedef unsigned int uint;
#define CUDART_INF_F std::numeric_limits<float>::infinity()
#define __global__
#define __launch_bounds__(a, b)
#define __align__(n) __attribute__((aligned(n)))
struct dim3_ { int x, y, z; };
static dim3_ threadIdx, blockIdx;
#define EMU_MAX_CLUSTER 8
static uchar g_shmem[EMU_MAX_CLUSTER][232 * 1024] __attribute__((aligned(1024)));
static int g_cur, g_nthreads, g_bt;  // current fiber, fibers (all blocks of the cluster), threads per block
#define buf_dyn_shmem (g_shmem[g_cur / g_bt])
template <class A, class B> inline auto max(A a, B b) { typedef std::common_type_t<A, B> C; return (C)a > (C)b ? (C)a : (C)b; }
template <class A, class B> inline auto min(A a, B b) { typedef std::common_type_t<A, B> C; return (C)a < (C)b ? (C)a : (C)b; }
inline int __popc(uint x) { return __builtin_popcount(x); }
inline int __clz(uint x) { return x ? __builtin_clz(x) : 32; }
template <class T> inline T AtomicAdd(T* a, T v) { T o = *a; *a = o + v; return o; }
struct bfloat16_t { uint16_t bits;
  bfloat16_t() = default;
  bfloat16_t(float f) { uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) bits = (u >> 16) | 0x40; else { u += 0x7fffu + ((u >> 16) & 1u); bits = u >> 16; } }
  operator float() const { uint32_t u = (uint32_t)bits << 16; float f; memcpy(&f, &u, 4); return f; }
  bfloat16_t operator-() const { bfloat16_t r; r.bits = bits ^ 0x8000; return r; } };
namespace std { template <> struct numeric_limits<bfloat16_t> {
  static bfloat16_t infinity() { bfloat16_t r; r.bits = 0x7f80; return r; } }; }

// ---- scheduler
struct Fiber { ucontext_t ctx; int tid; int state; /*0 run,1 blocked,2 done*/ std::vector<char> stack; int gen; };
static std::vector<Fiber> g_f;
static ucontext_t g_main;
static int g_blk0;  // first block of the running cluster
static std::vector<int> g_runnable;
static std::mt19937 g_rng;
static int g_bar_count[EMU_MAX_CLUSTER]; static std::vector<int> g_bar_wait[EMU_MAX_CLUSTER];
static int g_cl_gen, g_cl_count; static std::vector<int> g_cl_wait;  // cluster barrier
struct WarpBar { int count = 0; int line = -1; std::vector<int> wait; uint64_t slot[32]; uint64_t out[32]; };
static std::vector<WarpBar> g_wb;
static int g_error;
static int g_sched;  // 0: random at every switch point; 1: warp-serial (run_block)
static void fail(const char* m, int line) { fprintf(stderr, "EMU ERROR: %s (line %d, tid %d)\n", m, line, g_cur); g_error = 1; exit(3); }
static void set_ids() { threadIdx.x = g_cur % g_bt; blockIdx.x = g_blk0 + g_cur / g_bt; }
static void yield_() { swapcontext(&g_f[g_cur].ctx, &g_main); set_ids(); }
static void block_() { g_f[g_cur].state = 1; yield_(); }
inline void __syncthreads() {
  int blk = g_cur / g_bt;
  g_bar_count[blk]++;
  if (g_bar_count[blk] == g_bt) {
    g_bar_count[blk] = 0;
    for (int t : g_bar_wait[blk]) { g_f[t].state = 0; g_runnable.push_back(t); }
    g_bar_wait[blk].clear();
    yield_();
  } else { g_bar_wait[blk].push_back(g_cur); block_(); }
}
// cluster barrier: arrive records the open generation; wait blocks until every fiber of the cluster
// has arrived in it (a fiber arrives again only after its wait, so one open generation suffices)
inline void emu_cluster_arrive() {
  g_f[g_cur].gen = g_cl_gen;
  if (++g_cl_count == g_nthreads) {
    g_cl_count = 0; g_cl_gen++;
    for (int t : g_cl_wait) { g_f[t].state = 0; g_runnable.push_back(t); }
    g_cl_wait.clear();
  }
  yield_();
}
inline void emu_cluster_wait() {
  while (g_cl_gen <= g_f[g_cur].gen) { g_cl_wait.push_back(g_cur); block_(); }
}
template <class T> inline T* emu_cluster_ptr(T* p, unsigned rank) {
  if (rank >= (unsigned)(g_nthreads / g_bt)) { fprintf(stderr, "EMU ERROR: DSMEM rank %u\n", rank); exit(3); }
  return (T*)(g_shmem[rank] + ((uchar*)p - g_shmem[g_cur / g_bt]));
}
// exchange: every lane deposits v, after all 32 arrived each lane gets f(lane, slots)
template <class F> inline uint64_t warp_xchg(int line, uint64_t v, F f) {
  int w = g_cur / 32, l = g_cur % 32; WarpBar& b = g_wb[w];
  if (b.count == 0) b.line = line; else if (b.line != line) fail("divergent warp intrinsic", line);
  b.slot[l] = v; b.count++;
  if (b.count == 32) {
    for (int q = 0; q < 32; ++q) b.out[q] = f(q, b.slot);
    b.count = 0; b.line = -1;
    for (int t : b.wait) { g_f[t].state = 0; g_runnable.push_back(t); }
    b.wait.clear();
    uint64_t r = b.out[l];
    yield_();
    return r;
  }
  b.wait.push_back(g_cur); block_();
  return b.out[l];  // valid: nobody rewrites out before every lane of this round has resumed? see below
}
template <class T> inline uint64_t to_u64(T v) { uint64_t r = 0; memcpy(&r, &v, sizeof(T)); return r; }
template <class T> inline T from_u64(uint64_t r) { T v; memcpy(&v, &r, sizeof(T)); return v; }
template <class T> inline T emu_shfl(int line, T v, int src) {
  return from_u64<T>(warp_xchg(line, to_u64(v), [&](int q, uint64_t* s) { return s[src & 31]; }));
}
template <class T> inline T emu_shfl_xor(int line, T v, int d) {
  return from_u64<T>(warp_xchg(line, to_u64(v), [&](int q, uint64_t* s) { return s[(q ^ d) & 31]; }));
}
template <class T> inline T emu_shfl_up(int line, T v, int d) {
  return from_u64<T>(warp_xchg(line, to_u64(v), [&](int q, uint64_t* s) { return q >= d ? s[q - d] : s[q]; }));
}
inline uint emu_ballot(int line, bool p) {
  return (uint)warp_xchg(line, p ? 1 : 0, [&](int q, uint64_t* s) { uint m = 0; for (int j = 0; j < 32; ++j) if (s[j]) m |= 1u << j; return (uint64_t)m; });
}
inline int emu_all(int line, bool p) {
  return (int)warp_xchg(line, p ? 1 : 0, [&](int q, uint64_t* s) { for (int j = 0; j < 32; ++j) if (!s[j]) return (uint64_t)0; return (uint64_t)1; });
}
template <class T> inline uint emu_match_any(int line, T v) {
  return (uint)warp_xchg(line, to_u64(v), [&](int q, uint64_t* s) { uint m = 0; for (int j = 0; j < 32; ++j) if (s[j] == s[q]) m |= 1u << j; return (uint64_t)m; });
}
inline void emu_syncwarp(int line) { warp_xchg(line, 0, [&](int q, uint64_t* s) { return (uint64_t)0; }); }
#define __syncwarp(...) emu_syncwarp(__LINE__)
#define __shfl_sync(m, v, s, w) emu_shfl(__LINE__, v, s)
#define __shfl_xor_sync(m, v, d, w) emu_shfl_xor(__LINE__, v, d)
#define __shfl_up_sync(m, v, d, w) emu_shfl_up(__LINE__, v, d)
#define __ballot_sync(m, p) emu_ballot(__LINE__, p)
#define __all_sync(m, p) emu_all(__LINE__, p)
#define __match_any_sync(m, v) emu_match_any(__LINE__, v)

static void (*g_body)();
static void fiber_entry() { set_ids(); g_body(); g_f[g_cur].state = 2; }
// run one block (or the blocks of one cluster: `threads` = all their threads): all fibers, random
// scheduling; returns 0 ok
static int run_block(int threads, void (*body)(), int poison) {
  g_body = body; g_nthreads = threads; g_cl_gen = g_cl_count = 0; g_cl_wait.clear();
  for (int c = 0; c < EMU_MAX_CLUSTER; ++c) { g_bar_count[c] = 0; g_bar_wait[c].clear(); }
  g_wb.assign(threads / 32, WarpBar());
  if (poison) memset(g_shmem, 0xA5, sizeof(g_shmem));  // stale shared memory must not matter
  g_f.resize(threads);
  g_runnable.clear();
  for (int t = 0; t < threads; ++t) {
    Fiber& f = g_f[t]; f.tid = t; f.state = 0; f.stack.resize(256 * 1024);
    getcontext(&f.ctx); f.ctx.uc_stack.ss_sp = f.stack.data(); f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = &g_main; makecontext(&f.ctx, fiber_entry, 0);
    g_runnable.push_back(t);
  }
  // g_sched 1 (warp-serial): warps in a random priority order, the runnable fiber of the first warp runs,
  // so a warp goes on to its next __syncthreads before any later warp moves; a race between two barriers
  // (one warp's write against another's read of the same interval) then shows in the results
  std::vector<int> prio;
  if (g_sched) {
    prio.resize(threads / 32);
    for (size_t w = 0; w < prio.size(); ++w) prio[w] = (int)w;
    std::shuffle(prio.begin(), prio.end(), g_rng);
  }
  int done = 0;
  while (!g_runnable.empty()) {
    size_t j = 0;
    if (g_sched) { for (size_t q = 1; q < g_runnable.size(); ++q) if (prio[g_runnable[q] / 32] < prio[g_runnable[j] / 32]) j = q; }
    else j = g_rng() % g_runnable.size();
    int t = g_runnable[j]; g_runnable[j] = g_runnable.back(); g_runnable.pop_back();
    g_cur = t; set_ids();
    swapcontext(&g_main, &g_f[t].ctx);
    if (g_f[t].state == 0) g_runnable.push_back(t);
    else if (g_f[t].state == 2) done++;
  }
  if (done != threads) { fprintf(stderr, "EMU ERROR: deadlock, %d of %d threads finished\n", done, threads); return 1; }
  return 0;
}
'''



def build(src, name, opt="-O1", *, mutate=None, mutate_any=False):
    """The kernel source `src` as a shared library: (library, parameter names, parameter types).
    `mutate` ("old=>new") replaces `old` once in the source, for mutation testing of a checker (a broken
    kernel must be caught); a source without `old` is an error, unless `mutate_any` (a run whose kernels
    differ by static configuration, where only some hold the target: the others build unchanged)."""
    if mutate:
        old, new = mutate.split("=>")
        assert old in src or mutate_any, f"mutation target not found: {old}"
        src = src.replace(old, new, 1)
    lines = []
    for l in src.splitlines():
        if l.startswith("#") or "_tl_orig_alignas" in l or "alignas(N)" in l:
            continue
        if "extern __shared__" in l:
            continue
        lines.append(l)
    body = "\n".join(lines)
    protos = re.findall(r'extern "C" __global__ void (\w+)\((.*?)\);', body)
    kname, params = protos[0]
    body = body.replace(f'extern "C" __global__ void {kname}({params});', "")
    ps = [p.strip() for p in params.split(",")]
    names = [p.split()[-1] for p in ps]
    types = [" ".join(p.replace("__restrict__", "").split()[:-1]) for p in ps]
    glob = "\n".join(f"static {t} g_{n};" for t, n in zip(types, names))
    launcher = f'''
{glob}
static void body_fn() {{ {kname}({", ".join("g_" + n for n in names)}); }}
extern "C" int launch(int grid, int gridy, int threads, int cluster, unsigned seed, int sched, int poison, {", ".join(f"{t} {n}" for t, n in zip(types, names))}) {{
  g_rng.seed(seed); g_sched = sched;
  {" ".join(f"g_{n} = {n};" for n in names)}
  if (cluster < 1 || cluster > EMU_MAX_CLUSTER || grid % cluster) return 2;
  g_bt = threads;
  int emu_ncl = grid / cluster;  // clusters along x (1-D clusters)
  std::vector<int> order(emu_ncl * gridy); for (int i = 0; i < emu_ncl * gridy; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), g_rng);
  for (int ci : order) {{ g_blk0 = (ci % emu_ncl) * cluster; blockIdx.y = ci / emu_ncl; if (run_block(threads * cluster, body_fn, poison)) return 1; }}
  return 0;
}}
'''
    code = SHIM + "\n#include <algorithm>\n" + body + launcher
    so = shared_library(code, WORK, name, [opt, "-std=c++20", "-fno-strict-aliasing"])
    return ctypes.CDLL(so), names, types


class EmuKernel:
    def __init__(self, src, name, param_order, shapes, mutate=None):
        """param_order: prim_func tensor/scalar names in call order; shapes: dyn name -> (param, dim);
        mutate: as for build."""
        self.lib, self.names, self.types = build(src, name, mutate=mutate)
        self.param_order, self.shapes = param_order, shapes
        self.seed, self.poison, self.threads, self.grid_of, self.cluster = 0, 1, 1024, None, 1
        self.schedule = "random"  # or "warps": warp-serial scheduling (the shim's g_sched)

    def __call__(self, *args):
        kw = dict(zip(self.param_order, args))
        for dyn, (pname, dim) in self.shapes.items():
            kw[dyn] = kw[pname].numel() if dim is None else kw[pname].shape[dim]
        cargs = []
        for n, t in zip(self.names, self.types):
            v = kw[n]
            if "*" in t:
                assert v.is_contiguous() or v.dim() == 1, n
                cargs.append(ctypes.c_void_p(v.data_ptr()))
            elif "int64" in t:
                cargs.append(ctypes.c_int64(int(v)))
            elif t in ("float",):
                cargs.append(ctypes.c_float(float(v)))
            else:
                cargs.append(ctypes.c_int(int(v)))
        grid = self.grid_of(kw)
        grid, gridy = grid if isinstance(grid, tuple) else (grid, 1)
        rc = self.lib.launch(ctypes.c_int(grid), ctypes.c_int(gridy), ctypes.c_int(self.threads),
                             ctypes.c_int(self.cluster), ctypes.c_uint(self.seed),
                             ctypes.c_int(SCHEDULES.index(self.schedule)),
                             ctypes.c_int(self.poison), *cargs)
        if rc != 0:
            raise RuntimeError("emulated kernel failed")
