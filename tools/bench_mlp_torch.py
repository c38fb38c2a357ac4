#!/usr/bin/env python3
"""Time PyTorch on the same weights as kfuse's MLP benchmark models; write JSON.

    python tools/bench_mlp_torch.py --make bench_models/ --json torch_mlp.json
        writes the three benchmark models of bench/run's mlp suites (model.json + safetensors, via export_mlp.py)
        into bench_models/ and times them
    python tools/bench_mlp_torch.py --models a.json b.json --json out.json
        times existing kfuse model files

For each model: eager, eager replayed from a CUDA graph, and torch.compile (mode
"max-autotune-no-cudagraphs", skipped with --no-compile or on error), fp16, batch 2^21 by default,
row-major inputs and outputs as PyTorch holds them. Median of CUDA-event timings after warm-up;
the best of the variants is reported as "best_ms".
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def build_from_kfuse(json_path, device, dtype):
    import torch
    from torch import nn
    import torch.nn.functional as F
    from safetensors.torch import load_file

    with open(json_path) as f:
        desc = json.load(f)
    tensors = load_file(os.path.join(os.path.dirname(os.path.abspath(json_path)), desc["weights"]))
    named = {
        "none": lambda x: x, "relu": F.relu, "leaky_relu": lambda x: F.leaky_relu(x, 0.01), "silu": F.silu,
        "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "sigmoid": torch.sigmoid,
        "tanh": torch.tanh, "softplus": F.softplus, "sin": torch.sin, "exp": torch.exp,
    }
    layers = []
    for l in desc["layers"]:
        w = tensors[l["weight"]].to(device, dtype)
        b = tensors[l["bias"]].to(device, dtype) if l.get("bias") else None
        act = named.get(l.get("activation", "none"))
        if act is None:
            raise SystemExit(f"{json_path}: custom activation {l['activation']!r} has no torch equivalent here")
        layers.append((w, b, act))

    class Mlp(nn.Module):
        def forward(self, x):
            for w, b, act in layers:
                x = act(F.linear(x, w, b))
            return x

    return Mlp(), desc, layers


def make_models(folder):
    import torch
    from torch import nn
    from export_mlp import export

    torch.manual_seed(0)
    specs = {
        "mlp64x4_relu": nn.Sequential(nn.Linear(64, 64, bias=False), nn.ReLU(), nn.Linear(64, 64, bias=False), nn.ReLU(),
                                      nn.Linear(64, 64, bias=False), nn.ReLU(), nn.Linear(64, 64, bias=False), nn.ReLU(),
                                      nn.Linear(64, 16, bias=False)),
        "mlp128x4_relu": nn.Sequential(nn.Linear(64, 128, bias=False), nn.ReLU(), nn.Linear(128, 128, bias=False), nn.ReLU(),
                                       nn.Linear(128, 128, bias=False), nn.ReLU(), nn.Linear(128, 128, bias=False), nn.ReLU(),
                                       nn.Linear(128, 16, bias=False)),
        "mlp_silu_bias": nn.Sequential(nn.Linear(32, 64), nn.SiLU(), nn.Linear(64, 128), nn.SiLU(), nn.Linear(128, 96), nn.SiLU(),
                                       nn.Linear(96, 64), nn.SiLU(), nn.Linear(64, 32), nn.SiLU(), nn.Linear(32, 16)),
    }
    paths = []
    for name, module in specs.items():
        path = os.path.join(folder, f"{name}.json")
        export(module, path, "f16")
        paths.append(path)
    return paths


def time_fn(fn, warmup, iters):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--make", help="folder to write the three benchmark models into")
    ap.add_argument("--models", nargs="*", default=[])
    ap.add_argument("--batch", type=int, default=1 << 21)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args()
    import torch

    paths = list(args.models)
    if args.make:
        paths += make_models(args.make)
    if not paths:
        raise SystemExit("give --make FOLDER or --models ...")
    dev = torch.device("cuda")
    results = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "batch": args.batch, "models": []}
    for path in paths:
        model, desc, layers = build_from_kfuse(path, dev, torch.float16)
        x = torch.randn(args.batch, layers[0][0].shape[1], device=dev, dtype=torch.float16)
        entry = {"model": path, "widths": [layers[0][0].shape[1]] + [w.shape[0] for w, _, _ in layers]}
        with torch.inference_mode():
            entry["eager_ms"] = time_fn(lambda: model(x), 5, args.iters)
            try:
                static_x = x.clone()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        model(static_x)
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    model(static_x)
                entry["cuda_graph_ms"] = time_fn(g.replay, 5, args.iters)
            except Exception as e:  # noqa: BLE001 -- report and go on
                entry["cuda_graph_error"] = repr(e)
            if not args.no_compile:
                try:
                    t0 = time.time()
                    compiled = torch.compile(model, mode="max-autotune-no-cudagraphs")
                    compiled(x)
                    torch.cuda.synchronize()
                    entry["compile_s"] = time.time() - t0
                    entry["torch_compile_ms"] = time_fn(lambda: compiled(x), 5, args.iters)
                except Exception as e:  # noqa: BLE001
                    entry["torch_compile_error"] = repr(e)
        entry["best_ms"] = min(v for k, v in entry.items() if k.endswith("_ms"))
        print(f"{path}: " + ", ".join(f"{k} {v:.4f}" for k, v in entry.items() if k.endswith("_ms")), flush=True)
        results["models"].append(entry)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
