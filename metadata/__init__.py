"""Host-side contracts shared by the references and the kernels: formats, sizes, metadata."""

from metadata.cache_engine import (
    DEFAULT_MAX_BACKTRACKING_TOKENS,
    SUPPORTED_COMPRESS_RATIOS,
    check_compress_ratio,
    check_ring_capacity,
    compress_state_bytes,
    compress_state_ring_size,
    needs_index_state,
)
from metadata.cache_format import (
    ALL_FORMATS,
    BF16_KV_FORMAT,
    FP4_INDEX_KV_FORMAT,
    FP4_MAIN_KV_FORMAT,
    FP8_MAIN_KV_FORMAT,
    KVCacheFormat,
)
from metadata.cross_layer import validate_map_refines
from metadata.prepare_tensor_input import InputMetadata, SeqMetadata, prepare_tensor_input

__all__ = [
    "ALL_FORMATS",
    "BF16_KV_FORMAT",
    "DEFAULT_MAX_BACKTRACKING_TOKENS",
    "FP4_INDEX_KV_FORMAT",
    "FP4_MAIN_KV_FORMAT",
    "FP8_MAIN_KV_FORMAT",
    "InputMetadata",
    "KVCacheFormat",
    "SUPPORTED_COMPRESS_RATIOS",
    "SeqMetadata",
    "check_compress_ratio",
    "check_ring_capacity",
    "compress_state_bytes",
    "compress_state_ring_size",
    "needs_index_state",
    "prepare_tensor_input",
    "validate_map_refines",
]
