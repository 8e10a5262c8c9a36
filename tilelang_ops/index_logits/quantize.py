"""TileLang kernel: the index format's cast of query rows, x [rows, 128] bf16 -> (codes [rows, 64],
scales [rows, 4]) (SPEC 2 cast arithmetic: UE8M0 scale per 32 elements, e2m1 codes, RNE).

One thread per 32-element block: 64 bytes in, 16 code bytes and one scale byte out. The arithmetic is the
reference's (``reference.kv_store.quantize_rows_torch``) operation by operation: amax of the BF16 values
(exact), clamped below by 6 * 2^-126; ``amax / 6`` as an IEEE division, rounded up to a power of two by its
bits; ``x * (1 / sf)`` (exact: sf is a power of two); the e2m1 code by the reference's RNE thresholds.
"""


import functools
import operator
import struct

import tilelang
import tilelang.language as T

from metadata.cache_format import FP4_INDEX_KV_FORMAT

FMT = FP4_INDEX_KV_FORMAT
GROUP = FMT.group_size
THREADS = 128
# the reference's e2m1 thresholds (cast_to_e2m1_codes): (threshold, True when the midpoint goes up)
THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True),
              (5.0, False))


def _f32(v: float):
    return T.reinterpret(T.uint32(struct.unpack("<I", struct.pack("<f", v))[0]), "float32")


@tilelang.jit(pass_configs={tilelang.PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True})
def quantize_kernel(threads: int = THREADS, lead_rank: int = 1):
    """codes / scales of every 32-element block of x (one thread each); the tensors come in the caller's
    shape, ``lead_rank`` leading dimensions before the row's, and are addressed as rows."""
    lead = [T.dynamic(f"lead{i}") for i in range(lead_rank)] if lead_rank > 1 else [T.dynamic("rows")]
    rows = functools.reduce(operator.mul, lead)
    blocks = FMT.num_scales

    @T.prim_func
    def kernel(
        xn: T.Tensor((*lead, FMT.dim), "bfloat16"),  # [*lead, 128] bf16
        codes_n: T.Tensor((*lead, FMT.data_bytes), "uint8"),  # [*lead, 64] uint8, element 2i low nibble
        scales_n: T.Tensor((*lead, blocks), "uint8"),  # [*lead, 4] uint8, UE8M0
    ):
        with T.Kernel(T.ceildiv(rows * blocks, threads), threads=threads) as bx:
            x = T.reshape(xn, (rows, FMT.dim))
            codes = T.reshape(codes_n, (rows, FMT.data_bytes))
            scales = T.reshape(scales_n, (rows, blocks))
            job = bx * threads + T.get_thread_binding()
            xl = T.alloc_local([GROUP], "bfloat16")
            v = T.alloc_local([GROUP], "float32")
            out = T.alloc_local([GROUP // 2], "uint8")
            amax = T.alloc_var("float32")
            bits = T.alloc_var("uint32")
            inv = T.alloc_var("float32")
            if job < rows * blocks:
                row = job // blocks
                blk = job % blocks
                for i in T.vectorized(GROUP):
                    xl[i] = x[row, blk * GROUP + i]
                amax = _f32(FMT.amax_floor)
                for i in T.unroll(GROUP):
                    v[i] = T.Cast("float32", xl[i])
                    amax = T.max(amax, T.abs(v[i]))
                bits = T.reinterpret(T.ieee_fdiv(amax, _f32(FMT.qmax)), "uint32")
                bits = (bits + T.uint32(0x7FFFFF)) & T.uint32(0x7F800000)
                inv = T.ieee_fdiv(_f32(1.0), T.reinterpret(bits, "float32"))
                for i in T.unroll(GROUP // 2):
                    out[i] = T.uint8(0)
                for i in T.unroll(GROUP):
                    z = T.min(T.max(T.ieee_mul(v[i], inv), _f32(-FMT.qmax)), _f32(FMT.qmax))
                    mag = T.abs(z)
                    code = T.Cast("uint8", T.reinterpret(z, "uint32") >> T.uint32(31)) << T.uint8(3)
                    for th, up in THRESHOLDS:
                        hit = mag >= _f32(th) if up else mag > _f32(th)
                        code = code + T.Cast("uint8", T.if_then_else(hit, 1, 0))
                    out[i // 2] = out[i // 2] | (code << T.uint8(4 * (i % 2)))
                for i in T.vectorized(GROUP // 2):
                    codes[row, blk * (GROUP // 2) + i] = out[i]
                scales[row, blk] = T.Cast("uint8", bits >> T.uint32(23))

    return kernel
