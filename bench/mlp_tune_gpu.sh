#!/usr/bin/env bash
# kfuse-mlp tuning run on a GPU machine (one call): the variant table (mlp_tune), `kfuse mlp bench`
# on the three issue-5 models with a cold cache each, and the kfuse-mlp GPU tier.
# Usage: bench/mlp_tune_gpu.sh BIN_DIR   (BIN_DIR holds mlp_tune, kfuse, gpu_tier built in
# release on the dev machine); logs go to $OUT (or /tmp/mlp_out). Optional: TORCH=1 also times
# PyTorch through tools/bench_mlp_torch.py.
set -u
B=${1:?usage: bench/mlp_tune_gpu.sh BIN_DIR}
O=${OUT:-/tmp/mlp_out}
mkdir -p "$O"
M=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv 2>&1 | tee "$O/env.txt"
date -u | tee -a "$O/env.txt"
echo "== mlp_tune"
KFUSE_CACHE_DIR=$(mktemp -d) timeout 150 "$B/mlp_tune" "$O/tune.jsonl" "$M" > "$O/tune.log" 2>&1
echo "mlp_tune rc $?"
echo "== kfuse mlp bench (cold cache per model)"
for m in mlp64x4_relu mlp128x4_relu mlp_silu_bias; do
  KFUSE_LOG_COMPILES=1 KFUSE_CACHE_DIR=$(mktemp -d) timeout 30 "$B/kfuse" mlp bench "$M/$m.json" --json "$O/bench_$m.json" >> "$O/bench.log" 2>&1
  echo "$m rc $?"
done
grep -E "^(model|kernel|compile|time|check)" "$O/bench.log"
if [ "${TORCH:-0}" = 1 ]; then
  timeout 60 python3 tools/bench_mlp_torch.py --models "$M"/mlp64x4_relu.json "$M"/mlp128x4_relu.json "$M"/mlp_silu_bias.json --no-compile --json "$O/torch.json" 2>&1 | tail -4
fi
echo "== gpu tier"
KFUSE_REQUIRE_GPU=1 KFUSE_CACHE_DIR=$(mktemp -d) timeout "${TIER_S:-90}" "$B/gpu_tier" --nocapture --test-threads 1 > "$O/gpu_tier.log" 2>&1
echo "gpu_tier rc $?"
grep -E "^test |test result|panicked" "$O/gpu_tier.log"
echo "== tune table"
sed -n '/^$/,$p' "$O/tune.log"
