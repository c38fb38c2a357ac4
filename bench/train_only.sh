#!/usr/bin/env bash
# Issue 4 only: GIoU forward + backward in the three layouts, f32 and bf16, B=1024 and 16384,
# then the GPU conformance suite (every example against the interpreter) and the codegen GPU test.
#   ../shared/tools/gpu-bundle                              # here
#   device run: bash .gpu/run bash bench/train_only.sh      (carry .gpu)
set -uo pipefail
log="${OUT:-/tmp/kfuse-out}/train.log"
. "$(dirname "$0")/common.sh"
make_data
bench_training
cp /tmp/kfb/json/*.json "$OUT/" 2>/dev/null
# Per-kernel split of the B=16384 padded and lengths runs (ncu, clocks left alone), when asked.
if [ "${KFB_NCU:-0}" = 1 ] && command -v ncu >/dev/null; then
  for f in giou_train giou_train_lengths; do for dt in f32 bf16; do
    dir=examples; [ $dt = bf16 ] && dir=/tmp/kfb/bf16
    ins="--input pred=$D/16384-$dt/pred.npy --input target=$D/16384-$dt/target.npy"
    [ $f = giou_train_lengths ] && ins="$ins --input lengths=$D/16384-$dt/lengths.npy"
    echo "== ncu $f $dt" | tee -a "$log"; mkdir -p /tmp/kfb/ncu-out
    ncu --clock-control none -k regex:kf_ --launch-count 2 \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size \
        kfuse run $dir/$f.kf $ins --output /tmp/kfb/ncu-out 2>&1 | grep -E "kf_|duration|bytes|warps_active|registers|grid_size" | tee -a "$log"
  done; done
fi
# Correctness on the GPU: the conformance suite and the codegen GPU test (KFB_SKIP_TESTS=1: done elsewhere).
root=$(cat /tmp/kfuse-gpu/root)
[ "${KFB_SKIP_TESTS:-0}" = 1 ] && : > /tmp/kfb/no-tests.tsv
while IFS=$'\t' read -r exe dir; do
  case "$exe" in gpu_conformance-*|gpu-*) ;; *) continue ;; esac
  echo "== $exe ($dir)" | tee -a "$log"
  (cd "$root/$dir" && KFUSE_REQUIRE_GPU=1 "/tmp/kfuse-gpu/tests/$exe" --test-threads=1 2>&1 | tail -n 15 | tee -a "$log")
done < "$([ "${KFB_SKIP_TESTS:-0}" = 1 ] && echo /tmp/kfb/no-tests.tsv || echo /tmp/kfuse-gpu/tests.tsv)"
bench_summary summary 's/--input.*json /json /'
