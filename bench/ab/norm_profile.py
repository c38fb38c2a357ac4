#!/usr/bin/env python3
"""Where a training step of `bench/ab/norm_stats.py`'s cases spends its time under the kfuse
backend (or `--backend inductor`): `torch.profiler` over a few warm steps, the kernels with the most CUDA time (µs a step)
and the regions' plans (`kfuse.explain`); with `--host`, where the host's time goes instead: the
host's time of a step and of its forward alone (time.perf_counter, best of blocks), the same with
kfuse's kernel launches skipped (what the launches cost the host), the aten ops the step runs (CPU
µs a step, by op) and the Python functions with the most time of their own (`cProfile`).

    python3 bench/ab/norm_profile.py [CASE substring] [--steps 10] [--host]      (on a CUDA machine)
"""
import argparse
import cProfile
import io
import os
import pstats
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import kfuse  # noqa: E402
from benchlib import host_blocks  # noqa: E402
from norm_stats import CASES, step_of  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", nargs="?", default="group_norm")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--host", action="store_true", help="profile the host's time instead of the GPU's")
    ap.add_argument("--backend", default="kfuse", help="the torch.compile backend to profile (default kfuse)")
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
        step = step_of(torch.compile(module, backend=args.backend), x, dy)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        if args.host:
            forward = torch.compile(module, backend=args.backend)
            host_split(name, step, lambda: forward(x), args.backend == "kfuse")
            host_profile(name, step, args.steps)
            continue
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
        print(f"== {name} on {torch.cuda.get_device_name()}: CUDA µs a step, by kernel")
        rows = [(e.device_time_total / args.steps, e.count // args.steps, e.key) for e in prof.key_averages()]
        total = sum(us for us, _, _ in rows)
        print(f"{total:10.1f} µs  in all, {sum(calls for _, calls, _ in rows)} kernels a step")
        for us, calls, key in sorted(rows, reverse=True)[:30]:
            print(f"{us:10.1f} µs  {calls:3d}x  {key[:110]}")
        torch._dynamo.reset()
        if args.backend == "kfuse":
            print(kfuse.explain(module, x))


def host_split(name, step, forward, kfuse_backend):
    """Host µs of a step and of its forward alone (best of 7 blocks of 50 calls); for kfuse, again
    with the native launches skipped (outputs allocated, no kernel queued): the launches' share."""
    import kfuse._run as run  # noqa: PLC0415

    def best(fn):
        return min(host_blocks(torch, fn, 50, 7))

    print(f"== {name}: host µs (best of 7 blocks of 50 calls)")
    print(f"   step {best(step):8.1f}   forward {best(forward):8.1f}")
    if not kfuse_backend:
        return
    current, on_device = run._current_device, run._on_device
    run._current_device, run._on_device = (lambda: -1), (lambda *a: None)
    try:
        print(f"   launches skipped: step {best(step):8.1f}   forward {best(forward):8.1f}")
    finally:
        run._current_device, run._on_device = current, on_device


def host_profile(name, step, steps):
    """The host's time of `steps` warm steps: aten ops by CPU time, then Python by own time."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    print(f"== {name} on {torch.cuda.get_device_name()}: host µs a step, by op (self CPU time)")
    rows = [(e.self_cpu_time_total / steps, e.count / steps, e.key) for e in prof.key_averages()]
    print(f"{sum(us for us, _, _ in rows):10.1f} µs  in all")
    for us, calls, key in sorted(rows, reverse=True)[:25]:
        print(f"{us:10.1f} µs  {calls:5.1f}x  {key[:100]}")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
    print(f"== {name}: Python functions by own time, {steps} steps")
    print(out.getvalue())


if __name__ == "__main__":
    main()
