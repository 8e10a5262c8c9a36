"""Compression-state sizing rules (SPEC sections 1.3-1.4), shared by references, kernels and tests.

One ratio rule for every public entry point (the metadata builder, ``compress``, the compress and
compress_store wrappers, their references and twins, the sizing helpers here): the ratios the
released engine serves, ``SUPPORTED_COMPRESS_RATIOS``. C1 keeps no state, so the entry points that
read or write a ring take ratio 2 (``check_state_ratio``). The kernel factories compute any power of
two internally; no public path reaches another ratio.
"""

from __future__ import annotations

from metadata.checks import check_int, describe, is_int

# 5 draft tokens + 1 verified token: the speculative-decoding step the engine sizes rings for.
DEFAULT_MAX_BACKTRACKING_TOKENS = 6
# Ratios the released engine serves, and so the only ones the public API accepts.
SUPPORTED_COMPRESS_RATIOS = (1, 2)
STATE_DTYPE_BYTES = 4  # the ring is FP32


def check_compress_ratio(compress_ratio: int, *, compress_overlap: bool = False,
                         use_ape: bool = False) -> None:
    """Reject what the mirrored engine API rejects: other ratios, overlap and APE options."""
    if compress_overlap:
        raise ValueError("compress_overlap=True is not supported (the released engine rejects it)")
    if use_ape:
        raise ValueError("use_ape=True is not supported (the released engine rejects it)")
    if not is_int(compress_ratio):
        raise TypeError(f"compress_ratio must be an int, got {describe(compress_ratio)}")
    if compress_ratio not in SUPPORTED_COMPRESS_RATIOS:
        raise ValueError(
            f"compress_ratio={compress_ratio} is not supported; expected one of "
            f"{SUPPORTED_COMPRESS_RATIOS}"
        )


def check_state_ratio(compress_ratio: int) -> None:
    """The ratio of an entry point that reads or writes a compression ring: a supported ratio that
    keeps state (C1 rows pass through ``compress`` unchanged)."""
    check_compress_ratio(compress_ratio)
    if compress_ratio == 1:
        raise ValueError("compress_ratio=1 keeps no compression state (C1 rows pass through compress() "
                         "unchanged); the ring entry points take compress_ratio=2")


def compress_state_ring_size(compress_ratio: int,
                             max_backtracking_tokens: int = DEFAULT_MAX_BACKTRACKING_TOKENS) -> int:
    """Ring slots S per request: ``r + max(0, max_backtracking_tokens - 1)``; C1 keeps no state."""
    check_compress_ratio(compress_ratio)
    check_int("max_backtracking_tokens", max_backtracking_tokens, lo=0)
    if compress_ratio == 1:
        return 0
    return compress_ratio + max(0, max_backtracking_tokens - 1)


def compress_state_bytes(compress_ratio: int, head_dim: int,
                         max_backtracking_tokens: int = DEFAULT_MAX_BACKTRACKING_TOKENS) -> int:
    """FP32 state payload of one slot: ``S * 2 * D * 4`` bytes (score and latent halves)."""
    ring = compress_state_ring_size(compress_ratio, max_backtracking_tokens)
    head_dim = check_int("head_dim", head_dim, lo=1)
    return ring * 2 * head_dim * STATE_DTYPE_BYTES


def needs_index_state(compress_ratio: int) -> bool:
    """Whether the index branch keeps a compression ring of its own.

    It never does: index keys are projected from the main branch's norm-stage latent, so
    ``ica_state`` is None for every ratio (SPEC section 1.5).
    """
    check_compress_ratio(compress_ratio)
    return False


def min_ring_size(compress_ratio: int, max_seqlen_q: int) -> int:
    """Smallest ring that keeps every group's inputs alive in a decode step."""
    check_state_ratio(compress_ratio)
    max_seqlen_q = check_int("max_seqlen_q", max_seqlen_q, lo=1)
    return compress_ratio + max_seqlen_q - 1


def check_ring_capacity(ring_size: int, compress_ratio: int, max_seqlen_q: int) -> None:
    """Capacity rule ``S >= r + max_seqlen_q - 1`` (SPEC 1.3), checked before anything is written."""
    ring_size = check_int("ring_size", ring_size, lo=0)
    need = min_ring_size(compress_ratio, max_seqlen_q)
    if ring_size < need:
        raise ValueError(
            f"state ring of {ring_size} slots is too small: compress_ratio={compress_ratio} with "
            f"max_seqlen_q={max_seqlen_q} needs at least {need} (r + max_seqlen_q - 1)"
        )
