#!/usr/bin/env python3
"""A training step (forward + backward) of modules whose statistics reduce along axes other than
the last (`nn.BatchNorm2d`, `nn.GroupNorm`, a LayerNorm over (C, H, W)): eager PyTorch,
`torch.compile` with Inductor and with kfuse, CUDA-event medians in µs, and what kfuse left to
PyTorch. kfuse stores such a reduction once, by kernels of its own (in parts: the rows' sums,
then the columns'), and the kernels after it read it back.

These steps are bound by the host, and a median of single steps swings by a third from one
machine to the next. So each backend is also timed by blocks of `--calls` steps back to back, the
device synchronised at each block's end (µs a step: what a training loop sees), the three
backends' blocks interleaved over `--rounds` rounds, and the best block of each kept.

    python3 bench/ab/norm_stats.py [--iters 50] [--rounds 7] [--calls 50]      (on a CUDA machine)
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import kfuse  # noqa: E402
from benchlib import cuda_times_us, max_rel_err  # noqa: E402

CASES = {
    "batch_norm2d [32, 64, 56, 56]": (lambda: nn.BatchNorm2d(64), (32, 64, 56, 56)),
    "group_norm 32 groups [16, 256, 32, 32]": (lambda: nn.GroupNorm(32, 256), (16, 256, 32, 32)),
    "layer_norm (C, H, W) [32, 64, 28, 28]": (lambda: nn.LayerNorm((64, 28, 28)), (32, 64, 28, 28)),
}


def step_of(module, x, dy):
    def step():
        y = module(x)
        return torch.autograd.grad(y, [x, *module.parameters()], dy)

    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=7, help="rounds of interleaved blocks (best kept)")
    ap.add_argument("--calls", type=int, default=50, help="steps a block")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script itself (kfuse's interpreter)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cpu = dev.type == "cpu"
    where = "CPU" if cpu else torch.cuda.get_device_name()
    print(f"{where}, torch {torch.__version__}; step = forward + backward")
    print(f"median: CUDA events around each of {args.iters} steps; blocks: µs a step, best of {args.rounds} "
          f"interleaved blocks of {args.calls} steps")
    print("| case | eager median | Inductor median | kfuse median | ratio | eager blocks | Inductor blocks "
          "| kfuse blocks | ratio | left to PyTorch by kfuse |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    backends = ("eager", "inductor", "kfuse")
    for name, (make, shape) in CASES.items():
        torch.manual_seed(0)
        module = make().to(dev)
        x = torch.randn(shape, device=dev, requires_grad=True)
        dy = torch.randn(shape, device=dev)
        medians, errs, steps = {}, {}, {}
        want = step_of(module, x, dy)()
        for backend in backends:
            # Each backend's compiled module is its own (Dynamo's cache holds them side by side:
            # no reset between them, so the blocks below can interleave).
            m = module if backend == "eager" else torch.compile(module, backend=backend)
            step = step_of(m, x, dy)
            got = step()
            errs[backend] = max(max_rel_err(g, w) for g, w in zip(got, want))
            medians[backend] = cuda_times_us(torch, step, 5, args.iters, cpu=cpu)["median_us"]
            steps[backend] = step
        blocks = {b: float("inf") for b in backends}
        for _ in range(args.rounds):
            for backend in backends:
                blocks[backend] = min(blocks[backend], block_us(torch, steps[backend], args.calls, cpu))
        torch._dynamo.reset()
        report = kfuse.explain(module, x)
        left = sorted({f.op for f in report.fallbacks})
        print(f"| {name} | {medians['eager']:.1f} | {medians['inductor']:.1f} | {medians['kfuse']:.1f} | "
              f"{medians['kfuse'] / medians['inductor']:.2f} | {blocks['eager']:.1f} | {blocks['inductor']:.1f} | "
              f"{blocks['kfuse']:.1f} | {blocks['kfuse'] / blocks['inductor']:.2f} | {', '.join(left) or '-'} |")
        print(f"  max rel err vs eager: inductor {errs['inductor']:.1e}, kfuse {errs['kfuse']:.1e}")
        torch._dynamo.reset()


def block_us(torch, step, calls, cpu=False):
    """µs a step of `calls` steps back to back, the device synchronised before and at the end."""
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    sync()
    return (time.perf_counter() - t0) * 1e6 / calls


if __name__ == "__main__":
    main()
