#!/usr/bin/env bash
# kfuse-mlp SiLU model (issue 5), second pass, on a GPU machine in ONE call (about 60-120 s):
#   ../shared/tools/gpu-bundle                                  # here: release bins + test executables into .gpu/
#   device run: bash .gpu/run bash bench/mlp_silu2_gpu.sh       (carry [".gpu"], timeout_s 240)
# What it measures (mlp_tune, 2^21 rows, median of 50 CUDA-event-timed launches, each checked
# against the CPU interpreter on 4096 rows):
#   1. the SiLU bench model: the bias form before (BiasOperand::Pairs, `+pairs`) and after
#      (Quads, the new default), first and last; the new form at 12 and 10 warps (168/204-register
#      caps), with 1 row tile (16 and 8 warps), with TanhF32 and with 1/8 of the pairs on the FMA
#      pipe (SILU overrides the list; syntax in mlp_tune's docs);
#   2. the two ReLU models (no bias: the kernel differs only by the KF_BIAS_QUADS #define, same
#      SASS) as a regression check: default twice, then the Pairs build;
#   3. the kfuse-mlp gpu_tier test executable with KFUSE_REQUIRE_GPU=1;
#   4. time allowing (NCU=0 skips), ncu pipe metrics of the new default and the old form, launch
#      9 of the process (past the first call and the warm-up).
# Binaries: the bundle's (/tmp/kfuse-gpu/bin/mlp_tune, /tmp/kfuse-gpu/tests/gpu_tier-*), or
# BIN_DIR as the first argument holding mlp_tune and gpu_tier. Writes everything into ONE file,
# $OUT/mlp_silu2.tar.gz (OUT defaults to /tmp/mlp_silu2_out), and prints the tables.
set -uo pipefail
O=${OUT:-/tmp/mlp_silu2_out}
mkdir -p "$O"
W=$(mktemp -d /tmp/mlp_silu2.XXXXXX)
trap 'tar -C "$W" -czf "$O/mlp_silu2.tar.gz" . && echo "logs: $O/mlp_silu2.tar.gz"' EXIT

B=${1:-/tmp/kfuse-gpu}
if [ -x "$B/bin/mlp_tune" ]; then
  TUNE=$B/bin/mlp_tune
  TIER=$(awk -F'\t' '$1 ~ /^gpu_tier-/ && $2 == "crates/kfuse-mlp" {print $1; exit}' "$B/tests.tsv" 2>/dev/null)
  TIER=${TIER:+$B/tests/$TIER}
else
  TUNE=$B/mlp_tune
  TIER=$B/gpu_tier
fi
{ echo "mlp_tune: $TUNE"; echo "gpu_tier: ${TIER:-none found}"; } | tee "$W/env.txt"
[ -x "$TUNE" ] || { echo "no mlp_tune at $TUNE (build the bundle with ../shared/tools/gpu-bundle)"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv; date -u; } 2>&1 | tee -a "$W/env.txt"

SILU=${SILU:-packed+pairs,packed,packed@12,packed@10,packed@16/1,packed@8/1,tanhf32,fma1,packed+pairs,packed}
echo "== mlp_tune (SiLU variants: $SILU; ReLU: default twice, then +pairs)"
KF_RELU_PAIRS=1 KF_SILU_MATH=$SILU KFUSE_CACHE_DIR=$(mktemp -d) timeout 150 "$TUNE" "$W/tune.jsonl" > "$W/tune.log" 2>&1
echo "mlp_tune rc $?"
sed -n '/^$/,$p' "$W/tune.log"

echo "== gpu tier (t=${SECONDS}s)"
if [ -n "${TIER:-}" ] && [ -x "$TIER" ]; then
  (cd crates/kfuse-mlp 2>/dev/null; KFUSE_REQUIRE_GPU=1 KFUSE_CACHE_DIR=$(mktemp -d) timeout 70 "$TIER" --nocapture --test-threads 1) > "$W/gpu_tier.log" 2>&1
  echo "gpu_tier rc $?"
  grep -E "^test |test result|panicked|Pairs|seed" "$W/gpu_tier.log" | cut -c1-220
else
  echo "gpu_tier: not found"
fi

if [ "${NCU:-1}" = 1 ] && command -v ncu > /dev/null; then
  for m in packed packed+pairs; do
    [ "$SECONDS" -gt 170 ] && { echo "ncu $m: skipped (t=${SECONDS}s)"; continue; }
    echo "== ncu $m (t=${SECONDS}s)"
    KF_MODEL=mlp_silu_bias KF_SILU_MATH=$m KFUSE_CACHE_DIR=$(mktemp -d) timeout 30 ncu --clock-control none -k regex:kf_mlp_ --launch-skip 8 -c 1 \
      --metrics sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_issued.avg.pct_of_peak_sustained_active,sm__inst_executed.sum,sm__cycles_elapsed.avg.per_second,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,gpu__time_duration.sum \
      "$TUNE" > "$W/ncu_${m/+/_}.log" 2>&1
    echo "ncu rc $?"
    grep -E "^\s+(sm__|smsp__|gpu__)" "$W/ncu_${m/+/_}.log"
  done
fi
echo "done t=${SECONDS}s"
