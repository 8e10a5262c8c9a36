"""Cross-layer sharing maps (SPEC 3): which layer's cache or top-k result each layer reuses.

A sharing map has one entry per layer: ``map[l]`` is the source layer whose result layer ``l`` uses;
``map[l] == l`` means layer ``l`` computes its own. A *segment* is the set of layers with one source.
"""

from __future__ import annotations

from typing import Sequence

from metadata.checks import check_int_sequence


def _as_map(name: str, m: Sequence[int]) -> list[int]:
    if not isinstance(name, str):
        raise TypeError(f"map names must be str, got {type(name).__name__} {name!r}")
    return check_int_sequence(name, m)


def validate_map_refines(fine_name: str, fine: Sequence[int], coarse_name: str,
                         coarse: Sequence[int]) -> None:
    """Every segment of ``fine`` lies inside one segment of ``coarse``: ``coarse[fine[l]] == coarse[l]``.

    Raises ValueError on a length mismatch, an entry outside ``[0, num_layers)``, or a layer whose
    fine source sits in another coarse segment (naming the layer, both sources and both maps).
    """
    f = _as_map(fine_name, fine)
    c = _as_map(coarse_name, coarse)
    maps = f"{fine_name}={f}, {coarse_name}={c}"
    if len(f) != len(c):
        raise ValueError(f"{fine_name} has {len(f)} layers but {coarse_name} has {len(c)}: {maps}")
    n = len(f)
    for name, m in ((fine_name, f), (coarse_name, c)):
        for l, src in enumerate(m):
            if not 0 <= src < n:
                raise ValueError(f"{name}[{l}]={src} is outside [0, {n}): {maps}")
    for l in range(n):
        if c[f[l]] != c[l]:
            raise ValueError(
                f"layer {l}: {fine_name}[{l}]={f[l]} but {coarse_name}[{f[l]}]={c[f[l]]} != "
                f"{coarse_name}[{l}]={c[l]}, so the {fine_name} segment of layer {l} crosses "
                f"{coarse_name} segments: {maps}"
            )
