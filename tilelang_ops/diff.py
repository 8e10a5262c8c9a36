"""`python -m tilelang_ops diff`: every kernel against its reference, one table per operator.

Each operator contributes a module in `tilelang_ops.diffcases` with:

* ``OP``: the operator name;
* ``CASES``: case ids;
* ``run_case(case_id, device) -> list[Comparison]``: kernel vs reference on ``device`` (CUDA); raise
  ``NotImplementedError`` while the kernel does not exist;
* ``self_check(case_id) -> list[Comparison]``: reference checks that need no GPU (loop reference vs
  vectorized twin, invariants);
* ``build_check() -> list[str]``: compile the op's kernels for sm_90a, return what was built.
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback

import torch

from tilelang_ops.testing import format_table

DIFF_MODULES = (
    "tilelang_ops.diffcases.compress",
    "tilelang_ops.diffcases.kv_store",
    "tilelang_ops.diffcases.compress_store",
    "tilelang_ops.diffcases.topk",
    "tilelang_ops.diffcases.gather_rows",
    "tilelang_ops.diffcases.index_logits",
)


def _rows_for(case_id, comparisons):
    rows = []
    for c in comparisons:
        first = c.first[0] if c.first else ""
        rows.append([case_id, c.output, f"{c.max_abs_err:.3g}", f"{c.mismatches}/{c.total}",
                     first[:60], "pass" if c.passed else "FAIL"])
    return rows


def _quiet_tilelang() -> None:
    """TileLang logs every compile at INFO level; the tables are the output here."""
    import tilelang  # its import sets the level to INFO: set ours after it

    tilelang.set_log_level("WARNING")


def run_diff(out=sys.stdout, ops=None, verbose: bool = False) -> int:
    """Print one table per operator (``ops``: operator names, default all); returns the exit status."""
    if not verbose:
        _quiet_tilelang()
    modules = DIFF_MODULES
    if ops:
        known = {m.rsplit(".", 1)[-1]: m for m in DIFF_MODULES}
        unknown = [o for o in ops if o not in known]
        if unknown:
            print(f"unknown operator(s) {unknown}; known: {sorted(known)}", file=out)
            return 2
        modules = tuple(known[o] for o in ops)
    has_cuda = torch.cuda.is_available()
    if not has_cuda:
        print("CUDA is not available on this machine: kernels are not run. Running the reference "
              "self-checks and the sm_90a build check instead.\n", file=out)
    failures = 0
    header = ["case", "output", "max abs err", "mismatch", "first mismatch", "result"]
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not (exc.name == name or name.startswith(f"{exc.name}.")):
                raise  # a dependency is missing, not the operator
            print(f"{name.rsplit('.', 1)[-1]}: not implemented\n", file=out)
            continue
        rows = []
        for case_id in mod.CASES:
            try:
                comps = mod.run_case(case_id, torch.device("cuda")) if has_cuda else mod.self_check(case_id)
                rows += _rows_for(case_id, comps)
                failures += sum(not c.passed for c in comps)
            except NotImplementedError as exc:
                rows.append([case_id, "-", "-", "-", str(exc)[:60], "not implemented"])
            except Exception as exc:  # a crash is a failure, shown in the table
                failures += 1
                rows.append([case_id, "-", "-", "-", f"{type(exc).__name__}: {exc}"[:60], "ERROR"])
                traceback.print_exc(file=sys.stderr)
        kind = "kernel vs reference (CUDA)" if has_cuda else "reference self-checks (CPU)"
        print(format_table(f"== {mod.OP}: {kind}", header, rows), file=out)
        if has_cuda:  # the kernels above were JIT-compiled for this GPU and ran: that supersedes it
            print("build check sm_90a: superseded by running the kernels on CUDA\n", file=out)
            continue
        t0 = time.time()
        try:
            built = mod.build_check()
            print(f"build check sm_90a: {len(built)} kernels compiled in {time.time() - t0:.1f}s "
                  f"({', '.join(built)})\n", file=out)
        except NotImplementedError:
            print("build check sm_90a: kernel not implemented\n", file=out)
        except Exception as exc:
            failures += 1
            print(f"build check sm_90a: FAILED: {type(exc).__name__}: {exc}\n", file=out)
    print(f"diff: {failures} failing comparisons", file=out)
    return 1 if failures else 0
