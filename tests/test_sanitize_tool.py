"""`make sanitize` driver (tools/sanitize.sh) on the CPU: a stand-in compute-sanitizer and Python give
the summaries a real run prints, and the driver's verdict follows them (errors, hazards, mismatches,
a failing or summary-less run)."""

import os
import subprocess
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The sanitizer runs the command and prints one summary per process, as compute-sanitizer does: racecheck
# "RACECHECK SUMMARY: N hazards displayed (N errors, 0 warnings)", the other tools "ERROR SUMMARY: N errors";
# FAKE_ERROR_TOOL / FAKE_SILENT_TOOL pick a tool that reports errors or prints no summary.
FAKE_SANITIZER = """#!/usr/bin/env bash
tool=$2; shift 2
while [ "${1#--}" != "$1" ]; do shift 2; done
"$@"; status=$?
[ "$tool" = "${FAKE_SILENT_TOOL:-}" ] && exit $status
errors=0; [ "$tool" = "${FAKE_ERROR_TOOL:-}" ] && errors=3
if [ "$tool" = racecheck ]; then
  echo "========= RACECHECK SUMMARY: $errors hazards displayed ($errors errors, 0 warnings)"
else
  echo "========= ERROR SUMMARY: $errors errors"
fi
[ $errors != 0 ] && exit 99
exit $status
"""

# Python as the driver calls it: the case runner prints MISMATCH where asked, pytest and diff pass.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "python $*"
case "$*" in *sanitize_cases*"${FAKE_MISMATCH_OP:-none}"*) echo "case x: MISMATCH"; exit 1 ;; esac
case "$*" in *sanitize_cases*"${FAKE_FAILING_OP:-none}"*) exit 2 ;; esac
exit 0
"""


@dataclass(frozen=True)
class Run:
    id: str
    env: dict
    clean: bool
    flagged: str = ""  # a summary line that must report the problem

    def __str__(self):
        return self.id


RUNS = [
    Run("clean", {}, True),
    Run("memcheck_errors", {"FAKE_ERROR_TOOL": "memcheck"}, False, "cases_memcheck: 3 errors"),
    Run("racecheck_hazards", {"FAKE_ERROR_TOOL": "racecheck"}, False,
        "cases_racecheck: 3 errors in 1 process"),
    Run("synccheck_errors", {"FAKE_ERROR_TOOL": "synccheck"}, False, "cases_synccheck: 3 errors"),
    Run("mismatch", {"FAKE_MISMATCH_OP": "topk"}, False, "mismatches=1"),
    Run("no_summary", {"FAKE_SILENT_TOOL": "racecheck"}, False, "cases_racecheck: 0 errors in 0 process(es)"),
    Run("failing_case", {"FAKE_FAILING_OP": "gather_rows"}, False, "(exit 2)"),
]


@pytest.mark.parametrize("run", RUNS, ids=str)
def test_sanitize_verdict_follows_the_summaries(run, tmp_path):
    san, py = tmp_path / "compute-sanitizer", tmp_path / "python"
    san.write_text(FAKE_SANITIZER)
    py.write_text(FAKE_PYTHON)
    san.chmod(0o755)
    py.chmod(0o755)
    env = {**os.environ, **run.env, "COMPUTE_SANITIZER": str(san), "PYTHON": str(py),
           "OPS": "topk gather_rows", "LOG_DIR": str(tmp_path / "logs")}
    res = subprocess.run(["bash", os.path.join(ROOT, "tools", "sanitize.sh")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    out = res.stdout
    print(out, res.stderr)
    lines = [line for line in out.splitlines() if line.startswith(("cases_", "bad_input", "diff_"))]
    # every run of the three steps reports a summary line, in the order shortest first
    assert [line.split(":")[0] for line in lines] == ["cases_memcheck", "cases_racecheck", "cases_synccheck",
                                                       "bad_input_memcheck", "diff_memcheck"]
    assert out.rstrip().splitlines()[-1].startswith("sanitize: " + ("clean" if run.clean else "FAILED"))
    assert res.returncode == (0 if run.clean else 1)
    if run.flagged:
        assert any(run.flagged in line for line in lines), run.flagged
    if run.id == "clean":
        assert "cases_racecheck: 0 errors in 1 process(es); RACECHECK SUMMARY: 0 hazards" in out
