#!/usr/bin/env bash
# Prepares the training-step prototype harness (bench/proto/train_proto.cu) on the dev machine:
# the kernels kfuse generates today for the bf16 padded and lengths examples (the baselines, timed
# in the same run) and giou_fb.cuh, the GIoU loss term and its unscaled gradient lifted from the
# generated padded kernel (so every prototype computes bit-identical values).
#   bash bench/proto/prepare.sh .proto       # here: writes .proto/ (ignored by git)
#   device run: bash .proto/run.sh            (carry [".proto"]; nvcc on the GPU machine)
set -euo pipefail
dst=${1:-.proto}
mkdir -p "$dst" /tmp/kfb-proto
for f in giou_train giou_train_lengths; do sed 's/f32\[/bf16[/' examples/$f.kf > /tmp/kfb-proto/$f.kf; done
cargo run --release -q -- emit /tmp/kfb-proto/giou_train.kf > "$dst/pad_gen.cu"
cargo run --release -q -- emit /tmp/kfb-proto/giou_train_lengths.kf > "$dst/len_gen.cu"
cp bench/proto/train_proto.cu bench/proto/train_kernels.cuh bench/proto/run.sh "$dst/"
python3 - "$dst" <<'PY'
import re, sys
dst = sys.argv[1]
src = open(f"{dst}/pad_gen.cu").read().splitlines()
start = next(i for i, l in enumerate(src) if "const float v4 = " in l)
end = next(i for i, l in enumerate(src) if "const float v120 = " in l)
names = {"v4": "p2", "v5": "t2", "v7": "p0", "v8": "t0", "v12": "p3", "v14": "p1", "v15": "t1"}
body = []
for l in src[start:end + 1]:
    m = re.match(r"\s*const float (v\d+) = kf_bf16_to_f32", l)
    if m:
        body.append(f"    const float {m.group(1)} = {names[m.group(1)]};")
        continue
    l = l.replace("acc0 += (double)v41;", "").replace("acc1 += 1.0;", "").strip()
    if l:
        body.append("    " + l)
fn = ["// GIoU loss term (1 - giou) and its gradient w.r.t. pred, unscaled; lifted from kfuse's generated kernel.",
      "__device__ __forceinline__ float giou_fb(float p0, float p1, float p2, float p3, float t0, float t1, float t2, float v1, float4& g) {"]
fn += body + ["    g = make_float4(v76, v98, v109, v120);", "    return v41;", "}"]
open(f"{dst}/giou_fb.cuh", "w").write("\n".join(fn) + "\n")
PY
echo "prepared $dst"
