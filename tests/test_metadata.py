"""Host-side metadata: `prepare_tensor_input` (SPEC 1.2-1.6, 3) and `validate_map_refines`.

Every metadata tensor is an index, so all comparisons here are bitwise (SPEC 4): values, dtype
(int32) and shape must match exactly. Expected values come from literals worked out by hand, from a
vectorized twin that shares no code with the loop builder, and from invariants (chunk splitting,
prefill/decode agreement).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch

from metadata import InputMetadata, SeqMetadata, prepare_tensor_input, validate_map_refines
from tests.conftest import case_id
from tilelang_ops.testing import compare_bitwise

# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def assert_equal(name: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    # Metadata are indices and slots: bitwise, shape and dtype included.
    compare_bitwise(name, actual, expected).check()


PER_RATIO_TENSORS = ("klen", "cu_compressed", "num_compressed", "compressed_positions",
                     "slot_mapping_store_ca", "output_idx_offset")
SHARED_TENSORS = ("positions", "req_idx", "cu_seqlens_q", "seqlens_k", "context_lens", "state_block_idx",
                  "block_tables", "block_tables_per_token", "slot_mapping_swa")


def assert_meta_equal(actual: InputMetadata, expected: InputMetadata) -> None:
    for name in ("is_prefill", "block_size", "compress_ratios", "num_reqs", "total_q", "max_seqlen_q",
                 "max_seqlen_k", "num_rows"):
        assert getattr(actual, name) == getattr(expected, name), name
    for name in SHARED_TENSORS:
        assert_equal(name, getattr(actual, name), getattr(expected, name))
    for name in PER_RATIO_TENSORS:
        got, want = getattr(actual, name), getattr(expected, name)
        assert got.keys() == want.keys(), name
        for key in want:
            assert_equal(f"{name}[{key}]", got[key], want[key])


def twin_prepare(seqs, *, is_prefill, block_size=128, compress_ratios=(2,)) -> InputMetadata:
    """Vectorized twin of the builder: whole-batch torch ops instead of per-request loops."""
    B = block_size
    q = torch.tensor([s.seqlen_q for s in seqs], dtype=torch.int64)
    e = torch.tensor([s.seqlen_k for s in seqs], dtype=torch.int64)
    start = e - q
    n = len(seqs)
    width = max(1, max(len(s.block_table) for s in seqs))
    bt = torch.full((n, width), -1, dtype=torch.int64)
    for b, s in enumerate(seqs):
        bt[b, : len(s.block_table)] = torch.tensor(list(s.block_table), dtype=torch.int64)
    slots = torch.tensor([s.state_slot for s in seqs], dtype=torch.int64)

    req = torch.repeat_interleave(torch.arange(n), q)
    cu_q = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(q, 0)])
    pos = start[req] + torch.arange(req.numel()) - cu_q[req]
    bt_tok = bt[req]

    def paged(table, j, rows_per_block):
        blk = torch.gather(table, 1, (j // rows_per_block).clamp(max=table.shape[1] - 1)[:, None])[:, 0]
        return blk * rows_per_block + j % rows_per_block

    out = InputMetadata(
        is_prefill=is_prefill, block_size=B, compress_ratios=tuple(compress_ratios), num_reqs=n,
        total_q=int(q.sum()), max_seqlen_q=int(q.max()), max_seqlen_k=int(e.max()),
        positions=pos.int(), req_idx=req.int(), cu_seqlens_q=cu_q.int(), seqlens_k=e.int(),
        context_lens=(e if is_prefill else pos + 1).int(),
        state_block_idx=(slots if is_prefill else slots[req]).int(),
        block_tables=bt.int(), block_tables_per_token=bt_tok.int(),
        slot_mapping_swa=paged(bt_tok, pos, B).int(),
    )
    for r in compress_ratios:
        key, Bc = str(r), B // r
        ctx = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(e // r, 0)])
        out.klen[key] = ((pos + 1) // r).int()
        out.output_idx_offset[key] = ctx[req].int()
        if is_prefill:
            nc = e // r - start // r
            rows = nc.clamp(min=1)
            cu = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(rows, 0)])
            row_req = torch.repeat_interleave(torch.arange(n), rows)
            j = start[row_req] // r + torch.arange(row_req.numel()) - cu[row_req]
            placeholder = nc[row_req] == 0
            out.cu_compressed[key] = cu.int()
            out.num_compressed[key] = nc.int()
            out.compressed_positions[key] = torch.where(placeholder, 0, j * r).int()
            out.slot_mapping_store_ca[key] = torch.where(placeholder, -1, paged(bt[row_req], j, Bc)).int()
        else:
            done = pos % r == r - 1
            j = pos // r
            out.cu_compressed[key] = cu_q.int()
            out.num_compressed[key] = done.int()
            out.compressed_positions[key] = torch.where(done, j * r, 0).int()
            out.slot_mapping_store_ca[key] = torch.where(done, paged(bt_tok, j, Bc), -1).int()
        out.num_rows[key] = out.compressed_positions[key].numel()
    return out


def blocks_for(seqlen_k: int, block_size: int, first_block: int, extra: int = 0) -> list[int]:
    """A block table covering ``seqlen_k`` positions with distinct, shuffled-looking ids."""
    count = -(-seqlen_k // block_size) + extra
    return [(first_block + 7 * i) % 997 for i in range(count)]


# --------------------------------------------------------------------------------------------------
# Hand-computed cases
# --------------------------------------------------------------------------------------------------


@dataclass
class HandCase:
    id: str
    seqs: list
    is_prefill: bool
    block_size: int
    ratios: tuple
    expected: dict  # field -> literal; per-ratio fields as {str(r): literal}


HAND_CASES = [
    # B = 4, so C2 has Bc = 2 rows per block and C1 Bc = 4.
    #   req0 positions 3..7 (starts mid-group 1, spans blocks 3 and 4): C2 rows 1, 2, 3.
    #   req1 empty (seqlen_q = 0): one placeholder per ratio.
    #   req2 position 4 only: opens C2 group 2 but completes nothing -> placeholder; C1 row 4.
    #   req3 positions 0..2: C2 row 0 (position 2 stays pending).
    HandCase(
        "prefill_mixed_B4_r1_r2",
        [SeqMetadata(5, 8, [3, 4], 0), SeqMetadata(0, 4, [1], 1), SeqMetadata(1, 5, [6, 2], 2),
         SeqMetadata(3, 3, [5], 3)],
        True, 4, (2, 1),
        dict(
            positions=[3, 4, 5, 6, 7, 4, 0, 1, 2],
            req_idx=[0, 0, 0, 0, 0, 2, 3, 3, 3],
            cu_seqlens_q=[0, 5, 5, 6, 9],
            context_lens=[8, 4, 5, 3],
            state_block_idx=[0, 1, 2, 3],
            max_seqlen_q=5,
            block_tables=[[3, 4], [1, -1], [6, 2], [5, -1]],
            slot_mapping_swa=[15, 16, 17, 18, 19, 8, 20, 21, 22],
            klen={"2": [2, 2, 3, 3, 4, 2, 0, 1, 1], "1": [4, 5, 6, 7, 8, 5, 1, 2, 3]},
            num_compressed={"2": [3, 0, 0, 1], "1": [5, 0, 1, 3]},
            cu_compressed={"2": [0, 3, 4, 5, 6], "1": [0, 5, 6, 7, 10]},
            num_rows={"2": 6, "1": 10},
            compressed_positions={"2": [2, 4, 6, 0, 0, 0], "1": [3, 4, 5, 6, 7, 0, 4, 0, 1, 2]},
            slot_mapping_store_ca={"2": [7, 8, 9, -1, -1, 10],
                                   "1": [15, 16, 17, 18, 19, -1, 8, 20, 21, 22]},
            output_idx_offset={"2": [0, 0, 0, 0, 0, 6, 8, 8, 8], "1": [0, 0, 0, 0, 0, 12, 17, 17, 17]},
        ),
    ),
    # Decode, B = 4: req0 verifies 3 tokens at positions 4, 5, 6 (only 5 closes a C2 group: row 2,
    # slot 5 * 2 + 0); req1 one token at position 3 (row 1, slot 1 * 2 + 1).
    HandCase(
        "decode_multi_token_B4_r2_r1",
        [SeqMetadata(3, 7, [3, 5], 0), SeqMetadata(1, 4, [1], 1)],
        False, 4, (2, 1),
        dict(
            positions=[4, 5, 6, 3],
            cu_seqlens_q=[0, 3, 4],
            context_lens=[5, 6, 7, 4],
            state_block_idx=[0, 0, 0, 1],
            max_seqlen_q=3,
            block_tables=[[3, 5], [1, -1]],
            block_tables_per_token=[[3, 5], [3, 5], [3, 5], [1, -1]],
            slot_mapping_swa=[20, 21, 22, 7],
            klen={"2": [2, 3, 3, 2], "1": [5, 6, 7, 4]},
            num_compressed={"2": [0, 1, 0, 1], "1": [1, 1, 1, 1]},
            cu_compressed={"2": [0, 3, 4], "1": [0, 3, 4]},
            num_rows={"2": 4, "1": 4},
            compressed_positions={"2": [0, 4, 0, 2], "1": [4, 5, 6, 3]},
            slot_mapping_store_ca={"2": [-1, 10, -1, 3], "1": [20, 21, 22, 7]},
        ),
    ),
    # Decode of 6 draft-verification tokens (positions 7..12) over blocks [9, 2, 8, 4] with B = 4:
    # positions 7, 9, 11 close C2 rows 3, 4, 5 -> slots 2*2+1, 8*2+0, 8*2+1.
    HandCase(
        "decode_spec6_B4_r2",
        [SeqMetadata(6, 13, [9, 2, 8, 4], 5)],
        False, 4, (2,),
        dict(
            positions=[7, 8, 9, 10, 11, 12],
            context_lens=[8, 9, 10, 11, 12, 13],
            state_block_idx=[5] * 6,
            max_seqlen_q=6,
            slot_mapping_swa=[11, 32, 33, 34, 35, 16],
            klen={"2": [4, 4, 5, 5, 6, 6]},
            num_compressed={"2": [1, 0, 1, 0, 1, 0]},
            compressed_positions={"2": [6, 0, 8, 0, 10, 0]},
            slot_mapping_store_ca={"2": [5, -1, 16, -1, 17, -1]},
        ),
    ),
]


@pytest.mark.parametrize("case", HAND_CASES, ids=case_id)
def test_hand_computed(case: HandCase):
    meta = prepare_tensor_input(case.seqs, is_prefill=case.is_prefill, block_size=case.block_size,
                                compress_ratios=case.ratios)
    for name, want in case.expected.items():
        got = getattr(meta, name)
        if isinstance(want, dict):
            assert got.keys() == want.keys(), name
            for key, value in want.items():
                if isinstance(value, int):
                    assert got[key] == value, f"{name}[{key}]"
                else:
                    assert_equal(f"{name}[{key}]", got[key], i32(value))
        elif isinstance(want, int):
            assert got == want, name
        else:
            assert_equal(name, got, i32(want))
    # The hand literals and the twin must tell the same story.
    assert_meta_equal(meta, twin_prepare(case.seqs, is_prefill=case.is_prefill,
                                         block_size=case.block_size, compress_ratios=case.ratios))


# --------------------------------------------------------------------------------------------------
# Named scenarios, checked against the vectorized twin and structural invariants
# --------------------------------------------------------------------------------------------------


@dataclass
class Scenario:
    id: str
    seqs: list
    is_prefill: bool
    block_size: int = 128
    ratios: tuple = (2,)


def _seq(q: int, e: int, B: int, slot: int, extra_blocks: int = 0) -> SeqMetadata:
    return SeqMetadata(q, e, blocks_for(e, B, 11 * slot + 3, extra_blocks), slot)


SCENARIOS = [
    Scenario("prefill_mixed_B8", [_seq(0, 0, 8, 0), _seq(13, 13, 8, 1), _seq(1, 9, 8, 2), _seq(6, 23, 8, 3),
                                  _seq(0, 10, 8, 4), _seq(16, 33, 8, 5, extra_blocks=2)], True, 8, (1, 2)),
    Scenario("prefill_zero_row_chunks", [_seq(1, 1, 4, 0), _seq(1, 7, 4, 1), _seq(1, 3, 4, 2)],
             True, 4, (2,)),
    Scenario("prefill_mid_group_many_blocks", [_seq(37, 40, 2, 0), _seq(40, 41, 2, 1)], True, 2, (2, 1)),
    Scenario("prefill_all_empty", [_seq(0, 0, 4, 0), _seq(0, 5, 4, 1)], True, 4, (1, 2)),
    Scenario("prefill_default_B128", [_seq(300, 300, 128, 0), _seq(129, 1000, 128, 1)], True),
    Scenario("prefill_no_ratio", [_seq(3, 9, 4, 0)], True, 4, ()),
    Scenario("decode_spec6_mixed", [_seq(6, 6, 4, 0), _seq(1, 9, 4, 1), _seq(4, 17, 4, 2), _seq(6, 64, 4, 3)],
             False, 4, (1, 2)),
    Scenario("decode_single_B128", [_seq(1, 1, 128, 0), _seq(1, 128, 128, 1), _seq(1, 129, 128, 2),
                                    _seq(2, 257, 128, 3)], False),
    Scenario("decode_c1_only", [_seq(2, 5, 2, 0), _seq(3, 3, 2, 1)], False, 2, (1,)),
]


@pytest.mark.parametrize("sc", SCENARIOS, ids=case_id)
def test_scenarios(sc: Scenario):
    meta = prepare_tensor_input(sc.seqs, is_prefill=sc.is_prefill, block_size=sc.block_size,
                                compress_ratios=sc.ratios)
    assert_meta_equal(meta, twin_prepare(sc.seqs, is_prefill=sc.is_prefill, block_size=sc.block_size,
                                         compress_ratios=sc.ratios))
    assert meta.max_seqlen_q == max(s.seqlen_q for s in sc.seqs)
    for r in sc.ratios:
        key = str(r)
        rows, pos, slot = meta.num_rows[key], meta.compressed_positions[key], meta.slot_mapping_store_ca[key]
        assert pos.shape == slot.shape == (rows,)
        assert int(meta.cu_compressed[key][-1]) == rows
        # A skipped row (slot -1) is exactly a placeholder / non-completing row and sits at position 0.
        assert bool((pos[slot < 0] == 0).all())
        stored = slot[slot >= 0]
        assert stored.unique().numel() == stored.numel(), "two rows share a cache slot"
        if sc.is_prefill:
            nc = meta.num_compressed[key]
            assert int((slot < 0).sum()) == int((nc == 0).sum())  # one placeholder per nc = 0 request
            assert rows == int(nc.clamp(min=1).sum())
        else:
            assert rows == meta.total_q
            assert int((slot >= 0).sum()) == int(meta.num_compressed[key].sum())
        if r == 1 and meta.total_q:
            # C1 rows are the tokens themselves: same positions and same slots as the SWA store.
            stored_pos = pos[slot >= 0]
            assert_equal("c1 positions", stored_pos, meta.positions)
            assert_equal("c1 slots", stored, meta.slot_mapping_swa)


@pytest.mark.parametrize("is_prefill", [True, False], ids=["prefill", "decode"])
def test_random_batches_match_twin(is_prefill: bool):
    rng = random.Random(1234)
    for _ in range(150):
        B = rng.choice([2, 4, 8, 16, 128])
        ratios = rng.choice([(2,), (1,), (1, 2), (2, 1)])
        seqs = []
        for slot in rng.sample(range(64), rng.randint(1, 6)):
            e = rng.randint(0 if is_prefill else 1, 3 * B + 5)
            q = rng.randint(0 if is_prefill else 1, min(e, 6 if not is_prefill else e))
            seqs.append(_seq(q, e, B, slot, extra_blocks=rng.randint(0, 1)))
        meta = prepare_tensor_input(seqs, is_prefill=is_prefill, block_size=B, compress_ratios=ratios)
        assert_meta_equal(meta, twin_prepare(seqs, is_prefill=is_prefill, block_size=B,
                                             compress_ratios=ratios))


def _completed_rows(meta: InputMetadata, key: str) -> list[tuple[int, int]]:
    """(compressed position, store slot) of every row that reaches the cache, in order."""
    pos, slot = meta.compressed_positions[key].tolist(), meta.slot_mapping_store_ca[key].tolist()
    return [(p, s) for p, s in zip(pos, slot, strict=True) if s >= 0]


@pytest.mark.parametrize("ratio", [1, 2])
def test_chunk_splitting_and_decode_agree(ratio: int):
    """SPEC 1.2 invariant: any chunking (and token-by-token decode) stores the same rows."""
    rng = random.Random(ratio)
    B = 4
    for length in [0, 1, 2, 5, 8, 9, 17]:
        table = blocks_for(length, B, 40)
        whole = prepare_tensor_input([SeqMetadata(length, length, table, 0)], is_prefill=True,
                                     block_size=B, compress_ratios=(ratio,))
        want = _completed_rows(whole, str(ratio))
        assert len(want) == length // ratio
        for _ in range(8):
            cuts = sorted(rng.sample(range(length + 1), rng.randint(0, length + 1))) if length else []
            bounds = [0, *cuts, length]
            got = []
            for s, e in zip(bounds[:-1], bounds[1:], strict=True):
                m = prepare_tensor_input([SeqMetadata(e - s, e, table, 0)], is_prefill=True,
                                         block_size=B, compress_ratios=(ratio,))
                got += _completed_rows(m, str(ratio))
            assert got == want, bounds
        decoded = []
        for e in range(1, length + 1):
            m = prepare_tensor_input([SeqMetadata(1, e, table, 0)], is_prefill=False, block_size=B,
                                     compress_ratios=(ratio,))
            decoded += _completed_rows(m, str(ratio))
        assert decoded == want


def test_to_device_moves_every_tensor():
    meta = prepare_tensor_input([SeqMetadata(3, 5, [1, 2], 0)], is_prefill=True, block_size=4,
                                compress_ratios=(1, 2))
    moved = meta.to("meta")  # the meta device exists everywhere, so this runs on CPU-only machines
    for name, value in vars(moved).items():
        if isinstance(value, torch.Tensor):
            assert value.device.type == "meta", name
            assert value.dtype == torch.int32, name
        elif isinstance(value, dict):
            for key, v in value.items():
                if isinstance(v, torch.Tensor):
                    assert v.device.type == "meta", f"{name}[{key}]"
                    assert v.dtype == torch.int32, f"{name}[{key}]"
    assert moved.num_rows == meta.num_rows and moved.max_seqlen_q == meta.max_seqlen_q
    assert meta.positions.device.type == "cpu"  # the original is untouched


def test_shared_state_slot_allowed_without_state():
    # C1 keeps no ring, so requests may carry the same (unused) state slot.
    seqs = [SeqMetadata(1, 1, [0], 0), SeqMetadata(1, 1, [1], 0)]
    meta = prepare_tensor_input(seqs, is_prefill=True, block_size=4, compress_ratios=(1,))
    assert_equal("state_block_idx", meta.state_block_idx, i32([0, 0]))


# --------------------------------------------------------------------------------------------------
# Error paths
# --------------------------------------------------------------------------------------------------


@dataclass
class BadCase:
    id: str
    seqs: list
    kwargs: dict = field(default_factory=dict)
    exc: type = ValueError
    match: str = ""


OK = SeqMetadata(2, 4, [0], 0)
BAD_CASES = [
    BadCase("block_size_not_divisible", [OK], dict(block_size=3, compress_ratios=(1, 2)),
            match=r"block_size=3 is not divisible by compress_ratio=2"),
    BadCase("block_size_zero", [OK], dict(block_size=0), match=r"block_size=0 must be positive"),
    BadCase("ratio_4_engine_rejects", [OK], dict(block_size=4, compress_ratios=(4,)),
            match=r"compress_ratio=4 is not supported"),
    BadCase("ratio_3", [OK], dict(block_size=6, compress_ratios=(3,)),
            match=r"compress_ratio=3 is not supported"),
    BadCase("ratio_0", [OK], dict(compress_ratios=(0,)), match=r"compress_ratio=0 is not supported"),
    BadCase("ratio_duplicate", [OK], dict(compress_ratios=(2, 2)),
            match=r"compress_ratios=\(2, 2\) has duplicates"),
    BadCase("ratio_float", [OK], dict(compress_ratios=(2.0,)), exc=TypeError, match=r"must be an int"),
    BadCase("block_table_too_short", [OK, SeqMetadata(1, 5, [2], 1)], dict(block_size=4),
            match=r"seqs\[1\]: block_table has 1 blocks of 4 positions = 4 < seqlen_k=5"),
    BadCase("block_table_empty", [SeqMetadata(1, 1, [], 0)], dict(block_size=4),
            match=r"block_table has 0 blocks .* < seqlen_k=1"),
    BadCase("seqlen_q_gt_seqlen_k", [SeqMetadata(3, 2, [0], 0)], match=r"seqlen_q=3 > seqlen_k=2"),
    BadCase("negative_seqlen_q", [SeqMetadata(-1, 2, [0], 0)], match=r"seqlen_q=-1, seqlen_k=2.*>= 0"),
    BadCase("negative_seqlen_k", [SeqMetadata(0, -2, [0], 0)], match=r"seqlen_k=-2.*>= 0"),
    BadCase("negative_state_slot", [SeqMetadata(1, 1, [0], -1)], match=r"state_slot=-1.*>= 0"),
    BadCase("negative_block", [SeqMetadata(1, 5, [0, -1], 0)], dict(block_size=4),
            match=r"seqs\[0\].block_table\[1\]=-1 is negative"),
    BadCase("block_overflows_int32", [SeqMetadata(1, 1, [2**24], 0)], dict(block_size=128),
            match=r"block_table\[0\]=16777216.*overflow int32"),
    BadCase("decode_zero_tokens", [OK, SeqMetadata(0, 3, [1], 1)], dict(is_prefill=False),
            match=r"seqs\[1\]: seqlen_q=0 in a decode step"),
    BadCase("empty_batch", [], match=r"seqs is empty"),
    BadCase("shared_state_slot", [SeqMetadata(1, 1, [0], 3), SeqMetadata(1, 1, [1], 3)],
            match=r"seqs\[0\] and seqs\[1\] share state_slot=3"),
    BadCase("is_prefill_not_bool", [OK], dict(is_prefill=1), exc=TypeError,
            match=r"is_prefill must be a bool"),
    BadCase("seq_not_dataclass", [(2, 4, [0], 0)], exc=TypeError, match=r"seqs\[0\] must be a SeqMetadata"),
    BadCase("seqlen_bool", [SeqMetadata(True, 4, [0], 0)], exc=TypeError, match=r"seqs\[0\].seqlen_q"),
]


@pytest.mark.parametrize("case", BAD_CASES, ids=case_id)
def test_bad_input_raises(case: BadCase):
    kwargs = dict(is_prefill=True, **case.kwargs) if "is_prefill" not in case.kwargs else case.kwargs
    with pytest.raises(case.exc, match=case.match):
        prepare_tensor_input(case.seqs, **kwargs)


# --------------------------------------------------------------------------------------------------
# validate_map_refines
# --------------------------------------------------------------------------------------------------


@dataclass
class MapCase:
    id: str
    fine: list
    coarse: list
    match: str | None = None  # None: the fine map refines the coarse one
    exc: type = ValueError


MAP_CASES = [
    MapCase("identical", [0, 0, 2, 2, 2], [0, 0, 2, 2, 2]),
    MapCase("all_own_refines_anything", [0, 1, 2, 3], [0, 0, 0, 3]),
    MapCase("split_segments", [0, 0, 2, 2, 4, 5], [0, 0, 0, 0, 4, 4]),
    MapCase("one_layer", [0], [0]),
    MapCase("empty", [], []),
    MapCase("tensor_maps", torch.tensor([0, 0, 2, 2]), torch.tensor([0, 0, 0, 0])),
    MapCase("crosses_segments", [0, 0, 0, 3], [0, 0, 2, 2],
            match=r"layer 2: topk_map\[2\]=0 but cache_map\[0\]=0 != cache_map\[2\]=2.*"
                  r"topk_map=\[0, 0, 0, 3\], cache_map=\[0, 0, 2, 2\]"),
    MapCase("coarse_finer_than_fine", [0, 0, 0, 0], [0, 0, 2, 2], match=r"layer 2:"),
    MapCase("last_layer_crosses", [0, 1, 2, 2], [0, 1, 1, 3], match=r"layer 3: topk_map\[3\]=2"),
    MapCase("length_mismatch", [0, 0, 2], [0, 0, 0, 0],
            match=r"topk_map has 3 layers but cache_map has 4: "
                  r"topk_map=\[0, 0, 2\], cache_map=\[0, 0, 0, 0\]"),
    MapCase("fine_out_of_range", [0, 4, 2, 3], [0, 0, 0, 0], match=r"topk_map\[1\]=4 is outside \[0, 4\)"),
    MapCase("coarse_negative", [0, 1, 2, 3], [0, -1, 2, 3], match=r"cache_map\[1\]=-1 is outside \[0, 4\)"),
    MapCase("float_entry", [0, 0.0], [0, 0], match=r"topk_map\[1\] must be an int", exc=TypeError),
]


@pytest.mark.parametrize("case", MAP_CASES, ids=case_id)
def test_validate_map_refines(case: MapCase):
    if case.match is None:
        assert validate_map_refines("topk_map", case.fine, "cache_map", case.coarse) is None
    else:
        with pytest.raises(case.exc, match=case.match):
            validate_map_refines("topk_map", case.fine, "cache_map", case.coarse)
