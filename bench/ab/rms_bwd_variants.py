#!/usr/bin/env python3
"""The backend's RMSNorm backward region (bench/ab/rms_bwd_backend.kf) at [8192, 1024] f32: its
entry for rows in registers (dx, and the weight gradient's column sums a row per block) as
`kfuse emit` prints it, at one wave of its blocks (4 of 256 threads a multiprocessor) and at two,
and the same entry whose row groups of two warps fold their row sum at a barrier of their own
(`bar.sync` named per group) instead of the whole block's `__syncthreads`, each launched alone
through bench/ab/kernel_ab.py (same buffers).

    python3 bench/ab/rms_bwd_variants.py KFUSE_BINARY OUT_DIR      (on a CUDA machine)"""
import json, os, subprocess, sys

kfuse, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
here = os.path.dirname(os.path.abspath(__file__))
src = subprocess.run([kfuse, "emit", os.path.join(here, "rms_bwd_backend.kf")], check=True,
                     capture_output=True, text=True).stdout
entry = next("kf_" + l.split("kf_")[1].split("(")[0] for l in src.splitlines() if "_regs(" in l and "__global__" in l)
sync = "__syncthreads(); // smem may still be read by the previous call"
# The helper is defined once per translation unit behind an include guard: the first definition
# is the one the file compiles.
assert sync in src, "the emitted row fold changed: update the patterns"
group_bar = ("const unsigned kf_ng = blockDim.x / (unsigned)g; // row groups in the block: a barrier each when they fit 15\n"
             "        auto kf_gb = [&]() { if (kf_ng <= 15u) asm volatile(\"bar.sync %0, %1;\" :: \"r\"(1u + threadIdx.x / (unsigned)g), \"r\"((unsigned)g) : \"memory\"); else __syncthreads(); };\n"
             "        kf_gb(); // smem may still be read by the previous call")
named = src.replace(sync, group_bar, 1)
head, tail = named.split(group_bar, 1)
tail = tail.replace("__syncthreads();", "kf_gb();", 1)
named = head + group_bar + tail
variants = {"generated": src, "group_barriers": named}
rows, cols = 8192, 1024
args = [{"type": "ptr", "name": "ms", "dtype": "float32", "shape": [rows, 1]},
        {"type": "ptr", "name": "x", "dtype": "float32", "shape": [rows, cols]},
        {"type": "ptr", "name": "w", "dtype": "float32", "shape": [cols]},
        {"type": "ptr", "name": "dy", "dtype": "float32", "shape": [rows, cols]},
        {"type": "ptr", "name": "dx", "dtype": "float32", "shape": [rows, cols], "kind": "zeros"},
        {"type": "ptr", "name": "colp", "dtype": "float32", "shape": [2048, cols], "kind": "zeros"},
        {"type": "i64", "value": rows}, {"type": "i64", "value": cols}]
moved = (3 * rows * cols + rows + cols) * 4
spec = []
for name, text in variants.items():
    path = os.path.join(out, f"rms_bwd_{name}.cu")
    open(path, "w").write(text)
    for grid in (528, 1056):
        spec.append({"file": path, "entry": entry, "grid": grid, "block": 256, "args": args, "bytes": moved,
                     "check": ["dx"], "reps": 60, "batch": 20})
spec = spec + spec
json.dump(spec, open(os.path.join(out, "spec.json"), "w"))
subprocess.run([sys.executable, os.path.join(here, "kernel_ab.py"), os.path.join(out, "spec.json")], check=True)
