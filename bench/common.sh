# Shared by bench/gpu_all.sh and bench/train_only.sh (source it after setting $log): the box
# batches, bf16 copies of the examples, and the issue-4 training benchmark.
OUT=${OUT:-/tmp/kfuse-out}
D=/tmp/kfb/data
mkdir -p "$OUT" /tmp/kfb/json /tmp/kfb/bf16
run() { echo "+ $*" | tee -a "$log"; "$@" 2>&1 | tee -a "$log"; }

# Ragged batches at B=1024 and 16384 (N=256) in f32 and bf16, and every example with bf16 inputs.
make_data() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee -a "$log"
  for B in 1024 16384; do
    for dt in f32 bf16; do kfuse gen boxes --batch $B --max-boxes 256 --out $D/$B-$dt --dtype $dt >>"$log"; done
  done
  for f in examples/*.kf; do sed 's/f32\[/bf16[/' "$f" > /tmp/kfb/bf16/$(basename "$f"); done
}

# Issue 4: GIoU forward + backward, three layouts, f32 and bf16, B=1024 and 16384.
bench_training() {
  for B in 1024 16384; do
    for dt in f32 bf16; do
      local dir=examples; [ $dt = bf16 ] && dir=/tmp/kfb/bf16
      run kfuse bench $dir/giou_train.kf --input pred=$D/$B-$dt/pred.npy --input target=$D/$B-$dt/target.npy \
          --json /tmp/kfb/json/giou_train_padded_${dt}_B$B.json
      run kfuse bench $dir/giou_train_lengths.kf --input pred=$D/$B-$dt/pred.npy --input target=$D/$B-$dt/target.npy \
          --input lengths=$D/$B-$dt/lengths.npy --json /tmp/kfb/json/giou_train_lengths_${dt}_B$B.json
      run kfuse bench $dir/giou_train_packed.kf --input pred=$D/$B-$dt/pred_packed.npy --input target=$D/$B-$dt/target_packed.npy \
          --input offsets=$D/$B-$dt/offsets.npy --json /tmp/kfb/json/giou_train_packed_${dt}_B$B.json
    done
  done
}

# The summary of the `kfuse bench` runs in $log: each command (trimmed by the sed expression $2),
# the table's column header once, and the generated program's row: per-launch median µs, GB/s and
# % of copy bandwidth, each back to back / rotated over buffer sets beyond L2 / after an L2 flush.
bench_summary() {
  echo "== $1 (median µs, GB/s, % copy bw; each b2b / rot / flush)" | tee -a "$log"
  grep -m1 -B1 -E "^kernel +launches" "$log" | tee -a "$log"
  grep -E "^(\+ kfuse bench|kfuse \(generated\))" "$log" | sed "$2" | tee -a "$log"
}
