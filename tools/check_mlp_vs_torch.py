#!/usr/bin/env python3
"""End-to-end check of the MLP path against PyTorch, on a machine with torch and a GPU.

For several nn.Sequential models (every activation export_mlp.py accepts, odd widths, with and
without biases), this exports each with tools/export_mlp.py, runs the ORIGINAL module in PyTorch
on random f16 rows, runs `kfuse mlp run` on the same rows (GPU and CPU interpreter path), and
prints the relative error of each against PyTorch. Exit status 1 if any exceeds 1e-2.

    python3 tools/check_mlp_vs_torch.py [--kfuse kfuse] [--dir /tmp/kfuse-torch-check] [--json out.json]
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def models(nn):
    return {
        "relu_64x4": nn.Sequential(nn.Linear(64, 64, bias=False), nn.ReLU(), nn.Linear(64, 64, bias=False), nn.ReLU(),
                                   nn.Linear(64, 16, bias=False)),
        "silu_bias": nn.Sequential(nn.Linear(32, 64), nn.SiLU(), nn.Linear(64, 96), nn.SiLU(), nn.Linear(96, 16)),
        "leaky_gelu_odd": nn.Sequential(nn.Linear(24, 100), nn.LeakyReLU(0.2), nn.Linear(100, 37),
                                        nn.GELU(approximate="tanh"), nn.Linear(37, 5)),
        "gelu_tanh_sigmoid": nn.Sequential(nn.Linear(16, 128), nn.GELU(), nn.Linear(128, 24), nn.Tanh(),
                                           nn.Linear(24, 8), nn.Sigmoid()),
        "softplus_deep": nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(48, 48), nn.Softplus())], nn.Linear(48, 3)),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kfuse", default="kfuse")
    ap.add_argument("--dir", default="/tmp/kfuse-torch-check")
    ap.add_argument("--rows", type=int, default=4099)
    ap.add_argument("--json")
    args = ap.parse_args()
    import numpy as np
    import torch
    from export_mlp import export

    torch.manual_seed(0)
    os.makedirs(args.dir, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    results, worst = [], 0.0
    for name, module in models(torch.nn).items():
        path = os.path.join(args.dir, f"{name}.json")
        export(module, path, "f16")
        # PyTorch on the same f16 weights, computing in f32 (the reference kfuse is held to).
        ref = module.half().float().to(dev).eval()
        x = torch.randn(args.rows, module[0].in_features).half()
        with torch.inference_mode():
            y = ref(x.float().to(dev)).cpu().numpy().astype(np.float64)
        xp = os.path.join(args.dir, f"{name}.x.npy")
        np.save(xp, x.numpy())
        entry = {"model": name}
        for device in ("cuda", "cpu"):
            yp = os.path.join(args.dir, f"{name}.y_{device}.npy")
            run = subprocess.run([args.kfuse, "mlp", "run", path, "--input", xp, "--output", yp,
                                  "--out-dtype", "f32", "--device", device], capture_output=True, text=True)
            if run.returncode != 0:
                entry[device] = {"error": run.stderr.strip()}
                worst = float("inf")
                continue
            got = np.load(yp).astype(np.float64)
            rel = float(np.linalg.norm(got - y) / max(np.linalg.norm(y), 1e-30))
            entry[device] = {"rel_err_vs_torch": rel, "max_abs_err": float(np.abs(got - y).max())}
            worst = max(worst, rel)
        print(name, json.dumps(entry))
        results.append(entry)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": dev, "rows": args.rows, "models": results}, f, indent=1)
    print(f"worst relative error vs PyTorch: {worst:.3e} (bound 1e-2)")
    sys.exit(0 if worst <= 1e-2 else 1)


if __name__ == "__main__":
    main()
