"""References for the index-logits operators (SPEC section 5): the query-side cast and the scores
``I[t, j] = sum_h w[t, h] * relu(q[t, h] . k[j])`` over FP4 index rows.

Loop references (``*_ref``) walk query rows, keys and heads one by one with IEEE FP32 scalars; the
vectorized twins (``*_torch``, tested bitwise equal) do the same operations on whole batches and serve as
the GPU oracle and the torch eager / torch.compile benchmark peers.

**The FP32 order** (it is the kernel's; exact products and sums are exact in any order, so only the
roundings named here can differ between orders, and they are fixed). Codes are doubled so every e2m1 value
is an integer (``2v`` in {0, 1, 2, 3, 4, 6, 8, 12}, sign from bit 3). For query head ``h`` (scale bytes
``eq[h, b]``, ``Eq = max_b eq[h, b]``) and key ``j`` (``ek[j, b]``, ``Ek = max_b ek[j, b]``):

1. ``dot4[b] = sum_{i in block b} (2 q_i) (2 k_i)``: an exact integer (|dot4| <= 4608).
2. ``t[b] = fp32(dot4[b] * 2^(6 + (ek[j, b] - Ek) + (eq[h, b] - Eq)))``: rounded once (exact unless a
   block lies more than ~100 binades below the row's largest).
3. ``Y = ((t[0] + t[1]) + t[2]) + t[3]`` in FP32. Where no block of the key or of the head is more than
   3 binades below its row's largest, every ``t`` is an integer and the sums are exact: ``Y`` is then the
   exact dot ``q_h . k_j`` times ``2^(262 - Eq - Ek)``.
4. ``Wq[h] = fp32(w[t, h] * 2^(Eq - 160))`` (one rounding, exact unless subnormal).
5. Head sum, in groups of 32 heads ``G`` and four "lanes" ``l``: ``p[G][l] = fma(relu(Y_h), Wq[h], p)``
   from ``p = 0`` over ``h = 32 G + 8 u + 2 l + c`` in the order ``u = 0..3, c = 0..1`` (one rounding per
   step); ``S_G = (p[G][0] + p[G][1]) + (p[G][2] + p[G][3])``; ``S = S_0 (+ S_1 for H = 64)``.
6. ``I = fp32(S * 2^(Ek - 102))`` (one rounding; 102 + 160 = 262 undoes the scalings of 2 and 4).

The scalings by powers of two in 2, 4 and 6 only move the FP32 exponent range in which the sums run; the
value is ``sum_h w_h relu(q_h . k_j)`` with the dot exact (step 3) and one rounding per head (step 5).
Scale bytes are UE8M0 exponents (value ``2^(byte - 127)``); the cast (SPEC 2) writes bytes 1..253.

Columns at or beyond a row's valid count are left as they are unless ``clean`` (then -inf); a candidate
block of -1 gives -inf columns.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from metadata.cache_format import FP4_INDEX_KV_FORMAT
from metadata.index_logits_args import (
    CODE_BYTES,
    INDEX_DIM,
    check_paged_args,
    check_paged_values,
    check_quantize_args,
    check_ragged_args,
    check_ragged_values,
)
from reference.kv_store import quantize_row, quantize_rows_torch

FMT = FP4_INDEX_KV_FORMAT
GROUP = FMT.group_size  # 32 elements per scale
BLOCKS = FMT.num_scales  # 4 scale blocks per row
HEAD_GROUP = 32  # heads per partial sum group (step 5)
# 2v for the e2m1 codes 0..15 (bit 3 is the sign): every value an integer
CODES2 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
Q_OFFSET = 160  # step 4: Wq = w * 2^(Eq - Q_OFFSET)
K_OFFSET = 102  # step 6: I = S * 2^(Ek - K_OFFSET)
T_SHIFT = 6  # step 2: 2^(6 + rel) keeps every t an integer while both spreads are at most 3


# ----------------------------------------------------------------------------------------------
# The query-side cast (SPEC 5): the index format's e2m1 / UE8M0 / group-32 cast of section 2.
# ----------------------------------------------------------------------------------------------

def quantize_index_rows_ref(x):
    """x [..., 128] bf16 -> (codes [..., 64] uint8, scales [..., 4] uint8), row by row with the store's
    cast (``reference.kv_store.quantize_row`` on FP4_INDEX_KV_FORMAT)."""
    lead = check_quantize_args(x)
    rows = x.detach().reshape(-1, INDEX_DIM).cpu()
    codes = torch.empty(rows.shape[0], CODE_BYTES, dtype=torch.uint8)
    scales = torch.empty(rows.shape[0], BLOCKS, dtype=torch.uint8)
    for i in range(rows.shape[0]):
        codes[i], scales[i] = quantize_row(rows[i].float(), FMT)
    return codes.reshape(*lead, CODE_BYTES).to(x.device), scales.reshape(*lead, BLOCKS).to(x.device)


def quantize_index_rows_torch(x):
    """Vectorized twin of ``quantize_index_rows_ref`` (``reference.kv_store.quantize_rows_torch``)."""
    lead = check_quantize_args(x)
    codes, scales = quantize_rows_torch(x.reshape(-1, INDEX_DIM).float(), FMT)
    return codes.reshape(*lead, CODE_BYTES), scales.reshape(*lead, BLOCKS)


# ----------------------------------------------------------------------------------------------
# Scalar pieces of the loop reference (numpy float32 scalars round like IEEE FP32 operations).
# ----------------------------------------------------------------------------------------------

def codes2(row_codes) -> list[int]:
    """64 packed bytes -> the 128 doubled e2m1 values (element 2i in the low nibble of byte i)."""
    out = []
    for byte in row_codes.tolist():
        out += [CODES2[byte & 0xF], CODES2[byte >> 4]]
    return out


def fma32(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    """fp32(a * b + c) with one rounding. a * b is exact in double (24 + 24 bits); the sum is rounded to
    odd in double (the RN sum moved to its odd neighbour when inexact), which then rounds to FP32
    correctly (53 >= 24 + 2 bits)."""
    p, cc = float(a) * float(b), float(c)
    s = p + cc
    if math.isfinite(s):
        bp = s - p
        err = (p - (s - bp)) + (cc - bp)  # p + cc == s + err exactly (TwoSum)
        if err != 0 and (np.float64(s).view(np.int64) & 1) == 0:
            s = math.nextafter(s, math.inf if err > 0 else -math.inf)
    return np.float32(s)


def pow2_scale(x, e: int) -> np.float32:
    """fp32(x * 2^e), rounded once (the double product is exact; beyond the FP32 range: inf)."""
    with np.errstate(over="ignore"):
        return np.float32(math.ldexp(float(x), e))


def key_score(q2: list, eq: list, wq: list, k2: list, ek: list) -> np.float32:
    """I for one query row (H heads: doubled codes q2[h], scale bytes eq[h], Wq[h]) and one key (doubled
    codes k2, scale bytes ek), steps 1-6 of the module docstring."""
    heads = len(q2)
    big_k = max(ek)
    zero = np.float32(0.0)
    partial = [[zero] * 4 for _ in range(heads // HEAD_GROUP)]
    for g in range(heads // HEAD_GROUP):
        for lane in range(4):
            for u in range(4):
                for c in range(2):
                    h = HEAD_GROUP * g + 8 * u + 2 * lane + c
                    big_q = max(eq[h])
                    y = None
                    for b in range(BLOCKS):
                        dot4 = sum(q2[h][i] * k2[i] for i in range(GROUP * b, GROUP * (b + 1)))
                        t = pow2_scale(dot4, T_SHIFT + (ek[b] - big_k) + (eq[h][b] - big_q))
                        y = t if y is None else np.float32(y + t)
                    partial[g][lane] = fma32(max(y, zero), wq[h], partial[g][lane])
    s = None
    for g in range(heads // HEAD_GROUP):
        p = partial[g]
        sg = np.float32(np.float32(p[0] + p[1]) + np.float32(p[2] + p[3]))
        s = sg if s is None else np.float32(s + sg)
    return pow2_scale(s, big_k - K_OFFSET)


def query_row(q_codes_row, q_scales_row, w_row) -> tuple[list, list, list]:
    """(doubled codes [H][128], scale bytes [H][4], Wq [H]) of one query row (step 4)."""
    q2 = [codes2(q_codes_row[h]) for h in range(q_codes_row.shape[0])]
    eq = q_scales_row.tolist()
    wq = [pow2_scale(np.float32(w), max(e) - Q_OFFSET) for w, e in zip(w_row.tolist(), eq)]
    return q2, eq, wq


def _output(out, shape, device):
    return out if out is not None else torch.empty(shape, dtype=torch.float32, device=device)


# ----------------------------------------------------------------------------------------------
# Loop references.
# ----------------------------------------------------------------------------------------------

def paged_index_logits_ref(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen, *,
                           candidate_blocks=None, candidate_block_size=None, clean=False, out=None):
    """logits[r, t, j] = sum_h w[r, t, h] * relu(q[r, t, h] . k[row j]) for j < klen[r, t].

    q_codes [b, n, H, 64] uint8, q_scales [b, n, H, 4] uint8, weights [b, n, H] fp32,
    index_cache [num_blocks, Bc * 68] uint8 (FP4_INDEX_KV_FORMAT), block_tables [b, max_blocks] int32,
    klen [b, n] int32, max_klen host int; candidate_blocks [b, n, c] int32 with candidate_block_size
    (8 or 16): column i scores logical row blocks[i // bs] * bs + i % bs (-inf for a block of -1).
    Row j of request r lives at slot block_tables[r, j // Bc] * Bc + j % Bc. Columns >= klen keep their
    values unless clean (-inf). Returns logits [b, n, max_klen] fp32 (``out`` when given).
    """
    geom = check_paged_args(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen,
                            candidate_blocks=candidate_blocks, candidate_block_size=candidate_block_size,
                            clean=clean, out=out)
    check_paged_values(block_tables, klen, geom, candidate_blocks)
    logits = _output(out, (geom.b, geom.n, max_klen), q_codes.device)
    cache, table = index_cache.cpu(), block_tables.cpu().tolist()
    cand = None if candidate_blocks is None else candidate_blocks.cpu().tolist()
    rpb, bs = geom.rows_per_block, geom.candidate_block_size
    for r in range(geom.b):
        for t in range(geom.n):
            q2, eq, wq = query_row(q_codes[r, t].cpu(), q_scales[r, t].cpu(), weights[r, t].cpu())
            valid = int(klen[r, t])
            row = torch.full((max_klen,), float("-inf"))
            for j in range(valid):
                logical = j
                if cand is not None:
                    blk = cand[r][t][j // bs]
                    if blk < 0:
                        continue  # no key: stays -inf
                    logical = blk * bs + j % bs
                block, pos = table[r][logical // rpb], logical % rpb
                d0, s0 = FMT.data_offset(pos, rpb), FMT.scale_offset(pos, rpb)
                k2 = codes2(cache[block, d0:d0 + FMT.data_bytes])
                ek = cache[block, s0:s0 + FMT.scale_bytes].tolist()
                row[j] = float(key_score(q2, eq, wq, k2, ek))
            upto = max_klen if clean else valid
            logits[r, t, :upto] = row[:upto].to(logits.device)
    return logits


def ragged_index_logits_ref(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, *,
                            clean=False, out=None):
    """logits[t, i] = sum_h w[t, h] * relu(q[t, h] . k[ks[t] + i]) for i < ke[t] - ks[t].

    q_codes [T, H, 64] uint8, q_scales [T, H, 4] uint8, weights [T, H] fp32, k_codes [N, 64] uint8,
    k_scales [N, 4] uint8 (gathered keys), ks / ke [T] int32, max_width host int. Columns >= ke - ks keep
    their values unless clean (-inf). Returns logits [T, max_width] fp32 (``out`` when given); top-k takes
    ``end = ke - ks`` and ``output_idx_offset = ks``.
    """
    geom = check_ragged_args(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, clean=clean,
                             out=out)
    check_ragged_values(ks, ke, geom)
    logits = _output(out, (geom.t, max_width), q_codes.device)
    kc, ksc = k_codes.cpu(), k_scales.cpu()
    for t in range(geom.t):
        q2, eq, wq = query_row(q_codes[t].cpu(), q_scales[t].cpu(), weights[t].cpu())
        lo, hi = int(ks[t]), int(ke[t])
        row = torch.full((max_width,), float("-inf"))
        for i in range(hi - lo):
            row[i] = float(key_score(q2, eq, wq, codes2(kc[lo + i]), ksc[lo + i].tolist()))
        upto = max_width if clean else hi - lo
        logits[t, :upto] = row[:upto].to(logits.device)
    return logits


# ----------------------------------------------------------------------------------------------
# Vectorized twins: the same operations on [keys, heads] tensors.
# ----------------------------------------------------------------------------------------------

_CODES2_T = torch.tensor(CODES2, dtype=torch.float32)


def codes2_torch(codes: torch.Tensor) -> torch.Tensor:
    """[..., 64] uint8 -> [..., 128] fp32 doubled e2m1 values (integers, exact in any float type)."""
    table = _CODES2_T.to(codes.device)
    lo, hi = table[(codes & 0xF).long()], table[(codes >> 4).long()]
    return torch.stack((lo, hi), -1).reshape(*codes.shape[:-1], INDEX_DIM)


def fma32_torch(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``fma32`` on tensors (broadcasting): fp32(a * b + c) with one rounding."""
    p, cc = a.double() * b.double(), c.double()
    s = p + cc
    bp = s - p
    err = (p - (s - bp)) + (cc - bp)
    even = (s.view(torch.int64) & 1) == 0
    fix = (err != 0) & even & torch.isfinite(s)
    toward = torch.where(err > 0, torch.full_like(s, math.inf), torch.full_like(s, -math.inf))
    return torch.where(fix, torch.nextafter(s, toward), s).float()


def pow2_scale_torch(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """fp32(x * 2^e) with one rounding: the double product is exact (2^e built from its bits, |e| < 1000)."""
    p2 = ((e.long() + 1023) << 52).view(torch.float64)
    return (x.double() * p2).float()


def query_rows_torch(q_codes, q_scales, weights):
    """[..., H, 64], [..., H, 4], [..., H] -> (doubled codes [..., H, 128] fp32, scale bytes [..., H, 4]
    int64, Eq [..., H] int64, Wq [..., H] fp32)."""
    eq = q_scales.long()
    big_q = eq.amax(-1)
    wq = pow2_scale_torch(weights.float(), big_q - Q_OFFSET)
    return codes2_torch(q_codes), eq, big_q, wq


def key_scores_torch(q2, eq, big_q, wq, k2, ek) -> torch.Tensor:
    """I for batches of R query rows against J keys each: q2 [B, R, H, 128], eq [B, R, H, 4], big_q /
    wq [B, R, H] (from ``query_rows_torch``), k2 [B, J, 128] fp32 doubled codes, ek [B, J, 4] int64.
    Returns [B, R, J] fp32."""
    nb, nr, heads = q2.shape[:3]
    big_k = ek.amax(-1)  # [B, J]
    # step 1: exact integer dots; products <= 144 and sums <= 4608 are exact even in TF32 / BF16 GEMMs
    dot4 = torch.einsum("zrhki,zjki->zrjhk", q2.reshape(nb, nr, heads, BLOCKS, GROUP),
                        k2.reshape(nb, -1, BLOCKS, GROUP))  # [B, R, J, H, 4]
    rel = (ek - big_k[..., None])[:, None, :, None, :] + (eq - big_q[..., None])[:, :, None, :, :]
    t = pow2_scale_torch(dot4, T_SHIFT + rel)  # step 2
    y = (((t[..., 0] + t[..., 1]) + t[..., 2]) + t[..., 3]).clamp_min(0.0)  # step 3, [B, R, J, H]
    # step 5: heads h = 32 G + 8 u + 2 l + c -> [..., G, u, l, c]
    y = y.reshape(nb, nr, -1, heads // HEAD_GROUP, 4, 4, 2)
    w = wq.reshape(nb, nr, 1, heads // HEAD_GROUP, 4, 4, 2)
    p = torch.zeros(y.shape[:4] + (4,), dtype=torch.float32, device=y.device)  # [B, R, J, G, l]
    for u in range(4):
        for c in range(2):
            p = fma32_torch(y[..., u, :, c], w[..., u, :, c], p)
    sg = (p[..., 0] + p[..., 1]) + (p[..., 2] + p[..., 3])  # [B, R, J, G]
    s = sg[..., 0]
    for g in range(1, sg.shape[-1]):
        s = s + sg[..., g]
    return pow2_scale_torch(s, (big_k - K_OFFSET)[:, None, :])  # step 6


def _key_chunk(batch: int, heads: int) -> int:
    """Keys per pass of the twins: about 2^24 (batch, key, head, block) temporaries."""
    return max(64, min(8192, (1 << 24) // max(1, batch * heads * BLOCKS)))


def _gather_rows(flat, width, rpb, phys, pos):
    """Doubled codes [..., 128] and scale bytes [..., 4] of cache rows (block phys, row pos)."""
    dev = flat.device
    d0 = phys * width + pos * FMT.data_bytes
    s0 = phys * width + rpb * FMT.data_bytes + pos * FMT.scale_bytes
    k2 = codes2_torch(flat[d0[..., None] + torch.arange(FMT.data_bytes, device=dev)])
    return k2, flat[s0[..., None] + torch.arange(FMT.scale_bytes, device=dev)].long()


def paged_index_logits_torch(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen, *,
                             candidate_blocks=None, candidate_block_size=None, clean=False, out=None):
    """Vectorized twin of ``paged_index_logits_ref`` (same signature, same checks, same bits)."""
    geom = check_paged_args(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen,
                            candidate_blocks=candidate_blocks, candidate_block_size=candidate_block_size,
                            clean=clean, out=out)
    check_paged_values(block_tables, klen, geom, candidate_blocks)
    return paged_index_logits_torch_unchecked(q_codes, q_scales, weights, index_cache, block_tables, klen,
                                              max_klen, candidate_blocks=candidate_blocks,
                                              candidate_block_size=candidate_block_size, clean=clean, out=out)


def paged_index_logits_torch_unchecked(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen,
                                       *, candidate_blocks=None, candidate_block_size=None, clean=False,
                                       out=None, scorer=None):
    """The arithmetic of ``paged_index_logits_torch`` (host checks only), with ``scorer``
    (``key_scores_torch`` when None, or a torch.compile of it: the benchmark's peer) scoring each chunk of
    keys. Like the kernel it trusts the metadata: a column it cannot resolve (block-table entry outside
    the cache, logical row beyond the table) scores -inf, and klen is cut at max_klen."""
    scorer = scorer or key_scores_torch
    geom = check_paged_args(q_codes, q_scales, weights, index_cache, block_tables, klen, max_klen,
                            candidate_blocks=candidate_blocks, candidate_block_size=candidate_block_size,
                            clean=clean, out=out)
    dev = q_codes.device
    logits = _output(out, (geom.b, geom.n, max_klen), dev)
    if max_klen == 0 or geom.b == 0:
        return logits
    b, n, rpb, bs = geom.b, geom.n, geom.rows_per_block, geom.candidate_block_size
    q2, eq, big_q, wq = query_rows_torch(q_codes, q_scales, weights)  # [b, n, H, ...]
    cand = candidate_blocks is not None
    if cand:  # every row has its own keys: a batch of b * n single rows
        q2, eq, big_q, wq = (x.reshape(b * n, 1, *x.shape[2:]) for x in (q2, eq, big_q, wq))
    valid = klen.long().clamp(0, max_klen)  # [b, n]
    table = block_tables.long()
    chunk = _key_chunk(b * n, geom.heads)
    for j0 in range(0, max_klen, chunk):
        col = torch.arange(j0, min(j0 + chunk, max_klen), device=dev)
        if cand:
            blk = candidate_blocks.long()[:, :, col // bs]  # [b, n, J]
            logical, ok = blk * bs + col % bs, blk >= 0
        else:
            logical = col[None, :].expand(b, -1)  # [b, J]: the n rows share their keys
            ok = torch.ones_like(logical, dtype=torch.bool)
        tblk = torch.div(logical, rpb, rounding_mode="floor")
        ok = ok & (tblk < geom.max_blocks)
        idx = tblk.clamp(0, geom.max_blocks - 1)
        phys = table.gather(1, idx.reshape(b, -1)).reshape(idx.shape)
        ok = ok & (phys >= 0) & (phys < geom.num_blocks)
        k2, ek = _gather_rows(index_cache.reshape(-1), index_cache.shape[1], rpb, torch.where(ok, phys, 0),
                              logical % rpb)
        if cand:
            scores = scorer(q2, eq, big_q, wq, k2.reshape(b * n, -1, INDEX_DIM),
                            ek.reshape(b * n, -1, BLOCKS)).reshape(b, n, -1)
        else:
            scores = scorer(q2, eq, big_q, wq, k2, ek)
            ok = ok[:, None, :]
        scores = torch.where(ok, scores, torch.full_like(scores, float("-inf")))
        keep = col[None, None, :] < valid[:, :, None]
        if clean:
            scores = torch.where(keep, scores, torch.full_like(scores, float("-inf")))
            keep = torch.ones_like(keep)
        seg = logits[:, :, j0:j0 + col.numel()]
        seg.copy_(torch.where(keep, scores, seg))
    return logits


RAGGED_ROWS = 16  # query rows scored together against their keys' union in the ragged twin


def ragged_index_logits_torch(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, *,
                              clean=False, out=None):
    """Vectorized twin of ``ragged_index_logits_ref`` (same signature, same checks, same bits)."""
    geom = check_ragged_args(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, clean=clean,
                             out=out)
    check_ragged_values(ks, ke, geom)
    return ragged_index_logits_torch_unchecked(q_codes, q_scales, weights, k_codes, k_scales, ks, ke,
                                               max_width, clean=clean, out=out)


def ragged_index_logits_torch_unchecked(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, *,
                                        clean=False, out=None, scorer=None):
    """The arithmetic of ``ragged_index_logits_torch`` (host checks only), with ``scorer``
    (``key_scores_torch`` when None) scoring each group of ``RAGGED_ROWS`` rows against the union of
    their key ranges (read on the host: a reference may sync). Like the kernel it trusts the metadata:
    keys outside [0, N) score -inf and widths are cut at max_width."""
    scorer = scorer or key_scores_torch
    geom = check_ragged_args(q_codes, q_scales, weights, k_codes, k_scales, ks, ke, max_width, clean=clean,
                             out=out)
    dev = q_codes.device
    logits = _output(out, (geom.t, max_width), dev)
    if clean:
        logits.fill_(float("-inf"))
    if max_width == 0 or geom.t == 0:
        return logits
    q2, eq, big_q, wq = query_rows_torch(q_codes, q_scales, weights)
    k2_all, ek_all = codes2_torch(k_codes), k_scales.long()
    lo_all = ks.long()
    width = (ke.long() - lo_all).clamp(0, max_width)
    starts, widths = lo_all.tolist(), width.tolist()
    chunk = _key_chunk(RAGGED_ROWS, geom.heads)
    for t0 in range(0, geom.t, RAGGED_ROWS):
        t1 = min(t0 + RAGGED_ROWS, geom.t)
        live = [t for t in range(t0, t1) if widths[t] > 0]
        if not live:
            continue
        lo = min(starts[t] for t in live)
        hi = max(starts[t] + widths[t] for t in live)
        rows = slice(t0, t1)
        for k0 in range(lo, hi, chunk):
            key = torch.arange(k0, min(k0 + chunk, hi), device=dev)
            ok = (key >= 0) & (key < geom.num_keys)
            idx = torch.where(ok, key, 0)
            scores = scorer(q2[None, rows], eq[None, rows], big_q[None, rows], wq[None, rows],
                            k2_all[idx][None], ek_all[idx][None])[0]  # [rows, J]
            scores = torch.where(ok[None, :], scores, torch.full_like(scores, float("-inf")))
            col = key[None, :] - lo_all[rows, None]  # [rows, J]
            keep = (col >= 0) & (col < width[rows, None])
            r_idx = torch.arange(t0, t1, device=dev)[:, None].expand_as(col)
            logits[r_idx[keep], col[keep]] = scores[keep]
    return logits
