#!/usr/bin/env bash
# Issue 4 diagnosis (next step of session 5): ncu of the generated padded + lengths kernel, bf16,
# B=16384, N=256 (the one layout under 70%): speed of light, memory tables, launch/occupancy, warp
# states and the source lines with the most stall samples; and the same for the padded + predicate
# kernel for comparison. One text file: $OUT/lengths_ncu.txt.
#   ../shared/tools/gpu-bundle; device run: bash .gpu/run bash bench/lengths_ncu_gpu.sh   (carry [".gpu"])
set -uo pipefail
log=/tmp/lengths_ncu.log
. "$(dirname "$0")/common.sh"
B=16384; dt=bf16
kfuse gen boxes --batch $B --max-boxes 256 --out $D/$B-$dt --dtype $dt > /dev/null
for f in giou_train_lengths giou_train; do sed 's/f32\[/bf16[/' examples/$f.kf > /tmp/kfb/bf16/$f.kf; done
out=$OUT/lengths_ncu.txt
for f in giou_train_lengths giou_train; do
  ins="--input pred=$D/$B-$dt/pred.npy --input target=$D/$B-$dt/target.npy"
  [ $f = giou_train_lengths ] && ins="$ins --input lengths=$D/$B-$dt/lengths.npy"
  echo "===== $f $dt B=$B" >> "$out"
  timeout 120 ncu --clock-control none -k regex:kf_ --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section LaunchStats --section Occupancy --section WarpStateStats --section SourceCounters \
    --section SchedulerStats \
    kfuse bench /tmp/kfb/bf16/$f.kf $ins --iters 10 >> "$out" 2>&1
  echo "ncu rc $?" >> "$out"
done
grep -E "=====|Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Registers Per|Achieved Occupancy|Stall|Warp Cycles Per Issued|Issue Slots|Eligible|dram__bytes|Block Size|Grid Size" "$out" | head -60
