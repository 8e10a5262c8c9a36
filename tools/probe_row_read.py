"""How fast one 1024-thread CTA per row brings an FP32 row into the SM, by the way it reads: the top-k
compaction's question (its 32768-entry rows take ~4.9 us for 128 KiB on 64 SMs, ~1.2 us a tile of 8192
entries, i.e. about one memory latency per tile with one tile in flight). CUDA only:

    python tools/probe_row_read.py [n] [rows ...]

Each kernel reads its row once and sums the bits (so nothing is optimized away), timed with the
benchmark harness (time_us, the 256 MiB L2 flush): ld8 (registers, one tile of 8 entries a thread in
flight ahead of the one being summed, the compaction's pipeline), ld32 (all 32 a thread in flight at
once), cp16 (16-byte cp.async into shared memory, one wait), tma (the row in 4 bulk copies
cp.async.bulk into shared memory, one mbarrier), and empty (the launch alone).

H200 (session 24), us, 64 / 128 rows of 32768: empty 2.98 / 3.01, ld8 6.75 / 9.34, ld32 6.82 / 9.36, cp16
7.34 / 9.76, tma 7.55 / 10.38. Keeping more of the row in flight does not read it faster, and neither copy
engine beats plain loads: after the harness's flush (dirty lines the read's misses write back) the read is
bound by the memory system, ~2.2 TB/s on 64 SMs and ~2.7 TB/s on 128, not by a thread's loads in flight
(hence the TMA row copy tried in tilelang_ops/topk.py was dropped).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tilelang  # noqa: E402
import tilelang.language as T  # noqa: E402
import torch  # noqa: E402

from benchmarks.harness import time_us  # noqa: E402

PRELUDE = r"""
__device__ __forceinline__ unsigned prb_smem(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void prb_mbar_init(void* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(prb_smem(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void prb_expect_tx(void* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(prb_smem(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void prb_bulk(void* dst, const void* src, unsigned bytes, void* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(prb_smem(dst)), "l"(src), "r"(bytes), "r"(prb_smem(bar)) : "memory");
}
__device__ __forceinline__ void prb_wait(void* bar) {
  unsigned ok = 0;
  while (!ok) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; "
                 "selp.u32 %0, 1, 0, p; }" : "=r"(ok) : "r"(prb_smem(bar)) : "memory");
  }
}
__device__ __forceinline__ void prb_cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(prb_smem(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void prb_cp_wait() {
  asm volatile("cp.async.commit_group;\n\tcp.async.wait_all;" ::: "memory");
}
"""

NT = 1024


@tilelang.jit
def probe(mode: str, n: int):
    b = T.dynamic("b")
    per = n // NT  # entries per thread
    chunks = 4  # bulk copies per row

    @T.prim_func
    def k(x: T.Tensor((b * n,), "float32"), out: T.Tensor((b,), "int32")):
        with T.Kernel(b, threads=NT, prelude=PRELUDE) as bx:
            tx = T.get_thread_binding()
            acc = T.alloc_var("int32")
            acc = 0
            base = bx * n
            if mode == "ld8":
                kb = T.alloc_local([8], "float32")
                kn = T.alloc_local([8], "float32")
                for u in T.unroll(8):
                    kn[u] = x[base + (tx // 32) * 256 + u * 32 + tx % 32]
                for it in T.serial(per // 8):
                    for u in T.unroll(8):
                        kb[u] = kn[u]
                    if it + 1 < per // 8:
                        for u in T.unroll(8):
                            kn[u] = x[base + (it + 1) * 8 * NT + (tx // 32) * 256 + u * 32 + tx % 32]
                    for u in T.unroll(8):
                        acc = acc + T.reinterpret(kb[u], "int32")
            elif mode == "ld32":
                kb = T.alloc_local([per], "float32")
                for u in T.unroll(per):
                    kb[u] = x[base + u * NT + tx]
                for u in T.unroll(per):
                    acc = acc + T.reinterpret(kb[u], "int32")
            elif mode in ("cp16", "tma"):
                s = T.alloc_shared([n], "float32")
                bar = T.alloc_shared([1], "uint64")
                if mode == "cp16":
                    for j in T.unroll(per // 4):
                        T.call_extern("handle", "prb_cp16", T.address_of(s[(j * NT + tx) * 4]),
                                      T.address_of(x[base + (j * NT + tx) * 4]))
                    T.call_extern("handle", "prb_cp_wait")
                    T.sync_threads()
                else:
                    if tx == 0:
                        T.call_extern("handle", "prb_mbar_init", T.address_of(bar[0]))
                    T.sync_threads()
                    if tx == 0:
                        T.call_extern("handle", "prb_expect_tx", T.address_of(bar[0]), n * 4)
                        for j in T.unroll(chunks):
                            T.call_extern("handle", "prb_bulk", T.address_of(s[j * (n // chunks)]),
                                          T.address_of(x[base + j * (n // chunks)]), n * 4 // chunks,
                                          T.address_of(bar[0]))
                    T.call_extern("handle", "prb_wait", T.address_of(bar[0]))
                for u in T.unroll(per):
                    acc = acc + T.reinterpret(s[u * NT + tx], "int32")
            acc = T.call_extern("int32", "__reduce_add_sync", T.uint32(0xFFFFFFFF), acc)
            if tx % 32 == 0:  # the row's sum of bits (mod 2^32): every mode must agree
                T.call_extern("int32", "atomicAdd", T.address_of(out[bx]), acc)
    return k


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 32768
    rows_list = [int(v) for v in sys.argv[2:]] or [64, 128]
    for rows in rows_list:
        x = torch.randn(rows * n, device="cuda")
        out = torch.zeros(rows, dtype=torch.int32, device="cuda")
        ref = None
        for mode in ("empty", "ld8", "ld32", "cp16", "tma"):
            kern = probe(mode, n)
            out.zero_()
            kern(x, out)
            torch.cuda.synchronize()
            ok = True
            if mode != "empty":
                ref = out.clone() if ref is None else ref
                ok = torch.equal(out, ref)
            us = time_us(lambda kern=kern, x=x, out=out: kern(x, out), flush_bytes=256 << 20)
            gbs = rows * n * 4 / us / 1e3
            print(f"PROBE n={n} rows={rows} mode={mode} us={us:.2f} GBps={gbs:.0f} same_sums={ok}",
                  flush=True)
