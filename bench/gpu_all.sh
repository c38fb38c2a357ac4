#!/usr/bin/env bash
# Every GPU benchmark of kfuse in one call, for the lent GPU machine (no Rust there):
#   ../shared/tools/gpu-bundle            # here: build and pack the release binaries into .gpu/
#   device run: bash .gpu/run bash bench/gpu_all.sh      (carry .gpu)
# Writes bench_results.json (every figure) and bench.log under $OUT.
set -uo pipefail
log="${OUT:-/tmp/kfuse-out}/bench.log"
. "$(dirname "$0")/common.sh"
make_data

# Issue 2: the GIoU forward loss against the hand-written kernel and the copy bandwidth.
for B in 1024 16384; do
  run kfuse bench examples/giou.kf --input pred=$D/$B-f32/pred.npy --input target=$D/$B-f32/target.npy \
      --baseline giou --json /tmp/kfb/json/giou_fwd_f32_B$B.json
done

bench_training

# Issue 3: compile once (cold process, then a fresh process on the warm disk cache).
run kfuse cache bench --json /tmp/kfb/json/cache_bench.json

# Issue 5: the fused MLP on the three benchmark models, with PyTorch timed on the same weights.
run python3 tools/bench_mlp_torch.py --make /tmp/kfb/mlp --no-compile --json /tmp/kfb/json/mlp_torch.json
for m in /tmp/kfb/mlp/*.json; do
  CUDA_CACHE_DISABLE=1 KFUSE_CACHE_DIR=/tmp/kfb/mlp-cold-$(basename "$m" .json) run kfuse mlp bench "$m" --json /tmp/kfb/json/mlp_$(basename "$m")
done

# The MLP path end to end against PyTorch: export_mlp.py from real nn.Modules, kfuse mlp run (GPU, CPU).
run python3 tools/check_mlp_vs_torch.py --json /tmp/kfb/json/mlp_vs_torch.json

python3 - "$OUT/bench_results.json" /tmp/kfb/json/*.json <<'PY'
import json, sys
out = {p.rsplit("/", 1)[-1][:-5]: json.load(open(p)) for p in sys.argv[2:]}
json.dump(out, open(sys.argv[1], "w"), indent=1)
print("wrote", sys.argv[1], "with", len(out), "result sets")
PY
