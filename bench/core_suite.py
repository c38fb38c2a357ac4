#!/usr/bin/env python3
"""The `core` suite of bench/run: kfuse's fused kernels on the workloads people fuse (norms,
cross-entropy, a biased GELU), each beside PyTorch eager and torch.compile (Inductor, default
mode) of the same function, measured in one process.

    python3 bench/core_suite.py --out DIR [--only GROUP...] [--dtypes f32 bf16] [--no-compile]
    python3 bench/core_suite.py --smoke --out DIR     tiny sizes on the CPU: checks the logic

Rows (GROUP: rows):

* layer_norm, rms_norm: forward (`fwd`) and forward + backward with the weight gradients
  (`fwd_bwd`: `torch.autograd.grad(y, (x, w[, b]), dy)`), f32 and bf16, at [8192, D] for
  D = 64, 256, 1024, 4096 (`F.layer_norm` eps 1e-5, `F.rms_norm` eps 1e-6).
* cross_entropy: softmax cross-entropy (mean, `ignore_index=-100`, `label_smoothing=0.1`,
  int64 labels with 1/16 of them ignored) forward + backward w.r.t. the logits, at B x C = 2^26
  for C = 16, 1000, 32000, 128256, f32 and bf16 logits.
* gelu_bias: GELU(x + bias) (erf form) forward + backward with the bias gradient, [16384, 4096] bf16.
* views: inputs that are views which are not contiguous: layer norm forward + backward of a
  transposed x (copied by the package, its last axis not dense) and of x sliced from wider rows
  ([8192, 1024] f32), GELU + bias forward + backward of sliced x ([16384, 4096] bf16), the
  slices read in place. These rows also time `kfuse_copy`, kfuse on `x.contiguous()`
  (`ratio_kfuse_kfuse_copy`).

The kfuse side of each row is `.kf` source in this file, called through the `kfuse` package as a
user calls a program (autograd derives the backward). A row may list several forms, the first
that compiles and runs is measured (cross-entropy: int64 labels with `gather`, int64 labels
compared with each column's index (`iota`), int32 labels with `gather`, then one-hot targets in the logits' dtype; `params.kfuse_form` says which). A row that kfuse
cannot compile or run is recorded with kfuse's error message (`figures.kfuse.unsupported`) and
its PyTorch baselines; the suite goes on.

Every result (output and each gradient) is compared with eager's before timing (max relative
error: max |got - eager| / max |eager|, in `figures.max_rel_err`). Times: medians of CUDA-event
times around each call, the three implementations interleaved in rounds, back to back ("b2b")
and with the L2 cache flushed before each call ("flushed"); `pct_copy` is the bytes that must
move (`figures.bytes`) over the time, as a percentage of a device-to-device `copy_` measured in
the same run. `ratio_kfuse_eager` and `ratio_kfuse_inductor` are time ratios (below 1: kfuse is
faster). Exit status 1 when a result is wrong (outside its tolerance) or a measurement failed.
"""
import argparse
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from benchlib import copy_bandwidth, exit_status, interleaved_us, l2_flusher, max_rel_err, run_meta, write_result

SUITE = "core"
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
TOL = {"f32": 1e-3, "bf16": 3e-2}  # max relative error against eager in the same dtype
GROUPS = ("layer_norm", "rms_norm", "cross_entropy", "gelu_bias", "views")
PROBE_FRACTION = 64  # kfuse runs first at 1/64 of the rows,
SLOW_S = 1.0  # and not in full when one call would take longer than this (seconds)
BUDGET_S = 3.0  # timed calls per implementation and row: at most about this long (seconds)

# ---------------------------------------------------------------------------------------------
# The kfuse programs. Inputs are declared f32; a call with bf16 tensors runs the program typed at bf16.

LAYER_NORM = """
input x: f32[N, D]
input w: f32[D]
input b: f32[D]
let mu = mean(x, axis: -1)
let xc = x - mu[.., None]
let rstd = rsqrt(mean(xc * xc, axis: -1) + 1e-5)
output y = xc * rstd[.., None] * w + b
"""

RMS_NORM = """
input x: f32[N, D]
input w: f32[D]
let rstd = rsqrt(mean(x * x, axis: -1) + 1e-6)
output y = x * rstd[.., None] * w
"""

GELU_BIAS = """
input x: f32[N, D]
input bias: f32[D]
let z = x + bias
output y = 0.5 * z * (1 + erf(z * 0.7071067811865476))
"""

# log_softmax along the rows; the loss is torch's with label_smoothing=0.1 and ignore_index=-100:
# per kept row 0.9 * nll + 0.1 * (-mean of log_probs), averaged over the kept rows.
_LOG_SOFTMAX = """
input logits: f32[B, C]
let log_probs = log_softmax(logits, axis: -1)
let smooth = -mean(log_probs, axis: -1)
"""

XENT_LABELS = _LOG_SOFTMAX + """
input labels: {int}[B]
let valid = labels != -100
let nll = -sum(gather(log_probs, where(valid, labels, 0)[.., None], axis: -1), axis: -1)
output loss = sum(0.9 * nll + 0.1 * smooth, where: valid) / max(count(valid), 1)
"""

# The same with the label's column picked by comparing each column's index with the label.
XENT_IOTA = _LOG_SOFTMAX + """
input labels: i64[B]
let valid = labels != -100
let nll = -sum(where(iota(logits, axis: -1) == labels[.., None], log_probs, 0.0), axis: -1)
output loss = sum(0.9 * nll + 0.1 * smooth, where: valid) / max(count(valid), 1)
"""

XENT_ONE_HOT = _LOG_SOFTMAX + """
input onehot: f32[B, C]    # the label's one-hot row; all zero for an ignored label
let valid = sum(onehot, axis: -1) > 0
let nll = -sum(onehot * log_probs, axis: -1)
output loss = sum(0.9 * nll + 0.1 * smooth, where: valid) / max(count(valid), 1)
"""


# ---------------------------------------------------------------------------------------------
# The rows.


class Row:
    """One measurement: `make(device, rows)` builds the Workload (`rows` of the leading axis, None
    for the row's own); `params` go into the JSON."""

    def __init__(self, group, name, params, make):
        self.group, self.name, self.params, self.make = group, name, params, make


class Workload:
    """Tensors and functions of one row.

    inputs: the torch function's arguments (leaves `wrt` require grad); fn: the plain torch
    function; upstream: the gradient fed to the backward (None for a scalar loss or a forward
    row); forms: (name, kfuse source, adapt) in order of preference, where adapt(inputs) gives the
    program's inputs by name (the same tensors where the program takes them as they are); nbytes:
    the bytes that must move."""

    def __init__(self, inputs, fn, wrt, upstream, forms, nbytes):
        self.inputs, self.fn, self.wrt, self.upstream, self.forms, self.nbytes = inputs, fn, wrt, upstream, forms, nbytes

    def leaves(self):
        return [self.inputs[i] for i in self.wrt]


def nbytes_of(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def must_move(inputs, out, grads, upstream):
    """The bytes a forward (+ backward) must move: the forward reads the inputs and writes its
    output; a backward reads the inputs again and the upstream gradient and writes the gradients.
    A scalar loss with its gradients is one pass: the inputs read once, the gradients written."""
    if not grads:
        return nbytes_of(*inputs, out)
    if upstream is None:
        return nbytes_of(*inputs, *grads)
    return 2 * nbytes_of(*inputs) + nbytes_of(out, upstream, *grads)


def norm_rows(kind, rows, dims, dtypes):
    for dt in dtypes:
        for d in dims:
            for mode in ("fwd", "fwd_bwd"):
                params = {"workload": kind, "mode": mode, "dtype": dt, "shape": [rows, d],
                          "torch": "F.layer_norm(x, (D,), w, b, eps=1e-5)" if kind == "layer_norm"
                          else "F.rms_norm(x, (D,), w, eps=1e-6)"}

                def make(dev, n=None, kind=kind, d=d, dt=dt, mode=mode):
                    g = torch.Generator(device=dev).manual_seed(d)
                    x = torch.randn(n or rows, d, device=dev, dtype=DTYPES[dt], generator=g)
                    w = 1 + 0.1 * torch.randn(d, device=dev, dtype=DTYPES[dt], generator=g)
                    b = 0.1 * torch.randn(d, device=dev, dtype=DTYPES[dt], generator=g)
                    if kind == "layer_norm":
                        inputs, src = [x, w, b], LAYER_NORM

                        def fn(x, w, b):
                            return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)
                    else:
                        inputs, src = [x, w], RMS_NORM

                        def fn(x, w):
                            return F.rms_norm(x, (x.shape[-1],), w, eps=1e-6)
                    names = ["x", "w", "b"][: len(inputs)]
                    return workload(inputs, fn, mode, [("rows", src, lambda ts: dict(zip(names, ts)))], g)

                yield Row(kind, f"{kind}_{mode}_{dt}_D{d}", params, make)


def workload(inputs, fn, mode, forms, gen):
    """A Workload of a function with one non-scalar output, forward or forward + backward with
    respect to every input."""
    wrt = list(range(len(inputs))) if mode == "fwd_bwd" else []
    for i in wrt:
        inputs[i].requires_grad_()
    with torch.no_grad():
        out = fn(*inputs)
    upstream = torch.randn(out.shape, device=out.device, dtype=out.dtype, generator=gen) if wrt else None
    nbytes = must_move(inputs, out, [inputs[i] for i in wrt], upstream)
    return Workload(inputs, fn, wrt, upstream, forms, nbytes)


def xent_rows(total, classes, dtypes):
    for dt in dtypes:
        for c in classes:
            b = total // c
            params = {"workload": "cross_entropy", "mode": "fwd_bwd", "dtype": dt, "shape": [b, c],
                      "torch": "F.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.1), int64 labels",
                      "ignored_fraction": 1 / 16}

            def make(dev, n=None, b=b, c=c, dt=dt):
                b = n or b
                g = torch.Generator(device=dev).manual_seed(c)
                logits = (2 * torch.randn(b, c, device=dev, dtype=DTYPES[dt], generator=g)).requires_grad_()
                labels = torch.randint(0, c, (b,), device=dev, generator=g)
                labels[torch.rand(b, device=dev, generator=g) < 1 / 16] = -100

                def fn(logits, labels):
                    return F.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.1)

                def one_hot(ts):
                    lg, lb = ts
                    oh = F.one_hot(lb.clamp(min=0), lg.shape[-1]).to(lg.dtype) * (lb >= 0).to(lg.dtype)[:, None]
                    return {"logits": lg, "onehot": oh}

                forms = [("int64 labels, gather", XENT_LABELS.format(int="i64"), lambda ts: dict(logits=ts[0], labels=ts[1])),
                         ("int64 labels, iota one-hot", XENT_IOTA, lambda ts: dict(logits=ts[0], labels=ts[1])),
                         ("int32 labels, gather", XENT_LABELS.format(int="i32"),
                          lambda ts: dict(logits=ts[0], labels=ts[1].to(torch.int32))),
                         ("one-hot targets in the logits' dtype", XENT_ONE_HOT, one_hot)]
                # One pass: the logits and labels read once, the logits' gradient written.
                nbytes = nbytes_of(logits, labels, logits)
                return Workload([logits, labels], fn, [0], None, forms, nbytes)

            yield Row("cross_entropy", f"cross_entropy_fwd_bwd_{dt}_C{c}", params, make)


def gelu_rows(shape):
    params = {"workload": "gelu_bias", "mode": "fwd_bwd", "dtype": "bf16", "shape": list(shape),
              "torch": "F.gelu(x + bias)"}

    def make(dev, n=None):
        g = torch.Generator(device=dev).manual_seed(7)
        x = torch.randn(n or shape[0], shape[1], device=dev, dtype=torch.bfloat16, generator=g)
        bias = 0.1 * torch.randn(shape[-1], device=dev, dtype=torch.bfloat16, generator=g)

        def fn(x, bias):
            return F.gelu(x + bias)

        return workload([x, bias], fn, "fwd_bwd", [("rows", GELU_BIAS, lambda ts: dict(x=ts[0], bias=ts[1]))], g)

    yield Row("gelu_bias", f"gelu_bias_fwd_bwd_bf16_{shape[0]}x{shape[1]}", params, make)


def view_rows(smoke):
    """Inputs that are views which are not contiguous: layer norm of a transposed x (which the
    package copies: its last axis is not dense) and of x sliced from wider rows, GELU + bias of
    sliced x (both read in place). `kfuse_copy` is kfuse on `x.contiguous()` (what a call did
    before views were read in place)."""
    n, d = (16, 32) if smoke else (8192, 1024)
    params = {"workload": "layer_norm", "mode": "fwd_bwd", "dtype": "f32", "shape": [n, d],
              "view": "x transposed (x = base.t(), base [D, N])", "torch": "F.layer_norm(x, (D,), w, b, eps=1e-5)"}

    def make_ln(dev, rows=None):
        g = torch.Generator(device=dev).manual_seed(d)
        x = torch.randn(d, rows or n, device=dev, generator=g).t()
        w = 1 + 0.1 * torch.randn(d, device=dev, generator=g)
        b = 0.1 * torch.randn(d, device=dev, generator=g)

        def fn(x, w, b):
            return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)
        return workload([x, w, b], fn, "fwd_bwd", [("rows", LAYER_NORM, lambda ts: dict(zip("xwb", ts)))], g)

    yield Row("views", f"layer_norm_fwd_bwd_f32_D{d}_transposed", params, make_ln)
    params = {**params, "view": "x sliced (x = base[:, 64:], base [N, D + 64])"}

    def make_ln_sliced(dev, rows=None):
        g = torch.Generator(device=dev).manual_seed(d)
        x = torch.randn(rows or n, d + 64, device=dev, generator=g)[:, 64:]
        w = 1 + 0.1 * torch.randn(d, device=dev, generator=g)
        b = 0.1 * torch.randn(d, device=dev, generator=g)

        def fn(x, w, b):
            return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)
        return workload([x, w, b], fn, "fwd_bwd", [("rows", LAYER_NORM, lambda ts: dict(zip("xwb", ts)))], g)

    yield Row("views", f"layer_norm_fwd_bwd_f32_D{d}_sliced", params, make_ln_sliced)
    n, d = (32, 64) if smoke else (16384, 4096)
    params = {"workload": "gelu_bias", "mode": "fwd_bwd", "dtype": "bf16", "shape": [n, d],
              "view": "x sliced (x = base[:, 64:], base [N, D + 64])", "torch": "F.gelu(x + bias)"}

    def make_gelu(dev, rows=None):
        g = torch.Generator(device=dev).manual_seed(7)
        x = torch.randn(rows or n, d + 64, device=dev, dtype=torch.bfloat16, generator=g)[:, 64:]
        bias = 0.1 * torch.randn(d, device=dev, dtype=torch.bfloat16, generator=g)

        def fn(x, bias):
            return F.gelu(x + bias)
        return workload([x, bias], fn, "fwd_bwd", [("rows", GELU_BIAS, lambda ts: dict(x=ts[0], bias=ts[1]))], g)

    yield Row("views", f"gelu_bias_fwd_bwd_bf16_{n}x{d}_sliced", params, make_gelu)


def all_rows(smoke, groups, dtypes):
    if smoke:
        norm, dims, xent_total, classes, gelu = 16, (32,), 1 << 10, (16,), (32, 64)
    else:
        norm, dims, xent_total, classes, gelu = 8192, (64, 256, 1024, 4096), 1 << 26, (16, 1000, 32000, 128256), (16384, 4096)
    rows = []
    if "layer_norm" in groups:
        rows += norm_rows("layer_norm", norm, dims, dtypes)
    if "rms_norm" in groups:
        rows += norm_rows("rms_norm", norm, dims, dtypes)
    if "cross_entropy" in groups:
        rows += xent_rows(xent_total, classes, dtypes)
    if "gelu_bias" in groups and "bf16" in dtypes:
        rows += gelu_rows(gelu)
    if "views" in groups:
        rows += view_rows(smoke)
    return rows


# ---------------------------------------------------------------------------------------------
# Measuring one row.


def step_of(call, w):
    """The timed step: the forward, and the backward of the row's leaves when it has any."""
    leaves = w.leaves()
    if not leaves:
        return call

    def step():
        return torch.autograd.grad(call(), leaves, w.upstream)

    return step


def results_of(call, w):
    """The output and the gradients of one call, detached, in order."""
    out = call()
    grads = torch.autograd.grad(out, w.leaves(), w.upstream) if w.wrt else ()
    return [out.detach(), *grads]


def out_names(w):
    return ["out"] + [f"grad_{i}" for i in w.wrt]


def errors(got, want, w):
    return {n: max_rel_err(g, e) for n, g, e in zip(out_names(w), got, want)}


def kfuse_call(w, log):
    """The first form of the row that kfuse compiles and runs: (form, call, first-call seconds,
    results, tried, extra) or Nones when none does; `tried` lists the forms that failed (with
    kfuse's error), `extra` the bytes of the form's inputs that the row's inputs are not."""
    import kfuse

    tried = []
    for form, src, adapt in w.forms:
        try:
            t0 = time.perf_counter()
            prog = kfuse.compile(src, name=form)
            kin = adapt(w.inputs)

            def call(prog=prog, kin=kin):
                return prog(**kin)[0]

            got = results_of(call, w)
            sync(w.inputs[0].device)
            first_s = time.perf_counter() - t0
            # What this form moves, when its inputs are not the row's (one-hot targets for labels).
            ids = {id(t) for t in w.inputs}
            extra = nbytes_of(*[t for t in kin.values() if id(t) not in ids])

            def copied(prog=prog, kin=kin):  # the same call on contiguous copies of the inputs
                return prog(**{k: v.contiguous() for k, v in kin.items()})[0]

            call.copied = copied
            return form, call, first_s, got, tried, extra
        except Exception as e:  # noqa: BLE001 -- an unsupported form: recorded, the next is tried
            msg = f"{type(e).__name__}: {e}".strip()
            log(f"   kfuse form '{form}': {msg.splitlines()[0][:300]}")
            tried.append({"form": form, "error": msg})
    return None, None, None, None, tried, 0


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure_row(suite, row, copy):
    dev = suite.device
    dt = row.params["dtype"]
    w = row.make(dev)
    params = {**row.params, "bytes": w.nbytes}
    figures = {"bytes": w.nbytes, "copy": copy, "max_rel_err": {}, "tolerance": TOL[dt]}
    eager_call = lambda: w.fn(*w.inputs)  # noqa: E731
    want = results_of(eager_call, w)
    calls = {"eager": eager_call}

    if suite.args.no_compile:
        figures["inductor"] = {"skipped": "--no-compile"}
    else:
        torch._dynamo.reset()
        compiled = torch.compile(w.fn)
        ind_call = lambda: compiled(*w.inputs)  # noqa: E731
        try:
            t0 = time.perf_counter()
            got = results_of(ind_call, w)
            sync(dev)
            figures["inductor_first_call_s"] = time.perf_counter() - t0
            figures["max_rel_err"]["inductor"] = errors(got, want, w)
            suite.check(f"{row.name} inductor", figures["max_rel_err"]["inductor"], TOL[dt])
            calls["inductor"] = ind_call
        except Exception as e:  # noqa: BLE001 -- recorded; the other implementations still run
            figures["inductor"] = {"error": f"{type(e).__name__}: {e}"}
            suite.failures.append(f"{row.name}: torch.compile failed: {type(e).__name__}")

    # kfuse at 1/64 of the rows first (it compiles there): a form whose full-size call would take
    # longer than SLOW_S (a row kernel that is quadratic in the row length) is not run in full.
    small_rows = max(1, row.params["shape"][0] // PROBE_FRACTION)
    small = row.make(dev, small_rows)
    form, kcall, first_s, _, tried, _ = kfuse_call(small, suite.log)
    if kcall is not None:
        small_s = call_seconds(step_of(kcall, small), dev)
        estimate = small_s * row.params["shape"][0] / small_rows
        figures["kfuse_probe"] = {"rows": small_rows, "call_s": small_s, "full_call_estimate_s": estimate,
                                  "first_call_s": first_s}
        if estimate > SLOW_S:
            kcall = None
            figures["kfuse"] = {"too_slow": f"one call at {small_rows} rows took {small_s:.3g} s: about "
                                            f"{estimate:.3g} s at the row's size (the limit is {SLOW_S:g} s)"}
            suite.log(f"   kfuse: {figures['kfuse']['too_slow']}")
    del small
    if kcall is not None:
        form, kcall, first_s, got, tried, extra = kfuse_call(w, suite.log)
        if extra:
            figures["kfuse_form_extra_bytes"] = extra
    params["kfuse_form"] = form
    if tried:
        figures["kfuse_forms_failed"] = tried
    if kcall is None:
        figures.setdefault("kfuse", {"unsupported": tried[-1]["error"] if tried else "no kfuse form"})
    else:
        figures["kfuse_first_call_s"] = first_s
        figures["max_rel_err"]["kfuse"] = errors(got, want, w)
        if not suite.check(f"{row.name} kfuse", figures["max_rel_err"]["kfuse"], TOL[dt]):
            figures["kfuse_wrong"] = True
        calls["kfuse"] = kcall
        if row.params.get("view"):
            got = results_of(kcall.copied, w)
            figures["max_rel_err"]["kfuse_copy"] = errors(got, want, w)
            suite.check(f"{row.name} kfuse_copy", figures["max_rel_err"]["kfuse_copy"], TOL[dt])
            calls["kfuse_copy"] = kcall.copied
    got = want = None  # their memory back before timing

    steps = {name: step_of(c, w) for name, c in calls.items()}
    a = suite.args
    # At most about BUDGET_S of timed calls per implementation (fewer calls for a slow one).
    slowest = max(call_seconds(s, dev) for s in steps.values())
    iters = max(a.rounds, min(a.iters, int(BUDGET_S / slowest)))
    flushed_iters = max(a.rounds, min(a.flushed_iters, iters // 2))
    b2b = interleaved_us(torch, steps, min(a.warmup, iters), iters, a.rounds, cpu=suite.cpu)
    flushed = interleaved_us(torch, steps, 2, flushed_iters, a.rounds, cpu=suite.cpu, before=suite.flush)
    for name in steps:
        figures[name] = {"b2b": b2b[name], "flushed": flushed[name],
                         "pct_copy_b2b": pct_copy(w.nbytes, b2b[name]["median_us"], copy),
                         "pct_copy_flushed": pct_copy(w.nbytes, flushed[name]["median_us"], copy)}
    for other in ("eager", "inductor", "kfuse_copy"):
        if "kfuse" in steps and other in steps:
            figures[f"ratio_kfuse_{other}"] = b2b["kfuse"]["median_us"] / b2b[other]["median_us"]
            figures[f"ratio_kfuse_{other}_flushed"] = flushed["kfuse"]["median_us"] / flushed[other]["median_us"]
    suite.record(row, params, figures)


def call_seconds(fn, dev):
    """The time of one call (after one more that warms it up), to the device's finish."""
    fn()
    sync(dev)
    t0 = time.perf_counter()
    fn()
    sync(dev)
    return time.perf_counter() - t0


def pct_copy(nbytes, us, copy):
    return 100.0 * nbytes / (us * 1e-6) / (copy["gb_per_s"] * 1e9)


# ---------------------------------------------------------------------------------------------
# The run.


class Suite:
    def __init__(self, args):
        self.args = args
        self.cpu = args.smoke
        self.device = torch.device("cpu") if self.cpu else torch.device("cuda", 0)
        self.flush = l2_flusher(torch, self.device)
        self.out = os.path.abspath(args.results)
        self.meta = run_meta()
        self.failures = []
        self.rows = []
        self.command = "python3 bench/core_suite.py" + "".join(
            f" {flag}" for flag, on in (("--smoke", args.smoke), ("--no-compile", args.no_compile)) if on)

    def log(self, text):
        print(text, flush=True)

    def check(self, what, errs, tol):
        bad = {k: v for k, v in errs.items() if not (v == v and v <= tol)}
        for k, v in bad.items():
            self.failures.append(f"{what} {k}: max rel err {v:.3g} > {tol:g}")
            self.log(f"   WRONG: {what} {k}: max rel err {v:.3g} > {tol:g}")
        return not bad

    def record(self, row, params, figures):
        write_result(self.out, self.meta, SUITE, row.name, params, figures, self.command)
        self.rows.append((row.name, params, figures))


def table(suite):
    print(f"\n## core suite: {suite.meta['device']}, driver {suite.meta['driver']}, {suite.meta['date']}, "
          f"commit {suite.meta['commit']}, torch {torch.__version__}\n")
    head = ["row", "MB", "eager µs", "inductor µs", "kfuse µs", "% copy eager", "% copy inductor", "% copy kfuse",
            "kfuse/eager", "kfuse/inductor", "kfuse err"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name, params, f in suite.rows:
        def t(k):
            return f"{f[k]['b2b']['median_us']:.1f}" if "b2b" in f.get(k, {}) else "–"

        def p(k):
            return f"{f[k]['pct_copy_b2b']:.0f}" if "b2b" in f.get(k, {}) else "–"

        def r(k):
            return f"{f[k]:.2f}" if k in f else "–"
        kf = next((k.replace("_", " ") for k in ("unsupported", "too_slow") if k in f.get("kfuse", {})), t("kfuse"))
        err = max(f["max_rel_err"].get("kfuse", {}).values(), default=None)
        print(f"| {name} | {f['bytes'] / 1e6:.1f} | {t('eager')} | {t('inductor')} | {kf} | {p('eager')} | "
              f"{p('inductor')} | {p('kfuse')} | {r('ratio_kfuse_eager')} | {r('ratio_kfuse_inductor')} | "
              f"{'–' if err is None else f'{err:.1e}'} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", "--out", dest="results", required=True, help="folder for the JSON files")
    ap.add_argument("--kfuse", help="ignored (bench/run passes its kfuse binary to every script suite)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, time.perf_counter: checks the logic")
    ap.add_argument("--only", nargs="+", choices=GROUPS, default=list(GROUPS), help="these groups of rows only")
    ap.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    ap.add_argument("--iters", type=int, help="timed calls per implementation, back to back (default 200; smoke 8)")
    ap.add_argument("--flushed-iters", type=int, help="timed calls with the L2 flushed (default 60; smoke 4)")
    ap.add_argument("--rounds", type=int, default=4, help="interleaving rounds (default 4)")
    args = ap.parse_args()
    args.iters = args.iters or (8 if args.smoke else 200)
    args.flushed_iters = args.flushed_iters or (4 if args.smoke else 60)
    args.warmup = 2 if args.smoke else 20
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("core_suite: PyTorch sees no CUDA device (--smoke runs tiny sizes on the CPU)")
    suite = Suite(args)
    os.makedirs(suite.out, exist_ok=True)
    copy = copy_bandwidth(torch, suite.device, (8 << 20) if args.smoke else (1 << 30), 3 if args.smoke else 10,
                          5 if args.smoke else 50, cpu=suite.cpu)
    suite.log(f"== core suite on {suite.meta['device']}, torch {torch.__version__}; copy_ of "
              f"{copy['bytes'] / 2**21:.0f} MiB: {copy['gb_per_s']:.0f} GB/s")
    for row in all_rows(args.smoke, args.only, args.dtypes):
        suite.log(f"-- {row.name}")
        t0 = time.perf_counter()
        try:
            measure_row(suite, row, copy)
        except Exception:  # noqa: BLE001 -- the next row still runs
            suite.failures.append(f"{row.name}: {traceback.format_exc().strip().splitlines()[-1]}")
            suite.log(f"   FAILED: {row.name}\n{traceback.format_exc()}")
        if not suite.cpu:
            torch.cuda.empty_cache()
        suite.log(f"   ({time.perf_counter() - t0:.1f} s)")
    table(suite)
    return exit_status(suite.failures)


if __name__ == "__main__":
    sys.exit(main())
