#!/usr/bin/env python3
"""Where a compiled training step's host time goes: the cases of `bench/backend_suite.py`
(its functions and inputs) compiled by kfuse and by Inductor in one process, each step the
forward and `torch.autograd.grad` of the inputs it differentiates. Per backend: host time per
call (time.perf_counter around a block of calls with no synchronisation inside; best and median
block of several), then cProfile over one block: the functions with the most time of their own,
per step.

    python3 bench/ab/host_profile.py [--batch B] [--calls N] [--top K] [--backends kfuse inductor] CASE...

CASE is a backend_suite function: giou_loss, diou_loss, ciou_loss, layer_norm, rms_norm,
cross_entropy, sigmoid_focal_loss (at its first size unless --batch). Needs a CUDA GPU, torch
with Triton and the kfuse package.
"""
import argparse
import cProfile
import os
import pstats
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import backend_suite as suite  # noqa: E402
from benchlib import host_blocks  # noqa: E402


def first_case(name):
    return next(c for c in suite.cases(smoke=False, full=False) if c["fn"] == name)


def short(func):
    path, line, name = func
    return f"{os.path.basename(path)}:{line}({name})" if path != "~" else name


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--backends", nargs="+", default=["kfuse", "inductor"])
    ap.add_argument("--after-graph", action="store_true",
                    help="first capture the step in a CUDA graph and replay it, as the backend suite does")
    args = ap.parse_args()
    import kfuse  # noqa: F401  (registers nothing: the entry point names the backend)

    dev = torch.device("cuda", 0)
    print(f"device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    for name in args.cases:
        case = dict(first_case(name))
        if args.batch:
            case["batch"] = args.batch
        inputs, wrt, upstream = suite.make_inputs(torch, case, dev, case["batch"])
        leaves = [inputs[i].requires_grad_() for i in wrt]
        fn = suite.FUNCTIONS[case["fn"]]
        for backend in args.backends:
            torch._dynamo.reset()
            compiled = torch.compile(fn, backend=backend) if backend == "kfuse" else torch.compile(fn)

            def step(compiled=compiled):
                out = compiled(*inputs)
                return torch.autograd.grad(out, leaves, upstream)

            for _ in range(30):
                step()
            if args.after_graph:
                times = suite.graph_times(torch, step, 10, 50)
                print(f"   (captured in a CUDA graph first: {times.get('median_us', times.get('error'))} µs a replay)")
            blocks = host_blocks(torch, step, args.calls, args.rounds, warmup=0)
            print(f"\n== {name} batch {case['batch']} {backend}: host µs per step best {min(blocks):.1f}, "
                  f"median {statistics.median(blocks):.1f} ({args.rounds} blocks of {args.calls})")
            prof = cProfile.Profile()
            torch.cuda.synchronize()
            prof.enable()
            for _ in range(args.calls):
                step()
            prof.disable()
            torch.cuda.synchronize()
            stats = pstats.Stats(prof)
            rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[: args.top]
            print(f"{'calls/step':>10} {'own µs/step':>11} {'cum µs/step':>11}  function (cProfile's own overhead included)")
            for func, (cc, nc, tt, ct, _) in rows:
                print(f"{nc / args.calls:10.1f} {tt * 1e6 / args.calls:11.2f} {ct * 1e6 / args.calls:11.2f}  {short(func)}")


if __name__ == "__main__":
    main()
