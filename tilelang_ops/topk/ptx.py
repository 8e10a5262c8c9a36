"""Inline-PTX preludes of the row kernel: distributed shared memory of a cluster, streaming loads."""

# Rows of more than one candidate capacity may be split over a cluster of S CTAs ("split", a static argument
# of row_kernel): every CTA draws the same sample (so all get the same bound thr without talking) and
# compacts its share of the row's tiles into its own list (the one-CTA loop); the others then reserve room
# at the top of the lead CTA's list (one remote atomic add) and copy their entries there (DSMEM), one
# cluster barrier, and the lead moves that block after its own entries and goes on alone as with one CTA.
# The row's one read is spread over S SMs; the launch rule splits only when that pays
# (launch.split_rows). One remote add per CTA and one barrier keep the exchange off the compaction's
# loop (a remote add per warp and tile, or exact offsets after a count exchange, cost more). The
# prelude's helpers: a CTA's shared address in CTA `rank` of the cluster (mapa), a 32-bit store / atomic
# add there, and the cluster barrier's halves (every thread of every CTA of the cluster arrives).
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
# Streaming reads (`stream`, a static argument of row_kernel; the launch rule sets it for unsplit rows of
# the uncached tier when the launch reads at least STREAM_L2_FRACTION of the L2, see launch.topk_config):
# the compaction loads every tile but its first with ld.global.nc.L1::no_allocate.L2::cache_hint under an
# L2 evict-first policy (createpolicy), so the row's lines, read once, are the next victims in their L2
# sets instead of the lines already there (a serving step leaves other kernels' dirty outputs in the L2,
# whose write-backs would compete with the row's read). The first tile keeps the default policy
# (all-equal rows re-read it in the ordered pass), and so does the sample (the compaction reads its lines
# again). Smaller launches and the 32768 tier do not gain from it (docs/design.md, "## topk").
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
