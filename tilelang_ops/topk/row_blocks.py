"""Constants and building blocks of the row kernel (`row.row_kernel`): the row reads, the histogram and
bin selection, block [min, max] and the cluster helpers, as macros over one launch's threads / split /
stream.

The algorithm (exact and deterministic; the key is macros._key, the same as reference.topk.order_key):
* Rows above the candidate capacity sample a lower bound `thr` of the threshold (the k-th largest key)
  from runs of 32 entries spread over the row; then ONE read of the row compacts the keys >= thr into a
  shared list in any order (one shared counter add per warp and tile, no ordered scans, no per-tile
  barrier) and counts them exactly together with their [min, max]. With >= k of them the threshold lies
  in [min, max], so all-equal and few-distinct rows are done at once (min == max). Rows up to the
  capacity are compacted whole.
* Radix select on the key: the threshold lies in [lo, hi]; each pass histograms (key - lo) >> sh of the
  keys in [lo, hi] into ROW_NB bins (plain shared adds of 1, which the hardware aggregates per address),
  a block scan finds the threshold bin, and [lo, hi] becomes that bin intersected with [min, max] of the
  keys in range. The passes run on the list (<= capacity keys) or, when it overflowed or the bound was
  too high, on the row (compacting once the keys >= lo fit). Once the threshold bin holds at most ROW_RES
  keys they are gathered and each is ranked against all to find the kk-th largest with its multiplicity.
* Final lanes: over the list, per window of ROW_BMW * 32 indices, bitmaps of the taken and tied indices
  and a block scan of their word popcounts give each winner its ascending-index lane (taken before +
  min(ties before, kk)); over the row, the ordered pass stops once all k lanes are found. Rows of at most
  one tile keep their keys in registers through the passes and the ordered pass.
* A split row (a cluster of `split` CTAs, see ptx.CLUSTER_PRELUDE): each CTA draws the same sample (the
  same thr, no talking), compacts its share of the row's tiles into its own list, the others copy theirs
  into the lead's list through distributed shared memory, one cluster barrier, then the lead goes on alone.
* A warp owns UNROLL * 32 consecutive entries of a tile, so an ordered scan needs one count per warp and
  one cross-warp scan per tile; row reads are software-pipelined (tile it + 1 in flight while tile it is
  processed); the compaction read has no bounds checks on full tiles; warp reductions are REDUX.
"""

import tilelang.language as T

from tilelang_ops.topk.macros import (
    PASSES,
    UNROLL,
    _f32_bits,
    _key,
    _warp_incl,
    _warp_max,
    _warp_min,
    _warp_sum,
)

# Bitmap words per class (taken / tie): ranks are computed over windows of 131072 indices (32 KiB of
# bitmaps, word prefixes in s_hist, which has as many entries), so rows up to 131072 take one window.
ROW_BMW = 4096
# Sample runs of 32 per warp for rows of the 32768 tier (2048 entries at 1024 threads, 1/16 to 1/4 of the
# row: fewer or more runs are no faster); uncached rows take UNROLL runs (8192 entries).
ROW_SAMPLE_SHORT = 2
# The sampled bound thr is the lower edge of the ROW_NB-bin histogram bin of the sample's kt-th largest key,
# kt = mu + ROW_SAMPLE_SD * sqrt(mu) + ROW_SAMPLE_PAD with mu = k * sample / row the expected sample count
# above the threshold (binomial sd ~ sqrt(mu)): the row's keys >= thr number fewer than k (then the radix
# passes read the row: slower, still exact) with probability ~3e-6 on i.i.d. scores. A tighter bound means
# fewer compaction stores and a shorter list.
ROW_SAMPLE_SD = 4.5
ROW_SAMPLE_PAD = 8
# The bins span the sample's [min, max]: 2^20 keys each on randn (whose sample spans both signs), so a
# bin's lower edge can sit well below the kt-th sample key, and a long row multiplies that slack by row /
# sample (at 1M entries and k = 2048 the list would overflow in about a third of randn rows). So when the
# sample keys >= the edge, scaled to the row, could pass half the capacity, the sample keys of that one
# bin are histogrammed again over their own [min, max] (ROW_NB sub-bins), and thr becomes the lower edge of
# the sub-bin of the same kt-th key. The sample and so the choice are the same in every CTA of a split row.
ROW_ROUNDS = PASSES + 2  # first compaction, <= 3 radix passes, at most one fallback compaction
ROW_BITS = 12  # radix digit of the passes: 2^32 -> 2^20 -> 2^8 -> 1 keys
ROW_NB = 1 << ROW_BITS
assert ROW_BMW <= ROW_NB, "the rank's word prefixes live in s_hist"
# The pre-binned list: on one CTA a row, the compaction's pass that keys its list also histograms it, over
# ROW_NB bins from thr spanning ROW_PREBIN_SPAN times the sample's keys above thr (the last bin holds every
# key beyond); the first radix pass over the list then only selects the bin, which saves it a clear, a
# read of the list and two barriers.
ROW_PREBIN_SPAN = 2
# A threshold bin of at most this many keys is ranked directly (every key against every other, one warp
# per 32 keys) instead of by more radix passes (a pass costs several times more).
ROW_RES = 256
ROW_RES_STEP = 4  # keys compared per step of the rank loop (the gather pads to a multiple with key 0)


def row_blocks(threads: int, split: int, stream: bool) -> tuple:
    """The row kernel's helpers and macros for CTAs of `threads` threads, `split` CTAs per row and the
    streaming reads on or off, in the order row.py unpacks them."""
    NT = threads  # threads per CTA
    NW = NT // 32  # warps
    TL = NT * UNROLL  # row entries per tile
    BPT = ROW_NB // NT  # histogram bins per thread in the clear and the scan
    S = split
    ZERO, KEY_MAX, NO_BIN = T.uint32(0), T.uint32(0xFFFFFFFF), T.uint32(0xFFFFFFFF)

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
        (concentrated or few-valued keys) need no vote, and no add sits in a branch region of its own."""
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
        ROW_NB-1-BPT*t-j, j < BPT, a block scan runs in descending bin order, and the owner writes
        s_sel = [bin, rank - keys in the bins above it, keys in it] (read after the caller's barrier)."""
        c = T.alloc_var("int32")
        incl = T.alloc_local([1], "int32")
        tmp = T.alloc_var("int32")
        wpre = T.alloc_var("int32")
        h = T.alloc_var("int32")
        c = 0
        for j in T.unroll(BPT):
            c = c + s_hist[ROW_NB - 1 - BPT * tx - j]
        warp_scan(c, incl, s_scan, lane, warp)
        T.sync_threads()
        tmp = T.if_then_else(lane < warp, s_scan[0, lane], 0)
        tmp = _warp_sum(tmp)
        wpre = tmp + incl[0] - c  # keys in bins above my bins
        for j in T.unroll(BPT):
            h = s_hist[ROW_NB - 1 - BPT * tx - j]
            if wpre < rank and rank <= wpre + h:
                s_sel[0] = ROW_NB - 1 - BPT * tx - j
                s_sel[1] = rank - wpre
                s_sel[2] = h
            wpre = wpre + h

    return (lin, per_warp, lead_only, st_lead, cluster, raw, load_tile, next_keys, hist_add, hist_key,
            warp_scan, publish_min_max, gather_min_max, min_max_and_clear, select_bin)
