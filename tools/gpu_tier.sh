#!/usr/bin/env bash
# The GPU tier in one go on a CUDA machine: the kernel test files run as parallel pytest processes
# (their JIT compiles overlap on the CPU cores; the kernels are small next to the GPU), the rest of the
# tests in one more process, then `make diff`, then the benchmarks alone on the GPU so timings are
# clean. Logs go to $LOG_DIR (default gpu_logs/). Same tests as `make test`, only faster.
#
#   tools/gpu_tier.sh [bench-ops...]     e.g. tools/gpu_tier.sh compress topk ; no ops = no benchmark
set -u
LOG_DIR=${LOG_DIR:-gpu_logs}
mkdir -p "$LOG_DIR"
export TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-$PWD/.cache/tilelang}
kernel_tests=(tests/test_compress.py tests/test_kv_store.py tests/test_compress_store.py tests/test_topk.py)
other_tests=()
for f in tests/test_*.py; do
  case " ${kernel_tests[*]} " in *" $f "*) ;; *) other_tests+=("$f") ;; esac
done
pids=()
for f in "${kernel_tests[@]}"; do
  timeout "${TEST_TIMEOUT:-420}" python -m pytest "$f" -q -p no:cacheprovider --durations=5 \
    > "$LOG_DIR/$(basename "$f" .py).log" 2>&1 &
  pids+=($!)
done
timeout "${TEST_TIMEOUT:-420}" python -m pytest "${other_tests[@]}" -q -p no:cacheprovider \
  > "$LOG_DIR/test_other.log" 2>&1 &
pids+=($!)
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for f in "$LOG_DIR"/test_*.log; do echo "$(basename "$f"): $(tail -n 1 "$f")"; done
timeout "${DIFF_TIMEOUT:-240}" python -m tilelang_ops diff > "$LOG_DIR/diff.log" 2>&1 || rc=1
grep -E "^(==|diff:|build check)|FAIL|ERROR" "$LOG_DIR/diff.log"
if [ $# -gt 0 ]; then
  timeout "${BENCH_TIMEOUT:-300}" python -m benchmarks "$@" > "$LOG_DIR/bench.log" 2>&1 || rc=1
  grep -E "^BENCH|^copy roofline" "$LOG_DIR/bench.log"
fi
exit $rc
