"""TileLang kernels of the compress operator (SPEC 1.1-1.3): gated mean of r positions, ring update.

    z[d] = sum_t softmax_t(s[t, d]) * v[t, d]      (FP32, one BF16 RNE cast)

The FP32 operation order is the one fixed in reference/compress.py (max, exp(s - m), sequential sums
in position order, separate multiply and add, IEEE division); the kernels are compiled with
``--fmad=false`` so nvcc does not contract ``num + e * v`` into an FMA. Only ``expf`` may differ
from torch's exp (by one FP32 ulp), so rows are compared within one BF16 ulp; rings are copies and
compare bitwise.

Both kernels are memory bound: each thread moves 16 B vectors (4 FP32 channels) of the score and
the latent half; a block has 128 threads and covers whole rows.
"""

from __future__ import annotations

import math

import tilelang
import tilelang.language as T
import torch

from metadata.checks import check_aligned, check_cuda, debug_checks_enabled
from metadata.compress_args import (
    check_decode_args,
    check_decode_values,
    check_prefill_args,
    check_prefill_values,
    dispatch_compress,
)
from tilelang_ops._library import Plans, call_op, dense, kernel, register_op
from tilelang_ops.gather_rows import gather_rows

THREADS = 128
VEC = 4  # FP32 channels per thread and access: 16 B loads and stores of the inputs and the ring
DIM_ALIGN = 64  # D must be a multiple of this (VEC * 16, so a row is whole 64 B sectors)
PREFILL_MIN_ROWS = 4  # rows per prefill block at least: amortizes the row -> request search
SEARCH_STEPS = 32  # binary search over cu_compressed (int32 offsets: 31 halvings suffice)
# nvcc would contract `num + e * v` into an FMA and break bitwise agreement with the reference.
COMPILE_FLAGS = ["--fmad=false"]

# (D, r) pairs the build check compiles for sm_90a (tests and `make diff`)
BUILD_SHAPES = ((512, 2), (512, 4), (64, 2), (64, 4), (192, 8))


def _rows_per_pass(dim: int) -> int:
    """Fewest rows whose 16 B vectors fill whole passes of the block's threads."""
    vectors = dim // VEC
    return THREADS // math.gcd(vectors, THREADS)


def rows_per_block(dim: int, prefill: bool) -> int:
    """Output rows of one CTA: decode one pass of the block's threads, prefill at least
    ``PREFILL_MIN_ROWS`` (whole passes)."""
    rows_pass = _rows_per_pass(dim)
    return rows_pass * max(1, -(-PREFILL_MIN_ROWS // rows_pass)) if prefill else rows_pass


def _check_dim(dim: int) -> None:
    if dim % DIM_ALIGN:
        raise ValueError(f"the compress kernel needs D to be a multiple of {DIM_ALIGN}, got D={dim}")


@tilelang.jit(compile_flags=COMPILE_FLAGS)
def compress_prefill_kernel(dim: int, compress_ratio: int, ring: int = 0):
    """Prefill: one block per ROWS consecutive output rows.

    Rows find their request by a binary search over cu_compressed (one thread per row, results in
    shared memory), so a launch needs no host-side map. Only the first group of a request can read
    the ring (it began before the chunk), and that row's block also performs the request's ring
    writes, after a block barrier: the ring reads of a request therefore always precede its writes,
    even when the chunk is longer than the ring, and no other block touches that ring slot.
    ``ring`` = 0 makes S a runtime value (one compiled kernel for every ring size).
    """
    r = compress_ratio
    vectors = dim // VEC  # 16 B vectors per latent row (half of a projected row)
    rows = rows_per_block(dim, prefill=True)
    iters = rows * vectors // THREADS  # passes over the block's row vectors
    num_tokens, num_rows, num_reqs, num_slots, ring_dyn = T.dynamic(
        "num_tokens, num_rows, num_reqs, num_slots, ring_size")
    S = ring if ring else ring_dyn
    f32, bf16, i32, i64 = "float32", "bfloat16", "int32", "int64"

    @T.prim_func
    def prefill(
        projected_kv: T.Tensor((num_tokens, 2 * dim), f32),  # [num_tokens, 2 * D] fp32
        state_cache: T.Tensor((num_slots, S, 2, dim), f32),  # [num_state_slots, S, 2, D] fp32
        cu_seqlens_q: T.Tensor((num_reqs + 1,), i32),  # [num_reqs + 1] int32
        context_lens: T.Tensor((num_reqs,), i32),  # [num_reqs] int32
        state_block_idx: T.Tensor((num_reqs,), i32),  # [num_reqs] int32
        cu_compressed: T.Tensor((num_reqs + 1,), i32),  # [num_reqs + 1] int32
        kv: T.Tensor((num_rows, dim), bf16),  # [rows, D] bf16, written
    ):
        with T.Kernel(T.ceildiv(num_rows, rows), threads=THREADS) as bx:
            tx = T.get_thread_binding()
            # per row of the block: first position of its group (-1: placeholder or skipped row),
            # chunk start s, token index of position 0, slot; ring writes of its request (the newest
            # wcnt = min(len, S) positions, ending at e = start + len)
            sh_gpos = T.alloc_shared((rows,), i32, scope="shared")
            sh_start = T.alloc_shared((rows,), i32, scope="shared")
            sh_tokbase = T.alloc_shared((rows,), i32, scope="shared")
            sh_slot = T.alloc_shared((rows,), i32, scope="shared")
            sh_wcnt = T.alloc_shared((rows,), i32, scope="shared")
            sh_wlo = T.alloc_shared((rows,), i32, scope="shared")
            lo = T.alloc_var(i32)
            hi = T.alloc_var(i32)
            mid = T.alloc_var(i32)
            sc = T.alloc_local((r * VEC,), f32)
            lat = T.alloc_local((r * VEC,), f32)
            out = T.alloc_local((VEC,), bf16)
            m = T.alloc_var(f32)
            den = T.alloc_var(f32)
            num = T.alloc_var(f32)

            if tx < rows:
                row = bx * rows + tx
                # locals first, one store per shared entry (no write-after-write barrier needed)
                gpos = T.alloc_var(i32, init=-1)
                wcnt = T.alloc_var(i32, init=0)
                wlo = T.alloc_var(i32, init=0)
                start = T.alloc_var(i32, init=0)
                tokbase = T.alloc_var(i32, init=0)
                slot = T.alloc_var(i32, init=0)
                if row < num_rows:
                    # the request of this row: largest i with cu_compressed[i] <= row
                    lo = 0
                    hi = num_reqs - 1
                    for _ in T.serial(SEARCH_STEPS):
                        if lo >= hi:
                            T.loop_break()
                        mid = (lo + hi + 1) >> 1
                        if cu_compressed[mid] <= row:
                            lo = mid
                        else:
                            hi = mid - 1
                    tok0 = cu_seqlens_q[lo]
                    tok1 = cu_seqlens_q[lo + 1]
                    e = context_lens[lo]
                    k = row - cu_compressed[lo]
                    slot = state_block_idx[lo]
                    start = e - (tok1 - tok0)
                    tokbase = tok0 - start
                    # bad metadata (checked only under the debug switch) skips the request: its
                    # rows stay zero and nothing outside the tensors is touched
                    if (slot >= 0 and slot < num_slots and tok0 >= 0 and tok0 <= tok1 and tok1 <= num_tokens
                            and start >= 0 and k >= 0):
                        if k < e // r - start // r:
                            gpos = (start // r + k) * r
                        if k == 0:
                            wlo = T.max(start, e - S)
                            wcnt = e - wlo
                sh_gpos[tx] = gpos
                sh_wcnt[tx] = wcnt
                sh_wlo[tx] = wlo
                sh_start[tx] = start
                sh_tokbase[tx] = tokbase
                sh_slot[tx] = slot
            T.sync_threads()

            # unrolled so the loads of several rows can be in flight together
            for it in T.unroll(iters):
                v = it * THREADS + tx
                j = v // vectors
                d = (v % vectors) * VEC
                row = bx * rows + j
                if row < num_rows:
                    gpos = sh_gpos[j]
                    if gpos >= 0:
                        s = sh_start[j]
                        for t in T.unroll(r):
                            p = gpos + t
                            if p >= s:
                                tok = T.cast(sh_tokbase[j] + p, i64)
                                for q in T.vectorized(VEC):
                                    sc[t * VEC + q] = projected_kv[tok, d + q]
                                for q in T.vectorized(VEC):
                                    lat[t * VEC + q] = projected_kv[tok, dim + d + q]
                            else:  # the group began before the chunk: earlier inputs from the ring
                                slot64 = T.cast(sh_slot[j], i64)
                                for q in T.vectorized(VEC):
                                    sc[t * VEC + q] = state_cache[slot64, p % S, 0, d + q]
                                for q in T.vectorized(VEC):
                                    lat[t * VEC + q] = state_cache[slot64, p % S, 1, d + q]
                        for q in T.unroll(VEC):
                            m = sc[q]
                            for t in T.unroll(1, r):
                                m = T.max(m, sc[t * VEC + q])
                            for t in T.unroll(r):
                                sc[t * VEC + q] = T.exp(sc[t * VEC + q] - m)
                            den = sc[q]
                            num = sc[q] * lat[q]
                            for t in T.unroll(1, r):
                                den = den + sc[t * VEC + q]
                                num = num + sc[t * VEC + q] * lat[t * VEC + q]
                            out[q] = T.cast(num / den, bf16)
                    else:  # placeholder (nc = 0) or skipped request: a zero row
                        for q in T.unroll(VEC):
                            out[q] = T.cast(0, bf16)
                    for q in T.vectorized(VEC):
                        kv[T.cast(row, i64), d + q] = out[q]

            # All ring reads of the block's requests are done (the ring is only read by the first
            # group of a request, which is in this block): now write the newest min(len, S) inputs.
            T.sync_threads()
            for j in T.serial(rows):
                cnt = sh_wcnt[j]
                if cnt > 0:
                    for it in T.serial(T.ceildiv(S * 2 * vectors, THREADS)):
                        v = it * THREADS + tx
                        w = v // (2 * vectors)
                        h = (v % (2 * vectors)) // vectors
                        d = (v % vectors) * VEC
                        if w < cnt:
                            p = sh_wlo[j] + w
                            tok = T.cast(sh_tokbase[j] + p, i64)
                            for q in T.vectorized(VEC):
                                state_cache[T.cast(sh_slot[j], i64), p % S, h, d + q] = \
                                    projected_kv[tok, h * dim + d + q]

    return prefill


@tilelang.jit(compile_flags=COMPILE_FLAGS)
def compress_decode_kernel(dim: int, compress_ratio: int, ring: int = 0):
    """Decode / verification: one block per ROWS query tokens.

    Every token writes its own inputs at ``p % S``. A token that closes a group takes position
    ``p - dlt`` from the current step's projected_kv when token ``i - dlt`` has the same slot and
    that position (it belongs to this step), else from the ring, which this step never overwrites
    at those positions (capacity rule ``S >= r + max_seqlen_q - 1``, checked on the host). So no
    block reads what another block writes, and the result does not depend on block order.
    """
    r = compress_ratio
    vectors = dim // VEC
    rows = rows_per_block(dim, prefill=False)
    iters = rows * vectors // THREADS
    num_tokens, num_slots, ring_dyn = T.dynamic("num_tokens, num_slots, ring_size")
    S = ring if ring else ring_dyn
    f32, bf16, i32, i64 = "float32", "bfloat16", "int32", "int64"

    @T.prim_func
    def decode(
        projected_kv: T.Tensor((num_tokens, 2 * dim), f32),  # [total_q, 2 * D] fp32
        state_cache: T.Tensor((num_slots, S, 2, dim), f32),  # [num_state_slots, S, 2, D] fp32
        context_lens: T.Tensor((num_tokens,), i32),  # [total_q] int32, position + 1
        state_block_idx: T.Tensor((num_tokens,), i32),  # [total_q] int32
        kv: T.Tensor((num_tokens, dim), bf16),  # [total_q, D] bf16, written
    ):
        with T.Kernel(T.ceildiv(num_tokens, rows), threads=THREADS) as bx:
            tx = T.get_thread_binding()
            sh_pos = T.alloc_shared((rows,), i32, scope="shared")  # -1: skipped token
            sh_slot = T.alloc_shared((rows,), i32, scope="shared")
            # bit dlt-1 set: position p - dlt comes from token i - dlt of this step
            sh_local = T.alloc_shared((rows,), i32, scope="shared")
            sc = T.alloc_local((r * VEC,), f32)
            lat = T.alloc_local((r * VEC,), f32)
            out = T.alloc_local((VEC,), bf16)
            m = T.alloc_var(f32)
            den = T.alloc_var(f32)
            num = T.alloc_var(f32)

            if tx < rows:
                i = bx * rows + tx
                pos = T.alloc_var(i32, init=-1)
                slot = T.alloc_var(i32, init=0)
                mask = T.alloc_var(i32, init=0)
                if i < num_tokens:
                    p = context_lens[i] - 1
                    slot = state_block_idx[i]
                    # bad metadata (checked only under the debug switch) skips the token: zero row,
                    # no ring write, nothing outside the tensors is touched
                    if p >= 0 and slot >= 0 and slot < num_slots:
                        pos = p
                        for dlt in T.unroll(1, r):
                            if i - dlt >= 0:
                                if state_block_idx[i - dlt] == slot and context_lens[i - dlt] == p - dlt + 1:
                                    mask = mask | (1 << (dlt - 1))
                sh_pos[tx] = pos
                sh_slot[tx] = slot
                sh_local[tx] = mask
            T.sync_threads()

            for it in T.serial(iters):
                v = it * THREADS + tx
                j = v // vectors
                d = (v % vectors) * VEC
                i = bx * rows + j
                if i < num_tokens:
                    p = sh_pos[j]
                    i64_ = T.cast(i, i64)
                    if p >= 0:
                        slot64 = T.cast(sh_slot[j], i64)
                        for q in T.vectorized(VEC):
                            state_cache[slot64, p % S, 0, d + q] = projected_kv[i64_, d + q]
                        for q in T.vectorized(VEC):
                            state_cache[slot64, p % S, 1, d + q] = projected_kv[i64_, dim + d + q]
                    if p >= 0 and p % r == r - 1:
                        for t in T.unroll(r):
                            dlt = r - 1 - t
                            if dlt == 0 or (sh_local[j] >> (dlt - 1)) & 1 == 1:
                                for q in T.vectorized(VEC):
                                    sc[t * VEC + q] = projected_kv[i64_ - dlt, d + q]
                                for q in T.vectorized(VEC):
                                    lat[t * VEC + q] = projected_kv[i64_ - dlt, dim + d + q]
                            else:
                                slot64 = T.cast(sh_slot[j], i64)
                                for q in T.vectorized(VEC):
                                    sc[t * VEC + q] = state_cache[slot64, (p - dlt) % S, 0, d + q]
                                for q in T.vectorized(VEC):
                                    lat[t * VEC + q] = state_cache[slot64, (p - dlt) % S, 1, d + q]
                        for q in T.unroll(VEC):
                            m = sc[q]
                            for t in T.unroll(1, r):
                                m = T.max(m, sc[t * VEC + q])
                            for t in T.unroll(r):
                                sc[t * VEC + q] = T.exp(sc[t * VEC + q] - m)
                            den = sc[q]
                            num = sc[q] * lat[q]
                            for t in T.unroll(1, r):
                                den = den + sc[t * VEC + q]
                                num = num + sc[t * VEC + q] * lat[t * VEC + q]
                            out[q] = T.cast(num / den, bf16)
                    else:
                        for q in T.unroll(VEC):
                            out[q] = T.cast(0, bf16)
                    for q in T.vectorized(VEC):
                        kv[i64_, d + q] = out[q]

    return decode


# ----------------------------------------------------------------------------------------------
# torch-facing wrappers: torch.ops.tilelang_ops.compress_prefill / compress_decode (SPEC 7)
# ----------------------------------------------------------------------------------------------


def _checked(dims, projected_kv, state_cache):
    check_cuda(projected_kv=projected_kv, state_cache=state_cache)
    _check_dim(dims.dim)
    # a non-contiguous projected_kv is copied into a fresh (aligned) allocation at the launch
    check_aligned(state_cache=state_cache, projected_kv=projected_kv)
    return dims


def _check_prefill(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed,
                   compress_ratio, num_rows):
    """Every host check of a prefill call; returns its dimensions."""
    dims = check_prefill_args(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                              cu_compressed, compress_ratio, num_rows)
    return _checked(dims, projected_kv, state_cache)


def _check_decode(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q, compress_ratio):
    """Every host check of a decode call; returns its dimensions."""
    dims = check_decode_args(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                             compress_ratio)
    return _checked(dims, projected_kv, state_cache)


def _prefill_plan(*args):
    """(dimensions, compiled kernel, whether the read tensors are contiguous) of a call's static key."""
    dims = _check_prefill(*args)
    return dims, kernel(compress_prefill_kernel, dims.dim, args[6]), dense(*args)


def _decode_plan(*args):
    """(dimensions, compiled kernel, whether the read tensors are contiguous) of a call's static key."""
    dims = _check_decode(*args)
    return dims, kernel(compress_decode_kernel, dims.dim, args[5]), dense(*args)


_PREFILL_PLANS = Plans(_prefill_plan)
_DECODE_PLANS = Plans(_decode_plan)


def _prefill_impl(projected_kv: torch.Tensor, state_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
                  context_lens: torch.Tensor, state_block_idx: torch.Tensor, cu_compressed: torch.Tensor,
                  compress_ratio: int, num_rows: int | None = None) -> torch.Tensor:
    args = (projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed,
            compress_ratio, num_rows)
    dims, fn, contiguous = _PREFILL_PLANS(args)
    if debug_checks_enabled():
        num_rows = check_prefill_values(*args)
    if num_rows is None:
        num_rows = int(cu_compressed[-1])  # one device sync; pass num_rows to avoid it
    kv = torch.empty(num_rows, dims.dim, dtype=torch.bfloat16, device=projected_kv.device)
    if num_rows:
        if not contiguous:
            projected_kv, cu_seqlens_q, context_lens, state_block_idx, cu_compressed = (
                t.contiguous() for t in (projected_kv, cu_seqlens_q, context_lens, state_block_idx,
                                         cu_compressed))
        fn(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed, kv)
    return kv


def _prefill_fake(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx, cu_compressed,
                  compress_ratio, num_rows=None):
    dims = _check_prefill(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                          cu_compressed, compress_ratio, num_rows)
    if num_rows is None:  # cu_compressed[-1]: a value of the metadata, unknown while tracing
        num_rows = torch.library.get_ctx().new_dynamic_size()
    return projected_kv.new_empty(num_rows, dims.dim, dtype=torch.bfloat16)


def _decode_impl(projected_kv: torch.Tensor, state_cache: torch.Tensor, context_lens: torch.Tensor,
                 state_block_idx: torch.Tensor, max_seqlen_q: int, compress_ratio: int) -> torch.Tensor:
    args = (projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q, compress_ratio)
    dims, fn, contiguous = _DECODE_PLANS(args)
    if debug_checks_enabled():
        check_decode_values(*args[:5])
    kv = torch.empty(dims.num_tokens, dims.dim, dtype=torch.bfloat16, device=projected_kv.device)
    if dims.num_tokens:
        if not contiguous:
            projected_kv, context_lens, state_block_idx = (
                t.contiguous() for t in (projected_kv, context_lens, state_block_idx))
        fn(projected_kv, state_cache, context_lens, state_block_idx, kv)
    return kv


def _decode_fake(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q, compress_ratio):
    dims = _check_decode(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                         compress_ratio)
    return projected_kv.new_empty(dims.num_tokens, dims.dim, dtype=torch.bfloat16)


_PREFILL_OP = register_op("compress_prefill", _prefill_impl, _prefill_fake, mutates_args=("state_cache",))
_DECODE_OP = register_op("compress_decode", _decode_impl, _decode_fake, mutates_args=("state_cache",))


def compress_prefill(projected_kv, state_cache, cu_seqlens_q, context_lens, state_block_idx,
                     cu_compressed, compress_ratio, *, num_rows=None):
    """Chunked prefill on the GPU (``torch.ops.tilelang_ops.compress_prefill``); same contract as
    ``reference.compress.compress_prefill_ref``.

    projected_kv    [num_tokens, 2 * D] fp32   state_cache [num_state_slots, S, 2, D] fp32 (in place)
    cu_seqlens_q    [num_reqs + 1] int32       context_lens, state_block_idx [num_reqs] int32
    cu_compressed   [num_reqs + 1] int32       returns kv [rows, D] bf16
    ``num_rows`` (= cu_compressed[-1], known to the metadata builder) avoids a device sync and keeps the
    call CUDA-graph safe.
    """
    return call_op(_PREFILL_OP, _check_prefill, projected_kv, state_cache, cu_seqlens_q, context_lens,
                   state_block_idx, cu_compressed, compress_ratio, num_rows)


def compress_decode(projected_kv, state_cache, context_lens, state_block_idx, max_seqlen_q,
                    compress_ratio):
    """Decode / verification step on the GPU (``torch.ops.tilelang_ops.compress_decode``); same
    contract as ``compress_decode_ref``.

    projected_kv [total_q, 2 * D] fp32   state_cache [num_state_slots, S, 2, D] fp32 (in place)
    context_lens, state_block_idx [total_q] int32   returns kv [total_q, D] bf16
    The capacity rule ``S >= r + max_seqlen_q - 1`` is checked on the host before the launch.
    """
    return call_op(_DECODE_OP, _check_decode, projected_kv, state_cache, context_lens, state_block_idx,
                   max_seqlen_q, compress_ratio)


def compress(projected_kv, state_cache, metadata, compress_ratio, is_prefill, *,
             compress_overlap=False, use_ape=False):
    """Engine entry point: C1 passes its BF16 input through; C2 compresses (prefill or decode).

    ``metadata`` has ``cu_seqlens_q, context_lens, state_block_idx, max_seqlen_q`` and
    ``cu_compressed[str(r)]`` (an ``InputMetadata``; duck-typed). Under context parallelism (the
    metadata carries ``mirror_cp_reverse_index``) C1 takes the all-gathered rows and returns them in the
    batch's order: ``gather_rows(projected_kv, mirror_cp_reverse_index)`` (SPEC 6). A prefill
    request with no new token gets its zero placeholder row (``c1_prefill_rows``)."""
    return dispatch_compress(compress_prefill, compress_decode, gather_rows,
                             projected_kv, state_cache, metadata, compress_ratio, is_prefill,
                             compress_overlap=compress_overlap, use_ape=use_ape)
