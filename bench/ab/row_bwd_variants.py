#!/usr/bin/env python3
"""The backend's backward regions of RMSNorm and layer norm (bench/ab/rms_bwd_backend.kf,
bench/ab/ln_bwd_backend.kf) at [8192, 1024] f32: the entry for rows in registers (dx, and the
weight gradients' column sums, a row per block) as `kfuse emit` prints it, at one wave of its
blocks (4 of 256 threads a multiprocessor) and at two, and the same entry whose row groups (two
warps a row) fold their row sums at a barrier of their own (`bar.sync` named per group) instead of
the whole block's `__syncthreads`. Each is launched alone through bench/ab/kernel_ab.py; equal
`check` sums: the same dx.

    python3 bench/ab/row_bwd_variants.py KFUSE_BINARY OUT_DIR      (on a CUDA machine)"""
import json, os, re, subprocess, sys

kfuse, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
here = os.path.dirname(os.path.abspath(__file__))
ROWS, COLS = 8192, 1024
SIZES = {"N0": ROWS, "N1": COLS}
GROUP_BAR = ("const unsigned kf_ng = blockDim.x / (unsigned)({g}); // row groups in the block: a barrier each when they fit 15\n"
             "{ind}auto kf_gb = [&]() {{ if (kf_ng <= 15u) asm volatile(\"bar.sync %0, %1;\" :: \"r\"(1u + threadIdx.x / (unsigned)({g})), \"r\"((unsigned)({g})) : \"memory\"); else __syncthreads(); }};\n"
             "{ind}kf_gb();")


def group_barriers(src):
    """Every row fold's pair of block barriers (the helper's first definition, which the file
    compiles, and the inline folds of several sums) made the row group's own."""
    def fold(src, first, g, ind):
        at = src.index(first)
        head, tail = src[:at], src[at + len(first):]
        return head + GROUP_BAR.format(g=g, ind=ind) + tail.replace("__syncthreads();", "kf_gb();", 1)
    helper = "__syncthreads(); // smem may still be read by the previous call"
    src = fold(src, helper, "g", "        ")
    inline = "__syncthreads(); // kf_rs may still be read by the previous fold"
    while inline in src:
        src = fold(src, inline, "kf_g", "            ")
    return src


def args_of(src, entry):
    """kernel_ab.py's arguments of `entry`, from the parameter comments `kfuse emit` writes."""
    sig = src[src.index(entry + "("):]
    sig = sig[:sig.index("\n)")]
    args = []
    for line in sig.splitlines()[1:]:
        name = line.split("//")[0].split()[-1].rstrip(",")
        note = line.split("//", 1)[1]
        if name == "kf_colp":
            args.append({"type": "ptr", "name": "colp", "dtype": "float32", "shape": [2048, 4 * COLS], "kind": "zeros"})
        elif name.startswith("sz"):
            args.append({"type": "i64", "value": SIZES[note.split()[-1]]})
        else:
            dims = [SIZES.get(d.strip(), None) or int(d) for d in re.search(r"\[(.*)\]", note).group(1).split(",")]
            args.append({"type": "ptr", "name": f"{entry}:{name}", "dtype": "float32", "shape": dims,
                         # A row's statistic (a mean square, a variance) is positive: no NaN to compare.
                         **({"kind": "zeros"} if name.startswith("out") else {"kind": "positive"} if dims[-1] == 1 else {})})
    return args


spec = []
for kf in ("rms_bwd_backend.kf", "ln_bwd_backend.kf"):
    src = subprocess.run([kfuse, "emit", os.path.join(here, kf)], check=True, capture_output=True, text=True).stdout
    entry = next("kf_" + l.split("kf_")[1].split("(")[0] for l in src.splitlines() if "_regs(" in l and "__global__" in l)
    args = args_of(src, entry)
    outs = [a["name"] for a in args if a.get("kind") == "zeros" and a["name"] != "colp"]
    moved = sum(4 * ROWS * COLS for a in args if a["type"] == "ptr" and a["shape"] == [ROWS, COLS])
    for name, text in (("generated", src), ("group_barriers", group_barriers(src))):
        path = os.path.join(out, f"{kf[:-3]}_{name}.cu")
        open(path, "w").write(text)
        for grid in (528, 1056):
            spec.append({"file": path, "entry": entry, "grid": grid, "block": 256, "args": args, "bytes": moved,
                         "check": outs, "reps": 60, "batch": 20})
spec = spec + spec  # twice, interleaved, for the spread between two runs of one variant
json.dump(spec, open(os.path.join(out, "spec.json"), "w"))
subprocess.run([sys.executable, os.path.join(here, "kernel_ab.py"), os.path.join(out, "spec.json")], check=True)
