#!/usr/bin/env bash
# Prepares the training-step prototype harness (bench/proto/train_proto.cu) on the dev machine:
# the kernels kfuse generates today for the bf16 padded and lengths examples (the baselines, timed
# in the same run) and giou_fb.cuh, the GIoU loss term and its unscaled gradient lifted from the
# generated padded kernel (so every prototype computes bit-identical values), and the rows plan.
#   bash bench/proto/prepare.sh .proto       # here: writes .proto/ (ignored by git)
#   device run: bash .proto/run.sh            (carry [".proto"]; nvcc on the GPU machine)
set -euo pipefail
dst=${1:-.proto}
mkdir -p "$dst" /tmp/kfb-proto
for f in giou_train giou_train_lengths; do sed 's/f32\[/bf16[/' examples/$f.kf > /tmp/kfb-proto/$f.kf; done
cargo run --release -q -- emit /tmp/kfb-proto/giou_train.kf > "$dst/pad_gen.cu"
cargo run --release -q -- emit --lengths-gradient two-kernels /tmp/kfb-proto/giou_train_lengths.kf > "$dst/len_gen.cu"
cp bench/proto/train_proto.cu bench/proto/train_kernels.cuh bench/proto/run.sh bench/proto/ncu.sh "$dst/"
# the rows plan (one launch) of the lengths example, renamed beside the two-kernel plan's kernels
cargo run --release -q -- emit --lengths-gradient one-pass /tmp/kfb-proto/giou_train_lengths.kf | sed 's/kf_595cf59383a6d678_0/kf_len_rows/' > "$dst/len_rows_gen.cu"
# and with more compute warps at least (its helpers are guarded, so the whole source appends)
cp "$dst/len_rows_gen.cu" /tmp/kfb-proto/len_rows_base.cu
# variants of its tuning constants, as kf_len_rows_m<KF_MINCW>_u<KF_U>
for v in "6 2"; do set -- $v
  sed "s/kf_len_rows/kf_len_rows_m$1_u$2/; s/KF_MINCW = [0-9]*;/KF_MINCW = $1;/; s/KF_U = [0-9]*;/KF_U = $2;/" /tmp/kfb-proto/len_rows_base.cu >> "$dst/len_rows_gen.cu"; done
# giou_fb.cuh: the GIoU loss term and its unscaled gradient, lifted once from the generated padded kernel
cp bench/proto/giou_fb.cuh "$dst/"
echo "prepared $dst"
