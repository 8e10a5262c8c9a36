"""C1 under context parallelism (SPEC 6): the mirror split and the rank metadata (literals, an
independent twin, invariants against the single-process metadata), the reverse index, the C1 path with
simulated ranks, and the C1 path on a real torch.distributed group (gloo on the CPU: 2 and 4 ranks
spawned here; NCCL and the kernel when enough GPUs are present).

Metadata are indices and the C1 path is a copy, so every comparison is bitwise (SPEC 4).
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from metadata import SeqMetadata, prepare_tensor_input
from metadata.prepare_tensor_input import mirror_cp_chunks, mirror_cp_positions
from reference.compress import compress_ref
from tests.conftest import requires_cuda
from tilelang_ops.gather_rows import gather_rows_config
from tilelang_ops.testing import compare_bitwise
from tilelang_ops.testing.context_parallel import (
    CP_BATCHES,
    CP_SIZES,
    check_c1,
    cp_metadata,
    cp_rows,
    cp_seqs,
    distributed_c1_rank,
    rank_token_index,
    reverse_index_twin,
    simulate_c1,
)


def i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def assert_equal(name, actual, expected):
    compare_bitwise(name, actual, expected).check()  # indices: bitwise


# ------------------------------------------------------------------------------------------------
# The mirror split and the rank metadata
# ------------------------------------------------------------------------------------------------


def test_mirror_chunks_by_hand():
    assert mirror_cp_chunks(10, 2) == [(0, 3), (3, 6), (6, 8), (8, 10)]  # 10 = 3 + 3 + 2 + 2
    assert mirror_cp_chunks(3, 2) == [(0, 1), (1, 2), (2, 3), (3, 3)]  # shorter than 2 * cp: an empty piece
    assert mirror_cp_chunks(0, 2) == [(0, 0)] * 4
    assert mirror_cp_chunks(7, 1) == [(0, 4), (4, 7)]
    assert mirror_cp_chunks(17, 4) == [(0, 3)] + [(3 + 2 * i, 5 + 2 * i) for i in range(7)]
    assert mirror_cp_positions(5, 15, 2, 1) == [8, 9, 10, 11, 12]  # pieces 1 and 2 of [5, 15)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: mirror_cp_chunks(-5, 2), ValueError, "length=-5"),
    (lambda: mirror_cp_chunks(5.0, 2), TypeError, "length must be an int"),
    (lambda: mirror_cp_chunks(5, 0), ValueError, "cp_size=0"),
    (lambda: mirror_cp_positions(5, 0, 2, 1), ValueError, "start=5, end=0"),
    (lambda: mirror_cp_positions(-1, 3, 2, 1), ValueError, "start=-1"),
    (lambda: mirror_cp_positions(0, 5, 2, 7), ValueError, "cp_rank=7"),
    (lambda: mirror_cp_positions(0, 5, True, 0), TypeError, "cp_size must be an int"),
], ids=["negative_length", "float_length", "cp_size_0", "end_before_start", "negative_start", "rank_7",
        "bool_cp_size"])
def test_mirror_helpers_reject(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# A: 10 new tokens at 0..9, B: 3 new tokens at 2..4 (2 earlier), C: 1 token. cp 2 (4 pieces):
#   A pieces [0,3) [3,6) [6,8) [8,10); B (offsets) [0,1) [1,2) [2,3) [3,3); C [0,1) then empty.
#   rank 0 holds pieces 0 and 3: A 0 1 2 8 9, B 2, C 0; rank 1 pieces 1 and 2: A 3..7, B 3 4.
#   Gathered rows: rank 0's 0..6, rank 1's 7..13.
HAND_SEQS = [SeqMetadata(10, 10, [5, 6, 7], 0), SeqMetadata(3, 5, [9, 8], 1), SeqMetadata(1, 1, [4], 2)]
HAND = {
    0: dict(positions=[0, 1, 2, 8, 9, 2, 0], req_idx=[0, 0, 0, 0, 0, 1, 2], cu_seqlens_q=[0, 5, 6, 7],
            slot_mapping_swa=[20, 21, 22, 28, 29, 38, 16], klen=[1, 2, 3, 9, 10, 3, 1],
            output_idx_offset=[0, 0, 0, 0, 0, 10, 15], max_seqlen_q=5),
    1: dict(positions=[3, 4, 5, 6, 7, 3, 4], req_idx=[0, 0, 0, 0, 0, 1, 1], cu_seqlens_q=[0, 5, 7, 7],
            slot_mapping_swa=[23, 24, 25, 26, 27, 39, 32], klen=[4, 5, 6, 7, 8, 4, 5],
            output_idx_offset=[0, 0, 0, 0, 0, 10, 10], max_seqlen_q=5),
}
# original order: A 0..9, B 2 3 4, C 0 -> gathered row
HAND_REVERSE = [0, 1, 2, 7, 8, 9, 10, 11, 3, 4, 5, 12, 13, 6]


@pytest.mark.parametrize("rank", [0, 1])
def test_rank_metadata_by_hand(rank):
    meta = prepare_tensor_input(HAND_SEQS, is_prefill=True, block_size=4, compress_ratios=(1, 2),
                                cp_size=2, cp_rank=rank)
    want = HAND[rank]
    for name in ("positions", "req_idx", "cu_seqlens_q", "slot_mapping_swa"):
        assert_equal(name, getattr(meta, name), i32(want[name]))
    assert_equal("klen[1]", meta.klen["1"], i32(want["klen"]))
    assert_equal("output_idx_offset[1]", meta.output_idx_offset["1"], i32(want["output_idx_offset"]))
    assert meta.max_seqlen_q == want["max_seqlen_q"] and meta.total_q == 7
    assert (meta.cp_size, meta.cp_rank, meta.cp_tokens_per_rank) == (2, rank, (7, 7))
    assert_equal("mirror_cp_reverse_index", meta.mirror_cp_reverse_index, i32(HAND_REVERSE))
    # C1 rows: the whole batch in original order (the rows the C1 bypass returns), on every rank
    assert_equal("compressed_positions[1]", meta.compressed_positions["1"],
                 i32(list(range(10)) + [2, 3, 4, 0]))
    assert_equal("slot_mapping_store_ca[1]", meta.slot_mapping_store_ca["1"],
                 i32([20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 38, 39, 32, 16]))
    # C2 rows of the batch: A 0..4 (positions 0 2 4 6 8), B group 1 (positions 2 3), C a placeholder
    assert_equal("compressed_positions[2]", meta.compressed_positions["2"], i32([0, 2, 4, 6, 8, 2, 0]))
    assert_equal("klen[2]", meta.klen["2"], i32([(p + 1) // 2 for p in want["positions"]]))


def test_cp_size_1_is_the_plain_builder():
    seqs = cp_seqs(CP_BATCHES[0])
    meta = prepare_tensor_input(seqs, is_prefill=True, compress_ratios=(1, 2), cp_size=1, cp_rank=0)
    plain = prepare_tensor_input(seqs, is_prefill=True, compress_ratios=(1, 2))
    assert meta.mirror_cp_reverse_index is None and meta.cp_tokens_per_rank == (plain.total_q,)
    for name in ("positions", "cu_seqlens_q", "slot_mapping_swa", "block_tables_per_token"):
        assert_equal(name, getattr(meta, name), getattr(plain, name))


def twin_rank_positions(seqs, cp_size, rank):
    """Independent twin of the split: piece of offset t from the piece boundaries
    ``c * (L // 2cp) + min(c, L % 2cp)``; the rank keeps pieces rank and 2cp - 1 - rank."""
    pieces = 2 * cp_size
    out = []
    for s in seqs:
        length = s.seqlen_q
        c = torch.arange(pieces + 1)
        bounds = c * (length // pieces) + torch.minimum(c, torch.tensor(length % pieces))
        t = torch.arange(length)
        piece = torch.searchsorted(bounds, t, right=True) - 1
        keep = (piece == rank) | (piece == pieces - 1 - rank)
        out.append(t[keep] + s.seqlen_k - s.seqlen_q)
    return torch.cat(out).int()


PER_TOKEN = ("positions", "req_idx", "slot_mapping_swa", "block_tables_per_token")
PER_TOKEN_RATIO = ("klen", "output_idx_offset")
WHOLE_BATCH = ("seqlens_k", "context_lens", "state_block_idx", "block_tables")
WHOLE_BATCH_RATIO = ("cu_compressed", "num_compressed", "compressed_positions", "slot_mapping_store_ca")


@pytest.mark.parametrize("cp_size", [2, 3, 4, 8])
@pytest.mark.parametrize("batch", CP_BATCHES, ids=lambda b: b.id)
def test_rank_metadata_invariants(batch, cp_size):
    seqs = cp_seqs(batch)
    ratios = (1, 2)
    single = prepare_tensor_input(seqs, is_prefill=True, block_size=64, compress_ratios=ratios)
    metas = [prepare_tensor_input(seqs, is_prefill=True, block_size=64, compress_ratios=ratios,
                                  cp_size=cp_size, cp_rank=r) for r in range(cp_size)]
    order = []
    for r, meta in enumerate(metas):
        assert_equal(f"rank {r} positions vs twin", meta.positions, twin_rank_positions(seqs, cp_size, r))
        idx = rank_token_index(seqs, meta)  # the rank's tokens in the original order
        order.append(idx)
        for name in PER_TOKEN:
            assert_equal(f"rank {r} {name}", getattr(meta, name), getattr(single, name)[idx])
        for name in PER_TOKEN_RATIO:
            for key in ("1", "2"):
                assert_equal(f"rank {r} {name}[{key}]", getattr(meta, name)[key],
                             getattr(single, name)[key][idx])
        for name in WHOLE_BATCH:
            assert_equal(f"rank {r} {name}", getattr(meta, name), getattr(single, name))
        for name in WHOLE_BATCH_RATIO:
            for key in ("1", "2"):
                assert_equal(f"rank {r} {name}[{key}]", getattr(meta, name)[key], getattr(single, name)[key])
        assert meta.num_rows == single.num_rows
        counts = torch.bincount(meta.req_idx.long(), minlength=len(seqs))
        assert_equal(f"rank {r} cu_seqlens_q", meta.cu_seqlens_q,
                     torch.cat([i32([0]), counts.cumsum(0).int()]))
        assert meta.total_q == meta.positions.numel() and meta.max_seqlen_q == int(counts.max())
        assert meta.cp_tokens_per_rank == tuple(m.total_q for m in metas)
        assert_equal(f"rank {r} reverse index", meta.mirror_cp_reverse_index,
                     metas[0].mirror_cp_reverse_index)
    # every token on exactly one rank, and the reverse index undoes the gather
    gathered = torch.cat(order)
    assert_equal("tokens over ranks", gathered.sort().values, torch.arange(single.total_q))
    assert_equal("gathered[reverse]", gathered[metas[0].mirror_cp_reverse_index.long()],
                 torch.arange(single.total_q))
    assert_equal("reverse index vs twin", metas[0].mirror_cp_reverse_index,
                 reverse_index_twin([q.seqlen_q for q in seqs], cp_size))


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(cp_size=0), ValueError, "cp_size=0 must be >= 1"),
    (dict(cp_size=-2), ValueError, "cp_size=-2 must be >= 1"),
    (dict(cp_size=2, cp_rank=2), ValueError, r"cp_rank=2 must be in \[0, cp_size=2\)"),
    (dict(cp_size=2, cp_rank=-1), ValueError, r"cp_rank=-1 must be in \[0, cp_size=2\)"),
    (dict(cp_rank=1), ValueError, r"cp_rank=1 must be in \[0, cp_size=1\)"),
    (dict(cp_size=2.0), TypeError, "cp_size must be an int, got float"),
    (dict(cp_size=True), TypeError, "cp_size must be an int, got bool"),
    (dict(cp_size=2, cp_rank="0"), TypeError, "cp_rank must be an int, got str"),
    (dict(cp_size=2, is_prefill=False), ValueError, "cp_size=2 with is_prefill=False"),
], ids=["size0", "size_negative", "rank_too_big", "rank_negative", "rank_without_cp", "size_float",
        "size_bool", "rank_str", "decode"])
def test_cp_arguments_rejected(kwargs, exc, match):
    kwargs = {"is_prefill": True, **kwargs}
    with pytest.raises(exc, match=match):
        prepare_tensor_input(HAND_SEQS, compress_ratios=(1,), **kwargs)


# ------------------------------------------------------------------------------------------------
# The C1 path: simulated ranks (reference), argument errors
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cp_size", CP_SIZES)
@pytest.mark.parametrize("batch", CP_BATCHES, ids=lambda b: b.id)
def test_c1_simulated_ranks_reference(batch, cp_size):
    x, single, outs = simulate_c1(batch, cp_size, compress_ref)
    # the single-process run passes C1 through (in the metadata's rows: a placeholder row per request
    # without a token, tests/test_compress.py)
    got = compress_ref(x, None, single, 1, True)
    assert got.shape[0] == single.num_rows["1"] and (got is x or single.num_rows["1"] > x.shape[0])
    for c in check_c1(x, single, outs):
        c.check()


def test_c1_check_catches_a_wrong_reverse_index():
    """The comparison the distributed test relies on fails when one rank's index is off."""
    x, single, outs = simulate_c1(CP_BATCHES[0], 2, compress_ref, corrupt_rank=1)
    rows, meta = check_c1(x, single, outs)
    assert not rows.passed and meta.passed
    assert rows.first and all(f.startswith("(1, ") for f in rows.first)  # rank 1's rows only


def test_c1_path_rejects():
    seqs = cp_seqs(CP_BATCHES[0])
    meta = cp_metadata(seqs, 2, 0)
    x = cp_rows(CP_BATCHES[0], sum(meta.cp_tokens_per_rank))
    with pytest.raises(ValueError, match=r"projected_kv has 5 rows but mirror_cp_reverse_index covers"):
        compress_ref(x[:5], None, meta, 1, True)
    with pytest.raises(TypeError, match="projected_kv must have dtype torch.bfloat16"):
        compress_ref(x.float(), None, meta, 1, True)
    # C2 under context parallelism: rejected before the ring is touched
    meta2 = prepare_tensor_input(seqs, is_prefill=True, block_size=64, compress_ratios=(2,), cp_size=2,
                                 cp_rank=0)
    state = torch.zeros(len(seqs), 7, 2, 512)
    with pytest.raises(ValueError, match="compress_ratio=2 with context-parallel metadata"):
        compress_ref(torch.zeros(x.shape[0], 1024), state, meta2, 2, True)
    assert not state.any()
    with pytest.raises(ValueError, match="compress_ratio=3 is not supported"):
        compress_ref(x, None, meta, 3, True)


# ------------------------------------------------------------------------------------------------
# A real process group: gloo (CPU tier), NCCL (several GPUs)
# ------------------------------------------------------------------------------------------------


def _spawn(world_size, backend, tmp_path):
    init = f"file://{tmp_path}/pg_{backend}_{world_size}"
    mp.start_processes(distributed_c1_rank, args=(world_size, init, backend, [b.id for b in CP_BATCHES]),
                       nprocs=world_size, join=True, start_method="spawn")


@pytest.mark.parametrize("world_size", CP_SIZES)
def test_c1_on_a_gloo_process_group(world_size, tmp_path):
    """Each spawned rank builds its metadata and share, all-gathers, runs compress_ref's C1 path and
    raises unless its rows equal the single-process rows bitwise (the failure surfaces here)."""
    _spawn(world_size, "gloo", tmp_path)


@requires_cuda
@pytest.mark.parametrize("world_size", CP_SIZES)
def test_c1_on_an_nccl_process_group(world_size, tmp_path):
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs, found {torch.cuda.device_count()}")
    _spawn(world_size, "nccl", tmp_path)


@requires_cuda
@pytest.mark.parametrize("cp_size", CP_SIZES)
@pytest.mark.parametrize("batch", CP_BATCHES, ids=lambda b: b.id)
def test_c1_simulated_ranks_kernel(batch, cp_size):
    """One GPU: the ranks simulated in one process, the C1 path through the compress wrapper (kernel)."""
    from tilelang_ops.compress import compress

    x, single, outs = simulate_c1(batch, cp_size, compress, device="cuda")
    assert all(out.is_cuda for _, out in outs)
    for c in check_c1(x, single, outs):
        c.check()


def gpu_compile_jobs(props) -> list[tuple[str, str, tuple]]:
    """(module, function, static args) of every kernel specialization this file's GPU tests launch: the
    gather of each batch's rows, in the configuration the launch rule picks."""
    keys = set()
    for batch in CP_BATCHES:
        total = sum(s.seqlen_q for s in cp_seqs(batch))
        keys.add((batch.dim, gather_rows_config(total, batch.dim, props)))
    return [("tilelang_ops.gather_rows", "get_kernel", key) for key in sorted(keys, key=repr)]


def test_gpu_compile_jobs_cover_the_batches():
    from types import SimpleNamespace

    props = SimpleNamespace(multi_processor_count=132, L2_cache_size=60 << 20)
    jobs = gpu_compile_jobs(props)
    totals = [sum(s.seqlen_q for s in cp_seqs(b)) for b in CP_BATCHES]
    assert {j[2] for j in jobs} == {(512, gather_rows_config(t, 512, props)) for t in totals}
