#!/usr/bin/env python3
"""The `backend` suite of bench/run: `torch.compile(fn, backend="kfuse")` beside
`torch.compile(fn)` (Inductor, default mode) on the same plain-PyTorch functions, each case and
backend in fresh processes.

    python3 bench/backend_suite.py --out DIR [--only CASE-PREFIX...] [--full] [--shard K/N] [--backends kfuse]
    python3 bench/backend_suite.py --smoke --out DIR     tiny sizes on the CPU: checks the logic

Cases (a training step: the forward and `torch.autograd.grad` of every float input, f32 unless
named): the torchvision box losses `generalized_box_iou_loss`, `distance_box_iou_loss`,
`complete_box_iou_loss` written in plain torch over a padded batch [B, 256, 4] with the seed's
validity mask (a target whose y2 is 0 is padding; mean over the valid boxes), at B = 16384 (and
1024 for GIoU); `F.layer_norm` and `F.rms_norm` (with their weight gradients; upstream gradient
random) at [8192, 1024] f32 and [8192, 4096] bf16; `F.cross_entropy` with int64 labels
(`ignore_index=-100`, `label_smoothing=0.1`) at C = 1000 and 32000 (B x C = 2^26); torchvision's
`sigmoid_focal_loss` (mean) at [262144, 80]. `--full` adds every size of the core suite for
the norms (D = 64, 256, 1024, 4096, f32 and bf16) and cross-entropy (C = 16, 1000, 32000, 128256),
and the box losses at B = 1024.

Per case and backend, a fresh process on fresh cache folders (KFUSE_CACHE_DIR,
TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR; CUDA_CACHE_DISABLE=1) measures, after its imports:
the first call (forward + backward to the gradients on the host: the compile, "cold"); the
results against eager (max relative error of the output and each gradient); the step's GPU time
replayed from a CUDA graph and, not captured, by CUDA events around each call; host time per
call (time.perf_counter over 50 calls, no synchronisation; the best of 7 such blocks); for
kfuse, `kfuse.explain`'s regions and fallbacks (a case with no fused region falls back entirely). For the first size of
each function also a first call at half the batch (the compile a new batch size costs: kfuse's
NVRTC compiles and programs built, Inductor's kernels generated, Dynamo's graphs), and a second
process on the same folders times the first call again ("warm"). A step slower than a second is
timed a few times and not captured. With `--kernels`, each CUDA-graph step is also replayed
under `torch.profiler` and its kernels' GPU time per step is listed (where the time goes, kernel by
kernel, beside Inductor's). Exit status 1 when a result is wrong or a process failed.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchlib import REPO, cuda_times_us, exit_status, host_us, max_rel_err, run_meta, side_stream_warmup, write_result

SUITE = "backend"
TOL = {"f32": 1e-3, "bf16": 3e-2}  # max relative error against eager in the same dtype
BACKENDS = ("kfuse", "inductor")
SLOW_S = 1.0  # a step slower than this (seconds) is not captured in a CUDA graph
BUDGET_S = 3.0  # timed steps per measurement: at most about this long (seconds)
N_SLOTS = 256
EPS = 1e-7


# ---------------------------------------------------------------------------------------------
# The functions, in plain torch (imported by the child processes only).


def box_terms(pred, target):
    """Coordinates, intersection and union as torchvision's `_loss_inter_union` (the
    intersection with clamp instead of its boolean-mask assignment: the same values)."""
    import torch

    x1, y1, x2, y2 = pred.unbind(-1)
    x1g, y1g, x2g, y2g = target.unbind(-1)
    inter = (torch.min(x2, x2g) - torch.max(x1, x1g)).clamp(min=0) * (torch.min(y2, y2g) - torch.max(y1, y1g)).clamp(min=0)
    union = (x2 - x1) * (y2 - y1) + (x2g - x1g) * (y2g - y1g) - inter
    return (x1, y1, x2, y2), (x1g, y1g, x2g, y2g), inter, union


def masked_mean(per_box, target):
    """The seed's padded loss: the mean over the boxes whose target y2 is not 0."""
    import torch

    valid = target[..., 3] != 0
    return torch.where(valid, per_box, torch.zeros((), dtype=per_box.dtype, device=per_box.device)).sum() / valid.sum().clamp(min=1)


def giou_loss(pred, target):
    import torch

    (x1, y1, x2, y2), (x1g, y1g, x2g, y2g), inter, union = box_terms(pred, target)
    iou = inter / (union + EPS)
    area_c = (torch.max(x2, x2g) - torch.min(x1, x1g)) * (torch.max(y2, y2g) - torch.min(y1, y1g))
    return masked_mean(1 - (iou - (area_c - union) / (area_c + EPS)), target)


def _diou_terms(pred, target):
    import torch

    (x1, y1, x2, y2), (x1g, y1g, x2g, y2g), inter, union = box_terms(pred, target)
    iou = inter / (union + EPS)
    diag = (torch.max(x2, x2g) - torch.min(x1, x1g)) ** 2 + (torch.max(y2, y2g) - torch.min(y1, y1g)) ** 2 + EPS
    centers = ((x1 + x2) / 2 - (x1g + x2g) / 2) ** 2 + ((y1 + y2) / 2 - (y1g + y2g) / 2) ** 2
    return 1 - iou + centers / diag, iou


def diou_loss(pred, target):
    return masked_mean(_diou_terms(pred, target)[0], target)


def ciou_loss(pred, target):
    import torch

    loss, iou = _diou_terms(pred, target)
    w, h = pred[..., 2] - pred[..., 0], pred[..., 3] - pred[..., 1]
    wg, hg = target[..., 2] - target[..., 0], target[..., 3] - target[..., 1]
    v = (4 / math.pi**2) * torch.pow(torch.atan(wg / hg) - torch.atan(w / h), 2)
    with torch.no_grad():
        alpha = v / (1 - iou + v + EPS)
    return masked_mean(loss + alpha * v, target)


def layer_norm(x, w, b):
    import torch.nn.functional as F

    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def rms_norm(x, w):
    import torch.nn.functional as F

    return F.rms_norm(x, (x.shape[-1],), w, eps=1e-6)


def cross_entropy(logits, labels):
    import torch.nn.functional as F

    return F.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.1)


def sigmoid_focal_loss(inputs, targets, alpha=0.25, gamma=2.0):
    """torchvision.ops.sigmoid_focal_loss, reduction="mean"."""
    import torch
    import torch.nn.functional as F

    p = torch.sigmoid(inputs)
    ce = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce * ((1 - p_t) ** gamma)
    alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
    return (alpha_t * loss).mean()


# ---------------------------------------------------------------------------------------------
# Inputs.


def boxes(torch, dev, batch, gen):
    """A padded batch like the seed's: image b holds lengths[b] of N boxes; a padding slot's
    target is (0, -1, 1, 0) (y2 = 0 marks it; a finite box, so no NaN reaches a gradient)."""
    lengths = torch.randint(0, N_SLOTS + 1, (batch,), device=dev, generator=gen)
    valid = torch.arange(N_SLOTS, device=dev)[None, :] < lengths[:, None]
    xy = 10 * torch.rand(batch, N_SLOTS, 2, device=dev, generator=gen)
    target = torch.cat([xy, xy + 1 + 5 * torch.rand(batch, N_SLOTS, 2, device=dev, generator=gen)], -1)
    pad = torch.tensor([0.0, -1.0, 1.0, 0.0], device=dev)
    target = torch.where(valid[..., None], target, pad)
    pred = target + 0.3 * torch.randn(batch, N_SLOTS, 4, device=dev, generator=gen)
    pred[..., 2:] = torch.maximum(pred[..., 2:], pred[..., :2] + 0.1)  # positive widths and heights
    return pred, target


def make_inputs(torch, case, dev, batch):
    """(inputs, indices of the inputs to differentiate, upstream gradient or None)."""
    gen = torch.Generator(device=dev).manual_seed(batch)
    dt = {"f32": torch.float32, "bf16": torch.bfloat16}[case["dtype"]]
    kind = case["fn"]
    if kind in ("giou_loss", "diou_loss", "ciou_loss"):
        pred, target = boxes(torch, dev, batch, gen)
        return [pred.to(dt), target.to(dt)], [0], None
    if kind in ("layer_norm", "rms_norm"):
        d = case["dim"]
        x = torch.randn(batch, d, device=dev, dtype=dt, generator=gen)
        w = 1 + 0.1 * torch.randn(d, device=dev, dtype=dt, generator=gen)
        b = 0.1 * torch.randn(d, device=dev, dtype=dt, generator=gen)
        dy = torch.randn(batch, d, device=dev, dtype=dt, generator=gen)
        return ([x, w, b], [0, 1, 2], dy) if kind == "layer_norm" else ([x, w], [0, 1], dy)
    if kind == "cross_entropy":
        c = case["dim"]
        logits = 2 * torch.randn(batch, c, device=dev, dtype=dt, generator=gen)
        labels = torch.randint(0, c, (batch,), device=dev, generator=gen)
        labels[torch.rand(batch, device=dev, generator=gen) < 1 / 16] = -100
        return [logits, labels], [0], None
    if kind == "sigmoid_focal_loss":
        logits = torch.randn(batch, case["dim"], device=dev, dtype=dt, generator=gen)
        targets = (torch.rand(batch, case["dim"], device=dev, generator=gen) < 0.05).to(dt)
        return [logits, targets], [0], None
    raise ValueError(f"unknown function {kind}")


FUNCTIONS = {f.__name__: f for f in (giou_loss, diou_loss, ciou_loss, layer_norm, rms_norm, cross_entropy, sigmoid_focal_loss)}


def cases(smoke, full):
    """The cases: name, function, batch (the leading axis), dim, dtype, and whether the warm first
    call is measured (the first size of each function)."""
    out = []

    def add(fn, batch, dim=None, dtype="f32"):
        name = f"{fn}_{dtype}_B{batch}" + (f"_D{dim}" if dim else "")
        warm = not any(c["fn"] == fn for c in out)
        out.append({"name": name, "fn": fn, "batch": batch, "dim": dim, "dtype": dtype, "warm": warm})

    if smoke:
        for fn in ("giou_loss", "diou_loss", "ciou_loss"):
            add(fn, 4)
        add("layer_norm", 16, 32)
        add("rms_norm", 16, 32, "bf16")
        add("cross_entropy", 64, 16)
        add("sigmoid_focal_loss", 64, 8)
        return out
    for fn in ("giou_loss", "diou_loss", "ciou_loss"):
        for b in ((16384, 1024) if full or fn == "giou_loss" else (16384,)):
            add(fn, b)
    norms = [(d, dt) for dt in ("f32", "bf16") for d in (64, 256, 1024, 4096)] if full else [(1024, "f32"), (4096, "bf16")]
    for fn in ("layer_norm", "rms_norm"):
        for d, dt in norms:
            add(fn, 8192, d, dt)
    for c in ((16, 1000, 32000, 128256) if full else (1000, 32000)):
        add("cross_entropy", (1 << 26) // c, c)
    add("sigmoid_focal_loss", 262144, 80)
    return out


# ---------------------------------------------------------------------------------------------
# One case and backend, in its own process.


def child(args):
    """Measures one case with one backend (`--child`); writes its figures as JSON to --json."""
    import torch

    cpu = args.smoke
    if args.backend == "kfuse":
        import kfuse
        import kfuse._backend  # noqa: F401 -- an import, kept out of the timed first call
    else:
        import torch._inductor.compile_fx  # noqa: F401
    import torch._dynamo  # noqa: F401

    case = json.loads(args.child)
    dev = torch.device("cpu") if cpu else torch.device("cuda", 0)
    fn = FUNCTIONS[case["fn"]]
    compiled = torch.compile(fn, backend="kfuse") if args.backend == "kfuse" else torch.compile(fn)

    def sync():
        if not cpu:
            torch.cuda.synchronize()

    def step_of(f, inputs, wrt, upstream):
        leaves = [inputs[i].requires_grad_() for i in wrt]

        def step():
            out = f(*inputs)
            return (out, *torch.autograd.grad(out, leaves, upstream))

        return step

    inputs, wrt, upstream = make_inputs(torch, case, dev, case["batch"])
    step = step_of(compiled, inputs, wrt, upstream)
    sync()
    t0 = time.perf_counter()
    got = step()
    sync()
    figures = {"first_call_s": time.perf_counter() - t0}
    if args.phase == "warm":
        return figures

    want = step_of(fn, inputs, wrt, upstream)()
    names = ["out"] + [f"grad_{i}" for i in wrt]
    figures["max_rel_err"] = {n: max_rel_err(g, e) for n, g, e in zip(names, got, want)}
    del got, want
    # At most about BUDGET_S of timed calls (fewer for a slow step); a step slower than SLOW_S is
    # timed a few times, not captured.
    step()
    sync()
    t0 = time.perf_counter()
    step()
    sync()
    one = time.perf_counter() - t0
    iters = max(3, min(5 if cpu else 100, int(BUDGET_S / one)))
    warmup = min(2 if cpu else 10, iters)
    figures["step"] = cuda_times_us(torch, step, warmup, iters, cpu=cpu)
    if cpu:
        figures["cuda_graph"] = {"skipped": "no CUDA graph on the CPU"}
    elif one > SLOW_S:
        figures["cuda_graph"] = {"too_slow": f"one step took {one:.3g} s (the limit is {SLOW_S:g} s)"}
    else:
        figures["cuda_graph"] = graph_times(torch, step, warmup, iters, args.kernels)
    slow = cpu or one > SLOW_S
    figures["host_us_per_call"] = host_us(torch, step, 5 if slow else 50, cpu=cpu, warmup=2 if slow else 20,
                                          blocks=1 if slow else 7)

    # A new batch size: what its first call compiles (for the first size of each function).
    small, wrt_s, up_s = make_inputs(torch, case, dev, max(1, case["batch"] // 2))
    if case["warm"]:
        before = counters(torch, args.backend)
        t0 = time.perf_counter()
        step_of(compiled, small, wrt_s, up_s)()
        sync()
        figures["new_batch"] = {"batch": max(1, case["batch"] // 2), "first_call_s": time.perf_counter() - t0,
                                **{k: v - before[k] for k, v in counters(torch, args.backend).items()}}
    if args.backend == "kfuse":
        report = kfuse.explain(fn, *[t.detach().requires_grad_(i in wrt_s) for i, t in enumerate(small)])
        figures["explain"] = {
            "regions": [{"graph": k.graph, "ops": len(k.ops), "cuda_kernels": k.kernels} for k in report.kernels],
            "fallbacks": [{"graph": f.graph, "op": f.op, "reason": f.reason[:300]} for f in report.fallbacks][:40],
            "fallback_count": len(report.fallbacks),
            "falls_back_entirely": not report.kernels,
        }
    return figures


def counters(torch, backend):
    """Compile counters of this process: kfuse's NVRTC compiles and programs built, or Inductor's
    generated kernels; Dynamo's graphs for both."""
    from torch._dynamo.utils import counters as dyn

    out = {"dynamo_graphs": dyn["stats"]["unique_graphs"]}
    if backend == "kfuse":
        import kfuse
        from kfuse import _backend

        info = kfuse.cache_info()
        out.update(nvrtc_compiles=info["compiles"], disk_hits=info["disk_hits"], programs_built=_backend.stats["compiles"])
    else:
        from torch._inductor import metrics

        out["inductor_kernels"] = metrics.generated_kernel_count
    return out


def graph_times(torch, step, warmup, iters, kernels=False):
    """The step captured into a CUDA graph (after warm-up on a side stream), its replays timed;
    with `kernels`, also each kernel's GPU time per replay (`kernel_times`)."""
    try:
        side_stream_warmup(torch, step)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        times = cuda_times_us(torch, graph.replay, warmup, iters)
        if kernels:
            times["kernels"] = kernel_times(torch, graph.replay)
        return times
    except Exception as e:  # noqa: BLE001 -- recorded in the figures
        return {"error": f"{type(e).__name__}: {e}"[:2000]}


def kernel_times(torch, run, reps=20):
    """`[name, µs per call, launches per call]` of every kernel (and copy or fill) that `reps` calls
    of `run` put on the GPU, by torch.profiler (CUPTI), slowest first."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    rows = [[e.key[:90], e.self_device_time_total / reps, e.count / reps]
            for e in prof.key_averages() if e.self_device_time_total > 0]
    return sorted(rows, key=lambda r: -r[1])


# ---------------------------------------------------------------------------------------------
# The driver: standard library only, a process per case, backend and cache state.


def run_child(args, case, backend, phase, caches, log):
    fig = os.path.join(args.work, f"{case['name']}-{backend}-{phase}.json")
    if os.path.exists(fig):
        os.remove(fig)
    env = {**os.environ, "KFUSE_CACHE_DIR": os.path.join(caches, "kfuse"),
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(caches, "inductor"), "TRITON_CACHE_DIR": os.path.join(caches, "triton")}
    if phase == "cold":
        env["CUDA_CACHE_DISABLE"] = "1"
    argv = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(case), "--backend", backend,
            "--phase", phase, "--json", fig] + (["--smoke"] if args.smoke else []) + (["--kernels"] if args.kernels else [])
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log(f"   {backend} {phase}: exit {proc.returncode}, {time.perf_counter() - t0:.1f} s")
    if proc.returncode != 0 or not os.path.exists(fig):
        tail = proc.stdout[-3000:]
        log(tail)
        return {"error": f"exit status {proc.returncode}: " + tail.strip().splitlines()[-1] if tail.strip() else "no output"}
    with open(fig) as f:
        return json.load(f)


def run_case(args, case, meta, failures, rows, log):
    figures = {}
    for backend in args.backends:
        caches = os.path.join(args.work, "caches", f"{case['name']}-{backend}")
        shutil.rmtree(caches, ignore_errors=True)
        os.makedirs(caches)
        got = run_child(args, case, backend, "cold", caches, log)
        if "error" not in got and case["warm"]:
            warm = run_child(args, case, backend, "warm", caches, log)
            got["warm_first_call_s"] = warm.get("first_call_s", warm.get("error"))
        if "error" in got:
            failures.append(f"{case['name']} {backend}: {got['error']}")
        for out, err in got.get("max_rel_err", {}).items():
            tol = TOL[case["dtype"]]
            if not (err == err and err <= tol):
                failures.append(f"{case['name']} {backend} {out}: max rel err {err:.3g} > {tol:g}")
                log(f"   WRONG: {backend} {out}: max rel err {err:.3g} > {tol:g}")
        figures[backend] = got
    k, i = figures.get("kfuse", {}), figures.get("inductor", {})

    def ratio(key, sub="median_us"):
        a, b = k.get(key, {}), i.get(key, {})
        if isinstance(a, dict) and isinstance(b, dict) and sub in a and sub in b:
            return a[sub] / b[sub]
        return None

    figures["ratio_kfuse_inductor_graph"] = ratio("cuda_graph")
    figures["ratio_kfuse_inductor_step"] = ratio("step")
    for key in ("first_call_s", "warm_first_call_s", "host_us_per_call"):
        if isinstance(k.get(key), float) and isinstance(i.get(key), float):
            figures[f"ratio_kfuse_inductor_{key}"] = k[key] / i[key]
    figures["falls_back_entirely"] = k.get("explain", {}).get("falls_back_entirely")
    params = {key: case[key] for key in ("fn", "batch", "dim", "dtype") if case[key] is not None}
    params["slots"] = N_SLOTS if case["fn"].endswith("iou_loss") else None
    command = f"python3 bench/backend_suite.py --only {case['name']}" + (" --smoke" if args.smoke else "")
    write_result(args.results, meta, SUITE, case["name"], {k: v for k, v in params.items() if v is not None}, figures,
                 command)
    rows.append((case["name"], figures))


def table(rows, meta):
    print(f"\n## backend suite: {meta['device']}, driver {meta['driver']}, {meta['date']}, commit {meta['commit']}\n")
    head = ["case", "kfuse graph µs", "inductor graph µs", "kfuse/inductor", "kfuse 1st call s (cold, warm)",
            "inductor 1st call s (cold, warm)", "host µs kfuse", "host µs inductor", "new batch: kfuse compiles",
            "inductor kernels", "kfuse err", "fallback"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name, f in rows:
        k, i = f.get("kfuse", {}), f.get("inductor", {})

        def g(d, key="cuda_graph"):
            v = d.get(key, {})
            return f"{v['median_us']:.1f}" if isinstance(v, dict) and "median_us" in v else "–"

        def num(v, fmt):
            return format(v, fmt) if isinstance(v, (int, float)) else "–"
        r = f.get("ratio_kfuse_inductor_graph")
        err = max(k.get("max_rel_err", {}).values(), default=None)
        nb_k, nb_i = k.get("new_batch", {}), i.get("new_batch", {})
        fb = {True: "entirely", False: "no", None: "–"}[f.get("falls_back_entirely")]
        print(f"| {name} | {g(k)} | {g(i)} | {num(r, '.2f')} | {num(k.get('first_call_s'), '.2f')}, "
              f"{num(k.get('warm_first_call_s'), '.2f')} | {num(i.get('first_call_s'), '.2f')}, "
              f"{num(i.get('warm_first_call_s'), '.2f')} | {num(k.get('host_us_per_call'), '.1f')} | "
              f"{num(i.get('host_us_per_call'), '.1f')} | {num(nb_k.get('nvrtc_compiles'), 'd')} | "
              f"{num(nb_i.get('inductor_kernels'), 'd')} | {num(err, '.1e')} | {fb} |")


def kernel_table(rows):
    """Each case's CUDA-graph step kernel by kernel, kfuse's then Inductor's (`--kernels`)."""
    for name, f in rows:
        print(f"\n### {name}: GPU time per step, kernel by kernel (torch.profiler over graph replays)\n")
        for backend in BACKENDS:
            if backend not in f:
                continue
            graph = f[backend].get("cuda_graph", {})
            listed = graph.get("kernels") if isinstance(graph, dict) else None
            if not listed:
                print(f"- {backend}: no kernel list ({graph.get('error') or graph.get('too_slow') or graph.get('skipped') or 'not captured'})")
                continue
            total = sum(us for _, us, _ in listed)
            print(f"- {backend}: {total:.1f} µs in {sum(n for _, _, n in listed):g} launches")
            for kname, us, n in listed:
                print(f"  - {us:8.1f} µs  x{n:g}  {kname}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", "--out", dest="results", help="folder for the JSON files")
    ap.add_argument("--kfuse", help="ignored (bench/run passes its kfuse binary to every script suite)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU: checks the logic")
    ap.add_argument("--full", action="store_true", help="every size of the core suite (takes longer)")
    ap.add_argument("--only", nargs="+", metavar="PREFIX", help="cases whose name starts with one of these")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "kfuse-bench-backend"),
                    help="scratch folder: cache folders, child figures")
    ap.add_argument("--shard", metavar="K/N", help="only every N-th case from the K-th (1-based): the suite in N runs")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS),
                    help="the backends to run (default both; one alone gives no ratios, e.g. to compare two kfuse builds)")
    ap.add_argument("--kernels", action="store_true", help="also list each CUDA-graph step's kernels (torch.profiler)")
    # A child process: one case, one backend.
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--backend", choices=BACKENDS, help=argparse.SUPPRESS)
    ap.add_argument("--phase", choices=("cold", "warm"), help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        figures = child(args)
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
        # The figures are written: skip the interpreter's teardown (Inductor's compile workers,
        # the CUDA context), which nothing measures and which took seconds a process.
        sys.stdout.flush()
        os._exit(0)
    selected = [c for c in cases(args.smoke, args.full) if not args.only or any(c["name"].startswith(p) for p in args.only)]
    if args.shard:
        try:
            k, n = (int(v) for v in args.shard.split("/"))
        except ValueError:
            k = n = 0
        if not 1 <= k <= n:
            ap.error(f"--shard {args.shard}: expected K/N with 1 <= K <= N (e.g. 1/2)")
        # Interleaved: each run gets a share of every function's sizes. A case's warm first call
        # stays where `cases` put it (the first size of its function).
        selected = selected[k - 1::n]
    if args.list:
        for c in selected:
            print(c["name"] + ("  (+ warm first call)" if c["warm"] else ""))
        return 0
    if not args.results:
        ap.error("--out DIR is required")
    args.results = os.path.abspath(args.results)
    args.work = os.path.abspath(args.work)
    os.makedirs(args.work, exist_ok=True)
    meta = run_meta()
    failures, rows = [], []

    def log(text):
        print(text, flush=True)

    log(f"== backend suite on {meta['device']}, commit {meta['commit']}: {len(selected)} cases")
    for case in selected:
        log(f"-- {case['name']}")
        run_case(args, case, meta, failures, rows, log)
    table(rows, meta)
    if args.kernels:
        kernel_table(rows)
    return exit_status(failures)


if __name__ == "__main__":
    sys.exit(main())
