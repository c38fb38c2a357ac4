#!/usr/bin/env bash
# ncu of two kernels of the prototype harness side by side (default: the generated rows plan and the
# hand-written warp-specialized prototype len_ws<6,1>): instructions, warp states, memory. Needs the
# harness built by run.sh first (/tmp/tp). One text file: $OUT/proto_ncu.txt.
#   device run: bash .proto/run.sh > /dev/null; bash .proto/ncu.sh     (carry [".proto"])
set -uo pipefail
O=${OUT:-/tmp}
for k in ${@:-"regex:^kf_len_rows$" "regex:^len_ws"}; do
  echo "===== $k" >> $O/proto_ncu.txt
  timeout 150 ncu --clock-control none -k "$k" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis \
    /tmp/tp >> $O/proto_ncu.txt 2>&1
  echo "ncu rc $?" >> $O/proto_ncu.txt
done
grep -E "=====|Duration|Elapsed Cycles|SM Active Cycles|DRAM Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Eligible Warps|Executed Instructions  |Stall|ncu rc" $O/proto_ncu.txt | head -80
