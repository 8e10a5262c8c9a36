"""The store kernel: rows -> ``make_row_store``'s pipeline -> paged cache, one launch.

A row of ``dim`` elements sits on ``dim / 16 / chunks`` lanes of one warp, each lane holding ``chunks``
16-element chunks in registers; a CTA of 128 threads stores ``rows_per_cta`` rows at a time,
``rows_per_thread`` (R) times: each thread's R rows (``rows_per_cta`` apart, so a CTA covers R *
rows_per_cta consecutive rows) are all loaded before the first row's math (R times the bytes in flight).
With ``weight_smem`` the CTA converts the weights to FP32 once into shared memory and the norm reads
each row's weights there (4 conflict-free 16-byte loads a chunk); otherwise each lane converts its
weights into registers once.
"""

import tilelang
import tilelang.language as T

from tilelang_ops.kv_store.config import FORMATS, THREADS, VEC, KVStoreConfig, uses_hadamard_mma
from tilelang_ops.kv_store.preludes import (
    AMAX_PRELUDE,
    BF16X2_PRELUDE,
    HMMA_PRELUDE,
    INV_E4M3_PRELUDE,
    PRED_STORE_PRELUDE,
)
from tilelang_ops.kv_store.row_store import _smem_weight_index, make_row_store


# The store guard is `slot < capacity` (a host-computed argument), which TileLang cannot relate to the
# cache's extent: its safe-memory pass would then split every vector store into guarded byte stores.
# Every access is guarded or clamped by hand (see make_row_store), so the pass is off. The shared memory
# (weight_smem, rope_spread) is synchronized by hand too (one __syncthreads after the weights, __syncwarp
# around a row's RoPE exchange), so TileLang's automatic barriers are off as well, and so is its
# shared-memory reuse: the weights' last read in one warp is no barrier for the others.
@tilelang.jit(pass_configs={tilelang.PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True,
                             tilelang.PassConfigKey.TL_DISABLE_THREAD_STORAGE_SYNC: True,
                             tilelang.PassConfigKey.TL_DISABLE_SHARED_MEMORY_REUSE: True})
def kv_store_kernel(fmt_name: str, rope_dim: int, interleaved: bool, hadamard: bool, has_out_norm: bool,
                    rows_per_block: int, weight_dtype: str, pos_dtype: str, slot_dtype: str,
                    config: KVStoreConfig):
    """The store kernel for one call shape (format .. slot dtype) built as ``config`` says."""
    fmt = FORMATS[fmt_name]
    dim = fmt.dim
    C = config.chunks
    lanes = dim // VEC // C
    rows_per_cta = THREADS // lanes
    R = config.rows_per_thread
    min_ctas = config.min_ctas
    weight_smem = config.weight_smem
    pred_store = config.pred_store
    half = rope_dim // 2
    wvec = 8 if weight_dtype == "bfloat16" else 4  # 16-byte loads
    row_store = make_row_store(fmt, config, rope_dim=rope_dim, interleaved=interleaved, hadamard=hadamard,
                               has_out_norm=has_out_norm, rows_per_block=rows_per_block,
                               weight_dtype=weight_dtype)
    # the helpers are declared only where they are called (other kernels' sources stay free of them)
    prelude = "".join(text for on, text in ((config.e2m1_bf16x2, BF16X2_PRELUDE),
                                            (config.inv_table, INV_E4M3_PRELUDE),
                                            (config.amax_bf16x2, AMAX_PRELUDE),
                                            (uses_hadamard_mma(fmt, hadamard, config), HMMA_PRELUDE),
                                            (pred_store and C > 1, PRED_STORE_PRELUDE))
                      if on) or None
    rows, norm_rows, max_pos = T.dynamic("rows, norm_rows, max_pos")
    # the cache as the caller holds it ([num_blocks, bytes per block]: no view per call); the body
    # addresses it flat
    num_blocks, cache_block_bytes = T.dynamic("num_blocks, cache_block_bytes", "int64")
    cache_bytes = num_blocks * cache_block_bytes
    block_bytes = rows_per_block * fmt.row_bytes

    # with pred_store each row index lives in an int32 local (rix, filled by load_rows), so its clamp is not
    # widened to 64 bits at every use as a buffer index (it pays only together with the predicated stores:
    # docs/design.md)
    rows32 = pred_store and C > 1

    def row_of(rix, g, k, tx):
        """Row k of group g for this thread, clamped to the last row."""
        return rix[k] if rows32 else T.min((g * R + k) * rows_per_cta + tx // lanes, rows - 1)

    @T.macro
    def load_rows(kv, positions, slots, xb, posv, slotv, rix, g, tx, lane, rows):
        """Row group g's R rows (this lane's chunks), positions and slots (rows clamped to the last)."""
        if rows32:
            for k in T.unroll(R):
                rix[k] = T.min((g * R + k) * rows_per_cta + tx // lanes, rows - 1)
        for k in T.unroll(R):
            for c in T.unroll(C):
                for v in T.unroll(2):
                    for i in T.vectorized(8):
                        xb[(k * C + c) * VEC + v * 8 + i] = kv[row_of(rix, g, k, tx),
                                                               (lane + c * lanes) * VEC + v * 8 + i]
        for k in T.unroll(R):
            posv[k] = T.Cast("int64", positions[row_of(rix, g, k, tx)])
            slotv[k] = T.Cast("int64", slots[row_of(rix, g, k, tx)])

    @T.macro
    def widen_row(xw, x, k):
        """x = float(row k of the loaded rows) (BF16 pairs widen with one shift / one mask)."""
        for i in T.unroll(C * VEC // 2):
            x[2 * i] = T.reinterpret(xw[k * C * VEC // 2 + i] << T.uint32(16), "float32")
            x[2 * i + 1] = T.reinterpret(xw[k * C * VEC // 2 + i] & T.uint32(0xFFFF0000), "float32")

    @T.macro
    def store_rows(xb, x, weights, posv, slotv, rix, g, tx, lane, rows, cos, sin, cache, out_norm, max_pos,
                   capacity, eps):
        """Widen row group g's loaded rows and run the row pipeline on each (``weights``: the lane's FP32
        weights in registers, or with ``weight_smem`` the CTA's shared copy)."""
        xw = T.view(xb, [R * C * VEC // 2], "uint32")
        for k in T.unroll(R):
            widen_row(xw, x, k)
            row_store(x, lane, weights, cos, sin, cache, out_norm, posv[k], slotv[k],
                      (g * R + k) * rows_per_cta + tx // lanes < rows, row_of(rix, g, k, tx), max_pos,
                      capacity, eps)

    @T.prim_func
    def kernel(
        kv: T.Tensor((rows, dim), "bfloat16"),  # [rows, dim] bf16
        weight: T.Tensor((dim,), weight_dtype),  # [dim] bf16 or fp32
        cos: T.Tensor((max_pos, half), "float32"),  # [max_position, rope_dim / 2] fp32
        sin: T.Tensor((max_pos, half), "float32"),  # [max_position, rope_dim / 2] fp32
        positions: T.Tensor((rows,), pos_dtype),  # [rows] int32/int64
        slots: T.Tensor((rows,), slot_dtype),  # [rows] int32/int64, < 0: skip
        cache2: T.Tensor((num_blocks, cache_block_bytes), "uint8"),  # [num_blocks, block_bytes] uint8
        out_norm: T.Tensor((norm_rows, dim), "bfloat16"),  # [rows, dim] bf16 (or [1, dim] dummy)
        eps: T.float32,
        capacity: T.int64,  # slots in the cache (chunks 1 derives it from the cache's shape instead)
    ):
        with T.Kernel(T.ceildiv(rows, rows_per_cta * R), threads=THREADS, prelude=prelude) as bx:
            cache = T.reshape(cache2, (cache_bytes,))
            if min_ctas > 1:
                T.annotate_min_blocks_per_sm(min_ctas)
            tx = T.get_thread_binding()
            lane = tx % lanes
            xb = T.alloc_local([R * C * VEC], "bfloat16")
            x = T.alloc_local([C * VEC], "float32")
            wl = T.alloc_local([C * VEC], weight_dtype)
            wf = T.alloc_local([C * VEC], "float32")
            posv = T.alloc_local([R], "int64")
            slotv = T.alloc_local([R], "int64")
            rix = T.alloc_local([R], "int32")  # (rows32) the rows, clamped
            # every load first: R rows (tail rows redo the last row: they must shuffle, store nothing)
            load_rows(kv, positions, slots, xb, posv, slotv, rix, bx, tx, lane, rows)
            if weight_smem:
                assert dim % THREADS == 0, (dim, THREADS)  # every thread fills dim / THREADS weights
                s_w = T.alloc_shared([dim], "float32")
                for e in T.unroll(dim // THREADS):  # weight element e * THREADS + tx
                    s_w[_smem_weight_index((e * THREADS + tx) // VEC, (e * THREADS + tx) % VEC // 4,
                                           (e * THREADS + tx) % 4, dim)] = T.Cast("float32",
                                                                                  weight[e * THREADS + tx])
                T.sync_threads()
            else:
                for c in T.unroll(C):
                    for v in T.unroll(VEC // wvec):
                        for i in T.vectorized(wvec):
                            wl[c * VEC + v * wvec + i] = weight[(lane + c * lanes) * VEC + v * wvec + i]
                if weight_dtype == "bfloat16":
                    ww = T.view(wl, [C * VEC // 2], "uint32")
                    for i in T.unroll(C * VEC // 2):
                        wf[2 * i] = T.reinterpret(ww[i] << T.uint32(16), "float32")
                        wf[2 * i + 1] = T.reinterpret(ww[i] & T.uint32(0xFFFF0000), "float32")
                else:
                    for i in T.unroll(C * VEC):
                        wf[i] = T.Cast("float32", wl[i])
            store_rows(xb, x, s_w if weight_smem else wf, posv, slotv, rix, bx, tx, lane, rows, cos, sin,
                       cache, out_norm, max_pos,
                       capacity if C > 1 else (cache_bytes // block_bytes) * rows_per_block, eps)

    return kernel

