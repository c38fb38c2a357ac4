#!/usr/bin/env bash
# Issue 4 tuning pass: the training benchmark (bench/train_only.sh: three layouts, f32 and bf16,
# B=1024 and 16384, ncu per-kernel split, GPU conformance), then the B=16384 padded and lengths
# runs again with other code generation choices (--elems-per-thread, --block-size).
#   ../shared/tools/gpu-bundle                                  # here
#   device run: bash .gpu/run bash bench/train_variants.sh      (carry .gpu)
set -uo pipefail
export KFB_NCU=${KFB_NCU:-1}
bash "$(dirname "$0")/train_only.sh"
log="${OUT:-/tmp/kfuse-out}/variants.log"
. "$(dirname "$0")/common.sh"
for dt in bf16 f32; do
  dir=examples; [ $dt = bf16 ] && dir=/tmp/kfb/bf16
  ins="--input pred=$D/16384-$dt/pred.npy --input target=$D/16384-$dt/target.npy"
  for v in "--elems-per-thread 2" "--elems-per-thread 8" "--block-size 128" "--block-size 512" "--block-size 512 --elems-per-thread 2"; do
    tag=$(echo "$v" | tr -d ' -')
    run kfuse bench $dir/giou_train.kf $ins --iters 100 $v --json /tmp/kfb/json/variant_padded_${dt}_$tag.json
    run kfuse bench $dir/giou_train_lengths.kf $ins --input lengths=$D/16384-$dt/lengths.npy --iters 100 $v \
        --json /tmp/kfb/json/variant_lengths_${dt}_$tag.json
  done
done
cp /tmp/kfb/json/variant_*.json "$OUT/" 2>/dev/null
bench_summary "variants summary" 's/--input.*--iters 100//'
