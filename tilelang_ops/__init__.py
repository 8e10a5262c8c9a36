"""TileLang kernels for the compressed-KV and index path, with thin torch-facing wrappers.

Import the operators from their modules (``tilelang_ops.compress``, ``tilelang_ops.kv_store``,
``tilelang_ops.compress_store``, ``tilelang_ops.topk``); importing this package alone does not
import TileLang.
"""
