#!/usr/bin/env bash
# Session 5's GPU call (one device call, ~6 min): the MLP wgmma measurements, the training step's
# benchmarks (b2b / rotated / flushed), then every test executable with KFUSE_REQUIRE_GPU=1.
#   ../shared/tools/gpu-bundle; device run: bash .gpu/run bash bench/session5_gpu.sh   (carry [".gpu"])
set -uo pipefail
export OUT=${OUT:-/tmp/s5}
mkdir -p "$OUT"
echo "### mlp (t=${SECONDS}s)"
SILU=${SILU:-packed,packed+wg,packed+pipe,packed@16/1+wg,packed@12+wg,packed+wg,packed} \
RELU=${RELU:-packed,packed+wg,packed+wg,packed} timeout 200 bash bench/mlp_wgmma_gpu.sh 2>&1 | grep -vE "^test |rows 1023|rows 20001" | tail -40
echo "### training benchmarks (t=${SECONDS}s)"
KFB_SKIP_TESTS=1 timeout 180 bash bench/train_only.sh > "$OUT/train_stdout.log" 2>&1
echo "rc $?"; tail -16 "$OUT/train_stdout.log"
echo "### all test executables (t=${SECONDS}s)"
timeout $((570 - SECONDS)) bash .gpu/run > "$OUT/tests_stdout.log" 2>&1
echo "rc $?"; grep -E "FAILED|passed|failed" "$OUT/tests_stdout.log" | tail -8
echo "done t=${SECONDS}s"
