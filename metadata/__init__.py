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

__all__ = [
    "ALL_FORMATS",
    "BF16_KV_FORMAT",
    "DEFAULT_MAX_BACKTRACKING_TOKENS",
    "FP4_INDEX_KV_FORMAT",
    "FP4_MAIN_KV_FORMAT",
    "FP8_MAIN_KV_FORMAT",
    "KVCacheFormat",
    "SUPPORTED_COMPRESS_RATIOS",
    "check_compress_ratio",
    "check_ring_capacity",
    "compress_state_bytes",
    "compress_state_ring_size",
    "needs_index_state",
]
