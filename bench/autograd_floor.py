#!/usr/bin/env python3
"""Host time per eager call of PyTorch's autograd floor beside kfuse's GIoU call (B=1024, lengths
layout, validate=False): what a forward + backward costs the host before any kernel of kfuse.
Best and median of three runs of 1000 calls each, no synchronisation inside a run, with autograd's
default threads and with the backward on the calling thread
(`torch.autograd.set_multithreading_enabled(False)`); a markdown row per case. Needs a CUDA GPU
and the kfuse package; run from the repository root."""
import time

import torch

import kfuse

d = torch.device("cuda", 0)
B, N = 1024, 256
g = torch.Generator().manual_seed(0)
pred = torch.rand(B, N, 4, generator=g); pred[..., 2:] += pred[..., :2] + 0.1
tgt = torch.rand(B, N, 4, generator=g); tgt[..., 2:] += tgt[..., :2] + 0.1
lengths = torch.randint(0, 9, (B,), dtype=torch.int32, generator=g)
pred, tgt, lengths = pred.to(d).requires_grad_(), tgt.to(d), lengths.to(d)
class Id(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.new_empty(())
    @staticmethod
    def backward(ctx, up):
        return None
class Saved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        gr = torch.empty_like(x); ctx.save_for_backward(gr); return x.new_empty(())
    @staticmethod
    def backward(ctx, up):
        (gr,) = ctx.saved_tensors; return gr * up
p = kfuse.load("examples/giou_lengths.kf")
cases = {
  "torch a+b (no grad)": lambda: tgt + tgt,
  "autograd.Function, empty backward: fwd+bwd": lambda: Id.apply(pred).backward(),
  "autograd.Function returning a saved grad * up (kfuse's pattern, no kernel of its own): fwd+bwd": lambda: Saved.apply(pred).backward(),
  "torch (pred*2).sum() fwd+bwd": lambda: (pred * 2).sum().backward(),
  "kfuse giou_lengths fwd (no grad)": lambda: p(pred=pred.detach(), target=tgt, lengths=lengths, validate=False).loss,
  "kfuse giou_lengths fwd+bwd": lambda: p(pred=pred, target=tgt, lengths=lengths, validate=False).loss.backward(),
}
def measure(f):
    for _ in range(100): f()
    torch.cuda.synchronize()
    best = []
    for rep in range(3):
        t = time.perf_counter()
        for _ in range(1000): f()
        best.append((time.perf_counter() - t) / 1000 * 1e6)
        torch.cuda.synchronize()
    return min(best), sorted(best)[1]
print("| call | best | median | backward on the calling thread: best | median |")
print("|---|---:|---:|---:|---:|")
for name, f in cases.items():
    b, m = measure(f)
    with torch.autograd.set_multithreading_enabled(False):
        tb, tm = measure(f)
    print(f"| {name} | {b:.1f} | {m:.1f} | {tb:.1f} | {tm:.1f} |", flush=True)
