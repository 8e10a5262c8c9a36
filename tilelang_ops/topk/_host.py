"""Host-side helpers of the top-k wrappers: dtype names, the flat view of strided rows."""

import torch

TORCH_TO_TL = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.int32: "int32",
               torch.int64: "int64"}


def check_unit_columns(scores) -> None:
    """The kernels read rows of unit column stride (any row stride)."""
    if scores.shape[1] > 1 and scores.stride(1) != 1:
        raise ValueError(f"scores must have unit column stride, got {scores.stride()}")


def flat_scores(scores):
    """The [b, n] rows (unit column stride, any row stride: ``check_unit_columns``, which every caller's
    host checks run before the launch) as one flat view + the row stride."""
    b, n = scores.shape
    if b == 0 or n == 0:
        return scores.new_zeros(1), 0  # nothing is read: every row has end = 0
    ld = scores.stride(0) if b > 1 else n
    return scores.as_strided(((b - 1) * ld + n,), (1,)), ld
