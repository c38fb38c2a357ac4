#!/usr/bin/env python3
"""The `python` suite of bench/run: kfuse measured from PyTorch, as a PyTorch user measures it.

    python3 bench/python_suite.py --results DIR [--kfuse PATH] [--quick] [--work DIR]
    (bench/run calls it with --out DIR; --out and --results are the same option)

Needs a CUDA GPU, PyTorch with CUDA, NumPy, safetensors, the `kfuse` package and the `kfuse`
binary (--kfuse, else PATH, else target/release/kfuse). Every measurement is one JSON file in DIR:
{"schema", "suite", "name", "params", "device", "driver", "date", "time_utc", "commit", "command",
"figures"}. Measurements:

* giou--LAYOUT_DTYPE_BB: the GIoU loss forward + backward from PyTorch (`pred` requires grad,
  `out.loss.backward()`) in each layout (padded `examples/giou.kf`, lengths `giou_lengths.kf`,
  packed `giou_packed.kf`), f32 and bf16, B = 1024 and 16384 (N = 256, `kfuse gen boxes`: the
  seed's box counts), against PyTorch padded + mask eager and torch.compile of the same loss (its
  first call too) and the standalone `kfuse bench examples/giou_train*.kf` on the same batch.
  Times are medians of CUDA-event times around each call after warm-up, calls back to back.
* floor--giou_B1024: host time per eager call beside PyTorch's own floor, in one process, cases
  interleaved block by block, with autograd's device thread and with the backward on the calling
  thread: `torch.add` on 16 elements, an empty `autograd.Function` (forward `x.sum()`, backward
  expand), `(p * 2).sum().backward()`, kfuse's GIoU forward alone and forward + backward
  (`giou.kf` and `giou_lengths.kf`, validate=False and the default), torch.compile of the same loss;
  the ratios to the empty Function and to `torch.add` (targets: at most 1.1x and 1.5x).
* host--LAYOUT: host time of one eager call (time.perf_counter over 1000 calls, no
  synchronisation), forward only and forward + backward, at B = 1024, f32.
* first-call--PROGRAM_CACHE: the first call of a program in a new process, from before
  `kfuse.load` to the result on the host, with a warm disk cache and with a cold one; split into
  kfuse's share (`kfuse.load`, the call until it returns, the gradient scaling the backward
  launches) and PyTorch's (the rest: its allocations, autograd, the read-back); cold also with
  `KFUSE_FAST_COMPILE=max`. Targets: cold, the whole first forward + backward at most 200 ms;
  warm, kfuse's share at most 10 ms.
* mlp--MODEL: `kfuse.nn.FusedMLP` forward at 2^21 rows, fp16, on the three benchmark models of
  tools/bench_mlp_torch.py, against `kfuse mlp bench` on the same exported model and the PyTorch
  module itself.

Every measured result is checked against a float64 PyTorch reference (the relative errors are in
the JSON); a result outside its tolerance, or a measurement that fails, makes the exit status 1.
A markdown table of the headline figures is printed at the end.
"""
import argparse
import copy
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

# torch.compile's first call is timed: no compiled artefacts from an earlier run (set before torch loads).
os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from benchlib import cuda_times_us, exit_status, host_us, rel_err, run_meta, side_stream_warmup  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = 1
SUITE = "python"
N_SLOTS = 256
EPS = 1e-7
LAYOUTS = {
    # layout: (forward example, standalone training example, layout input, its gen-boxes file)
    "padded": ("giou", "giou_train", None, None),
    "lengths": ("giou_lengths", "giou_train_lengths", "lengths", "lengths.npy"),
    "packed": ("giou_packed", "giou_train_packed", "offsets", "offsets.npy"),
}
# Tolerances of the checks against float64: loss (relative), gradient (relative 2-norm).
TOL = {
    "f32": {"loss": 1e-4, "grad": 1e-3},
    "bf16": {"loss": 2e-2, "grad": 1e-1},
}
# PyTorch's own bf16 math rounds every intermediate to bf16; its baseline gets more room.
TORCH_BF16_TOL = {"loss": 5e-2, "grad": 3e-1}
MLP_TOL = 2e-2


# ---------------------------------------------------------------------------------------------
# Run metadata and results.


def find_kfuse(given):
    if given:
        return os.path.abspath(given) if os.sep in given else (shutil.which(given) or given)
    on_path = shutil.which("kfuse")
    if on_path:
        return on_path
    built = os.path.join(REPO, "target", "release", "kfuse")
    if os.access(built, os.X_OK):
        return built
    sys.exit("python_suite: no kfuse binary: put one on PATH, build target/release/kfuse, or pass --kfuse PATH")


class Suite:
    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.kfuse_bin = find_kfuse(args.kfuse)
        self.out = os.path.abspath(args.results)
        self.work = os.path.abspath(args.work)
        os.makedirs(self.out, exist_ok=True)
        os.makedirs(self.work, exist_ok=True)
        self.meta = run_meta()
        self.failures = []
        self.missed = []  # performance targets not met (reported, not failures)
        self.rows = []  # (section, name, headline text) for the markdown table
        self.command = "python3 bench/python_suite.py" + (" --quick" if self.quick else "")
        self.iters = 30 if self.quick else 200
        self.warmup = 10 if self.quick else 50
        self.host_calls = 200 if self.quick else 1000
        self.floor_calls, self.floor_rounds = (100, 5) if self.quick else (200, 15)

    def log(self, text):
        print(text, flush=True)

    def record(self, name, params, figures, command=None):
        entry = {"schema": SCHEMA, "suite": SUITE, "name": name, "params": params, **self.meta,
                 "command": command or self.command, "figures": figures}
        with open(os.path.join(self.out, f"{SUITE}--{name}.json"), "w") as f:
            json.dump(entry, f, indent=1)
            f.write("\n")

    def check(self, what, err, tol):
        """Records a failure when a relative error is above its tolerance (or not a number)."""
        ok = err == err and err <= tol
        if not ok:
            self.failures.append(f"{what}: rel err {err:.3g} > tolerance {tol:g}")
            self.log(f"   WRONG: {what}: rel err {err:.3g} > tolerance {tol:g}")
        return ok

    def target(self, name, figures, key, what, met):
        """Notes a performance target of the issue (met or not) in the figures; a missed target is
        reported at the end but is not a failure: only wrong results are."""
        figures.setdefault("targets", {})[f"{key}: {what}"] = bool(met)
        if not met:
            self.missed.append(f"{name} {key}: {what}")

    def sh(self, argv, env=None):
        """Runs a command (the kfuse binary for "kfuse"); returns its output, raises on failure."""
        argv = [self.kfuse_bin if a == "kfuse" else str(a) for a in argv]
        self.log("+ " + " ".join(shlex.quote(a if len(a) < 200 else a[:40] + "...") for a in argv))
        proc = subprocess.run(argv, cwd=REPO, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"exit status {proc.returncode}: {' '.join(argv)}\n{proc.stdout[-4000:]}")
        return proc.stdout

    def shown(self, argv):
        return " ".join(shlex.quote(str(a)) for a in argv).replace(self.work, "$WORK")

    def attempt(self, what, fn, *args):
        """Runs one measurement; an exception is a failure of the suite, not the end of the run."""
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 -- report it and go on with the next measurement
            self.failures.append(f"{what}: {traceback.format_exc().strip().splitlines()[-1]}")
            self.log(f"   FAILED: {what}\n{traceback.format_exc()}")


# ---------------------------------------------------------------------------------------------
# Timing as a PyTorch user does it.


def calling_thread_us(torch, step, suite):
    """`cuda_times_us` with the backward run on the calling thread
    (`torch.autograd.set_multithreading_enabled(False)`), not handed to autograd's device thread."""
    with torch.autograd.set_multithreading_enabled(False):
        return cuda_times_us(torch, step, suite.warmup, suite.iters)


def graph_replay_us(torch, step, pred, suite):
    """The training step captured into a CUDA graph (after warm-up on a side stream), then
    `cuda_times_us` of its replays: the step's GPU time without the host's part. Checks that a
    replay reproduces the eager gradient."""
    side_stream_warmup(torch, step)
    want = pred.grad.clone()
    pred.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    err = rel_err(torch, pred.grad, want)
    suite.check("cuda graph replay gradient", err, 1e-6 if pred.dtype == torch.float32 else 1e-2)
    times = cuda_times_us(torch, graph.replay, suite.warmup, suite.iters)
    pred.grad = None
    return {**times, "grad_rel_err_vs_eager": err}


# ---------------------------------------------------------------------------------------------
# The GIoU loss in torch: the baseline (padded + mask) and the float64 reference.


def giou_terms(pred, target):
    ix1 = torch.maximum(pred[..., 0], target[..., 0])
    iy1 = torch.maximum(pred[..., 1], target[..., 1])
    ix2 = torch.minimum(pred[..., 2], target[..., 2])
    iy2 = torch.minimum(pred[..., 3], target[..., 3])
    inter = (ix2 - ix1).clamp(min=0) * (iy2 - iy1).clamp(min=0)
    area1 = (pred[..., 2] - pred[..., 0]) * (pred[..., 3] - pred[..., 1])
    area2 = (target[..., 2] - target[..., 0]) * (target[..., 3] - target[..., 1])
    union = area1 + area2 - inter
    iou = inter / (union + EPS)
    cw = torch.maximum(pred[..., 2], target[..., 2]) - torch.minimum(pred[..., 0], target[..., 0])
    ch = torch.maximum(pred[..., 3], target[..., 3]) - torch.minimum(pred[..., 1], target[..., 1])
    areac = cw * ch
    return 1 - (iou - (areac - union) / (areac + EPS))


def torch_padded_loss(pred, target):
    """The seed's padded + mask loss: mean of 1 - GIoU over the boxes whose target y2 is not 0."""
    valid = target[..., 3] != 0
    per = torch.where(valid, giou_terms(pred, target), torch.zeros((), dtype=pred.dtype, device=pred.device))
    return per.sum() / valid.sum().clamp(min=1)


def torch_packed_loss(pred, target):
    return giou_terms(pred, target).sum() / max(pred.shape[0], 1)


# ---------------------------------------------------------------------------------------------
# Measurements.


def gen_boxes(suite, batch, dtype):
    folder = os.path.join(suite.work, "data", f"{batch}-{dtype}")
    if not os.path.exists(os.path.join(folder, "offsets.npy")):
        suite.sh(["kfuse", "gen", "boxes", "--batch", batch, "--max-boxes", N_SLOTS, "--out", folder, "--dtype", dtype])
    return folder


def example_at(suite, stem, dtype):
    """examples/STEM.kf for f32, else a copy with `f32[` read as `DTYPE[` (as bench/run's train suite)."""
    src = os.path.join(REPO, "examples", stem + ".kf")
    if dtype == "f32":
        return src
    dst = os.path.join(suite.work, dtype, stem + ".kf")
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(src) as f:
        text = f.read()
    with open(dst, "w") as f:
        f.write(text.replace("f32[", f"{dtype}["))
    return dst


def load_batch(torch, np, folder, dev):
    names = ["pred", "target", "lengths", "offsets", "pred_packed", "target_packed"]
    return {n: torch.from_numpy(np.load(os.path.join(folder, n + ".npy"))).to(dev) for n in names}


def standalone(suite, layout, dtype, batch):
    """`kfuse bench` of the training example of `layout` on the same batch (its own JSON)."""
    _, train_stem, layout_input, layout_file = LAYOUTS[layout]
    d = gen_boxes(suite, batch, dtype)
    p, t = ("pred_packed.npy", "target_packed.npy") if layout == "packed" else ("pred.npy", "target.npy")
    fig = os.path.join(suite.work, "standalone.json")
    if os.path.exists(fig):
        os.remove(fig)
    argv = ["kfuse", "bench", example_at(suite, train_stem, dtype), "--input", f"pred={d}/{p}",
            "--input", f"target={d}/{t}"]
    if layout_input:
        argv += ["--input", f"{layout_input}={d}/{layout_file}"]
    argv += ["--json", fig]
    suite.sh(argv)
    with open(fig) as f:
        rep = json.load(f)
    k = rep["kfuse"]
    return {
        "command": suite.shown(argv).replace(suite.kfuse_bin, "kfuse").replace(REPO + "/", ""),
        "b2b_us": k["back_to_back"]["median_us"],
        "rotated_us": k["rotated"]["median_us"],
        "flushed_us": k["l2_flushed"]["median_us"],
        "launches": k.get("launches"),
        "max_rel_err": k.get("max_rel_err"),
    }


def giou_case(suite, torch, np, dtype, batch):
    """One (dtype, B): the torch baselines once, then kfuse in each layout."""
    dev = torch.device("cuda", 0)
    tdt = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    x = load_batch(torch, np, gen_boxes(suite, batch, "f32"), dev)
    pred0, target = x["pred"].to(tdt), x["target"].to(tdt)
    pred0_packed, target_packed = x["pred_packed"].to(tdt), x["target_packed"].to(tdt)
    tol = TOL[dtype]

    # float64 references from the very values the measured calls see.
    ref_pred = pred0.double().requires_grad_()
    ref_loss = torch_padded_loss(ref_pred, target.double())
    (ref_grad,) = torch.autograd.grad(ref_loss, ref_pred)
    ref_pred_p = pred0_packed.double().requires_grad_()
    ref_loss_p = torch_packed_loss(ref_pred_p, target_packed.double())
    (ref_grad_p,) = torch.autograd.grad(ref_loss_p, ref_pred_p)

    def train_step(loss_fn, pred, tgt, **kw):
        def step():
            pred.grad = None
            loss = loss_fn(pred=pred, target=tgt, **kw)
            loss = loss.loss if hasattr(loss, "loss") else loss
            loss.backward()
            return loss

        return step

    def checked(what, step, pred, want_loss, want_grad, tols):
        loss = step()
        torch.cuda.synchronize()
        errs = {"loss_rel_err": rel_err(torch, loss, want_loss), "grad_rel_err": rel_err(torch, pred.grad, want_grad)}
        suite.check(f"{what} loss", errs["loss_rel_err"], tols["loss"])
        suite.check(f"{what} grad", errs["grad_rel_err"], tols["grad"])
        return errs

    # PyTorch padded + mask, eager.
    torch_tol = TORCH_BF16_TOL if dtype == "bf16" else tol
    pred = pred0.clone().requires_grad_()
    step = train_step(lambda pred, target: torch_padded_loss(pred, target), pred, target)
    eager = {**cuda_times_us(torch, step, suite.warmup, suite.iters),
             **checked(f"torch eager {dtype} B={batch}", step, pred, ref_loss, ref_grad, torch_tol)}

    # torch.compile of the same loss (default backend); its first call from a reset compiler.
    torch._dynamo.reset()
    compiled_loss = torch.compile(torch_padded_loss)
    pred = pred0.clone().requires_grad_()
    step = train_step(lambda pred, target: compiled_loss(pred, target), pred, target)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    compiled = {**cuda_times_us(torch, step, suite.warmup, suite.iters), "first_call_s": first_s,
                **checked(f"torch.compile {dtype} B={batch}", step, pred, ref_loss, ref_grad, torch_tol)}
    compiled_calling_thread = calling_thread_us(torch, step, suite)
    try:
        compiled_graph = graph_replay_us(torch, step, pred, suite)
    except Exception as e:  # noqa: BLE001 - reported in the results, the kfuse rows still run
        suite.log(f"torch.compile {dtype} B={batch} in a CUDA graph: {type(e).__name__}: {e}")
        compiled_graph = {"error": f"{type(e).__name__}: {e}"}

    import kfuse

    for layout, (stem, _, layout_input, _) in LAYOUTS.items():
        name = f"{layout}_{dtype}_B{batch}"
        params = {"layout": layout, "dtype": dtype, "B": batch, "N": N_SLOTS, "example": f"examples/{stem}.kf"}

        def measure(layout=layout, stem=stem, layout_input=layout_input, name=name, params=params):
            prog = kfuse.load(os.path.join(REPO, "examples", stem + ".kf"))
            if layout == "packed":
                pred, tgt = pred0_packed.clone().requires_grad_(), target_packed
                want_loss, want_grad = ref_loss_p, ref_grad_p
            else:
                pred, tgt, want_loss, want_grad = pred0.clone().requires_grad_(), target, ref_loss, ref_grad
            extra = {layout_input: x[layout_input]} if layout_input else {}
            figures = {"torch_eager": eager, "torch_compile": compiled}
            # The default call (validate=True checks lengths/offsets on the host) and, for the
            # ragged layouts, the call a CUDA graph would capture (validate=False).
            variants = [("kfuse", {})] + ([("kfuse_no_validate", {"validate": False})] if layout_input else [])
            for key, kw in variants:
                step = train_step(prog, pred, tgt, **extra, **kw)
                figures[key] = {**cuda_times_us(torch, step, suite.warmup, suite.iters),
                                **checked(f"kfuse {name} {key}", step, pred, want_loss, want_grad, tol)}
            last = variants[-1][1]
            step = train_step(prog, pred, tgt, **extra, **last)
            figures["kfuse_calling_thread"] = calling_thread_us(torch, step, suite)
            figures["torch_compile_calling_thread"] = compiled_calling_thread
            figures["kfuse_cuda_graph"] = graph_replay_us(torch, step, pred, suite)
            figures["torch_compile_cuda_graph"] = compiled_graph
            figures["standalone"] = standalone(suite, layout, dtype, batch)
            k = figures["kfuse"]["median_us"]
            best = min(figures[v]["median_us"] for v, _ in variants)
            figures["speedup_vs_torch_compile"] = compiled["median_us"] / k
            figures["speedup_vs_torch_eager"] = eager["median_us"] / k
            figures["ratio_to_standalone"] = k / figures["standalone"]["b2b_us"]
            figures["best_ratio_to_standalone"] = best / figures["standalone"]["b2b_us"]
            for key, _ in variants:
                t = figures[key]["median_us"]
                if batch == 1024:
                    suite.target(name, figures, key, "at most 30 us", t <= 30)
                    suite.target(name, figures, key, "at least 20x torch.compile", compiled["median_us"] / t >= 20)
                if batch == 16384:
                    ratio = t / figures["standalone"]["b2b_us"]
                    suite.target(name, figures, key, "within 1.3x of kfuse bench", ratio <= 1.3)
            suite.record(f"giou--{name}", params, figures)
            suite.rows.append(("giou", name, [
                f"{k:.1f}", f"{figures.get('kfuse_no_validate', {}).get('median_us', k):.1f}",
                f"{figures['standalone']['b2b_us']:.1f}", f"{figures['ratio_to_standalone']:.2f}",
                f"{eager['median_us']:.1f}", f"{compiled['median_us']:.1f}",
                f"{figures['speedup_vs_torch_compile']:.1f}x", f"{compiled['first_call_s']:.1f}",
                f"{figures['kfuse']['grad_rel_err']:.1e}"]))
            ct, cc = figures["kfuse_calling_thread"]["median_us"], compiled_calling_thread["median_us"]
            gk, gc = figures["kfuse_cuda_graph"]["median_us"], compiled_graph.get("median_us", float("nan"))
            suite.rows.append(("giou_modes", name, [
                f"{figures[variants[-1][0]]['median_us']:.1f}", f"{ct:.1f}", f"{cc:.1f}", f"{cc / ct:.1f}x",
                f"{gk:.1f}", f"{gc:.1f}", f"{gc / gk:.1f}x", f"{figures['standalone']['b2b_us']:.1f}",
                f"{gk / figures['standalone']['b2b_us']:.2f}"]))

        suite.attempt(f"giou {name}", measure)


def host_case(suite, torch, np):
    """Host time of one eager call at B = 1024, f32: 1000 calls, no synchronisation."""
    import kfuse

    dev = torch.device("cuda", 0)
    x = load_batch(torch, np, gen_boxes(suite, 1024, "f32"), dev)
    # The cost of one PyTorch eager op, the floor any eager call pays.
    a, b = torch.ones(4, device=dev), torch.ones(4, device=dev)
    floor_us = host_us(torch, lambda: a + b, suite.host_calls)
    for layout, (stem, _, layout_input, _) in LAYOUTS.items():

        def measure(layout=layout, stem=stem, layout_input=layout_input):
            prog = kfuse.load(os.path.join(REPO, "examples", stem + ".kf"))
            p, t = (x["pred_packed"], x["target_packed"]) if layout == "packed" else (x["pred"], x["target"])
            extra = {layout_input: x[layout_input]} if layout_input else {}
            pg = p.clone().requires_grad_()

            def fwd(**kw):
                return lambda: prog(pred=p, target=t, **extra, **kw)

            def fwd_bwd(**kw):
                def call():
                    pg.grad = None
                    prog(pred=pg, target=t, **extra, **kw).loss.backward()

                return call

            figures = {"calls": suite.host_calls, "torch_add_us": floor_us,
                       "forward_us": host_us(torch, fwd(), suite.host_calls),
                       "forward_backward_us": host_us(torch, fwd_bwd(), suite.host_calls)}
            if layout_input:
                figures["forward_no_validate_us"] = host_us(torch, fwd(validate=False), suite.host_calls)
                figures["forward_backward_no_validate_us"] = host_us(torch, fwd_bwd(validate=False), suite.host_calls)
            # The backward on the calling thread instead of autograd's device thread.
            with torch.autograd.set_multithreading_enabled(False):
                kw = {"validate": False} if layout_input else {}
                figures["forward_backward_calling_thread_us"] = host_us(torch, fwd_bwd(**kw), suite.host_calls)
            # The calls timed are the ones checked: the result of one more is compared.
            ref = p.double().requires_grad_()
            want = torch_packed_loss(ref, t.double()) if layout == "packed" else torch_padded_loss(ref, t.double())
            got = fwd()().loss
            figures["loss_rel_err"] = rel_err(torch, got, want)
            suite.check(f"host {layout} loss", figures["loss_rel_err"], TOL["f32"]["loss"])
            for key in ("forward_us", "forward_no_validate_us"):
                if key in figures:
                    suite.target(f"host {layout}", figures, key, "at most 15 us", figures[key] <= 15)
            suite.record(f"host--{layout}", {"layout": layout, "dtype": "f32", "B": 1024, "N": N_SLOTS,
                                             "example": f"examples/{stem}.kf"}, figures)
            suite.rows.append(("host", layout, [
                f"{figures['forward_us']:.1f}", f"{figures.get('forward_no_validate_us', figures['forward_us']):.1f}",
                f"{figures['forward_backward_us']:.1f}",
                f"{figures.get('forward_backward_no_validate_us', figures['forward_backward_us']):.1f}",
                f"{figures['forward_backward_calling_thread_us']:.1f}", f"{floor_us:.1f}"]))

        suite.attempt(f"host {layout}", measure)


def floor_case(suite, torch, np):
    """Host time per eager call beside PyTorch's own floor, in one process, at B = 1024, N = 256,
    f32: each case's calls are timed in blocks (time.perf_counter around `suite.floor_calls` calls
    back to back, no synchronisation inside a block), the cases interleaved block by block so that
    the host's drift reaches them all alike, in both threading modes (autograd's device thread, the
    default; and the backward on the calling thread). The figure per case is the best block (the
    host's own cost without interference) beside the median block."""
    import kfuse

    dev = torch.device("cuda", 0)
    x = load_batch(torch, np, gen_boxes(suite, 1024, "f32"), dev)
    pred, tgt, lengths = x["pred"].clone().requires_grad_(), x["target"], x["lengths"]
    pd = pred.detach()
    a16 = torch.ones(16, device=dev)
    shape = tuple(pred.shape)

    class Empty(torch.autograd.Function):
        """PyTorch's floor for a custom autograd.Function: forward = x.sum(), backward = expand."""

        @staticmethod
        def forward(ctx, p):
            return p.sum()

        @staticmethod
        def backward(ctx, up):
            return up.expand(shape)

    giou = kfuse.load(os.path.join(REPO, "examples", "giou.kf"))
    giou_len = kfuse.load(os.path.join(REPO, "examples", "giou_lengths.kf"))
    compiled = torch.compile(lambda p, t: torch_padded_loss(p, t))

    def step(loss_fn):
        def call():
            pred.grad = None
            loss_fn().backward()

        return call

    cases = {
        "torch_add": lambda: a16 + a16,
        "empty_function": step(lambda: Empty.apply(pred)),
        "torch_p2_sum": step(lambda: (pred * 2).sum()),
        "kfuse_giou_forward": lambda: giou(pred=pd, target=tgt),
        "kfuse_giou_lengths_forward": lambda: giou_len(pred=pd, target=tgt, lengths=lengths),
        "kfuse_giou_no_validate": step(lambda: giou(pred=pred, target=tgt, validate=False).loss),
        "kfuse_giou_lengths_no_validate": step(lambda: giou_len(pred=pred, target=tgt, lengths=lengths,
                                                                validate=False).loss),
        "kfuse_giou_lengths_default": step(lambda: giou_len(pred=pred, target=tgt, lengths=lengths).loss),
        "torch_compile": step(lambda: compiled(pred, tgt)),
    }
    modes = {"worker": True, "calling": False}  # torch.autograd.set_multithreading_enabled(...)
    blocks = {(c, m): [] for c in cases for m in modes}
    for f in cases.values():  # warm-up: compiles, loads, autograd's thread started
        for m in modes.values():
            with torch.autograd.set_multithreading_enabled(m):
                for _ in range(20):
                    f()
    torch.cuda.synchronize()
    for _ in range(suite.floor_rounds):
        for c, f in cases.items():
            for m, on in modes.items():
                with torch.autograd.set_multithreading_enabled(on):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(suite.floor_calls):
                        f()
                    blocks[(c, m)].append((time.perf_counter() - t0) * 1e6 / suite.floor_calls)
    torch.cuda.synchronize()
    best = {k: min(v) for k, v in blocks.items()}
    figures = {"calls_per_block": suite.floor_calls, "rounds": suite.floor_rounds, "B": 1024, "N": N_SLOTS}
    for (c, m), v in blocks.items():
        figures[f"{c}_{m}_best_us"] = best[(c, m)]
        figures[f"{c}_{m}_median_us"] = statistics.median(v)
    for m in modes:
        floor, add = best[("empty_function", m)], best[("torch_add", m)]
        for c in cases:
            figures[f"{c}_{m}_vs_empty_function"] = best[(c, m)] / floor
            figures[f"{c}_{m}_vs_torch_add"] = best[(c, m)] / add
        for c in ("kfuse_giou_no_validate", "kfuse_giou_lengths_no_validate", "kfuse_giou_lengths_default"):
            suite.target(f"floor {c} ({m} thread)", figures, f"{c}_{m}_vs_empty_function",
                         "at most 1.1x the empty autograd.Function", best[(c, m)] <= 1.1 * floor)
    for c in ("kfuse_giou_forward", "kfuse_giou_lengths_forward"):
        suite.target(f"floor {c}", figures, f"{c}_worker_vs_torch_add", "at most 1.5 torch.add",
                     best[(c, "worker")] <= 1.5 * best[("torch_add", "worker")])
    # The calls timed are the ones checked: the loss and gradient of one more against float64.
    ref = pred.detach().double().requires_grad_()
    want = torch_padded_loss(ref, tgt.double())
    want.backward()
    pred.grad = None
    got = giou(pred=pred, target=tgt).loss
    got.backward()
    figures["loss_rel_err"] = rel_err(torch, got, want)
    figures["grad_rel_err"] = rel_err(torch, pred.grad, ref.grad)
    suite.check("floor loss", figures["loss_rel_err"], TOL["f32"]["loss"])
    suite.check("floor gradient", figures["grad_rel_err"], TOL["f32"]["grad"])
    suite.record("floor--giou_B1024", {"B": 1024, "N": N_SLOTS, "dtype": "f32",
                                       "examples": ["examples/giou.kf", "examples/giou_lengths.kf"]}, figures)
    for c in cases:
        w, k = best[(c, "worker")], best[(c, "calling")]
        suite.rows.append(("floor", c, [
            f"{w:.1f}", f"{statistics.median(blocks[(c, 'worker')]):.1f}", f"{w / best[('empty_function', 'worker')]:.2f}",
            f"{k:.1f}", f"{statistics.median(blocks[(c, 'calling')]):.1f}",
            f"{k / best[('empty_function', 'calling')]:.2f}", f"{w / best[('torch_add', 'worker')]:.1f}"]))


FIRST_CALL = r"""
import json, os, sys, time
import numpy as np
import torch
path, folder, backward, warm_torch = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"
dev = torch.device("cuda", 0)
x = {n: torch.from_numpy(np.load(f"{folder}/{n}.npy")).to(dev) for n in ("pred", "target", "lengths")}
if warm_torch:
    # PyTorch's own first uses (its kernels load lazily; autograd starts its device thread), paid
    # as a training loop that has run a step before calling kfuse has paid them.
    w = x["pred"].clone().requires_grad_()
    (w * 2).sum().backward()
    float(w.grad.double().sum()); x["lengths"].cpu()
torch.cuda.synchronize()
t = time.perf_counter()
import kfuse
from kfuse import _autograd
import_ms = (time.perf_counter() - t) * 1e3
# kfuse's share of the backward: the gradient scaling it launches (timed around the call).
scale_ns = [0]
_scale = _autograd._scale_in_place
def _timed_scale(g, up):
    t = time.perf_counter_ns()
    _scale(g, up)
    scale_ns[0] += time.perf_counter_ns() - t
_autograd._scale_in_place = _timed_scale
t0 = time.perf_counter()
prog = kfuse.load(path)
load_ms = (time.perf_counter() - t0) * 1e3
pred = x["pred"].requires_grad_(backward)
t = time.perf_counter()
out = prog(pred=pred, target=x["target"], lengths=x["lengths"])
call_ms = (time.perf_counter() - t) * 1e3
loss = out.loss.item()
forward_ms = (time.perf_counter() - t0) * 1e3
if backward:
    out.loss.backward()
    grad_sum = float(pred.grad.double().sum())
first_ms = (time.perf_counter() - t0) * 1e3
kfuse_ms = load_ms + call_ms + scale_ns[0] / 1e6
t1 = time.perf_counter()
pred.grad = None
out = prog(pred=pred, target=x["target"], lengths=x["lengths"])
if backward:
    out.loss.backward()
    float(pred.grad.double().sum())
out.loss.item()
second_ms = (time.perf_counter() - t1) * 1e3
print("FIRST-CALL " + json.dumps({"first_ms": first_ms, "load_ms": load_ms, "to_loss_ms": forward_ms,
                                  "kfuse_ms": kfuse_ms, "torch_ms": first_ms - kfuse_ms,
                                  "second_ms": second_ms, "import_ms": import_ms, "loss": loss}))
"""


def first_call_case(suite, torch, np):
    """A new process: kfuse.load and the first result on the host, with a cold disk cache and a
    warm one, after PyTorch's own first uses (as in a training loop that has run a step); and with
    a warm disk cache in a process whose first CUDA work is kfuse's call (torch's first uses inside
    the timed region)."""
    folder = gen_boxes(suite, 1024, "f32")
    x = {n: torch.from_numpy(np.load(os.path.join(folder, n + ".npy"))) for n in ("pred", "target")}
    want = torch_padded_loss(x["pred"].double(), x["target"].double()).item()
    path = os.path.join(REPO, "examples", "giou_lengths.kf")
    reps = 1 if suite.quick else 3
    # phase: (cold kernel cache, torch's first uses before the timer, NVRTC's -Ofast-compile level);
    # each cold phase starts from an empty folder, and "cold", the last of them, fills it for the
    # warm ones (its process waits for the optimised kernels before it exits)
    phases = {"cold_fast_compile": (True, True, "max"), "cold": (True, True, None), "warm": (False, True, None),
              "warm_torch_first_use": (False, False, None)}
    for backward in (False, True):
        what = "forward_backward" if backward else "forward"

        def run_once(cache, cold, warm_torch, fast):
            env = {"KFUSE_CACHE_DIR": cache}
            if fast:
                env["KFUSE_FAST_COMPILE"] = fast
            if cold:
                env["CUDA_CACHE_DISABLE"] = "1"  # NVRTC's own cache off: the compile is really cold
            argv = [sys.executable, "-c", FIRST_CALL, path, folder, str(int(backward)), str(int(warm_torch))]
            out = suite.sh(argv, env=env)
            line = next(ln for ln in out.splitlines() if ln.startswith("FIRST-CALL "))
            got = json.loads(line[len("FIRST-CALL "):])
            err = abs(got["loss"] - want) / abs(want)
            suite.check(f"first call {what} loss", err, TOL["f32"]["loss"])
            got["loss_rel_err"] = err
            return got

        def measure(backward=backward, what=what, run_once=run_once):
            runs = {phase: [] for phase in phases}
            for k in range(reps):
                cache = os.path.join(suite.work, f"first-call-{what}-{k}")
                for phase, (cold, warm_torch, fast) in phases.items():
                    if cold:
                        # An empty folder for each cold phase: a process leaves its kernels on disk
                        # (the optimised builds, and the quick ones a fast-compile level would find).
                        shutil.rmtree(cache, ignore_errors=True)
                        os.makedirs(cache)
                    runs[phase].append(run_once(cache, cold, warm_torch, fast))
            for phase, got in runs.items():
                cold, warm_torch, fast = phases[phase]
                figures = {"first_ms_median": statistics.median(g["first_ms"] for g in got),
                           "kfuse_ms_median": statistics.median(g["kfuse_ms"] for g in got)}
                for key in ("first_ms", "load_ms", "to_loss_ms", "kfuse_ms", "torch_ms", "second_ms", "import_ms"):
                    figures[key] = [g[key] for g in got]
                figures["loss_rel_err"] = max(g["loss_rel_err"] for g in got)
                if cold:
                    # The whole first call, compiles included (NVRTC and the driver's caches off).
                    suite.target(f"first call {what} {phase}", figures, "first_ms_median", "at most 200 ms",
                                 figures["first_ms_median"] <= 200)
                elif warm_torch:
                    # kfuse's share (load, the call, the gradient scaling): PyTorch's first uses are its own.
                    suite.target(f"first call {what} {phase}", figures, "kfuse_ms_median",
                                 "kfuse's share at most 10 ms", figures["kfuse_ms_median"] <= 10)
                cmd = (("CUDA_CACHE_DISABLE=1 " if cold else "") + (f"KFUSE_FAST_COMPILE={fast} " if fast else "")
                       + f"KFUSE_CACHE_DIR=$WORK/first-call-{what}-K python3 -c <bench/python_suite.py FIRST_CALL> "
                       + f"examples/giou_lengths.kf $WORK/data/1024-f32 {int(backward)} {int(warm_torch)}")
                suite.record(f"first-call--{what}_{phase}", {"program": "examples/giou_lengths.kf", "B": 1024,
                                                             "backward": backward, "cache": "cold" if cold else "warm",
                                                             "torch_used_before": warm_torch, "processes": reps,
                                                             "fast_compile": fast},
                             figures, command=cmd)
                med = statistics.median
                suite.rows.append(("first", f"{what} {phase}", [
                    f"{figures['first_ms_median']:.1f}", f"{figures['kfuse_ms_median']:.1f}",
                    f"{med(figures['torch_ms']):.1f}", f"{med(figures['load_ms']):.2f}",
                    f"{med(figures['to_loss_ms']):.1f}", f"{med(figures['second_ms']):.2f}",
                    f"{med(figures['import_ms']):.0f}"]))

        suite.attempt(f"first call {what}", measure)


def mlp_models(torch):
    """The three benchmark models of tools/bench_mlp_torch.py, built the same way (seed 0)."""
    from torch import nn

    torch.manual_seed(0)
    return {
        "mlp64x4_relu": nn.Sequential(nn.Linear(64, 64, bias=False), nn.ReLU(), nn.Linear(64, 64, bias=False),
                                      nn.ReLU(), nn.Linear(64, 64, bias=False), nn.ReLU(),
                                      nn.Linear(64, 64, bias=False), nn.ReLU(), nn.Linear(64, 16, bias=False)),
        "mlp128x4_relu": nn.Sequential(nn.Linear(64, 128, bias=False), nn.ReLU(), nn.Linear(128, 128, bias=False),
                                       nn.ReLU(), nn.Linear(128, 128, bias=False), nn.ReLU(),
                                       nn.Linear(128, 128, bias=False), nn.ReLU(), nn.Linear(128, 16, bias=False)),
        "mlp_silu_bias": nn.Sequential(nn.Linear(32, 64), nn.SiLU(), nn.Linear(64, 128), nn.SiLU(), nn.Linear(128, 96),
                                       nn.SiLU(), nn.Linear(96, 64), nn.SiLU(), nn.Linear(64, 32), nn.SiLU(),
                                       nn.Linear(32, 16)),
    }


def wait_optimised(torch, fused, x, seconds):
    """Lets the tiered compile finish: the module's own wait when it has one, else calls for a while."""
    for owner in (fused, getattr(fused, "_native", None)):
        for name in ("wait_optimized", "wait_optimised"):
            if owner is not None and callable(getattr(owner, name, None)):
                getattr(owner, name)()
                return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        fused(x)
        torch.cuda.synchronize()


def mlp_case(suite, torch):
    import kfuse
    import kfuse.nn

    dev = torch.device("cuda", 0)
    rows = (1 << 18) if suite.quick else (1 << 21)
    for name, module in mlp_models(torch).items():

        def measure(name=name, module=module):
            folder = os.path.join(suite.work, "mlp-models")
            path = os.path.join(folder, f"{name}.json")
            kfuse.export_mlp(module, path, "f16")
            fig = os.path.join(suite.work, "mlp-standalone.json")
            if os.path.exists(fig):
                os.remove(fig)
            argv = ["kfuse", "mlp", "bench", path, "--batch", rows, "--json", fig]
            # The same kernel cache as this process (KFUSE_CACHE_DIR), so the package finds the
            # optimised kernel that the command compiled.
            suite.sh(argv)
            with open(fig) as f:
                cli = json.load(f)
            standalone_ms = cli["kernel_ms_median"]

            fused = kfuse.nn.FusedMLP.from_torch(module, dtype=torch.float16)
            torch_module = copy.deepcopy(module).to(dev, torch.float16)
            gen = torch.Generator(device=dev).manual_seed(11)
            x = torch.randn(rows, module[0].in_features, device=dev, dtype=torch.float16, generator=gen)
            with torch.inference_mode():
                wait_optimised(torch, fused, x, 1.0 if suite.quick else 3.0)
                fused_t = cuda_times_us(torch, lambda: fused(x), 5, 20 if suite.quick else 50)
                torch_t = cuda_times_us(torch, lambda: torch_module(x), 5, 20 if suite.quick else 50)
                # float64 on the f16 weights, on rows spread over the batch.
                ref_module = copy.deepcopy(module).to(dev, torch.float16).to(torch.float64)
                idx = torch.linspace(0, rows - 1, 4099, device=dev).long()
                y = fused(x)
                ref = ref_module(x[idx].double())
                fused_err = (y[idx].double() - ref).abs().max().item() / ref.abs().max().item()
                torch_err = (torch_module(x)[idx].double() - ref).abs().max().item() / ref.abs().max().item()
            suite.check(f"FusedMLP {name}", fused_err, MLP_TOL)
            suite.check(f"torch {name} fp16", torch_err, MLP_TOL)
            figures = {"fused_mlp": fused_t, "torch_eager": torch_t, "standalone_kernel_ms": standalone_ms,
                       "standalone_command": suite.shown(argv).replace(suite.kfuse_bin, "kfuse"),
                       "standalone_check": cli.get("check"),
                       "ratio_to_standalone": fused_t["median_us"] / (standalone_ms * 1e3),
                       "speedup_vs_torch_eager": torch_t["median_us"] / fused_t["median_us"],
                       "fused_rel_err": fused_err, "torch_rel_err": torch_err}
            suite.target(name, figures, "fused_mlp", "within 5% of kfuse mlp bench",
                         figures["ratio_to_standalone"] <= 1.05)
            suite.record(f"mlp--{name}", {"model": name, "rows": rows, "dtype": "f16"}, figures)
            suite.rows.append(("mlp", name, [f"{fused_t['median_us'] / 1e3:.3f}", f"{standalone_ms:.3f}",
                                             f"{figures['ratio_to_standalone']:.3f}",
                                             f"{torch_t['median_us'] / 1e3:.3f}", f"{fused_err:.1e}"]))

        suite.attempt(f"mlp {name}", measure)


# ---------------------------------------------------------------------------------------------
# The summary.

TABLES = {
    "giou": ("GIoU loss forward + backward from PyTorch (median µs per call, CUDA events)",
             ["case", "kfuse", "kfuse validate=False", "standalone b2b", "ratio", "torch eager", "torch.compile",
              "vs compile", "compile 1st call s", "grad rel err"]),
    "giou_modes": ("GIoU loss forward + backward, backward on the calling thread and in a CUDA graph (median µs per "
                   "call, CUDA events; validate=False)",
                   ["case", "kfuse", "kfuse, calling thread", "torch.compile, calling thread", "vs compile",
                    "kfuse CUDA graph", "torch.compile CUDA graph", "vs compile", "standalone b2b",
                    "graph / standalone"]),
    "floor": ("Host time per eager call beside PyTorch's floor, B=1024 f32 (µs per call, best and median block, "
              "cases interleaved in one process)",
              ["case", "autograd thread: best", "median", "vs empty Function", "calling thread: best", "median",
               "vs empty Function", "vs torch.add"]),
    "host": ("Host time per eager call, B=1024 f32 (µs, perf_counter over the calls, no sync)",
             ["layout", "fwd", "fwd validate=False", "fwd+bwd", "fwd+bwd validate=False",
              "fwd+bwd validate=False, calling thread", "torch a+b"]),
    "first": ("First call in a new process, giou_lengths.kf B=1024 (ms, kfuse.load to the result on the host)",
              ["call", "first", "kfuse's share", "PyTorch's share", "of which kfuse.load", "load to the loss on the host",
               "second", "import kfuse"]),
    "mlp": ("FusedMLP forward, fp16 (ms per call)",
            ["model", "FusedMLP", "kfuse mlp bench", "ratio", "torch eager", "rel err"]),
}


def print_tables(suite):
    print(f"\n## python suite: {suite.meta['device']}, driver {suite.meta['driver']}, {suite.meta['date']}, "
          f"commit {suite.meta['commit']}")
    for section, (title, header) in TABLES.items():
        rows = [r for r in suite.rows if r[0] == section]
        if not rows:
            continue
        print(f"\n### {title}\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for _, name, cells in rows:
            print("| " + " | ".join([name, *cells]) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", "--out", dest="results", required=True,
                    help="folder that receives one JSON file per measurement")
    ap.add_argument("--kfuse", help="the kfuse binary (default: PATH, then target/release/kfuse)")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "kfuse-bench-python"),
                    help="scratch folder: data, models, kernel caches")
    ap.add_argument("--quick", action="store_true", help="a short run: B=1024 only, fewer calls, 2^18 MLP rows")
    ap.add_argument("--only", nargs="*", choices=["giou", "floor", "host", "first-call", "mlp"],
                    help="run these parts only (default: all)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("python_suite: PyTorch sees no CUDA device; the suite needs one")
    suite = Suite(args)
    os.environ["KFUSE_CACHE_DIR"] = os.path.join(suite.work, "cache")
    parts = args.only or ["giou", "floor", "host", "first-call", "mlp"]
    suite.log(f"== python suite on {suite.meta['device']} (driver {suite.meta['driver']}), commit "
              f"{suite.meta['commit']}, torch {torch.__version__}, kfuse = {suite.kfuse_bin}")
    if "giou" in parts:
        for batch in ((1024,) if args.quick else (1024, 16384)):
            for dtype in ("f32", "bf16"):
                suite.attempt(f"giou {dtype} B={batch}", giou_case, suite, torch, np, dtype, batch)
    if "floor" in parts:
        suite.attempt("floor", floor_case, suite, torch, np)
    if "host" in parts:
        suite.attempt("host", host_case, suite, torch, np)
    if "first-call" in parts:
        suite.attempt("first call", first_call_case, suite, torch, np)
    if "mlp" in parts:
        suite.attempt("mlp", mlp_case, suite, torch)
    print_tables(suite)
    if suite.missed:
        print(f"\n{len(suite.missed)} performance targets not met:\n  " + "\n  ".join(suite.missed))
    return exit_status(suite.failures)


if __name__ == "__main__":
    sys.exit(main())
