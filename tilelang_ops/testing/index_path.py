"""The index read path of one step, end to end, for the GPU test and ``examples/decode_step.py``:

decode: projected inputs -> ``compress_store_decode`` (main FP8 cache, ``out_norm``) -> index branch (the
norm-stage rows through a plain torch linear projection to 128, then ``norm_rope_hadamard_cast_store`` with
the Hadamard into the FP4 index cache) -> ``quantize_index_rows`` of the queries -> ``paged_index_logits``
-> ``topk_to_slots`` (physical main-cache slots);
prefill: the same with ``compress_store_prefill``, the request's index rows gathered into one buffer,
``ragged_index_logits`` and ``topk`` with ``output_idx_offset`` (rows of the gathered buffer).

``run_decode`` / ``run_prefill`` take the operators as a namespace (``kernel_ops()`` or ``reference_ops()``)
and an optional ``stage_timer`` (a context manager per stage name) and return every stage's output.
``from_cache`` re-runs the chain from a given index cache onwards (the comparison the test makes: the
store's default FP4 index kernel sums part of the Hadamard on tensor cores, in another FP32 order than its
reference, so the index caches of the two chains may differ by one code step; the index cache itself is
compared within the store's own tolerance, and everything after it bitwise).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from metadata import FP4_INDEX_KV_FORMAT, FP8_MAIN_KV_FORMAT, SeqMetadata, prepare_tensor_input
from reference.kv_store import quantize_rows_torch
from tilelang_ops.testing.index_logits import garbage_bytes, index_values

BLOCK, RATIO, DIM = 128, 2, FP8_MAIN_KV_FORMAT.dim
BC = BLOCK // RATIO  # compressed rows per allocator block
RING = 8  # >= r + max_seqlen_q - 1 for the verification steps below


@dataclass(frozen=True)
class PathCase:
    id: str
    prefill: bool
    seqlens_k: tuple  # context length after the step, per request
    seqlen_q: int  # tokens per request in this step (decode 1-8; prefill: the chunk)
    heads: int = 64
    k: int = 512
    seed: int = 0


def kernel_ops():
    from tilelang_ops.compress_store import compress_store_decode, compress_store_prefill
    from tilelang_ops.index_logits import paged_index_logits, quantize_index_rows, ragged_index_logits
    from tilelang_ops.kv_store import norm_rope_hadamard_cast_store
    from tilelang_ops.topk import topk, topk_to_slots

    return SimpleNamespace(compress_store_decode=compress_store_decode,
                           compress_store_prefill=compress_store_prefill, store=norm_rope_hadamard_cast_store,
                           quantize=quantize_index_rows,
                           paged=paged_index_logits, ragged=ragged_index_logits, topk=topk,
                           topk_to_slots=topk_to_slots)


def reference_ops():
    from reference.compress_store import compress_store_decode_torch, compress_store_prefill_torch
    from reference.index_logits import (
        paged_index_logits_torch,
        quantize_index_rows_torch,
        ragged_index_logits_torch,
    )
    from reference.kv_store import norm_rope_hadamard_cast_store_torch
    from reference.topk import topk_to_slots_ref, topk_torch

    return SimpleNamespace(compress_store_decode=compress_store_decode_torch,
                           compress_store_prefill=compress_store_prefill_torch,
                           store=norm_rope_hadamard_cast_store_torch, quantize=quantize_index_rows_torch,
                           paged=paged_index_logits_torch, ragged=ragged_index_logits_torch, topk=topk_torch,
                           topk_to_slots=topk_to_slots_ref)


def build_path(case: PathCase, device="cpu") -> dict:
    """Metadata, the step's inputs, and caches already holding every row before the step (their rows
    beyond the context, and the unused blocks, hold NaN / inf garbage)."""
    g = torch.Generator().manual_seed(case.seed * 977 + len(case.seqlens_k) * 31 + case.seqlen_q)
    need = [max(1, -(-k // BLOCK)) for k in case.seqlens_k]
    num_blocks = sum(need) + 2
    perm = torch.randperm(num_blocks, generator=g).tolist()
    seqs, used = [], 0
    for r, (k, nb) in enumerate(zip(case.seqlens_k, need)):
        seqs.append(SeqMetadata(case.seqlen_q, k, perm[used:used + nb], r))
        used += nb
    meta = prepare_tensor_input(seqs, is_prefill=case.prefill, block_size=BLOCK, compress_ratios=(RATIO,))
    main_fmt, idx_fmt = FP8_MAIN_KV_FORMAT, FP4_INDEX_KV_FORMAT
    gd = torch.Generator(device=device).manual_seed(case.seed + 11)
    # the main cache's earlier rows are random bytes (this path only writes main rows); the index cache
    # holds valid rows for every row completed before the step, garbage elsewhere
    main = torch.randint(0, 256, (num_blocks, main_fmt.block_bytes(BC)), dtype=torch.uint8, device=device,
                         generator=gd)
    index = garbage_bytes(num_blocks * idx_fmt.block_bytes(BC)).reshape(num_blocks, -1).to(device)
    slots = []
    for seq in seqs:
        done = torch.arange((seq.seqlen_k - seq.seqlen_q) // RATIO, device=device)
        table = torch.tensor(seq.block_table, dtype=torch.long, device=device)
        slots.append(table[done // BC] * BC + done % BC)
    slot = torch.cat(slots)
    if slot.numel():
        x = torch.randn(slot.numel(), idx_fmt.dim, generator=gd, device=device).bfloat16().float()
        data, sc = quantize_rows_torch(x, idx_fmt)
        base = (slot // BC) * index.shape[1]
        d0 = base + (slot % BC) * idx_fmt.data_bytes
        s0 = base + BC * idx_fmt.data_bytes + (slot % BC) * idx_fmt.scale_bytes
        flat = index.view(-1)
        flat[(d0[:, None] + torch.arange(idx_fmt.data_bytes, device=device)).reshape(-1)] = data.reshape(-1)
        flat[(s0[:, None] + torch.arange(idx_fmt.scale_bytes, device=device)).reshape(-1)] = sc.reshape(-1)
    ang = torch.rand(max(case.seqlens_k) + 8, 32, generator=g) * 6.3
    x = torch.randn(meta.total_q, 2 * DIM, generator=g)
    x[:, :DIM] *= 4  # gate scores spread wide
    t = dict(
        x=x, state=torch.randn(len(seqs), RING, 2, DIM, generator=g),
        w_main=(torch.rand(DIM, generator=g) * 1.5 + 0.25).bfloat16(),
        w_index=(torch.rand(idx_fmt.dim, generator=g) * 1.5 + 0.25).bfloat16(), cos=torch.cos(ang),
        sin=torch.sin(ang), proj=(torch.randn(idx_fmt.dim, DIM, generator=g) * DIM ** -0.5).bfloat16(),
        q=index_values(meta.total_q * case.heads, "randn", g).bfloat16().reshape(meta.total_q, case.heads,
                                                                                   -1),
        weights=(torch.randn(meta.total_q, case.heads, generator=g) * 0.1).float())
    out = {k: v.to(device) for k, v in t.items()}
    out.update(main_cache=main, index_cache=index, meta=meta, case=case, eps=1e-6,
               devmeta=_meta_to(meta, device))
    if case.prefill:
        out["index_rows"] = index_row_coords(meta, device)
    return out


def _meta_to(meta, device):
    return SimpleNamespace(**{k: (v.to(device) if isinstance(v, torch.Tensor) else
                                  {kk: vv.to(device) for kk, vv in v.items()} if isinstance(v, dict) and v and
                                  isinstance(next(iter(v.values())), torch.Tensor) else v)
                              for k, v in vars(meta).items()})


def _stage(timer, name):
    return timer(name) if timer is not None else contextlib.nullcontext()


def _store_index_branch(p, ops, out_norm, index_cache, timer):
    """The index branch: the norm-stage rows -> linear to 128 (plain torch) -> norm, RoPE, Hadamard, FP4."""
    m, key = p["devmeta"], str(RATIO)
    with _stage(timer, "index projection (torch linear)"):
        kv_index = F.linear(out_norm, p["proj"])
    with _stage(timer, "norm_rope_hadamard_cast_store (index)"):
        ops.store(kv_index, p["w_index"], p["eps"], p["cos"], p["sin"], m.compressed_positions[key],
                         m.slot_mapping_store_ca[key], index_cache, FP4_INDEX_KV_FORMAT, hadamard=True)
    return kv_index


def run_decode(p: dict, ops, timer=None, index_cache=None) -> dict:
    """One decode / verification step (module docstring). ``index_cache``: start the chain from this
    index cache (after the store) instead of running the store stages."""
    m, key, case = p["devmeta"], str(RATIO), p["case"]
    b, n, heads = len(case.seqlens_k), case.seqlen_q, case.heads
    res = {}
    if index_cache is None:
        main, index, state = p["main_cache"].clone(), p["index_cache"].clone(), p["state"].clone()
        out_norm = torch.empty(m.num_rows[key], DIM, dtype=torch.bfloat16, device=main.device)
        with _stage(timer, "compress_store_decode (main)"):
            ops.compress_store_decode(p["x"], state, m.context_lens, m.state_block_idx, m.max_seqlen_q, RATIO,
                                      p["w_main"], p["eps"], p["cos"], p["sin"], m.compressed_positions[key],
                                      m.slot_mapping_store_ca[key], main, FP8_MAIN_KV_FORMAT,
                                      out_norm=out_norm)
        res.update(main_cache=main, state=state, out_norm=out_norm)
        res["kv_index"] = _store_index_branch(p, ops, out_norm, index, timer)
        index_cache = index
    res["index_cache"] = index_cache
    with _stage(timer, "quantize_index_rows (queries)"):
        qc, qs = ops.quantize(p["q"])
    klen = m.klen[key].reshape(b, n)
    max_klen = int(p["meta"].klen[key].max())  # host metadata (built on the CPU)
    with _stage(timer, "paged_index_logits"):
        logits = ops.paged(qc.reshape(b, n, heads, -1), qs.reshape(b, n, heads, -1),
                           p["weights"].reshape(b, n, heads), index_cache, m.block_tables, klen, max_klen)
    with _stage(timer, "topk_to_slots"):
        slots = ops.topk_to_slots(logits.reshape(b * n, max_klen), case.k, end=m.klen[key], block_size_c=BC,
                                  block_tables=m.block_tables_per_token)
    res.update(q_codes=qc, q_scales=qs, logits=logits, klen=klen, slots=slots)
    return res


def decode_step(x, state, context_lens, state_block_idx, w_main, cos, sin, positions, slot_mapping,
                main_cache, proj, w_index, index_cache, q, weights, block_tables, klen,
                block_tables_per_token, *, max_seqlen_q: int, max_klen: int, k: int, eps: float = 1e-6):
    """``run_decode``'s chain through the registered kernel ops, on tensors and host ints only (what
    ``torch.compile`` and a CUDA-graph capture take): compress_store_decode -> index projection -> index
    store -> quantize -> paged_index_logits -> topk_to_slots. ``klen`` [b, n]; returns (out_norm, logits,
    slots); the state ring and both caches are written in place."""
    import tilelang_ops as ops

    b, n = klen.shape
    out_norm = torch.empty(positions.shape[0], DIM, dtype=torch.bfloat16, device=x.device)
    ops.compress_store_decode(x, state, context_lens, state_block_idx, max_seqlen_q, RATIO, w_main, eps, cos,
                              sin, positions, slot_mapping, main_cache, FP8_MAIN_KV_FORMAT, out_norm=out_norm)
    ops.norm_rope_hadamard_cast_store(F.linear(out_norm, proj), w_index, eps, cos, sin, positions,
                                      slot_mapping, index_cache, FP4_INDEX_KV_FORMAT, hadamard=True)
    qc, qs = ops.quantize_index_rows(q)
    logits = ops.paged_index_logits(qc.reshape(b, n, q.shape[1], -1), qs.reshape(b, n, q.shape[1], -1),
                                    weights.reshape(b, n, -1), index_cache, block_tables, klen, max_klen)
    slots = ops.topk_to_slots(logits.reshape(b * n, max_klen), k, end=klen.reshape(-1), block_size_c=BC,
                              block_tables=block_tables_per_token)
    return out_norm, logits, slots


def decode_step_args(p: dict) -> tuple[list, dict]:
    """``decode_step``'s tensors (fresh copies of the ring and caches) and host ints for a ``build_path``
    decode case."""
    m, key, case = p["devmeta"], str(RATIO), p["case"]
    tensors = [p["x"], p["state"].clone(), m.context_lens, m.state_block_idx, p["w_main"], p["cos"], p["sin"],
               m.compressed_positions[key], m.slot_mapping_store_ca[key], p["main_cache"].clone(), p["proj"],
               p["w_index"], p["index_cache"].clone(), p["q"], p["weights"], m.block_tables,
               m.klen[key].reshape(len(case.seqlens_k), case.seqlen_q), m.block_tables_per_token]
    ints = dict(max_seqlen_q=p["meta"].max_seqlen_q, max_klen=int(p["meta"].klen[key].max()), k=case.k)
    return tensors, ints


def index_row_coords(meta, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(block [N] int64, row in block [N] int64) of every request's index rows [0, seqlen_k // r), in
    request order: the prefill's gathered keys, part of the step's metadata (built with it, ahead of the
    step). Logical row j of request b is row j % BC of block block_tables[b, j // BC]."""
    counts = [int(s) // RATIO for s in meta.seqlens_k]
    nrows = torch.as_tensor(counts, dtype=torch.long)
    req = torch.repeat_interleave(torch.arange(len(counts)), nrows, output_size=sum(counts))
    j = torch.arange(req.numel()) - (torch.cumsum(nrows, 0) - nrows)[req]
    return meta.block_tables.long()[req, j // BC].to(device), (j % BC).to(device)


def gather_index_rows(index_cache, coords) -> tuple[torch.Tensor, torch.Tensor]:
    """The index rows at ``coords`` (``index_row_coords``): (codes [N, 64], scales [N, 4]) uint8; request
    b's rows start at row output_idx_offset of its first token."""
    fmt = FP4_INDEX_KV_FORMAT
    blk, pos = coords
    # a block holds BC rows of codes, then BC rows of scales: one [blocks, BC, bytes] view of each
    nb, codes_end = index_cache.shape[0], BC * fmt.data_bytes
    codes = index_cache[:, :codes_end].view(nb, BC, fmt.data_bytes)
    scales = index_cache[:, codes_end:codes_end + BC * fmt.scale_bytes].view(nb, BC, fmt.scale_bytes)
    return codes[blk, pos], scales[blk, pos]


def run_prefill(p: dict, ops, timer=None, index_cache=None) -> dict:
    """One prefill chunk (module docstring); ``index_cache`` as in ``run_decode``."""
    m, key, case = p["devmeta"], str(RATIO), p["case"]
    res = {}
    if index_cache is None:
        main, index, state = p["main_cache"].clone(), p["index_cache"].clone(), p["state"].clone()
        out_norm = torch.empty(m.num_rows[key], DIM, dtype=torch.bfloat16, device=main.device)
        with _stage(timer, "compress_store_prefill (main)"):
            ops.compress_store_prefill(p["x"], state, m.cu_seqlens_q, m.context_lens, m.state_block_idx,
                                       m.cu_compressed[key], RATIO, p["w_main"], p["eps"], p["cos"], p["sin"],
                                       m.compressed_positions[key], m.slot_mapping_store_ca[key], main,
                                       FP8_MAIN_KV_FORMAT, out_norm=out_norm, num_rows=m.num_rows[key])
        res.update(main_cache=main, state=state, out_norm=out_norm)
        res["kv_index"] = _store_index_branch(p, ops, out_norm, index, timer)
        index_cache = index
    res["index_cache"] = index_cache
    with _stage(timer, "gather index rows (torch)"):
        k_codes, k_scales = gather_index_rows(index_cache, p["index_rows"])
    with _stage(timer, "quantize_index_rows (queries)"):
        qc, qs = ops.quantize(p["q"])
    ks = m.output_idx_offset[key]
    ke = ks + m.klen[key]
    max_width = int(p["meta"].klen[key].max())
    with _stage(timer, "ragged_index_logits"):
        logits = ops.ragged(qc, qs, p["weights"], k_codes, k_scales, ks, ke, max_width)
    with _stage(timer, "topk (output_idx_offset)"):
        _, idx = ops.topk(logits, case.k, end=m.klen[key], output_idx_offset=ks, return_value=False)
    res.update(k_codes=k_codes, k_scales=k_scales, q_codes=qc, q_scales=qs, logits=logits, ks=ks, ke=ke,
               indices=idx)
    return res


def run(p: dict, ops, timer=None, index_cache=None) -> dict:
    return (run_prefill if p["case"].prefill else run_decode)(p, ops, timer, index_cache)


class CudaStageTimer:
    """Device time per stage: CUDA events around each stage (read after a synchronize)."""

    def __init__(self):
        self.events = []

    @contextlib.contextmanager
    def __call__(self, name):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        self.events.append((name, start, end))

    def times_us(self) -> dict:
        torch.cuda.synchronize()
        out = {}
        for name, s, e in self.events:
            out[name] = out.get(name, 0.0) + s.elapsed_time(e) * 1e3
        return out
