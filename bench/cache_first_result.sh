#!/usr/bin/env bash
# Issue 3 on the GPU machine: the cache bench (cold + warm fresh process) with the step-by-step
# first-result breakdown (KFUSE_LOG_TIMING=1), with and without the driver first-use probe; then the
# kfuse-runtime and GPU-conformance test executables (failures' output kept in $OUT/tests.log).
# Run from the repository root after ../shared/tools/gpu-bundle: `bash bench/cache_first_result.sh`.
set -uo pipefail
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
run() { # name, env...
  local name=$1; shift
  echo "=== $name: $*"
  env "$@" KFUSE_LOG_TIMING=1 bash .gpu/run kfuse cache bench --json "$out/$name.json" > "$out/$name.log" 2>&1
  grep -E "^\| |open: |driver probe|bind: buffer Input|launch " "$out/$name.log" | head -n 40
}
run probe KFUSE_BENCH_DRIVER_PROBE=1
run noprobe KFUSE_BENCH_DRIVER_PROBE=0
echo "=== tests"
bash .gpu/run true >/dev/null 2>&1  # unpack the bundle
orig=$(cat /tmp/kfuse-gpu/root)
export PATH="/tmp/kfuse-gpu/bin:$PATH" KFUSE_REQUIRE_GPU=1
while IFS=$'\t' read -r exe dir; do
  case "$dir" in crates/kfuse-runtime) ;; crates/kfuse) case "$exe" in gpu_conformance-*) ;; *) continue ;; esac ;; *) continue ;; esac
  echo "== $exe ($dir)" | tee -a "$out/tests.log"
  (cd "$orig/$dir" && timeout 150 "/tmp/kfuse-gpu/tests/$exe" --test-threads=1 >> "$out/tests.log" 2>&1)
  echo "   rc $?"; grep -E "^test result" "$out/tests.log" | tail -n 1
done < /tmp/kfuse-gpu/tests.tsv
grep -E "panicked|assert" -A6 "$out/tests.log" | head -n 60
