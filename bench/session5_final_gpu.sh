#!/usr/bin/env bash
# Session 5's closing GPU calls. PART=a: every benchmark (bench/gpu_all.sh: issue 2 forward, the
# training step b2b / rotated / flushed, the cache, the MLP models against PyTorch with cold first
# calls); PART=b: every test executable (KFUSE_REQUIRE_GPU=1), then bench/mlp_tier_gpu.sh.
# Everything is packed into ONE file, $OUT/session5_<part>.tar.gz (the device returns few files).
#   ../shared/tools/gpu-bundle; device run: PART=a bash .gpu/run bash bench/session5_final_gpu.sh  (carry [".gpu"])
set -uo pipefail
FINAL=${OUT:-/tmp/s5final}
mkdir -p "$FINAL"
export OUT=$(mktemp -d /tmp/s5out.XXXXXX)
trap 'tar -C "$OUT" -czf "$FINAL/session5_${PART:-a}.tar.gz" . && echo "logs: session5_${PART:-a}.tar.gz"' EXIT
if [ "${PART:-a}" = a ]; then
  timeout 560 bash bench/gpu_all.sh > "$OUT/gpu_all_stdout.log" 2>&1
  echo "gpu_all rc $? (t=${SECONDS}s)"
  grep -E "^(\+ kfuse (bench|mlp bench)|kfuse \(generated\)|kernel time|first call|PyTorch|torch|rel)" "$OUT/bench.log" | cut -c1-200 | tail -60
else
  timeout 300 bash .gpu/run > "$OUT/tests_stdout.log" 2>&1
  echo "tests rc $? (t=${SECONDS}s)"; grep -E "FAILED|passed|failed" "$OUT/tests_stdout.log" | tail -6
  timeout $((580 - SECONDS)) bash bench/mlp_tier_gpu.sh > "$OUT/mlp_tier_stdout.log" 2>&1
  echo "mlp_tier rc $? (t=${SECONDS}s)"; tail -30 "$OUT/mlp_tier_stdout.log" | cut -c1-200
fi
