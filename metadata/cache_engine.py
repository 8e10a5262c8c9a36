"""Compression-state sizing rules (SPEC sections 1.3-1.4), shared by references, kernels and tests."""

from __future__ import annotations

# 5 draft tokens + 1 verified token: the speculative-decoding step the engine sizes rings for.
DEFAULT_MAX_BACKTRACKING_TOKENS = 6
# Ratios the released engine serves; the kernels also take other powers of two as an extension.
SUPPORTED_COMPRESS_RATIOS = (1, 2)
STATE_DTYPE_BYTES = 4  # the ring is FP32


def check_compress_ratio(compress_ratio: int, *, compress_overlap: bool = False,
                         use_ape: bool = False) -> None:
    """Reject what the mirrored engine API rejects: other ratios, overlap and APE options."""
    if compress_overlap:
        raise ValueError("compress_overlap=True is not supported (the released engine rejects it)")
    if use_ape:
        raise ValueError("use_ape=True is not supported (the released engine rejects it)")
    if isinstance(compress_ratio, bool) or not isinstance(compress_ratio, int):
        raise TypeError(f"compress_ratio must be an int, got {type(compress_ratio).__name__}")
    if compress_ratio not in SUPPORTED_COMPRESS_RATIOS:
        raise ValueError(
            f"compress_ratio={compress_ratio} is not supported; expected one of "
            f"{SUPPORTED_COMPRESS_RATIOS}"
        )


def check_kernel_ratio(compress_ratio: int) -> None:
    """Kernels and references compute any power-of-two ratio >= 2 (no overlap)."""
    if isinstance(compress_ratio, bool) or not isinstance(compress_ratio, int):
        raise TypeError(f"compress_ratio must be an int, got {type(compress_ratio).__name__}")
    if compress_ratio < 2 or compress_ratio & (compress_ratio - 1):
        raise ValueError(f"compress_ratio={compress_ratio} must be a power of two >= 2 here")


def compress_state_ring_size(compress_ratio: int,
                             max_backtracking_tokens: int = DEFAULT_MAX_BACKTRACKING_TOKENS) -> int:
    """Ring slots S per request: ``r + max(0, max_backtracking_tokens - 1)``; C1 keeps no state."""
    if compress_ratio == 1:
        return 0
    check_kernel_ratio(compress_ratio)
    if max_backtracking_tokens < 0:
        raise ValueError(f"max_backtracking_tokens={max_backtracking_tokens} must be >= 0")
    return compress_ratio + max(0, max_backtracking_tokens - 1)


def compress_state_bytes(compress_ratio: int, head_dim: int,
                         max_backtracking_tokens: int = DEFAULT_MAX_BACKTRACKING_TOKENS) -> int:
    """FP32 state payload of one slot: ``S * 2 * D * 4`` bytes (score and latent halves)."""
    ring = compress_state_ring_size(compress_ratio, max_backtracking_tokens)
    return ring * 2 * head_dim * STATE_DTYPE_BYTES


def needs_index_state(compress_ratio: int) -> bool:
    """Whether the index branch keeps a compression ring of its own.

    It never does: index keys are projected from the main branch's norm-stage latent, so
    ``ica_state`` is None for every ratio (SPEC section 1.5).
    """
    if compress_ratio != 1:
        check_kernel_ratio(compress_ratio)
    return False


def min_ring_size(compress_ratio: int, max_seqlen_q: int) -> int:
    """Smallest ring that keeps every group's inputs alive in a decode step."""
    return compress_ratio + max_seqlen_q - 1


def check_ring_capacity(ring_size: int, compress_ratio: int, max_seqlen_q: int) -> None:
    """Capacity rule ``S >= r + max_seqlen_q - 1`` (SPEC 1.3), checked before anything is written."""
    need = min_ring_size(compress_ratio, max_seqlen_q)
    if ring_size < need:
        raise ValueError(
            f"state ring of {ring_size} slots is too small: compress_ratio={compress_ratio} with "
            f"max_seqlen_q={max_seqlen_q} needs at least {need} (r + max_seqlen_q - 1)"
        )
