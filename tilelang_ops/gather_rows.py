"""TileLang kernel of ``gather_rows`` (SPEC 6): ``out[i] = x[index[i]]``, rows of bf16 at copy speed.

    x [N, D] bf16, index [M] int32 -> out [M, D] bf16

The C1 bypass under context parallelism returns ``gather_rows(all_gathered, mirror_cp_reverse_index)``.
Each thread moves 16-byte vectors (8 bf16); a CTA covers ``rows_per_cta`` whole rows, and every thread
issues all its loads (``vectors_per_thread`` of them, of the same or of consecutive rows) before its
first store, so each thread keeps that many 16-byte loads in flight. ``D`` is static (one kernel per
width, any multiple of 8 up to 16384), ``N``, ``M`` and x's row stride are runtime values: one kernel
serves every batch. An index outside ``[0, N)`` gives a zero row and reads nothing; the range check
itself runs only under TILELANG_OPS_DEBUG=1 (the reference always checks).
"""

from dataclasses import dataclass

import tilelang
import tilelang.language as T
import torch

from metadata.checks import check_cuda, debug_checks_enabled
from metadata.gather_rows_args import VEC, check_gather_rows_args, check_gather_rows_index
from tilelang_ops._library import Plans, call_op, kernel, register_op


@dataclass(frozen=True)
class GatherRowsConfig:
    """Launch shape of the gather kernel."""

    threads: int = 256
    """Threads per CTA."""
    vectors_per_thread: int = 4
    """16-byte vectors each thread loads before it stores (loads in flight per thread)."""

    def __post_init__(self):
        if not (isinstance(self.threads, int) and 32 <= self.threads <= 1024 and self.threads % 32 == 0):
            raise ValueError(f"GatherRowsConfig.threads={self.threads!r} must be a multiple of 32 in "
                             f"[32, 1024]")
        if not (isinstance(self.vectors_per_thread, int) and 1 <= self.vectors_per_thread <= 16):
            raise ValueError(f"GatherRowsConfig.vectors_per_thread={self.vectors_per_thread!r} must be an "
                             f"int in [1, 16]")


INT32_MAX = 2**31 - 1
DEFAULT_CONFIG = GatherRowsConfig()
# a grid of fewer CTAs than SMs leaves SMs idle: small gathers spread one vector per thread
SMALL_CONFIG = GatherRowsConfig(vectors_per_thread=1)


def rows_per_cta(dim: int, config: GatherRowsConfig) -> int:
    """Whole rows a CTA copies: as many as its threads' vectors cover (at least one)."""
    return max(1, config.threads * config.vectors_per_thread // (dim // VEC))


def gather_rows_config(num_rows: int, dim: int, props) -> GatherRowsConfig:
    """The launch rule: ``DEFAULT_CONFIG`` unless its grid would not cover every SM (``props``:
    ``multi_processor_count``)."""
    ctas = -(-num_rows // rows_per_cta(dim, DEFAULT_CONFIG))
    return DEFAULT_CONFIG if ctas >= props.multi_processor_count else SMALL_CONFIG


# The kernel bounds its reads itself (src in [0, N), so src * stride + D <= x_len); TileLang's own guard
# on x_flat would split each 16-byte load into 8 guarded scalar loads.
PASS_CONFIGS = {tilelang.PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True}


@tilelang.jit(pass_configs=PASS_CONFIGS)
def gather_rows_kernel(dim: int, threads: int, vectors_per_thread: int):
    """``out[i] = x[index[i]]`` (zero row where ``index[i]`` is outside ``[0, N)``).

    ``x`` arrives as a flat view of its rows (``x_flat[s * stride + d]`` is ``x[s, d]``) so a row stride
    that is not D costs no copy; the stride comes in units of 8 elements, which keeps every address a
    provable multiple of 8 and the accesses 16-byte vectors."""
    vectors = dim // VEC  # 16-byte vectors per row
    rows = max(1, threads * vectors_per_thread // vectors)  # rows per CTA (rows_per_cta)
    tile = rows * vectors  # vectors per CTA
    iters = -(-tile // threads)
    ragged = tile % threads != 0  # the last pass has idle threads
    num_rows, x_len = T.dynamic("num_rows, x_len")
    bf16, i32, i64 = "bfloat16", "int32", "int64"

    @T.prim_func
    def gather(
        x_flat: T.Tensor((x_len,), bf16),  # [(N - 1) * stride + D] bf16: row s at s * stride
        index: T.Tensor((num_rows,), i32),  # [M] int32
        out: T.Tensor((num_rows, dim), bf16),  # [M, D] bf16, written
        num_src: T.int32,  # N
        stride8: T.int32,  # x's row stride / 8
    ):
        with T.Kernel(T.ceildiv(num_rows, rows), threads=threads) as bx:
            tx = T.get_thread_binding()
            src = T.alloc_local((iters,), i32)
            buf = T.alloc_local((iters * VEC,), bf16)
            # the indices first, then every row load, then every store: each phase's loads are
            # independent, so a thread waits for two load latencies, not 2 * iters
            for it in T.unroll(iters):
                v = it * threads + tx
                row = bx * rows + v // vectors
                src[it] = -1
                if (not ragged or v < tile) and row < num_rows:
                    src[it] = index[row]
            for it in T.unroll(iters):
                d = ((it * threads + tx) % vectors) * VEC
                if src[it] >= 0 and src[it] < num_src:
                    for q in T.vectorized(VEC):  # (inline address: a bound base hides its alignment)
                        buf[it * VEC + q] = x_flat[T.cast(src[it], i64) * T.cast(stride8, i64) * VEC + d + q]
                else:  # bad index (or no row): a zero row, nothing read
                    for q in T.vectorized(VEC):
                        buf[it * VEC + q] = T.cast(0, bf16)
            for it in T.unroll(iters):
                v = it * threads + tx
                row = bx * rows + v // vectors
                d = (v % vectors) * VEC
                if (not ragged or v < tile) and row < num_rows:
                    for q in T.vectorized(VEC):
                        out[T.cast(row, i64), d + q] = buf[it * VEC + q]

    return gather


def get_kernel(dim: int, config: GatherRowsConfig):
    """The compiled kernel of one (D, config): what the wrapper launches and the GPU warm-up compiles."""
    return gather_rows_kernel(dim, config.threads, config.vectors_per_thread)


def _flat_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x`` as a flat view of its rows and the row stride, copying only when rows are not unit-stride
    16-byte aligned vectors."""
    n, d = x.shape
    stride = x.stride(0) if n > 1 else d
    if x.stride(1) != 1 or stride % VEC or stride < d or x.data_ptr() % 16:
        # a fresh allocation (aligned), also when x is contiguous but starts off a 16-byte boundary
        x, stride = x.clone(memory_format=torch.contiguous_format), d
    return x.as_strided(((n - 1) * stride + d,), (1,)), stride


def _check(x, index):
    """Every host check of a call; returns (N, D, M)."""
    dims = check_gather_rows_args(x, index)
    check_cuda(x=x, index=index)
    return dims


def _plan(x, index, config=None):
    """(N, D, M, compiled kernel) of a call's static key, after its host checks."""
    n, d, m = _check(x, index)
    if config is None:
        config = gather_rows_config(m, d, torch.cuda.get_device_properties(x.device))
    return n, d, m, kernel(gather_rows_kernel, d, config.threads, config.vectors_per_thread)


_PLANS = Plans(_plan)


def _launch(x, index, n, d, m, fn):
    if debug_checks_enabled():
        check_gather_rows_index(index, n)
    if n == 0 or m == 0:  # nothing to read: every row (if any) has a bad index
        return torch.zeros(m, d, dtype=torch.bfloat16, device=x.device)
    out = torch.empty(m, d, dtype=torch.bfloat16, device=x.device)
    flat, stride = _flat_rows(x)
    # an int32 index never reaches row 2^31 - 1 or beyond, so N saturates there
    fn(flat, index.contiguous(), out, min(n, INT32_MAX), stride // VEC)
    return out


def _impl(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return _launch(x, index, *_PLANS((x, index)))


def _fake(x, index):
    n, d, m = _check(x, index)
    return x.new_empty(m, d)


_OP = register_op("gather_rows", _impl, _fake)


def gather_rows(x, index, *, config: GatherRowsConfig | None = None):
    """``out[i] = x[index[i]]`` on the GPU (``torch.ops.tilelang_ops.gather_rows``); same contract as
    ``reference.gather_rows.gather_rows_ref``.

    x      [N, D] bf16 (rows may be strided)   index [M] int32
    returns out [M, D] bf16; an index outside [0, N) raises under TILELANG_OPS_DEBUG=1 and otherwise
    gives a zero row (never a read outside x).
    ``config``: launch shape (default: ``gather_rows_config``'s choice for this device); a call with a
    config launches directly, outside the registered op (tests, benchmarks).
    """
    if config is None:
        return call_op(_OP, _check, x, index)
    if not isinstance(config, GatherRowsConfig):
        raise TypeError(f"config must be a GatherRowsConfig, got {type(config).__name__}")
    return _launch(x, index, *_plan(x, index, config))


# (D, config) pairs the sm_90a build check compiles: the launch rule's two configurations at the engine's
# width, one vector per row, a width that is not a power-of-two number of vectors (ragged passes), the
# widest row
BUILD_SHAPES = ((512, DEFAULT_CONFIG), (512, SMALL_CONFIG), (8, DEFAULT_CONFIG), (520, DEFAULT_CONFIG),
                (16384, DEFAULT_CONFIG))


def build_configs():
    """(name, factory, static args) of every kernel in ``BUILD_SHAPES``."""
    return [(f"d{dim}_t{c.threads}_v{c.vectors_per_thread}", gather_rows_kernel,
             (dim, c.threads, c.vectors_per_thread)) for dim, c in BUILD_SHAPES]
