"""The comparison helpers must catch what they claim to catch (a check that cannot fail is a defect)."""

import pytest
import torch

from tilelang_ops.testing import bf16_ulp_distance, compare_bf16_ulp, compare_bitwise, format_table


def test_bitwise_equal_passes_and_reports_nothing():
    t = torch.tensor([1.0, -0.0, float("nan")], dtype=torch.float32)
    c = compare_bitwise("x", t, t.clone())
    assert c.passed and c.mismatches == 0
    c.check()


def test_bitwise_sees_signed_zero_and_first_coordinates():
    a = torch.zeros(3, 4)
    b = a.clone()
    b[1, 2] = -0.0
    b[2, 3] = 5.0
    c = compare_bitwise("rows", a, b)
    assert c.mismatches == 2
    assert "(1, 2)" in c.first[0] and "(2, 3)" in c.first[1]
    with pytest.raises(AssertionError, match=r"rows: 2/12 elements differ"):
        c.check()


def test_bitwise_rejects_shape_or_dtype_change():
    with pytest.raises(AssertionError, match="want"):
        compare_bitwise("x", torch.zeros(2), torch.zeros(3))
    with pytest.raises(AssertionError, match="int32"):
        compare_bitwise("x", torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int32))


def test_bf16_ulp_distance_counts_steps_across_zero_and_nan():
    one = torch.tensor([1.0], dtype=torch.bfloat16)
    nxt = torch.nextafter(one.float(), torch.tensor([2.0])).to(torch.bfloat16)  # rounds back to 1.0
    assert bf16_ulp_distance(one, nxt).item() == 0
    up = (one.view(torch.int16) + 1).view(torch.bfloat16)
    assert bf16_ulp_distance(one, up).item() == 1
    tiny = torch.tensor([0], dtype=torch.int16).view(torch.bfloat16)
    neg_tiny = torch.tensor([-0x7FFF - 1 + 1], dtype=torch.int16).view(torch.bfloat16)  # -smallest subnormal
    assert bf16_ulp_distance(tiny, neg_tiny).item() == 1
    nan = torch.tensor([float("nan")], dtype=torch.bfloat16)
    assert bf16_ulp_distance(nan, nan).item() == 0
    assert bf16_ulp_distance(nan, one).item() > 1000


def test_compare_bf16_ulp_allows_one_step_only():
    a = torch.randn(64, dtype=torch.float32).to(torch.bfloat16)
    b = (a.view(torch.int16) + 1).view(torch.bfloat16)
    assert compare_bf16_ulp("kv", b, a, max_ulp=1).passed
    c = (a.view(torch.int16) + 2).view(torch.bfloat16)
    assert not compare_bf16_ulp("kv", c, a, max_ulp=1).passed


def test_format_table_aligns_columns():
    text = format_table("t", ["a", "bb"], [["1", "2"], ["333", "4"]])
    lines = text.splitlines()
    assert lines[0] == "t" and lines[1].startswith("a  ") and len(lines) == 5
