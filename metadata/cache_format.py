"""Byte layouts of the paged KV caches (SPEC section 2).

A cache is a ``uint8`` tensor ``[num_blocks, fmt.block_bytes(rows_per_block)]``; slot ``s`` lives in
row ``s % rows_per_block`` of block ``s // rows_per_block``. Kernels, references and memory
accounting all read these dataclasses: nothing else in the project hard-codes a row size.
"""

from __future__ import annotations

from dataclasses import dataclass

from metadata.checks import check_int

# Largest finite magnitudes of the data codes; the cast clamps to them before rounding.
E4M3_MAX = 448.0
E2M1_MAX = 6.0
DATA_BITS = {"e4m3": 8, "e2m1": 4, "bf16": 16}
SCALE_DTYPES = {"e4m3": ("ue8m0",), "e2m1": ("ue8m0", "e4m3"), "bf16": (None,)}


@dataclass(frozen=True)
class KVCacheFormat:
    """One cache row format: ``dim`` elements of ``data_dtype`` with one scale per ``group_size``."""

    name: str
    dim: int  # elements per row
    data_dtype: str  # "e4m3", "e2m1" or "bf16"
    scale_dtype: str | None  # "ue8m0", "e4m3" or None (bf16 rows carry no scale)
    group_size: int  # elements sharing one scale (0 when there is no scale)
    block_sections: bool = False  # True: a block is [all data][all scales]; False: row by row

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"KVCacheFormat name must be a str, got {type(self.name).__name__} {self.name!r}")
        dim = check_int(f"{self.name}: dim", self.dim, lo=1)
        if self.data_dtype not in SCALE_DTYPES:
            raise ValueError(f"{self.name}: data_dtype={self.data_dtype!r} is not one of "
                             f"{list(SCALE_DTYPES)}")
        if self.scale_dtype not in SCALE_DTYPES[self.data_dtype]:
            raise ValueError(f"{self.name}: scale_dtype={self.scale_dtype!r} does not go with data_dtype="
                             f"{self.data_dtype!r} (expected one of {SCALE_DTYPES[self.data_dtype]})")
        group = check_int(f"{self.name}: group_size", self.group_size, lo=0)
        if self.scale_dtype is None and group != 0:
            raise ValueError(f"{self.name}: group_size={group} must be 0 for rows without scales")
        if self.scale_dtype is not None and (group < 1 or dim % group):
            raise ValueError(f"{self.name}: group_size={group} must be >= 1 and divide dim={dim}")
        if dim * DATA_BITS[self.data_dtype] % 8:
            raise ValueError(f"{self.name}: dim={dim} {self.data_dtype} elements are not whole bytes")
        if not isinstance(self.block_sections, bool):
            raise TypeError(f"{self.name}: block_sections must be a bool, got "
                            f"{type(self.block_sections).__name__} {self.block_sections!r}")

    @property
    def data_bytes(self) -> int:
        """Payload bytes of one row."""
        return self.dim * DATA_BITS[self.data_dtype] // 8

    @property
    def num_scales(self) -> int:
        return 0 if self.scale_dtype is None else self.dim // self.group_size

    @property
    def scale_bytes(self) -> int:
        """Scale bytes of one row (UE8M0 and e4m3 scales are one byte each)."""
        return self.num_scales

    @property
    def row_bytes(self) -> int:
        return self.data_bytes + self.scale_bytes

    @property
    def qmax(self) -> float:
        """Largest data magnitude; values are clamped to ``[-qmax, qmax]`` before rounding."""
        return {"e4m3": E4M3_MAX, "e2m1": E2M1_MAX}[self.data_dtype]

    @property
    def amax_floor(self) -> float:
        """Lower clamp of a block's amax, so the scale never underflows (SPEC section 2)."""
        if self.data_dtype == "e4m3":
            return 1e-4
        if self.scale_dtype == "ue8m0":
            return 6.0 * 2.0**-126
        return 6.0 * 2.0**-9

    def block_bytes(self, rows: int) -> int:
        """Bytes of one allocator block holding ``rows`` (>= 1) cache rows."""
        return check_int("rows", rows, lo=1) * self.row_bytes

    def rows_per_block(self, block_width: int) -> int:
        """Rows held by a block of ``block_width`` bytes (the cache tensor's second dimension)."""
        block_width = check_int("block_width", block_width)
        if block_width <= 0 or block_width % self.row_bytes:
            raise ValueError(
                f"{self.name}: cache block width {block_width} B is not a positive multiple of "
                f"row_bytes={self.row_bytes}"
            )
        return block_width // self.row_bytes

    def data_offset(self, row: int, rows: int) -> int:
        """Byte offset of row ``row``'s payload inside a block of ``rows`` rows."""
        row, rows = _check_row(row, rows)
        return row * (self.data_bytes if self.block_sections else self.row_bytes)

    def scale_offset(self, row: int, rows: int) -> int:
        """Byte offset of row ``row``'s scales inside a block of ``rows`` rows."""
        row, rows = _check_row(row, rows)
        if self.block_sections:
            return rows * self.data_bytes + row * self.scale_bytes
        return row * self.row_bytes + self.data_bytes


FP8_MAIN_KV_FORMAT = KVCacheFormat("fp8_main", 512, "e4m3", "ue8m0", 32)
FP4_MAIN_KV_FORMAT = KVCacheFormat("fp4_main", 512, "e2m1", "e4m3", 16)
FP4_INDEX_KV_FORMAT = KVCacheFormat("fp4_index", 128, "e2m1", "ue8m0", 32, block_sections=True)
BF16_KV_FORMAT = KVCacheFormat("bf16", 512, "bf16", None, 0)

ALL_FORMATS = (FP8_MAIN_KV_FORMAT, FP4_MAIN_KV_FORMAT, FP4_INDEX_KV_FORMAT, BF16_KV_FORMAT)


def _check_row(row, rows) -> tuple[int, int]:
    rows = check_int("rows", rows, lo=1)
    return check_int("row", row, lo=0, hi=rows - 1), rows


def slot_location(slot: int, rows_per_block: int) -> tuple[int, int]:
    """(block, row) of a cache slot (>= 0; a negative slot means "not stored" and has no location)."""
    slot = check_int("slot", slot, lo=0)
    rows_per_block = check_int("rows_per_block", rows_per_block, lo=1)
    return slot // rows_per_block, slot % rows_per_block
