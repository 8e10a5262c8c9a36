"""Torch integration (SPEC 7): registered ops, fake implementations, torch.compile, CUDA graphs.

CPU tier: every public op is ``torch.ops.tilelang_ops.<name>`` with the ``mutates_args`` SPEC 7 names;
each fake (run under ``FakeTensorMode`` on fake CUDA tensors) gives the shapes and dtypes of the
reference's outputs on the same arguments, on the CUDA device, and runs the host checks; ``opcheck``
passes for every op with its reference as the CPU kernel; a decode step traces under
``torch.compile(fullgraph=True)`` into one graph holding the ops. GPU tier: ``torch.library.opcheck`` of
every op, torch.compile bitwise equal to eager, and a CUDA-graph capture of a decode step replayed on new
inputs, bitwise equal to eager.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import subprocess
import sys
import warnings
from collections.abc import Callable

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import tilelang_ops
from tilelang_ops.testing import bad_input as B
from tilelang_ops.testing.cpu_launch import accept_cpu_tensors, eager_on_the_cpu
from tilelang_ops.testing.index_path import PathCase, build_path, decode_step, decode_step_args
from tilelang_ops.testing.torch_ops import CASES, MUTATES, OP_CASES, outputs, to_fake_cuda

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _op(name):
    return getattr(torch.ops.tilelang_ops, name).default


def _meta(result):
    return [(tuple(t.shape), t.dtype) for t in outputs(result)]


# ----------------------------------------------------------------------------------------------
# CPU tier
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(MUTATES))
def test_op_is_registered_with_what_it_writes(name):
    schema = _op(name)._schema
    written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert written == MUTATES[name], f"{name}: schema {schema} writes {written}, SPEC 7 says {MUTATES[name]}"
    assert name in tilelang_ops.OPS


def test_every_registered_op_has_cases_and_a_top_level_function():
    assert set(tilelang_ops.OPS) == set(MUTATES), "MUTATES lists every registered op"
    assert {c.op for c in CASES} == set(MUTATES), "every op has an OpCase"
    for c in CASES:
        fn = getattr(tilelang_ops, c.fn_path.split(":")[1])
        assert fn is c.fn, f"tilelang_ops.{fn.__name__} is not {c.fn_path}"


def test_package_import_compiles_nothing(tmp_path):
    cache = tmp_path / "cache"
    code = "import tilelang_ops, torch; print(len(tilelang_ops.OPS), torch.ops.tilelang_ops.compress_decode)"
    env = dict(os.environ, TILELANG_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    compiled = [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else []
    assert not compiled, f"importing tilelang_ops wrote {compiled[:5]}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_fake_gives_the_reference_outputs_shapes(case):
    call = case.call("cpu")
    want = _meta(call.fresh()(case.ref))
    with FakeTensorMode():
        got_result = to_fake_cuda(call)(case.fn)
        got = _meta(got_result)
        devices = {t.device.type for t in outputs(got_result)}
    assert got == want, f"{case.id}: fake outputs {got}, reference {want}"
    assert devices <= {"cuda"}, f"{case.id}: fake outputs on {devices}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_fake_runs_the_host_checks(case):
    call = case.call("cpu")
    first = next(iter(call.args))
    bad = call.with_(**{first: call[first].double()})  # no op takes an fp64 tensor
    with FakeTensorMode(), pytest.raises((TypeError, ValueError), match=first):
        to_fake_cuda(bad)(case.fn)


@pytest.mark.parametrize("value, kind", [(torch.tensor(3), "tensor"), (True, "bool"), (3.0, "float")],
                         ids=["tensor", "bool", "float"])
def test_scalar_arguments_are_checked_before_the_dispatcher(value, kind):
    """The dispatcher would take a 0-d tensor, a bool or a float as the int; the call names it instead."""
    call = B.decode_call("cpu").with_(max_seqlen_q=value)
    with pytest.raises(TypeError, match="max_seqlen_q"):
        call(tilelang_ops.compress_decode)


def test_a_mutated_tensor_is_bumped_once_per_call():
    from tilelang_ops._library import bump_versions

    cache, other, out = torch.zeros(1000, 4), torch.zeros(3), torch.zeros(2)
    run = bump_versions(lambda cache, other, out=None: None, (0, 2))
    v = cache._version, other._version, out._version
    run(cache, other, out)
    assert (cache._version, other._version, out._version) == (v[0] + 1, v[1], v[2] + 1)
    run(cache, other)  # the dispatcher leaves out a trailing argument that has its default
    assert cache._version == v[0] + 2


def test_only_plain_eager_calls_skip_the_dispatcher():
    from torch.utils._python_dispatch import TorchDispatchMode

    from tilelang_ops._library import _plain_untraced

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x = torch.zeros(2)
    assert _plain_untraced((x, None))
    with FakeTensorMode():
        assert not _plain_untraced((torch.empty(2),))
    with Passthrough():
        assert not _plain_untraced((x,))
    assert not _plain_untraced((torch.nn.Parameter(x),))


@dataclasses.dataclass(frozen=True)
class PlanCase:
    """A second call after ``(x, k, y)`` with x [8, 16] fp32, k 4, y None: ``change`` makes its arguments
    from the first call's; ``same``: its static key is the first call's; ``recent``: the most recent key's
    compiled check accepts it too (the guard also compares ``requires_grad``, which no plan reads)."""

    id: str
    change: Callable
    same: bool
    recent: bool = False


def _misaligned(x):
    return torch.zeros(x.numel() + 1)[1:].view(x.shape)  # 4 bytes past a 16-byte aligned address


PLAN_CASES = [
    PlanCase("same_tensors", lambda x, k, y: (x, k, y), True, True),
    PlanCase("new_tensors_same_key", lambda x, k, y: (x.clone(), 4, None), True, True),
    PlanCase("requires_grad", lambda x, k, y: (x.clone().requires_grad_(), k, y), True),
    PlanCase("shape", lambda x, k, y: (x[:4], k, y), False),
    PlanCase("strides", lambda x, k, y: (x.t().contiguous().t(), k, y), False),
    PlanCase("dtype", lambda x, k, y: (x.double(), k, y), False),
    PlanCase("scalar_value", lambda x, k, y: (x, 5, y), False),
    PlanCase("scalar_class", lambda x, k, y: (x, 4.0, y), False),
    PlanCase("none_to_tensor", lambda x, k, y: (x, k, x), False),
    PlanCase("misaligned", lambda x, k, y: (_misaligned(x), k, y), False),
]


def _counting_plans():
    from tilelang_ops._library import Plans, plan_key

    made = []

    def make(*args):
        made.append(plan_key(args))
        return len(made)

    return Plans(make), made


@pytest.mark.parametrize("case", PLAN_CASES, ids=lambda c: c.id)
def test_a_plan_is_made_once_per_static_key(case):
    """``Plans`` makes a plan on a key's first call only, whichever of the two keys came last."""
    from tilelang_ops._library import plan_key

    plans, made = _counting_plans()
    first = (torch.zeros(8, 16), 4, None)
    second = case.change(*first)
    assert (plan_key(second) == plan_key(first)) == case.same, f"{case.id} does not change what it says"
    want = 1 if case.same else 2
    assert plans(first) == 1 and plans(second) == want, f"{case.id}: made {made}"
    assert plans(first) == 1 and plans(second) == want and len(made) == want, f"{case.id}: made {made}"


@pytest.mark.parametrize("case", PLAN_CASES, ids=lambda c: c.id)
def test_the_most_recent_key_is_checked_without_the_table(case):
    """With the table emptied, only the most recent key's compiled check can find the plan: it does for
    the same key and for no changed part of it."""
    plans, made = _counting_plans()
    first = (torch.zeros(8, 16), 4, None)
    plans(first)
    plans.table.clear()
    assert plans(case.change(*first)) == (1 if case.recent else 2), f"{case.id}: made {made}"


def test_float_arguments_key_by_their_bits():
    """-0.0 and 0.0 are two keys (top-k's value fill writes either), every NaN one key (equality would make
    each NaN call a new plan)."""
    from tilelang_ops.topk import exact_fill

    plans, made = _counting_plans()
    x = torch.zeros(8, 16)
    assert [plans((x, 0.0)), plans((x, -0.0)), plans((x, 0.0)), plans((x, -0.0))] == [1, 2, 1, 2]
    assert [plans((x, float("nan"))), plans((x, float("nan")))] == [3, 3] and len(made) == 3
    # the kernel caches compare static arguments by equality too: the fill travels exactly
    assert exact_fill(-0.0) != exact_fill(0.0) and exact_fill(float("nan")) == exact_fill(float("nan"))
    assert exact_fill(-1.5) == -1.5 and math.copysign(1.0, float.fromhex(exact_fill(-0.0))) == -1.0


def test_alternating_keys_are_found_by_their_compiled_checks():
    """The RECENT_KEYS most recent keys are each found without the table (an engine alternates a few keys
    per op, one per layer type); an older one is looked up in the table again."""
    from tilelang_ops._library import RECENT_KEYS

    plans, made = _counting_plans()
    calls = [(torch.zeros(8, 16), k, None) for k in range(RECENT_KEYS + 1)]
    for call in calls:
        plans(call)
    plans.table.clear()
    for _ in range(2):
        for call in calls[1:]:
            assert plans(call) == call[1] + 1, f"key {call[1]}: made {made}"
    assert len(made) == RECENT_KEYS + 1
    assert plans(calls[0]) == RECENT_KEYS + 2  # forgotten by the checks, and the table was emptied


def test_plans_work_without_compiled_checks(monkeypatch):
    """Where torch's TensorGuards is missing or refuses the tensors (a private API), the table alone finds
    every plan."""
    from tilelang_ops import _library

    def refuse(*tensors, **kwargs):
        raise TypeError("TensorGuards() changed")

    for guards in (None, refuse):
        monkeypatch.setattr(_library, "_TensorGuards", guards)
        plans, made = _counting_plans()
        first, second = (torch.zeros(8, 16), 4, None), (torch.zeros(8, 16), 5, None)
        assert [plans(first), plans(second), plans(first), plans(second)] == [1, 2, 1, 2]
        assert len(made) == 2 and plans.recent == []


def _launch_with_configs():
    """The ``config=`` paths (tests, benchmarks and tools launch them directly)."""
    from tilelang_ops.compress_store import CompressStoreConfig
    from tilelang_ops.index_logits import IndexLogitsConfig
    from tilelang_ops.kv_store import DEFAULT_CONFIGS
    from tilelang_ops.topk import TopkConfig

    for config in (TopkConfig(), TopkConfig("tile"), TopkConfig("warp"), TopkConfig(split=2)):
        B.topk_call("cpu")(functools.partial(tilelang_ops.topk, config=config))
        B.topk_to_slots_call("cpu")(functools.partial(tilelang_ops.topk_to_slots, config=config))
    for case in ("store_fp8_main", "store_fp4_index"):
        call = OP_CASES[case].call("cpu")
        config = DEFAULT_CONFIGS[call["fmt"].name]
        call(functools.partial(tilelang_ops.norm_rope_hadamard_cast_store, config=config))
    B.compress_store_prefill_call("cpu")(functools.partial(tilelang_ops.compress_store_prefill,
                                                           config=CompressStoreConfig(rows_per_warp=8)))
    paged = IndexLogitsConfig(rows=2, warps=4, keys_per_step=64, stages=6, keys_per_cta=64)
    ragged = IndexLogitsConfig(rows=8, warps=8, keys_per_step=64, stages=4, keys_per_cta=512, min_ctas=0)
    for case, config in (("paged_index_logits", paged), ("paged_index_logits_out", paged),
                         ("paged_index_logits_candidates", IndexLogitsConfig(keys_per_cta=64)),
                         ("ragged_index_logits", ragged), ("ragged_index_logits_out", ragged)):
        OP_CASES[case].call("cpu").fresh()(functools.partial(OP_CASES[case].fn, config=config))


def _layout(result):
    return [(tuple(t.shape), t.stride(), t.dtype) for t in outputs(result)]


def _check_impl_outputs_match_the_fake(case):
    """The op's CUDA implementation (its kernels stood in for) allocates outputs of the fake's shapes,
    strides and dtypes, what opcheck's fake test compares on the GPU."""
    from tilelang_ops import _library

    op = _op(case.op)
    call = case.call("cpu")
    kw = _schema_kwargs(case, call.fresh())
    args = [kw[a.name] if a.name in kw else a.default_value for a in op._schema.arguments]
    got = _layout(_library._CALLS[op].impl(*args))
    with FakeTensorMode():
        fake = _layout(op(**_schema_kwargs(case, to_fake_cuda(call))))
    assert got == fake, f"{case.id}: implementation {got}, fake {fake}"


_TL_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
              torch.int32: "int32", torch.int64: "int64", torch.uint8: "uint8", torch.int8: "int8"}


def bind_launch(func, args, name: str) -> None:
    """Bind a launch's arguments to a prim_func's parameters as its TVM-FFI host code does on the GPU: as
    many arguments as parameters; per buffer a tensor of its dtype and rank, constant extents equal,
    each symbolic extent one value across every buffer, extent expressions (``num_reqs + 1``) equal to
    their value, compact strides (contiguous); per scalar a Python number."""
    import tvm
    from tvm import tirx as tir

    assert len(args) == len(func.params), f"{name}: {len(args)} arguments, {len(func.params)} params"
    env: dict = {}
    exprs = []
    for i, (param, arg) in enumerate(zip(func.params, args)):
        buf = func.buffer_map.get(param)
        if buf is None:
            assert isinstance(arg, (int, float)), \
                f"{name}: argument {i} ({param.name}) must be a number, got {type(arg).__name__}"
            continue
        where = f"{name}: argument {i} ({buf.name})"
        assert isinstance(arg, torch.Tensor), f"{where}: a tensor, got {type(arg).__name__}"
        assert _TL_DTYPES.get(arg.dtype) == str(buf.dtype), f"{where}: dtype {arg.dtype}, buffer {buf.dtype}"
        assert arg.dim() == len(buf.shape), f"{where}: shape {tuple(arg.shape)}, buffer {list(buf.shape)}"
        assert arg.is_contiguous(), f"{where}: strides {arg.stride()}, the buffer is compact"
        for extent, size in zip(buf.shape, arg.shape):
            if isinstance(extent, tir.IntImm):
                assert int(extent) == size, f"{where}: shape {tuple(arg.shape)}, buffer {list(buf.shape)}"
            elif isinstance(extent, tir.Var):
                assert env.setdefault(extent.name, size) == size, \
                    f"{where}: {extent.name} = {size}, another buffer has {env[extent.name]}"
            else:
                exprs.append((where, extent, size))
    def variables(expr) -> list:
        found = []
        tir.stmt_functor.post_order_visit(expr, lambda e: found.append(e) if isinstance(e, tir.Var) else None)
        return found

    analyzer = tvm.arith.Analyzer()
    for where, extent, size in exprs:
        value = analyzer.simplify(tir.stmt_functor.substitute(
            extent, {v: tir.IntImm(v.dtype, env[v.name]) for v in variables(extent) if v.name in env}))
        assert isinstance(value, tir.IntImm) and int(value) == size, \
            f"{where}: extent {extent} = {value}, got {size}"


def test_every_op_launches_its_kernels_with_their_parameters(monkeypatch):
    """Each case's eager path, and the decode step's, on the CPU up to the launches: the host checks (the
    device check passing), the plan, every kernel's static arguments bound into its sm_90a TIR, and each
    launch's arguments bound to that prim_func's parameters as its TVM-FFI host code binds them
    (``bind_launch``: what the CUDA tier would otherwise find first), strided inputs included; each op's
    outputs have its fake's shapes, strides and dtypes."""
    from tvm.target import Target

    from tilelang_ops.build import SM90_TARGET

    funcs: dict = {}

    def bound(factory, *static):
        key = (id(factory), static)
        if key not in funcs:
            with Target(SM90_TARGET):
                funcs[key] = factory.get_tir(*static)
        name = getattr(getattr(getattr(factory, "func", None), "orig_func", None), "__name__", "kernel")

        def launch(*args):
            bind_launch(funcs[key], args, f"{name}{static}")
        return launch

    strided = 0
    with eager_on_the_cpu(bound, monkeypatch.setattr):
        for case in CASES:
            case.call("cpu").fresh()(case.fn)
            _check_impl_outputs_match_the_fake(case)
            strided += _launch_with_strided_inputs(case)
        step, tensors = _step("cpu")
        step(*tensors)
        _launch_with_configs()
    assert len(funcs) >= len({c.op for c in CASES}) - 2, list(funcs)
    assert strided >= 10, f"only {strided} calls with a strided input reached a launch"


def test_has_memory_tells_real_tensors_from_traced_ones():
    """The address checks (``same_start``, ``check_aligned``) read addresses only of tensors with memory: a
    plain tensor (its fast path) or a functional wrapper of one; never a meta or fake tensor, or a
    functional wrapper of a fake (what functionalization hands a kernel while tracing)."""
    from metadata.checks import has_memory, same_start

    x = torch.zeros(4)
    assert has_memory(x) and same_start(x, x[:2]) and not same_start(x, x[1:])
    assert has_memory(torch._to_functional_tensor(x))
    assert not has_memory(torch.empty(4, device="meta"))
    with FakeTensorMode():
        fake = torch.empty(4, device="cuda")
    assert not has_memory(fake) and not same_start(fake, fake)
    wrapped = torch._to_functional_tensor(fake)
    assert type(wrapped) is torch.Tensor and not has_memory(wrapped)


def test_launches_keep_the_current_device():
    """TVM's host code makes the kernel's device current and leaves it so: each launch restores the device
    that was current before it (after an error too), and sets nothing when the device did not change."""
    from tilelang_ops._library import keeps_current_device

    state, sets = {"device": 0}, []

    def set_device(d):
        sets.append(d)
        state["device"] = d

    def kernel_on(device):
        def fn(*args):
            state["device"] = device  # what __tvm_set_device does
            if args and args[0] == "fail":
                raise RuntimeError("launch failed")
            return args
        return keeps_current_device(fn, lambda: state["device"], set_device)

    assert kernel_on(1)(7, 8) == (7, 8) and state["device"] == 0 and sets == [0]
    with pytest.raises(RuntimeError, match="launch failed"):
        kernel_on(1)("fail")
    assert state["device"] == 0 and sets == [0, 0]
    kernel_on(0)(1)
    assert sets == [0, 0], "a launch on the current device sets no device"


@pytest.mark.parametrize("gpus", [0, 1, 2, 4])
def test_launches_query_the_device_only_where_there_are_several(monkeypatch, gpus):
    """``direct`` gives the bare TVM-FFI executable where the process sees at most one GPU (nothing can
    move the current device) and the device-keeping wrapper where it sees several."""
    from types import SimpleNamespace

    from tilelang_ops import _library

    def executable(*args):
        return args

    kernel = SimpleNamespace(adapter=SimpleNamespace(_get_executable=lambda: executable))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_setDevice", lambda d: None, raising=False)
    launch = _library.direct(kernel)
    assert (launch is executable) == (gpus < 2), f"{gpus} GPU(s): got {launch}"
    assert launch(3, 4) == (3, 4)


def test_an_address_check_runs_on_every_call(monkeypatch):
    """A cached plan does not skip the one host check that reads addresses (out_norm starting where kv
    does): after a clean call, the same static key with out_norm = kv raises before any launch."""
    import tilelang_ops.kv_store as kv_store
    from tilelang_ops import _library

    launches = []
    accept_cpu_tensors(monkeypatch.setattr)
    monkeypatch.setattr(kv_store, "compiled", lambda *static: lambda *args: launches.append(args))
    case = OP_CASES["store_fp8_main"]
    call = case.call("cpu")
    kv = call["kv"]
    _library.forget_plans()
    try:
        call.fresh().with_(out_norm=torch.empty_like(kv))(case.fn)
        assert len(launches) == 1
        with pytest.raises(ValueError, match="out_norm must not alias kv"):
            call.fresh().with_(out_norm=kv)(case.fn)
        assert len(launches) == 1
    finally:
        _library.forget_plans()


def _strided(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a non-contiguous tensor (every other element of a buffer twice as long)."""
    out = torch.empty(*t.shape, 2, dtype=t.dtype)[..., 0]
    return out.copy_(t)


def _launch_with_strided_inputs(case) -> int:
    """The case once per tensor argument, that argument strided (after the contiguous call made its plan):
    where the host checks take it, the launch still gets contiguous tensors (the stand-in launch asserts
    it). Returns how many such calls reached their launch."""
    reached = 0
    call = case.call("cpu")
    for name, value in {**call.args, **call.kwargs}.items():
        if not isinstance(value, torch.Tensor) or value.numel() < 2 or name in call.writes:
            continue
        try:
            call.fresh().with_(**{name: _strided(value)})(case.fn)
        except (ValueError, TypeError):
            continue  # the host checks ask for this argument contiguous
        reached += 1
    return reached


def test_host_benchmark_noop_kernels_lower_for_sm90():
    """The launch floor the host benchmark measures: its no-op kernels take 1 and 10 tensor arguments."""
    from tvm.target import Target

    from benchmarks.bench_host import NOOP_ARGS, noop_kernel
    from tilelang_ops.build import SM90_TARGET

    noop = noop_kernel()
    with Target(SM90_TARGET):
        assert [len(noop.get_tir(n).params) for n in NOOP_ARGS] == list(NOOP_ARGS)


@pytest.mark.parametrize("shape", [(128,), (5, 128), (2, 3, 128), (2, 1, 4, 128)], ids=str)
def test_quantize_launch_binds_every_leading_rank(monkeypatch, shape):
    """quantize_index_rows hands x and its outputs to the kernel in their own shapes (a kernel per leading
    rank; one row of x [128] as [1, 128]): each launch binds to its prim_func's parameters."""
    from tvm.target import Target

    import tilelang_ops.index_logits as index_logits
    from tilelang_ops import _library
    from tilelang_ops.build import SM90_TARGET

    launches = []

    def bound(factory, *static):
        with Target(SM90_TARGET):
            func = factory.get_tir(*static)
        return lambda *args: launches.append(bind_launch(func, args, f"quantize{static}"))

    accept_cpu_tensors(monkeypatch.setattr)
    monkeypatch.setattr(index_logits, "kernel", bound)
    _library.forget_plans()
    try:
        codes, scales = tilelang_ops.quantize_index_rows(torch.zeros(shape, dtype=torch.bfloat16))
    finally:
        _library.forget_plans()
    assert len(launches) == 1 and codes.shape == (*shape[:-1], 64) and scales.shape == (*shape[:-1], 4)


def test_cpu_tensors_get_the_named_device_error():
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        B.decode_call("cpu")(tilelang_ops.compress_decode)


STEP = PathCase("step", prefill=False, seqlens_k=(300, 1001, 77), seqlen_q=2, k=128)


def _step(device="cpu"):
    """``decode_step`` (the issue's decode step: compress_store_decode, the index branch's store,
    quantize, paged_index_logits, topk_to_slots) bound to its host ints, and its tensors."""
    tensors, ints = decode_step_args(build_path(STEP, device))
    return functools.partial(decode_step, **ints), tensors


STEP_OPS = ("compress_store_decode", "norm_rope_hadamard_cast_store", "quantize_index_rows",
            "paged_index_logits", "topk_to_slots")


def test_decode_step_compiles_into_one_graph():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    step, inputs = _step()
    with FakeTensorMode():
        fake = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda") for t in inputs]
        torch._dynamo.reset()
        out_norm, logits, slots = torch.compile(step, backend=backend, fullgraph=True)(*fake)
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    for op in STEP_OPS:
        assert any(f"tilelang_ops.{op}.default" in t for t in targets), f"{op} not in the graph: {targets}"
    rows = inputs[7].shape[0]
    assert out_norm.shape == (rows, 512) and logits.shape[-1] == step.keywords["max_klen"]
    assert slots.shape == (inputs[16].numel(), STEP.k) and slots.dtype == torch.int32


def test_prefill_without_num_rows_traces_a_dynamic_row_count():
    call = B.prefill_call("cpu")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def step(*args):
        return tilelang_ops.compress_prefill(*args, num_rows=None)

    with FakeTensorMode(shape_env=ShapeEnv()):  # as torch.compile of real tensors has
        fake = to_fake_cuda(call)
        torch._dynamo.reset()
        kv = torch.compile(step, backend=backend, fullgraph=True)(*fake.args.values())
    assert kv.shape[1] == call["projected_kv"].shape[1] // 2 and len(graphs) == 1


# ----------------------------------------------------------------------------------------------
# GPU tier
# ----------------------------------------------------------------------------------------------

def _schema_kwargs(case, call):
    """The call's arguments by schema name (what torch.ops and opcheck take), the Python API's defaults for
    those it leaves out (topk's schema has none: its parser takes no -inf); the cache format by its name,
    and ``clean`` logits (opcheck compares two calls' outputs, so no column may be left unwritten)."""
    defaults = {n: p.default for n, p in inspect.signature(case.fn).parameters.items()
                if p.default is not inspect.Parameter.empty}
    kw = {**defaults, **call.args, **call.kwargs}
    names = {a.name for a in _op(case.op)._schema.arguments}
    if "fmt" in kw:
        kw["fmt"] = kw["fmt"].name
    if "clean" in names:
        kw["clean"] = True
    return {k: v for k, v in kw.items() if k in names}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_registered_op_takes_the_schema_call(case):
    """torch.ops.tilelang_ops.<op> called by schema name, as opcheck calls it, runs (fakes on fake CUDA
    tensors); its last output is the Python API's (ops that fill a tensor in place return nothing)."""
    call = case.call("cpu")
    with FakeTensorMode():
        fake = to_fake_cuda(call)
        want = _meta(fake.fresh()(case.fn))
        got = _meta(_op(case.op)(**_schema_kwargs(case, fake)))
    if got or not MUTATES[case.op]:  # an op that only fills its arguments returns nothing
        assert got[-1:] == want[-1:], f"{case.id}: op {got}, Python API {want}"


def _reference_kernel(op, ref):
    """A CPU kernel of ``op`` made of its reference: schema arguments to the reference's keywords, the
    format by its name, nothing returned where the op fills its arguments, and where the Python API
    returns no values, topk's: those sorting needs, else [0, k]."""
    from tilelang_ops.kv_store import cache_format

    names = [a.name for a in op._schema.arguments]
    returns = len(op._schema.returns)

    def run(*args):
        kw = dict(zip(names, args))
        if "fmt" in kw:
            kw["fmt"] = cache_format(kw["fmt"])
        out = ref(**kw)
        if not returns:
            return None
        if isinstance(out, tuple) and out[0] is None:
            values = ref(**{**kw, "return_value": True})[0]
            out = (values if kw["sorted"] else values[:0], *out[1:])
        return out
    return run


@pytest.fixture
def reference_cpu_kernels():
    """Every op's CPU kernel is its reference, wrapped as the CUDA kernel wraps the implementation
    (``bump_versions``), during the test (then the original again, which names the device error); the
    device checks accept CPU tensors and every call goes through the dispatcher, so ``opcheck`` and
    compiled steps run on the CPU."""
    from tilelang_ops import _library

    lib = torch.library.Library("tilelang_ops", "IMPL")
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", "(?s).*Overriding a previously registered kernel")
        mp.setattr(_library, "_plain_untraced", lambda tensors: False)
        accept_cpu_tensors(mp.setattr)
        for name in sorted({c.op for c in CASES}):
            op = _op(name)
            ref = _reference_kernel(op, next(c.ref for c in CASES if c.op == name))
            # torch 2.11 refuses to override a Python kernel unless asked; 2.13 allows it by default
            lib.impl(name, _library.bump_versions(ref, _library.mutated_positions(op)), "CPU",
                     allow_override=True)
        yield
    lib._destroy()
    with pytest.raises(ValueError, match="needs CUDA"):
        _op("gather_rows")(torch.zeros(2, 8, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.int32))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_opcheck_on_the_cpu_with_the_reference_as_kernel(case, reference_cpu_kernels):
    """opcheck's schema (what is written matches ``mutates_args``, no output aliases an input), fake
    (the fake's outputs have the real outputs' shapes, strides and dtypes) and AOT-dispatch tests, with
    the reference standing in for the kernel; the GPU tier runs the same with the kernels."""
    torch.library.opcheck(_op(case.op), (), _schema_kwargs(case, case.call("cpu")))


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inductor's
def test_compiled_decode_step_is_bitwise_eager_on_the_cpu(reference_cpu_kernels):
    """The decode step compiled by inductor (functionalized in-place ops, reinplacing, the fakes' shapes)
    gives bitwise eager's outputs and writes, with the references as the ops' CPU kernels."""
    _check_compiled_step("cpu")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_an_op_on_another_gpu_leaves_the_current_device(case):
    """Each op on cuda:1 tensors while cuda:0 is current: the same bytes as on cuda:0 (outputs and what it
    writes; logits cleaned, so no column is left unwritten), and cuda:0 is still current afterwards."""
    results = {}
    for device in ("cuda:0", "cuda:1"):
        torch.cuda.set_device(0)
        call = case.call(device)
        if "clean" in {**call.args, **call.kwargs}:
            call = call.with_(clean=True)
        out = call(case.fn)
        torch.cuda.synchronize(device)
        now = torch.cuda.current_device()
        assert now == 0, f"{case.id} on {device} left cuda:{now} current"
        results[device] = [t.cpu() for t in outputs(out)] + [t.cpu() for t in call.written().values()]
    _bitwise(f"{case.id} cuda:1 vs cuda:0", results["cuda:1"], results["cuda:0"])


@needs_cuda
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_opcheck(case):
    call = case.call("cuda")
    torch.library.opcheck(_op(case.op), (), _schema_kwargs(case, call))


def _clone(inputs):
    return [t.clone() for t in inputs]


def _bitwise(name, got, want):
    for i, (g, w) in enumerate(zip(outputs(got), outputs(want))):
        gb, wb = g.contiguous().view(torch.uint8), w.contiguous().view(torch.uint8)
        bad = (gb != wb).nonzero()
        assert bad.numel() == 0, f"{name} output {i}: {bad.shape[0]} bytes differ, first {bad[:4].tolist()}"


KLEN = 16  # the position of klen [b, n] among the decode step's tensors


def _written(result, klen):
    """A decode step's outputs as far as it writes them: the logits at columns < klen only (the rest stays
    unwritten: top-k reads each row up to end = klen)."""
    out_norm, logits, slots = result
    cols = torch.arange(logits.shape[-1], device=logits.device)
    return out_norm, logits[cols < klen[..., None]], slots


def _check_compiled_step(device):
    step, inputs = _step(device)
    eager_in, compiled_in = _clone(inputs), _clone(inputs)
    want = step(*eager_in)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(*compiled_in)
    _bitwise("compiled step", _written(got, inputs[KLEN]), _written(want, inputs[KLEN]))
    _check_step_writes("", compiled_in, eager_in)


def _check_step_writes(prefix: str, compiled_in: list, eager_in: list) -> None:
    """What a compiled decode step wrote in place (ring, main cache, index cache) equals eager's writes."""
    for i, name in ((1, "state ring"), (9, "main cache"), (12, "index cache")):
        _bitwise(f"{prefix}{name} after the compiled step", compiled_in[i], eager_in[i])


# a second decode batch for the dynamic-shape test: other request count, contexts, tokens per request
STEP_OTHER = PathCase("step_other", prefill=False, seqlens_k=(500, 90, 1200, 333, 2048), seqlen_q=2, k=128)


def test_every_op_traces_with_dynamic_shapes():
    """``torch.compile(dynamic=True)``: every op's call traces into one graph with symbolic sizes and ints
    (the host checks take ``torch.SymInt`` / ``SymFloat``; static arguments such as the compress ratio
    are specialized by guards), and gives the outputs the eager fake gives."""
    for case in CASES:
        graphs = []

        def backend(gm, example_inputs, graphs=graphs):
            graphs.append(gm)
            return gm.forward

        fn, call = case.fn, case.call("cpu")
        with FakeTensorMode(shape_env=ShapeEnv()):
            fake = to_fake_cuda(call)
            want = _meta(fn(*fake.args.values(), **fake.kwargs))
            torch._dynamo.reset()
            got = torch.compile(lambda *a, fn=fn, **kw: fn(*a, **kw), backend=backend, fullgraph=True,
                                dynamic=True)(*fake.args.values(), **fake.kwargs)
        assert len(graphs) == 1, case.id
        sizes = [n for n in graphs[0].graph.nodes
                 if n.op == "placeholder" and isinstance(n.meta.get("example_value"), torch.SymInt)]
        assert sizes, f"{case.id}: no symbolic size in the graph"
        assert _meta(got) == want, case.id


def test_dynamic_decode_step_serves_other_shapes_without_recompiling(reference_cpu_kernels):
    """A decode step compiled with ``dynamic=True`` (aot_eager: functionalized, symbolic sizes) serves a
    batch of other request count, contexts and block-table width without compiling again, bitwise equal
    to eager each time, with the references as the ops' CPU kernels. Duck sizing is off: it would tie
    sizes that happen to be equal in the first batch (a block-table width and a ring size) and recompile
    for the second, whatever the ops do. The step size ``n`` and the static arguments (heads, k, ratio,
    formats) select kernels, so they are guarded, not symbolic."""
    import torch.fx.experimental._config as fx_config
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    compiled = torch.compile(decode_step, backend=counter, fullgraph=True, dynamic=True)
    frames = []
    with fx_config.patch(use_duck_shape=False):
        for case in (STEP, STEP_OTHER):
            inputs, ints = decode_step_args(build_path(case, "cpu"))
            eager_in, compiled_in = _clone(inputs), _clone(inputs)
            want = decode_step(*eager_in, **ints)
            got = compiled(*compiled_in, **ints)
            frames.append(counter.frame_count)
            _bitwise(f"{case.id} compiled step", _written(got, inputs[KLEN]), _written(want, inputs[KLEN]))
            _check_step_writes(f"{case.id}: ", compiled_in, eager_in)
    assert frames[1] == frames[0], f"the second batch compiled again ({frames})"


@needs_cuda
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_compiled_eager_path_is_bitwise_the_python_path(case):
    """The third call of a static key (replayed by the compiled eager path) returns and writes bitwise
    what the first (the Python path) did, from the same inputs; the ops of ``COMPILED_EAGER`` replay it."""
    from tilelang_ops import _fast, _library

    fn = case.fn
    if "clean" in inspect.signature(fn).parameters:  # every logit written, so outputs compare whole
        fn = functools.partial(fn, clean=True)
    call = case.call("cuda")
    _library.forget_recipes()  # the first call takes the Python path, the second records, the third replays
    runs = []
    before = tilelang_ops.compiled_eager(True)
    try:
        for _ in range(3):
            fresh = call.fresh()
            result = fresh(fn)
            runs.append(([t for t in outputs(result)], fresh.written()))
        fast = _library._CALLS[_library.OPS[case.op]].fast
        replays = _fast.extension().stats(fast)[2] if fast is not None else 0
    finally:
        tilelang_ops.compiled_eager(before)
    if case.id in COMPILED_EAGER:
        assert replays == 1, f"{case.id}: replayed {replays} of 3 calls"
    for (got, got_w), (want, want_w) in [(runs[2], runs[0]), (runs[1], runs[0])]:
        for k, (g, w) in enumerate(zip(got, want)):
            _bitwise(f"{case.id} output {k}", g, w)
        for name in want_w:
            _bitwise(f"{case.id} {name}", got_w[name], want_w[name])


@needs_cuda
def test_compiled_decode_step_is_bitwise_eager():
    _check_compiled_step("cuda")


@needs_cuda
@pytest.mark.parametrize("compiled", [False, True], ids=["python_path", "compiled_eager"])
def test_cuda_graph_replay_of_a_decode_step_is_bitwise_eager(compiled):
    """A captured decode step replays bitwise what eager calls give; with the compiled eager path the
    capture and the eager calls are replays of recipes (the two warm-ups record them)."""
    before = tilelang_ops.compiled_eager(compiled)
    try:
        _check_graph_replay(warmups=2 if compiled else 1)
    finally:
        tilelang_ops.compiled_eager(before)


def _check_graph_replay(warmups: int):
    step, static = _step("cuda")
    initial = _clone(static)
    for _ in range(warmups):
        tilelang_ops.warmup(step, *_clone(static), progress=None)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            captured = step(*static)
    torch.cuda.current_stream().wait_stream(stream)
    for seed in (1, 2):
        g = torch.Generator(device="cuda").manual_seed(seed)
        fresh = _clone(initial)  # the ring and caches as before the step; new projected inputs and queries
        fresh[0].normal_(generator=g)
        fresh[13].copy_(torch.randn(fresh[13].shape, generator=g, device="cuda"))
        fresh[14].normal_(generator=g)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        eager_in = _clone(fresh)
        want = step(*eager_in)
        torch.cuda.synchronize()
        _bitwise(f"replay {seed}", _written(captured, static[KLEN]), _written(want, static[KLEN]))
        for i, name in ((1, "state ring"), (9, "main cache"), (12, "index cache")):
            _bitwise(f"{name} after replay {seed}", static[i], eager_in[i])


@needs_cuda
def test_a_compile_during_capture_raises():
    from tilelang_ops._library import kernel
    from tilelang_ops.gather_rows import gather_rows_kernel

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), pytest.raises(RuntimeError, match="CUDA graph"):
        with torch.cuda.graph(graph, stream=stream):
            kernel(gather_rows_kernel, 4104, 256, 4)  # a width no test compiles


# the ops whose decode-size calls the compiled eager path must serve (each case's second call records it)
COMPILED_EAGER = {"compress_decode", "compress_prefill", "gather_rows", "quantize_index_rows",
                  "paged_index_logits", "paged_index_logits_candidates", "paged_index_logits_out",
                  "ragged_index_logits", "ragged_index_logits_out", "store_fp8_main", "store_fp4_index",
                  "compress_store_prefill", "compress_store_decode", "topk", "topk_to_slots",
                  "block_max_scores", "restore_candidate_indices_", "convert_kv_index_"}


def _launch_rows(sink: list, call, result) -> list:
    """The launches in ``sink`` with each address told as (argument name or output position, byte offset);
    an address in neither (a placeholder, a temporary) by the order of its first appearance."""
    spans = [(n, t) for n, t in {**call.args, **call.kwargs}.items() if isinstance(t, torch.Tensor)]
    outs = result if isinstance(result, tuple) else (result,)
    spans += [(f"out{j}", t) for j, t in enumerate(outs) if isinstance(t, torch.Tensor)]

    others: dict = {}

    def where(addr):
        for name, t in spans:
            start = t.untyped_storage().data_ptr()
            if start <= addr < start + max(t.untyped_storage().nbytes(), 1):
                return name, addr - t.data_ptr()
        return "other", others.setdefault(addr, len(others))

    return [(fn, tuple((where(p[0]), *p[1:]) if isinstance(p, tuple) else p for p in row))
            for fn, row in sink]


def test_the_extension_replays_only_a_call_that_matches_the_recipe():
    """The C++ extension alone: a recipe (one view of an argument, one allocation, scalars) replays a call
    with the same key, launching the view at its offset and returning the allocation and the argument, with
    the argument's version bumped; any difference in the key (shape, strides, dtype, alignment, which
    arguments share a start, a scalar's type or value, None for a tensor), a tensor subclass or an active
    mode answers NotImplemented and launches nothing; malformed recipes raise."""
    import tvm_ffi
    from torch.overrides import TorchFunctionMode

    from tilelang_ops import _fast

    ext = _fast.extension()
    sink: list = []
    ext.probe("tilelang_ops.testing.unit_probe", sink)
    fn = tvm_ffi.get_global_func("tilelang_ops.testing.unit_probe")
    op = ext.new_op(False)
    x, y = torch.arange(12.0).reshape(3, 4), torch.zeros(3, 4)
    out = torch.empty(3, 2)
    launch = (fn, (("arg", 0, x[:, 1:3]), ("alloc", 0, out), ("int", 7), ("float", 1.5), ("bool", 1),
                   ("none",), ("arg", 1, y)))
    ext.add(op, (x, y, 5, 2.5, torch.int32, "fp8", None), (out,),
            (launch,), (0,), ("tuple", (-1, 1)))

    a, b = torch.ones(3, 4), torch.ones(3, 4)
    key = (a, b, 5, 2.5, torch.int32, "fp8", None)
    v = a._version
    got = ext.call(op, key)
    assert got[1] is b and got[0].shape == (3, 2) and got[0].dtype == torch.float32 and a._version == v + 1
    (_, row), = sink
    assert row[0][:4] == (a.data_ptr() + 4, (3, 2), (4, 1), (2, 32, 1))  # x[:, 1:3] of this call's a
    assert row[1][:3] == (got[0].data_ptr(), (3, 2), (2, 1)) and row[2:6] == (7, 1.5, True, None)
    assert row[6][:3] == (b.data_ptr(), (3, 4), (4, 1))

    base = torch.ones(13)
    changed = {
        "shape": (torch.ones(3, 5), b), "strides": (torch.ones(4, 3).t(), b),
        "dtype": (torch.ones(3, 4, dtype=torch.float64), b), "alignment": (base[1:].view(3, 4), b),
        "same start": (a, a), "subclass": (torch.nn.Parameter(torch.ones(3, 4)), b),
    }
    scalars = {"int value": (2, 6), "bool for int": (2, True), "int for float": (3, 2),
               "float value": (3, -2.5), "dtype": (4, torch.int64), "str": (5, "fp4"),
               "tensor for None": (6, a)}
    calls = {name: t + key[2:] for name, t in changed.items()}
    calls.update({name: key[:i] + (value,) + key[i + 1:] for name, (i, value) in scalars.items()})
    sink.clear()
    for name, args in calls.items():
        assert ext.call(op, args) is NotImplemented, name
    with FakeTensorMode():
        assert ext.call(op, key) is NotImplemented, "a dispatch mode"
    with TorchFunctionMode():
        assert ext.call(op, key) is NotImplemented, "a torch-function mode"
    assert not sink and ext.stats(op) == (1, 0, 1)

    for bad, match in [((("arg", 2, x),), "out of range"), ((("alloc", 1, out),), "out of range"),
                       ((("what", 1),), "unknown parameter kind")]:
        with pytest.raises(ValueError, match=match):
            ext.add(op, (x, y, 5), (out,), ((fn, bad),), (), None)
    with pytest.raises(ValueError, match="bumped argument"):
        ext.add(op, (x,), (), (), (3,), None)
    with pytest.raises(ValueError, match="neither a tensor argument nor an allocation"):
        ext.add(op, (x, 5), (), (), (), ("one", 1))
    assert ext.stats(op) == (1, 0, 1)


def test_compiled_eager_is_off_by_default_and_off_drops_the_recipes(monkeypatch):
    """``compiled_eager``: off in a new process, takes a bool, returns the setting before; turning it off
    drops every recipe, so no call is replayed after."""
    import tvm_ffi

    from tilelang_ops import _fast, _library

    assert tilelang_ops.compiled_eager() is False
    with pytest.raises(TypeError, match="enabled must be a bool"):
        tilelang_ops.compiled_eager(1)
    ext = _fast.extension()
    ext.probe("tilelang_ops.testing.noop", None)
    noop = tvm_ffi.get_global_func("tilelang_ops.testing.noop")
    case = OP_CASES["compress_decode"]
    fast = _library._CALLS[_library.OPS[case.op]]
    with eager_on_the_cpu(lambda factory, *static: noop, monkeypatch.setattr, record=True):
        call = case.call("cpu")
        for _ in range(3):
            call(case.fn)
        assert ext.stats(fast.fast)[:1] + ext.stats(fast.fast)[2:] == (1, 1)
        assert tilelang_ops.compiled_eager(False) is True
        assert ext.stats(fast.fast) == (0, 0, 0) and not fast.seen
        call(case.fn)
        assert ext.stats(fast.fast) == (0, 0, 0)


def test_a_replayed_key_still_refuses_out_norm_on_kv(monkeypatch):
    """The store's one per-call address check holds on the compiled eager path: a recipe recorded with
    out_norm apart from kv does not serve a call whose out_norm starts where kv does (the recipe matches
    which arguments share a start), so the Python path raises and nothing is launched."""
    import tvm_ffi

    from tilelang_ops import _fast, _library

    ext = _fast.extension()
    sink: list = []
    ext.probe("tilelang_ops.testing.store_probe", sink)
    fn = tvm_ffi.get_global_func("tilelang_ops.testing.store_probe")
    case = OP_CASES["store_fp8_main"]
    with eager_on_the_cpu(lambda factory, *static: fn, monkeypatch.setattr, record=True):
        call = case.call("cpu")
        kv = call["kv"]
        apart = call.with_(out_norm=torch.empty_like(kv))
        for _ in range(3):
            apart(case.fn)
        assert ext.stats(_library._CALLS[_library.OPS[case.op]].fast)[2] == 1 and len(sink) == 3
        with pytest.raises(ValueError, match="out_norm must not alias kv"):
            call.with_(out_norm=kv)(case.fn)
        assert len(sink) == 3


def test_compiled_eager_path_launches_what_the_python_path_launches(monkeypatch):
    """Every case on the CPU with TVM-FFI stand-ins that record their parameters (``probe``): the second
    call of a static key records its recipe, the third is replayed by the compiled eager path, which
    launches the same functions with the same parameters (each address as the same argument or output
    at the same offset, shapes, strides, dtypes, scalars), returns outputs of the same shapes, strides and
    dtypes, bumps the same version counters and returns the same arguments. The decode-size calls of every
    op become recipes."""
    import tvm_ffi

    from tilelang_ops import _fast, _library

    ext = _fast.extension()
    assert ext is not None, "the compiled eager path did not build"
    sink: list = []
    probes: dict = {}

    def probe(factory, *static):
        key = (id(factory), static)
        if key not in probes:
            name = f"tilelang_ops.testing.probe{len(probes)}"
            ext.probe(name, sink)
            probes[key] = tvm_ffi.get_global_func(name)
        return probes[key]

    replayed = set()
    with eager_on_the_cpu(probe, monkeypatch.setattr, record=True):
        for case in CASES:
            call = case.call("cpu")
            runs = []
            for _ in range(3):
                sink.clear()
                versions = {n: t._version for n, t in call.written().items()}
                result = call(case.fn)
                outs = result if isinstance(result, tuple) else (result,)
                runs.append((_launch_rows(sink, call, result), _meta(result),
                             [(t.stride(), t.device, t.requires_grad) for t in outputs(result)],
                             {n: t._version - versions[n] for n, t in call.written().items()},
                             tuple(any(o is t for t in call.args.values()) for o in outs)))
            fast = _library._CALLS[_library.OPS[case.op]].fast
            if fast is not None and ext.stats(fast)[0]:
                replayed.add(case.id)
            for k in (1, 2):
                assert runs[k] == runs[0], f"{case.id}: call {k + 1} differs:\n{runs[k]}\nvs\n{runs[0]}"
    missing = COMPILED_EAGER - replayed
    assert not missing, f"no recipe for {sorted(missing)}"
