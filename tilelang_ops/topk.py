"""TileLang kernels for index-score selection (SPEC 1.6): exact top-k, block maxima, candidate restore,
logical-row -> physical-slot conversion, and the fused scores -> slots path.

Top-k algorithm (one CTA of 1024 threads per row; v3 uses one warp per row or 256-thread CTAs for many
short rows and a cluster of CTAs for a few long ones, see the last bullets), exact and deterministic:

* Scores map to order-preserving uint32 keys (fp32 bit trick; bf16 widened exactly; -0.0 folded onto
  +0.0 and every NaN onto 0xFFFFFFFF, so NaN ranks highest as in torch.topk). Same key as
  `reference.topk.order_key`.
* Radix select on the key: the threshold (k-th largest key) lies in [lo, hi], first the whole uint32
  range. Each pass builds a 2048-bin shared histogram of (key - lo) >> sh for the keys in [lo, hi]
  (warp-aggregated adds, so concentrated scores do not serialize on one bin); a block suffix scan finds
  the bin holding the threshold, and [lo, hi] becomes that bin intersected with [min, max] of the keys
  that were in range (concentrated scores collapse to their spread at once; all-equal ties give the
  exact key). At most 3 passes (2^32 -> 2^21 -> 2^10 -> 1 keys); it stops early when the bin is taken
  whole or lo == hi.
* Where keys come from: rows up to MAX_CACHE entries keep their keys in shared memory after the first
  read. Longer rows are re-read from global memory until the keys >= lo fit
  in CAND shared slots; they are then compacted once (key, index; in index order, through ordered
  ballots), and the remaining passes run on that list. The capacity is checked against the exact count
  *before* compacting, so nothing can overflow and no winner is dropped; when it never fits (heavy ties)
  the passes simply keep reading the row: slower, still exact. Speculation: long rows first estimate a
  lower bound of the threshold from a sample (8 chunks of 1024 spread over the row) and pass 0 compacts
  the keys above it on the fly; when that list turns out to hold >= k and <= CAND keys (checked exactly)
  the row is read only once (+ the sample), else it is ignored. (This is variant v1; v3, the default,
  is its own factory: see below and VARIANTS.)
* Final ordered pass: a key above hi is taken; a key in [lo, hi] is taken iff fewer than `kk` such keys
  precede it (block-wide ordered prefix counts with warp ballots), which gives ties to
  the lower index. The write position is the ordered count of taken lanes before it, so the output is in
  **ascending index order** (unsorted and ``sorted_index`` are the same thing here); ``sorted=True``
  sorts the k lanes afterwards with a stable torch sort on the same key (extra launches).
* Variant v3 (`topk_kernel_v3`, same output contract): no row cache; rows above the candidate capacity
  sample a bound `thr` as above, then ONE read of the row compacts the keys >= thr in any order (one
  shared counter add per warp, no ordered scans, no per-tile barrier) and counts them exactly together
  with their [min, max]. With >= k of them the threshold lies in [min, max] (nothing is above max), so
  all-equal and few-distinct rows are done at once (min == max). The radix passes then run on the list
  (<= CAND keys) or, when it overflowed or the bound was too high, on the row (compacting once the keys
  >= lo fit). Final lanes: over the list, per window of 131072 indices, bitmaps of the taken and tied
  indices and a block scan of their word popcounts give each winner its ascending-index lane
  (taken before + min(ties before, kk)); over the row, the ordered pass stops once all k lanes are found.
  Rows of at most one tile skip the list: their keys stay in registers through the passes and the
  ordered pass. v3's radix digits are 12 bits (4096 bins); once the threshold bin holds at most 256
  keys (list or registers), they are gathered and each is ranked against all (one warp per 32 keys) to
  find the kk-th largest with its multiplicity, instead of further passes.
* v3 on few long rows (up to 8 CTAs per row while all take at most half the SMs): a cluster per row. Each
  draws the same sample (the same thr, no talking), compacts its share of the row's tiles into its own
  list, and the others copy theirs into the lead's list through distributed shared memory (room
  reserved with one remote add), one cluster barrier, then the lead goes on alone. 1 x 65536: 20.7 ->
  17.0 us on the H200, 1 x 1M 109 -> 49 us; at 64 rows it measured slower (see _v3_split).
* v3 on many short rows (at least n / 104 rows of <= 1024 entries per SM, see _v3_threads): one warp
  per row (`topk_kernel_warp`), four rows per CTA, no block barrier. The same radix select on 8-bit
  digits (a 256-bin histogram per warp; at most 4 passes, each re-reading the row, or for rows of at
  most W_CACHE entries the keys the first pass kept in shared memory, and batching its shuffles, votes
  and adds), then the ordered pass with ballots. 4096 x 1000, k = 512: 37 us against the tile kernel's
  37 (few distinct values 34 / 55) on the H200.
* v3 on launches of long (uncached) rows that read at least half the L2: the compaction's reads past its
  first tile use the L2 evict-first policy (see STREAM_PRELUDE): 128 x 131072: 36.3 -> 33.4 us.
* Lanes [min(k, end), k) get the fills; `end` is clamped to [0, n] in the kernel so a bad `end` can
  never read outside the row (the value check runs under TILELANG_OPS_DEBUG=1).
"""


import tilelang
import tilelang.language as T
import torch

from metadata.checks import check_cuda, debug_checks_enabled
from metadata.topk_args import (
    check_block_max_args,
    check_convert_args,
    check_convert_values,
    check_end_values,
    check_restore_args,
    check_restore_values,
    check_topk_args,
    check_topk_to_slots_args,
)

PASS_CONFIGS = {tilelang.PassConfigKey.TL_DISABLE_THREAD_STORAGE_SYNC: True}

THREADS = 1024  # one CTA per row
WARPS = THREADS // 32
RADIX_BITS = 11
BINS = 1 << RADIX_BITS
PASSES = 3  # the [lo, hi] range narrows from 2^32 keys to <= 2^21, <= 2^10, then 1
UNROLL = 8  # row entries per thread per tile: independent loads in flight
TILE = THREADS * UNROLL
# Rows beyond the cache: once the keys >= lo (above the threshold range or in it) number at most this
# many, they are compacted (key, index) into shared memory and the row is not read again (64 KiB).
CAND = 8192
# Rows up to this many entries keep their keys in shared memory between passes (128 KiB of keys).
MAX_CACHE = 32768
SMALL_CACHE = 4096  # short rows use a 16 KiB cache so several CTAs fit on an SM
SHORT_ROW_THREADS = 256  # v3's CTA for many rows of this tier (three per SM; see _v3_threads)

# Kernel variants (the last static argument of ``_topk_jit``; both stay compiled and tested):
# * "v1" (`topk_kernel`): GPU-verified (exact on every test case): histogram adds aggregated with
#   match_any_sync; a tile is UNROLL strips of THREADS entries and its ordered scans run once per strip.
# * "v3" (`topk_kernel_v3`, the default; see the comment above it): its own factory.
# A "v2" (v1's algorithm with cheaper on-chip work) was the default until v3 replaced it and was then
# removed; its measured figures are in bench_results/h200.txt.
VARIANTS = ("v1", "v3")
TOPK_VARIANT = "v3"  # what topk / topk_to_slots launch; "v1" is the GPU-verified fallback


def _f32_bits(score):
    """The FP32 bits of a score (BF16 widened exactly), as uint32."""
    return T.reinterpret(T.Cast("float32", score), "uint32")


def _lin(it, u, tx):
    """v1: row entry handled by thread tx for strip u of tile it (the order of the ordered scans)."""
    return it * TILE + u * THREADS + tx


def _lane_macros(in_dtype, idx_dtype, with_values, with_offset, idx_fill, val_fill, mode, cand_bs, block_c,
                 nc, mb, threads=THREADS):
    """The output-lane macros both top-k factories share: `fills` writes the fill values to the lanes
    [min(e, k), k) of a row, `emit` gives lane `pos` row entry `oi` (the mode's index transform and the
    value copy)."""

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


_TORCH_TO_TL = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.int32: "int32",
                torch.int64: "int64"}


@tilelang.jit(pass_configs=PASS_CONFIGS)
def topk_kernel(in_dtype: str = "float32", idx_dtype: str = "int32", off_dtype: str = "int32",
                cache_cap: int = 0, with_values: bool = True, with_offset: bool = False,
                idx_fill: int = -1, val_fill: float = float("-inf"), mode: str = "topk",
                cand_bs: int = 0, block_c: int = 1, variant: str = "v1"):
    """mode "topk": indices (+ values); mode "slots": indices -> candidate restore (cand_bs > 0) ->
    physical slots through the block table, all in the epilogue of the ordered pass.
    variant: "v1" only (a static argument, so v1's cache keys name it; v3 is `topk_kernel_v3`)."""
    if variant != "v1":  # v3 is its own factory (topk_kernel_v3; _topk_jit picks it)
        raise ValueError(f"topk_kernel variant must be 'v1' (of {VARIANTS}; v3 is topk_kernel_v3), "
                         f"got {variant!r}")
    total = T.dynamic("total", "int64")  # flat scores storage: (b - 1) * ld + n elements
    b, k, nb_end, nb_off, nb_val, kv = T.dynamic("b, k, nb_end, nb_off, nb_val, kv")
    nc, mb = T.dynamic("nc, mb")
    fills, emit = _lane_macros(in_dtype, idx_dtype, with_values, with_offset, idx_fill, val_fill, mode,
                               cand_bs, block_c, nc, mb)
    cache = max(cache_cap, 1)
    use_cand = cache_cap == 0  # candidate list (compacted keys >= a sampled threshold bound): uncached rows
    n_cand = CAND if use_cand else 1
    SIGN, ZERO, ABS = T.uint32(0x80000000), T.uint32(0), T.uint32(0x7FFFFFFF)
    INF_BITS, KEY_MAX = T.uint32(0x7F800000), T.uint32(0xFFFFFFFF)
    NO_BIN = T.uint32(0xFFFFFFFF)  # lane that adds nothing to the histogram

    @T.prim_func
    def kernel(
        scores: T.Tensor((total,), in_dtype),  # [b, n] rows at stride ld, flattened
        end: T.Tensor((nb_end,), "int32"),  # [b] (or [1] dummy when has_end == 0)
        offset: T.Tensor((nb_off,), off_dtype),  # [b] (or [1] dummy)
        cand: T.Tensor((b, nc), "int32"),  # [b, c] candidate blocks (slots mode) or [b, 1] dummy
        table: T.Tensor((b, mb), "int32"),  # [b, max_blocks] block table (slots mode) or dummy
        values: T.Tensor((nb_val, kv), in_dtype),  # [b, k] (or [1, 1] dummy)
        indices: T.Tensor((b, k), idx_dtype),  # [b, k]
        n: T.int32,
        ld: T.int64,
        has_end: T.int32,
    ):
        with T.Kernel(b, threads=THREADS) as row:
            tx = T.get_thread_binding()
            lane = tx % 32
            warp = tx // 32
            s_hist = T.alloc_shared([BINS], "int32")
            s_scan = T.alloc_shared([2, UNROLL, WARPS], "int32")
            s_sel = T.alloc_shared([4], "int32")
            s_mm = T.alloc_shared([2, WARPS], "uint32")  # per-warp min / max of the matching keys
            s_keys = T.alloc_shared([cache], "uint32")  # whole-row key cache (cache_cap > 0)
            s_ck = T.alloc_shared([n_cand], "uint32")  # candidate keys, ascending index (use_cand)
            s_ci = T.alloc_shared([n_cand], "int32")  # their row indices
            kb = T.alloc_local([UNROLL], "uint32")  # keys of this thread's UNROLL lanes of a tile
            cl = T.alloc_local([UNROLL], "int32")  # packed take/tie flag per lane
            inl = T.alloc_local([UNROLL], "int32")  # packed counts of lower lanes in the warp

            e = T.alloc_var("int32")
            kk = T.alloc_var("int32")  # lanes still to find among the keys in [lo, hi]
            done = T.alloc_var("int32")
            take_all = T.alloc_var("int32")
            src = T.alloc_var("int32")  # where keys come from: 0 global row, 1 row cache, 2 candidates
            ne = T.alloc_var("int32")  # number of source entries
            cnt = T.alloc_var("int32")
            lo = T.alloc_var("uint32")  # the threshold key lies in [lo, hi]; keys above hi are taken
            lo_bin = T.alloc_var("uint32")
            hi_bin = T.alloc_var("uint64")
            sh = T.alloc_var("int32")
            hi = T.alloc_var("uint32")
            bv = T.alloc_var("uint32")
            kmin = T.alloc_var("uint32")
            kmax = T.alloc_var("uint32")
            peers = T.alloc_var("uint32")
            lt = T.alloc_var("uint32")
            dm = T.alloc_var("uint32")
            tm = T.alloc_var("uint32")
            c = T.alloc_var("int32")
            incl = T.alloc_var("int32")
            tmp = T.alloc_var("int32")
            wpre = T.alloc_var("int32")
            wtot = T.alloc_var("int32")
            h_hi = T.alloc_var("int32")
            run_def = T.alloc_var("int32")
            run_tie = T.alloc_var("int32")
            d_before = T.alloc_var("int32")
            t_before = T.alloc_var("int32")
            pos = T.alloc_var("int32")
            oi = T.alloc_var("int32")
            spec = T.alloc_var("int32")  # 1 while pass 0 also compacts the keys >= lo_est
            spec_n = T.alloc_var("int32")  # exact count of keys >= lo_est seen so far
            lo_est = T.alloc_var("uint32")
            kt = T.alloc_var("int32")

            base = T.Cast("int64", row) * ld
            lt = (T.uint32(1) << T.Cast("uint32", lane)) - T.uint32(1)  # lanes below mine
            e = n
            if has_end != 0:
                e = T.max(T.min(end[row], n), 0)  # clamp: a bad end never reads outside the row
            take_all = T.if_then_else(e <= k, 1, 0)
            done = take_all
            kk = k
            lo = T.uint32(0)
            hi = KEY_MAX
            src = 0
            ne = e

            # fills for the lanes beyond the valid count
            fills(values, indices, row, tx, k, e)

            spec = 0
            spec_n = 0
            lo_est = ZERO
            if use_cand:
                # Long rows: guess a lower bound lo_est of the threshold from a sample (8 chunks of 1024
                # entries spread over the row), so that pass 0 can also compact the keys >= lo_est. The
                # guess is verified exactly at the end of pass 0 (k <= count <= CAND), else unused.
                if T.And(done == 0, e > 2 * TILE):
                    for u in T.unroll(UNROLL):
                        kb[u] = _f32_bits(scores[base + u * (e // UNROLL) + tx])
                    for u in T.unroll(UNROLL):
                        kb[u] = T.if_then_else(kb[u] == SIGN, ZERO, kb[u])
                        kb[u] = T.if_then_else(
                            (kb[u] & ABS) > INF_BITS, KEY_MAX,
                            T.if_then_else(kb[u] >= SIGN, ~kb[u], kb[u] | SIGN))
                    kmin = KEY_MAX
                    kmax = ZERO
                    for u in T.unroll(UNROLL):
                        kmin = T.min(kmin, kb[u])
                        kmax = T.max(kmax, kb[u])
                    for o in (16, 8, 4, 2, 1):
                        kmin = T.min(kmin, T.shfl_xor(kmin, o))
                        kmax = T.max(kmax, T.shfl_xor(kmax, o))
                    if lane == 0:
                        s_mm[0, warp] = kmin
                        s_mm[1, warp] = kmax
                    for q in T.serial(BINS // THREADS):
                        s_hist[q * THREADS + tx] = 0
                    T.sync_threads()
                    kmin = s_mm[0, lane]
                    kmax = s_mm[1, lane]
                    for o in (16, 8, 4, 2, 1):
                        kmin = T.min(kmin, T.shfl_xor(kmin, o))
                        kmax = T.max(kmax, T.shfl_xor(kmax, o))
                    lo_est = kmin
                    if kmin != kmax:
                        sh = T.max(0, 21 - T.Cast("int32", T.clz(kmax - kmin)))
                        for u in T.unroll(UNROLL):
                            bv = (kb[u] - kmin) >> T.Cast("uint32", sh)
                            peers = T.match_any_sync(bv)
                            if (peers & lt) == ZERO:
                                T.atomic_add(s_hist[T.Cast("int32", bv)],
                                             T.Cast("int32", T.popcount(peers)))
                        T.sync_threads()
                        # bin of the kt-th largest sample: kt ~ 1.25x the expected winners in a sample
                        kt = T.min(TILE, (k * TILE) // e + (k * TILE) // e // 4 + 64)
                        h_hi = s_hist[BINS - 1 - 2 * tx]
                        c = h_hi + s_hist[BINS - 2 - 2 * tx]
                        incl = c
                        for o in (1, 2, 4, 8, 16):
                            tmp = T.shfl_up(incl, o)
                            incl = incl + T.if_then_else(lane >= o, tmp, 0)
                        if lane == 31:
                            s_scan[0, 0, warp] = incl
                        T.sync_threads()
                        tmp = T.if_then_else(lane < warp, s_scan[0, 0, lane], 0)
                        for o in (16, 8, 4, 2, 1):
                            tmp = tmp + T.shfl_xor(tmp, o)
                        wpre = tmp + incl - c
                        if wpre < kt and kt <= wpre + h_hi:
                            s_sel[0] = BINS - 1 - 2 * tx
                        if wpre + h_hi < kt and kt <= wpre + c:
                            s_sel[0] = BINS - 2 - 2 * tx
                        T.sync_threads()
                        lo_est = kmin + (T.Cast("uint32", s_sel[0]) << T.Cast("uint32", sh))
                    spec = 1
                    T.sync_threads()  # s_hist / s_mm / s_scan / s_sel are reused by pass 0

            for p in range(PASSES):
                if done == 0:
                    # bins of 2^sh keys over [lo, hi]: at most BINS of them (hi > lo while not done)
                    sh = T.max(0, 21 - T.Cast("int32", T.clz(hi - lo)))
                    for q in T.serial(BINS // THREADS):
                        s_hist[q * THREADS + tx] = 0
                    kmin = KEY_MAX
                    kmax = ZERO
                    T.sync_threads()
                    for it in T.serial(T.ceildiv(ne, TILE)):
                        # all UNROLL loads first (memory-level parallelism), then the keys
                        for u in T.unroll(UNROLL):
                            i = _lin(it, u, tx)
                            if p > 0 and cache_cap > 0 and src == 1:
                                kb[u] = T.if_then_else(i < ne, s_keys[i], ZERO)
                            elif p > 0 and use_cand and src == 2:
                                kb[u] = T.if_then_else(i < ne, s_ck[i], ZERO)
                            else:
                                kb[u] = T.if_then_else(
                                    i < ne, _f32_bits(scores[base + i]),
                                    ZERO)
                        if src == 0:
                            for u in T.unroll(UNROLL):
                                # order-preserving key: -0.0 -> +0.0, NaN -> max, sign flip
                                kb[u] = T.if_then_else(kb[u] == SIGN, ZERO, kb[u])
                                kb[u] = T.if_then_else(
                                    (kb[u] & ABS) > INF_BITS, KEY_MAX,
                                    T.if_then_else(kb[u] >= SIGN, ~kb[u], kb[u] | SIGN))
                                if p == 0 and cache_cap > 0:
                                    i = _lin(it, u, tx)
                                    if T.And(e <= cache_cap, i < ne):
                                        s_keys[i] = kb[u]
                        for u in T.unroll(UNROLL):
                            i = _lin(it, u, tx)
                            bv = NO_BIN
                            if i < ne:
                                if T.And(kb[u] >= lo, kb[u] <= hi):
                                    bv = (kb[u] - lo) >> T.Cast("uint32", sh)
                                    kmin = T.min(kmin, kb[u])
                                    kmax = T.max(kmax, kb[u])
                            # warp-aggregated add: concentrated scores hit one bin from every lane
                            peers = T.match_any_sync(bv)
                            if T.And(bv != NO_BIN, (peers & lt) == ZERO):
                                T.atomic_add(s_hist[T.Cast("int32", bv)],
                                             T.Cast("int32", T.popcount(peers)))
                        if use_cand:
                            if spec == 1:
                                # pass 0 of a long row: ordered compaction of the keys >= lo_est
                                for u in T.unroll(UNROLL):
                                    i = _lin(it, u, tx)
                                    cl[u] = T.if_then_else(T.And(i < ne, kb[u] >= lo_est), 1, 0)
                                    dm = T.Cast("uint32", T.ballot_sync(cl[u] == 1))
                                    inl[u] = T.Cast("int32", T.popcount(dm & lt))
                                    if lane == 0:
                                        s_scan[it % 2, u, warp] = T.Cast("int32", T.popcount(dm))
                                T.sync_threads()
                                for u in T.unroll(UNROLL):
                                    i = _lin(it, u, tx)
                                    wtot = s_scan[it % 2, u, lane]
                                    tmp = T.if_then_else(lane < warp, wtot, 0)
                                    for o in (16, 8, 4, 2, 1):
                                        tmp = tmp + T.shfl_xor(tmp, o)
                                        wtot = wtot + T.shfl_xor(wtot, o)
                                    pos = spec_n + tmp + inl[u]
                                    if T.And(cl[u] == 1, pos < CAND):
                                        s_ck[pos] = kb[u]
                                        s_ci[pos] = i
                                    spec_n = spec_n + wtot
                    T.sync_threads()
                    # thread t owns bins BINS-1-2t (higher) and BINS-2-2t; scan in descending bin order
                    h_hi = s_hist[BINS - 1 - 2 * tx]
                    c = h_hi + s_hist[BINS - 2 - 2 * tx]
                    incl = c
                    for o in (1, 2, 4, 8, 16):  # warp inclusive scan
                        tmp = T.shfl_up(incl, o)
                        incl = incl + T.if_then_else(lane >= o, tmp, 0)
                    if lane == 31:
                        s_scan[0, 0, warp] = incl
                    for o in (16, 8, 4, 2, 1):
                        kmin = T.min(kmin, T.shfl_xor(kmin, o))
                        kmax = T.max(kmax, T.shfl_xor(kmax, o))
                    if lane == 0:
                        s_mm[0, warp] = kmin
                        s_mm[1, warp] = kmax
                    T.sync_threads()
                    tmp = T.if_then_else(lane < warp, s_scan[0, 0, lane], 0)
                    kmin = s_mm[0, lane]
                    kmax = s_mm[1, lane]
                    for o in (16, 8, 4, 2, 1):
                        tmp = tmp + T.shfl_xor(tmp, o)
                        kmin = T.min(kmin, T.shfl_xor(kmin, o))
                        kmax = T.max(kmax, T.shfl_xor(kmax, o))
                    wpre = tmp + incl - c  # keys in bins above my two bins
                    if wpre < kk and kk <= wpre + h_hi:
                        s_sel[0] = BINS - 1 - 2 * tx
                        s_sel[1] = kk - wpre
                        s_sel[2] = h_hi
                    if wpre + h_hi < kk and kk <= wpre + c:
                        s_sel[0] = BINS - 2 - 2 * tx
                        s_sel[1] = kk - wpre - h_hi
                        s_sel[2] = c - h_hi
                    T.sync_threads()
                    # the threshold is in the chosen bin and is one of the keys that were in [lo, hi], so
                    # also within [kmin, kmax] of those: concentrated scores shrink the range at once,
                    # all-equal ties give the exact key after one pass
                    lo_bin = lo + (T.Cast("uint32", s_sel[0]) << T.Cast("uint32", sh))
                    hi_bin = T.Cast("uint64", lo_bin) + ((T.uint64(1) << T.Cast("uint64", sh)) - T.uint64(1))
                    hi = T.Cast("uint32", T.min(T.Cast("uint64", hi), hi_bin))  # 64-bit: no wrap-around
                    lo = T.max(lo_bin, kmin)
                    hi = T.min(hi, kmax)
                    kk = s_sel[1]
                    cnt = s_sel[2]
                    if T.Or(cnt == kk, lo == hi):
                        done = 1  # the threshold bin is taken whole, or the threshold key is exact
                    T.sync_threads()  # s_hist / s_sel / s_scan are rewritten next
                    if p == 0 and cache_cap > 0:
                        if e <= cache_cap:
                            src = 1  # later passes read the row's keys from shared memory
                    if use_cand:
                        if spec == 1:
                            # at least k keys >= lo_est: the k-th largest (the threshold) is >= lo_est, so
                            # every winner is in the compacted list (also when `done` already)
                            if T.And(spec_n >= k, spec_n <= CAND):
                                src = 2
                                ne = spec_n
                            spec = 0
                    if p < 2 and cache_cap == 0:
                        # keys >= lo: (k - kk) above hi + cnt in [lo, hi]. When they fit,
                        # compact them once, in index order, so later passes never touch the row again.
                        if T.And(T.And(done == 0, src == 0), k - kk + cnt <= CAND):
                            run_def = 0
                            for it in T.serial(T.ceildiv(ne, TILE)):
                                for u in T.unroll(UNROLL):
                                    i = _lin(it, u, tx)
                                    kb[u] = T.if_then_else(
                                        i < ne,
                                        _f32_bits(scores[base + i]),
                                        ZERO)
                                for u in T.unroll(UNROLL):
                                    kb[u] = T.if_then_else(kb[u] == SIGN, ZERO, kb[u])
                                    kb[u] = T.if_then_else(
                                        (kb[u] & ABS) > INF_BITS, KEY_MAX,
                                        T.if_then_else(kb[u] >= SIGN, ~kb[u], kb[u] | SIGN))
                                for u in T.unroll(UNROLL):
                                    i = _lin(it, u, tx)
                                    cl[u] = T.if_then_else(T.And(i < ne, kb[u] >= lo), 1, 0)
                                    dm = T.Cast("uint32", T.ballot_sync(cl[u] == 1))
                                    inl[u] = T.Cast("int32", T.popcount(dm & lt))
                                    if lane == 0:
                                        s_scan[it % 2, u, warp] = T.Cast("int32", T.popcount(dm))
                                T.sync_threads()
                                for u in T.unroll(UNROLL):
                                    i = _lin(it, u, tx)
                                    wtot = s_scan[it % 2, u, lane]
                                    tmp = T.if_then_else(lane < warp, wtot, 0)
                                    for o in (16, 8, 4, 2, 1):
                                        tmp = tmp + T.shfl_xor(tmp, o)
                                        wtot = wtot + T.shfl_xor(wtot, o)
                                    pos = run_def + tmp + inl[u]
                                    if T.And(cl[u] == 1, pos < CAND):
                                        s_ck[pos] = kb[u]
                                        s_ci[pos] = i
                                    run_def = run_def + wtot
                            T.sync_threads()
                            src = 2
                            ne = T.min(run_def, CAND)

            # ordered pass: take keys above hi, and the first kk keys in [lo, hi]
            run_def = 0
            run_tie = 0
            for it in T.serial(T.ceildiv(ne, TILE)):
                for u in T.unroll(UNROLL):
                    i = _lin(it, u, tx)
                    if cache_cap > 0 and src == 1:
                        kb[u] = T.if_then_else(i < ne, s_keys[i], ZERO)
                    elif use_cand and src == 2:
                        kb[u] = T.if_then_else(i < ne, s_ck[i], ZERO)
                    else:
                        kb[u] = T.if_then_else(
                            i < ne, _f32_bits(scores[base + i]), ZERO)
                if src == 0:
                    for u in T.unroll(UNROLL):
                        kb[u] = T.if_then_else(kb[u] == SIGN, ZERO, kb[u])
                        kb[u] = T.if_then_else(
                            (kb[u] & ABS) > INF_BITS, KEY_MAX,
                            T.if_then_else(kb[u] >= SIGN, ~kb[u], kb[u] | SIGN))
                for u in T.unroll(UNROLL):
                    i = _lin(it, u, tx)
                    cl[u] = 0
                    if i < ne:
                        if take_all != 0:
                            cl[u] = 1
                        elif kb[u] > hi:
                            cl[u] = 1
                        elif kb[u] >= lo:
                            cl[u] = TIE
                    dm = T.Cast("uint32", T.ballot_sync(cl[u] == 1))
                    tm = T.Cast("uint32", T.ballot_sync(cl[u] == TIE))
                    inl[u] = (T.Cast("int32", T.popcount(dm & lt))
                              + T.Cast("int32", T.popcount(tm & lt)) * TIE)
                    if lane == 0:
                        # one barrier per tile: s_scan is double-buffered across tiles
                        s_scan[it % 2, u, warp] = (T.Cast("int32", T.popcount(dm))
                                                   + T.Cast("int32", T.popcount(tm)) * TIE)
                T.sync_threads()
                for u in T.unroll(UNROLL):
                    i = _lin(it, u, tx)
                    wtot = s_scan[it % 2, u, lane]
                    tmp = T.if_then_else(lane < warp, wtot, 0)
                    for o in (16, 8, 4, 2, 1):
                        tmp = tmp + T.shfl_xor(tmp, o)
                        wtot = wtot + T.shfl_xor(wtot, o)
                    wpre = tmp + inl[u]  # packed counts of all lanes before mine in this sub-chunk
                    d_before = run_def + (wpre & 0xFFFF)
                    t_before = run_tie + (wpre >> 16)
                    if T.Or(cl[u] == 1, T.And(cl[u] == TIE, t_before < kk)):
                        pos = d_before + T.min(t_before, kk)
                        if pos < k:
                            oi = i  # row index of this entry (a var: reassigned below)
                            if use_cand:
                                if src == 2:
                                    oi = s_ci[i]
                            emit(scores, offset, cand, table, values, indices, row, base, pos, oi)
                    run_def = run_def + (wtot & 0xFFFF)
                    run_tie = run_tie + (wtot >> 16)

    return kernel


# ----------------------------------------------------------------------------------------------------
# Variant "v3": its own factory (safe-memory legalization off: every global index is bounded by the clamped
# `end` or by k), same contract and key as v1. Cheaper on-chip work than v1: every lane adds 1 to its bin,
# a shared add the hardware aggregates per address (no match_any_sync, no vote; see hist_add); a warp owns
# UNROLL * 32 consecutive entries of a tile (v3's `lin`; still one coalesced 128 B load per instruction),
# so an ordered scan needs one count per warp and one cross-warp scan per tile instead of one per strip; row
# reads are software-pipelined (tile it + 1 in flight while tile it is processed); the lane class rides in
# the rank register (no spills);
# the sample is 8 (2 in the 32768 tier) runs of 32 per warp spread evenly over the row (sorted or otherwise
# structured rows also get a useful bound). What changes in the algorithm (see the module docstring):
# unordered candidate compaction (one shared counter, one add per warp and tile, no block scans or barriers
# per tile), [lo, hi] taken straight from the candidates' [min, max] (all-equal / few-distinct rows finish
# without a radix pass), a final rank by index over the short list through index bitmaps, an early exit of
# the ordered pass over the row, and no row cache. Rows of one tile (e <= UNROLL x threads) keep their keys
# in registers (src 3): radix passes and the ordered pass run on them, no list or bitmaps. Radix passes use
# 12-bit digits (V3_NB bins), so a list spanning up to 2^24 keys takes two passes (on one CTA a row the first
# comes pre-binned from the compaction, see V3_PREBIN_SPAN); the compaction read has
# no bounds checks on full tiles; the key is branch-free; warp reductions (min / max / sums of packed
# counts) are single REDUX instructions.
# Tried on the H200 and dropped: an L2 prefetch (prefetch.global.L2, one line per lane) of the row P tiles
# ahead of the compaction read, the first P tiles before the sample; randn, us for P = 0 / 2 / 4 / 8:
# b128n131072 46.0 / 49.0 / 49.5 / 53.5, b64n32768 22.7 / 23.6 / 24.1 / 24.1, b1n65536 26.9 / 27.9 /
# 28.1 / 28.2, b64n8192 (one tile, no compaction) 19.6 / 19.9 (concentrated scores: the same picture).
# Its bulk form (cp.async.bulk.prefetch.L2, one instruction per warp and tile, P = 4; session 21, on the
# per-lane mask compaction): b128n131072 36.4 -> 41.1, b64n32768 16.5 -> 18.3, b1n65536 17.1 -> 17.6.
# Also dropped (session 21): FP32 rows of the 32768 tier copied whole into shared memory (128 KiB, 4-byte
# cp.async of each thread's own entries, issued before the sample, one cp.async.wait_all before the
# compaction, which then read shared memory): GPU-exact (test_topk 300 passed) but b64n32768 16.5 -> 18.8 us
# (equal 18.7 -> 20.9): the sample's loads queue behind the row's copies, and the sample gates the compaction.
# Also dropped (session 23): the compaction's first tile alone prefetched into the L2 (prefetch.global.L2, a
# line per thread) right after the sample's loads, so the compaction would start on L2 hits: GPU-exact, but
# b64n32768 16.16 -> 16.35 us, b128n131072 32.38 -> 32.42 (randn; few 16.80 -> 16.96).
# Also dropped: reading the compaction's first tile into registers together with the sample (so its
# latency passes during the sample's histogram): GPU-tested, but slower (us, randn: b128n131072 42.2 ->
# 43.1, b64n32768 21.2 -> 21.9, b1n65536 24.1 -> 24.8, v1 peers unchanged).
# Also dropped (session 24): the whole row of the 32768 tier copied into shared memory by the TMA
# (cp.async.bulk in 16 KiB chunks, one mbarrier, thread 0 issuing it as soon as the sample's loads had
# returned, so the copy would overlap the sample's histogram and selection), every later read of the row
# from there: exact (CPU emulator, mid and adv sets), but 64 x 32768 16.21 -> 17.22 us (few 16.70 -> 17.41,
# equal 19.20 -> 21.47, sorted 15.33 -> 16.05; tools/ab_topk.py). tools/probe_row_read.py says why: after the
# harness's L2 flush, 64 CTAs read their 128 KiB rows in 3.8 us above an empty launch with a tile of 8 loads a
# thread in flight, the same with 32 in flight, 4.4 us by 16-byte cp.async and 4.6 us by the TMA; the read is
# bound by the memory system (the flush's dirty lines are written back as it goes), not by the loads a thread
# keeps in flight, and the TMA's copy, waited for whole, also stops the compaction's work overlapping it.
# Bitmap words per class (taken / tie): ranks are computed over windows of 131072 indices (32 KiB of
# bitmaps, word prefixes in s_hist, which has as many entries), so rows up to 131072 take one window.
V3_BMW = 4096
# Sample runs of 32 per warp for rows of the 32768 tier (2048 entries at 1024 threads, 1/16 to 1/4 of the
# row); uncached rows keep UNROLL (8192 entries). H200, 64 x 32768, k = 2048, us (randn / few / equal), 2 ->
# 1 / 4 runs: 16.06 / 16.67 / 19.17 -> 16.58 / 16.45 / 19.01 and 16.22 / 16.99 / 19.17 (session 24).
V3_SAMPLE_SHORT = 2
# The sampled bound thr is the lower edge of the V3_NB-bin histogram bin of the sample's kt-th largest key,
# kt = mu + V3_SAMPLE_SD * sqrt(mu) + V3_SAMPLE_PAD with mu = k * sample / row the expected sample count
# above the threshold (binomial sd ~ sqrt(mu)): the row's keys >= thr number fewer than k (then the radix
# passes read the row: slower, still exact) with probability ~3e-6 on i.i.d. scores. Fewer candidates mean
# fewer compaction stores and a shorter list: randn 128 x 131072, k = 2048, goes from ~4.8k candidates
# (the former kt = 1.25 mu + 64, over 2048 bins: ~8 sd) to ~3.4k (a numpy model of the sample and its bins).
V3_SAMPLE_SD = 4.5  # 3.5 measured the same (64 x 32768 16.06 us; 128 x 131072 32.37 -> 32.27; session 24)
V3_SAMPLE_PAD = 8
# The bins span the sample's [min, max]: 2^20 keys each on randn (whose sample spans both signs), a quarter
# of a unit at |x| ~ 2.5, so a bin's lower edge can sit well below the kt-th sample key, and a long row
# multiplies that slack by row / sample. At 1M entries and k = 2048 the keys >= the edge overflowed the
# candidate list in about a third of the randn rows, which then fell back to reading the row again (H200,
# tools/sweep_topk.py: 64 x 1M 644 us, against 119 us at k = 512). So when the sample keys >= the edge,
# scaled to the row, could pass half the capacity, the sample keys of that one bin are histogrammed again
# over their own [min, max] (V3_NB sub-bins), and thr becomes the lower edge of the sub-bin of the same kt-th
# key (64 x 1M, k = 2048: 644 -> 121 us). The sample and so the choice are the same in every CTA of a split
# row.
V3_ROUNDS = PASSES + 2  # first compaction, <= 3 radix passes, at most one fallback compaction
V3_BITS = 12  # radix digit of v3's passes (v1: RADIX_BITS); 2^32 -> 2^20 -> 2^8 -> 1 keys
V3_NB = 1 << V3_BITS
assert V3_BMW <= V3_NB, "the rank's word prefixes live in s_hist"
# The pre-binned list: on one CTA a row, the compaction's pass that keys its list also histograms it, over
# V3_NB bins from thr spanning V3_PREBIN_SPAN times the sample's keys above thr (the last bin holds every key
# beyond); the first radix pass over the list then only selects the bin (randn 128 x 131072, k = 2048: ~5
# keys a bin, then the direct rank). Without it that pass cleared the histogram, read the list again and
# histogrammed it over the list's [min, max], two barriers more.
V3_PREBIN_SPAN = 2
# A threshold bin of at most this many keys is ranked directly (every key against every other, one warp
# per 32 keys) instead of by more radix passes: ~0.3 us against ~2 us for a pass over a one-tile row.
V3_RES = 256
V3_RES_STEP = 4  # keys compared per step of the rank loop (the gather pads to a multiple with key 0)


# Rows of more than one candidate capacity may be split over a cluster of S CTAs ("split", a static argument
# of topk_kernel_v3): every CTA draws the same sample (so all get the same bound thr without talking) and
# compacts its share of the row's tiles into its own list (the one-CTA loop); the others then reserve room
# at the top of the lead CTA's list (one remote atomic add) and copy their entries there (DSMEM), one
# cluster barrier, and the lead moves that block after its own entries and goes on alone as with one CTA.
# The row's one read is spread over S SMs; the wrapper splits only when that pays (see _v3_split). Tried
# and dropped: compacting straight into the lead's list (a remote counter add per warp and tile, remote
# stores) and a copy at exact offsets after exchanging the counts (two cluster barriers); both slower
# (bench_results/h200.txt). The prelude's helpers: a CTA's shared address in CTA `rank` of the cluster
# (mapa), a 32-bit store / atomic add there, and the cluster barrier's halves (every thread of every CTA
# of the cluster arrives).
CLUSTER_PRELUDE = """
__device__ __forceinline__ unsigned tl_topk_cluster_addr(const void* p, unsigned rank) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p), r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  return r;
}
__device__ __forceinline__ unsigned tl_topk_st_cluster(void* p, unsigned rank, unsigned v) {
  asm volatile("st.shared::cluster.u32 [%0], %1;" :: "r"(tl_topk_cluster_addr(p, rank)), "r"(v) : "memory");
  return 0u;
}
__device__ __forceinline__ unsigned tl_topk_atomic_add_cluster(void* p, unsigned rank, unsigned v) {
  unsigned old;
  asm volatile("atom.shared::cluster.add.u32 %0, [%1], %2;"
               : "=r"(old) : "r"(tl_topk_cluster_addr(p, rank)), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ unsigned tl_topk_cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  return 0u;
}
__device__ __forceinline__ unsigned tl_topk_cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
  return 0u;
}
"""
# Streaming reads (`stream`, a static argument of topk_kernel_v3; the wrapper sets it for unsplit rows of
# the uncached tier when the launch reads at least STREAM_L2_FRACTION of the L2, see _v3_launch): the
# compaction loads every tile but its first with ld.global.nc.L1::no_allocate.L2::cache_hint under an L2
# evict-first policy (createpolicy), so the row's lines, read once, are the next victims in their L2 sets
# instead of the lines already there. The first tile keeps the default policy (all-equal rows re-read it in
# the ordered pass), and so does the sample (the compaction reads its lines again). The benchmark's L2
# flush (a 256 MiB zero_) leaves the L2 full of dirty lines, which the default policy evicts: write-backs
# that compete with the row's read (a serving step leaves other kernels' outputs there the same way).
# Found by timing 128 x 131072 after the flush with and without one launch on other data in between (which
# pays those write-backs): 36.3 -> 31.7 us; at 64 x 8192 (2 MiB) 13.7 -> 13.4.
# H200, us, default -> streaming (randn / equal rows): 128 x 131072 FP32 (64 MiB) 36.3 -> 33.4 / 38.9 ->
# 39.0, BF16 (32 MiB) 35.3 -> 34.1 / 42.7 -> 41.9; 64 x 131072 FP32 (32 MiB) 28.9 -> 28.5 / 37.1 -> 37.5;
# 256 x 65536 (64 MiB) 45.7 -> 43.8 / 48.7 -> 48.9; but 48 x 131072 (24 MiB) 27.5 -> 28.2, and the 32768
# tier loses at any size: 64 x 32768 (8 MiB) 16.6 -> 16.9, 1024 x 32768 (128 MiB) 110.3 -> 110.6 / 124.9 ->
# 126.6 (split rows, 1 x 65536: 17.1 -> 17.5-17.9). Variants on 128 x 131072 (randn / equal): ld.global.cs
# on every row read 33.7 / 40.5, the policy on every row read 34.0 / 40.4 (and with the 256-byte L2
# prefetch 34.4 / 41.2), on every compaction tile 33.4 / 39.7.
STREAM_PRELUDE = """
template <typename Tp> __device__ __forceinline__ unsigned tl_topk_ld_stream(const Tp* p) {
  unsigned long long pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  if constexpr (sizeof(Tp) == 4) {
    unsigned r;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.b32 %0, [%1], %2;" : "=r"(r) : "l"(p), "l"(pol));
    return r;
  } else {
    unsigned short r;
    asm("ld.global.nc.L1::no_allocate.L2::cache_hint.b16 %0, [%1], %2;" : "=h"(r) : "l"(p), "l"(pol));
    return ((unsigned)r) << 16;
  }
}
"""
STREAM_L2_FRACTION = 0.5
MAX_SPLIT = 8  # CTAs per split row at most (the wrapper's choice: see _v3_split)


def _v3_cand_cap(cache_cap: int) -> int:
    """Candidate slots of v3 (rows up to this many entries are compacted whole, without a sample)."""
    return SMALL_CACHE if cache_cap == SMALL_CACHE else CAND


def _key(bits):
    """Order-preserving uint32 key of fp32 bits (-0.0 -> +0.0, every NaN -> 0xFFFFFFFF): flip all bits of a
    negative, the sign bit of a positive (xor with the sign-extended sign | MSB). Branch-free without
    selects (nvcc turned the selects of the two special cases into a branch around every key): -0.0's bits
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
    """incl[0] = the warp's inclusive prefix sum of the int32 c (v3 and the tile kernel)."""
    tmp = T.alloc_var("int32")
    incl[0] = c
    for o in (1, 2, 4, 8, 16):
        tmp = T.shfl_up(incl[0], o)
        incl[0] = incl[0] + T.if_then_else(lane >= o, tmp, 0)


# Packed counts of an ordered pass's step (v3 and the warp kernel): keys taken for sure in the low 16 bits,
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


@tilelang.jit(pass_configs={**PASS_CONFIGS, tilelang.PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True})
def topk_kernel_v3(in_dtype: str = "float32", idx_dtype: str = "int32", off_dtype: str = "int32",
                   cache_cap: int = 0, with_values: bool = True, with_offset: bool = False,
                   idx_fill: int = -1, val_fill: float = float("-inf"), mode: str = "topk",
                   cand_bs: int = 0, block_c: int = 1, split: int = 1, threads: int = THREADS,
                   stream: bool = False):
    """Variant v3 of `topk_kernel` (same arguments but the variant, plus `split`: CTAs per row, a cluster
    when > 1, see CLUSTER_PRELUDE; `threads` per CTA: fewer for many short rows, see _v3_threads; and
    `stream`: the compaction reads the row with the L2 evict-first policy, see STREAM_PRELUDE)."""
    total = T.dynamic("total", "int64")  # flat scores storage: (b - 1) * ld + n elements
    b, k, nb_end, nb_off, nb_val, kv = T.dynamic("b, k, nb_end, nb_off, nb_val, kv")
    nc, mb = T.dynamic("nc, mb")
    NT = threads  # threads per CTA
    NW = NT // 32  # warps
    TL = NT * UNROLL  # row entries per tile
    BPT = V3_NB // NT  # histogram bins per thread in the clear and the scan
    cap = _v3_cand_cap(cache_cap)  # candidate slots
    su = UNROLL if cache_cap == 0 else V3_SAMPLE_SHORT  # sample runs of 32 entries per thread
    ssz = NT * su  # sample size
    bmw = V3_BMW if cache_cap == 0 else cache_cap // 32  # bitmap words per class: the row tiers need one
    win = bmw * 32  # indices per rank window
    wpt = max(1, bmw // NT)  # bitmap words per thread in the rank scan
    ZERO, KEY_MAX, NO_BIN = T.uint32(0), T.uint32(0xFFFFFFFF), T.uint32(0xFFFFFFFF)
    NEG_INF_BITS = T.uint32(0xFF800000)
    S = split
    assert S in (1, 2, 4, 8), split
    prelude = (STREAM_PRELUDE if stream else "") + (CLUSTER_PRELUDE if S > 1 else "") or None
    # fewer threads only for one CTA per row (the split's block move holds cap / NT entries per thread);
    # the rank step needs a warp per 32 of its V3_RES keys
    assert NT in (256, 512, 1024) and (S == 1 or NT == THREADS) and NW * 32 >= V3_RES, (threads, split)

    def lin(it, u, tx):
        """The row entry of thread tx for lane group u of tile it: a warp owns UNROLL * 32 consecutive
        entries (one count per warp and one cross-warp scan per tile in the ordered scans)."""
        return it * TL + (tx // 32) * (UNROLL * 32) + u * 32 + tx % 32

    def per_warp(buf, r, lane, fill):
        """buf[r, lane] (a value per warp, buffers sized for 32 warps), `fill` in lanes past the last warp."""
        return buf[r, lane] if NW == 32 else T.if_then_else(lane < NW, buf[r, lane], fill)

    def lead_only(cond, rank):
        """cond, and (split rows) this CTA is the row's lead (cluster rank 0), which alone writes outputs."""
        return cond if S == 1 else T.And(cond, rank == 0)

    def st_lead(ref, v):
        """Store the uint32 v to the lead CTA's copy of the shared element ref (DSMEM)."""
        return T.call_extern("uint32", "tl_topk_st_cluster", T.address_of(ref), 0, v)

    def cluster(half):
        """One half of the cluster barrier ("arrive" or "wait"), by every thread of every CTA."""
        return T.call_extern("uint32", f"tl_topk_cluster_{half}")

    def raw(scores, i, streaming=False):
        """The FP32 bits of scores[i]; `streaming` (the compaction's reads past its first tile, in a
        `stream` kernel) loads it with the L2 evict-first policy."""
        if stream and streaming:
            return T.call_extern("uint32", "tl_topk_ld_stream", T.address_of(scores[i]))
        return _f32_bits(scores[i])

    fills, emit = _lane_macros(in_dtype, idx_dtype, with_values, with_offset, idx_fill, val_fill, mode,
                               cand_bs, block_c, nc, mb, NT)

    @T.macro
    def load_tile(scores, kn, base, it, lim, tx, streaming=False):
        """kn = the raw bits of tile `it` of the row (0 at and past `lim`): the loads of a pipelined read."""
        for u in T.unroll(UNROLL):
            kn[u] = T.if_then_else(lin(it, u, tx) < lim, raw(scores, base + lin(it, u, tx), streaming), ZERO)

    @T.macro
    def next_keys(scores, kb, kn, base, it, lim, tx):
        """Pipelined read of the row: kb = the keys of tile `it` (its bits, loaded one step earlier, into
        kn; key 0 at and past `lim`), and the loads of tile it + 1 go into kn."""
        for u in T.unroll(UNROLL):
            kb[u] = kn[u]
        load_tile(scores, kn, base, it + 1, lim, tx)
        for u in T.unroll(UNROLL):
            kb[u] = T.if_then_else(lin(it, u, tx) < lim, _key(kb[u]), ZERO)

    @T.macro
    def hist_add(bv, s_hist):
        """Histogram add of bin bv per lane, NO_BIN: none. A plain predicated add: ptxas emits the shared
        add of 1 as ATOMS.POPC.INC, which adds each address's lane count in one go, so lanes on one bin
        (concentrated or few-valued keys) need no vote. (Before: a shuffle and a vote per key, one add of
        32 when the whole warp hit one bin; each key's add then sat in its own branch region, serialized.
        H200, us, randn, vote -> plain: 64 x 8192, k = 512 13.94 -> 13.76, 64 x 32768 16.24 -> 15.97,
        128 x 131072 32.48 -> 32.02, 1 x 65536 17.09 -> 16.61, 4096 x 8192 310.2 -> 302.0; few / conc /
        sorted / tiny rows gained alike, equal rows unchanged: bench_results/h200.txt, session 26.)"""
        if bv != NO_BIN:
            T.atomic_add(s_hist[T.Cast("int32", bv)], 1)

    @T.macro
    def hist_key(kb, j, mm, lo, hi, sh, s_hist):
        """Radix-pass histogram add of one key kb[j] per lane: bin
        (kb[j] - lo) >> sh when kb[j] is in [lo, hi], and mm = [min, max] of those keys. Key 0 (no entry)
        is below lo. (The key comes as a buffer element: TVM's bound solver fails on a uint32 scalar
        argument inside these conditions.)"""
        bv = T.alloc_var("uint32")
        bv = T.if_then_else(T.And(kb[j] >= lo, kb[j] <= hi), (kb[j] - lo) >> T.Cast("uint32", sh), NO_BIN)
        mm[0] = T.min(mm[0], T.if_then_else(bv != NO_BIN, kb[j], KEY_MAX))
        mm[1] = T.max(mm[1], T.if_then_else(bv != NO_BIN, kb[j], ZERO))
        hist_add(bv, s_hist)

    @T.macro
    def warp_scan(c, incl, s_scan, lane, warp):
        """_warp_incl, and the last lane publishes the warp's total to s_scan[0, warp] (read after a
        barrier)."""
        _warp_incl(c, incl, lane)
        if lane == 31:
            s_scan[0, warp] = incl[0]

    @T.macro
    def publish_min_max(kmin, kmax, s_mm, lane, warp):
        """Block [min, max], first half: the warp's min of kmin and max of kmax go to s_mm[:, warp]
        (gather_min_max reads them after a barrier)."""
        a = T.alloc_var("uint32")
        z = T.alloc_var("uint32")
        a = _warp_min(kmin)
        z = _warp_max(kmax)
        if lane == 0:
            s_mm[0, warp] = a
            s_mm[1, warp] = z

    @T.macro
    def gather_min_max(mm, s_mm, lane):
        """Block [min, max], second half (a barrier after publish_min_max): mm = [min, max] over the warps."""
        mm[0] = _warp_min(per_warp(s_mm, 0, lane, KEY_MAX))
        mm[1] = _warp_max(per_warp(s_mm, 1, lane, ZERO))

    @T.macro
    def min_max_and_clear(kmin, kmax, mm, s_mm, s_hist, tx, lane, warp):
        """mm = block [min of kmin, max of kmax], and the histogram cleared (one barrier for both)."""
        publish_min_max(kmin, kmax, s_mm, lane, warp)
        for q in T.unroll(BPT):
            s_hist[q * NT + tx] = 0
        T.sync_threads()
        gather_min_max(mm, s_mm, lane)

    @T.macro
    def select_bin(rank, s_hist, s_scan, s_sel, tx, lane, warp):
        """After a histogram (a barrier ago): the bin holding the rank-th largest key. Thread t owns bins
        V3_NB-1-BPT*t-j, j < BPT, a block scan runs in descending bin order, and the owner writes
        s_sel = [bin, rank - keys in the bins above it, keys in it] (read after the caller's barrier)."""
        c = T.alloc_var("int32")
        incl = T.alloc_local([1], "int32")
        tmp = T.alloc_var("int32")
        wpre = T.alloc_var("int32")
        h = T.alloc_var("int32")
        c = 0
        for j in T.unroll(BPT):
            c = c + s_hist[V3_NB - 1 - BPT * tx - j]
        warp_scan(c, incl, s_scan, lane, warp)
        T.sync_threads()
        tmp = T.if_then_else(lane < warp, s_scan[0, lane], 0)
        tmp = _warp_sum(tmp)
        wpre = tmp + incl[0] - c  # keys in bins above my bins
        for j in T.unroll(BPT):
            h = s_hist[V3_NB - 1 - BPT * tx - j]
            if wpre < rank and rank <= wpre + h:
                s_sel[0] = V3_NB - 1 - BPT * tx - j
                s_sel[1] = rank - wpre
                s_sel[2] = h
            wpre = wpre + h

    @T.prim_func
    def kernel(
        scores: T.Tensor((total,), in_dtype),  # [b, n] rows at stride ld, flattened
        end: T.Tensor((nb_end,), "int32"),  # [b] (or [1] dummy when has_end == 0)
        offset: T.Tensor((nb_off,), off_dtype),  # [b] (or [1] dummy)
        cand: T.Tensor((b, nc), "int32"),  # [b, c] candidate blocks (slots mode) or [b, 1] dummy
        table: T.Tensor((b, mb), "int32"),  # [b, max_blocks] block table (slots mode) or dummy
        values: T.Tensor((nb_val, kv), in_dtype),  # [b, k] (or [1, 1] dummy)
        indices: T.Tensor((b, k), idx_dtype),  # [b, k]
        n: T.int32,
        ld: T.int64,
        has_end: T.int32,
    ):
        with T.Kernel(b if S == 1 else b * S, threads=NT, prelude=prelude,
                      cluster_dims=S if S > 1 else None) as bx:
            row = bx if S == 1 else bx // S
            rank = 0 if S == 1 else bx % S  # this CTA's rank in the row's cluster
            tx = T.get_thread_binding()
            lane = tx % 32
            warp = tx // 32
            s_hist = T.alloc_shared([V3_NB], "int32")  # radix histogram; in the final rank: word prefixes
            s_scan = T.alloc_shared([2, WARPS], "int32")  # a value per warp (per_warp)
            s_sel = T.alloc_shared([4], "int32")
            s_small = T.alloc_shared([V3_RES], "uint32")  # the <= V3_RES keys of a small threshold bin
            s_mm = T.alloc_shared([2, WARPS], "uint32")  # per-warp min / max
            s_mm0 = T.alloc_shared([2, WARPS], "uint32")  # the one-tile rows' first min / max
            if S > 1:
                s_peer = T.alloc_shared([3, S], "uint32")  # the lead's: the CTAs' [min, max]; [2, 0] a count
            s_cnt = T.alloc_shared([1], "int32")  # candidate counter
            s_ck = T.alloc_shared([cap], "uint32")  # candidate keys (any order)
            s_ci = T.alloc_shared([cap], "int32")  # their row indices
            s_bm = T.alloc_shared([2 * bmw], "uint32")  # index bitmaps of one window: taken, ties
            kb = T.alloc_local([UNROLL], "uint32")
            kn = T.alloc_local([UNROLL], "uint32")  # raw bits of the next tile (loads in flight)
            inl = T.alloc_local([UNROLL], "int32")
            mm = T.alloc_local([2], "uint32")  # [min, max] of a radix pass's keys in range

            e = T.alloc_var("int32")
            kk = T.alloc_var("int32")  # lanes still to find among the keys in [lo, hi]
            done = T.alloc_var("int32")
            take_all = T.alloc_var("int32")
            src = T.alloc_var("int32")  # where keys come from: 0 the row, 2 the candidates, 3 registers
            ne = T.alloc_var("int32")
            cnt = T.alloc_var("int32")
            resolve = T.alloc_var("int32")  # 1: the next round ranks the <= V3_RES keys of [lo, hi] directly
            compact = T.alloc_var("int32")  # 1: compact keys >= thr (sampled bound), 2: >= lo (fallback)
            thr = T.alloc_var("uint32")
            m = T.alloc_var("int32")
            slot = T.alloc_var("int32")
            lo = T.alloc_var("uint32")
            hi = T.alloc_var("uint32")
            lo_bin = T.alloc_var("uint32")
            hi_bin = T.alloc_var("uint64")
            sh = T.alloc_var("int32")
            kmin = T.alloc_var("uint32")
            kmax = T.alloc_var("uint32")
            lt = T.alloc_var("uint32")
            c = T.alloc_var("int32")
            incl = T.alloc_local([1], "int32")  # a warp_scan result
            tmp = T.alloc_var("int32")
            wpre = T.alloc_var("int32")
            wtot = T.alloc_var("int32")
            run_def = T.alloc_var("int32")
            run_tie = T.alloc_var("int32")
            d_before = T.alloc_var("int32")
            t_before = T.alloc_var("int32")
            pos = T.alloc_var("int32")
            oi = T.alloc_var("int32")
            kt = T.alloc_var("int32")
            rk = T.alloc_var("int32")
            b0 = T.alloc_var("uint32")
            wsum = T.alloc_var("int32")
            # an ordered-pass step's packed total (_ordered_classes); the final rank's packed word counts
            wcnt = T.alloc_local([wpt], "int32")
            kx = T.alloc_var("uint32")
            tf = T.alloc_var("float32")  # float filter of the compaction threshold
            xf = T.alloc_var("float32")
            wd = T.alloc_var("uint32")
            wt = T.alloc_var("uint32")
            mb = T.alloc_var("uint32")  # a lane's candidates of a compaction tile, bit u for strip u
            # the list's histogram (see V3_PREBIN_SPAN): > 0 its shift + 1, -1 a cleared histogram, 0 neither
            pre = T.alloc_var("int32")
            smax = T.alloc_var("uint32")  # the sample's largest key

            base = T.Cast("int64", row) * ld
            lt = (T.uint32(1) << T.Cast("uint32", lane)) - T.uint32(1)  # lanes below mine
            e = n
            if has_end != 0:
                e = T.max(T.min(end[row], n), 0)  # clamp: a bad end never reads outside the row
            take_all = T.if_then_else(e <= k, 1, 0)
            done = take_all
            if S > 1:
                # the row is split over the cluster when it is sampled (e > cap); else only the lead works
                spl = T.alloc_var("int32")
                c0 = T.alloc_var("int32")  # a compaction's first tile and end entry (see the compaction)
                ce = T.alloc_var("int32")
                spl = T.if_then_else(T.And(take_all == 0, e > cap), 1, 0)
                done = T.if_then_else(rank == 0, take_all, 1)
                if spl != 0:
                    # the lead's counter of the other CTAs' entries, zeroed before the first half of a cluster
                    # barrier that every CTA waits for before its first DSMEM access (then all have started)
                    if T.And(rank == 0, tx == 0):
                        s_peer[2, 0] = 0
                    cluster("arrive")
            kk = k
            lo = T.uint32(1)  # real keys are >= 0x007FFFFF: key 0 (ZERO) marks "no entry", never in range
            hi = KEY_MAX
            src = 0
            ne = e
            resolve = 0
            pre = 0
            cnt = 0
            compact = 1 - take_all
            if S > 1:
                compact = T.if_then_else(T.Or(rank == 0, spl != 0), 1 - take_all, 0)
            thr = ZERO  # rows up to `cap` entries: every entry is a candidate

            # fills for the lanes beyond the valid count
            if lead_only(True, rank):
                fills(values, indices, row, tx, k, e)
            if lead_only(take_all != 0, rank):
                # every valid entry is taken: lane i holds entry i (ascending index)
                for q in T.serial(T.ceildiv(e, NT)):
                    if q * NT + tx < e:
                        emit(scores, offset, cand, table, values, indices, row, base, q * NT + tx,
                             q * NT + tx)

            if lead_only(T.And(take_all == 0, e <= TL), rank):
                # Short rows (one tile): the keys stay in registers (src 3; key 0, below every real
                # key, past the end); the radix passes and the ordered pass run on them, so there is
                # no candidate list, no bitmap rank and no second read.
                load_tile(scores, kb, base, 0, e, tx)
                for u in T.unroll(UNROLL):
                    kb[u] = T.if_then_else(lin(0, u, tx) < e, _key(kb[u]), ZERO)
                kmin = KEY_MAX
                kmax = ZERO
                for u in T.unroll(UNROLL):
                    kmin = T.min(kmin, T.if_then_else(kb[u] == ZERO, KEY_MAX, kb[u]))
                    kmax = T.max(kmax, kb[u])
                # (its own per-warp buffer: the first pass publishes to s_mm without waiting for every
                # warp to have read this one; one barrier less, 64 x 8192 13.76 -> 13.63 us)
                min_max_and_clear(kmin, kmax, mm, s_mm0, s_hist, tx, lane, warp)
                pre = -1  # the first radix pass finds its histogram cleared
                lo = mm[0]
                hi = mm[1]
                done = T.if_then_else(lo == hi, 1, 0)
                src = 3
                compact = 0

            if T.And(take_all == 0, T.And(src == 0, e > cap)):
                # Longer rows: a lower bound thr of the threshold from a sample (NW * su runs of 32
                # spread over the row): the bin of its kt-th largest key (kt: see V3_SAMPLE_SD). Used only
                # if exactly counted k <= count (then every winner is >= thr).
                for u in T.unroll(su):
                    kb[u] = raw(scores, base + (warp * su + u) * (e // (NW * su)) + lane)
                for u in T.unroll(su):
                    kb[u] = _key(kb[u])
                kmin = KEY_MAX
                kmax = ZERO
                for u in T.unroll(su):
                    kmin = T.min(kmin, kb[u])
                    kmax = T.max(kmax, kb[u])
                min_max_and_clear(kmin, kmax, mm, s_mm, s_hist, tx, lane, warp)
                kmin = mm[0]
                kmax = mm[1]
                smax = kmax
                thr = kmin
                if kmin != kmax:
                    # the radix pass's bins (V3_NB over [kmin, kmax]; every sample key is in range)
                    sh = T.max(0, (32 - V3_BITS) - T.Cast("int32", T.clz(kmax - kmin)))
                    mm[0] = KEY_MAX  # (not used: every sample key is in range)
                    mm[1] = ZERO
                    for u in T.unroll(su):
                        hist_key(kb, u, mm, kmin, kmax, sh, s_hist)
                    T.sync_threads()
                    kt = (k * ssz) // e  # the expected sample count above the threshold, plus the margin
                    kt = T.min(ssz, kt + T.Cast("int32", T.sqrt(T.Cast("float32", kt)) * V3_SAMPLE_SD)
                               + V3_SAMPLE_PAD)
                    select_bin(kt, s_hist, s_scan, s_sel, tx, lane, warp)
                    T.sync_threads()
                    thr = kmin + (T.Cast("uint32", s_sel[0]) << T.Cast("uint32", sh))
                    rk = s_sel[1]  # the kt-th largest sample key is the rk-th largest in its bin
                    if T.And(sh > 0, T.Cast("int64", kt - rk + s_sel[2]) * T.Cast("int64", e)
                             > T.Cast("int64", (cap // 2) * ssz)):
                        # [min, max] of the sample keys in that bin, then (unless they are one key, as in
                        # few-valued rows, where a histogram would only pile up on one counter) a second
                        # histogram of them over V3_NB sub-bins: thr moves up from the bin's lower edge to
                        # the sub-bin of the same kt-th key (see V3_SAMPLE_PAD).
                        hi_bin = T.min(T.Cast("uint64", kmax), T.Cast("uint64", thr)
                                       + ((T.uint64(1) << T.Cast("uint64", sh)) - T.uint64(1)))
                        lo_bin = T.Cast("uint32", hi_bin)  # the bin's highest key
                        kmin = KEY_MAX
                        kmax = ZERO
                        for u in T.unroll(su):
                            kmin = T.min(kmin, T.if_then_else(T.And(kb[u] >= thr, kb[u] <= lo_bin), kb[u],
                                                              KEY_MAX))
                            kmax = T.max(kmax, T.if_then_else(T.And(kb[u] >= thr, kb[u] <= lo_bin), kb[u],
                                                              ZERO))
                        min_max_and_clear(kmin, kmax, mm, s_mm, s_hist, tx, lane, warp)
                        kmin = mm[0]
                        kmax = mm[1]
                        thr = kmin  # <= the kt-th key, which is in the bin
                        if kmin != kmax:
                            sh = T.max(0, (32 - V3_BITS) - T.Cast("int32", T.clz(kmax - kmin)))
                            for u in T.unroll(su):
                                hist_key(kb, u, mm, kmin, kmax, sh, s_hist)
                            T.sync_threads()
                            select_bin(rk, s_hist, s_scan, s_sel, tx, lane, warp)
                            T.sync_threads()
                            thr = kmin + (T.Cast("uint32", s_sel[0]) << T.Cast("uint32", sh))
                # One CTA a row: the list's bins (see V3_PREBIN_SPAN), and no barrier here: the compaction
                # writes s_hist, s_bm and s_cnt before its first barrier, and the sample's last reads of
                # s_hist came before the barrier after its selection. A split row's exchange reuses s_sel.
                if S == 1:
                    wd = smax - thr
                    wd = T.if_then_else(wd > T.uint32(0xFFFFFFFF // V3_PREBIN_SPAN), KEY_MAX,
                                        wd * T.uint32(V3_PREBIN_SPAN) + T.uint32(1))
                    pre = T.if_then_else(thr <= T.uint32(0xFF800000),
                                         T.max(0, (32 - V3_BITS) - T.Cast("int32", T.clz(wd))) + 1, 0)
                else:
                    T.sync_threads()

            for _rnd in T.serial(V3_ROUNDS):
                if compact != 0:
                    # One read of the row: the keys >= thr (key, index) in any order, counted exactly
                    # (slots beyond `cap` are not written), with their min and max. The test is one
                    # float compare, exact: key(x) >= thr <=> not (x < tf) (true for NaN), with tf the
                    # float of the smallest key >= thr (-inf below the -inf key); the test is written
                    # as a select on the complement (x < tf: TVM would turn not (x < tf) into tf <= x,
                    # false for NaN). Above the +inf key
                    # (only NaN qualifies) tf is +inf, so the +inf entries come too: a superset, which
                    # is safe for the sampled bound (compact 1: the list is then the keys >= key(+inf),
                    # and only its count and [min, max] are used); compact 2's lo never lies there (a
                    # radix pass turns such an lo into the NaN key, which ends the search). A lane's
                    # candidates of a tile are one bit mask; a warp scan of their counts and one counter
                    # add per warp and tile give each its slot, and the lane stores them in turn
                    # (predicated), raw bits: a pass over the list after the loop turns them into keys
                    # and takes [min, max] (the loop keys only what overflows), which costs one list
                    # entry per thread instead of a key and a min / max per strip. (Before: a ballot per
                    # strip and a warp-uniform branch around each strip's stores, 166 SASS instructions
                    # per warp and tile on 128 x 131072, k = 2048.)
                    if tx == 0:
                        s_cnt[0] = 0
                    kmin = KEY_MAX
                    kmax = ZERO
                    wd = T.if_then_else(thr >= T.uint32(0x80000000),
                                        T.if_then_else(thr > T.uint32(0xFF800000), T.uint32(0x7F800000),
                                                       thr & T.uint32(0x7FFFFFFF)),
                                        T.if_then_else(thr < T.uint32(0x007FFFFF), NEG_INF_BITS, ~thr))
                    tf = T.reinterpret(wd, "float32")
                    if S > 1:
                        # this CTA's tiles [c0, ceil(ce / TL)) of the row: its share when the row is split,
                        # else (the fallback compaction, the lead alone) the whole row
                        c0 = 0
                        ce = e
                        if T.And(spl != 0, compact == 1):
                            c0 = rank * T.ceildiv(T.ceildiv(e, TL), S)
                            ce = T.min(e, (c0 + T.ceildiv(T.ceildiv(e, TL), S)) * TL)
                    t_lo = 0 if S == 1 else c0  # the loop's first tile and its end entry
                    t_end = e if S == 1 else ce
                    if S == 1 and T.And(pre > 0, compact == 1):
                        for q in T.unroll(BPT):
                            s_hist[q * NT + tx] = 0
                    # the final rank's first window finds its bitmaps cleared (s_bm is free until then)
                    for q in T.serial(T.ceildiv(2 * bmw, NT)):
                        if q * NT + tx < 2 * bmw:
                            s_bm[q * NT + tx] = ZERO
                    load_tile(scores, kn, base, t_lo, t_end, tx)  # (in flight across the barrier)
                    T.sync_threads()
                    for it in T.serial(t_lo, T.ceildiv(t_end, TL)):
                        for u in T.unroll(UNROLL):
                            kb[u] = kn[u]
                        # full tiles (all but the last) need no bounds checks: uniform branches
                        if (it + 2) * TL <= t_end:
                            for u in T.unroll(UNROLL):
                                kn[u] = raw(scores, base + lin(it + 1, u, tx), True)
                        else:
                            load_tile(scores, kn, base, it + 1, t_end, tx, True)
                        # mb: my candidates of the tile as bits (bit u: strip u); the warp's scan of their
                        # counts places them, one counter add per warp and tile reserves the room
                        mb = ZERO
                        if (it + 1) * TL <= t_end:
                            for u in T.unroll(UNROLL):
                                xf = T.reinterpret(kb[u], "float32")
                                mb = mb | (T.if_then_else(xf < tf, ZERO, T.uint32(1)) << T.uint32(u))
                        else:
                            for u in T.unroll(UNROLL):
                                xf = T.reinterpret(kb[u], "float32")
                                mb = mb | (T.if_then_else(T.Or(lin(it, u, tx) >= t_end, xf < tf), ZERO,
                                                          T.uint32(1)) << T.uint32(u))
                        c = T.Cast("int32", T.popcount(mb))
                        _warp_incl(c, incl, lane)
                        wsum = T.shfl_sync(incl[0], 31)
                        if wsum != 0:  # warp-uniform
                            if lane == 0:
                                # plain CUDA atomicAdd: a shared-memory ATOMS (tilelang's AtomicAddRet
                                # goes through a device-scope atomic_ref: a generic ATOM)
                                slot = T.call_extern("int32", "atomicAdd", T.address_of(s_cnt[0]), wsum)
                            slot = T.shfl_sync(slot, 0)
                            pos = slot + incl[0] - c  # my first slot
                            if slot + wsum <= cap:  # warp-uniform: no overflow check per entry
                                for u in T.unroll(UNROLL):
                                    if ((mb >> T.uint32(u)) & T.uint32(1)) != ZERO:
                                        s_ck[pos] = kb[u]
                                        s_ci[pos] = lin(it, u, tx)
                                        pos = pos + 1
                            else:
                                for u in T.unroll(UNROLL):
                                    if ((mb >> T.uint32(u)) & T.uint32(1)) != ZERO:
                                        # the raw bits go to the list (keyed after the loop, with the list's
                                        # min / max); only a key beyond `cap` is keyed here
                                        if pos < cap:
                                            s_ck[pos] = kb[u]
                                            s_ci[pos] = lin(it, u, tx)
                                        else:
                                            kx = _key(kb[u])
                                            kmin = T.min(kmin, kx)
                                            kmax = T.max(kmax, kx)
                                        pos = pos + 1
                    T.sync_threads()
                    m = s_cnt[0]
                    # the stored raw bits become keys; [min, max] over them and the overflow keys
                    # (and, for a list that fits, its pre-binned histogram: every key is >= thr, which is at
                    # most the +inf key)
                    pre = T.if_then_else(T.And(compact == 1, m <= cap), pre, 0)
                    for q in T.serial(T.ceildiv(T.min(m, cap), NT)):
                        wd = NO_BIN
                        if q * NT + tx < T.min(m, cap):
                            kx = _key(s_ck[q * NT + tx])
                            s_ck[q * NT + tx] = kx
                            kmin = T.min(kmin, kx)
                            kmax = T.max(kmax, kx)
                            if S == 1:
                                wd = T.min((kx - thr) >> T.Cast("uint32", T.max(pre - 1, 0)),
                                           T.uint32(V3_NB - 1))
                        if S == 1 and pre > 0:
                            hist_add(wd, s_hist)
                    publish_min_max(kmin, kmax, s_mm, lane, warp)
                    T.sync_threads()
                    gather_min_max(mm, s_mm, lane)
                    kmin = mm[0]
                    kmax = mm[1]
                    if S > 1:
                        if T.And(spl != 0, compact == 1):
                            # A split row: the other CTAs reserve room at the top of the lead's list (a remote
                            # add to its counter s_peer[2, 0], zeroed at the start), copy their keyed entries
                            # there (if they fit) and their [min, max] to s_peer; one cluster barrier; the
                            # lead moves that block down after its own entries and takes every CTA's count
                            # and [min, max]. (Where the lead's and the others' entries would meet, the total
                            # is above the capacity and the list is not used.)
                            cluster("wait")  # every CTA has started, the lead's counter is zero
                            if rank != 0:
                                if tx == 0:
                                    s_sel[3] = T.Cast("int32", T.call_extern(
                                        "uint32", "tl_topk_atomic_add_cluster", T.address_of(s_peer[2, 0]), 0,
                                        T.Cast("uint32", m)))
                                    st_lead(s_peer[0, rank], kmin)
                                    st_lead(s_peer[1, rank], kmax)
                                T.sync_threads()
                                slot = cap - s_sel[3] - m  # my first entry in the lead's list
                                if T.And(slot >= 0, m <= cap):
                                    for q in T.serial(T.ceildiv(m, NT)):
                                        if q * NT + tx < m:
                                            st_lead(s_ck[slot + q * NT + tx], s_ck[q * NT + tx])
                                            st_lead(s_ci[slot + q * NT + tx],
                                                    T.Cast("uint32", s_ci[q * NT + tx]))
                                m = 0  # done: only the lead goes on
                            cluster("arrive")
                            cluster("wait")
                            if rank == 0:
                                c = T.Cast("int32", s_peer[2, 0])  # the other CTAs' entries
                                for j in T.unroll(S - 1):
                                    kmin = T.min(kmin, s_peer[0, j + 1])
                                    kmax = T.max(kmax, s_peer[1, j + 1])
                                if T.And(c > 0, m + c <= cap):
                                    # the block [cap - c, cap) moves to [m, m + c) (through registers: the
                                    # two may overlap)
                                    for q in T.unroll(cap // NT):
                                        if q * NT + tx < c:
                                            kb[q] = s_ck[cap - c + q * NT + tx]
                                            inl[q] = s_ci[cap - c + q * NT + tx]
                                    T.sync_threads()
                                    for q in T.unroll(cap // NT):
                                        if q * NT + tx < c:
                                            s_ck[m + q * NT + tx] = kb[q]
                                            s_ci[m + q * NT + tx] = inl[q]
                                m = m + c
                    if compact == 2:
                        src = 2  # the keys >= lo: m == k - kk + cnt <= cap, checked before
                        ne = m
                    elif m >= k:
                        # at least k keys >= thr: the threshold is one of them, in [min, max] of the list
                        # (nothing above max): all-equal or few-distinct rows are done here
                        lo = kmin
                        hi = kmax
                        done = T.if_then_else(kmin == kmax, 1, 0)
                        src = T.if_then_else(m <= cap, 2, 0)
                        ne = T.if_then_else(m <= cap, m, e)
                    # the list's histogram is the next radix pass's when that pass selects in the list
                    pre = T.if_then_else(T.And(m >= k, kmin != kmax), pre, 0)
                    compact = 0
                    if S > 1:
                        done = T.if_then_else(rank == 0, done, 1)  # the other CTAs of a split row are done
                    if pre == 0:
                        # s_cnt / s_mm are rewritten next (that pass, with pre > 0, writes neither before its
                        # selection's barrier)
                        T.sync_threads()
                elif resolve != 0:
                    # The threshold bin holds at most V3_RES keys (all of [lo, hi]; keys from registers or the
                    # list): gather them (zero-padded: key 0 is below every real key) and rank each against
                    # all (one warp per 32 keys) for the kk-th largest with its multiplicity, instead of
                    # more radix passes. Then [lo, hi] is that one key and kk counts its ties.
                    # (s_cnt and s_small were zeroed by the radix pass that chose this round, before its
                    # last barrier)
                    if src == 3:
                        for u in T.unroll(UNROLL):
                            if T.And(kb[u] >= lo, kb[u] <= hi):
                                slot = T.call_extern("int32", "atomicAdd", T.address_of(s_cnt[0]), 1)
                                if slot < V3_RES:  # always (cnt keys are in range): a bounds guard
                                    s_small[slot] = kb[u]
                    else:
                        for q in T.serial(T.ceildiv(ne, NT)):
                            if q * NT + tx < ne:
                                kx = s_ck[q * NT + tx]
                                if T.And(kx >= lo, kx <= hi):
                                    slot = T.call_extern("int32", "atomicAdd", T.address_of(s_cnt[0]), 1)
                                    if slot < V3_RES:
                                        s_small[slot] = kx
                    T.sync_threads()
                    if warp * 32 < cnt:  # warp-uniform
                        kx = s_small[warp * 32 + lane]  # 0 past cnt
                        c = 0  # keys above mine
                        tmp = 0  # keys at or above mine
                        for j in T.serial(T.ceildiv(cnt, V3_RES_STEP)):
                            for t in T.unroll(V3_RES_STEP):
                                b0 = s_small[j * V3_RES_STEP + t]
                                c = c + T.if_then_else(b0 > kx, 1, 0)
                                tmp = tmp + T.if_then_else(b0 >= kx, 1, 0)
                        if T.And(kx != ZERO, T.And(c < kk, kk <= tmp)):  # ties all write the same
                            s_sel[0] = T.Cast("int32", kx)
                            s_sel[1] = kk - c
                            s_sel[2] = tmp - c  # its multiplicity
                    T.sync_threads()
                    lo = T.Cast("uint32", s_sel[0])
                    hi = lo
                    kk = s_sel[1]
                    cnt = s_sel[2]
                    done = 1
                    resolve = 0
                    # no barrier: no later phase writes s_sel, s_cnt or s_small
                elif done == 0:
                    # radix pass: bins of 2^sh keys over [lo, hi] (at most V3_NB of them: 12-bit digits, so
                    # a candidate list spanning up to 2^24 keys, as a randn row's top ~2% does, needs two)
                    if pre > 0:
                        # the compaction binned the list (origin thr, shift pre - 1, the keys past the last
                        # bin in it) and published the list's [min, max] to s_mm: straight to the selection
                        sh = pre - 1
                        lo = thr
                    else:
                        sh = T.max(0, (32 - V3_BITS) - T.Cast("int32", T.clz(hi - lo)))
                        mm[0] = KEY_MAX
                        mm[1] = ZERO
                        if pre == 0:  # (-1: the one-tile rows' first pass, cleared with their [min, max])
                            for q in T.unroll(BPT):
                                s_hist[q * NT + tx] = 0
                            T.sync_threads()
                        if src == 2:
                            # the list: one key per thread and step over its ne entries only (a tile's
                            # 8 strips per thread would mostly hold key 0: the list is ~1.3k keys long)
                            for q in T.serial(T.ceildiv(ne, NT)):
                                kb[0] = T.if_then_else(q * NT + tx < ne, s_ck[q * NT + tx], ZERO)
                                hist_key(kb, 0, mm, lo, hi, sh, s_hist)
                        else:
                            if src == 0:
                                load_tile(scores, kn, base, 0, ne, tx)
                            for it in T.serial(T.ceildiv(ne, TL)):
                                if src == 0:
                                    next_keys(scores, kb, kn, base, it, ne, tx)
                                # entries past the end hold key 0, below lo: no bounds check, no branches
                                for u in T.unroll(UNROLL):
                                    hist_key(kb, u, mm, lo, hi, sh, s_hist)
                        publish_min_max(mm[0], mm[1], s_mm, lane, warp)
                        T.sync_threads()
                    select_bin(kk, s_hist, s_scan, s_sel, tx, lane, warp)
                    gather_min_max(mm, s_mm, lane)
                    kmin = mm[0]
                    kmax = mm[1]
                    # a resolve round may come next: its gather counter and zero padding (a compaction
                    # zeroes s_cnt itself)
                    if tx == 0:
                        s_cnt[0] = 0
                    if tx < V3_RES:
                        s_small[tx] = ZERO
                    T.sync_threads()
                    lo_bin = lo + (T.Cast("uint32", s_sel[0]) << T.Cast("uint32", sh))
                    hi_bin = T.Cast("uint64", lo_bin) + ((T.uint64(1) << T.Cast("uint64", sh)) - T.uint64(1))
                    if T.And(pre > 0, s_sel[0] == V3_NB - 1):
                        hi_bin = T.uint64(0xFFFFFFFF)  # the pre-binned list's last bin holds every key above
                    pre = 0
                    hi = T.Cast("uint32", T.min(T.Cast("uint64", hi), hi_bin))  # 64-bit: no wrap-around
                    lo = T.max(lo_bin, kmin)
                    hi = T.min(hi, kmax)
                    # above the +inf key only the NaN key exists: such an lo is that key (then lo == hi and
                    # the search ends), so compact 2's float filter never needs a threshold above +inf
                    lo = T.if_then_else(lo > T.uint32(0xFF800000), KEY_MAX, lo)
                    kk = s_sel[1]
                    cnt = s_sel[2]
                    if T.Or(cnt == kk, lo == hi):
                        done = 1  # the threshold bin is taken whole, or the threshold key is exact
                    if T.And(T.And(done == 0, src == 0), k - kk + cnt <= cap):
                        compact = 2  # the keys >= lo fit: compact them, later passes use the list
                        thr = lo
                    if T.And(T.And(done == 0, src != 0), cnt <= V3_RES):
                        resolve = 1  # [lo, hi] holds exactly cnt keys: they are ranked directly next
                    if resolve == 0:
                        # s_hist / s_sel / s_scan / s_mm are rewritten next (a resolve writes s_sel only
                        # after its gather's barrier)
                        T.sync_threads()

            if lead_only(take_all == 0, rank):
                if src == 2:
                    # Final rank over the candidates (any order): per window of `win` indices, bitmaps
                    # of the taken (key > hi) and tied (key in [lo, hi]) entries, a block scan of their
                    # packed word counts, then lane = taken before + min(ties before, kk) (ties go to
                    # the lower index, output in ascending index order).
                    run_def = 0  # packed (taken | ties << 16) counts of the earlier windows
                    for w in T.serial(T.ceildiv(e, win)):
                        if w > 0:  # (the compaction cleared them for the first window)
                            for q in T.serial(T.ceildiv(2 * bmw, NT)):
                                if q * NT + tx < 2 * bmw:
                                    s_bm[q * NT + tx] = ZERO
                            T.sync_threads()
                        for q in T.serial(T.ceildiv(ne, NT)):
                            if q * NT + tx < ne:
                                oi = s_ci[q * NT + tx] - w * win
                                kx = s_ck[q * NT + tx]
                                if T.And(T.And(oi >= 0, oi < win), kx >= lo):
                                    # plain CUDA atomicOr (ATOMS): tilelang's AtomicOr is a global red
                                    wd = T.Cast("uint32", T.if_then_else(kx > hi, 0, bmw) + (oi >> 5))
                                    T.call_extern("uint32", "atomicOr", T.address_of(s_bm[wd]),
                                                  T.uint32(1) << T.Cast("uint32", oi & 31))
                        T.sync_threads()
                        c = 0
                        for x in T.unroll(wpt):
                            wcnt[x] = 0
                            if tx * wpt + x < bmw:
                                wcnt[x] = (T.Cast("int32", T.popcount(s_bm[tx * wpt + x]))
                                           + T.Cast("int32", T.popcount(s_bm[bmw + tx * wpt + x])) * TIE)
                            c = c + wcnt[x]
                        warp_scan(c, incl, s_scan, lane, warp)
                        T.sync_threads()
                        wtot = per_warp(s_scan, 0, lane, 0)
                        tmp = T.if_then_else(lane < warp, wtot, 0)
                        tmp = _warp_sum(tmp)
                        wtot = _warp_sum(wtot)
                        wpre = run_def + tmp + incl[0] - c  # packed counts before my first word
                        for x in T.unroll(wpt):
                            if tx * wpt + x < bmw:
                                s_hist[tx * wpt + x] = wpre
                                wpre = wpre + wcnt[x]
                        T.sync_threads()
                        for q in T.serial(T.ceildiv(ne, NT)):
                            if q * NT + tx < ne:
                                oi = s_ci[q * NT + tx] - w * win
                                kx = s_ck[q * NT + tx]
                                if T.And(T.And(oi >= 0, oi < win), kx >= lo):
                                    wd = s_bm[oi >> 5]
                                    wt = s_bm[bmw + (oi >> 5)]
                                    lt = (T.uint32(1) << T.Cast("uint32", oi & 31)) - T.uint32(1)
                                    wpre = (s_hist[oi >> 5] + T.Cast("int32", T.popcount(wd & lt))
                                            + T.Cast("int32", T.popcount(wt & lt)) * TIE)
                                    d_before = wpre & 0xFFFF
                                    t_before = wpre >> 16
                                    if T.Or(kx > hi, t_before < kk):
                                        emit(scores, offset, cand, table, values, indices, row, base,
                                             d_before + T.min(t_before, kk), oi + w * win)
                        run_def = run_def + wtot
                        if w + 1 < T.ceildiv(e, win):
                            T.sync_threads()  # s_bm / s_hist / s_scan are rewritten by the next window
                else:
                    # ordered pass over the row: keys above hi, and the first kk keys in [lo, hi]; it
                    # stops once all k lanes are found (tie-heavy rows: usually after the first tile).
                    # When every key in [lo, hi] is taken (cnt == kk: the usual case, a threshold key
                    # without ties to cut), the winners are the keys >= lo: one ballot per strip.
                    lt = (T.uint32(1) << T.Cast("uint32", lane)) - T.uint32(1)
                    run_def = 0
                    run_tie = 0
                    if src == 0:
                        load_tile(scores, kn, base, 0, e, tx)
                    for it in T.serial(T.ceildiv(e, TL)):
                        if run_def + T.min(run_tie, kk) < k:  # lanes found so far (run_def <= k - kk)
                            if src == 0:  # else (src 3) the one tile's keys are in kb already
                                next_keys(scores, kb, kn, base, it, e, tx)
                            _ordered_classes(kb, inl, wcnt, UNROLL, lo, hi, cnt, kk, lt)
                            for u in T.unroll(UNROLL):
                                kb[u] = ZERO  # src 3 has one tile: kb is not live across the emits
                            if lane == 0:
                                s_scan[it % 2, warp] = wcnt[0]
                            T.sync_threads()
                            wtot = per_warp(s_scan, it % 2, lane, 0)
                            tmp = T.if_then_else(lane < warp, wtot, 0)
                            tmp = _warp_sum(tmp)
                            wtot = _warp_sum(wtot)
                            for u in T.unroll(UNROLL):
                                i = lin(it, u, tx)
                                wpre = tmp + (inl[u] & CNT_MASK)
                                d_before = run_def + (wpre & 0xFFFF)
                                t_before = run_tie + (wpre >> 16)
                                if T.Or((inl[u] & CLS_TAKE) != 0,
                                        T.And((inl[u] & CLS_TIE) != 0, t_before < kk)):
                                    pos = d_before + T.min(t_before, kk)
                                    if pos < k:
                                        emit(scores, offset, cand, table, values, indices, row, base, pos, i)
                            run_def = run_def + (wtot & 0xFFFF)
                            run_tie = run_tie + (wtot >> 16)

    return kernel


# One-tile rows (k < end <= TILE: 8 keys a thread) in a kernel of their own, one 1024-thread CTA a row. Such
# rows are bound by instruction issue, not by memory or barriers (ncu, 64 x 8192: ~1,430 warp instructions a
# warp at IPC ~2.4 on the busy SMs is the whole row time), so this kernel does only what they need: the
# keys stay in registers; [min, max] from one barrier; up to three radix passes (12-bit digits over
# [lo, hi]: 2^32 -> 2^20 -> 2^8 -> 1 keys, a key in range by one unsigned compare) into two alternating
# histograms, so a pass clears the one after next and needs two barriers: one after its adds, one after
# its warps published their chunk totals; every warp then finds the threshold bin itself (a scan of the 32
# totals, then of the chosen chunk's 128 bins), so no selection is written and read back; then the ordered
# pass of v3 (_ordered_classes: keys above hi, the first kk keys in [lo, hi], ascending index order). A
# search ends when the threshold bin is taken whole (cnt == kk) or is one key (then kk of its ties go).
# H200, us (session 27, A/B in one process), v3's one-tile path -> this kernel: 64 x 8192, k 512:
# randn 13.54 -> 10.46, few 13.22 -> 10.05, equal 9.02 -> 7.70, conc 11.81 -> 9.17; 4096 x 8192
# 301.5 -> 196.7; 132 x 2048 11.62 -> 8.64.
TILE_ROWS = True  # _v3_launch gives such rows this kernel (False: v3's one-tile path)
TILE_SHORT = True  # ... and the rows v3 would run on SHORT_ROW_THREADS (256: up to SMALL_CACHE entries)
# Radix digit: three passes cover 32 bits from 11 up. H200, us, 12 -> 11 bits (A/B, session 28): 64 x 8192,
# k 512: randn 9.65 -> 9.25, few 9.89 -> 9.63, conc 9.02 -> 8.86, sorted 9.38 -> 9.02, equal the same;
# 4096 x 8192: randn 176.7 -> 167.1, few 209.2 -> 200.0 (fewer bins to clear and to scan a pass).
TILE_BITS = 11
TILE_MAX_UNROLL = 16  # 256 threads x 16 keys: rows of the short tier (SMALL_CACHE) on v3's 256-thread launch


def _tile_unroll(n: int, threads: int) -> int:
    """Keys a thread of the tile kernel for rows of n entries on `threads` threads: UNROLL, or the power of
    two above that covers the row (0: the row is more than one tile)."""
    if n > TILE:
        return 0
    u = UNROLL
    while threads * u < n and u < TILE_MAX_UNROLL:
        u *= 2
    return u if threads * u >= n else 0


@tilelang.jit(pass_configs={**PASS_CONFIGS, tilelang.PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True})
def topk_kernel_tile(in_dtype: str = "float32", idx_dtype: str = "int32", off_dtype: str = "int32",
                     with_values: bool = True, with_offset: bool = False, idx_fill: int = -1,
                     val_fill: float = float("-inf"), mode: str = "topk", cand_bs: int = 0, block_c: int = 1,
                     threads: int = THREADS, unroll: int = UNROLL):
    """Rows of at most threads * unroll entries, one CTA a row: the arguments of `topk_kernel_warp` without
    its rows per CTA, then `threads` a CTA and `unroll` keys a thread."""
    total = T.dynamic("total", "int64")  # flat scores storage: (b - 1) * ld + n elements
    b, k, nb_end, nb_off, nb_val, kv = T.dynamic("b, k, nb_end, nb_off, nb_val, kv")
    nc, mb = T.dynamic("nc, mb")
    NT, U, NB = threads, unroll, 1 << TILE_BITS
    NW = NT // 32
    CH = NB // NW  # bins per warp chunk in the selection
    BPL = CH // 32  # bins per lane
    assert 11 <= TILE_BITS <= 13 and PASSES * TILE_BITS >= 32, TILE_BITS
    assert NT in (256, 512, 1024) and U in (8, 16), (NT, U)
    BPT = NB // NT  # histogram entries per thread in a clear
    HS = NB + 32  # a histogram and a spare counter per lane (keys out of range)
    ZERO, KEY_MAX = T.uint32(0), T.uint32(0xFFFFFFFF)
    fills, emit = _lane_macros(in_dtype, idx_dtype, with_values, with_offset, idx_fill, val_fill, mode,
                               cand_bs, block_c, nc, mb, NT)

    def of_warp(read, lane, fill):
        """read(lane), a warp's entry, in the lanes that name a warp (all of them at 32 warps), else fill."""
        return read(lane) if NW == 32 else T.if_then_else(lane < NW, read(lane), fill)

    def lin(u, tx):
        """The row entry of thread tx's key u: a warp owns U * 32 consecutive entries (the ordered pass's
        cross-warp scan is then one count per warp)."""
        return (tx // 32) * (U * 32) + u * 32 + tx % 32

    @T.prim_func
    def kernel(
        scores: T.Tensor((total,), in_dtype),  # [b, n] rows at stride ld, flattened
        end: T.Tensor((nb_end,), "int32"),  # [b] (or [1] dummy when has_end == 0)
        offset: T.Tensor((nb_off,), off_dtype),  # [b] (or [1] dummy)
        cand: T.Tensor((b, nc), "int32"),  # [b, c] candidate blocks (slots mode) or [b, 1] dummy
        table: T.Tensor((b, mb), "int32"),  # [b, max_blocks] block table (slots mode) or dummy
        values: T.Tensor((nb_val, kv), in_dtype),  # [b, k] (or [1, 1] dummy)
        indices: T.Tensor((b, k), idx_dtype),  # [b, k]
        n: T.int32,
        ld: T.int64,
        has_end: T.int32,
    ):
        with T.Kernel(b, threads=NT) as row:
            tx = T.get_thread_binding()
            lane = tx % 32
            warp = tx // 32
            s_hist = T.alloc_shared([2 * HS], "int32")  # two histograms, by pass parity
            s_tot = T.alloc_shared([NW], "int32")  # a pass's chunk totals; then the ordered pass's counts
            s_mm = T.alloc_shared([2, NW], "uint32")  # per-warp min / max
            kb = T.alloc_local([U], "uint32")
            inl = T.alloc_local([U], "int32")
            hj = T.alloc_local([BPL], "int32")
            incl = T.alloc_local([1], "int32")
            wcnt = T.alloc_local([1], "int32")  # the ordered pass's packed warp total (_ordered_classes)
            e = T.alloc_var("int32")
            kk = T.alloc_var("int32")  # rank of the threshold among the keys in [lo, hi]
            cnt = T.alloc_var("int32")  # keys in [lo, hi]
            done = T.alloc_var("int32")
            lo = T.alloc_var("uint32")
            hi = T.alloc_var("uint32")
            sh = T.alloc_var("int32")
            kmin = T.alloc_var("uint32")
            kmax = T.alloc_var("uint32")
            c = T.alloc_var("int32")
            r = T.alloc_var("int32")
            wpre = T.alloc_var("int32")
            sel = T.alloc_var("int32")
            rr = T.alloc_var("int32")
            hh = T.alloc_var("int32")
            ch = T.alloc_var("int32")
            ln = T.alloc_var("int32")
            lt = T.alloc_var("uint32")
            ok = T.alloc_var("int32")
            t_before = T.alloc_var("int32")
            pos = T.alloc_var("int32")

            base = T.Cast("int64", row) * ld
            # the row's loads go out first, bounded by n (in the row whatever `end` says), so they need not
            # wait for end[row]; entries at and past `end` are masked when keyed
            for u in T.unroll(U):
                kb[u] = T.if_then_else(lin(u, tx) < n, _f32_bits(scores[base + lin(u, tx)]), ZERO)
            e = n
            if has_end != 0:
                e = T.max(T.min(end[row], n), 0)  # clamp: a bad end never reads outside the row
            fills(values, indices, row, tx, k, e)
            if e <= k:
                # every valid entry is taken: lane i holds entry i (ascending index)
                for q in T.serial(T.ceildiv(e, NT)):
                    if q * NT + tx < e:
                        emit(scores, offset, cand, table, values, indices, row, base, q * NT + tx,
                             q * NT + tx)
            else:
                kmin = KEY_MAX
                kmax = ZERO
                for u in T.unroll(U):
                    # key 0 (below every real key, which is >= 0x007FFFFF) past the end: & the sign-extended
                    # borrow of i - e (all ones before the end), no branch around the key
                    kb[u] = _key(kb[u]) & T.Cast("uint32", T.Cast("int32", lin(u, tx) - e) >> 31)
                    kmin = T.min(kmin, T.if_then_else(kb[u] == ZERO, KEY_MAX, kb[u]))
                    kmax = T.max(kmax, kb[u])
                kmin = _warp_min(kmin)
                kmax = _warp_max(kmax)
                if lane == 0:
                    s_mm[0, warp] = kmin
                    s_mm[1, warp] = kmax
                for q in T.unroll(BPT):
                    s_hist[q * NT + tx] = 0
                    s_hist[HS + q * NT + tx] = 0
                T.sync_threads()
                lo = _warp_min(of_warp(lambda w: s_mm[0, w], lane, KEY_MAX))
                hi = _warp_max(of_warp(lambda w: s_mm[1, w], lane, ZERO))
                kk = k
                cnt = e
                done = T.if_then_else(lo == hi, 1, 0)
                for p in T.unroll(PASSES):
                    if done == 0:  # block-uniform
                        hb = (p % 2) * HS
                        sh = T.max(0, (32 - TILE_BITS) - T.Cast("int32", T.clz(hi - lo)))
                        for u in T.unroll(U):
                            # in [lo, hi] <=> kb - lo <= hi - lo (unsigned: keys below lo wrap above); every
                            # lane adds, a key out of range to its lane's spare counter, so there is no branch
                            # (H200, us, with / without the spare counters: 64 x 8192 randn 10.46 / 10.50, few
                            # 10.05 / 10.21; 4096 x 8192 few 212.0 / 216.3, conc 180.5 / 177.5)
                            T.atomic_add(s_hist[hb + T.Cast("int32", T.if_then_else(
                                kb[u] - lo <= hi - lo, (kb[u] - lo) >> T.Cast("uint32", sh),
                                T.Cast("uint32", NB + lane)))], 1)
                        T.sync_threads()
                        # warp w's chunk: bins NB-1-CH*w-d, d < CH (descending), BPL a lane
                        c = 0
                        for j in T.unroll(BPL):
                            c = c + s_hist[hb + NB - 1 - CH * warp - BPL * lane - j]
                        c = _warp_sum(c)
                        if lane == 0:
                            s_tot[warp] = c
                        if p == 1:
                            for q in T.unroll(BPT):  # the third pass's histogram (the first's, read by now)
                                s_hist[q * NT + tx] = 0
                        T.sync_threads()
                        # every warp alike: the chunk ch holding the kk-th largest key, r its rank there ...
                        c = of_warp(lambda w: s_tot[w], lane, 0)  # lanes past the warps: empty chunks
                        _warp_incl(c, incl, lane)
                        ch = T.Cast("int32", T.popcount(T.Cast("uint32", T.ballot_sync(incl[0] < kk))))
                        r = kk - T.shfl_sync(incl[0] - c, ch)
                        # ... and in it the lane ln whose BPL bins hold the r-th, and there the bin
                        c = 0
                        for j in T.unroll(BPL):
                            hj[j] = s_hist[hb + NB - 1 - CH * ch - BPL * lane - j]
                            c = c + hj[j]
                        _warp_incl(c, incl, lane)
                        ln = T.Cast("int32", T.popcount(T.Cast("uint32", T.ballot_sync(incl[0] < r))))
                        wpre = incl[0] - c  # keys in the chunk's bins above my bins
                        sel = 0
                        rr = 0
                        hh = 0
                        for j in T.unroll(BPL):
                            if T.And(wpre < r, r <= wpre + hj[j]):
                                sel = j
                                rr = r - wpre
                                hh = hj[j]
                            wpre = wpre + hj[j]
                        sel = T.shfl_sync(sel, ln)
                        kk = T.shfl_sync(rr, ln)
                        cnt = T.shfl_sync(hh, ln)
                        sel = NB - 1 - CH * ch - BPL * ln - sel  # the bin
                        lo = lo + (T.Cast("uint32", sel) << T.Cast("uint32", sh))
                        hi = lo + T.min(hi - lo, (T.uint32(1) << T.Cast("uint32", sh)) - T.uint32(1))
                        done = T.if_then_else(T.Or(cnt == kk, lo == hi), 1, 0)
                # ordered pass: keys above hi, and the first kk keys in [lo, hi] (all of them when cnt == kk)
                lt = (T.uint32(1) << T.Cast("uint32", lane)) - T.uint32(1)  # lanes below mine
                _ordered_classes(kb, inl, wcnt, U, lo, hi, cnt, kk, lt)
                if lane == 0:
                    s_tot[warp] = wcnt[0]
                T.sync_threads()
                c = _warp_sum(T.if_then_else(lane < warp, s_tot[lane], 0))  # packed counts, warps before
                if cnt == kk:  # block-uniform: every key >= lo is taken, there are no ties to count
                    for u in T.unroll(U):
                        pos = c + (inl[u] & 0xFFFF)
                        if T.And((inl[u] & CLS_TAKE) != 0, pos < k):
                            emit(scores, offset, cand, table, values, indices, row, base, pos, lin(u, tx))
                else:
                    for u in T.unroll(U):
                        wpre = c + (inl[u] & CNT_MASK)
                        t_before = wpre >> 16
                        pos = (wpre & 0xFFFF) + T.min(t_before, kk)
                        # taken: a key above hi, or one of the first kk ties (bitwise: one branch, the emit's)
                        ok = ((inl[u] >> 28) | ((inl[u] >> 29) & T.Cast("int32", t_before < kk))) & T.Cast(
                            "int32", pos < k)
                        if (ok & 1) != 0:
                            emit(scores, offset, cand, table, values, indices, row, base, pos, lin(u, tx))

    return kernel


# One warp per row (v3's launch for many short rows; `threads` 32 in _v3_launch): a row's whole search runs
# in one warp, so there is no block barrier, no cross-warp scan and no idle warp, and an SM holds up to 24
# rows at a time (80 registers a thread and 37 KiB of shared memory a CTA: 6 CTAs of 4 warps; a 1024-thread
# CTA holds one row, a 256-thread CTA one per 8 warps). Each radix pass reads the row again
# (software-pipelined a step of 8 x 32 entries ahead; rows of at most W_CACHE entries: the first pass
# keeps the keys in shared memory and the later passes read them there) and histograms the keys in
# [lo, hi] into the W_NB bins of the warp's own shared histogram (8-bit digits: at most 4 passes, 2^32 ->
# 2^24 -> 2^16 -> 2^8 -> 1 keys, [lo, hi] narrowing to the threshold bin intersected with [min, max] of
# the pass's keys in range; it stops once the threshold bin is taken whole or holds one key value), then
# one ordered pass emits the keys above hi and the first kk keys in [lo, hi] with ballots, in ascending
# index order. H200 (bench_results/h200.txt): adding one key at a time (each waiting
# for its shuffle and vote) was 2x slower than batching a step's 8; __match_any_sync aggregation 4-36%
# slower than the shuffle-and-vote one, which in turn lost to plain adds of 1 (see hist_step).
WARP_ROWS = 4  # 8 rows per CTA measured 1-6% slower
WARP_ROW_MAX = 1024  # the longest rows _v3_threads gives a warp (beyond, the tile kernel wins at any batch)
WARP_DIV = 104  # _v3_threads: a warp per row from n / WARP_DIV rows per SM
W_BITS = 8
W_NB = 1 << W_BITS
W_UNROLL = 8  # strips of 32 entries per step: independent loads in flight per lane
# Rows of at most W_CACHE entries keep their keys in shared memory after the first pass (8 KiB a warp): the
# later passes and the ordered pass read them there instead of loading and keying the row again
W_CACHE = 2048
assert W_CACHE % (32 * W_UNROLL) == 0  # whole steps: the first pass stores key 0 past the end too


@tilelang.jit(pass_configs={**PASS_CONFIGS, tilelang.PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True})
def topk_kernel_warp(in_dtype: str = "float32", idx_dtype: str = "int32", off_dtype: str = "int32",
                     with_values: bool = True, with_offset: bool = False, idx_fill: int = -1,
                     val_fill: float = float("-inf"), mode: str = "topk", cand_bs: int = 0, block_c: int = 1,
                     rows_per_cta: int = WARP_ROWS):
    """One warp per row (see WARP_ROWS): the arguments of `topk_kernel_v3` without its cache tier, split and
    thread count; `rows_per_cta` warps per CTA."""
    total = T.dynamic("total", "int64")  # flat scores storage: (b - 1) * ld + n elements
    b, k, nb_end, nb_off, nb_val, kv = T.dynamic("b, k, nb_end, nb_off, nb_val, kv")
    nc, mb = T.dynamic("nc, mb")
    RPC = rows_per_cta
    U = W_UNROLL
    ST = 32 * U  # row entries per step
    BPL = W_NB // 32  # histogram bins per lane in the clear and the scan
    ZERO, KEY_MAX = T.uint32(0), T.uint32(0xFFFFFFFF)
    fills, emit = _lane_macros(in_dtype, idx_dtype, with_values, with_offset, idx_fill, val_fill, mode,
                               cand_bs, block_c, nc, mb, 32)

    @T.macro
    def step_load(scores, kn, base, it, e, lane):
        """kn = the raw bits of step `it` of the row (0 at and past e): the loads of a pipelined read."""
        for u in T.unroll(U):
            kn[u] = T.if_then_else(it * ST + u * 32 + lane < e,
                                   _f32_bits(scores[base + it * ST + u * 32 + lane]), ZERO)

    @T.macro
    def step_keys(scores, kb, kn, base, it, e, lane):
        """Pipelined read: kb = the keys of step `it` (loaded a step earlier into kn; key 0, below every
        real key, at and past e), and the loads of step it + 1 go into kn."""
        for u in T.unroll(U):
            kb[u] = kn[u]
        step_load(scores, kn, base, it + 1, e, lane)
        for u in T.unroll(U):
            # & the sign-extended borrow of i - e (all ones before the end): no branch around the key
            kb[u] = _key(kb[u]) & T.Cast("uint32", T.Cast("int32", it * ST + u * 32 + lane - e) >> 31)

    @T.macro
    def hist_step(kb, bv, mm, lo, hi, sh, s_hist, hb):
        """The histogram adds of a step's U keys per lane: bin (kb[u] - lo) >> sh of the keys in [lo, hi],
        mm = [min, max] of them. Plain predicated adds of 1, which the hardware aggregates per address (see
        v3's hist_add). (Before: a shuffle and a vote per key, one add of 32 where the whole warp hit one bin,
        skipped when no key of the step was in range. H200, us, k = 512, randn / few: 4096 x 2048 71.2 /
        83.0 -> 63.9 / 58.4, 4096 x 1000 36.9 / 44.5 -> 33.7 / 33.9, 1024 x 2048 31.5 / 33.4 -> 30.7 / 27.3;
        equal and sorted rows a little faster too.)"""
        for u in T.unroll(U):
            bv[u] = T.Select(T.And(kb[u] >= lo, kb[u] <= hi), (kb[u] - lo) >> T.Cast("uint32", sh), KEY_MAX)
            mm[0] = T.min(mm[0], T.Select(bv[u] != KEY_MAX, kb[u], KEY_MAX))
            mm[1] = T.max(mm[1], T.Select(bv[u] != KEY_MAX, kb[u], ZERO))
        for u in T.unroll(U):
            if bv[u] != KEY_MAX:
                T.atomic_add(s_hist[hb + T.Cast("int32", bv[u])], 1)

    @T.prim_func
    def kernel(
        scores: T.Tensor((total,), in_dtype),  # [b, n] rows at stride ld, flattened
        end: T.Tensor((nb_end,), "int32"),  # [b] (or [1] dummy when has_end == 0)
        offset: T.Tensor((nb_off,), off_dtype),  # [b] (or [1] dummy)
        cand: T.Tensor((b, nc), "int32"),  # [b, c] candidate blocks (slots mode) or [b, 1] dummy
        table: T.Tensor((b, mb), "int32"),  # [b, max_blocks] block table (slots mode) or dummy
        values: T.Tensor((nb_val, kv), in_dtype),  # [b, k] (or [1, 1] dummy)
        indices: T.Tensor((b, k), idx_dtype),  # [b, k]
        n: T.int32,
        ld: T.int64,
        has_end: T.int32,
    ):
        with T.Kernel(T.ceildiv(b, RPC), threads=RPC * 32) as bx:
            tx = T.get_thread_binding()
            lane = tx % 32
            warp = tx // 32
            row = bx * RPC + warp
            s_hist = T.alloc_shared([RPC * W_NB], "int32")  # the warp's histogram at warp * W_NB
            s_sel = T.alloc_shared([RPC * 4], "int32")  # the warp's selected bin at warp * 4
            s_keys = T.alloc_shared([RPC * W_CACHE], "uint32")  # the warp's row keys (rows <= W_CACHE)
            kb = T.alloc_local([U], "uint32")
            kn = T.alloc_local([U], "uint32")  # raw bits of the next step (loads in flight)
            bv = T.alloc_local([U], "uint32")
            inl = T.alloc_local([U], "int32")
            mm = T.alloc_local([2], "uint32")
            e = T.alloc_var("int32")
            kk = T.alloc_var("int32")
            cnt = T.alloc_var("int32")
            done = T.alloc_var("int32")
            lo = T.alloc_var("uint32")
            hi = T.alloc_var("uint32")
            lo_bin = T.alloc_var("uint32")
            hi_bin = T.alloc_var("uint64")
            sh = T.alloc_var("int32")
            c = T.alloc_var("int32")
            incl = T.alloc_var("int32")
            tmp = T.alloc_var("int32")
            wpre = T.alloc_var("int32")
            h = T.alloc_var("int32")
            lt = T.alloc_var("uint32")
            wcnt = T.alloc_local([1], "int32")  # an ordered-pass step's packed total (_ordered_classes)
            run_def = T.alloc_var("int32")
            run_tie = T.alloc_var("int32")
            d_before = T.alloc_var("int32")
            t_before = T.alloc_var("int32")
            pos = T.alloc_var("int32")
            hb = warp * W_NB
            kw = warp * W_CACHE
            kc = T.alloc_var("int32")  # 1: the first pass keeps the keys in s_keys, later passes read them
            if row < b:  # warp-uniform: every lane below takes part in the warp's intrinsics
                base = T.Cast("int64", row) * ld
                e = n
                if has_end != 0:
                    e = T.max(T.min(end[row], n), 0)  # clamp: a bad end never reads outside the row
                fills(values, indices, row, lane, k, e)
                if e <= k:
                    for q in T.serial(T.ceildiv(e, 32)):
                        if q * 32 + lane < e:
                            emit(scores, offset, cand, table, values, indices, row, base, q * 32 + lane,
                                 q * 32 + lane)
                else:
                    lt = (T.uint32(1) << T.Cast("uint32", lane)) - T.uint32(1)  # lanes below mine
                    kc = T.if_then_else(e <= W_CACHE, 1, 0)
                    kk = k  # lanes still to find among the keys in [lo, hi]
                    lo = T.uint32(1)  # real keys are >= 0x007FFFFF: key 0 marks "no entry"
                    hi = KEY_MAX
                    cnt = 0
                    done = 0
                    for _p in T.serial(4):
                        if done == 0:
                            sh = T.max(0, (32 - W_BITS) - T.Cast("int32", T.clz(hi - lo)))
                            for q in T.unroll(BPL):
                                s_hist[hb + q * 32 + lane] = 0
                            mm[0] = KEY_MAX
                            mm[1] = ZERO
                            T.sync_warp()
                            if T.And(kc != 0, _p > 0):
                                for it in T.serial(T.ceildiv(e, ST)):  # the keys the first pass kept
                                    for u in T.unroll(U):
                                        kb[u] = s_keys[kw + it * ST + u * 32 + lane]
                                    hist_step(kb, bv, mm, lo, hi, sh, s_hist, hb)
                            else:
                                step_load(scores, kn, base, 0, e, lane)
                                for it in T.serial(T.ceildiv(e, ST)):
                                    step_keys(scores, kb, kn, base, it, e, lane)
                                    if kc != 0:  # each lane reads back only its own entries: no sync
                                        for u in T.unroll(U):
                                            s_keys[kw + it * ST + u * 32 + lane] = kb[u]
                                    hist_step(kb, bv, mm, lo, hi, sh, s_hist, hb)
                            T.sync_warp()
                            # the bin of the kk-th largest key: lane l owns bins W_NB-1-BPL*l-j, j < BPL (a
                            # scan in descending bin order); its finder writes [bin, rank in it, keys in it]
                            c = 0
                            for j in T.unroll(BPL):
                                c = c + s_hist[hb + W_NB - 1 - BPL * lane - j]
                            incl = c
                            for o in (1, 2, 4, 8, 16):
                                tmp = T.shfl_up(incl, o)
                                incl = incl + T.if_then_else(lane >= o, tmp, 0)
                            wpre = incl - c  # keys in the bins above mine
                            for j in T.unroll(BPL):
                                h = s_hist[hb + W_NB - 1 - BPL * lane - j]
                                if wpre < kk and kk <= wpre + h:
                                    s_sel[warp * 4] = W_NB - 1 - BPL * lane - j
                                    s_sel[warp * 4 + 1] = kk - wpre
                                    s_sel[warp * 4 + 2] = h
                                wpre = wpre + h
                            mm[0] = _warp_min(mm[0])
                            mm[1] = _warp_max(mm[1])
                            T.sync_warp()
                            lo_bin = lo + (T.Cast("uint32", s_sel[warp * 4]) << T.Cast("uint32", sh))
                            hi_bin = (T.Cast("uint64", lo_bin)
                                      + ((T.uint64(1) << T.Cast("uint64", sh)) - T.uint64(1)))
                            hi = T.Cast("uint32", T.min(T.Cast("uint64", hi), hi_bin))  # 64-bit: no wrap
                            lo = T.max(lo_bin, mm[0])
                            hi = T.min(hi, mm[1])
                            kk = s_sel[warp * 4 + 1]
                            cnt = s_sel[warp * 4 + 2]
                            if T.Or(cnt == kk, lo == hi):
                                done = 1  # the threshold bin is taken whole, or the threshold key is exact
                            T.sync_warp()  # s_hist / s_sel are rewritten by the next pass
                    # ordered pass: keys above hi, and the first kk keys in [lo, hi] (when cnt == kk, every
                    # key >= lo: one ballot per strip); it stops once all k lanes are found
                    run_def = 0
                    run_tie = 0
                    if kc == 0:
                        step_load(scores, kn, base, 0, e, lane)
                    for it in T.serial(T.ceildiv(e, ST)):
                        if run_def + T.min(run_tie, kk) < k:  # warp-uniform
                            if kc != 0:
                                for u in T.unroll(U):
                                    kb[u] = s_keys[kw + it * ST + u * 32 + lane]
                            else:
                                step_keys(scores, kb, kn, base, it, e, lane)
                            _ordered_classes(kb, inl, wcnt, U, lo, hi, cnt, kk, lt)
                            for u in T.unroll(U):
                                d_before = run_def + ((inl[u] & CNT_MASK) & 0xFFFF)
                                t_before = run_tie + ((inl[u] & CNT_MASK) >> 16)
                                if T.Or((inl[u] & CLS_TAKE) != 0,
                                        T.And((inl[u] & CLS_TIE) != 0, t_before < kk)):
                                    pos = d_before + T.min(t_before, kk)
                                    if pos < k:
                                        emit(scores, offset, cand, table, values, indices, row, base, pos,
                                             it * ST + u * 32 + lane)
                            run_def = run_def + (wcnt[0] & 0xFFFF)
                            run_tie = run_tie + (wcnt[0] >> 16)

    return kernel


def _jit_args(*static, split=1, threads=THREADS, stream=False, tile=0) -> tuple:
    """(factory name, positional arguments) of the top-k kernel for these static arguments (the last one is
    the variant; `split`: v3's CTAs per row, `threads`: v3's threads per CTA, 32 for `topk_kernel_warp`, one
    warp per row, which takes no cache tier and no split; `stream`: v3's streaming reads; `tile`: keys a
    thread of `topk_kernel_tile` for rows of one tile, 0 for the others (see _tile_unroll); defaults are
    left out, so the default launch keeps its cache key)."""
    if static[-1] == "v3" and threads == 32:
        assert split == 1 and not tile, "a warp per row is never split"
        return "topk_kernel_warp", static[:3] + static[4:-1]
    if static[-1] == "v3" and tile:
        assert split == 1 and not stream, (split, stream)
        extra = () if (threads, tile) == (THREADS, UNROLL) else (threads, tile)
        return "topk_kernel_tile", static[:3] + static[4:-1] + extra
    if static[-1] == "v3":
        if stream:
            extra = (split, threads, True)
        elif threads != THREADS:
            extra = (split, threads)
        else:
            extra = (split,) if split != 1 else ()
        return "topk_kernel_v3", static[:-1] + extra
    return "topk_kernel", static


def _topk_jit(*static, split=1, threads=THREADS, stream=False, tile=0):
    """The compiled top-k kernel (see _jit_args)."""
    name, args = _jit_args(*static, split=split, threads=threads, stream=stream, tile=tile)
    return {"topk_kernel_v3": topk_kernel_v3, "topk_kernel": topk_kernel,
            "topk_kernel_warp": topk_kernel_warp, "topk_kernel_tile": topk_kernel_tile}[name](*args)


def _v3_split(b: int, n: int, cache_cap: int, sms: int) -> int:
    """CTAs per row for v3 (see CLUSTER_PRELUDE): the most, up to MAX_SPLIT, such that the b rows' CTAs
    take at most half the `sms` SMs (one 1024-thread CTA per SM); 1 for rows that are never sampled
    (n <= capacity). Measured on the H200 (us, randn, k = 2048, split 1 / 4 / 8): 1 x 65536 20.7 / 17.8 /
    17.0, 1 x 131072 25.1 / 18.5 / 17.0, 8 x 262144 40.7 / 26.1 / 23.4, 1 x 1M 109.0 / 59.9 / 49.2, where
    one SM's read of the row is the bound; but 16 x 131072 26.6 / 20.4 / 26.9 and 64 x 32768 at split 1 /
    2 17.3 / 18.6: once the clusters' CTAs pass ~half the SMs the split costs more than it saves."""
    if n <= _v3_cand_cap(cache_cap):
        return 1
    split = MAX_SPLIT
    while split > 1 and b * split > sms // 2:
        split //= 2
    return split


def _v3_threads(b: int, n: int, cache_cap: int, sms: int) -> int:
    """Threads per CTA for v3 (one CTA per row), or 32: one warp per row (`topk_kernel_warp`).

    A warp per row when rows are at most WARP_ROW_MAX entries and there are at least n / WARP_DIV of them per
    SM (b * WARP_DIV >= n * sms): a warp does a row's whole search without a block barrier and an SM holds 24
    rows at a time, but it re-reads its row (or its key cache) in every radix pass, so it pays only with many
    rows. Since one-tile rows got `topk_kernel_tile` (256 threads for the short tier), the warp wins only on
    rows of about 1000 entries and fewer, from about 1300 of them (H200, k = 512 unless said, us, warp /
    tile256, randn and few: 4096 x 2048 63.8 / 42.0 and 58.4 / 58.0; 4096 x 4096 151 / 74 and 125 / 85;
    1024 x 2048 30.4 / 14.9; 4096 x 1000 33.7 / 37.1 and 33.9 / 55.1; 1536 x 1000 18.4 / 17.6 and
    18.1 / 24.2; 1024 x 1000 17.0 / 13.6 and 16.6 / 18.0; 768 x 600 13.7 / 12.0 and 12.7 / 14.5; 1024 x 600
    14.4 / 13.9 and 12.9 / 17.5; 1024 x 1024 k 256 18.6 / 14.2 and 16.6 / 17.8; tools/ab_topk.py with
    WARP_ROW_MAX=0): WARP_DIV puts the crossover at 1270 rows of 1000 entries and 760 of 600 on 132 SMs.
    (Before the tile kernel the warp took rows up to 4096 entries from n / 320 rows per SM: 4096 x 1000 93 ->
    38 us, 4096 x 2048 115 -> 69 us against v3's CTA.)
    Else SHORT_ROW_THREADS for rows of the short tier (<= 4096 entries) when there are more rows than SMs,
    else THREADS. Three 256-thread CTAs share an SM. H200, randn, k = 512, us at 1024 / 256 threads (v3,
    before the tile kernel): 4096 x 2048 355 / 145, 1024 x 2048 93 / 44, 264 x 2048 26 / 16; but 4096 x
    8192 395 / 398 and 264 x 8192 29 / 31 (longer rows: 1024 is as fast or faster; 512 threads never won).
    The tile kernel runs on either (see _v3_launch)."""
    if n <= WARP_ROW_MAX and b * WARP_DIV >= n * sms:
        return 32
    return SHORT_ROW_THREADS if cache_cap == SMALL_CACHE and b > sms else THREADS


_PROPS = {}


def _props(device):
    """The device's properties, looked up once per device (the launch choice reads them on every call)."""
    if device not in _PROPS:
        _PROPS[device] = torch.cuda.get_device_properties(device)
    return _PROPS[device]


def _sm_count(device) -> int:
    return _props(device).multi_processor_count


def _l2_bytes(device) -> int:
    return _props(device).L2_cache_size


def _v3_launch(b: int, n: int, sms: int, itemsize: int = 4, l2_bytes: int = 0) -> dict:
    """v3's launch shape for b rows of n entries (`itemsize` bytes each) on `sms` SMs and an L2 of `l2_bytes`:
    {"split": CTAs per row, "threads": per CTA, 32 for one warp per row} (a split row keeps the full CTA),
    and "stream": True for unsplit rows of the uncached tier when the launch reads at least
    STREAM_L2_FRACTION of the L2 (see STREAM_PRELUDE)."""
    cap = _cache_cap(n)
    split = _v3_split(b, n, cap, sms)
    launch = {"split": split, "threads": _v3_threads(b, n, cap, sms) if split == 1 else THREADS}
    if (cap == 0 and split == 1 and launch["threads"] == THREADS
            and l2_bytes > 0 and b * n * itemsize >= STREAM_L2_FRACTION * l2_bytes):
        launch["stream"] = True
    unroll = _tile_unroll(n, launch["threads"])
    if (TILE_ROWS and split == 1 and unroll  # (streamed rows are uncached: never one tile)
            and (launch["threads"] == THREADS or (TILE_SHORT and launch["threads"] == SHORT_ROW_THREADS))):
        launch["tile"] = unroll
    return launch


def _launch(b: int, n: int, device, itemsize: int = 4) -> dict:
    """The launch shape the wrappers use on this device (_v3_launch under the default variant)."""
    if TOPK_VARIANT != "v3":
        return {"split": 1, "threads": THREADS}
    return _v3_launch(b, n, _sm_count(device), itemsize, _l2_bytes(device))


_DUMMY = {}


def _dummy(device, dtype, shape=(1,)):
    key = (device, dtype, shape)
    if key not in _DUMMY:
        _DUMMY[key] = torch.zeros(shape, dtype=dtype, device=device)
    return _DUMMY[key]


def _flat_scores(scores):
    """The [b, n] rows (unit column stride, any row stride) as one flat view + the row stride."""
    b, n = scores.shape
    if n > 1 and scores.stride(1) != 1:
        raise ValueError(f"scores must have unit column stride, got {scores.stride()}")
    if b == 0 or n == 0:
        return scores.new_zeros(1), 0  # nothing is read: every row has end = 0
    ld = scores.stride(0) if b > 1 else n
    return scores.as_strided(((b - 1) * ld + n,), (1,)), ld


def _cache_cap(n: int) -> int:
    """Shared key cache size for rows of n entries: three tiers, so few kernel variants compile."""
    if n > MAX_CACHE:
        return 0
    return SMALL_CACHE if n <= SMALL_CACHE else MAX_CACHE


def topk(scores, k, *, end=None, sorted=False, sorted_index=False, indices_type=torch.int32,
         idx_oob_fill_value=-1, value_oob_fill_value=float("-inf"), output_idx_offset=None,
         return_value=True):
    """Per row: the min(k, end) best of scores[row, :end] (NaN highest, ties to lower index).

    scores: [b, n] fp32/bf16 (unit column stride); end: [b] int32; output_idx_offset: [b] int32/int64.
    Returns (values [b, k] or None, indices [b, k] indices_type); unsorted output is ascending index.
    """
    b, n = check_topk_args(scores, k, end, sorted=sorted, sorted_index=sorted_index,
                           indices_type=indices_type, output_idx_offset=output_idx_offset,
                           return_value=return_value)
    dev = check_cuda(scores=scores, end=end, output_idx_offset=output_idx_offset)
    if debug_checks_enabled():
        check_end_values(end, n)
    need_values = return_value or sorted
    end = end.contiguous() if end is not None else None  # the kernel reads them with unit stride
    output_idx_offset = output_idx_offset.contiguous() if output_idx_offset is not None else None
    values = torch.empty((b, k), dtype=scores.dtype, device=dev) if need_values else None
    indices = torch.empty((b, k), dtype=indices_type, device=dev)
    if b == 0:
        return (values if return_value else None), indices
    flat, ld = _flat_scores(scores)
    off_dtype = output_idx_offset.dtype if output_idx_offset is not None else torch.int32
    kern = _topk_jit(_TORCH_TO_TL[scores.dtype], _TORCH_TO_TL[indices_type], _TORCH_TO_TL[off_dtype],
                     _cache_cap(n), need_values, output_idx_offset is not None, int(idx_oob_fill_value),
                     float(value_oob_fill_value), "topk", 0, 1, TOPK_VARIANT,
                     **_launch(b, n, dev, scores.element_size()))
    kern(flat, end if end is not None else _dummy(dev, torch.int32),
         output_idx_offset if output_idx_offset is not None else _dummy(dev, off_dtype),
         _dummy(dev, torch.int32, (b, 1)), _dummy(dev, torch.int32, (b, 1)),
         values if need_values else _dummy(dev, scores.dtype, (1, 1)), indices,
         n, ld, int(end is not None))
    if sorted:
        values, indices = _sort_by_value(values, indices, end, n, k)
    return (values if return_value else None), indices


def _sort_by_value(values, indices, end, n, k):
    """Stable descending sort of the (ascending-index) k lanes on the order key: ties keep the lower
    index first, fills (beyond the valid count) stay last."""
    from reference.topk import order_key

    b = values.shape[0]
    ends = torch.full((b,), n, device=values.device) if end is None else end.long().clamp(0, n)
    valid = torch.arange(k, device=values.device)[None, :] < ends.clamp(max=k)[:, None]
    key = torch.where(valid, order_key(values), torch.full_like(indices, -1, dtype=torch.int64))
    order = torch.sort(key, dim=1, descending=True, stable=True).indices
    return values.gather(1, order), indices.gather(1, order)


def topk_to_slots(scores, k, *, end=None, candidate_blocks=None, candidate_block_size=None,
                  block_size_c, block_tables):
    """One launch: topk indices (ascending local index) -> candidate restore (optional) -> slots,
    slot(j) = block_tables[r, j // Bc] * Bc + j % Bc; lanes beyond min(k, end) are -1.

    scores: [b, n] fp32/bf16 (compact candidate rows when candidate_blocks is given); end: [b] int32;
    candidate_blocks: [b, c] int32; block_tables: [b, max_blocks] int32. Returns slots [b, k] int32.
    A row or block the table cannot resolve gives -1 (TILELANG_OPS_DEBUG=1 raises instead).
    """
    b, n = check_topk_to_slots_args(scores, k, end, candidate_blocks, candidate_block_size,
                                    block_size_c, block_tables)
    dev = check_cuda(scores=scores, end=end, candidate_blocks=candidate_blocks, block_tables=block_tables)
    if debug_checks_enabled():
        from reference.topk import topk_to_slots_ref

        # the reference runs every value check (end range, candidate range, table range)
        topk_to_slots_ref(scores, k, end=end, candidate_blocks=candidate_blocks,
                          candidate_block_size=candidate_block_size, block_size_c=block_size_c,
                          block_tables=block_tables)
    slots = torch.empty((b, k), dtype=torch.int32, device=dev)
    end = end.contiguous() if end is not None else None
    if b == 0:
        return slots
    flat, ld = _flat_scores(scores)
    cand_bs = candidate_block_size or 0
    kern = _topk_jit(_TORCH_TO_TL[scores.dtype], "int32", "int32", _cache_cap(n), False, False, -1,
                     float("-inf"), "slots", cand_bs, block_size_c, TOPK_VARIANT,
                     **_launch(b, n, dev, scores.element_size()))
    cand = candidate_blocks if candidate_blocks is not None else _dummy(dev, torch.int32, (b, 1))
    kern(flat, end if end is not None else _dummy(dev, torch.int32), _dummy(dev, torch.int32), cand,
         block_tables, _dummy(dev, scores.dtype, (1, 1)), slots, n, ld, int(end is not None))
    return slots


ELEM_THREADS = 256


@tilelang.jit
def block_max_kernel(block_size: int, in_dtype: str = "float32"):
    """out[r, j] = max over valid entries of block j (first NaN wins; -inf when none)."""
    b, total, nblk, nb_end = T.dynamic("b, total, nblk, nb_end")
    NEG_INF = -T.infinity("float32")

    @T.prim_func
    def kernel(
        scores: T.Tensor((total,), in_dtype),  # [b, n] rows at stride ld, flattened
        end: T.Tensor((nb_end,), "int32"),  # [b] (or [1] dummy when has_end == 0)
        out: T.Tensor((b, nblk), in_dtype),  # [b, ceil(n / block_size)]
        n: T.int32,
        ld: T.int32,
        has_end: T.int32,
    ):
        with T.Kernel(T.ceildiv(nblk, ELEM_THREADS), b, threads=ELEM_THREADS) as (bx, row):
            tx = T.get_thread_binding()
            e = T.alloc_var("int32")
            best = T.alloc_var("float32")
            v = T.alloc_var("float32")
            raw = T.alloc_var(in_dtype)
            best_raw = T.alloc_var(in_dtype)  # the chosen element itself: its bits are copied out
            is_nan = T.alloc_var("int32")
            blk = bx * ELEM_THREADS + tx
            e = n
            if has_end != 0:
                e = T.max(T.min(end[row], n), 0)
            best = NEG_INF
            best_raw = T.Cast(in_dtype, NEG_INF)
            is_nan = 0
            if blk < nblk:
                for q in T.serial(block_size):
                    i = blk * block_size + q
                    if T.And(i < e, is_nan == 0):
                        raw = scores[row * ld + i]
                        v = T.Cast("float32", raw)  # exact widening, compares only
                        if (T.reinterpret(v, "uint32") & T.uint32(0x7FFFFFFF)) > T.uint32(0x7F800000):
                            best_raw = raw  # the first NaN wins with its exact bits (a float round
                            is_nan = 1  # trip would canonicalize a bf16 NaN)
                        elif T.Or(q == 0, v > best):  # first of equal maxima (-0.0 vs +0.0)
                            best = v
                            best_raw = raw
                out[row, blk] = best_raw

    return kernel


def block_max_scores(scores, block_size, end=None):
    """out[r, j] = max(scores[r, i] for i in block j, i < end[r]); -inf if none; NaN if any is NaN.

    scores: [b, n] fp32/bf16; end: [b] int32 or None. Returns [b, ceil(n / block_size)] scores.dtype.
    """
    b, n = check_block_max_args(scores, block_size, end)
    dev = check_cuda(scores=scores, end=end)
    if debug_checks_enabled():
        check_end_values(end, n)
    nblk = (n + block_size - 1) // block_size
    out = torch.empty((b, nblk), dtype=scores.dtype, device=dev)
    end = end.contiguous() if end is not None else None
    if b == 0 or nblk == 0:
        return out
    flat, ld = _flat_scores(scores)
    if flat.numel() >= 2**31:
        raise ValueError(f"block_max_scores supports < 2^31 score elements, got {flat.numel()}")
    block_max_kernel(block_size, _TORCH_TO_TL[scores.dtype])(
        flat, end if end is not None else _dummy(dev, torch.int32), out, n, ld, int(end is not None))
    return out


@tilelang.jit
def restore_kernel(block_size: int):
    """In place: i -> blocks[r, i // bs] * bs + i % bs; -1 (or an unresolvable lane) -> -1."""
    b, k, c = T.dynamic("b, k, c")

    @T.prim_func
    def kernel(
        index: T.Tensor((b, k), "int32"),  # [b, k] compact offsets, rewritten in place
        blocks: T.Tensor((b, c), "int32"),  # [b, c] candidate block ids
    ):
        with T.Kernel(T.ceildiv(k, ELEM_THREADS), b, threads=ELEM_THREADS) as (bx, row):
            tx = T.get_thread_binding()
            lane = bx * ELEM_THREADS + tx
            i = T.alloc_var("int32")
            blk = T.alloc_var("int32")
            if lane < k:
                i = index[row, lane]
                if i >= 0:
                    blk = -1
                    if i // block_size < c:
                        blk = blocks[row, i // block_size]
                    index[row, lane] = T.if_then_else(blk < 0, -1, blk * block_size + i % block_size)
                else:
                    index[row, lane] = -1

    return kernel


def restore_candidate_indices_(index, candidate_blocks, block_size):
    """In place: local i -> candidate_blocks[r, i // bs] * bs + i % bs; -1 stays -1 (and a lane
    beyond the candidates or in a negative block becomes -1). index: [b, k] int32;
    candidate_blocks: [b, c] int32. Returns index."""
    b, k, _ = check_restore_args(index, candidate_blocks, block_size)
    check_cuda(index=index, candidate_blocks=candidate_blocks)
    if debug_checks_enabled():
        check_restore_values(index, candidate_blocks, block_size)
    if b and k:
        restore_kernel(block_size)(index, candidate_blocks)
    return index


@tilelang.jit
def convert_kernel(block_size_c: int):
    """In place: slot(j) = table[r, j // Bc] * Bc + j % Bc for lanes < valid_len holding j >= 0."""
    b, L, k, mb = T.dynamic("b, L, k, mb")

    @T.prim_func
    def kernel(
        index: T.Tensor((b, L, k), "int32"),  # [b, L, k] logical rows, rewritten in place
        valid_lens: T.Tensor((b, L), "int32"),  # [b, L]
        table: T.Tensor((b, mb), "int32"),  # [b, max_blocks]
    ):
        with T.Kernel(T.ceildiv(k, ELEM_THREADS), L, b, threads=ELEM_THREADS) as (bx, t, row):
            tx = T.get_thread_binding()
            lane = bx * ELEM_THREADS + tx
            j = T.alloc_var("int32")
            tb = T.alloc_var("int32")
            if lane < k:
                j = index[row, t, lane]
                tb = -1
                if T.And(T.And(lane < valid_lens[row, t], j >= 0), j // block_size_c < mb):
                    tb = table[row, j // block_size_c]
                index[row, t, lane] = T.if_then_else(tb < 0, -1, tb * block_size_c + j % block_size_c)

    return kernel


def convert_kv_index_(index, block_size_c, valid_lens, block_tables):
    """In place: slot(j) = block_tables[r, j // Bc] * Bc + j % Bc for lanes < valid_lens[r, t] holding
    j >= 0; every other lane becomes -1. index: [b, L, k] int32; valid_lens: [b, L] int32;
    block_tables: [b, max_blocks] int32. Returns index."""
    b, L, k, _ = check_convert_args(index, block_size_c, valid_lens, block_tables)
    check_cuda(index=index, valid_lens=valid_lens, block_tables=block_tables)
    if debug_checks_enabled():
        check_convert_values(index, block_size_c, valid_lens, block_tables)
    if b and L and k:
        convert_kernel(block_size_c)(index, valid_lens, block_tables)
    return index


QUICK_BUILD = ("topk fp32 uncached v1", "topk fp32 uncached split8", "topk fp32 uncached stream",
               "topk bf16 int64+offset cache4096", "topk_to_slots fp32 cand16 Bc64",
               "topk fp32 cache32768 split2", "topk fp32 cache32768 threads512", "topk warp bf16",
               "topk tile bf16", "topk tile256x16", "block_max", "restore", "convert")


def build_configs() -> list[tuple]:
    """(name, factory, static arguments) of every kernel configuration the build check compiles."""
    # (name, static arguments without the variant): the default variant gets every code path, the other
    # variants the two big tiers (uncached rows, the 32768 row cache)
    paths = [
        ("topk fp32 uncached", ("float32", "int32", "int32", 0, True, False, -1, float("-inf"), "topk", 0,
                                1)),
        ("topk fp32 cache32768", ("float32", "int32", "int32", 32768, True, False, -1, float("-inf"), "topk",
                                  0, 1)),
        ("topk bf16 int64+offset cache4096", ("bfloat16", "int64", "int64", 4096, True, True, -1,
                                              float("-inf"), "topk", 0, 1)),
        ("topk fp32 indices-only fills", ("float32", "int32", "int32", 32768, False, False, -5, 0.0, "topk",
                                          0, 1)),
        ("topk_to_slots fp32 cand16 Bc64", ("float32", "int32", "int32", 0, False, False, -1, float("-inf"),
                                            "slots", 16, 64)),
        ("topk_to_slots bf16 Bc64 cache4096", ("bfloat16", "int32", "int32", 4096, False, False, -1,
                                               float("-inf"), "slots", 0, 64)),
    ]
    configs = []
    for variant in (TOPK_VARIANT,) + tuple(v for v in VARIANTS if v != TOPK_VARIANT):
        for name, static in paths if variant == TOPK_VARIANT else paths[:2]:
            factory = topk_kernel_v3 if variant == "v3" else topk_kernel
            configs.append((f"{name} {variant}", factory, static if variant == "v3" else static + (variant,)))
    # v3 rows split over a cluster (CLUSTER_PRELUDE): the decode tier, the uncached tier, the fused slots
    for name, static, split in ((paths[1][0], paths[1][1], 2), (paths[0][0], paths[0][1], 8),
                                (paths[4][0], paths[4][1], 4)):
        configs.append((f"{name} split{split}", topk_kernel_v3, static + (split,)))
    # v3's streaming reads (large launches of uncached rows, _v3_launch; in the quick build it stands for the
    # uncached v3 kernel, which differs only in the compaction's loads)
    configs.append((f"{paths[0][0]} stream", topk_kernel_v3, paths[0][1] + (1, THREADS, True)))
    # v3 with fewer threads per CTA (many short rows, _v3_threads): the short tier, the decode tier
    for name, static, threads in ((paths[2][0], paths[2][1], 256), (paths[1][0], paths[1][1], 512)):
        configs.append((f"{name} threads{threads}", topk_kernel_v3, static + (1, threads)))
    # one warp per row (many short rows, _v3_threads): plain scores, bf16 with offsets, the fused slots
    for name, static in (("topk warp fp32", paths[0][1]), ("topk warp bf16 int64+offset", paths[2][1]),
                         ("topk_to_slots warp fp32 cand16 Bc64", paths[4][1])):
        configs.append((name, topk_kernel_warp, _jit_args(*static, "v3", threads=32)[1]))
    # rows of one tile (_v3_launch): plain scores, bf16 with offsets, the fused slots on 1024 threads; the
    # short tier's rows on 256 threads, 16 keys a thread
    for name, static, threads, unroll in (
            ("topk tile fp32", paths[0][1], THREADS, UNROLL),
            ("topk tile bf16 int64+offset", paths[2][1], THREADS, UNROLL),
            ("topk_to_slots tile fp32 cand16 Bc64", paths[4][1], THREADS, UNROLL),
            ("topk tile256x16 bf16 int64+offset", paths[2][1], SHORT_ROW_THREADS, TILE_MAX_UNROLL)):
        configs.append((name, topk_kernel_tile, _jit_args(*static, "v3", threads=threads, tile=unroll)[1]))
    configs += [
        ("block_max bs16 fp32", block_max_kernel, (16, "float32")),
        ("block_max bs8 bf16", block_max_kernel, (8, "bfloat16")),
        ("restore bs16", restore_kernel, (16,)),
        ("convert Bc64", convert_kernel, (64,)),
    ]
    return configs


def build_all(quick: bool = False, workers: int | None = None) -> list[str]:
    """Compile every kernel for sm_90a at several static configurations (CPU build check), in ``workers``
    processes (default one per CPU). quick: one configuration per code path (the CPU test tier; `make diff`
    builds them all)."""
    from tilelang_ops.build import compile_sm90_in_processes

    names = [name for name, _, _ in build_configs() if not quick or name.startswith(QUICK_BUILD)]
    return compile_sm90_in_processes(__name__, names, workers)
