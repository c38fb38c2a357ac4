"""The GIoU seed's training step under PyTorch DistributedDataParallel, with the loss computed by
a kfuse program through the Python package.

    torchrun --nproc_per_node 2 examples/ddp_giou.py --layout lengths --dtype bf16 --batch 32
    torchrun --nproc_per_node 2 examples/ddp_giou.py --compile kfuse --batch 32

One process per GPU (NCCL). Each rank draws its own images and boxes from the seed's distribution
(``clip(floor(|N(0, 3)|), 0, 255)`` boxes per image, up to N = 256) for global sample indices
``rank * B .. (rank + 1) * B - 1``, so a run on 1 GPU with ``--batch 2B`` sees the same global
batch as a run on 2 GPUs with ``--batch B``. The model is the seed's toy detector (four conv
blocks, two linear layers: 256 boxes of 4 coordinates per image).

The loss is the mean of 1 - GIoU over the valid boxes of the *global* batch: each rank's kfuse
loss (the mean over its own valid boxes) is weighted by its share of the boxes, so that DDP's
average of the ranks' gradients is the gradient of the global mean, and the loss and gradients of
a 2-GPU step equal those of a 1-GPU step over the same global batch.

``--compile kfuse`` (or ``inductor``, to compare) writes the loss in plain PyTorch instead
(:func:`torch_loss`, over the padded boxes and the lengths) and compiles it and the DDP-wrapped
detector with ``torch.compile(..., backend=...)``: Dynamo splits the detector's graph at DDP's
bucket boundaries, and the kfuse backend fuses each piece's elementwise work and the loss and
its gradient into kfuse kernels, leaving the convolutions and matmuls to PyTorch.

Layouts: ``padded`` (examples/giou.kf, a zero y2 marks padding), ``lengths``
(examples/giou_lengths.kf), ``packed`` (examples/giou_packed.kf). ``--dtype bf16`` runs the model
under autocast and the loss at bf16 (the kfuse program typed at bf16 by value).

Checks, printed per rank and failing the run when they fail:
* the kfuse loss against the same loss written in PyTorch in float64 on the same rank's data;
* the kfuse kernels ran on this rank's device and on its current stream (read from a profile);
* with ``--save FILE``, rank 0 saves the global loss and the parameter gradients (lin1 sampled)
  for ``--compare FILE`` of another run.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

# NVLink multicast stays off in every process (set before torch initialises NCCL).
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import kfuse

ROOT = Path(__file__).resolve().parent.parent
N = 256  # box slots per image
PROGRAMS = {"padded": "giou.kf", "lengths": "giou_lengths.kf", "packed": "giou_packed.kf"}


class Net(nn.Module):
    """The seed's toy detector."""

    def __init__(self, hidden=256 * 64):
        super().__init__()
        layers = []
        for i in range(4):
            layers += [nn.Conv2d(4**i, 4 ** (i + 1), 3, padding="same"), nn.MaxPool2d(2, 2), nn.ReLU()]
        self.conv_layers = nn.Sequential(*layers)
        self.lin1 = nn.Linear(256 * 256, hidden)
        self.lin2 = nn.Linear(hidden, 256 * 4)

    def forward(self, x):
        x = self.conv_layers(x.float())
        x = self.lin2(F.relu(self.lin1(x.view((-1, 256 * 256)))))
        return x.view((-1, 256, 4))


def sample(index, seed):
    """Image and boxes of global sample `index`, as the seed's dataset draws them."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + index)
    rng = np.random.default_rng(seed * 1_000_003 + index)
    image = torch.randint(0, 256, (1, 256, 256), dtype=torch.uint8, generator=g)
    n = int(np.clip(np.floor(np.abs(rng.normal(0, 3))), 0, 255))
    sizes = torch.randint(1, 256, (n, 2), generator=g)
    top_left = torch.randint(0, 255, (n, 2), generator=g)
    bottom_right = torch.clamp(top_left + sizes, 0, 255)
    # y2 > 0 always (top_left + size >= 1), so a zero y2 can mark padding.
    return image, torch.cat((top_left, bottom_right), dim=1).float()


def batch(rank, per_rank, seed, device):
    items = [sample(rank * per_rank + i, seed) for i in range(per_rank)]
    images = torch.stack([im for im, _ in items]).to(device)
    boxes = [b for _, b in items]
    lengths = torch.tensor([len(b) for b in boxes], dtype=torch.int32)
    padded = torch.zeros(per_rank, N, 4)
    for i, b in enumerate(boxes):
        padded[i, : len(b)] = b
    offsets = torch.cat((torch.zeros(1, dtype=torch.int64), lengths.cumsum(0))).to(torch.int32)
    return images, padded.to(device), lengths.to(device), offsets.to(device)


def loss_inputs(layout, pred, target, lengths, offsets):
    """The kfuse program's inputs in `layout` (for packed: the valid boxes of every image, one
    after the other, gathered from the padded prediction)."""
    if layout == "padded":
        return {"pred": pred, "target": target}
    if layout == "lengths":
        return {"pred": pred, "target": target, "lengths": lengths}
    valid = torch.arange(N, device=pred.device)[None, :] < lengths[:, None]
    return {"pred": pred[valid], "target": target[valid], "offsets": offsets}


def reference_loss(pred, target, lengths):
    """The same loss in PyTorch, float64 (torchvision GIoU, eps 1e-7, intersection clamped)."""
    p, t = pred.double(), target.double()
    valid = torch.arange(N, device=p.device)[None, :] < lengths[:, None]
    p, t = p[valid], t[valid]
    eps = 1e-7
    ix1, iy1 = torch.max(p[:, 0], t[:, 0]), torch.max(p[:, 1], t[:, 1])
    ix2, iy2 = torch.min(p[:, 2], t[:, 2]), torch.min(p[:, 3], t[:, 3])
    inter = (ix2 - ix1).clamp(min=0) * (iy2 - iy1).clamp(min=0)
    a1 = (p[:, 2] - p[:, 0]) * (p[:, 3] - p[:, 1])
    a2 = (t[:, 2] - t[:, 0]) * (t[:, 3] - t[:, 1])
    union = a1 + a2 - inter
    iou = inter / (union + eps)
    cw = torch.max(p[:, 2], t[:, 2]) - torch.min(p[:, 0], t[:, 0])
    ch = torch.max(p[:, 3], t[:, 3]) - torch.min(p[:, 1], t[:, 1])
    areac = cw * ch
    giou = iou - (areac - union) / (areac + eps)
    return (1 - giou).sum() / max(int(valid.sum()), 1)


def torch_loss(pred, target, lengths):
    """The loss of the kfuse programs in plain PyTorch, in `pred`'s dtype (for ``--compile``): the
    mean of 1 - GIoU over the first `lengths[b]` boxes of each image."""
    eps = 1e-7
    valid = torch.arange(pred.shape[1], device=pred.device)[None, :] < lengths[:, None]
    x1, y1, x2, y2 = pred.unbind(-1)
    x1g, y1g, x2g, y2g = target.unbind(-1)
    inter = (torch.min(x2, x2g) - torch.max(x1, x1g)).clamp(min=0) * (torch.min(y2, y2g) - torch.max(y1, y1g)).clamp(min=0)
    union = (x2 - x1) * (y2 - y1) + (x2g - x1g) * (y2g - y1g) - inter
    iou = inter / (union + eps)
    area_c = (torch.max(x2, x2g) - torch.min(x1, x1g)) * (torch.max(y2, y2g) - torch.min(y1, y1g))
    per_box = 1 - (iou - (area_c - union) / (area_c + eps))
    zero = torch.zeros((), dtype=per_box.dtype, device=per_box.device)
    return torch.where(valid, per_box, zero).sum() / valid.sum().clamp(min=1)


class _HostTimer:
    """The CUDA event interface, on the host clock (for --cpu)."""

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def kernels_on(prof):
    """Where the kernels of a profile ran: the (device, stream) pairs of kfuse's kernels (named
    kf_*), and the stream that most of PyTorch's own compute kernels used (NCCL's excluded)."""
    kfuse_at, torch_streams = set(), {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if e.name.startswith("kf"):
            kfuse_at.add((e.device_index, e.device_resource_id))
        elif "nccl" not in e.name.lower() and "memcpy" not in e.name.lower() and "memset" not in e.name.lower():
            torch_streams[e.device_resource_id] = torch_streams.get(e.device_resource_id, 0) + 1
    main_stream = max(torch_streams, key=torch_streams.get) if torch_streams else None
    return kfuse_at, main_stream


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layout", choices=sorted(PROGRAMS), default="lengths")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--batch", type=int, default=32, help="images per process")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=20, help="timed steps after the checked one")
    ap.add_argument("--save", help="rank 0 writes the global loss and gradients here")
    ap.add_argument("--compare", help="compare the global loss and gradients with this file")
    ap.add_argument("--json", help="rank 0 writes its figures here (JSON)")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (gloo; kfuse's interpreter), for a quick check")
    ap.add_argument("--hidden", type=int, default=256 * 64, help="lin1's width (the seed's: 16384)")
    ap.add_argument("--compile", choices=["kfuse", "inductor"],
                    help="compile the DDP detector and the loss written in PyTorch with this torch.compile backend")
    args = ap.parse_args()

    dist.init_process_group("gloo" if args.cpu else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    if args.cpu:
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    failures = []

    t0 = time.perf_counter()
    program = None if args.compile else kfuse.load(ROOT / "examples" / PROGRAMS[args.layout])
    load_s = time.perf_counter() - t0

    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts them)
    with torch.device(device):  # initialised where it runs: the seed's detector has a billion parameters
        net = Net(args.hidden)
    model = nn.parallel.DistributedDataParallel(net, device_ids=None if args.cpu else [local])
    compiled_loss = None
    if args.compile:
        model = torch.compile(model, backend=args.compile)
        compiled_loss = torch.compile(torch_loss, backend=args.compile)
    images, target, lengths, offsets = batch(rank, args.batch, args.seed, device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    def sync():
        if not args.cpu:
            torch.cuda.synchronize(device)

    def timer():
        return _HostTimer() if args.cpu else torch.cuda.Event(enable_timing=True)

    def step(validate=False):
        model.zero_grad(set_to_none=True)
        with autocast:
            pred = model(images)
        tgt = target.to(pred.dtype)
        count = lengths.sum().to(torch.float32)
        total = count.clone()
        dist.all_reduce(total)
        loss_start, loss_end = timer(), timer()
        loss_start.record()
        if compiled_loss is not None:
            local_loss = compiled_loss(pred, tgt, lengths)
        else:
            # The first step checks the lengths / offsets values (a host synchronisation); later
            # steps use the same, already checked, values.
            local_loss = program(**loss_inputs(args.layout, pred, tgt, lengths, offsets), validate=validate).loss
        loss_end.record()
        # This rank's share of the global mean; DDP averages the ranks' gradients.
        loss = local_loss * (count * world / total.clamp(min=1)).to(local_loss.dtype)
        loss.backward()
        return pred, local_loss, loss, (loss_start, loss_end)

    # The first step: compile (cold or warm disk cache) and the checks.
    sync()
    t0 = time.perf_counter()
    activities = [] if args.cpu else [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        pred, local_loss, loss, _ = step(validate=True)
        sync()
    first_step_s = time.perf_counter() - t0 + load_s
    where, stream = kernels_on(prof) if not args.cpu else (set(), None)
    if not where and not args.cpu and args.compile != "inductor":
        failures.append("no kfuse kernel in the profile of the first step")
    for dev, kstream in where:
        if dev != local:
            failures.append(f"a kfuse kernel ran on device {dev}, expected {local}")
        if kstream != stream:
            failures.append(f"a kfuse kernel ran on stream {kstream}, PyTorch's step on stream {stream}")
    ref = reference_loss(pred.detach(), target, lengths)
    got = float(local_loss.detach())
    tol = 1e-5 if args.dtype == "f32" else 2e-2
    rel = abs(got - float(ref)) / max(abs(float(ref)), 1e-12)
    if not rel <= tol:
        failures.append(f"kfuse loss {got:.8g} vs PyTorch float64 {float(ref):.8g}: rel err {rel:.2e} > {tol:g}")
    global_loss = loss.detach().float().clone()
    dist.all_reduce(global_loss)
    global_loss /= world

    grads = {n: p.grad.detach().float() for n, p in model.module.named_parameters()}
    rows = torch.arange(0, grads["lin1.weight"].shape[0], 97)
    sampled = {n: (g[rows] if n == "lin1.weight" else g).cpu() for n, g in grads.items()}
    if args.save and rank == 0:
        torch.save({"loss": float(global_loss), "grads": sampled, "world": world}, args.save)
    if args.compare:
        other = torch.load(args.compare)
        dl = abs(other["loss"] - float(global_loss)) / max(abs(other["loss"]), 1e-12)
        gtol = 1e-3 if args.dtype == "f32" else 5e-2
        if not dl <= gtol:
            failures.append(f"global loss {float(global_loss):.8g} vs {other['loss']:.8g} ({other['world']} GPUs)")
        worst = max(
            float((sampled[n] - other["grads"][n]).norm() / other["grads"][n].norm().clamp(min=1e-30))
            for n in sampled
        )
        if not worst <= gtol:
            failures.append(f"parameter gradients differ from the {other['world']}-GPU run: rel err {worst:.2e}")
        print(f"rank {rank}: against the {other['world']}-GPU run: loss rel err {dl:.2e}, worst gradient rel err {worst:.2e}")

    # Timed steps: step time and the loss's own time (CUDA events around the kfuse call).
    step_ms, loss_ms = [], []
    for _ in range(args.steps):
        s, e = timer(), timer()
        s.record()
        _, _, _, (ls, le) = step()
        e.record()
        sync()
        step_ms.append(s.elapsed_time(e))
        loss_ms.append(ls.elapsed_time(le))
    figures = {
        "rank": rank,
        "world": world,
        "layout": "torch" if args.compile else args.layout,
        "compile": args.compile,
        "dtype": args.dtype,
        "batch_per_rank": args.batch,
        "device": "cpu" if args.cpu else torch.cuda.get_device_name(device),
        "kernels_on": sorted(where, key=str),
        "current_stream": stream,
        "loss": got,
        "loss_ref": float(ref),
        "global_loss": float(global_loss),
        "first_step_s": first_step_s,
        "step_ms_median": float(np.median(step_ms)) if step_ms else None,
        "loss_ms_median": float(np.median(loss_ms)) if loss_ms else None,
        "failures": failures,
    }
    if args.compile:
        from torch._dynamo.utils import counters

        figures["dynamo_graphs"] = counters["stats"]["unique_graphs"]
        if args.compile == "kfuse":
            from kfuse import _backend

            figures["kfuse_programs"] = _backend.stats["compiles"]
    print(json.dumps(figures), flush=True)
    gathered = [None] * world
    dist.all_gather_object(gathered, figures)
    if rank == 0 and args.json:
        Path(args.json).write_text(json.dumps(gathered, indent=1))
    dist.destroy_process_group()
    for f in failures:
        print(f"rank {rank}: FAILED: {f}", file=sys.stderr)
    # Leave without tearing down the DDP model: its reducer's gloo group can deadlock on the GIL
    # while the interpreter finalises (the step's work and output are complete here).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if failures else 0)


if __name__ == "__main__":
    main()
