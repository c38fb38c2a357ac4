#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")"
O=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $O/proto.log 2>&1
date -u >> $O/proto.log
nvcc -O3 -arch=sm_90 -std=c++17 -Xptxas -v train_proto.cu -o /tmp/tp >> $O/proto_build.log 2>&1 || { tail -50 $O/proto_build.log; exit 1; }
grep -E "Compiling entry|registers|spill" $O/proto_build.log | paste - - - | sed 's/ptxas info    : //g' | cut -c1-220 >> $O/proto.log
/tmp/tp 2>&1 | tee -a $O/proto.log
