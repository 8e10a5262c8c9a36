"""Output comparison for kernel-by-kernel diffing (SPEC section 4), shared by tests and `make diff`.

Every comparison returns a `Comparison` that counts mismatches, keeps the first few coordinates and
can raise with a readable message; tests call `.check()`, the diff tool prints `.row()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

FIRST_N = 5


@dataclass
class Comparison:
    output: str  # which output was compared, e.g. "kv" or "state"
    rule: str  # "bitwise", "<=1 bf16 ulp", ...
    total: int
    mismatches: int
    max_abs_err: float
    first: list[str] = field(default_factory=list)  # "(i, j): got x want y"

    @property
    def passed(self) -> bool:
        return self.mismatches == 0

    def message(self) -> str:
        head = (f"{self.output}: {self.mismatches}/{self.total} elements differ ({self.rule}), "
                f"max abs err {self.max_abs_err:.3g}")
        return head + ("; first: " + "; ".join(self.first) if self.first else "")

    def check(self) -> None:
        if not self.passed:
            raise AssertionError(self.message())


def _int_view(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns as integers, so NaN payloads and signed zeros compare exactly."""
    t = t.detach().contiguous()
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if not (t.is_floating_point() or t.is_complex()):
        return t
    width = t.element_size()
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]
    return t.view(as_int)


def _first_coords(mask: torch.Tensor, actual: torch.Tensor, expected: torch.Tensor, n=FIRST_N):
    idx = mask.nonzero()[:n].tolist()
    out = []
    for c in idx:
        a, e = actual[tuple(c)].item(), expected[tuple(c)].item()
        out.append(f"{tuple(c)}: got {a!r} want {e!r}")
    return out


def _abs_err(actual: torch.Tensor, expected: torch.Tensor, mask: torch.Tensor) -> float:
    if not mask.any():
        return 0.0
    if actual.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) or not actual.is_floating_point():
        a, e = actual.to(torch.float64), expected.to(torch.float64)
    else:
        a, e = actual.double(), expected.double()
    diff = (a[mask] - e[mask]).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    return float(diff.max())


def _check_shapes(output: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise AssertionError(
            f"{output}: got {tuple(actual.shape)} {actual.dtype}, want {tuple(expected.shape)} "
            f"{expected.dtype}")


def compare_bitwise(output: str, actual: torch.Tensor, expected: torch.Tensor) -> Comparison:
    """Exact bit equality: indices, slots, metadata, rings, payload bytes, fixed-order rows."""
    _check_shapes(output, actual, expected)
    actual, expected = actual.cpu(), expected.cpu()
    mask = _int_view(actual) != _int_view(expected)
    return Comparison(output, "bitwise", actual.numel(), int(mask.sum()),
                      _abs_err(actual, expected, mask), _first_coords(mask, actual, expected))


def bf16_ulp_distance(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Distance in BF16 steps (monotone integer order of the bit patterns); NaN vs non-NaN is huge."""
    def ordered(t):
        bits = t.contiguous().view(torch.int16).to(torch.int32)
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)
    dist = (ordered(actual) - ordered(expected)).abs()
    nan_a, nan_e = torch.isnan(actual), torch.isnan(expected)
    dist = torch.where(nan_a & nan_e, torch.zeros_like(dist), dist)
    return torch.where(nan_a ^ nan_e, torch.full_like(dist, 1 << 20), dist)


def compare_bf16_ulp(output: str, actual: torch.Tensor, expected: torch.Tensor,
                     max_ulp: int = 1) -> Comparison:
    """BF16 rows whose FP32 summation order differs from the reference: within ``max_ulp`` steps."""
    _check_shapes(output, actual, expected)
    actual, expected = actual.cpu(), expected.cpu()
    mask = bf16_ulp_distance(actual, expected) > max_ulp
    return Comparison(output, f"<={max_ulp} bf16 ulp", actual.numel(), int(mask.sum()),
                      _abs_err(actual, expected, mask), _first_coords(mask, actual, expected))


def format_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    """A plain fixed-width table for terminals and logs."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    out = [title, line(header), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)
