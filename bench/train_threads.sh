#!/usr/bin/env bash
# Issue 4: the padded layout at B=16384 (bf16, f32) over batched-loop launch bounds
# (--threads-per-sm) and elements per thread; output in $OUT/threads.log.
#   device run: bash .gpu/run bash bench/train_threads.sh      (carry .gpu)
set -uo pipefail
log="${OUT:-/tmp/kfuse-out}/threads.log"
. "$(dirname "$0")/common.sh"
make_data
for dt in bf16 f32; do
  dir=examples; [ $dt = bf16 ] && dir=/tmp/kfb/bf16
  for t in 512 768 1024; do for e in 2 4 8; do
    run kfuse bench $dir/giou_train.kf --input pred=$D/16384-$dt/pred.npy --input target=$D/16384-$dt/target.npy \
        --iters 200 --threads-per-sm $t --elems-per-thread $e
  done; done
done
bench_summary summary 's/--input.*--iters 200//'
