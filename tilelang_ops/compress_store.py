"""TileLang kernel: fused compress -> RMSNorm -> RoPE -> cast -> paged-cache store (SPEC 1.5 main branch).

One launch per call goes from the projected inputs to cache rows: the gated mean of a group (FP32)
is rounded to BF16 and stays in registers, then ``tilelang_ops.kv_store.make_row_store`` (the store
kernel's own per-row ``@T.macro``, imported, not copied) normalizes, rotates, casts and stores it. The
compressed row never travels through global memory; the ring is updated in the same launch.

Prefill (``compress_store_prefill_kernel``): one warp per compressed row at a time, lane ``l`` holding
channels ``16 l .. 16 l + 15`` (the store macro's layout), ``config.warps`` warps per CTA, each taking
``config.rows_per_warp`` consecutive rows as a software pipeline (row k's loads are in flight while row
k - 1 is normalized, cast and stored). A warp finds its first row's request with a 32-ary search over
``cu_compressed`` (each step one load per lane and a warp sum, ``ceil(log32(num_reqs))`` steps) and then
steps forward row by row (every request owns at least one row). Decode
(``compress_store_decode_kernel``): one row per query token, two thread layouts in one CTA (see there).

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
the difference, ascending sums, separate IEEE multiply and add, IEEE division, one BF16 RNE cast; for
r = 2 one ``expf`` per channel, the same bits: ``make_gated_mean_r2``), the same sequence as the
compress kernel (which uses ``T.exp`` = ``expf`` and ``--fmad=false``), so the fused kernel's cache bytes,
ring and out_norm are bitwise those of our two-kernel pipeline (``two_kernel_*`` below); the store
arithmetic is the store kernel's own macro. The compress kernel's gated mean cannot be imported: it is
written inline in its prim_func for another thread layout (4 channels per thread, per-block metadata in
shared memory); ``make_gated_mean`` is the same operation order for the store macro's layout.

Metadata that is out of range (slots, tokens, requests) makes a row skip (no store, no out_norm, no
ring write); it never reads or writes outside the tensors. Nothing is returned (see
``reference.compress_store``).
"""


import dataclasses
from dataclasses import dataclass

import tilelang
import tilelang.language as T
import torch

from metadata.cache_format import BF16_KV_FORMAT, FP4_MAIN_KV_FORMAT, FP8_MAIN_KV_FORMAT
from metadata.checks import check_aligned, check_cuda, debug_checks_enabled
from metadata.compress_store_args import (
    MAIN_BRANCH_FORMATS,
    check_compress_store_decode_args,
    check_compress_store_decode_values,
    check_compress_store_prefill_args,
    check_compress_store_prefill_values,
)
from tilelang_ops._library import Plans, dense, dummy, kernel, register_op
from tilelang_ops.kv_store import (
    _TORCH_TO_TL,
    VEC,
    KVStoreConfig,
    _f32,
    cache_format,
    call_format_op,
    kernel_supports,
    make_row_store,
)

WARP = 32
F4 = 4  # FP32 elements per 16-byte vector access
DECODE_ROWS = 4  # decode: query tokens per CTA (= warps; phase 1's 128 threads x 4 channels cover a row)
MANY_ROWS = 131072  # prefill launches from this many rows take CompressStoreConfig.rows_per_warp
Tensor = torch.Tensor


@dataclass(frozen=True)
class CompressStoreConfig:
    """The prefill kernel's launch shape (every value compiles its own kernel; all store the same bytes).

    rows_per_warp: consecutive rows a warp pipelines (one prologue and request search per warp);
    warps: warps per CTA; min_ctas: ``__launch_bounds__`` minimum CTAs per SM (caps registers).
    """

    rows_per_warp: int = 16
    warps: int = 4
    min_ctas: int = 3

    def __post_init__(self):
        for name in ("rows_per_warp", "warps"):
            if getattr(self, name) < 1:
                raise ValueError(f"CompressStoreConfig: {name} must be >= 1, got {getattr(self, name)}")
        if self.min_ctas < 0:
            raise ValueError(f"CompressStoreConfig: min_ctas must be >= 0, got {self.min_ctas}")

    def replace(self, **changes) -> "CompressStoreConfig":
        return dataclasses.replace(self, **changes)


def prefill_config(rows: int) -> CompressStoreConfig:
    """The launch rule: 16 rows per warp from ``MANY_ROWS`` compressed rows, 4 below (more CTAs, shorter
    tail waves); 4 warps, at least 3 CTAs per SM (docs/design.md, "## compress_store")."""
    return CompressStoreConfig(rows_per_warp=16 if rows >= MANY_ROWS else 4)


# The store macro's config inside the fused kernels: one chunk per lane (the gated mean's layout), no
# options (they are tuned for the store kernel's own layouts).
ROW_STORE_CONFIG = KVStoreConfig(chunks=1)
# Bounds are explicit in both kernels (every index is checked or clamped before its access), so
# TileLang's per-access guards, which also re-evaluate 64-bit ring modulos per vector, are off. The init
# check is off as well: it flags the prefill pipeline's registers (read in stage A of iteration k, written
# in stage B of iteration k - 1), a pattern it cannot follow.
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True, "tl.disable_buffer_init_check": True}

_FORMATS = {f.name: f for f in MAIN_BRANCH_FORMATS}

# (format, ratio) pairs the build check compiles (rope 64, interleaved, BF16 weight, out_norm, int32 ids)
BUILD_SHAPES = [(f.name, 2) for f in (FP8_MAIN_KV_FORMAT, FP4_MAIN_KV_FORMAT, BF16_KV_FORMAT)]


def _expf(x):
    # The CUDA math library's expf (what torch's exp and the compress kernel's T.exp call on the GPU),
    # never the __expf approximation.
    return T.call_extern("float32", "expf", x)


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


def make_gated_mean_r2(r: int, width: int = VEC):
    """``make_gated_mean`` with one ``expf`` per channel for r = 2, same bits.

    For finite scores, m = max(s0, s1) is one of them, so that score's difference is +0 and its
    weight expf(+0) = 1 exactly; the other difference is s_min - s_max = -|s0 - s1| (IEEE subtraction
    is sign-symmetric). With diff = s0 - s1 and e = expf(-|diff|):
        den = 1 + e                  (make_gated_mean: w0 + w1, either order: FP32 addition commutes)
        num = v_big + e * v_small    (make_gated_mean: w0 * v0 + w1 * v1 with one weight 1: 1 * v = v)
    where v_big is the latent of the larger score (s0 when diff >= 0; equal scores give e = 1, either
    way). A NaN latent gives a NaN row in both (1 * NaN and this sum both end in the BF16 cast's
    canonical NaN). The lane takes this path when the sum of its ``width`` diffs is finite, i.e. every
    score pair is finite and no difference overflows; otherwise it runs make_gated_mean's two-expf
    sequence (so infinite or NaN scores give its bits). Other ratios use ``make_gated_mean``.
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


@tilelang.jit(pass_configs=PASS_CONFIGS)
def compress_store_prefill_kernel(fmt_name: str, r: int, rope_dim: int, interleaved: bool,
                                  has_out_norm: bool, weight_dtype: str, pos_dtype: str, slot_dtype: str,
                                  config: CompressStoreConfig):
    """Prefill: every compressed row of the chunk, a software pipeline per warp (``config``: its shape).

    Iteration k of a warp (rows ``first_row + k``): A) the gated mean of row k-1 from the registers
    its loads filled; B) row k's loads are issued into the same registers (its request's metadata is
    kept in registers and reloaded only when the row crosses into the next request); C) row k-1's
    norm / RoPE / cast / store and, for a request's first row, the ring refresh. So the HBM loads of
    row k are in flight during row k-1's store math instead of after it. The weight is loaded and
    converted once per warp. Ring entries are int32 (one modulo per entry, not per vector access).
    """
    fmt = _FORMATS[fmt_name]
    dim = fmt.dim
    assert dim == WARP * VEC, dim
    rpw = config.rows_per_warp
    warps = config.warps
    min_ctas_per_sm = config.min_ctas
    rows_per_cta = warps * rpw
    half = rope_dim // 2
    wvec = 8 if weight_dtype == "bfloat16" else 4  # 16-byte weight loads
    row_store = make_row_store(fmt, ROW_STORE_CONFIG, rope_dim=rope_dim, interleaved=interleaved,
                               hadamard=False, has_out_norm=has_out_norm, rows_per_block=1,
                               weight_dtype=weight_dtype)
    gated_mean = make_gated_mean_r2(r)
    load_token, load_ring, store_ring = make_row_io(dim)
    num_tokens, num_slots, ring, num_reqs, nreq1, rows, norm_rows, max_pos = T.dynamic(
        "num_tokens, num_slots, ring, num_reqs, nreq1, rows, norm_rows, max_pos")
    # the cache as the caller holds it (no view per call); the body addresses it flat
    num_blocks, cache_block_bytes = T.dynamic("num_blocks, cache_block_bytes", "int64")
    cache_bytes = num_blocks * cache_block_bytes

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
        cache2: T.Tensor((num_blocks, cache_block_bytes), "uint8"),  # [num_blocks, block_bytes] uint8
        out_norm: T.Tensor((norm_rows, dim), "bfloat16"),  # [rows, D] bf16 (or [1, D] dummy)
        eps: T.float32,
        search_steps: T.int32,  # ceil(log32(num_reqs))
    ):
        with T.Kernel(T.ceildiv(rows, rows_per_cta), threads=warps * WARP) as bx:
            cache = T.reshape(cache2, (cache_bytes,))
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
                # req = the last i with cu_c[i] <= first_row (a 32-ary warp search)
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


@tilelang.jit(pass_configs=PASS_CONFIGS)
def compress_store_decode_kernel(fmt_name: str, r: int, rope_dim: int, interleaved: bool,
                                 has_out_norm: bool, weight_dtype: str, pos_dtype: str, slot_dtype: str):
    """Decode / verification step: two thread layouts in one CTA.

    A CTA of ``DECODE_ROWS`` warps takes ``DECODE_ROWS`` consecutive query tokens. Phase 1, the compress
    kernel's layout (thread t: channels 4t .. 4t+3): one trip loads the inputs and metadata of the CTA's
    tokens and of the r - 1 tokens before them, so every in-step neighbour of a group is already in registers;
    groups whose earlier positions were written by an earlier step read them from the ring (second
    trip). Each token's inputs go to its ring entry (the capacity rule keeps them off every entry a group
    of this step reads), the gated means to shared memory. A barrier; phase 2: warp w runs the store
    macro on token w's row (16 channels per lane). Few registers per thread (no pipeline state), so more
    warps share an SM.
    """
    fmt = _FORMATS[fmt_name]
    dim = fmt.dim
    rows_cta = DECODE_ROWS
    threads = rows_cta * WARP
    assert dim == threads * F4 and dim == WARP * VEC, dim
    span = rows_cta + r - 1  # tokens whose inputs phase 1 loads: the CTA's and the r - 1 before them
    half = rope_dim // 2
    wvec = 8 if weight_dtype == "bfloat16" else 4  # 16-byte weight loads
    row_store = make_row_store(fmt, ROW_STORE_CONFIG, rope_dim=rope_dim, interleaved=interleaved,
                               hadamard=False, has_out_norm=has_out_norm, rows_per_block=1,
                               weight_dtype=weight_dtype)
    gated_mean = make_gated_mean_r2(r, F4)
    num_tokens, num_slots, ring, norm_rows, max_pos = T.dynamic(
        "num_tokens, num_slots, ring, norm_rows, max_pos")
    # the cache as the caller holds it (no view per call); the body addresses it flat
    num_blocks, cache_block_bytes = T.dynamic("num_blocks, cache_block_bytes", "int64")
    cache_bytes = num_blocks * cache_block_bytes

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
        cache2: T.Tensor((num_blocks, cache_block_bytes), "uint8"),  # [num_blocks, block_bytes] uint8
        out_norm: T.Tensor((norm_rows, dim), "bfloat16"),  # [total_q, D] bf16 (or [1, D] dummy)
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, rows_cta), threads=threads) as bx:
            cache = T.reshape(cache2, (cache_bytes,))
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


# ----------------------------------------------------------------------------------------------
# torch-facing wrappers: torch.ops.tilelang_ops.compress_store_prefill / _decode (SPEC 7). The ops take
# the format's name (``fmt.name``); the Python functions take the KVCacheFormat.
# ----------------------------------------------------------------------------------------------

def _launchable(projected_kv, state_cache, kv_cache, fmt, compress_ratio, rope_dim, interleaved, out_norm,
                norm_weight, positions, slot_mapping) -> tuple:
    """The checks a launch adds to the shape checks (devices, addresses, the kernel's configurations);
    returns the kernel's static arguments."""
    check_cuda(projected_kv=projected_kv, state_cache=state_cache, kv_cache=kv_cache)
    check_aligned(kv_cache=kv_cache, state_cache=state_cache)
    return _static(fmt, compress_ratio, rope_dim, interleaved, out_norm, norm_weight, positions, slot_mapping)


def _prefill_check(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed,
                   compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
                   out_norm, num_rows, rope_dim, interleaved, config=None):
    """Every host check of a prefill call (``config``: the caller's, if any; none reads a device value, and
    the fake runs them on fake tensors); returns (dimensions, static arguments)."""
    dims = check_compress_store_prefill_args(
        projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed,
        compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
        out_norm=out_norm, num_rows=num_rows, rope_dim=rope_dim, interleaved=interleaved)
    if config is not None and not isinstance(config, CompressStoreConfig):
        raise TypeError(f"compress_store_prefill: config must be a CompressStoreConfig, got "
                        f"{type(config).__name__}")
    return dims, _launchable(projected_kv, state_cache, kv_cache, fmt, compress_ratio, rope_dim, interleaved,
                             out_norm, norm_weight, positions, slot_mapping)


def _decode_check(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q, compress_ratio,
                  norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt, out_norm, rope_dim,
                  interleaved):
    """Every host check of a decode call (none reads a device value, and the fake runs them on fake
    tensors); returns (dimensions, static arguments)."""
    dims = check_compress_store_decode_args(
        projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q, compress_ratio, norm_weight,
        eps, cos, sin, positions, slot_mapping, kv_cache, fmt, out_norm=out_norm, rope_dim=rope_dim,
        interleaved=interleaved)
    return dims, _launchable(projected_kv, state_cache, kv_cache, fmt, compress_ratio, rope_dim, interleaved,
                             out_norm, norm_weight, positions, slot_mapping)


def _no_norm(projected_kv):
    """The out_norm placeholder of a call without one."""
    return dummy(projected_kv.device, torch.bfloat16, (1, VEC * WARP))


def _prefill_plan(*args, config=None):
    """(dimensions, compiled kernel, search steps, out_norm placeholder, whether the read tensors are
    contiguous) of a call's static key."""
    dims, static = _prefill_check(*args, config=config)
    if dims.store.rows == 0:
        return dims, None, 0, None, True
    fn = kernel(compress_store_prefill_kernel, *static, config or prefill_config(dims.store.rows))
    return dims, fn, _search_steps(dims.compress.num_reqs), _no_norm(args[0]), dense(*args)


def _decode_plan(*args):
    """(dimensions, compiled kernel, out_norm placeholder, whether the read tensors are contiguous) of a
    call's static key."""
    dims, static = _decode_check(*args)
    if dims.store.rows == 0:
        return dims, None, None, True
    return dims, kernel(compress_store_decode_kernel, *static), _no_norm(args[0]), dense(*args)


_PREFILL_PLANS = Plans(_prefill_plan)
_DECODE_PLANS = Plans(_decode_plan)


def _prefill_launch(plan_, projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                    cu_compressed, compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping,
                    kv_cache, fmt, out_norm, num_rows, rope_dim, interleaved):
    dims, fn, search_steps, no_norm, contiguous = plan_
    if debug_checks_enabled():
        check_compress_store_prefill_values(projected_kv, state_cache, cu_seqlens_q, context_lens,
                                            state_block_idx, cu_compressed, compress_ratio, positions,
                                            slot_mapping, dims)
    if fn is None:
        return
    if not contiguous:
        (projected_kv, cu_seqlens_q, context_lens, state_block_idx, cu_compressed, norm_weight, cos, sin,
         positions, slot_mapping) = (t.contiguous() for t in (
            projected_kv, cu_seqlens_q, context_lens, state_block_idx, cu_compressed, norm_weight, cos, sin,
            positions, slot_mapping))
    fn(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed, norm_weight,
       cos, sin, positions, slot_mapping, kv_cache, out_norm if out_norm is not None else no_norm,
       float(eps), search_steps)


def _decode_launch(plan_, projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                   compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
                   out_norm, rope_dim, interleaved):
    dims, fn, no_norm, contiguous = plan_
    if debug_checks_enabled():
        check_compress_store_decode_values(projected_kv, state_cache, context_lens, state_block_idx,
                                           max_seqlen_q, positions, slot_mapping, dims)
    if fn is None:
        return
    if not contiguous:
        projected_kv, context_lens, state_block_idx, norm_weight, cos, sin, positions, slot_mapping = (
            t.contiguous() for t in (projected_kv, context_lens, state_block_idx, norm_weight, cos, sin,
                                     positions, slot_mapping))
    fn(projected_kv, state_cache, context_lens, state_block_idx, norm_weight, cos, sin, positions,
       slot_mapping, kv_cache, out_norm if out_norm is not None else no_norm, float(eps))


def _prefill_impl(projected_kv: Tensor, state_cache: Tensor, cu_seqlens_q: Tensor, context_lens: Tensor,
                  state_block_idx: Tensor, cu_compressed: Tensor, compress_ratio: int, norm_weight: Tensor,
                  eps: float, cos: Tensor, sin: Tensor, positions: Tensor, slot_mapping: Tensor,
                  kv_cache: Tensor, fmt: str, out_norm: Tensor | None = None, num_rows: int | None = None,
                  rope_dim: int = 64, interleaved: bool = True) -> None:
    args = (projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed,
            compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, cache_format(fmt),
            out_norm, num_rows, rope_dim, interleaved)
    _prefill_launch(_PREFILL_PLANS(args), *args)


def _prefill_fake(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed,
                  compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
                  out_norm=None, num_rows=None, rope_dim=64, interleaved=True):
    _prefill_check(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed,
                   compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache,
                   cache_format(fmt), out_norm, num_rows, rope_dim, interleaved)


def _decode_impl(projected_kv: Tensor, state_cache: Tensor, context_lens: Tensor, state_block_idx: Tensor,
                 max_seqlen_q: int, compress_ratio: int, norm_weight: Tensor, eps: float, cos: Tensor,
                 sin: Tensor, positions: Tensor, slot_mapping: Tensor, kv_cache: Tensor, fmt: str,
                 out_norm: Tensor | None = None, rope_dim: int = 64, interleaved: bool = True) -> None:
    args = (projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q, compress_ratio,
            norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, cache_format(fmt), out_norm,
            rope_dim, interleaved)
    _decode_launch(_DECODE_PLANS(args), *args)


def _decode_fake(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q, compress_ratio,
                 norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt, out_norm=None,
                 rope_dim=64, interleaved=True):
    _decode_check(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q, compress_ratio,
                  norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, cache_format(fmt), out_norm,
                  rope_dim, interleaved)


_WRITES = ("state_cache", "kv_cache", "out_norm")
_PREFILL_OP = register_op("compress_store_prefill", _prefill_impl, _prefill_fake, mutates_args=_WRITES)
_DECODE_OP = register_op("compress_store_decode", _decode_impl, _decode_fake, mutates_args=_WRITES)


def compress_store_prefill(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                           cu_compressed, compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping,
                           kv_cache, fmt, *, out_norm=None, num_rows=None, rope_dim=64,
                           interleaved=True, config: CompressStoreConfig | None = None) -> None:
    """cache[slot_mapping[j]] = cast(rope(rmsnorm(gated_mean(group j)))), ring updated; one launch.

    Same arguments and results as ``reference.compress_store.compress_store_prefill_ref``:
    projected_kv [num_tokens, 2 * D] fp32 (copied if non-contiguous), state_cache [slots, S, 2, D]
    fp32 (in place), cu_seqlens_q/context_lens/state_block_idx/cu_compressed int32 metadata,
    norm_weight [D] bf16/fp32, cos/sin [max_position, rope_dim/2] fp32, positions/slot_mapping
    [rows] int32/int64, kv_cache uint8 (in place), out_norm optional [rows, D] bf16. Returns None.
    ``torch.ops.tilelang_ops.compress_store_prefill`` (it takes ``fmt.name``). ``config``: the launch shape
    (None: ``prefill_config(rows)``), launched directly, outside the registered op; every config stores the
    same bytes.
    """
    args = (projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed,
            compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt, out_norm,
            num_rows, rope_dim, interleaved)
    if config is None:
        call_format_op(_PREFILL_OP, _prefill_check, args, 14)
    else:
        _prefill_launch(_prefill_plan(*args, config=config), *args)


def compress_store_decode(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                          compress_ratio, norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt,
                          *, out_norm=None, rope_dim=64, interleaved=True) -> None:
    """Decode / verification step, fused: ring writes, groups closing in the step, their cache rows.

    Same arguments and results as ``reference.compress_store.compress_store_decode_ref``. Returns None.
    ``torch.ops.tilelang_ops.compress_store_decode`` (it takes ``fmt.name``). The kernel has no tuning knob
    (its CTA shape follows from the row width), so no ``config``.
    """
    args = (projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q, compress_ratio,
            norm_weight, eps, cos, sin, positions, slot_mapping, kv_cache, fmt, out_norm, rope_dim,
            interleaved)
    call_format_op(_DECODE_OP, _decode_check, args, 13)


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
