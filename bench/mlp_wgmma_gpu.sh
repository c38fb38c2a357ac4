#!/usr/bin/env bash
# kfuse-mlp hidden layers on wgmma (TensorInstructions::Wgmma), on the GPU machine in ONE call:
#   ../shared/tools/gpu-bundle                                   # here
#   device run: bash .gpu/run bash bench/mlp_wgmma_gpu.sh        (carry [".gpu"], timeout_s 420)
# 1. bench/proto/wgmma_check.cu (nvcc): the descriptor and fragment conventions on one instruction;
# 2. the wgmma and layer_forms test executables (KFUSE_REQUIRE_GPU=1): every wgmma kernel against the
#    CPU interpreter;
# 3. mlp_tune (2^21 rows, median of 50 CUDA-event-timed launches, each variant checked against the
#    interpreter): SiLU model `packed`, `packed+wg`, `packed+pipe`, `packed+wg@16`, `packed+wg`,
#    `packed`; the ReLU models `packed`, `packed+wg`, `packed+wg`, `packed` (SILU / RELU override);
# 4. time allowing (NCU=0 skips), ncu of the SiLU model's `packed+wg` kernel (KF_FULL_ONLY=1).
# Logs: $OUT/mlp_wgmma.tar.gz; prints the tables.
set -uo pipefail
O=${OUT:-/tmp/mlp_wgmma_out}
mkdir -p "$O"
W=$(mktemp -d /tmp/mlp_wgmma.XXXXXX)
trap 'tar -C "$W" -czf "$O/mlp_wgmma.tar.gz" . && echo "logs: $O/mlp_wgmma.tar.gz"' EXIT
B=${1:-/tmp/kfuse-gpu}
TUNE=$B/bin/mlp_tune
t() { awk -F'\t' -v p="^$1-" '$1 ~ p && $2 == "crates/kfuse-mlp" {print $1; exit}' "$B/tests.tsv" 2>/dev/null; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv; date -u; } 2>&1 | tee "$W/env.txt"

echo "== wgmma_check (t=${SECONDS}s)"
nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17 bench/proto/wgmma_check.cu -o /tmp/wgc > "$W/wgmma_check_build.log" 2>&1 && timeout 30 /tmp/wgc | tee "$W/wgmma_check.log"

for test in ${TESTS:-wgmma layer_forms}; do
  exe=$(t $test)
  for rep in $(seq ${REPEAT:-1}); do
    echo "== test $test #$rep: ${exe:-not found} (t=${SECONDS}s)"
    [ -n "$exe" ] || continue
    (cd crates/kfuse-mlp; KFUSE_REQUIRE_GPU=1 KFUSE_CACHE_DIR=$(mktemp -d) timeout 150 "$B/tests/$exe" --nocapture --test-threads 1) > "$W/test_${test}_$rep.log" 2>&1
    echo "rc $?"
    grep -E "test result|panicked" "$W/test_${test}_$rep.log" | cut -c1-200
    grep -B3 -A6 "panicked" "$W/test_${test}_$rep.log" | cut -c1-300 | head -30
  done
done

SILU=${SILU:-packed,packed+wg,packed+pipe,packed+wg@16,packed+wg,packed}
RELU=${RELU:-packed,packed+wg,packed+wg,packed}
echo "== mlp_tune SiLU: $SILU (t=${SECONDS}s)"
KF_MODEL=mlp_silu_bias KF_SILU_MATH=$SILU KFUSE_CACHE_DIR=$(mktemp -d) timeout 120 "$TUNE" "$W/tune_silu.jsonl" > "$W/tune_silu.log" 2>&1
echo "rc $?"; sed -n '/^$/,$p' "$W/tune_silu.log"
for m in mlp64x4_relu mlp128x4_relu; do
  echo "== mlp_tune $m: $RELU (t=${SECONDS}s)"
  KF_MODEL=$m KF_RELU_VARIANTS=$RELU KFUSE_CACHE_DIR=$(mktemp -d) timeout 90 "$TUNE" "$W/tune_$m.jsonl" > "$W/tune_$m.log" 2>&1
  echo "rc $?"; sed -n '/^$/,$p' "$W/tune_$m.log"
done

if [ "${NCU:-1}" = 1 ] && command -v ncu > /dev/null && [ "$SECONDS" -lt 330 ]; then
  echo "== ncu ${NCU_VARIANT:=packed+wg} (t=${SECONDS}s)"
  KF_FULL_ONLY=1 KF_MODEL=mlp_silu_bias KF_SILU_MATH=$NCU_VARIANT KFUSE_CACHE_DIR=$(mktemp -d) timeout 40 ncu --clock-control none -k regex:kf_mlp_ --launch-skip 3 -c 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section InstructionStats \
    "$TUNE" > "$W/ncu_wg.log" 2>&1
  echo "ncu rc $?"
  grep -E "Duration|SM Frequency|Issue Slots Busy|Executed Ipc Active|Stall|Warp Cycles Per Issued" "$W/ncu_wg.log" | head -20
  grep -iE "pipe|tensor|XU|utiliz" "$W/ncu_wg.log" | head -12
fi
echo "done t=${SECONDS}s"
