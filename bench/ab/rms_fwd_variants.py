#!/usr/bin/env python3
"""The backend's RMSNorm forward region (bench/ab/rms_fwd_saved.kf) at [8192, 1024] f32: its entry
for rows in registers as `kfuse emit` prints it, and the same entry with its row loads and output
stores given other cache hints, each launched alone through bench/ab/kernel_ab.py (same buffers;
the generated entry's grid and block, and Inductor's for a row per block of 256 threads), then Inductor's kernel and kfuse's region from PyTorch
(bench/ab/rms_fwd_vs_inductor.py). What the loads' and stores' cache policy is worth.

    python3 bench/ab/rms_fwd_variants.py KFUSE_BINARY OUT_DIR [VARIANT,...]      (on a CUDA machine)

With variant names, only those run, and Inductor's kernel is left out. The `blocks_of_N` variants
keep a row per warp and take blocks of N threads (1024 / N of them a multiprocessor) instead of the
entry's one block of 1024: what the granularity of the blocks is worth."""
import json, os, subprocess, sys

kfuse, out = sys.argv[1], sys.argv[2]
only = sys.argv[3].split(",") if len(sys.argv) > 3 else None
os.makedirs(out, exist_ok=True)
here = os.path.dirname(os.path.abspath(__file__))
src = subprocess.run([kfuse, "emit", os.path.join(here, "rms_fwd_saved.kf")], check=True,
                     capture_output=True, text=True).stdout
entry = next(l.split("kf_")[1].split("(")[0] for l in src.splitlines() if "_regs(" in l and "__global__" in l)
entry = "kf_" + entry
load = "*reinterpret_cast<const float4*>(in0 + rowbase + kf_j)"
store = "*reinterpret_cast<float4*>(out1 + rowbase + kf_j) = make_float4(kf_o1[0], kf_o1[1], kf_o1[2], kf_o1[3]);"
assert load in src and store in src, "the emitted entry changed: update the patterns"
variants = {
    "generated": src,
    "loads_cs": src.replace(load, "__ldcs(reinterpret_cast<const float4*>(in0 + rowbase + kf_j))"),
    "loads_lu": src.replace(load, "__ldlu(reinterpret_cast<const float4*>(in0 + rowbase + kf_j))"),
    "stores_cs": src.replace(store, "__stcs(reinterpret_cast<float4*>(out1 + rowbase + kf_j), make_float4(kf_o1[0], kf_o1[1], kf_o1[2], kf_o1[3]));"),
}
# Inductor's shape: a row per block of 256 threads, 4 columns a thread (8 warps fold the row).
lanes = "while (kf_g < (int)blockDim.x && kf_g * 32 < cols) kf_g <<= 1;"
assert lanes in src, "the emitted lane rule changed: update the patterns"
variants["rows_of_256_lanes"] = src.replace(lanes, "while (kf_g < (int)blockDim.x && kf_g * 4 < cols) kf_g <<= 1;")
variants["both_cs"] = variants["loads_cs"].replace(store, "__stcs(reinterpret_cast<float4*>(out1 + rowbase + kf_j), make_float4(kf_o1[0], kf_o1[1], kf_o1[2], kf_o1[3]));")
bounds = "__launch_bounds__(1024, 1)"
assert bounds in src, "the emitted entry's launch bounds changed: update the patterns"
for block in (128, 256, 512):
    variants[f"blocks_of_{block}"] = src.replace(bounds, f"__launch_bounds__({block}, {1024 // block})")
if only:
    unknown = [k for k in only if k not in variants]
    if unknown:
        sys.exit(f"rms_fwd_variants: no variant {', '.join(unknown)}; the variants: {', '.join(variants)}")
    variants = {k: v for k, v in variants.items() if k in only}
rows, cols = 8192, 1024
args = [{"type": "ptr", "name": "x", "dtype": "float32", "shape": [rows, cols]},
        {"type": "ptr", "name": "w", "dtype": "float32", "shape": [cols]},
        {"type": "ptr", "name": "ms", "dtype": "float32", "shape": [rows], "kind": "zeros"},
        {"type": "ptr", "name": "y", "dtype": "float32", "shape": [rows, cols], "kind": "zeros"},
        {"type": "i64", "value": rows}, {"type": "i64", "value": cols}]
moved = (2 * rows * cols + rows + cols) * 4
spec = []
for name, text in variants.items():
    path = os.path.join(out, f"rms_fwd_{name}.cu")
    open(path, "w").write(text)
    if name == "rows_of_256_lanes":
        shapes = [(8192, 256), (1056, 256)]
    elif name.startswith("blocks_of_"):
        block = int(name.rsplit("_", 1)[1])
        shapes = [(132 * 1024 // block, block), (rows * 32 // block, block)]  # one wave; a row per warp
    else:
        shapes = [(132, 1024), (264, 1024)]
    for grid, block in shapes:
        spec.append({"file": path, "entry": entry, "grid": grid, "block": block, "args": args, "bytes": moved,
                     "check": ["y", "ms"], "reps": 60, "batch": 20})
spec = spec + spec  # twice, interleaved, for the spread between two runs of one variant
json.dump(spec, open(os.path.join(out, "spec.json"), "w"))
subprocess.run([sys.executable, os.path.join(here, "kernel_ab.py"), os.path.join(out, "spec.json")], check=True)
if not only:
    subprocess.run([sys.executable, os.path.join(here, "rms_fwd_vs_inductor.py")], check=True,
                   cwd=os.path.dirname(os.path.dirname(here)))
