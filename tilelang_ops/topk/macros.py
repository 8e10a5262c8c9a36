"""Macros and constants the top-k kernels share: the order-preserving key, warp reductions, the packed
counts of an ordered pass and the output-lane epilogue (fills, the index transform of each mode)."""

import tilelang
import tilelang.language as T

PASS_CONFIGS = {tilelang.PassConfigKey.TL_DISABLE_THREAD_STORAGE_SYNC: True}
# every global index of the kernels is bounded by the clamped `end` or by k: no safe-memory legalization
KERNEL_PASS_CONFIGS = {**PASS_CONFIGS, tilelang.PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True}

THREADS = 1024  # one CTA per row (the row and tile kernels' full CTA)
WARPS = THREADS // 32  # per-warp shared buffers are sized for the full CTA
PASSES = 3  # radix passes at most: the [lo, hi] range narrows from 2^32 keys to one key
UNROLL = 8  # row entries per thread per tile: independent loads in flight
TILE = THREADS * UNROLL
# Rows beyond the row tiers: the candidate list holds this many (key, index) pairs (64 KiB).
CAND = 8192
MAX_CACHE = 32768  # the longest rows of the 32768 tier (sampled over 2 runs of 32 a warp)
SMALL_CACHE = 4096  # the short tier: a 4096-slot candidate list, so several CTAs fit on an SM
SHORT_ROW_THREADS = 256  # the CTA for many rows of the short tier (three per SM)


def cand_cap(cache_cap: int) -> int:
    """Candidate slots of the row kernel (rows up to this many entries are compacted whole, unsampled)."""
    return SMALL_CACHE if cache_cap == SMALL_CACHE else CAND


def _f32_bits(score):
    """The FP32 bits of a score (BF16 widened exactly), as uint32."""
    return T.reinterpret(T.Cast("float32", score), "uint32")


def _lane_macros(in_dtype, idx_dtype, with_values, with_offset, idx_fill, val_fill, mode, cand_bs, block_c,
                 nc, mb, threads=THREADS):
    """The output-lane macros of the top-k kernels: `fills` writes the fill values to the lanes
    [min(e, k), k) of a row, `emit` gives lane `pos` row entry `oi` (the mode's index transform and the
    value copy). `val_fill` is a float or its ``float.hex`` (``exact_fill``)."""
    val_fill = float.fromhex(val_fill) if isinstance(val_fill, str) else val_fill

    @T.macro
    def fills(values, indices, row, tx, k, e):
        for it in T.serial(T.ceildiv(k, threads)):
            ln = it * threads + tx
            if ln < k and ln >= T.min(e, k):
                indices[row, ln] = T.Cast(idx_dtype, idx_fill)
                if with_values:
                    values[row, ln] = T.Cast(in_dtype, val_fill)

    @T.macro
    def emit(scores, offset, cand, table, values, indices, row, base, pos, oi):
        jj = T.alloc_var("int64")
        jj = T.Cast("int64", oi)
        if mode == "slots":
            if cand_bs > 0:
                blk = cand[row, T.min(oi // cand_bs, nc - 1)]
                jj = T.if_then_else(T.Or(blk < 0, oi // cand_bs >= nc), T.int64(-1),
                                    T.Cast("int64", blk) * cand_bs + oi % cand_bs)
            if jj >= 0:
                tb = table[row, T.Cast("int32", T.min(jj // block_c, mb - 1))]
                jj = T.if_then_else(T.Or(tb < 0, jj // block_c >= mb), T.int64(-1),
                                    T.Cast("int64", tb) * block_c + jj % block_c)
        elif with_offset:
            jj = jj + T.Cast("int64", offset[row])
        indices[row, pos] = T.Cast(idx_dtype, jj)
        if with_values:
            values[row, pos] = scores[base + oi]

    return fills, emit


def _key(bits):
    """Order-preserving uint32 key of fp32 bits (-0.0 -> +0.0, every NaN -> 0xFFFFFFFF): flip all bits of a
    negative, the sign bit of a positive (xor with the sign-extended sign | MSB). Branch-free without
    selects (nvcc turns selects of the two special cases into a branch around every key): -0.0's bits
    are cleared by the sign-extended borrow of mag - 1, and NaN ORs in the sign-extended borrow of
    0x7F800000 - mag (mag <= 0x7FFFFFFF: both differences fit an int32)."""
    mag = bits & T.uint32(0x7FFFFFFF)
    nan = T.Cast("uint32", T.Cast("int32", T.uint32(0x7F800000) - mag) >> 31)
    b2 = bits & ~T.Cast("uint32", T.Cast("int32", mag - T.uint32(1)) >> 31)
    return (b2 ^ (T.Cast("uint32", T.Cast("int32", b2) >> 31) | T.uint32(0x80000000))) | nan


def _warp_min(x):
    """Minimum of a uint32 over the warp (one REDUX instead of a five-step shuffle tree)."""
    return T.call_extern("uint32", "__reduce_min_sync", T.uint32(0xFFFFFFFF), x)


def _warp_max(x):
    return T.call_extern("uint32", "__reduce_max_sync", T.uint32(0xFFFFFFFF), x)


def _warp_sum(x):
    """Sum of an int32 over the warp (REDUX; packed counts add without carries between fields)."""
    return T.call_extern("int32", "__reduce_add_sync", T.uint32(0xFFFFFFFF), x)


@T.macro
def _warp_incl(c, incl, lane):
    """incl[0] = the warp's inclusive prefix sum of the int32 c (row and tile kernels)."""
    tmp = T.alloc_var("int32")
    incl[0] = c
    for o in (1, 2, 4, 8, 16):
        tmp = T.shfl_up(incl[0], o)
        incl[0] = incl[0] + T.if_then_else(lane >= o, tmp, 0)


# Packed counts of an ordered pass's step (all three kernels): keys taken for sure in the low 16 bits,
# ties above (TIE); a lane's own class rides above its rank (CLS_*), so it needs no register of its own.
TIE = 1 << 16
CLS_TAKE, CLS_TIE, CNT_MASK = 1 << 28, 1 << 29, (1 << 28) - 1


@T.macro
def _ordered_classes(kb, inl, ws, nu, lo, hi, cnt, kk, lt):
    """One step of an ordered pass over the nu keys kb[u] of each lane (strip u: 32 consecutive entries):
    inl[u] = the packed counts of the warp's entries before mine in the step (CNT_MASK bits) | my class,
    ws[0] = the warp's packed total. A key above hi is taken for sure, a key in [lo, hi] is a tie (key 0,
    no entry, is below lo); when cnt == kk every key in [lo, hi] is taken: one ballot per strip."""
    dm = T.alloc_var("uint32")
    tm = T.alloc_var("uint32")
    kx = T.alloc_var("uint32")
    cv = T.alloc_var("int32")
    ws[0] = 0
    if cnt == kk:
        for u in T.unroll(nu):
            dm = T.Cast("uint32", T.ballot_sync(kb[u] >= lo))
            inl[u] = (ws[0] + T.Cast("int32", T.popcount(dm & lt))
                      + T.if_then_else(kb[u] >= lo, CLS_TAKE, 0))
            ws[0] = ws[0] + T.Cast("int32", T.popcount(dm))
    else:
        for u in T.unroll(nu):
            kx = kb[u]
            cv = T.if_then_else(kx > hi, 1, T.if_then_else(kx >= lo, TIE, 0))
            dm = T.Cast("uint32", T.ballot_sync(cv == 1))
            tm = T.Cast("uint32", T.ballot_sync(cv == TIE))
            inl[u] = (ws[0] + T.Cast("int32", T.popcount(dm & lt))
                      + T.Cast("int32", T.popcount(tm & lt)) * TIE
                      + T.if_then_else(cv == 1, CLS_TAKE, 0)
                      + T.if_then_else(cv == TIE, CLS_TIE, 0))
            ws[0] = (ws[0] + T.Cast("int32", T.popcount(dm))
                     + T.Cast("int32", T.popcount(tm)) * TIE)


