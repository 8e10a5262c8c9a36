"""`make diff` driver: tables, 'not implemented', failures and the CPU fallback (fake operators)."""

import io
import sys
import types

import pytest
import torch

import tilelang_ops.diff as diff
from tilelang_ops.testing import compare_bitwise


def _fake_module(name, *, implemented=True, wrong=False):
    mod = types.ModuleType(name)
    mod.OP = name.rsplit(".", 1)[-1]
    mod.CASES = ["small", "odd"]

    def run_case(case_id, device):
        if not implemented:
            raise NotImplementedError("no kernel yet")
        got = torch.arange(4) + (1 if wrong and case_id == "odd" else 0)
        return [compare_bitwise("out", got, torch.arange(4))]

    def self_check(case_id):
        got = torch.arange(4) + (1 if wrong and case_id == "odd" else 0)
        return [compare_bitwise("out twin", got, torch.arange(4))]

    def build_check():
        if not implemented:
            raise NotImplementedError
        return ["k1"]

    mod.run_case, mod.self_check, mod.build_check = run_case, self_check, build_check
    return mod


@pytest.fixture
def fake_ops(monkeypatch):
    mods = {"fake.good": _fake_module("fake.good"),
            "fake.todo": _fake_module("fake.todo", implemented=False),
            "fake.bad": _fake_module("fake.bad", wrong=True)}
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return monkeypatch


def _run(monkeypatch, names, cuda):
    monkeypatch.setattr(diff, "DIFF_MODULES", names)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    out = io.StringIO()
    return diff.run_diff(out), out.getvalue()


def test_cpu_fallback_says_so_and_passes(fake_ops):
    rc, text = _run(fake_ops, ("fake.good", "fake.todo"), cuda=False)
    assert rc == 0
    assert "CUDA is not available" in text
    assert "reference self-checks (CPU)" in text
    assert "build check sm_90a: 1 kernels compiled" in text
    assert "build check sm_90a: kernel not implemented" in text


def test_cuda_runs_kernels_and_skips_the_build_check(fake_ops):
    rc, text = _run(fake_ops, ("fake.good",), cuda=True)
    assert rc == 0
    assert "kernel vs reference (CUDA)" in text and "superseded" in text and "1 kernels compiled" not in text


def test_missing_kernel_is_not_a_pass(fake_ops):
    rc, text = _run(fake_ops, ("fake.todo",), cuda=True)
    assert rc == 0
    assert text.count("not implemented") >= 2 and " pass" not in text


def test_mismatch_fails_and_shows_first_coordinate(fake_ops):
    rc, text = _run(fake_ops, ("fake.bad",), cuda=True)
    assert rc == 1
    assert "FAIL" in text and "(0,): got 1 want 0" in text
    assert "diff: 1 failing comparisons" in text


def test_missing_operator_module_shows_not_implemented(fake_ops):
    rc, text = _run(fake_ops, ("fake.absent_module_xyz",), cuda=False)
    assert rc == 0 and "absent_module_xyz: not implemented" in text
