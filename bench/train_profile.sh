#!/usr/bin/env bash
# Issue 4 profile pass (B=16384): the padded bf16 and lengths runs timed, then one ncu report per
# kernel (speed of light, memory, warp states, occupancy) of padded bf16 and of both lengths
# plans, bf16 and f32. Everything ends in $OUT/profile.tar.gz (one file) and $OUT/profile.log.
#   device run: bash .gpu/run bash bench/train_profile.sh      (carry .gpu)
set -uo pipefail
log="${OUT:-/tmp/kfuse-out}/profile.log"
. "$(dirname "$0")/common.sh"
make_data
P=/tmp/kfb/profile; mkdir -p $P
for dt in bf16 f32; do
  dir=examples; [ $dt = bf16 ] && dir=/tmp/kfb/bf16
  ins="--input pred=$D/16384-$dt/pred.npy --input target=$D/16384-$dt/target.npy"
  lin="$ins --input lengths=$D/16384-$dt/lengths.npy"
  run kfuse bench $dir/giou_train.kf $ins --iters 200 --json $P/padded_$dt.json
  for lg in two-kernels one-pass; do
    run kfuse bench $dir/giou_train_lengths.kf $lin --iters 200 --lengths-gradient $lg --json $P/lengths_${lg}_$dt.json
  done
done
if command -v ncu >/dev/null; then
  sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats"
  for dt in bf16 f32; do
    dir=examples; [ $dt = bf16 ] && dir=/tmp/kfb/bf16
    ins="--input pred=$D/16384-$dt/pred.npy --input target=$D/16384-$dt/target.npy"
    lin="$ins --input lengths=$D/16384-$dt/lengths.npy"
    ncu --clock-control none -k regex:kf_ $sections kfuse run $dir/giou_train.kf $ins --output $P/o > $P/ncu_padded_$dt.txt 2>&1
    # kfuse run has no tuning flags: the lengths plans are profiled through kfuse bench's first run.
    for lg in two-kernels one-pass; do
      ncu --clock-control none -k regex:kf_ --launch-count 3 $sections kfuse bench $dir/giou_train_lengths.kf $lin --iters 1 \
          --lengths-gradient $lg > $P/ncu_lengths_${lg}_$dt.txt 2>&1
    done
  done
  for f in $P/ncu_*.txt; do
    echo "== $f" | tee -a "$log"
    grep -E "kf_[0-9a-f]+_[0-9]|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Grid Size|Eligible Warps|No Eligible|Issued Warp|Warp Cycles Per Issued|L2 Hit Rate|Block Limit Reg" "$f" | head -60 | tee -a "$log"
  done
fi
bench_summary summary 's/--input.*--iters 200//'
cp "$log" $P/ && rm -rf $P/o && tar -C /tmp/kfb -czf "${OUT:-/tmp/kfuse-out}/profile.tar.gz" profile
