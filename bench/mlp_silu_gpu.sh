#!/usr/bin/env bash
# kfuse-mlp SiLU (issue 5) run on a GPU machine (one call): the SiLU model with every SiLU math
# variant (the MUFU default, shares of the pairs on the FMA pipe, the per-layer balanced share;
# the default first and last), the two ReLU models' defaults as a regression check, the kfuse-mlp
# GPU tier, and (time allowing) an ncu pipe profile of the default and one FMA-share kernel
# (launch 9 of the process: past the first call and the warm-up; the 2026-11-22 run profiled the
# first launch, which is not the timed steady state).
# Usage: bench/mlp_silu_gpu.sh BIN_DIR (mlp_tune and gpu_tier built in release on the dev
# machine); logs go to $OUT (or /tmp/mlp_silu_out). Env: SILU (KF_SILU_MATH list), NCU_MATH.
set -u
B=${1:?usage: bench/mlp_silu_gpu.sh BIN_DIR}
O=${OUT:-/tmp/mlp_silu_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv 2>&1 | tee "$O/env.txt"
date -u | tee -a "$O/env.txt"
SILU=${SILU:-packed,fma1,fma2,fma3,fma4,fma6,fma8,balanced,packed}
echo "== mlp_tune (SiLU variants: $SILU)"
KF_SILU_MATH=$SILU KFUSE_CACHE_DIR=$(mktemp -d) timeout 130 "$B/mlp_tune" "$O/tune.jsonl" > "$O/tune.log" 2>&1; echo "rc $?"
sed -n '/^$/,$p' "$O/tune.log"
echo "== gpu tier (t=${SECONDS}s)"
KFUSE_REQUIRE_GPU=1 KFUSE_CACHE_DIR=$(mktemp -d) timeout 50 "$B/gpu_tier" --nocapture --test-threads 1 > "$O/gpu_tier.log" 2>&1
echo "gpu_tier rc $?"
grep -E "^test |test result|panicked|Packed|TanhF32" "$O/gpu_tier.log" | cut -c1-200
if command -v ncu >/dev/null; then
  for m in packed ${NCU_MATH:-fma2}; do
    [ "$SECONDS" -gt 190 ] && { echo "ncu $m: skipped (t=${SECONDS}s)"; continue; }
    echo "== ncu $m (t=${SECONDS}s)"
    KF_MODEL=mlp_silu_bias KF_SILU_MATH=$m KFUSE_CACHE_DIR=$(mktemp -d) timeout 35 ncu --clock-control none -k regex:kf_mlp_ --launch-skip 8 -c 1 \
      --metrics sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_issued.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,gpu__time_duration.sum \
      "$B/mlp_tune" > "$O/ncu_$m.log" 2>&1; echo "ncu rc $?"
    grep -E "^\s+(sm__|smsp__|gpu__)" "$O/ncu_$m.log"
  done
fi
echo "done t=${SECONDS}s"
