"""Command lines on the CPU: `--help` of `python -m tilelang_ops`, `python -m benchmarks` and
`tools/profile_ncu.py` exits 0 and lists what each runs; the benchmark options reach the modules' `run`.
The emulators' build cache is safe for parallel test workers; tools/host_cost.py times two ops and
restores what it patched; .ci/run-gpu refuses without CUDA."""

import ctypes
import inspect
import os
import shutil
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)


def test_tilelang_ops_help_lists_commands():
    res = _run("-m", "tilelang_ops", "--help")
    assert res.returncode == 0, res.stderr
    assert "diff" in res.stdout


def test_benchmarks_help_lists_operators_and_options():
    from benchmarks.__main__ import BENCH_MODULES

    res = _run("-m", "benchmarks", "--help")
    assert res.returncode == 0, res.stderr
    for word in (*BENCH_MODULES, "--sweep", "--sweep-formats", "--cases", "--no-torch-peers", "--plot"):
        assert word in res.stdout, word


@pytest.mark.parametrize("args, message", [
    (["nosuchop"], "unknown benchmark(s) ['nosuchop']"),
    (["topk", "--sweep"], "--sweep applies to kv_store, compress_store, index_logits only"),
    (["topk", "--no-torch-peers"], "--no-torch-peers applies to index_logits only"),
    (["topk", "--cases", "b1q1"], "--cases applies to compress_store only"),
])
def test_benchmarks_rejects_what_would_not_run(args, message, capsys):
    from benchmarks.__main__ import main

    assert main(args) == 2
    assert message in capsys.readouterr().out


def test_benchmark_options_match_the_modules_run():
    import importlib

    from benchmarks.__main__ import BENCH_MODULES, MODULE_OPTIONS

    assert set(MODULE_OPTIONS) <= set(BENCH_MODULES)
    for op, keys in MODULE_OPTIONS.items():
        params = inspect.signature(importlib.import_module(f"benchmarks.bench_{op}").run).parameters
        assert set(keys) <= set(params), (op, keys)


def test_profile_ncu_help_lists_cases():
    res = _run(os.path.join("tools", "profile_ncu.py"), "--help")
    assert res.returncode == 0, res.stderr
    assert "--lineinfo" in res.stdout and "kv_store:fp8" in res.stdout and "topk:b128" in res.stdout


def _build_and_call(work: str, code: str) -> int:
    from tools.cuda_emu import shared_library

    return ctypes.CDLL(shared_library(code, work, "probe", ["-O1"])).probe()


def test_emulator_builds_are_safe_for_parallel_workers(tmp_path):
    # pytest-xdist workers build the same kernel at once: each must load a complete library (a worker
    # loading one another is still writing crashes), and the cache must hold only finished files
    if shutil.which("g++") is None:
        pytest.skip("the emulators build with g++")
    from tools.cuda_emu import cached_text

    code = 'extern "C" int probe() { return 42; }\n'
    with ProcessPoolExecutor(4) as pool:
        got = list(pool.map(_build_and_call, [str(tmp_path)] * 8, [code] * 8))
    assert got == [42] * 8
    names = sorted(os.listdir(tmp_path))
    assert len(names) == 2 and names[0].endswith(".cpp") and names[1].endswith(".so"), names
    built = os.path.getmtime(tmp_path / names[1])
    assert _build_and_call(str(tmp_path), code) == 42 and os.path.getmtime(tmp_path / names[1]) == built

    made = []
    path = str(tmp_path / "src" / "k.cu")
    assert cached_text(path, lambda: made.append(1) or "text") == "text"
    assert cached_text(path, lambda: made.append(1) or "other") == "text" and made == [1]
    assert sorted(os.listdir(tmp_path / "src")) == ["k.cu"]


def test_host_cost_times_the_python_layers_and_leaves_nothing_patched():
    """tools/host_cost.py on two ops: a time per call for each and for its torch references; afterwards the
    device check, the compile helper and the device properties are the real ones again."""
    import importlib

    import torch

    from tilelang_ops import _library
    from tools.host_cost import measure

    compress = importlib.import_module("tilelang_ops.compress")  # (the package exports the function)

    check, helper, props = compress.check_cuda, compress.kernel, torch.cuda.get_device_properties
    got = measure(["compress_decode", "topk"], calls=3, repeats=2)
    assert set(got) == {"torch.add", "torch.empty", "compress_decode", "topk"}
    assert all(us > 0 for us in got.values()), got
    assert (compress.check_cuda, compress.kernel, torch.cuda.get_device_properties) == (check, helper, props)
    assert compress.kernel is _library.kernel
    with pytest.raises(ValueError, match="unknown cases"):
        measure(["nosuchcase"])


def test_host_rounds_take_turns_and_keep_each_best(monkeypatch):
    """``rounds_us``: every round runs each function's warm-up then its timed calls, the functions in turn,
    each synced; each keeps its fastest round (a slow round of one function is not its result)."""
    import benchmarks.bench_host as bench_host

    clock, log = [0.0], []
    monkeypatch.setattr(bench_host.time, "perf_counter", lambda: clock[0])

    def timed(name, cost_of_round):
        def fn():
            log.append(name)
            clock[0] += cost_of_round[(log.count(name) - 1) // 5] * 1e-6  # 5 calls a round
        return fn

    got = bench_host.rounds_us({"a": timed("a", [9, 3, 7]), "b": timed("b", [4, 8, 2])},
                               calls=3, rounds=3, warmup=2, sync=lambda: log.append("sync"))
    assert got == pytest.approx({"a": 3.0, "b": 2.0}), got
    one_round = ["a"] * 2 + ["sync"] + ["a"] * 3 + ["sync"] + ["b"] * 2 + ["sync"] + ["b"] * 3 + ["sync"]
    assert log == one_round * 3


def test_gpu_run_refuses_without_cuda(tmp_path):
    """.ci/run-gpu (the GPU tier as one run) says so and exits 1 on a machine without CUDA, writing no
    logs."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present: the script would run the GPU tier")
    env = dict(os.environ, PYTHON=sys.executable, LOG_DIR=str(tmp_path / "logs"))
    res = subprocess.run(["bash", os.path.join(ROOT, ".ci", "run-gpu")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 1 and "no CUDA device" in res.stderr, res
    assert not (tmp_path / "logs").exists()
