"""The row kernel: exact top-k of rows of any length, one CTA (or a cluster of CTAs) per row."""

import tilelang
import tilelang.language as T

from tilelang_ops.topk.macros import (
    CLS_TAKE,
    CLS_TIE,
    CNT_MASK,
    KERNEL_PASS_CONFIGS,
    THREADS,
    TIE,
    UNROLL,
    WARPS,
    _key,
    _lane_macros,
    _ordered_classes,
    _warp_incl,
    _warp_sum,
    cand_cap,
)
from tilelang_ops.topk.ptx import CLUSTER_PRELUDE, STREAM_PRELUDE
from tilelang_ops.topk.row_blocks import (
    ROW_BITS,
    ROW_BMW,
    ROW_NB,
    ROW_PREBIN_SPAN,
    ROW_RES,
    ROW_RES_STEP,
    ROW_ROUNDS,
    ROW_SAMPLE_PAD,
    ROW_SAMPLE_SD,
    ROW_SAMPLE_SHORT,
    row_blocks,
)


@tilelang.jit(pass_configs=KERNEL_PASS_CONFIGS)
def row_kernel(in_dtype: str = "float32", idx_dtype: str = "int32", off_dtype: str = "int32",
               cache_cap: int = 0, with_values: bool = True, with_offset: bool = False,
               idx_fill: int = -1, val_fill: float = float("-inf"), mode: str = "topk",
               cand_bs: int = 0, block_c: int = 1, split: int = 1, threads: int = THREADS,
               stream: bool = False):
    """Per row: the min(k, end) best of scores[row, :end] in ascending index order (ties to lower index).

    mode "topk": indices (+ values, + offset); mode "slots": indices -> candidate restore (cand_bs > 0) ->
    physical slots through the block table, in the epilogue. cache_cap: the row tier (0, SMALL_CACHE or
    MAX_CACHE, launch.cache_tier); split: CTAs per row, a cluster when > 1 (see CLUSTER_PRELUDE); threads
    per CTA; stream: the compaction reads the row with the L2 evict-first policy (see STREAM_PRELUDE)."""
    total = T.dynamic("total", "int64")  # flat scores storage: (b - 1) * ld + n elements
    b, k, nb_end, nb_off, nb_val, kv = T.dynamic("b, k, nb_end, nb_off, nb_val, kv")
    nc, mb = T.dynamic("nc, mb")
    NT = threads  # threads per CTA
    NW = NT // 32  # warps
    TL = NT * UNROLL  # row entries per tile
    BPT = ROW_NB // NT  # histogram bins per thread in the clear and the scan
    cap = cand_cap(cache_cap)  # candidate slots
    su = UNROLL if cache_cap == 0 else ROW_SAMPLE_SHORT  # sample runs of 32 entries per thread
    ssz = NT * su  # sample size
    bmw = ROW_BMW if cache_cap == 0 else cache_cap // 32  # bitmap words per class: the row tiers need one
    win = bmw * 32  # indices per rank window
    wpt = max(1, bmw // NT)  # bitmap words per thread in the rank scan
    ZERO, KEY_MAX, NO_BIN = T.uint32(0), T.uint32(0xFFFFFFFF), T.uint32(0xFFFFFFFF)
    NEG_INF_BITS = T.uint32(0xFF800000)
    S = split
    assert S in (1, 2, 4, 8), split
    prelude = (STREAM_PRELUDE if stream else "") + (CLUSTER_PRELUDE if S > 1 else "") or None
    # fewer threads only for one CTA per row (the split's block move holds cap / NT entries per thread);
    # the rank step needs a warp per 32 of its ROW_RES keys
    assert NT in (256, 512, 1024) and (S == 1 or NT == THREADS) and NW * 32 >= ROW_RES, (threads, split)

    (lin, per_warp, lead_only, st_lead, cluster, raw, load_tile, next_keys, hist_add, hist_key, warp_scan,
     publish_min_max, gather_min_max, min_max_and_clear, select_bin) = row_blocks(NT, S, stream)

    fills, emit = _lane_macros(in_dtype, idx_dtype, with_values, with_offset, idx_fill, val_fill, mode,
                               cand_bs, block_c, nc, mb, NT)

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
            s_hist = T.alloc_shared([ROW_NB], "int32")  # radix histogram; in the final rank: word prefixes
            s_scan = T.alloc_shared([2, WARPS], "int32")  # a value per warp (per_warp)
            s_sel = T.alloc_shared([4], "int32")
            s_small = T.alloc_shared([ROW_RES], "uint32")  # the <= ROW_RES keys of a small threshold bin
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
            resolve = T.alloc_var("int32")  # 1: the next round ranks the <= ROW_RES keys of [lo, hi] directly
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
            # the list's histogram (see ROW_PREBIN_SPAN): > 0 its shift + 1, -1 a cleared histogram, 0 neither
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
                # warp to have read this one, one barrier less)
                min_max_and_clear(kmin, kmax, mm, s_mm0, s_hist, tx, lane, warp)
                pre = -1  # the first radix pass finds its histogram cleared
                lo = mm[0]
                hi = mm[1]
                done = T.if_then_else(lo == hi, 1, 0)
                src = 3
                compact = 0

            if T.And(take_all == 0, T.And(src == 0, e > cap)):
                # Longer rows: a lower bound thr of the threshold from a sample (NW * su runs of 32
                # spread over the row): the bin of its kt-th largest key (kt: see ROW_SAMPLE_SD). Used only
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
                    # the radix pass's bins (ROW_NB over [kmin, kmax]; every sample key is in range)
                    sh = T.max(0, (32 - ROW_BITS) - T.Cast("int32", T.clz(kmax - kmin)))
                    mm[0] = KEY_MAX  # (not used: every sample key is in range)
                    mm[1] = ZERO
                    for u in T.unroll(su):
                        hist_key(kb, u, mm, kmin, kmax, sh, s_hist)
                    T.sync_threads()
                    kt = (k * ssz) // e  # the expected sample count above the threshold, plus the margin
                    kt = T.min(ssz, kt + T.Cast("int32", T.sqrt(T.Cast("float32", kt)) * ROW_SAMPLE_SD)
                               + ROW_SAMPLE_PAD)
                    select_bin(kt, s_hist, s_scan, s_sel, tx, lane, warp)
                    T.sync_threads()
                    thr = kmin + (T.Cast("uint32", s_sel[0]) << T.Cast("uint32", sh))
                    rk = s_sel[1]  # the kt-th largest sample key is the rk-th largest in its bin
                    if T.And(sh > 0, T.Cast("int64", kt - rk + s_sel[2]) * T.Cast("int64", e)
                             > T.Cast("int64", (cap // 2) * ssz)):
                        # [min, max] of the sample keys in that bin, then (unless they are one key, as in
                        # few-valued rows, where a histogram would only pile up on one counter) a second
                        # histogram of them over ROW_NB sub-bins: thr moves up from the bin's lower edge to
                        # the sub-bin of the same kt-th key (see ROW_SAMPLE_PAD).
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
                            sh = T.max(0, (32 - ROW_BITS) - T.Cast("int32", T.clz(kmax - kmin)))
                            for u in T.unroll(su):
                                hist_key(kb, u, mm, kmin, kmax, sh, s_hist)
                            T.sync_threads()
                            select_bin(rk, s_hist, s_scan, s_sel, tx, lane, warp)
                            T.sync_threads()
                            thr = kmin + (T.Cast("uint32", s_sel[0]) << T.Cast("uint32", sh))
                # One CTA a row: the list's bins (see ROW_PREBIN_SPAN), and no barrier here: the compaction
                # writes s_hist, s_bm and s_cnt before its first barrier, and the sample's last reads of
                # s_hist came before the barrier after its selection. A split row's exchange reuses s_sel.
                if S == 1:
                    wd = smax - thr
                    wd = T.if_then_else(wd > T.uint32(0xFFFFFFFF // ROW_PREBIN_SPAN), KEY_MAX,
                                        wd * T.uint32(ROW_PREBIN_SPAN) + T.uint32(1))
                    pre = T.if_then_else(thr <= T.uint32(0xFF800000),
                                         T.max(0, (32 - ROW_BITS) - T.Cast("int32", T.clz(wd))) + 1, 0)
                else:
                    T.sync_threads()

            for _rnd in T.serial(ROW_ROUNDS):
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
                    # entry per thread instead of a key and a min / max per strip.
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
                                           T.uint32(ROW_NB - 1))
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
                    # The threshold bin holds at most ROW_RES keys (all of [lo, hi]; keys from registers or
                    # the list): gather them (zero-padded: key 0 is below every real key) and rank each
                    # against all (one warp per 32 keys) for the kk-th largest with its multiplicity, instead
                    # of more radix passes. Then [lo, hi] is that one key and kk counts its ties.
                    # (s_cnt and s_small were zeroed by the radix pass that chose this round, before its
                    # last barrier)
                    if src == 3:
                        for u in T.unroll(UNROLL):
                            if T.And(kb[u] >= lo, kb[u] <= hi):
                                slot = T.call_extern("int32", "atomicAdd", T.address_of(s_cnt[0]), 1)
                                if slot < ROW_RES:  # always (cnt keys are in range): a bounds guard
                                    s_small[slot] = kb[u]
                    else:
                        for q in T.serial(T.ceildiv(ne, NT)):
                            if q * NT + tx < ne:
                                kx = s_ck[q * NT + tx]
                                if T.And(kx >= lo, kx <= hi):
                                    slot = T.call_extern("int32", "atomicAdd", T.address_of(s_cnt[0]), 1)
                                    if slot < ROW_RES:
                                        s_small[slot] = kx
                    T.sync_threads()
                    if warp * 32 < cnt:  # warp-uniform
                        kx = s_small[warp * 32 + lane]  # 0 past cnt
                        c = 0  # keys above mine
                        tmp = 0  # keys at or above mine
                        for j in T.serial(T.ceildiv(cnt, ROW_RES_STEP)):
                            for t in T.unroll(ROW_RES_STEP):
                                b0 = s_small[j * ROW_RES_STEP + t]
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
                    # radix pass: bins of 2^sh keys over [lo, hi] (at most ROW_NB of them: 12-bit digits, so
                    # a candidate list spanning up to 2^24 keys, as a randn row's top ~2% does, needs two)
                    if pre > 0:
                        # the compaction binned the list (origin thr, shift pre - 1, the keys past the last
                        # bin in it) and published the list's [min, max] to s_mm: straight to the selection
                        sh = pre - 1
                        lo = thr
                    else:
                        sh = T.max(0, (32 - ROW_BITS) - T.Cast("int32", T.clz(hi - lo)))
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
                    if tx < ROW_RES:
                        s_small[tx] = ZERO
                    T.sync_threads()
                    lo_bin = lo + (T.Cast("uint32", s_sel[0]) << T.Cast("uint32", sh))
                    hi_bin = T.Cast("uint64", lo_bin) + ((T.uint64(1) << T.Cast("uint64", sh)) - T.uint64(1))
                    if T.And(pre > 0, s_sel[0] == ROW_NB - 1):
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
                    if T.And(T.And(done == 0, src != 0), cnt <= ROW_RES):
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
