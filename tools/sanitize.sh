#!/usr/bin/env bash
# `make sanitize` (CUDA machine): compute-sanitizer over the kernels, one summary line per run.
#
#   1. memcheck, racecheck and synccheck over one small launch of each kernel
#      (python -m tilelang_ops.testing.sanitize_cases <ops>, which also compares each result);
#   2. memcheck over the GPU tier of bad metadata without the debug switch (tests/test_bad_input_gpu.py):
#      slots beyond the cache, positions beyond the tables, end beyond the row, short block tables,
#      state slots beyond the ring: a kernel that skipped such a row by reading or writing out of bounds
#      shows up here even when the canaries survive;
#   3. memcheck over `make diff` (every kernel against its reference, python -m tilelang_ops diff).
#
# Each tensor is its own allocation (PYTORCH_NO_CUDA_MEMORY_CACHING=1), so memcheck sees an access past
# any tensor, not only past the allocator's pool. The kernels are compiled (into TILELANG_CACHE_DIR)
# before the sanitized runs, which then load them. Logs in $LOG_DIR (default sanitize_logs/). Exit 1 if
# any run reports an error, a hazard or a mismatch, or fails.
#
#   tools/sanitize.sh                 everything
#   OPS="topk" STEPS="cases" tools/sanitize.sh      a subset (STEPS: diff bad cases)
set -u
PY=${PYTHON:-python}
SAN=${COMPUTE_SANITIZER:-compute-sanitizer}
LOG_DIR=${LOG_DIR:-sanitize_logs}
OPS=${OPS:-"compress kv_store compress_store topk index_logits gather_rows"}
STEPS=${STEPS:-"diff bad cases"}
export TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-$PWD/.cache/tilelang}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset TILELANG_OPS_DEBUG  # the kernels' own bounds handling is what is checked
mkdir -p "$LOG_DIR"
rm -f "$LOG_DIR"/*.log
command -v "$SAN" >/dev/null || { echo "sanitize: $SAN not found (set COMPUTE_SANITIZER)"; exit 1; }

rc=0
# run NAME TOOL ARGS...: one sanitized run; prints "NAME: <summary> (exit N)"
run() {
  local name=$1 tool=$2
  shift 2
  local opts=()
  [ "$tool" = memcheck ] && opts+=(--leak-check no)
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${SAN_TIMEOUT:-900}" "$SAN" --tool "$tool" ${opts[@]+"${opts[@]}"} \
    --error-exitcode 99 "$@" > "$LOG_DIR/$name.log" 2>&1
  local status=$?
  # every process the sanitizer followed prints a summary (racecheck: "RACECHECK SUMMARY: ... (N errors,",
  # the other tools: "ERROR SUMMARY: N"): add up their errors; none at all is a failure
  local summaries errors hazards bad_cases
  summaries=$(grep -cE "(ERROR|RACECHECK) SUMMARY" "$LOG_DIR/$name.log")
  errors=$( (grep -oE "ERROR SUMMARY: [0-9]+" "$LOG_DIR/$name.log" | awk '{print $3}';
             grep -E "RACECHECK SUMMARY" "$LOG_DIR/$name.log" | grep -oE "\(([0-9]+) errors" | tr -d '(') |
            awk '{s += $1} END {print s + 0}')
  hazards=$(grep -E "RACECHECK SUMMARY" "$LOG_DIR/$name.log" | sed 's/^=* *//' | tail -n 1)
  bad_cases=$(grep -c "MISMATCH" "$LOG_DIR/$name.log")
  echo "$name: $errors errors in $summaries process(es)${hazards:+; $hazards}; mismatches=$bad_cases (exit $status)"
  if [ "$status" != 0 ] || [ "$summaries" = 0 ] || [ "$errors" != 0 ] || [ "$bad_cases" != 0 ]; then rc=1; fi
}

# compile everything first, unsanitized (also a quick check that the cases pass)
# shellcheck disable=SC2086  # OPS is a list of words
$PY -m tilelang_ops.testing.sanitize_cases $OPS > "$LOG_DIR/warm_cases.log" 2>&1 \
  || { echo "warm-up cases failed: $(grep MISMATCH "$LOG_DIR/warm_cases.log" | head -n 3; tail -n 2 "$LOG_DIR/warm_cases.log")"; rc=1; }
case " $STEPS " in *" bad "*)
  $PY -m pytest -q -p no:cacheprovider tests/test_bad_input_gpu.py > "$LOG_DIR/warm_bad.log" 2>&1 \
    || { echo "warm-up bad-input tier failed: $(tail -n 1 "$LOG_DIR/warm_bad.log")"; rc=1; } ;;
esac

# shortest runs first: a run cut short by a time limit then leaves the most summaries behind; one process
# per tool runs every operator's cases (a process start under the sanitizer costs seconds)
case " $STEPS " in *" cases "*)
  for tool in memcheck racecheck synccheck; do
    # shellcheck disable=SC2086
    run "cases_$tool" "$tool" $PY -m tilelang_ops.testing.sanitize_cases $OPS
  done ;;
esac
case " $STEPS " in *" bad "*)
  run bad_input_memcheck memcheck $PY -m pytest -q -p no:cacheprovider tests/test_bad_input_gpu.py ;;
esac
case " $STEPS " in *" diff "*) run diff_memcheck memcheck $PY -m tilelang_ops diff ;; esac
echo "sanitize: $([ $rc = 0 ] && echo clean || echo FAILED) (logs in $LOG_DIR/)"
exit $rc
