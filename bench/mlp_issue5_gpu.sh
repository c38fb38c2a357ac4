#!/usr/bin/env bash
# kfuse-mlp issue-5 run on a GPU machine (one call): the variant table of the current build
# (mlp_tune) and of the previous commit's build (mlp_tune_before) in the same run, cold NVRTC
# compile times on the host (mlp_compile_time, loop and unrolled repeated layers), an ncu pipe
# profile of the default SiLU kernel, and the kfuse-mlp GPU tier.
# Usage: bench/mlp_issue5_gpu.sh BIN_DIR (mlp_tune, mlp_tune_before, mlp_compile_time, gpu_tier,
# built in release on the dev machine); logs go to $OUT (or /tmp/mlp_out).
set -u
B=${1:?usage: bench/mlp_issue5_gpu.sh BIN_DIR}
O=${OUT:-/tmp/mlp_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv 2>&1 | tee "$O/env.txt"
date -u | tee -a "$O/env.txt"; nproc | tee -a "$O/env.txt"
echo "== compile time (host CPU, NVRTC only, sm_90)"
for rep in 1 2; do for u in 0 1; do
  KF_UNROLL=$u timeout 60 "$B/mlp_compile_time" 2>&1 | sed "s/^/unroll=$u /" | tee -a "$O/compile.log" | grep -v warps | cut -c1-90
done; done
echo "== mlp_tune (new)"
KFUSE_CACHE_DIR=$(mktemp -d) timeout 100 "$B/mlp_tune" "$O/tune.jsonl" > "$O/tune.log" 2>&1; echo "rc $?"
echo "== mlp_tune_before"
KFUSE_CACHE_DIR=$(mktemp -d) timeout 80 "$B/mlp_tune_before" "$O/tune_before.jsonl" > "$O/tune_before.log" 2>&1; echo "rc $?"
echo "== gpu tier"
KFUSE_REQUIRE_GPU=1 KFUSE_CACHE_DIR=$(mktemp -d) timeout "${TIER_S:-60}" "$B/gpu_tier" --nocapture --test-threads 1 > "$O/gpu_tier.log" 2>&1
echo "gpu_tier rc $?"
grep -E "^test |test result|panicked" "$O/gpu_tier.log"
if command -v ncu >/dev/null && [ "${NCU:-1}" = 1 ]; then
  echo "== ncu (SiLU default kernel)"
  KF_MODEL=mlp_silu_bias KFUSE_CACHE_DIR=$(mktemp -d) timeout 60 ncu --clock-control none -k regex:kf_mlp_ -c 1 \
    --metrics sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_issued.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,sm__cycles_elapsed.avg.per_second,gpu__time_duration.sum \
    "$B/mlp_tune" > "$O/ncu.log" 2>&1; echo "ncu rc $?"
  grep -E "^\s+(sm__|smsp__|gpu__)" "$O/ncu.log"
fi
echo "== tables (before, then new)"
sed -n '/^$/,$p' "$O/tune_before.log"
sed -n '/^$/,$p' "$O/tune.log"
