"""The warp kernel: exact top-k of many short rows, one warp per row."""

import tilelang
import tilelang.language as T

from tilelang_ops.topk.macros import (
    CLS_TAKE,
    CLS_TIE,
    CNT_MASK,
    KERNEL_PASS_CONFIGS,
    _f32_bits,
    _key,
    _lane_macros,
    _ordered_classes,
    _warp_max,
    _warp_min,
)

# One warp per row (many short rows): a row's whole search runs in one warp, so there is no block barrier,
# no cross-warp scan and no idle warp, and an SM holds up to 24 rows at a time (6 CTAs of 4 warps). Each
# radix pass reads the row again (software-pipelined a step of W_UNROLL x 32 entries ahead; rows of at most
# W_CACHE entries: the first pass keeps the keys in shared memory and the later passes read them there)
# and histograms the keys in [lo, hi] into the W_NB bins of the warp's own shared histogram (8-bit digits:
# at most 4 passes, [lo, hi] narrowing to the threshold bin intersected with [min, max] of the pass's keys
# in range; it stops once the threshold bin is taken whole or holds one key value), then one ordered pass
# emits the keys above hi and the first kk keys in [lo, hi] with ballots, in ascending index order. A step
# batches its 8 keys' adds: one key at a time, each waiting for its shuffle and vote, is twice as slow.
WARP_ROWS = 4  # rows (warps) per CTA: 8 is slower
W_BITS = 8
W_NB = 1 << W_BITS
W_UNROLL = 8  # strips of 32 entries per step: independent loads in flight per lane
# Rows of at most W_CACHE entries keep their keys in shared memory after the first pass (8 KiB a warp): the
# later passes and the ordered pass read them there instead of loading and keying the row again
W_CACHE = 2048
assert W_CACHE % (32 * W_UNROLL) == 0  # whole steps: the first pass stores key 0 past the end too


@tilelang.jit(pass_configs=KERNEL_PASS_CONFIGS)
def warp_kernel(in_dtype: str = "float32", idx_dtype: str = "int32", off_dtype: str = "int32",
                with_values: bool = True, with_offset: bool = False, idx_fill: int = -1,
                val_fill: float = float("-inf"), mode: str = "topk", cand_bs: int = 0, block_c: int = 1,
                rows_per_cta: int = WARP_ROWS):
    """Per row, one warp: the min(k, end) best in ascending index order.

    The static arguments of `row_kernel` without its cache tier, split, threads and streaming, then
    `rows_per_cta` warps (rows) per CTA."""
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
        row.hist_add): faster than a shuffle and a vote per key."""
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
