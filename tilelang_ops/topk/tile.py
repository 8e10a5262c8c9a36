"""The tile kernel: exact top-k of rows of at most one tile, one CTA per row, keys in registers."""

import tilelang
import tilelang.language as T

from tilelang_ops.topk.macros import (
    CLS_TAKE,
    CNT_MASK,
    KERNEL_PASS_CONFIGS,
    PASSES,
    THREADS,
    UNROLL,
    _f32_bits,
    _key,
    _lane_macros,
    _ordered_classes,
    _warp_incl,
    _warp_max,
    _warp_min,
    _warp_sum,
)

# Rows of at most one tile (end <= threads * unroll) are bound by instruction issue, not by memory or
# barriers, so this kernel does only what they need: the keys stay in registers; [min, max] from one
# barrier; up to three radix passes (TILE_BITS digits over [lo, hi], a key in range by one unsigned compare)
# into two alternating histograms, so a pass clears the one after next and needs two barriers: one after
# its adds, one after its warps published their chunk totals; every warp then finds the threshold bin
# itself (a scan of the warp totals, then of the chosen chunk's bins), so no selection is written and read
# back; then the ordered pass (_ordered_classes: keys above hi, the first kk keys in [lo, hi], ascending
# index order). A search ends when the threshold bin is taken whole (cnt == kk) or is one key (then kk of
# its ties go).
TILE_BITS = 11  # three passes cover 32 bits; fewer bins to clear and scan per pass than 12


@tilelang.jit(pass_configs=KERNEL_PASS_CONFIGS)
def tile_kernel(in_dtype: str = "float32", idx_dtype: str = "int32", off_dtype: str = "int32",
                with_values: bool = True, with_offset: bool = False, idx_fill: int = -1,
                val_fill: float = float("-inf"), mode: str = "topk", cand_bs: int = 0, block_c: int = 1,
                threads: int = THREADS, unroll: int = UNROLL):
    """Per row of at most threads * unroll entries: the min(k, end) best in ascending index order.

    The static arguments of `row_kernel` without its cache tier, split and streaming, then `threads` a CTA
    and `unroll` keys a thread."""
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
            s_tot = T.alloc_shared([NW], "int32")  # a pass's chunk totals
            # the ordered pass's packed warp counts: their own array, since a warp writes its count while
            # slower warps may still read the last pass's chunk totals (no barrier between the two)
            s_ord = T.alloc_shared([NW], "int32")
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
                    s_ord[warp] = wcnt[0]
                T.sync_threads()
                c = _warp_sum(T.if_then_else(lane < warp, s_ord[lane], 0))  # packed counts, warps before
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
