#!/usr/bin/env bash
# The GPU tier in one go on a CUDA machine: each kernel test file runs as SHARDS (default 3) parallel
# pytest processes on contiguous slices of its tests (`--shard I/N`, tests/conftest.py), so their JIT
# compiles overlap on the CPU cores (the kernels are small next to the GPU), the rest of the
# tests in one more process, then `make diff`, then the benchmarks alone on the GPU so timings are
# clean. Logs go to $LOG_DIR (default gpu_logs/). Same tests as `make test`, only faster.
#
#   tools/gpu_tier.sh [bench-ops...]     e.g. tools/gpu_tier.sh compress topk ; no ops = no benchmark
# A subset: KERNEL_TESTS="tests/test_topk.py ..." (default: all four kernel files), OTHER=0 skips the
# other tests, DIFF=0 skips `make diff`.
set -u
LOG_DIR=${LOG_DIR:-gpu_logs}
mkdir -p "$LOG_DIR"
rm -f "$LOG_DIR"/test_*.log "$LOG_DIR"/diff.log "$LOG_DIR"/bench.log  # a summary of this run only
export TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-$PWD/.cache/tilelang}
all_kernel_tests="tests/test_compress.py tests/test_kv_store.py tests/test_compress_store.py tests/test_topk.py"
kernel_tests=()
for f in ${KERNEL_TESTS:-$all_kernel_tests}; do kernel_tests+=("tests/$(basename "$f")"); done
other_tests=()  # never a kernel file, whichever subset runs
for f in tests/test_*.py; do
  case " $all_kernel_tests " in *" $f "*) ;; *) other_tests+=("$f") ;; esac
done
SHARDS=${SHARDS:-3}
pids=()
for f in "${kernel_tests[@]}"; do
  for ((i = 0; i < SHARDS; i++)); do
    timeout "${TEST_TIMEOUT:-420}" python -m pytest "$f" -q -p no:cacheprovider --durations=5 \
      --shard "$i/$SHARDS" > "$LOG_DIR/$(basename "$f" .py).$i.log" 2>&1 &
    pids+=($!)
  done
done
if [ "${OTHER:-1}" != 0 ]; then
  timeout "${TEST_TIMEOUT:-420}" python -m pytest "${other_tests[@]}" -q -p no:cacheprovider \
    > "$LOG_DIR/test_other.log" 2>&1 &
  pids+=($!)
fi
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for f in "$LOG_DIR"/test_*.log; do echo "$(basename "$f"): $(tail -n 1 "$f")"; done
if [ "${DIFF:-1}" != 0 ]; then
  timeout "${DIFF_TIMEOUT:-240}" python -m tilelang_ops diff > "$LOG_DIR/diff.log" 2>&1 || rc=1
  grep -E "^(==|diff:|build check)|FAIL|ERROR" "$LOG_DIR/diff.log"
fi
if [ $# -gt 0 ]; then
  timeout "${BENCH_TIMEOUT:-300}" python -m benchmarks "$@" > "$LOG_DIR/bench.log" 2>&1 || rc=1
  grep -E "^BENCH|^copy roofline" "$LOG_DIR/bench.log"
fi
exit $rc
