"""TileLang kernels for the compressed-KV and index path of DeepSeek-V4-style sparse attention.

Every op is a function here (``tilelang_ops.compress_decode(...)``) and a registered torch op
(``torch.ops.tilelang_ops.compress_decode``) that ``torch.compile`` traces as one node and CUDA graphs
record (SPEC 7). Importing the package registers the ops and compiles nothing: each kernel is compiled on
its first call, or ahead of a CUDA-graph capture by ``tilelang_ops.warmup``. ``compiled_eager(True)``
replays repeated eager calls through a small C++ launcher instead of the Python layers.

The names ``topk``, ``compress`` and ``gather_rows`` here are the functions; their modules are
``tilelang_ops.topk`` etc. for ``from tilelang_ops.topk import ...``.
"""

from tilelang_ops._library import OPS, compiled_eager, warmup
from tilelang_ops.compress import compress, compress_decode, compress_prefill
from tilelang_ops.compress_store import compress_store_decode, compress_store_prefill
from tilelang_ops.gather_rows import gather_rows
from tilelang_ops.index_logits import paged_index_logits, quantize_index_rows, ragged_index_logits
from tilelang_ops.kv_store import norm_rope_hadamard_cast_store
from tilelang_ops.topk import (
    block_max_scores,
    convert_kv_index_,
    restore_candidate_indices_,
    topk,
    topk_to_slots,
)

__all__ = [
    "OPS", "block_max_scores", "compiled_eager", "compress", "compress_decode", "compress_prefill",
    "compress_store_decode", "compress_store_prefill", "convert_kv_index_", "gather_rows",
    "norm_rope_hadamard_cast_store", "paged_index_logits", "quantize_index_rows", "ragged_index_logits",
    "restore_candidate_indices_", "topk", "topk_to_slots", "warmup",
]
