#!/usr/bin/env python3
"""Where a training step of `bench/ab/norm_stats.py`'s cases spends its GPU time under the kfuse
backend: `torch.profiler` over a few warm steps, the kernels with the most CUDA time (µs a step)
and the regions' plans (`kfuse.explain`).

    python3 bench/ab/norm_profile.py [CASE substring] [--steps 10]      (on a CUDA machine)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import kfuse  # noqa: E402
from norm_stats import CASES, step_of  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", nargs="?", default="group_norm")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    dev = torch.device("cuda")
    for name, (make, shape) in CASES.items():
        if args.case not in name:
            continue
        torch.manual_seed(0)
        module = make().to(dev)
        x = torch.randn(shape, device=dev, requires_grad=True)
        dy = torch.randn(shape, device=dev)
        torch._dynamo.reset()
        step = step_of(torch.compile(module, backend="kfuse"), x, dy)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
        print(f"== {name} on {torch.cuda.get_device_name()}: CUDA µs a step, by kernel")
        rows = [(e.device_time_total / args.steps, e.count // args.steps, e.key) for e in prof.key_averages()]
        total = sum(us for us, _, _ in rows)
        print(f"{total:10.1f} µs  in all, {sum(calls for _, calls, _ in rows)} kernels a step")
        for us, calls, key in sorted(rows, reverse=True)[:12]:
            print(f"{us:10.1f} µs  {calls:3d}x  {key[:110]}")
        torch._dynamo.reset()
        print(kfuse.explain(module, x))


if __name__ == "__main__":
    main()
