#!/usr/bin/env bash
# Issue 4 only: GIoU forward + backward in the three layouts, f32 and bf16, B=1024 and 16384,
# then the GPU conformance suite (every example against the interpreter) and the codegen GPU test.
#   ../shared/tools/gpu-bundle                              # here
#   device run: bash .gpu/run bash bench/train_only.sh      (carry .gpu)
set -uo pipefail
OUT=${OUT:-/tmp/kfuse-out}
mkdir -p "$OUT" /tmp/kfb/json /tmp/kfb/bf16
D=/tmp/kfb/data
log="$OUT/train.log"
run() { echo "+ $*" | tee -a "$log"; "$@" 2>&1 | tee -a "$log"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee -a "$log"
for B in 1024 16384; do
  for dt in f32 bf16; do kfuse gen boxes --batch $B --max-boxes 256 --out $D/$B-$dt --dtype $dt >>"$log"; done
done
for f in examples/giou_train*.kf; do sed 's/f32\[/bf16[/' "$f" > /tmp/kfb/bf16/$(basename "$f"); done
for B in 16384 1024; do
  for dt in f32 bf16; do
    dir=examples; [ $dt = bf16 ] && dir=/tmp/kfb/bf16
    run kfuse bench $dir/giou_train.kf --input pred=$D/$B-$dt/pred.npy --input target=$D/$B-$dt/target.npy \
        --json /tmp/kfb/json/giou_train_padded_${dt}_B$B.json
    run kfuse bench $dir/giou_train_lengths.kf --input pred=$D/$B-$dt/pred.npy --input target=$D/$B-$dt/target.npy \
        --input lengths=$D/$B-$dt/lengths.npy --json /tmp/kfb/json/giou_train_lengths_${dt}_B$B.json
    run kfuse bench $dir/giou_train_packed.kf --input pred=$D/$B-$dt/pred_packed.npy --input target=$D/$B-$dt/target_packed.npy \
        --input offsets=$D/$B-$dt/offsets.npy --json /tmp/kfb/json/giou_train_packed_${dt}_B$B.json
  done
done
cp /tmp/kfb/json/*.json "$OUT/" 2>/dev/null
# Correctness on the GPU: the conformance suite and the codegen GPU test.
root=$(cat /tmp/kfuse-gpu/root)
while IFS=$'\t' read -r exe dir; do
  case "$exe" in gpu_conformance-*|gpu-*) ;; *) continue ;; esac
  echo "== $exe ($dir)" | tee -a "$log"
  (cd "$root/$dir" && KFUSE_REQUIRE_GPU=1 "/tmp/kfuse-gpu/tests/$exe" --test-threads=1 2>&1 | tail -n 15 | tee -a "$log")
done < /tmp/kfuse-gpu/tests.tsv
echo "== summary (b2b median µs)" | tee -a "$log"
grep -E "^(\+ kfuse bench|kfuse \(generated\))" "$log" | sed 's/--input.*json /json /' | tee -a "$log"
