#!/usr/bin/env bash
# Issue 3 on the GPU machine: the cache bench (cold + warm fresh process) with the step-by-step
# first-result breakdown (KFUSE_LOG_TIMING=1), under lazy and eager CUDA module loading and with the
# driver first-use probe; then the kfuse-runtime and GPU-conformance test executables.
# Run from the repository root after ../shared/tools/gpu-bundle: `bash bench/cache_first_result.sh`
# (logs go to $OUT, default /tmp).
set -uo pipefail
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
run() { # name, env...
  local name=$1; shift
  echo "=== $name: $*"
  env "$@" KFUSE_LOG_TIMING=1 bash .gpu/run kfuse cache bench --json "$out/$name.json" 2>&1 | tee "$out/$name.log"
}
run lazy CUDA_MODULE_LOADING=LAZY
run eager CUDA_MODULE_LOADING=EAGER
run probe KFUSE_BENCH_DRIVER_PROBE=1
run probe-eager KFUSE_BENCH_DRIVER_PROBE=1 CUDA_MODULE_LOADING=EAGER
echo "=== tests"
bash .gpu/run true >/dev/null 2>&1  # unpack the bundle
orig=$(cat /tmp/kfuse-gpu/root)
while IFS=$'\t' read -r exe dir; do
  case "$dir" in crates/kfuse-runtime) ;; crates/kfuse) case "$exe" in gpu_conformance-*) ;; *) continue ;; esac ;; *) continue ;; esac
  echo "== $exe ($dir)"
  (cd "$orig/$dir" && KFUSE_REQUIRE_GPU=1 timeout 120 "/tmp/kfuse-gpu/tests/$exe" --test-threads=1 2>&1 | tail -n 4) | tee -a "$out/tests.log"
done < /tmp/kfuse-gpu/tests.tsv
