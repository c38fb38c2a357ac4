"""The torch.compile backend's RMSNorm forward region (bench/ab/rms_fwd_saved.kf, run through
kfuse.compile) against Inductor's kernel for the same function at [8192, 1024] f32: each call replayed
from a CUDA graph of 20 calls (no host time), on one buffer set and rotated over 4 (more than L2).

    python3 bench/ab/rms_fwd_vs_inductor.py      (from the repository root, on a CUDA machine)"""
import torch, kfuse, statistics
src = open("bench/ab/rms_fwd_saved.kf").read()
prog = kfuse.compile(src, "rms_fwd_saved")
def f(x, w):
    ms = (x * x).mean(-1, keepdim=True)
    return x * torch.rsqrt(ms + 1e-6) * w, ms
ind = torch.compile(f)
def kf(x, w):
    o = prog(a0=x, a1=w, validate=False)
    return o.o1, o.o0
sets = [(torch.randn(8192, 1024, device="cuda"), torch.randn(1024, device="cuda")) for _ in range(4)]
x, w = sets[0]
yr = f(x.double(), w.double())[0]
# The bytes a call must move: x read, y and the mean squares written, w read.
moved = (2 * x.numel() + x.shape[0] + w.numel()) * x.element_size()
for name, fn in [("inductor", ind), ("kfuse", kf)]:
    err = ((fn(x, w)[0].double() - yr).abs().max() / yr.abs().max()).item()
    for rot in (1, 4):
        for _ in range(3): fn(x, w)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(20): fn(*sets[i % rot])
        ts = []
        for _ in range(30):
            s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
            s.record(); g.replay(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e) * 1000 / 20)
        print(f"{name:9s} sets={rot} median {statistics.median(ts):6.2f} us  min {min(ts):6.2f}  GB/s {moved/statistics.median(ts)/1e3:6.0f}  rel err {err:.1e}")
