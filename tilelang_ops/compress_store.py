"""TileLang kernel: fused compress -> RMSNorm -> RoPE -> cast -> paged-cache store (SPEC 1.5 main branch).

One launch per call goes from the projected inputs to cache rows: the gated mean of a group (FP32)
is rounded to BF16 and stays in registers, then ``tilelang_ops.kv_store.make_row_store`` (the store
kernel's own per-row ``@T.macro``, imported, not copied) normalizes, rotates, casts and stores it. The
compressed row never travels through global memory; the ring is updated in the same launch.

Work split (v1, prefill v2; decode v3 under Variants): one warp per compressed row, lane ``l``
holding channels ``16 l .. 16 l + 15`` (the store macro's layout), ``WARPS`` warps per CTA. Prefill warps
take ``PREFILL_ROWS_PER_WARP`` consecutive rows; a warp finds its first row's request with a 32-ary search
over ``cu_compressed`` (each step one load per lane and a warp sum, ``ceil(log32(num_reqs))`` steps) and
then steps forward row by row (every request owns at least one row). Decode has one row per query token.

Ring ordering (same guarantees as the compress kernel, SPEC 1.2-1.3):
* prefill: only a request's first row can read the ring (the group that began before the chunk). The
  warp computing that row writes the request's newest ``min(len, S)`` inputs to the ring right after
  reading, each lane writing exactly the channels it read, so program order alone puts every old
  read before the chunk's writes, whatever the block schedule and however long the chunk.
* decode: a group's in-step inputs are read from ``projected_kv`` (the neighbouring tokens of the
  same request: same slot, consecutive context lengths), older ones from the ring. The capacity rule
  ``S >= r + max_seqlen_q - 1`` (checked on the host) means no write of the step lands on an entry a
  group still reads, so all tokens' inputs are visible regardless of block order.

Arithmetic: the gated mean follows ``reference.compress`` operation by operation (max, ``expf`` of
the difference, ascending sums, separate IEEE multiply and add, IEEE division, one BF16 RNE cast),
the same sequence as the compress kernel (which uses ``T.exp`` = ``expf`` and ``--fmad=false``), so
the fused kernel's cache bytes, ring and out_norm are bitwise those of our two-kernel pipeline
(``two_kernel_*`` below); the store arithmetic is the store kernel's own macro (its docstring lists
the one documented difference from torch: the RMS sum-of-squares order). The compress kernel's gated
mean cannot be imported: it is written inline in its prim_func for another thread layout (4 channels
per thread, per-block metadata in shared memory); ``make_gated_mean`` is the same operation order
for the store macro's layout (16 channels per lane).

Variants (``VARIANTS[op]``; ``VARIANT`` per operation, or ``variant=`` per call): each operation keeps one
fast kernel, its default, plus "v1", the first version, verified on the H200 and kept as the baseline.
Prefill "v2" pipelines each warp's rows (row k's loads are in flight while row k-1 is normalized, cast
and stored), computes one ``expf`` per channel for r = 2 (the other weight is expf(+0) = 1 exactly;
non-finite scores fall back to v1's sequence) and keeps ring entries in int32. Decode "v3" splits a
CTA's work into two layouts: its four tokens' gated means with the compress kernel's layout (thread t:
channels 4t .. 4t+3; the CTA's tokens and the r - 1 before them loaded in one trip, so in-step
neighbours come from registers) into shared memory, a barrier, then one warp per token runs the store
macro; it needs no pipeline state (112-119 registers), so more warps share an SM. A v3 prefill (the
same two layouts: 1M FP8 tokens 1182 -> 1404 us) and a v2 decode (per-warp, speculative neighbour
loads: b4096q6 90.3 us against v3's 77.7) were removed after the H200 comparison (figures in
bench_results/h200.txt). All give the same bytes (CPU emulation of the generated CUDA,
tools/check_compress_store_emu.py; GPU tests of each variant).

Metadata that is out of range (slots, tokens, requests) makes a row skip (no store, no out_norm, no
ring write); it never reads or writes outside the tensors. Nothing is returned (see
``reference.compress_store``).
"""


import functools

import tilelang
import tilelang.language as T

from metadata.cache_format import BF16_KV_FORMAT, FP4_MAIN_KV_FORMAT, FP8_MAIN_KV_FORMAT
from metadata.checks import check_cuda, debug_checks_enabled
from metadata.compress_store_args import (
    MAIN_BRANCH_FORMATS,
    check_compress_store_decode_args,
    check_compress_store_decode_values,
    check_compress_store_prefill_args,
    check_compress_store_prefill_values,
)
from tilelang_ops.kv_store import _TORCH_TO_TL, VEC, _dummy_norm, _f32, kernel_supports, make_row_store

WARP = 32
# Launch shape (module-level so a benchmark sweep can change them between calls; they are static
# arguments of the factories, so every value compiles its own kernel).
WARPS = 4  # prefill warps per CTA
PREFILL_ROWS_PER_WARP = 4  # amortizes the request search over a few rows
DECODE_WARPS = 4  # decode warps (query tokens) per CTA
F4 = 4  # FP32 elements per 16-byte vector access
# Launch paths per operation (the module docstring's "Variants" says what each is and which were removed)
VARIANTS = {"prefill": ("v1", "v2"), "decode": ("v1", "v3")}
VARIANT = {"prefill": "v2", "decode": "v3"}
V2_WARPS = 4  # v2 prefill warps per CTA
V2_ROWS_PER_WARP = 16  # v2 prefill rows per warp (the pipeline's depth in time: one prologue per warp)
V2_ROWS_PER_WARP_SMALL = 4  # below V2_MANY_ROWS rows (more CTAs: shorter tail waves)
V2_MANY_ROWS = 131072
V2_MIN_CTAS_PER_SM = 3  # v2 prefill __launch_bounds__ minimum (<= 168 registers: 12 warps per SM)
# (rows per warp, warps, min CTAs per SM) candidates: the benchmark's sweep times them, the GPU tests check
# each bitwise (benchmarks/bench_compress_store.py says why each is there)
V2_PREFILL_SHAPES = [(8, 4, 3), (8, 2, 6), (12, 4, 3), (6, 4, 3), (4, 4, 3), (16, 4, 3), (8, 4, 2)]
# Tried on the H200 and dropped: an L2 prefetch (prefetch.global.L2, one line per lane per token) of the
# warp's row 1 / 2 ahead in stage B made 1M FP8 tokens slower, 1200 -> 1280 / 1370 us.
V3_ROWS = 4  # v3 decode: query tokens per CTA, = warps
V2_FAST = True  # the store macro's fast arithmetic (kv_store v3's: FFMA sum of squares, FMA e2m1), same bytes
# Bounds are explicit in the v2 prefill and v3 decode kernels (every index is checked or clamped before
# its access), so TileLang's per-access guards, which also re-evaluate 64-bit ring modulos per vector,
# are off.
# The init check is off as well: it flags the pipeline's registers (read in stage A of iteration k,
# written in stage B of iteration k - 1), a pattern it cannot follow.
V2_PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True, "tl.disable_buffer_init_check": True}

_FORMATS = {f.name: f for f in MAIN_BRANCH_FORMATS}

# (format, ratio) pairs the build check compiles (rope 64, interleaved, BF16 weight, out_norm, int32 ids)
BUILD_SHAPES = [(f.name, 2) for f in (FP8_MAIN_KV_FORMAT, FP4_MAIN_KV_FORMAT, BF16_KV_FORMAT)]


def _expf(x):
    # The CUDA math library's expf (what torch's exp and the compress kernel's T.exp call on the GPU),
    # never the __expf approximation.
    return T.call_extern("float32", "expf", x)


@tilelang.jit
def expf_probe_kernel(threads: int = 256):
    """Test probe, not an operator: y[i] = expf(x[i]) through ``_expf`` with the fused kernels' compile
    options (the GPU test that torch's exp and the kernels' expf agree bitwise)."""
    n = T.dynamic("n")

    @T.prim_func
    def kernel(
        x: T.Tensor((n,), "float32"),  # [n] fp32
        y: T.Tensor((n,), "float32"),  # [n] fp32, expf(x)
    ):
        with T.Kernel(T.ceildiv(n, threads), threads=threads) as bx:
            tx = T.get_thread_binding()
            if bx * threads + tx < n:
                y[bx * threads + tx] = _expf(x[bx * threads + tx])

    return kernel


def make_gated_mean(r: int, width: int = VEC):
    """``@T.macro``: x[w] = float(bf16(sum_t softmax_t(s_t) * v_t)) for this thread's ``width`` channels.

    ``sc``/``lt`` local FP32 [r, width]: score and latent of the r positions in ascending order.
    Operation order of ``reference.compress.gated_mean``.
    """

    @T.macro
    def gated_mean(sc, lt, x):
        mx = T.alloc_local([width], "float32")
        den = T.alloc_local([width], "float32")
        num = T.alloc_local([width], "float32")
        w = T.alloc_local([width], "float32")
        for i in T.unroll(width):
            mx[i] = sc[0, i]
        for t in range(1, r):
            for i in T.unroll(width):
                mx[i] = T.max(mx[i], sc[t, i])
        for i in T.unroll(width):
            w[i] = _expf(T.ieee_sub(sc[0, i], mx[i]))
            den[i] = w[i]
            num[i] = T.ieee_mul(w[i], lt[0, i])
        for t in range(1, r):
            for i in T.unroll(width):
                w[i] = _expf(T.ieee_sub(sc[t, i], mx[i]))
                den[i] = T.ieee_add(den[i], w[i])
                num[i] = T.ieee_add(num[i], T.ieee_mul(w[i], lt[t, i]))
        for i in T.unroll(width):
            x[i] = T.Cast("float32", T.Cast("bfloat16", T.ieee_fdiv(num[i], den[i])))

    return gated_mean


def make_gated_mean_v2(r: int, width: int = VEC):
    """``make_gated_mean`` with one ``expf`` per channel for r = 2, same bits.

    For finite scores, m = max(s0, s1) is one of them, so that score's difference is +0 and its
    weight expf(+0) = 1 exactly; the other difference is s_min - s_max = -|s0 - s1| (IEEE subtraction
    is sign-symmetric). With diff = s0 - s1 and e = expf(-|diff|):
        den = 1 + e                      (v1: w0 + w1, either order: FP32 addition commutes)
        num = v_big + e * v_small        (v1: w0 * v0 + w1 * v1 with one weight 1: 1 * v = v)
    where v_big is the latent of the larger score (s0 when diff >= 0; equal scores give e = 1, either
    way). A NaN latent gives a NaN row in both (v1's 1 * NaN and this sum both end in the BF16 cast's
    canonical NaN). The lane takes this path when the sum of its ``width`` diffs is finite, i.e. every score
    pair is finite and no difference overflows; otherwise it runs v1's two-expf sequence (so infinite
    or NaN scores give v1's bits). Other ratios use ``make_gated_mean``.
    """
    if r != 2:
        return make_gated_mean(r, width)
    slow = make_gated_mean(r, width)

    @T.macro
    def gated_mean(sc, lt, x):
        diff = T.alloc_local([width], "float32")
        acc = T.alloc_var("float32")
        acc = T.float32(0)
        for i in T.unroll(width):
            diff[i] = T.ieee_sub(sc[0, i], sc[1, i])
            acc = T.ieee_add(acc, diff[i])  # inf / NaN once any diff is (and stays so)
        if T.abs(acc) <= _f32(3.4028234663852886e38):
            for i in T.unroll(width):
                e = _expf(-T.abs(diff[i]))
                x[i] = T.Cast("float32", T.Cast("bfloat16", T.ieee_fdiv(
                    T.ieee_add(T.if_then_else(diff[i] >= T.float32(0), lt[0, i], lt[1, i]),
                               T.ieee_mul(e, T.if_then_else(diff[i] >= T.float32(0), lt[1, i], lt[0, i]))),
                    T.ieee_add(_f32(1.0), e))))
        else:
            slow(sc, lt, x)

    return gated_mean

def make_row_io(dim: int):
    """``@T.macro``s moving one position's (score, latent) channels of this lane, 16-byte vectors:
    ``load_token`` from projected_kv, ``load_ring`` / ``store_ring`` from / to a ring entry;
    ``sc``/``lt`` are local [*, 16] buffers, ``t`` the row of them."""

    @T.macro
    def load_token(sc, lt, t, projected_kv, tok, lane):
        for v in T.unroll(VEC // F4):
            for i in T.vectorized(F4):
                sc[t, v * F4 + i] = projected_kv[tok, lane * VEC + v * F4 + i]
            for i in T.vectorized(F4):
                lt[t, v * F4 + i] = projected_kv[tok, dim + lane * VEC + v * F4 + i]

    @T.macro
    def load_ring(sc, lt, t, state, slot, entry, lane):
        for v in T.unroll(VEC // F4):
            for i in T.vectorized(F4):
                sc[t, v * F4 + i] = state[slot, entry, 0, lane * VEC + v * F4 + i]
            for i in T.vectorized(F4):
                lt[t, v * F4 + i] = state[slot, entry, 1, lane * VEC + v * F4 + i]

    @T.macro
    def store_ring(state, slot, entry, sc, lt, t, lane):
        for v in T.unroll(VEC // F4):
            for i in T.vectorized(F4):
                state[slot, entry, 0, lane * VEC + v * F4 + i] = sc[t, v * F4 + i]
            for i in T.vectorized(F4):
                state[slot, entry, 1, lane * VEC + v * F4 + i] = lt[t, v * F4 + i]

    return load_token, load_ring, store_ring


@tilelang.jit
def compress_store_prefill_kernel(fmt_name: str, r: int, rope_dim: int, interleaved: bool,
                                  has_out_norm: bool, weight_dtype: str, pos_dtype: str, slot_dtype: str,
                                  rows_per_warp: int = PREFILL_ROWS_PER_WARP, warps: int = WARPS):
    fmt = _FORMATS[fmt_name]
    dim = fmt.dim
    assert dim == WARP * VEC, dim
    rpw = rows_per_warp
    rows_per_cta = warps * rpw
    half = rope_dim // 2
    row_store = make_row_store(fmt, rope_dim, interleaved, False, has_out_norm, 1, weight_dtype)
    gated_mean = make_gated_mean(r)
    load_token, load_ring, store_ring = make_row_io(dim)
    num_tokens, num_slots, ring, num_reqs, nreq1, rows, norm_rows, max_pos = T.dynamic(
        "num_tokens, num_slots, ring, num_reqs, nreq1, rows, norm_rows, max_pos")
    cache_bytes = T.dynamic("cache_bytes", "int64")

    @T.prim_func
    def kernel(
        projected_kv: T.Tensor((num_tokens, 2 * dim), "float32"),  # [num_tokens, 2 * D] fp32
        state: T.Tensor((num_slots, ring, 2, dim), "float32"),  # [num_state_slots, S, 2, D] fp32
        cu_q: T.Tensor((nreq1,), "int32"),  # [num_reqs + 1] int32
        ctx: T.Tensor((num_reqs,), "int32"),  # [num_reqs] int32, e
        sbi: T.Tensor((num_reqs,), "int32"),  # [num_reqs] int32, ring slot
        cu_c: T.Tensor((nreq1,), "int32"),  # [num_reqs + 1] int32, row offsets
        weight: T.Tensor((dim,), weight_dtype),  # [D] bf16 or fp32
        cos: T.Tensor((max_pos, half), "float32"),  # [max_position, rope_dim / 2] fp32
        sin: T.Tensor((max_pos, half), "float32"),  # [max_position, rope_dim / 2] fp32
        positions: T.Tensor((rows,), pos_dtype),  # [rows] int32/int64, j * r
        slots: T.Tensor((rows,), slot_dtype),  # [rows] int32/int64, < 0: skip
        cache: T.Tensor((cache_bytes,), "uint8"),  # [num_blocks * block_bytes] uint8, flat view
        out_norm: T.Tensor((norm_rows, dim), "bfloat16"),  # [rows, D] bf16 (or [1, D] dummy)
        eps: T.float32,
        search_steps: T.int32,  # ceil(log32(num_reqs))
    ):
        with T.Kernel(T.ceildiv(rows, rows_per_cta), threads=warps * WARP) as bx:
            tx = T.get_thread_binding()
            lane = tx % WARP
            first_row = bx * rows_per_cta + (tx // WARP) * rpw
            sc = T.alloc_local([r, VEC], "float32")
            lt = T.alloc_local([r, VEC], "float32")
            x = T.alloc_local([VEC], "float32")
            cps = T.alloc_local([1, VEC], "float32")
            cpl = T.alloc_local([1, VEC], "float32")
            lo = T.alloc_var("int32")
            span = T.alloc_var("int32")
            step = T.alloc_var("int32")
            cnt = T.alloc_var("int32")
            req = T.alloc_var("int32")
            posv = T.alloc_var("int64")
            slotv = T.alloc_var("int64")
            if first_row < rows:
                # req = the last i with cu_c[i] <= first_row: 32 candidates per step, one per lane; the
                # lanes that pass form a prefix (cu_c rises), so their count locates the next span.
                lo = 0
                span = num_reqs
                for _ in T.serial(search_steps):
                    step = (span + WARP - 1) // WARP
                    cnt = T.if_then_else(
                        lane * step < span and cu_c[T.min(lo + lane * step, num_reqs)] <= first_row, 1, 0)
                    for k in T.unroll(5):
                        cnt = cnt + T.shfl_xor(cnt, 16 >> k)
                    lo = lo + T.max(cnt - 1, 0) * step
                    span = T.min(step, span - T.max(cnt - 1, 0) * step)
                req = T.min(T.max(lo, 0), num_reqs - 1)
                for kr in T.serial(rpw):
                    row = first_row + kr
                    if row < rows:
                        if req + 1 < num_reqs and row >= cu_c[req + 1]:
                            req = req + 1
                        posv = positions[row]  # issued before the inputs: their latencies overlap
                        slotv = slots[row]
                        tok0 = cu_q[req]
                        e = ctx[req]
                        s = e - (cu_q[req + 1] - tok0)
                        slot = sbi[req]
                        k_in = row - cu_c[req]
                        # the request's metadata addresses only its own chunk and its own ring
                        ok = (tok0 >= 0 and cu_q[req + 1] <= num_tokens and s >= 0 and slot >= 0
                              and slot < num_slots and k_in >= 0)
                        if ok and k_in < e // r - s // r:
                            g = s // r + k_in
                            for t in T.unroll(r):
                                p = g * r + t
                                if p >= s:  # in this chunk
                                    load_token(sc, lt, t, projected_kv, tok0 + p - s, lane)
                                else:  # the group began before the chunk: its earlier inputs wait in the ring
                                    load_ring(sc, lt, t, state, slot, p % ring, lane)
                            gated_mean(sc, lt, x)
                        else:  # placeholder (nc = 0): a zero row
                            for i in T.unroll(VEC):
                                x[i] = T.float32(0)
                        row_store(x, lane, weight, cos, sin, cache, out_norm, posv, slotv, ok, row, max_pos,
                                  cache_bytes // fmt.row_bytes, eps)
                        # The first row's warp refreshes the ring after its reads: each lane writes the
                        # channels it read itself, so program order keeps old reads before new writes.
                        if ok and k_in == 0:
                            for p in T.serial(T.max(s, e - ring), e):
                                load_token(cps, cpl, 0, projected_kv, tok0 + p - s, lane)
                                store_ring(state, slot, p % ring, cps, cpl, 0, lane)

    return kernel


@tilelang.jit
def compress_store_decode_kernel(fmt_name: str, r: int, rope_dim: int, interleaved: bool,
                                 has_out_norm: bool, weight_dtype: str, pos_dtype: str, slot_dtype: str,
                                 warps: int = DECODE_WARPS):
    fmt = _FORMATS[fmt_name]
    dim = fmt.dim
    assert dim == WARP * VEC, dim
    half = rope_dim // 2
    row_store = make_row_store(fmt, rope_dim, interleaved, False, has_out_norm, 1, weight_dtype)
    gated_mean = make_gated_mean(r)
    load_token, load_ring, store_ring = make_row_io(dim)
    num_tokens, num_slots, ring, norm_rows, max_pos = T.dynamic(
        "num_tokens, num_slots, ring, norm_rows, max_pos")
    cache_bytes = T.dynamic("cache_bytes", "int64")

    @T.prim_func
    def kernel(
        projected_kv: T.Tensor((num_tokens, 2 * dim), "float32"),  # [total_q, 2 * D] fp32
        state: T.Tensor((num_slots, ring, 2, dim), "float32"),  # [num_state_slots, S, 2, D] fp32
        ctx: T.Tensor((num_tokens,), "int32"),  # [total_q] int32, position + 1
        sbi: T.Tensor((num_tokens,), "int32"),  # [total_q] int32, ring slot
        weight: T.Tensor((dim,), weight_dtype),  # [D] bf16 or fp32
        cos: T.Tensor((max_pos, half), "float32"),  # [max_position, rope_dim / 2] fp32
        sin: T.Tensor((max_pos, half), "float32"),  # [max_position, rope_dim / 2] fp32
        positions: T.Tensor((num_tokens,), pos_dtype),  # [total_q] int32/int64, j * r or 0
        slots: T.Tensor((num_tokens,), slot_dtype),  # [total_q] int32/int64, < 0: skip
        cache: T.Tensor((cache_bytes,), "uint8"),  # [num_blocks * block_bytes] uint8, flat view
        out_norm: T.Tensor((norm_rows, dim), "bfloat16"),  # [total_q, D] bf16 (or [1, D] dummy)
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, warps), threads=warps * WARP) as bx:
            tx = T.get_thread_binding()
            lane = tx % WARP
            i = bx * warps + tx // WARP
            sc = T.alloc_local([r, VEC], "float32")
            lt = T.alloc_local([r, VEC], "float32")
            x = T.alloc_local([VEC], "float32")
            nctx = T.alloc_local([r], "int32")
            nsbi = T.alloc_local([r], "int32")
            posv = T.alloc_var("int64")
            slotv = T.alloc_var("int64")
            if i < num_tokens:
                # Latency: every load whose address is known from i alone is issued up front (own
                # inputs, neighbours' metadata, the row's position and slot), so a step costs two
                # dependent trips to memory before the math: these, then the group's other inputs.
                load_token(sc, lt, r - 1, projected_kv, i, lane)
                for t in T.unroll(r - 1):
                    nctx[t] = ctx[T.max(i - (r - 1 - t), 0)]
                    nsbi[t] = sbi[T.max(i - (r - 1 - t), 0)]
                posv = positions[i]
                slotv = slots[i]
                c = ctx[i]
                slot = sbi[i]
                p = c - 1
                ok = c >= 1 and slot >= 0 and slot < num_slots
                if ok:
                    # This token's own inputs go to the ring; no group of this step reads that entry
                    # from the ring (in-step inputs come from projected_kv; capacity rule).
                    store_ring(state, slot, p % ring, sc, lt, r - 1, lane)
                if ok and p % r == r - 1:
                    for t in T.unroll(r - 1):
                        back = r - 1 - t  # position p - back
                        if i - back >= 0 and nsbi[t] == slot and nctx[t] == c - back:
                            load_token(sc, lt, t, projected_kv, i - back, lane)  # earlier token, this step
                        else:  # written by an earlier step
                            load_ring(sc, lt, t, state, slot, (p - back) % ring, lane)
                    gated_mean(sc, lt, x)
                else:  # closes no group: a zero row
                    for j in T.unroll(VEC):
                        x[j] = T.float32(0)
                row_store(x, lane, weight, cos, sin, cache, out_norm, posv, slotv, ok, i, max_pos,
                          cache_bytes // fmt.row_bytes, eps)

    return kernel


@tilelang.jit(pass_configs=V2_PASS_CONFIGS)
def compress_store_prefill_kernel_v2(fmt_name: str, r: int, rope_dim: int, interleaved: bool,
                                     has_out_norm: bool, weight_dtype: str, pos_dtype: str, slot_dtype: str,
                                     rows_per_warp: int = V2_ROWS_PER_WARP, warps: int = V2_WARPS,
                                     min_ctas_per_sm: int = V2_MIN_CTAS_PER_SM, fast: bool = V2_FAST):
    """v2 of ``compress_store_prefill_kernel``: same rows, same bits, a software pipeline per warp.

    Iteration k of a warp (rows ``first_row + k``): A) the gated mean of row k-1 from the registers
    its loads filled; B) row k's loads are issued into the same registers (its request's metadata is
    kept in registers and reloaded only when the row crosses into the next request); C) row k-1's
    norm / RoPE / cast / store and, for a request's first row, the ring refresh. So the HBM loads of
    row k are in flight during row k-1's store math instead of after it. The weight is loaded and
    converted once per warp. Ring entries are int32 (one modulo per entry, not per vector access).
    ``fast`` (default ``V2_FAST``): ``make_row_store(fast=True, e2m1_fma=True)``, the store kernel's own
    v3 arithmetic (same bytes; CPU emulation bitwise on every case of tools/check_compress_store_emu.py).
    """
    fmt = _FORMATS[fmt_name]
    dim = fmt.dim
    assert dim == WARP * VEC, dim
    rpw = rows_per_warp
    rows_per_cta = warps * rpw
    half = rope_dim // 2
    wvec = 8 if weight_dtype == "bfloat16" else 4  # 16-byte weight loads
    row_store = make_row_store(fmt, rope_dim, interleaved, False, has_out_norm, 1, weight_dtype,
                               weight_in_registers=True, fast=fast, e2m1_fma=fast)
    gated_mean = make_gated_mean_v2(r)
    load_token, load_ring, store_ring = make_row_io(dim)
    num_tokens, num_slots, ring, num_reqs, nreq1, rows, norm_rows, max_pos = T.dynamic(
        "num_tokens, num_slots, ring, num_reqs, nreq1, rows, norm_rows, max_pos")
    cache_bytes = T.dynamic("cache_bytes", "int64")

    @T.prim_func
    def kernel(
        projected_kv: T.Tensor((num_tokens, 2 * dim), "float32"),  # [num_tokens, 2 * D] fp32
        state: T.Tensor((num_slots, ring, 2, dim), "float32"),  # [num_state_slots, S, 2, D] fp32
        cu_q: T.Tensor((nreq1,), "int32"),  # [num_reqs + 1] int32
        ctx: T.Tensor((num_reqs,), "int32"),  # [num_reqs] int32, e
        sbi: T.Tensor((num_reqs,), "int32"),  # [num_reqs] int32, ring slot
        cu_c: T.Tensor((nreq1,), "int32"),  # [num_reqs + 1] int32, row offsets
        weight: T.Tensor((dim,), weight_dtype),  # [D] bf16 or fp32
        cos: T.Tensor((max_pos, half), "float32"),  # [max_position, rope_dim / 2] fp32
        sin: T.Tensor((max_pos, half), "float32"),  # [max_position, rope_dim / 2] fp32
        positions: T.Tensor((rows,), pos_dtype),  # [rows] int32/int64, j * r
        slots: T.Tensor((rows,), slot_dtype),  # [rows] int32/int64, < 0: skip
        cache: T.Tensor((cache_bytes,), "uint8"),  # [num_blocks * block_bytes] uint8, flat view
        out_norm: T.Tensor((norm_rows, dim), "bfloat16"),  # [rows, D] bf16 (or [1, D] dummy)
        eps: T.float32,
        search_steps: T.int32,  # ceil(log32(num_reqs))
    ):
        with T.Kernel(T.ceildiv(rows, rows_per_cta), threads=warps * WARP) as bx:
            if min_ctas_per_sm > 1:
                T.annotate_min_blocks_per_sm(min_ctas_per_sm)
            tx = T.get_thread_binding()
            lane = tx % WARP
            first_row = bx * rows_per_cta + (tx // WARP) * rpw
            sc = T.alloc_local([r, VEC], "float32")
            lt = T.alloc_local([r, VEC], "float32")
            x = T.alloc_local([VEC], "float32")
            wl = T.alloc_local([VEC], weight_dtype)
            wf = T.alloc_local([VEC], "float32")
            cps = T.alloc_local([1, VEC], "float32")
            cpl = T.alloc_local([1, VEC], "float32")
            lo = T.alloc_var("int32")
            span = T.alloc_var("int32")
            step = T.alloc_var("int32")
            cnt = T.alloc_var("int32")
            req = T.alloc_var("int32")
            # the current request's metadata (registers; reloaded when a row enters the next request)
            tok0 = T.alloc_var("int32")
            tok1 = T.alloc_var("int32")
            e = T.alloc_var("int32")
            slot = T.alloc_var("int32")
            c0 = T.alloc_var("int32")
            c1 = T.alloc_var("int32")
            # the row whose loads are in flight (issued in stage B)
            ok = T.alloc_var("int32")
            k_in = T.alloc_var("int32")
            comp = T.alloc_var("int32")
            n_pos = T.alloc_var("int64")
            n_slot = T.alloc_var("int64")
            # the row being stored (stage C), copied in stage A
            posv = T.alloc_var("int64")
            slotv = T.alloc_var("int64")
            c_ok = T.alloc_var("int32")
            c_first = T.alloc_var("int32")
            c_s = T.alloc_var("int32")
            c_e = T.alloc_var("int32")
            c_tok0 = T.alloc_var("int32")
            c_slot = T.alloc_var("int32")
            ent = T.alloc_var("int32")
            if first_row < rows:
                # req = the last i with cu_c[i] <= first_row (v1's 32-ary warp search)
                lo = 0
                span = num_reqs
                for _ in T.serial(search_steps):
                    step = (span + WARP - 1) // WARP
                    cnt = T.if_then_else(
                        lane * step < span and cu_c[T.min(lo + lane * step, num_reqs)] <= first_row, 1, 0)
                    for k in T.unroll(5):
                        cnt = cnt + T.shfl_xor(cnt, 16 >> k)
                    lo = lo + T.max(cnt - 1, 0) * step
                    span = T.min(step, span - T.max(cnt - 1, 0) * step)
                req = T.min(T.max(lo, 0), num_reqs - 1)
                tok0 = cu_q[req]
                tok1 = cu_q[req + 1]
                e = ctx[req]
                slot = sbi[req]
                c0 = cu_c[req]
                c1 = cu_c[req + 1]
                for v in T.unroll(VEC // wvec):
                    for i in T.vectorized(wvec):
                        wl[v * wvec + i] = weight[lane * VEC + v * wvec + i]
                for i in T.unroll(VEC):
                    wf[i] = T.Cast("float32", wl[i])
                for k in T.serial(rpw + 1):
                    # A) row k-1: gated mean from its registers (frees them for row k's loads)
                    if k >= 1 and first_row + k - 1 < rows:
                        if comp == 1:
                            gated_mean(sc, lt, x)
                        else:  # placeholder (nc = 0) or a skipped row: a zero row
                            for i in T.unroll(VEC):
                                x[i] = T.float32(0)
                        posv = n_pos
                        slotv = n_slot
                        c_ok = ok
                        c_first = T.if_then_else(ok == 1 and k_in == 0, 1, 0)
                        c_s = e - (tok1 - tok0)
                        c_e = e
                        c_tok0 = tok0
                        c_slot = slot
                    # B) row k: metadata, then its loads (in flight during C)
                    if k < rpw and first_row + k < rows:
                        if first_row + k >= c1 and req + 1 < num_reqs:  # every request owns >= 1 row
                            req = req + 1
                            tok0 = cu_q[req]
                            tok1 = cu_q[req + 1]
                            e = ctx[req]
                            slot = sbi[req]
                            c0 = c1
                            c1 = cu_c[req + 1]
                        n_pos = T.Cast("int64", positions[first_row + k])
                        n_slot = T.Cast("int64", slots[first_row + k])
                        k_in = first_row + k - c0
                        # the request's metadata addresses only its own chunk and its own ring
                        ok = T.if_then_else(tok0 >= 0 and tok1 <= num_tokens and e - (tok1 - tok0) >= 0
                                            and slot >= 0 and slot < num_slots and k_in >= 0, 1, 0)
                        comp = T.if_then_else(
                            ok == 1 and k_in < e // r - (e - (tok1 - tok0)) // r, 1, 0)
                        if comp == 1:
                            for t in T.unroll(r):
                                # position p = ((s // r) + k_in) * r + t, s = e - (tok1 - tok0)
                                if ((e - (tok1 - tok0)) // r + k_in) * r + t >= e - (tok1 - tok0):
                                    load_token(sc, lt, t, projected_kv,
                                               tok1 - e + ((e - (tok1 - tok0)) // r + k_in) * r + t, lane)
                                else:  # the group began before the chunk: the ring holds its inputs
                                    ent = (((e - (tok1 - tok0)) // r + k_in) * r + t) % ring
                                    load_ring(sc, lt, t, state, slot, ent, lane)
                    # C) row k-1: norm, RoPE, cast, store; a request's first row refreshes the ring
                    if k >= 1 and first_row + k - 1 < rows:
                        row_store(x, lane, wf, cos, sin, cache, out_norm, posv, slotv, c_ok == 1,
                                  first_row + k - 1, max_pos, cache_bytes // fmt.row_bytes, eps)
                        # after this warp's own ring reads (stage A of this row): each lane writes
                        # the channels it read, so program order keeps old reads before new writes
                        if c_first == 1:
                            ent = T.max(c_s, c_e - ring) % ring
                            for p in T.serial(T.max(c_s, c_e - ring), c_e):
                                load_token(cps, cpl, 0, projected_kv, c_tok0 + p - c_s, lane)
                                store_ring(state, c_slot, ent, cps, cpl, 0, lane)
                                ent = T.if_then_else(ent + 1 == ring, 0, ent + 1)

    return kernel


@tilelang.jit(pass_configs=V2_PASS_CONFIGS)
def compress_store_decode_kernel_v3(fmt_name: str, r: int, rope_dim: int, interleaved: bool,
                                    has_out_norm: bool, weight_dtype: str, pos_dtype: str, slot_dtype: str,
                                    fast: bool = V2_FAST):
    """v3 of ``compress_store_decode_kernel``: same rows, same bits, two thread layouts in one CTA.

    A CTA of ``V3_ROWS`` warps takes ``V3_ROWS`` consecutive query tokens. Phase 1, the compress kernel's
    layout (thread t: channels 4t .. 4t+3): one trip loads the inputs and metadata of the CTA's tokens
    and of the r - 1 tokens before them, so every in-step neighbour of a group is already in registers;
    groups whose earlier positions were written by an earlier step read them from the ring (second
    trip). Each token's inputs go to its ring entry (the capacity rule keeps them off every entry a group
    of this step reads), the gated means to shared memory. A barrier; phase 2: warp w runs the store
    macro on token w's row (16 channels per lane). Few registers per thread (no pipeline state), so more
    warps share an SM.
    """
    fmt = _FORMATS[fmt_name]
    dim = fmt.dim
    rows_cta = V3_ROWS
    threads = rows_cta * WARP
    assert dim == threads * F4 and dim == WARP * VEC, dim
    span = rows_cta + r - 1  # tokens whose inputs phase 1 loads: the CTA's and the r - 1 before them
    half = rope_dim // 2
    wvec = 8 if weight_dtype == "bfloat16" else 4  # 16-byte weight loads
    row_store = make_row_store(fmt, rope_dim, interleaved, False, has_out_norm, 1, weight_dtype,
                               weight_in_registers=True, fast=fast, e2m1_fma=fast)
    gated_mean = make_gated_mean_v2(r, F4)
    num_tokens, num_slots, ring, norm_rows, max_pos = T.dynamic(
        "num_tokens, num_slots, ring, norm_rows, max_pos")
    cache_bytes = T.dynamic("cache_bytes", "int64")

    @T.prim_func
    def kernel(
        projected_kv: T.Tensor((num_tokens, 2 * dim), "float32"),  # [total_q, 2 * D] fp32
        state: T.Tensor((num_slots, ring, 2, dim), "float32"),  # [num_state_slots, S, 2, D] fp32
        ctx: T.Tensor((num_tokens,), "int32"),  # [total_q] int32, position + 1
        sbi: T.Tensor((num_tokens,), "int32"),  # [total_q] int32, ring slot
        weight: T.Tensor((dim,), weight_dtype),  # [D] bf16 or fp32
        cos: T.Tensor((max_pos, half), "float32"),  # [max_position, rope_dim / 2] fp32
        sin: T.Tensor((max_pos, half), "float32"),  # [max_position, rope_dim / 2] fp32
        positions: T.Tensor((num_tokens,), pos_dtype),  # [total_q] int32/int64, j * r or 0
        slots: T.Tensor((num_tokens,), slot_dtype),  # [total_q] int32/int64, < 0: skip
        cache: T.Tensor((cache_bytes,), "uint8"),  # [num_blocks * block_bytes] uint8, flat view
        out_norm: T.Tensor((norm_rows, dim), "bfloat16"),  # [total_q, D] bf16 (or [1, D] dummy)
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, rows_cta), threads=threads) as bx:
            tx = T.get_thread_binding()
            lane = tx % WARP
            first = bx * rows_cta - (r - 1)  # token of phase 1's slot u = 0
            row = bx * rows_cta + tx // WARP  # this warp's token in phase 2
            xs = T.alloc_shared([rows_cta, dim], "float32")
            sc = T.alloc_local([span, F4], "float32")  # slot u: token first + u (clamped into range)
            lt = T.alloc_local([span, F4], "float32")
            c = T.alloc_local([span], "int32")
            sl = T.alloc_local([span], "int32")
            rsc = T.alloc_local([rows_cta * (r - 1), F4], "float32")  # earlier steps' positions
            rlt = T.alloc_local([rows_cta * (r - 1), F4], "float32")
            sc1 = T.alloc_local([r, F4], "float32")
            lt1 = T.alloc_local([r, F4], "float32")
            xv = T.alloc_local([F4], "float32")
            x = T.alloc_local([VEC], "float32")
            wl = T.alloc_local([VEC], weight_dtype)
            wf = T.alloc_local([VEC], "float32")
            posv = T.alloc_var("int64")
            slotv = T.alloc_var("int64")
            okw = T.alloc_var("int32")  # this warp's token (phase 2) is ok
            ent = T.alloc_var("int32")  # ring entry (int32: one modulo per entry, not per vector access)
            tok = T.alloc_var("int32")
            ok = T.alloc_local([rows_cta], "int32")  # token j exists and its metadata is in range
            closes = T.alloc_local([rows_cta], "int32")  # ... and it closes a group
            # 1: position c - 1 - (r - 1 - t) of token j's group is token j - (r - 1 - t) of this step;
            # 0: an earlier step's, in the ring
            instep = T.alloc_local([rows_cta * (r - 1)], "int32")
            okw = 0
            for u in T.unroll(span):
                tok = T.min(T.max(first + u, 0), num_tokens - 1)
                for i in T.vectorized(F4):
                    sc[u, i] = projected_kv[tok, tx * F4 + i]
                for i in T.vectorized(F4):
                    lt[u, i] = projected_kv[tok, dim + tx * F4 + i]
                c[u] = ctx[tok]
                sl[u] = sbi[tok]
            if row < num_tokens:
                posv = T.Cast("int64", positions[row])
                slotv = T.Cast("int64", slots[row])
                okw = T.if_then_else(ctx[row] >= 1 and sbi[row] >= 0 and sbi[row] < num_slots, 1, 0)
                for v in T.unroll(VEC // wvec):
                    for i in T.vectorized(wvec):
                        wl[v * wvec + i] = weight[lane * VEC + v * wvec + i]
            # token j sits in slot u = j + r - 1
            for j in T.unroll(rows_cta):
                ok[j] = T.if_then_else(bx * rows_cta + j < num_tokens and c[j + r - 1] >= 1
                                       and sl[j + r - 1] >= 0 and sl[j + r - 1] < num_slots, 1, 0)
                closes[j] = T.if_then_else(ok[j] == 1 and (c[j + r - 1] - 1) % r == r - 1, 1, 0)
                for t in T.unroll(r - 1):
                    instep[j * (r - 1) + t] = T.if_then_else(
                        bx * rows_cta + j - (r - 1 - t) >= 0 and sl[j + t] == sl[j + r - 1]
                        and c[j + t] == c[j + r - 1] - (r - 1 - t), 1, 0)
            for j in T.unroll(rows_cta):
                if closes[j] == 1:
                    for t in T.unroll(r - 1):
                        if instep[j * (r - 1) + t] == 0:
                            ent = (c[j + r - 1] - 1 - (r - 1 - t)) % ring
                            for i in T.vectorized(F4):
                                rsc[j * (r - 1) + t, i] = state[sl[j + r - 1], ent, 0, tx * F4 + i]
                            for i in T.vectorized(F4):
                                rlt[j * (r - 1) + t, i] = state[sl[j + r - 1], ent, 1, tx * F4 + i]
            for j in T.unroll(rows_cta):
                if ok[j] == 1:
                    ent = (c[j + r - 1] - 1) % ring
                    for i in T.vectorized(F4):
                        state[sl[j + r - 1], ent, 0, tx * F4 + i] = sc[j + r - 1, i]
                    for i in T.vectorized(F4):
                        state[sl[j + r - 1], ent, 1, tx * F4 + i] = lt[j + r - 1, i]
            for j in T.unroll(rows_cta):
                if closes[j] == 1:
                    for i in T.unroll(F4):
                        sc1[r - 1, i] = sc[j + r - 1, i]
                        lt1[r - 1, i] = lt[j + r - 1, i]
                    for t in T.unroll(r - 1):
                        if instep[j * (r - 1) + t] == 1:
                            for i in T.unroll(F4):
                                sc1[t, i] = sc[j + t, i]
                                lt1[t, i] = lt[j + t, i]
                        else:
                            for i in T.unroll(F4):
                                sc1[t, i] = rsc[j * (r - 1) + t, i]
                                lt1[t, i] = rlt[j * (r - 1) + t, i]
                    gated_mean(sc1, lt1, xv)
                else:  # closes no group (or a skipped token): a zero row
                    for i in T.unroll(F4):
                        xv[i] = T.float32(0)
                for i in T.vectorized(F4):
                    xs[j, tx * F4 + i] = xv[i]
            T.sync_threads()
            if row < num_tokens:
                for i in T.unroll(VEC):
                    wf[i] = T.Cast("float32", wl[i])
                for v in T.unroll(VEC // F4):
                    for i in T.vectorized(F4):
                        x[v * F4 + i] = xs[tx // WARP, lane * VEC + v * F4 + i]
                row_store(x, lane, wf, cos, sin, cache, out_norm, posv, slotv, okw == 1, row, max_pos,
                          cache_bytes // fmt.row_bytes, eps)

    return kernel


@functools.lru_cache(maxsize=None)
def _prefill_kernel(*static):
    return compress_store_prefill_kernel(*static)


@functools.lru_cache(maxsize=None)
def _decode_kernel(*static):
    return compress_store_decode_kernel(*static)


@functools.lru_cache(maxsize=None)
def _prefill_kernel_v2(*static):
    return compress_store_prefill_kernel_v2(*static)


@functools.lru_cache(maxsize=None)
def _decode_kernel_v3(*static):
    return compress_store_decode_kernel_v3(*static)


def v2_prefill_launch(rows: int) -> tuple:
    """The v2 prefill factory's launch arguments for a launch of ``rows`` compressed rows: (rows per
    warp, warps, min CTAs per SM, fast), from the module constants at call time (the benchmark's sweep
    and the tests change them)."""
    rpw = V2_ROWS_PER_WARP if rows >= V2_MANY_ROWS else V2_ROWS_PER_WARP_SMALL
    return rpw, V2_WARPS, V2_MIN_CTAS_PER_SM, V2_FAST


def _variant(variant, op):
    v = VARIANT[op] if variant is None else variant
    if v not in VARIANTS[op]:
        raise ValueError(f"compress_store {op}: variant must be one of {VARIANTS[op]}, got {v!r}")
    return v


def _search_steps(num_reqs: int) -> int:
    steps, reach = 0, 1
    while reach < num_reqs:
        steps, reach = steps + 1, reach * WARP
    return steps


def _static(fmt, r, rope_dim, interleaved, out_norm, norm_weight, positions, slot_mapping):
    why = kernel_supports(fmt, rope_dim, interleaved)
    if why is not None or fmt.dim != WARP * VEC:
        raise ValueError(f"compress_store kernel: unsupported configuration for {fmt.name}: "
                         f"{why or f'dim={fmt.dim} must be {WARP * VEC}'}")
    return (fmt.name, r, rope_dim, interleaved, out_norm is not None, _TORCH_TO_TL[norm_weight.dtype],
            _TORCH_TO_TL[positions.dtype], _TORCH_TO_TL[slot_mapping.dtype])


def compress_store_prefill(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                           cu_compressed, compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping,
                           kv_cache, fmt, *, out_norm=None, num_rows=None, rope_dim=64,
                           interleaved=True, variant=None) -> None:
    """cache[slot_mapping[j]] = cast(rope(rmsnorm(gated_mean(group j)))), ring updated; one launch.

    Same arguments and results as ``reference.compress_store.compress_store_prefill_ref``:
    projected_kv [num_tokens, 2 * D] fp32 (copied if non-contiguous), state_cache [slots, S, 2, D]
    fp32 (in place), cu_seqlens_q/context_lens/state_block_idx/cu_compressed int32 metadata,
    norm_weight [D] bf16/fp32, cos/sin [max_position, rope_dim/2] fp32, positions/slot_mapping
    [rows] int32/int64, kv_cache uint8 (in place), out_norm optional [rows, D] bf16. Returns None.
    ``variant``: one of ``VARIANTS["prefill"]``, "v1" / "v2" (None: the module's ``VARIANT["prefill"]``);
    same bytes, different launch path.
    """
    dims = check_compress_store_prefill_args(
        projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed,
        compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
        out_norm=out_norm, num_rows=num_rows, rope_dim=rope_dim, interleaved=interleaved)
    v = _variant(variant, "prefill")
    check_cuda(projected_kv=projected_kv, state_cache=state_cache, kv_cache=kv_cache)
    static = _static(fmt, compress_ratio, rope_dim, interleaved, out_norm, norm_weight, positions,
                     slot_mapping)
    if debug_checks_enabled():
        check_compress_store_prefill_values(projected_kv, state_cache, cu_seqlens_q, context_lens,
                                            state_block_idx, cu_compressed, compress_ratio, positions,
                                            slot_mapping, dims)
    if dims.store.rows == 0:
        return
    norm = out_norm if out_norm is not None else _dummy_norm(fmt.dim, projected_kv.device)
    if v == "v1":
        launch = _prefill_kernel(*static, PREFILL_ROWS_PER_WARP, WARPS)
    else:
        launch = _prefill_kernel_v2(*static, *v2_prefill_launch(dims.store.rows))
    launch(
        projected_kv.contiguous(), state_cache, cu_seqlens_q.contiguous(), context_lens.contiguous(),
        state_block_idx.contiguous(), cu_compressed.contiguous(), norm_weight.contiguous(), cos.contiguous(),
        sin.contiguous(), positions.contiguous(), slot_mapping.contiguous(), kv_cache.view(-1), norm,
        float(eps), _search_steps(dims.compress.num_reqs))


def compress_store_decode(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                          compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
                          *, out_norm=None, rope_dim=64, interleaved=True, variant=None) -> None:
    """Decode / verification step, fused: ring writes, groups closing in the step, their cache rows.

    Same arguments and results as ``reference.compress_store.compress_store_decode_ref``. Returns None.
    ``variant``: one of ``VARIANTS["decode"]``, "v1" / "v3" (None: ``VARIANT["decode"]``).
    """
    dims = check_compress_store_decode_args(
        projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q, compress_ratio, norm_weight,
        eps, cos, sin, positions, slot_mapping, kv_cache, fmt, out_norm=out_norm, rope_dim=rope_dim,
        interleaved=interleaved)
    v = _variant(variant, "decode")
    check_cuda(projected_kv=projected_kv, state_cache=state_cache, kv_cache=kv_cache)
    static = _static(fmt, compress_ratio, rope_dim, interleaved, out_norm, norm_weight, positions,
                     slot_mapping)
    if debug_checks_enabled():
        check_compress_store_decode_values(projected_kv, state_cache, context_lens, state_block_idx,
                                           max_seqlen_q, positions, slot_mapping, dims)
    if dims.store.rows == 0:
        return
    norm = out_norm if out_norm is not None else _dummy_norm(fmt.dim, projected_kv.device)
    if v == "v1":
        launch = _decode_kernel(*static, DECODE_WARPS)
    else:
        launch = _decode_kernel_v3(*static, V2_FAST)
    launch(
        projected_kv.contiguous(), state_cache, context_lens.contiguous(), state_block_idx.contiguous(),
        norm_weight.contiguous(), cos.contiguous(), sin.contiguous(), positions.contiguous(),
        slot_mapping.contiguous(), kv_cache.view(-1), norm, float(eps))


# ----------------------------------------------------------------------------------------------
# The unfused pipeline (our compress kernel, then our store kernel): the baseline that tests and
# benchmarks compare the fused kernel with. Same arguments as the fused wrappers.
# ----------------------------------------------------------------------------------------------


def two_kernel_prefill(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed,
                       compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt, *,
                       out_norm=None, num_rows=None, rope_dim=64, interleaved=True) -> None:
    from tilelang_ops.compress import compress_prefill
    from tilelang_ops.kv_store import norm_rope_hadamard_cast_store

    kv = compress_prefill(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                          cu_compressed, compress_ratio, num_rows=positions.shape[0])
    norm_rope_hadamard_cast_store(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
                                  rope_dim=rope_dim, interleaved=interleaved, out_norm=out_norm)


def two_kernel_decode(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q, compress_ratio,
                      norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt, *, out_norm=None,
                      rope_dim=64, interleaved=True) -> None:
    from tilelang_ops.compress import compress_decode
    from tilelang_ops.kv_store import norm_rope_hadamard_cast_store

    kv = compress_decode(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                         compress_ratio)
    norm_rope_hadamard_cast_store(kv, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
                                  rope_dim=rope_dim, interleaved=interleaved, out_norm=out_norm)
