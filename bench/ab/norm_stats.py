#!/usr/bin/env python3
"""A training step (forward + backward) of modules whose statistics reduce along axes other than
the last (`nn.BatchNorm2d`, `nn.GroupNorm`, a LayerNorm over (C, H, W)): eager PyTorch,
`torch.compile` with Inductor and with kfuse, CUDA-event medians in µs, and what kfuse left to
PyTorch. kfuse stores such a reduction once, by kernels of its own (in parts: the rows' sums,
then the columns'), and the kernels after it read it back.

    python3 bench/ab/norm_stats.py [--iters 50]      (on a CUDA machine)
"""
import argparse
import os
import sys

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
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; step = forward + backward, median µs of {args.iters}")
    print("| case | eager | Inductor | kfuse | kfuse / Inductor | left to PyTorch by kfuse |")
    print("|---|---:|---:|---:|---:|---|")
    for name, (make, shape) in CASES.items():
        torch.manual_seed(0)
        module = make().to(dev)
        x = torch.randn(shape, device=dev, requires_grad=True)
        dy = torch.randn(shape, device=dev)
        figures, errs = {}, {}
        want = step_of(module, x, dy)()
        for backend in ("eager", "inductor", "kfuse"):
            torch._dynamo.reset()
            m = module if backend == "eager" else torch.compile(module, backend=backend)
            step = step_of(m, x, dy)
            got = step()
            errs[backend] = max(max_rel_err(g, w) for g, w in zip(got, want))
            figures[backend] = cuda_times_us(torch, step, 5, args.iters)["median_us"]
        torch._dynamo.reset()
        report = kfuse.explain(module, x)
        left = sorted({f.op for f in report.fallbacks})
        print(f"| {name} | {figures['eager']:.1f} | {figures['inductor']:.1f} | {figures['kfuse']:.1f} | "
              f"{figures['kfuse'] / figures['inductor']:.2f} | {', '.join(left) or '-'} |")
        print(f"  max rel err vs eager: inductor {errs['inductor']:.1e}, kfuse {errs['kfuse']:.1e}")


if __name__ == "__main__":
    main()
