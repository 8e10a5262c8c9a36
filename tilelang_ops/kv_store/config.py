"""kv_store's tuning knobs (``KVStoreConfig``) and its launch rule (``launch_config``).

The per-format defaults and why each knob is where it is: docs/design.md, "## kv_store".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from metadata.cache_format import ALL_FORMATS, KVCacheFormat

VEC = 16  # row elements per lane chunk
THREADS = 128  # threads per CTA
MULTI_ROW_MIN_ROWS = 32768  # below: one row per thread (latency-bound launches, every row's chain serial)

FORMATS = {f.name: f for f in ALL_FORMATS}

# The (data, scale) dtypes an option changes; None: every format; "main": the 512-wide rows; "main_cast":
# 512-wide rows with scales (not BF16). An option on a format it does not apply to is a ValueError.
OPTION_APPLIES = {"e2m1_bf16x2": ("e2m1", "ue8m0"), "scale_mul": ("e2m1", "e4m3"),
                  "inv_table": ("e2m1", "e4m3"), "e2m1_noclamp": ("e2m1", "e4m3"), "weight_smem": None,
                  "rope_spread": "main", "amax_bf16x2": "main_cast", "rcp_norm": None,
                  "hadamard_mma": ("e2m1", "ue8m0"), "pred_store": None}
OPTION_NAMES = tuple(OPTION_APPLIES)


@dataclass(frozen=True)
class KVStoreConfig:
    """How one store kernel is built (every field changes the generated code, none the stored bytes except
    ``hadamard_mma``'s summation order: see ``make_row_store``).

    chunks: 16-element chunks per lane (1, 2 or 4; a lane holds row chunks ``lane + c * lanes``).
    rows_per_thread: rows each thread stores per launch step, their loads all issued first.
    min_ctas: ``__launch_bounds__`` minimum CTAs per SM (0: the compiler's register choice).
    The cast / layout options (``make_row_store`` documents each): e2m1_bf16x2, scale_mul, inv_table,
    e2m1_noclamp, weight_smem, rope_spread, amax_bf16x2, rcp_norm, hadamard_mma, pred_store;
    hmma_chain: A-tiles chained per MMA output with ``hadamard_mma`` (1, 2 or 4).
    """

    chunks: int = 2
    rows_per_thread: int = 1
    min_ctas: int = 0
    e2m1_bf16x2: bool = False
    scale_mul: bool = False
    inv_table: bool = False
    e2m1_noclamp: bool = False
    weight_smem: bool = False
    rope_spread: bool = False
    amax_bf16x2: bool = False
    rcp_norm: bool = False
    hadamard_mma: bool = False
    pred_store: bool = False
    hmma_chain: int = 2

    def __post_init__(self):
        if self.chunks not in (1, 2, 4):
            raise ValueError(f"KVStoreConfig: chunks must be 1, 2 or 4, got {self.chunks}")
        if self.rows_per_thread < 1:
            raise ValueError(f"KVStoreConfig: rows_per_thread must be >= 1, got {self.rows_per_thread}")
        if self.min_ctas < 0:
            raise ValueError(f"KVStoreConfig: min_ctas must be >= 0, got {self.min_ctas}")
        if self.hmma_chain not in (1, 2, 4):  # whole groups of the 4 A-tiles
            raise ValueError(f"KVStoreConfig: hmma_chain must be 1, 2 or 4, got {self.hmma_chain}")
        if self.e2m1_noclamp and not self.inv_table:
            raise ValueError("KVStoreConfig: e2m1_noclamp needs inv_table (it tests the table's scale byte)")

    def options(self) -> tuple[str, ...]:
        """The names of the options that are on."""
        return tuple(n for n in OPTION_NAMES if getattr(self, n))

    def replace(self, **changes) -> KVStoreConfig:
        return dataclasses.replace(self, **changes)


def option_applies(name: str, fmt: KVCacheFormat) -> bool:
    """Whether option ``name`` changes ``fmt``'s kernel."""
    applies = OPTION_APPLIES[name]
    if applies == "main":
        return fmt.dim == 512
    if applies == "main_cast":
        return fmt.dim == 512 and fmt.scale_dtype is not None
    return applies in (None, (fmt.data_dtype, fmt.scale_dtype))


def check_config(fmt: KVCacheFormat, config: KVStoreConfig) -> None:
    """ValueError unless every option that ``config`` turns on applies to ``fmt``."""
    wrong = [n for n in config.options() if not option_applies(n, fmt)]
    if wrong:
        raise ValueError(f"KVStoreConfig options {wrong} do not apply to {fmt.name}")


def kernel_supports(fmt: KVCacheFormat, rope_dim: int, interleaved: bool) -> str | None:
    """None when the kernel handles this configuration, else why not (the wrapper raises it)."""
    dim = fmt.dim
    if dim % VEC or (dim // VEC) & (dim // VEC - 1) or dim // VEC > 32:
        return f"dim={dim} must be 16 x a power of two <= 32"
    if fmt.group_size not in (0, VEC, 2 * VEC):
        return f"group_size={fmt.group_size} must be {VEC} or {2 * VEC}"
    if rope_dim % (2 * VEC if not interleaved else VEC):
        return f"rope_dim={rope_dim} must be a multiple of {2 * VEC if not interleaved else VEC}"
    if not interleaved and (dim - rope_dim) % rope_dim:
        return f"half-split RoPE needs (dim - rope_dim) % rope_dim == 0, got dim={dim} rope_dim={rope_dim}"
    return None


def chunks_fit(fmt: KVCacheFormat, chunks: int, rope_dim: int, interleaved: bool) -> bool:
    """Whether ``chunks`` chunks per lane lay this row out: at least 2 lanes a row (except chunks 1) and a
    half-split RoPE partner in another lane (rope_dim / 32 < lanes)."""
    lanes = fmt.dim // VEC // chunks
    return chunks == 1 or (lanes >= 2 and (interleaved or rope_dim // 2 // VEC < lanes))


def hadamard_mma_fits(fmt: KVCacheFormat, chunks: int) -> bool:
    """Whether ``hadamard_mma``'s layout holds: index rows with a row on one quad of the warp, 4 lanes x 2
    chunks of 16."""
    return option_applies("hadamard_mma", fmt) and chunks == 2 and fmt.dim // VEC // chunks == 4


def uses_hadamard_mma(fmt: KVCacheFormat, hadamard: bool, config: KVStoreConfig) -> bool:
    """Whether a call with ``config`` sums the Hadamard on the tensor cores (then in the order of
    ``tilelang_ops.testing.kv_store.hadamard_mma_model``, approximately, not the reference's butterflies)."""
    return hadamard and config.hadamard_mma and hadamard_mma_fits(fmt, config.chunks)


def rows_per_cta(fmt: KVCacheFormat, config: KVStoreConfig) -> int:
    """Rows one CTA covers per rows-per-thread step."""
    return THREADS // (fmt.dim // VEC // config.chunks)


# The launch rule's table: large launches (>= MULTI_ROW_MIN_ROWS rows); small ones take rows_per_thread 1.
DEFAULT_CONFIGS = {
    "fp8_main": KVStoreConfig(rows_per_thread=2, min_ctas=7, weight_smem=True, rope_spread=True,
                              amax_bf16x2=True, rcp_norm=True),
    "fp4_main": KVStoreConfig(rows_per_thread=2, min_ctas=6, scale_mul=True, inv_table=True,
                              e2m1_noclamp=True, weight_smem=True, rope_spread=True, pred_store=True),
    "fp4_index": KVStoreConfig(rows_per_thread=2, min_ctas=4, e2m1_bf16x2=True, weight_smem=True,
                               hadamard_mma=True, pred_store=True),
    "bf16": KVStoreConfig(rows_per_thread=2, min_ctas=5, weight_smem=True),
}


def launch_config(fmt: KVCacheFormat, rows: int, rope_dim: int = 64,
                  interleaved: bool = True) -> KVStoreConfig:
    """The default config of a launch of ``rows`` rows: the format's table entry, one row per thread
    below ``MULTI_ROW_MIN_ROWS`` rows, and the widest chunking (from 2 down) that lays the row out."""
    cfg = DEFAULT_CONFIGS[fmt.name]
    chunks = cfg.chunks
    while chunks > 1 and not chunks_fit(fmt, chunks, rope_dim, interleaved):
        chunks //= 2
    return cfg.replace(chunks=chunks,
                       rows_per_thread=cfg.rows_per_thread if rows >= MULTI_ROW_MIN_ROWS else 1)
