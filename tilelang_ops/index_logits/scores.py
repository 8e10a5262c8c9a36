"""TileLang kernel: index scores over FP4 index rows on the integer tensor cores (SPEC 5), for the paged
decode cache (``paged``), its candidate-restricted form (``cand``) and gathered prefill keys (``ragged``).

**Arithmetic.** Doubled e2m1 codes are integers (|2v| <= 12). For a key whose four block exponents lie
within 3 binades of its largest (``Ek``) the block with exponent e is shifted left by 3 + e - Ek, and the
same for a query head: then ``Y = sum_b dot4_b 2^(6 + rel_k + rel_q)`` (``reference.index_logits``, step 3)
is one integer dot product of u8 x s8 vectors of length 128 (|values| <= 96, |Y| < 2^21), which four chained
``mma.m16n8k32.u8.s8.s32`` compute exactly. Keys are stored as u8 ``128 + x``: the bias adds
``128 * sum_k b_k`` per head, which the accumulator's start value (the C operand) removes. The head term
``fma(relu(Y), Wq, p)`` is one IMNMX and one FFMA: ``relu(Y)`` as integer bits is the FP32 number
``relu(Y) * 2^-149`` (a subnormal, exact), and ``Wq * 2^149`` (exact unless it overflows) gives the same
real product, so the FMA rounds exactly as the reference's. A tile of 16 keys with a wider key, or a
query row with a wider head or an overflowing ``Wq * 2^149``, takes the general path: one MMA per block
(exact ``D_b``), ``t_b = fp32(D_b 2^c)`` in double (c: the exponent the shifts left over), the reference's
FP32 sums, ``fma(relu(Y), Wq, p)``. Both paths produce the reference's bits.

**Layout.** A CTA (``warps`` warps) serves ``rows`` query rows (a request's n rows; one candidate row; a
block of prefill rows) over a range of keys, ``kc`` keys per step through a ``stages``-deep cp.async ring:
raw FP4 rows land in shared memory, every thread converts its share of (key pair, block) to the MMA's A
fragments (u8, in fragment order, so one 16-byte load gives a lane its four registers), then warp w scores
tiles of 16 keys against row ``w % rows``, whose B fragments (s8 query codes, H x 128 bytes) it holds in
registers for the whole launch. The D fragment puts a lane's two keys (g, g + 8) and two heads (2q, 2q + 1)
of each 8-head N-tile in its registers, so the head sum runs in the lane and then over the quad (two
shuffles), in the reference's order.

**On wgmma** (modes ``*_wg``; 4 warps, 64 keys per step, at most 4 rows): the CTA is one
warpgroup; warp w loads the A fragments of keys 16 w .. 16 w + 15 (s8: the stored byte with its top bit
flipped) and the warpgroup issues, per pair of rows (or the one row), four ``wgmma.m64nNk32.s32.s8.s8``
with B = the rows' heads in shared memory (bcan: K-major, no swizzle, written once by the prologue). Its
accumulator has the mma D layout per N-tile, so the fast path's epilogue is the same; the general path
runs ``mma.sync`` s8 x s8 on the same A fragments with B words from bcan.
"""


import tilelang
import tilelang.language as T

from tilelang_ops.index_logits.ptx import PRELUDE

ROW_BYTES, CODE_BYTES, SCALE_BYTES = 68, 64, 4
NOSHIFT = 0xC8C8C8C8  # packed residual exponents of a key / head without residual: 4 x (0 + 200)
RES_BIAS = 200  # residual exponents are stored as bytes c + 200, c clamped to [-200, 3]
T0, T1 = 0x03020100, 0x0C080604  # doubled e2m1 magnitudes of codes 0-3 / 4-7, one per byte
Q_OFFSET, K_OFFSET = 160, 102  # reference.index_logits: Wq = w 2^(Eq - 160), I = S 2^(Ek - 102)
HMETA_WORDS = 9  # per (row, head): 4 block biases, Wq, packed residuals, fast C, 2^149 Wq, fast flag
PASS_CONFIGS = {tilelang.PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True,
                tilelang.PassConfigKey.TL_DISABLE_THREAD_STORAGE_SYNC: True,
                tilelang.PassConfigKey.TL_DISABLE_SHARED_MEMORY_REUSE: True}


def smem_words(heads: int, rows: int, kc: int, stages: int, wg: bool = False) -> dict:
    """Offsets (in 32-bit words) of the shared-memory regions and the total. ``wg``: the query rows as the
    wgmma's B operand (bcan, first: 16-byte aligned) instead of staged mma fragments (bstage)."""
    off, size = {}, 0
    for name, words in (("bcan", rows * heads * 32 if wg else 0), ("raw", stages * kc * 16),
                        ("rsc", stages * kc), ("rfl", stages * kc),
                        ("conv", kc * 32), ("meta", kc * 2), ("hmeta", rows * heads * HMETA_WORDS),
                        ("bstage", 0 if wg else rows * heads * 32)):
        off[name] = size
        size += words
    off["total"] = size
    return off


def _u32(v: int):
    return T.uint32(v)


def _byte(w, k: int):
    """Byte k of the uint32 w as int32."""
    return T.Cast("int32", (w >> _u32(8 * k)) & _u32(0xFF))


def _max4(w):
    return T.max(T.max(_byte(w, 0), _byte(w, 1)), T.max(_byte(w, 2), _byte(w, 3)))


def _min4(w):
    return T.min(T.min(_byte(w, 0), _byte(w, 1)), T.min(_byte(w, 2), _byte(w, 3)))


def _prmt(a, b, c):
    return T.call_extern("uint32", "il_prmt", a, b, c)


def _biased_u8(w, t0, t1, half: int):
    """Codes 4 half .. 4 half + 3 of the code word w as bytes 128 + x, x = +-(2v << shift) (t0 / t1: the
    shifted magnitude table). PRMT with the raw code as selector gives the magnitude of a positive code
    and 0 for a negative one (its sign bit replicates a byte < 128); with the sign flipped the other way
    round; 0x80 + P - N never borrows across bytes (|x| <= 96). The upper half's flip is taken from its
    shifted selector, so a code word costs 3 selector instructions."""
    sel = w if half == 0 else w >> _u32(16)
    flip = (w ^ _u32(0x88888888)) if half == 0 else (sel ^ _u32(0x8888))
    return _u32(0x80808080) + _prmt(t0, t1, sel) - _prmt(t0, t1, flip)


def _residual_pack(sw, big):
    """Packed bytes clamp(3 + e_b - big, -200, 3) + 200 of the scale word sw (the exponents a wide row's
    unshifted blocks leave)."""
    acc = _u32(0)
    for b in range(4):
        c = T.max(3 + _byte(sw, b) - big, -RES_BIAS) + RES_BIAS
        acc = acc | (T.Cast("uint32", c) << _u32(8 * b))
    return acc


def _shift(sw, big, wide, b: int):
    """The left shift of block b: 3 + e_b - big (in [0, 3]) for a row within 3 binades, else 0."""
    return T.Cast("uint32", T.if_then_else(wide, 0, 3 + _byte(sw, b) - big))


@tilelang.jit(pass_configs=PASS_CONFIGS)
def scores_kernel(mode: str, heads: int, rows: int, warps: int, kc: int, stages: int, vec16: bool,
                  min_ctas: int = 0):
    """The scoring kernel for ``mode`` in ("paged", "cand", "ragged"), each also on wgmma (``mode + "_wg"``);
    see the module docstring.
    ``rows``: query rows per CTA (paged: n rounded up to 1, 2, 4 or 8); ``kc``: keys per step; ``vec16``:
    16-byte copies of the key rows (else 4-byte: cache blocks of Bc % 4 != 0 rows); ``min_ctas`` > 1 caps
    the registers so that many CTAs fit an SM (``__launch_bounds__``)."""
    wg = mode.endswith("_wg")  # the scores on wgmma: the CTA one warpgroup, a step one M-tile of 64 keys
    if wg:
        mode = mode[:-3]
        assert warps == 4 and kc == 64 and rows <= 4, (mode, warps, kc, rows)
    assert mode in ("paged", "cand", "ragged") and heads in (32, 64) and stages >= 2
    threads = 32 * warps
    wpr = warps // rows  # warps per query row
    tiles = kc // 16
    assert warps % rows == 0 and tiles % wpr == 0, (warps, rows, kc)
    tpw = tiles // wpr  # tiles per warp per step
    ntiles = heads // 8  # N-tiles of 8 heads
    groups = heads // 32
    lay = smem_words(heads, rows, kc, stages, wg)
    rpw = min(rows, 2)  # query rows per wgmma
    wgn = rpw * heads  # wgmma N: their heads
    sbo = 1024  # bcan: bytes between groups of 8 B rows (one group's 8 core matrices of 16 x 8 along K)
    kpt = -(-kc // threads)  # keys a thread issues per step
    cjobs = -(-(2 * kc) // threads)  # conversion jobs (key pair, block) per thread per step
    pjobs = -(-(rows * ntiles) // warps)  # prologue jobs (query row, N-tile) per warp
    neg_inf = T.reinterpret(_u32(0xFF800000), "float32")

    dyn = T.dynamic("nq, nkeys, nb_rows, mb, ncol, ncand")

    def src_addr(src, off, byte):
        """Address of byte ``byte`` of key data: the flat cache at offset off (paged), or row off of the
        gathered keys (ragged)."""
        if mode == "ragged":
            return T.address_of(src[off, byte])
        return T.address_of(src[off + byte])

    @T.macro
    def load_step(sm, src_codes, src_scales, table, cand, s_start, s_end, stage, bidx, row0, bc, num_blocks,
                  max_blocks, cbs, nkey_total, tx, kq, kr, kstep):
        """cp.async of the keys [s_start, s_start + kc) (those >= s_end: nothing) into raw stage ``stage``;
        rfl = 1 for a key in range that cannot be resolved (it scores -inf). Paged: kq[it] / kr[it] hold
        this thread's key of the step divided by bc (quotient / remainder) and advance by kc (kstep: kc
        divided by bc); steps are issued in order, so no step divides."""
        for it in T.unroll(kpt):
            i = tx + it * threads
            if i < kc:
                key = s_start + i
                live = key < s_end
                ok = T.alloc_var("bool")
                dsrc = T.alloc_var("int64")
                ssrc = T.alloc_var("int64")
                ok = live
                dsrc = T.int64(0)
                ssrc = T.int64(0)
                if mode == "ragged":
                    ok = live and key >= 0 and key < nkey_total
                    dsrc = T.Cast("int64", T.if_then_else(ok, key, 0))
                    ssrc = dsrc
                else:
                    if mode == "cand":
                        lrow = T.alloc_var("int32")
                        lrow = key
                        cb = T.if_then_else(live, cand[row0, key // cbs], -1)
                        ok = live and cb >= 0
                        lrow = cb * cbs + key % cbs
                        tb = lrow // bc
                    else:
                        tb = kq[it]
                        rem = kr[it]
                    ok = ok and tb < max_blocks
                    phys = T.if_then_else(ok, table[bidx, T.min(tb, max_blocks - 1)], 0)
                    ok = ok and phys >= 0 and phys < num_blocks
                    base = T.Cast("int64", T.if_then_else(ok, phys, 0)) * bc * ROW_BYTES
                    dsrc = base + T.Cast("int64", rem if mode == "paged" else lrow % bc) * CODE_BYTES
                    ssrc = base + T.Cast("int64", bc) * CODE_BYTES + T.Cast(
                        "int64", rem if mode == "paged" else lrow % bc) * SCALE_BYTES
                dsrc = T.if_then_else(ok, dsrc, T.int64(0))
                ssrc = T.if_then_else(ok, ssrc, T.int64(0))
                dst = lay["raw"] + (stage * kc + i) * 16
                if vec16:
                    for d in T.unroll(4):
                        T.call_extern("handle", "il_cp16", T.address_of(sm[dst + 4 * d]),
                                      src_addr(src_codes, dsrc, 16 * d), T.if_then_else(ok, 16, 0))
                else:
                    for d in T.unroll(16):
                        T.call_extern("handle", "il_cp4", T.address_of(sm[dst + d]),
                                      src_addr(src_codes, dsrc, 4 * d), T.if_then_else(ok, 4, 0))
                T.call_extern("handle", "il_cp4", T.address_of(sm[lay["rsc"] + stage * kc + i]),
                              src_addr(src_scales, ssrc, 0), T.if_then_else(ok, 4, 0))
                sm[lay["rfl"] + stage * kc + i] = T.if_then_else(live and not ok, _u32(1), _u32(0))
                if mode == "paged":
                    kr[it] = kr[it] + kstep[1]
                    kq[it] = kq[it] + kstep[0]
                    if kr[it] >= bc:
                        kr[it] = kr[it] - bc
                        kq[it] = kq[it] + 1
        T.call_extern("handle", "il_cp_commit")

    @T.macro
    def convert_step(sm, stage, tx):
        """Raw stage -> A fragments (conv) and per-key meta. Job (tile m, g, block kb): keys 16 m + g and
        16 m + g + 8, code words 4 kb .. 4 kb + 3, i.e. a0 / a2 (key g) and a1 / a3 (key g + 8) of lanes
        4 g + w; lane slot (4 g + w) ^ kb keeps the 16-byte stores and the MMA warps' loads conflict-free."""
        raw = T.alloc_local([8], "uint32")
        frag = T.alloc_local([4], "uint32")
        tab = T.alloc_local([4], "uint32")
        swv = T.alloc_local([2], "uint32")
        bigv = T.alloc_local([2], "int32")
        widev = T.alloc_local([2], "bool")
        for it in T.unroll(cjobs):
            job = tx + it * threads
            if job < 2 * kc:
                kb = job % 4
                g = (job // 4) % 8
                m = job // 32
                for h in T.unroll(2):
                    i = 16 * m + g + 8 * h
                    for v in T.vectorized(4):
                        raw[4 * h + v] = sm[lay["raw"] + (stage * kc + i) * 16 + 4 * kb + v]
                    swv[h] = sm[lay["rsc"] + stage * kc + i]
                    bigv[h] = _max4(swv[h])
                    widev[h] = bigv[h] - _min4(swv[h]) > 3
                    sh = T.Cast("uint32", T.if_then_else(widev[h], 0, 3 + T.Cast(
                        "int32", (swv[h] >> (T.Cast("uint32", kb) * _u32(8))) & _u32(0xFF)) - bigv[h]))
                    tab[2 * h] = _u32(T0) << sh
                    tab[2 * h + 1] = _u32(T1) << sh
                for w in T.unroll(4):
                    for h in T.unroll(2):
                        frag[h] = _biased_u8(raw[4 * h + w], tab[2 * h], tab[2 * h + 1], 0)
                        frag[2 + h] = _biased_u8(raw[4 * h + w], tab[2 * h], tab[2 * h + 1], 1)
                    slot = (m * 4 + kb) * 32 + ((4 * g + w) ^ kb)
                    for v in T.vectorized(4):
                        sm[lay["conv"] + slot * 4 + v] = frag[v]
                if kb == 0:
                    for h in T.unroll(2):
                        i = 16 * m + g + 8 * h
                        sm[lay["meta"] + 2 * i] = T.if_then_else(widev[h], _residual_pack(swv[h], bigv[h]),
                                                                 _u32(NOSHIFT))
                        sm[lay["meta"] + 2 * i + 1] = T.Cast("uint32", bigv[h]) | (
                            sm[lay["rfl"] + stage * kc + i] << _u32(8))

    @T.macro
    def query_prologue(sm, q_codes, q_scales, weights, row0, nrows, tx):
        """The CTA's query rows, once: warp job (row t, N-tile nt) converts heads 8 nt .. 8 nt + 7 of flat
        query row row0 + t into B fragments (s8, the keys' shifts), staged in shared memory (bstage,
        [t][nt][half][lane][4 words]), and per head the meta of both paths (hmeta: block biases, Wq, packed
        residuals, the fast path's accumulator start, 2^149 Wq, its fast-path flag)."""
        lane = tx % 32
        g = lane // 4
        q = lane % 4
        bw = T.alloc_local([8], "uint32")
        part = T.alloc_var("int32")
        tot = T.alloc_var("int32")
        for it in T.serial(pjobs):
            job = tx // 32 + it * warps
            t = job // ntiles
            nt = job % ntiles
            if t < nrows:
                h = 8 * nt + g
                qrow = row0 + t
                hm = lay["hmeta"] + (t * heads + h) * HMETA_WORDS
                sw = T.call_extern("uint32", "il_ld32", T.address_of(q_scales[qrow, h * SCALE_BYTES]))
                big = _max4(sw)
                wide = big - _min4(sw) > 3
                tot = 0
                for kb in T.unroll(4):
                    sh = _shift(sw, big, wide, kb)
                    t0 = _u32(T0) << sh
                    t1 = _u32(T1) << sh
                    word = T.call_extern("uint32", "il_ld32",
                                         T.address_of(q_codes[qrow, h * CODE_BYTES + 16 * kb + 4 * q]))
                    bw[2 * kb] = _biased_u8(word, t0, t1, 0) ^ _u32(0x80808080)
                    bw[2 * kb + 1] = _biased_u8(word, t0, t1, 1) ^ _u32(0x80808080)
                    part = T.call_extern("int32", "il_dp4a", bw[2 * kb], _u32(0x01010101)) + \
                        T.call_extern("int32", "il_dp4a", bw[2 * kb + 1], _u32(0x01010101))
                    part = part + T.shfl_xor(part, 1)
                    part = part + T.shfl_xor(part, 2)
                    tot = tot + part
                    if q == 0:
                        sm[hm + kb] = T.reinterpret(part * -128, "uint32")
                if wg:  # B row n = t H + h, k32 step kb: core matrices (n / 8, 2 kb + half), row n % 8
                    for kb in T.unroll(4):
                        for half in T.unroll(2):
                            sm[lay["bcan"] + ((t * heads + h) // 8) * (sbo // 4) + kb * 64 + half * 32
                               + (h % 8) * 4 + q] = bw[2 * kb + half]
                else:
                    for half in T.unroll(2):
                        for v in T.vectorized(4):
                            sm[lay["bstage"] + (((t * ntiles + nt) * 2 + half) * 32 + lane) * 4 + v] = bw[
                                4 * half + v]
                if q == 0:
                    wq = T.call_extern("float32", "il_pow2_scale", T.Cast("float64", weights[qrow, h]),
                                       big - Q_OFFSET)
                    w2 = T.call_extern("float32", "il_w_denorm", wq)
                    inf = T.reinterpret(_u32(0x7F800000), "float32")
                    sm[hm + 4] = T.reinterpret(wq, "uint32")
                    sm[hm + 5] = T.if_then_else(wide, _residual_pack(sw, big), _u32(NOSHIFT))
                    sm[hm + 6] = T.reinterpret(tot * -128, "uint32")
                    sm[hm + 7] = T.reinterpret(w2, "uint32")
                    slow = wide or (T.abs(w2) == inf and T.abs(wq) < inf)  # (2^149 Wq overflows)
                    sm[hm + 8] = T.if_then_else(slow, _u32(0), _u32(1))

    @T.macro
    def row_constants(sm, trow, bq, cfe, w2e, fast, lane):
        """This warp's row, from the staged prologue: B fragments (bq), the fast path's per-column
        accumulator starts (cfe) and 2^149 Wq (w2e) of heads 8 nt + 2 q + c, and the row's fast-path flag
        (every head of it)."""
        q = lane % 4
        okv = T.alloc_var("int32")
        okv = 1
        for nt in T.unroll(ntiles):
            for half in T.unroll(2):
                for v in T.vectorized(4):
                    bq[nt * 8 + 4 * half + v] = sm[lay["bstage"] + (((trow * ntiles + nt) * 2 + half) * 32
                                                                     + lane) * 4 + v]
            for c in T.unroll(2):
                hm = lay["hmeta"] + (trow * heads + 8 * nt + 2 * q + c) * HMETA_WORDS
                cfe[nt * 2 + c] = T.reinterpret(sm[hm + 6], "int32")
                w2e[nt * 2 + c] = T.reinterpret(sm[hm + 7], "float32")
                if sm[hm + 8] == _u32(0):
                    okv = 0
        fast[0] = T.call_extern("int32", "il_all", okv)

    @T.macro
    def tile_result(sm, m, p, lane, res):
        """res[0], res[1] from the lane's partial head sums p: over the quad, times the key's scale, -inf for
        an unresolvable key."""
        g = lane // 4
        s = T.alloc_local([2 * groups], "float32")
        for i in T.unroll(2 * groups):
            s[i] = T.ieee_add(p[i], T.shfl_xor(p[i], 1))
            s[i] = T.ieee_add(s[i], T.shfl_xor(s[i], 2))
        kv = T.alloc_var("float32")
        for h in T.unroll(2):
            ekw = sm[lay["meta"] + 2 * (16 * m + g + 8 * h) + 1]
            tot = s[h] if groups == 1 else T.ieee_add(s[h], s[2 + h])
            # scaled unconditionally, then selected: no branch per key
            kv = T.call_extern("float32", "il_key_scale", tot, T.Cast("int32", ekw & _u32(0xFF)) - K_OFFSET)
            res[h] = T.if_then_else((ekw >> _u32(8)) != _u32(0), neg_inf, kv)

    @T.macro
    def general_path(sm, m, trow, af, bq, p, lane):
        """p of row trow for a tile with a wide key or a row with a wide head: one MMA per block (exact D_b),
        t_b = fp32(D_b 2^c) in double (c: the exponent the shifts left over), the reference's FP32 sums,
        p += relu(y) Wq. B: the row's fragments bq (u8 keys; the accumulator starts at -128 sum(b)) or, on
        wgmma (bq None), words of bcan (s8 keys; the accumulator starts at zero)."""
        g = lane // 4
        q = lane % 4
        db = T.alloc_local([16], "int32")
        y = T.alloc_var("float32")
        ck = T.alloc_local([2], "uint32")
        for h in T.unroll(2):
            ck[h] = sm[lay["meta"] + 2 * (16 * m + g + 8 * h)]
        for nt in T.unroll(ntiles):
            hm0 = lay["hmeta"] + (trow * heads + 8 * nt + 2 * q) * HMETA_WORDS
            for kb in T.unroll(4):
                if bq is None:
                    bfr = T.alloc_local([2], "uint32")
                    for half in T.unroll(2):
                        bfr[half] = sm[lay["bcan"] + (trow * ntiles + nt) * (sbo // 4) + kb * 64 + half * 32
                                       + g * 4 + q]
                    T.call_extern("handle", "il_mma_ss", T.address_of(db[kb * 4]), T.address_of(af[kb * 4]),
                                  T.address_of(bfr[0]), 0, 0, 0, 0)
                else:
                    c0 = T.reinterpret(sm[hm0 + kb], "int32")
                    c1 = T.reinterpret(sm[hm0 + HMETA_WORDS + kb], "int32")
                    T.call_extern("handle", "il_mma", T.address_of(db[kb * 4]), T.address_of(af[kb * 4]),
                                  T.address_of(bq[nt * 8 + kb * 2]), c0, c1, c0, c1)
            for e in T.unroll(4):
                cq = sm[hm0 + (e % 2) * HMETA_WORDS + 5]
                for kb in T.unroll(4):
                    tb = T.call_extern("float32", "il_pow2_scale", T.Cast("float64", db[kb * 4 + e]),
                                       _byte(ck[e // 2], kb) + _byte(cq, kb) - 2 * RES_BIAS)
                    if kb == 0:
                        y = tb
                    else:
                        y = T.ieee_add(y, tb)
                p[(nt // 4) * 2 + e // 2] = T.ieee_fmaf(
                    T.max(y, T.float32(0)), T.reinterpret(sm[hm0 + (e % 2) * HMETA_WORDS + 4], "float32"),
                    p[(nt // 4) * 2 + e // 2])

    @T.macro
    def score_tile(sm, m, trow, bq, cfe, w2e, fast, lane, res):
        """res[0], res[1]: I of keys 16 m + g and 16 m + g + 8 of the step for row trow (every lane of a
        quad holds both)."""
        af = T.alloc_local([16], "uint32")
        dd = T.alloc_local([4], "int32")
        p = T.alloc_local([2 * groups], "float32")
        for kb in T.unroll(4):
            for v in T.vectorized(4):
                af[kb * 4 + v] = sm[lay["conv"] + ((m * 4 + kb) * 32 + (lane ^ kb)) * 4 + v]
        ck_lane = sm[lay["meta"] + 2 * (16 * m + lane % 16)]
        wide = T.call_extern("int32", "il_any", T.if_then_else(lane < 16 and ck_lane != _u32(NOSHIFT), 1, 0))
        for i in T.unroll(2 * groups):
            p[i] = T.float32(0)
        if wide == 0 and fast[0] != 0:
            for nt in T.unroll(ntiles):
                T.call_extern("handle", "il_mma", T.address_of(dd[0]), T.address_of(af[0]),
                              T.address_of(bq[nt * 8]), cfe[nt * 2], cfe[nt * 2 + 1], cfe[nt * 2],
                              cfe[nt * 2 + 1])
                for kb in T.unroll(1, 4):
                    T.call_extern("handle", "il_mma", T.address_of(dd[0]), T.address_of(af[kb * 4]),
                                  T.address_of(bq[nt * 8 + kb * 2]), dd[0], dd[1], dd[2], dd[3])
                for e in T.unroll(4):
                    p[(nt // 4) * 2 + e // 2] = T.ieee_fmaf(T.reinterpret(T.max(dd[e], 0), "float32"),
                                                           w2e[nt * 2 + e % 2], p[(nt // 4) * 2 + e // 2])
        else:
            general_path(sm, m, trow, af, bq, p, lane)
        tile_result(sm, m, p, lane, res)

    @T.macro
    def row_constants_wg(sm, w2a, fasta, lane):
        """Every row's 2^149 Wq of heads 8 nt + 2 q + c (w2a[t, nt, c]) and fast-path flag (fasta[t])."""
        q = lane % 4
        okv = T.alloc_var("int32")
        for t in T.unroll(rows):
            okv = 1
            for nt in T.unroll(ntiles):
                for c in T.unroll(2):
                    hm = lay["hmeta"] + (t * heads + 8 * nt + 2 * q + c) * HMETA_WORDS
                    w2a[(t * ntiles + nt) * 2 + c] = T.reinterpret(sm[hm + 7], "float32")
                    if sm[hm + 8] == _u32(0):
                        okv = 0
            fasta[t] = T.call_extern("int32", "il_all", okv)

    @T.macro
    def score_tile_wg(sm, m, t, tt, af, dw, w2a, fasta, wide, lane, res):
        """res as score_tile's, for row t from the wgmma accumulator dw (its N-tiles tt ntiles ..) or, for a
        wide tile or row, the general path on the s8 A fragments af with B words from bcan."""
        p = T.alloc_local([2 * groups], "float32")
        for i in T.unroll(2 * groups):
            p[i] = T.float32(0)
        if wide == 0 and fasta[t] != 0:
            for nt in T.unroll(ntiles):
                for e in T.unroll(4):
                    p[(nt // 4) * 2 + e // 2] = T.ieee_fmaf(
                        T.reinterpret(T.max(dw[(tt * ntiles + nt) * 4 + e], 0), "float32"),
                        w2a[(t * ntiles + nt) * 2 + e % 2], p[(nt // 4) * 2 + e // 2])
        else:
            general_path(sm, m, t, af, None, p, lane)
        tile_result(sm, m, p, lane, res)

    def steps(lo, hi):
        return T.if_then_else(hi > lo, (hi - lo + kc - 1) // kc, 0)

    @T.macro
    def main_loop(sm, src_codes, src_scales, table, cand, q_codes, q_scales, weights, out, bidx, row0, nrows,
                  j_lo, j_hi, rlo, rhi, col_shift, out_row0, ld_out, bc, num_blocks, max_blocks, cbs,
                  nkey_total):
        """Score keys [j_lo, j_hi) against the CTA's rows: row t (t < nrows; flat query row row0 + t) keeps
        keys [rlo[t], rhi[t]) and writes key j to out[(out_row0 + t) * ld_out + j - col_shift[t]]."""
        tx = T.get_thread_binding()
        warp = tx // 32
        lane = tx % 32
        trow = warp % rows
        tsel = warp // rows
        bq = T.alloc_local([ntiles * 8], "uint32")
        cfe = T.alloc_local([ntiles * 2], "int32")
        w2e = T.alloc_local([ntiles * 2], "float32")
        fast = T.alloc_local([1], "int32")
        res = T.alloc_local([2], "float32")
        my_lo = T.alloc_var("int32")
        my_hi = T.alloc_var("int32")
        my_sft = T.alloc_var("int32")
        my_lo = 0
        my_hi = 0
        my_sft = 0
        for t in T.unroll(rows):
            if trow == t:
                my_lo = rlo[t]
                my_hi = rhi[t]
                my_sft = col_shift[t]
        kq = kr = kstep = None
        if mode == "paged":  # the load steps' divisions by bc, once
            kq = T.alloc_local([kpt], "int32")
            kr = T.alloc_local([kpt], "int32")
            kstep = T.alloc_local([2], "int32")
            kstep[0] = kc // bc
            kstep[1] = kc % bc
            for it in T.unroll(kpt):
                kq[it] = (j_lo + tx + it * threads) // bc
                kr[it] = (j_lo + tx + it * threads) % bc
        nsteps = steps(j_lo, j_hi)
        for s in T.unroll(stages - 1):
            if s < nsteps:
                load_step(sm, src_codes, src_scales, table, cand, j_lo + s * kc, j_hi, s, bidx, row0, bc,
                          num_blocks, max_blocks, cbs, nkey_total, tx, kq, kr, kstep)
            else:
                T.call_extern("handle", "il_cp_commit")
        if wg:
            w2a = T.alloc_local([rows * ntiles * 2], "float32")
            fasta = T.alloc_local([rows], "int32")
            dw = T.alloc_local([wgn // 2], "int32")
            af = T.alloc_local([16], "uint32")
        if nsteps > 0:
            query_prologue(sm, q_codes, q_scales, weights, row0, nrows, tx)
            if wg:
                T.call_extern("handle", "il_fence_proxy_async")
            T.sync_threads()
            if wg:
                row_constants_wg(sm, w2a, fasta, lane)
            elif trow < nrows:
                row_constants(sm, trow, bq, cfe, w2e, fast, lane)
        for s in T.serial(nsteps):
            T.call_extern("handle", f"il_cp_wait<{stages - 2}>")
            T.sync_threads()
            if s + stages - 1 < nsteps:
                load_step(sm, src_codes, src_scales, table, cand, j_lo + (s + stages - 1) * kc, j_hi,
                          (s + stages - 1) % stages, bidx, row0, bc, num_blocks, max_blocks, cbs, nkey_total,
                          tx, kq, kr, kstep)
            else:
                T.call_extern("handle", "il_cp_commit")
            convert_step(sm, s % stages, tx)
            T.sync_threads()
            if wg:
                # warp w scores keys 16 w .. 16 w + 15 of the step for every row: the A fragments once (s8:
                # the stored 128 + x with its top bit flipped), then per pair of rows one chain of 4 wgmma
                m = warp
                j = j_lo + s * kc + 16 * m
                for kb in T.unroll(4):
                    for v in T.vectorized(4):
                        af[kb * 4 + v] = sm[lay["conv"] + ((m * 4 + kb) * 32 + (lane ^ kb)) * 4 + v]
                for i in T.unroll(16):
                    af[i] = af[i] ^ _u32(0x80808080)
                ck_lane = sm[lay["meta"] + 2 * (16 * m + lane % 16)]
                wide = T.call_extern("int32", "il_any",
                                     T.if_then_else(lane < 16 and ck_lane != _u32(NOSHIFT), 1, 0))
                # every pair, also beyond the CTA's rows (their results unused): a wgmma under a condition
                # ptxas cannot prove uniform is serialized (C7520)
                for pr in T.unroll(rows // rpw):
                    T.call_extern("handle", "il_wg_fence")
                    for kb in T.unroll(4):
                        T.call_extern("handle", f"il_wgmma_n{wgn}", T.address_of(dw[0]),
                                      T.address_of(af[kb * 4]),
                                      T.call_extern("uint64", "il_wg_desc", T.address_of(
                                          sm[lay["bcan"] + pr * (wgn // 8) * (sbo // 4) + kb * 64]),
                                          128, sbo), kb)
                    T.call_extern("handle", "il_wg_commit")
                    T.call_extern("handle", "il_wg_wait0")
                    T.call_extern("handle", f"il_wg_regs_n{wgn}", T.address_of(dw[0]))
                    for tt in T.unroll(rpw):
                        t = rpw * pr + tt
                        if t < nrows and j < rhi[t] and j + 16 > rlo[t]:
                            score_tile_wg(sm, m, t, tt, af, dw, w2a, fasta, wide, lane, res)
                            if lane % 4 < 2:
                                key = j + lane // 4 + 8 * (lane % 4)
                                if key >= rlo[t] and key < rhi[t]:
                                    out[out_row0 + t, key - col_shift[t]] = T.if_then_else(
                                        lane % 4 == 0, res[0], res[1])
            elif trow < nrows:
                for u in T.serial(tpw):
                    m = tsel + u * wpr
                    j = j_lo + s * kc + 16 * m
                    if j < my_hi and j + 16 > my_lo:
                        score_tile(sm, m, trow, bq, cfe, w2e, fast, lane, res)
                        if lane % 4 < 2:
                            key = j + lane // 4 + 8 * (lane % 4)
                            if key >= my_lo and key < my_hi:
                                out[out_row0 + trow, key - my_sft] = T.if_then_else(
                                    lane % 4 == 0, res[0], res[1])

    return _entry(mode, heads, rows, threads, lay, main_loop, dyn, neg_inf, min_ctas)


def _entry(mode, heads, rows, threads, lay, main_loop, dyn, neg_inf, min_ctas):
    """The prim_func of ``mode``: the CTA's rows and key range, the main loop, the clean fill."""
    nq, nkeys, nb_rows, mb, ncol, ncand = dyn
    if mode == "ragged":
        @T.prim_func
        def ragged(
            q_codes3: T.Tensor((nq, heads, CODE_BYTES), "uint8"),  # [T, H, 64] uint8
            q_scales3: T.Tensor((nq, heads, SCALE_BYTES), "uint8"),  # [T, H, 4] uint8
            weights: T.Tensor((nq, heads), "float32"),  # [T, H] fp32
            k_codes: T.Tensor((nkeys, CODE_BYTES), "uint8"),  # [N, 64] uint8
            k_scales: T.Tensor((nkeys, SCALE_BYTES), "uint8"),  # [N, 4] uint8
            ks: T.Tensor((nq,), "int32"),  # [T] int32
            ke: T.Tensor((nq,), "int32"),  # [T] int32
            out: T.Tensor((nq, ncol), "float32"),  # [T, max_width] fp32
            max_width: T.int32,
            kps: T.int32,  # columns per CTA
            clean: T.int32,
        ):
            with T.Kernel(T.ceildiv(nq, rows), T.ceildiv(max_width, kps), threads=threads,
                          prelude=PRELUDE) as (bx, by):
                q_codes = T.reshape(q_codes3, (nq, heads * CODE_BYTES))  # the body addresses a row's bytes
                q_scales = T.reshape(q_scales3, (nq, heads * SCALE_BYTES))
                if min_ctas > 1:
                    T.annotate_min_blocks_per_sm(min_ctas)
                sm = T.alloc_shared([lay["total"]], "uint32")
                rlo = T.alloc_local([rows], "int32")
                rhi = T.alloc_local([rows], "int32")
                sft = T.alloc_local([rows], "int32")
                jlo = T.alloc_var("int32")
                jhi = T.alloc_var("int32")
                c0 = by * kps
                c1 = T.min(c0 + kps, max_width)
                nrows = T.min(rows, nq - bx * rows)
                jlo = 2147483647
                jhi = -2147483647
                for t in T.unroll(rows):
                    sft[t] = 0
                    rlo[t] = 0
                    rhi[t] = 0
                    if t < nrows:
                        width = T.min(T.max(ke[bx * rows + t] - ks[bx * rows + t], 0), max_width)
                        sft[t] = ks[bx * rows + t]
                        rlo[t] = sft[t] + c0
                        rhi[t] = sft[t] + T.min(c1, width)
                        if rhi[t] > rlo[t]:
                            jlo = T.min(jlo, rlo[t])
                            jhi = T.max(jhi, rhi[t])
                if jhi < jlo:
                    jlo = 0
                    jhi = 0
                main_loop(sm, k_codes, k_scales, ks, ks, q_codes, q_scales, weights, out, bx, bx * rows,
                          nrows, jlo, jhi, rlo, rhi, sft, bx * rows, ncol, 1, 1, 1, 1, nkeys)
                if clean != 0:
                    tx = T.get_thread_binding()
                    for t in T.unroll(rows):
                        if t < nrows:
                            lo = T.max(c0, rhi[t] - sft[t])
                            for it in T.serial(T.ceildiv(T.max(c1 - lo, 0), threads)):
                                col = lo + it * threads + tx
                                if col < c1:
                                    out[bx * rows + t, col] = neg_inf
        return ragged

    nper, nblk, bbytes = T.dynamic("nper, nblk, bbytes")

    @T.prim_func
    def paged(
        q_codes4: T.Tensor((nb_rows, nper, heads, CODE_BYTES), "uint8"),  # [b, n, H, 64] uint8
        q_scales4: T.Tensor((nb_rows, nper, heads, SCALE_BYTES), "uint8"),  # [b, n, H, 4] uint8
        weights3: T.Tensor((nb_rows, nper, heads), "float32"),  # [b, n, H] fp32
        cache2: T.Tensor((nblk, bbytes), "uint8"),  # [num_blocks, Bc * 68] uint8
        table: T.Tensor((nb_rows, mb), "int32"),  # [b, max_blocks] int32
        klen2: T.Tensor((nb_rows, nper), "int32"),  # [b, n] int32
        cand3: T.Tensor((nb_rows, nper, ncand), "int32"),  # [b, n, c] int32 ([b, n, 1] when unused)
        out3: T.Tensor((nb_rows, nper, ncol), "float32"),  # [b, n, max_klen] fp32
        n: T.int32,  # query rows per request
        bc: T.int32,  # rows per cache block
        num_blocks: T.int32,
        cbs: T.int32,  # candidate block size (cand)
        kps: T.int32,  # keys (columns) per CTA
        clean: T.int32,
    ):
        # grid x: requests (cand: query rows), y: column splits
        with T.Kernel(nb_rows if mode == "paged" else nb_rows * nper, T.ceildiv(ncol, kps), threads=threads,
                      prelude=PRELUDE) as (bx, by):
            # the kernel body addresses query rows flat (row = request * n + i) and the cache by byte
            q_codes = T.reshape(q_codes4, (nb_rows * nper, heads * CODE_BYTES))
            q_scales = T.reshape(q_scales4, (nb_rows * nper, heads * SCALE_BYTES))
            weights = T.reshape(weights3, (nb_rows * nper, heads))
            cache = T.reshape(cache2, (nblk * bbytes,))
            klen = T.reshape(klen2, (nb_rows * nper,))
            cand = T.reshape(cand3, (nb_rows * nper, ncand))
            out = T.reshape(out3, (nb_rows * nper, ncol))
            if min_ctas > 1:
                T.annotate_min_blocks_per_sm(min_ctas)
            sm = T.alloc_shared([lay["total"]], "uint32")
            rlo = T.alloc_local([rows], "int32")
            rhi = T.alloc_local([rows], "int32")
            sft = T.alloc_local([rows], "int32")
            jhi = T.alloc_var("int32")
            j0 = by * kps
            j1 = T.min(j0 + kps, ncol)
            nrows = n if mode == "paged" else 1
            row0 = bx * n if mode == "paged" else bx
            req = bx if mode == "paged" else bx // n
            jhi = j0
            for t in T.unroll(rows):
                sft[t] = 0
                rlo[t] = j0
                rhi[t] = j0
                if t < nrows:
                    rhi[t] = T.max(j0, T.min(j1, klen[row0 + t]))
                    jhi = T.max(jhi, rhi[t])
            main_loop(sm, cache, cache, table, cand, q_codes, q_scales, weights, out, req, row0, nrows, j0,
                      jhi, rlo, rhi, sft, row0, ncol, bc, num_blocks, mb, cbs, 0)
            if clean != 0:
                tx = T.get_thread_binding()
                for t in T.unroll(rows):
                    if t < nrows:
                        for it in T.serial(T.ceildiv(j1 - rhi[t], threads)):
                            col = rhi[t] + it * threads + tx
                            if col < j1:
                                out[row0 + t, col] = neg_inf
    return paged
