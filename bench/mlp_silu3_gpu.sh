#!/usr/bin/env bash
# kfuse-mlp SiLU model (issue 5), third pass: hidden-layer forms, on a GPU machine in ONE call
# (about 60-100 s):
#   ../shared/tools/gpu-bundle                                  # here: release bins + test executables into .gpu/
#   device run: bash .gpu/run bash bench/mlp_silu3_gpu.sh       (carry [".gpu"], timeout_s 240)
# What it measures (mlp_tune, 2^21 rows, median of 50 CUDA-event-timed launches, each checked
# against the CPU interpreter on 4096 rows; SiLU model only, KF_MODEL):
#   1. the default (`packed`) first and last, and between them (syntax in mlp_tune's docs) the
#      f32-accumulating candidates for <= 0.30 ms: `packed+pipe` (ChunkOrder::Pipelined, 0.3278
#      on 2026-11-22), `fma1+pipe`, `fma2+pipe`, `balanced+pipe` (a share of the SiLU pairs on the
#      FMA pipe, now combinable with +pipe: XU was the busiest pipe by instruction count, 64.5%),
#      `fma1` (the same share without +pipe, for the comparison), `packed@12+pipe` (12 warps,
#      168 registers, 4 B spill), and `packed+acc16` (f16 accumulators: the opt-in reference, not
#      the issue's f32 target); SILU overrides the list;
#   2. the kfuse-mlp gpu_tier and layer_forms test executables with KFUSE_REQUIRE_GPU=1;
#   3. time allowing (NCU=0 skips), ncu of `packed+pipe` and `fma1+pipe` with the optimised
#      kernel compiled before the first call (KF_FULL_ONLY=1: every launch is the timed kernel).
# Binaries: the bundle's (/tmp/kfuse-gpu/bin/mlp_tune, /tmp/kfuse-gpu/tests/gpu_tier-*), or
# BIN_DIR as the first argument holding mlp_tune and gpu_tier. Writes everything into ONE file,
# $OUT/mlp_silu3.tar.gz (OUT defaults to /tmp/mlp_silu3_out), and prints the tables.
set -uo pipefail
O=${OUT:-/tmp/mlp_silu3_out}
mkdir -p "$O"
W=$(mktemp -d /tmp/mlp_silu3.XXXXXX)
trap 'tar -C "$W" -czf "$O/mlp_silu3.tar.gz" . && echo "logs: $O/mlp_silu3.tar.gz"' EXIT

B=${1:-/tmp/kfuse-gpu}
if [ -x "$B/bin/mlp_tune" ]; then
  TUNE=$B/bin/mlp_tune
  TIER=$(awk -F'\t' '$1 ~ /^gpu_tier-/ && $2 == "crates/kfuse-mlp" {print $1; exit}' "$B/tests.tsv" 2>/dev/null)
  TIER=${TIER:+$B/tests/$TIER}
  FORMS=$(awk -F'\t' '$1 ~ /^layer_forms-/ && $2 == "crates/kfuse-mlp" {print $1; exit}' "$B/tests.tsv" 2>/dev/null)
  FORMS=${FORMS:+$B/tests/$FORMS}
else
  TUNE=$B/mlp_tune
  TIER=$B/gpu_tier
  FORMS=$B/layer_forms
fi
{ echo "mlp_tune: $TUNE"; echo "gpu_tier: ${TIER:-none found}"; } | tee "$W/env.txt"
[ -x "$TUNE" ] || { echo "no mlp_tune at $TUNE (build the bundle with ../shared/tools/gpu-bundle)"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv; date -u; } 2>&1 | tee -a "$W/env.txt"

SILU=${SILU:-packed,packed+pipe,fma1+pipe,fma2+pipe,balanced+pipe,fma1,packed@12+pipe,packed+acc16,packed}
echo "== mlp_tune (SiLU variants: $SILU)"
KF_MODEL=mlp_silu_bias KF_SILU_MATH=$SILU KFUSE_CACHE_DIR=$(mktemp -d) timeout 100 "$TUNE" "$W/tune.jsonl" > "$W/tune.log" 2>&1
echo "mlp_tune rc $? (t=${SECONDS}s)"
sed -n '/^$/,$p' "$W/tune.log"

echo "== gpu tier (t=${SECONDS}s)"
if [ -n "${TIER:-}" ] && [ -x "$TIER" ]; then
  (cd crates/kfuse-mlp 2>/dev/null; KFUSE_REQUIRE_GPU=1 KFUSE_CACHE_DIR=$(mktemp -d) timeout 60 "$TIER" --nocapture --test-threads 1) > "$W/gpu_tier.log" 2>&1
  echo "gpu_tier rc $?"
  grep -E "^test |test result|panicked|acc16|pipe|seed" "$W/gpu_tier.log" | cut -c1-220
else
  echo "gpu_tier: not found"
fi
if [ -n "${FORMS:-}" ] && [ -x "$FORMS" ]; then
  (cd crates/kfuse-mlp 2>/dev/null; KFUSE_REQUIRE_GPU=1 timeout 30 "$FORMS" --nocapture --test-threads 1) > "$W/layer_forms.log" 2>&1
  echo "layer_forms rc $?"
  grep -E "^test |test result|panicked|seed" "$W/layer_forms.log" | cut -c1-220
else
  echo "layer_forms: not found"
fi

if [ "${NCU:-1}" = 1 ] && command -v ncu > /dev/null; then
  for m in packed+pipe fma1+pipe; do
    [ "$SECONDS" -gt 125 ] && { echo "ncu $m: skipped (t=${SECONDS}s)"; continue; }
    echo "== ncu $m (t=${SECONDS}s)"
    f="$W/ncu_$(echo "$m" | tr '@+/' '___').log"
    KF_FULL_ONLY=1 KF_MODEL=mlp_silu_bias KF_SILU_MATH=$m KFUSE_CACHE_DIR=$(mktemp -d) timeout 25 ncu --clock-control none -k regex:kf_mlp_ --launch-skip 3 -c 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats \
      "$TUNE" > "$f" 2>&1
    echo "ncu rc $?"
    grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc Active|Shared Memory|Bank|Stall|Warp Cycles Per Issued|^\s+(smsp__|sm__|l1tex__)" "$f" | head -30
    grep -iE "pipe|tensor|XU|utiliz" "$f" | head -12
  done
fi
echo "done t=${SECONDS}s"
