#!/usr/bin/env bash
# Session 5's second GPU call: the wgmma test three times (a failure was seen once), then the SiLU
# model's wgmma forms (16 warps x 1 row tile, FMA shares) and the ReLU models at 16 x 1.
#   ../shared/tools/gpu-bundle; device run: bash .gpu/run bash bench/session5b_gpu.sh   (carry [".gpu"])
set -uo pipefail
export OUT=${OUT:-/tmp/s5b}
TESTS=wgmma REPEAT=3 NCU_VARIANT=packed@16/1+wg \
SILU=packed,packed@16/1+wg,fma1@16/1+wg,fma2@16/1+wg,balanced@16/1+wg,packed@12/1+wg,fma1+wg,packed@16/1,packed@16/1+wg,packed \
RELU=packed,packed+wg,packed@16/1+wg,packed@8/1+wg,packed+wg \
timeout 420 bash bench/mlp_wgmma_gpu.sh 2>&1 | tail -70
