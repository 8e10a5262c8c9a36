"""One small valid call of every registered op, for the torch-integration tests and the host-cost
benchmark: the public function, its reference and the arguments (``bad_input`` builders).

``OP_CASES`` maps a case id to an ``OpCase``; ``OpCase.call(device)`` builds the arguments there.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from metadata.cache_format import FP4_INDEX_KV_FORMAT
from tilelang_ops.testing import bad_input as B


@dataclass(frozen=True)
class OpCase:
    id: str
    op: str  # the registered op, torch.ops.tilelang_ops.<op>
    fn_path: str  # "module:name" of the public function (imported on use: the package imports light)
    ref_path: str  # "module:name" of its reference (the vectorized twin: same outputs, fast on the CPU)
    build: Callable[..., B.Call]  # device -> arguments

    def call(self, device="cpu") -> B.Call:
        return self.build(device)

    @property
    def fn(self) -> Callable:
        return _resolve(self.fn_path)

    @property
    def ref(self) -> Callable:
        return _resolve(self.ref_path)


def _resolve(path: str) -> Callable:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def _prefill(device):
    call = B.prefill_call(device)
    return call.with_(num_rows=int(call["cu_compressed"][-1]))


def _gather(device):
    from tilelang_ops.testing.gather_rows import GatherCase, gather_inputs

    x, index, _ = gather_inputs(GatherCase("ops", n=40, d=64, m=24, pattern="perm"), device)
    # finite rows: opcheck compares outputs with allclose, for which NaN differs from NaN
    return B.Call(dict(x=torch.nan_to_num(x, 0.0, 0.0, 0.0), index=index), {}, ())


def _quantize(device):
    g = torch.Generator().manual_seed(5)
    return B.Call(dict(x=(torch.randn(3, 4, 128, generator=g) * 3).bfloat16().to(device)), {}, ())


def _paged(device, cand=None, out=False):
    from tilelang_ops.testing.index_logits import PagedCase, make_paged_inputs

    kw = make_paged_inputs(PagedCase("ops", b=3, n=2, max_klen=150, heads=32, rows_per_block=16,
                                     candidates=cand), device)
    return _split(kw, 7, out)


def _split(kw: dict, positional: int, out: bool) -> B.Call:
    """A Call of the first ``positional`` arguments and the keyword ones (``out`` only when asked)."""
    o = kw.pop("out")
    names = list(kw)
    extra = {n: kw[n] for n in names[positional:]}
    if out:
        extra["out"] = o
    return B.Call({n: kw[n] for n in names[:positional]}, extra, ("out",) if out else ())


def _ragged(device, out=False):
    from tilelang_ops.testing.index_logits import RaggedCase, make_ragged_inputs

    kw = make_ragged_inputs(RaggedCase("ops", t=5, num_keys=90, heads=32, ranges="ragged"), device)
    return _split(kw, 8, out)


def _with_kwargs(call: B.Call, **kwargs) -> B.Call:
    return B.Call(call.args, {**call.kwargs, **kwargs}, call.writes)


CASES = [
    OpCase("compress_prefill", "compress_prefill", "tilelang_ops.compress:compress_prefill",
           "reference.compress:compress_prefill_torch", _prefill),
    OpCase("compress_decode", "compress_decode", "tilelang_ops.compress:compress_decode",
           "reference.compress:compress_decode_torch", B.decode_call),
    OpCase("gather_rows", "gather_rows", "tilelang_ops.gather_rows:gather_rows",
           "reference.gather_rows:gather_rows_torch", _gather),
    OpCase("quantize_index_rows", "quantize_index_rows", "tilelang_ops.index_logits:quantize_index_rows",
           "reference.index_logits:quantize_index_rows_torch", _quantize),
    OpCase("paged_index_logits", "paged_index_logits", "tilelang_ops.index_logits:paged_index_logits",
           "reference.index_logits:paged_index_logits_torch", _paged),
    OpCase("paged_index_logits_candidates", "paged_index_logits",
           "tilelang_ops.index_logits:paged_index_logits",
           "reference.index_logits:paged_index_logits_torch", lambda d: _paged(d, cand=(3, 16))),
    OpCase("paged_index_logits_out", "paged_index_logits_out", "tilelang_ops.index_logits:paged_index_logits",
           "reference.index_logits:paged_index_logits_torch", lambda d: _paged(d, out=True)),
    OpCase("ragged_index_logits", "ragged_index_logits", "tilelang_ops.index_logits:ragged_index_logits",
           "reference.index_logits:ragged_index_logits_torch", _ragged),
    OpCase("ragged_index_logits_out", "ragged_index_logits_out",
           "tilelang_ops.index_logits:ragged_index_logits",
           "reference.index_logits:ragged_index_logits_torch", lambda d: _ragged(d, out=True)),
    OpCase("store_fp8_main", "norm_rope_hadamard_cast_store",
           "tilelang_ops.kv_store:norm_rope_hadamard_cast_store",
           "reference.kv_store:norm_rope_hadamard_cast_store_torch", B.store_call),
    OpCase("store_fp4_index", "norm_rope_hadamard_cast_store",
           "tilelang_ops.kv_store:norm_rope_hadamard_cast_store",
           "reference.kv_store:norm_rope_hadamard_cast_store_torch",
           lambda d: B.store_call(d, FP4_INDEX_KV_FORMAT, hadamard=True)),
    OpCase("compress_store_prefill", "compress_store_prefill",
           "tilelang_ops.compress_store:compress_store_prefill",
           "reference.compress_store:compress_store_prefill_torch", B.compress_store_prefill_call),
    OpCase("compress_store_decode", "compress_store_decode",
           "tilelang_ops.compress_store:compress_store_decode",
           "reference.compress_store:compress_store_decode_torch", B.compress_store_decode_call),
    OpCase("topk", "topk", "tilelang_ops.topk:topk", "reference.topk:topk_torch", B.topk_call),
    OpCase("topk_sorted_indices_only", "topk", "tilelang_ops.topk:topk", "reference.topk:topk_torch",
           lambda d: _with_kwargs(B.topk_call(d), sorted=True, return_value=False)),
    OpCase("topk_to_slots", "topk_to_slots",
           "tilelang_ops.topk:topk_to_slots", "reference.topk:topk_to_slots_ref",
           B.topk_to_slots_call),
    OpCase("block_max_scores", "block_max_scores", "tilelang_ops.topk:block_max_scores",
           "reference.topk:block_max_scores_ref", B.block_max_call),
    OpCase("restore_candidate_indices_", "restore_candidate_indices_",
           "tilelang_ops.topk:restore_candidate_indices_",
           "reference.topk:restore_candidate_indices_ref_", B.restore_call),
    OpCase("convert_kv_index_", "convert_kv_index_", "tilelang_ops.topk:convert_kv_index_",
           "reference.topk:convert_kv_index_ref_", B.convert_call),
]
OP_CASES = {c.id: c for c in CASES}

# what each registered op writes in place (its mutates_args), SPEC 7
MUTATES = {
    "compress_prefill": {"state_cache"}, "compress_decode": {"state_cache"}, "gather_rows": set(),
    "quantize_index_rows": set(), "paged_index_logits": set(), "paged_index_logits_out": {"out"},
    "ragged_index_logits": set(), "ragged_index_logits_out": {"out"},
    "norm_rope_hadamard_cast_store": {"kv_cache", "out_norm"},
    "compress_store_prefill": {"state_cache", "kv_cache", "out_norm"},
    "compress_store_decode": {"state_cache", "kv_cache", "out_norm"},
    "topk": set(), "topk_to_slots": set(), "block_max_scores": set(), "restore_candidate_indices_": {"index"},
    "convert_kv_index_": {"index"},
}


def outputs(result) -> list:
    """The tensors of an op's result (a tensor, a tuple of them, or None), flattened."""
    if result is None:
        return []
    if isinstance(result, torch.Tensor):
        return [result]
    return [t for r in result for t in outputs(r)]


def to_fake_cuda(call: B.Call) -> B.Call:
    """``call`` with every tensor replaced by an empty CUDA tensor of its shape, strides and dtype (run it
    inside a FakeTensorMode: the tensors are fake and no GPU is needed)."""
    def conv(v):
        if isinstance(v, torch.Tensor):
            return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cuda")
        return v
    return B.Call({k: conv(v) for k, v in call.args.items()}, {k: conv(v) for k, v in call.kwargs.items()},
                  call.writes)
