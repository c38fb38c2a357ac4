#!/usr/bin/env bash
# Session 5's third MLP call (the k-streaming form it measured was removed again, see
# bench/results/2026-11-22-h100-session5.md; +wgs no longer parses): the k-streaming wgmma form (+wgs) against the 16-warp chunked form
# (the current default on the H100, fma1@16/1+wg) and mma.sync, each twice; the wgmma test once.
#   ../shared/tools/gpu-bundle; device run: bash .gpu/run bash bench/session5c_gpu.sh   (carry [".gpu"])
set -uo pipefail
export OUT=${OUT:-/tmp/s5c}
TESTS=wgmma REPEAT=1 NCU_VARIANT=fma1+wgs \
SILU=packed,fma1@16/1+wg,fma1+wgs,packed+wgs,fma1@8+wgs,fma2+wgs,fma1@16/1+wg,fma1+wgs,packed \
RELU=packed+wg,packed+wgs,packed+wg,packed+wgs \
timeout 420 bash bench/mlp_wgmma_gpu.sh 2>&1 | tail -60
