"""``torch.compile(fn, backend="kfuse")``: forward outputs and every input gradient against eager
PyTorch (CPU tier: the fused regions run in kfuse's interpreter; GPU tier: CUDA kernels against
float64), the reuse of programs across sizes, ``kfuse.explain`` and the entry point."""

import glob
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.nn.functional as F

import kfuse
from kfuse import _backend

SEED = int(os.environ.get("KFUSE_TEST_SEED", "20240611"))


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------
# The functions, written as users write them in plain torch.


def giou_loss(b1, b2, eps: float = 1e-7):
    """torchvision's generalized_box_iou_loss (reduction "mean"), intersection clamped at 0."""
    x1, y1, x2, y2 = b1.unbind(dim=-1)
    x1g, y1g, x2g, y2g = b2.unbind(dim=-1)
    xkis1, ykis1 = torch.max(x1, x1g), torch.max(y1, y1g)
    xkis2, ykis2 = torch.min(x2, x2g), torch.min(y2, y2g)
    intsct = (xkis2 - xkis1).clamp(min=0) * (ykis2 - ykis1).clamp(min=0)
    union = (x2 - x1) * (y2 - y1) + (x2g - x1g) * (y2g - y1g) - intsct
    iou = intsct / (union + eps)
    xc1, yc1 = torch.min(x1, x1g), torch.min(y1, y1g)
    xc2, yc2 = torch.max(x2, x2g), torch.max(y2, y2g)
    area_c = (xc2 - xc1) * (yc2 - yc1)
    miou = iou - ((area_c - union) / (area_c + eps))
    return (1 - miou).mean()


def smooth_l1(p, t):
    return F.smooth_l1_loss(p, t, beta=0.5)


def gelu_erf(x, b):
    return F.gelu(x + b)


def gelu_tanh(x, b):
    return F.gelu(x + b, approximate="tanh")


def focal_loss(inputs, targets, alpha: float = 0.25, gamma: float = 2.0):
    """torchvision's sigmoid_focal_loss (reduction "mean")."""
    p = torch.sigmoid(inputs)
    ce = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce * ((1 - p_t) ** gamma)
    alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
    return (alpha_t * loss).mean()


def weighted_rows(x, w):
    return (x * w).sum(-1)


def masked_mean(x, valid):
    return torch.where(valid, x, 0).sum() / valid.sum()


def relu_affine(x):
    return torch.relu(x) * 2 - 1


def log_sigmoid(x):
    return F.logsigmoid(x).mean()


def matmul_mix(x, s, w):
    h = torch.tanh(x * s + 1)
    return torch.sigmoid(h @ w) * 3 - 1


def normalize_rows(x):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) * torch.rsqrt(var + 1e-5)


def softmax_rows(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def huber(p, t):
    return F.huber_loss(p, t, delta=0.7)


def inverse_hyperbolic(x):
    return torch.asinh(x * 3) * torch.acosh(x.abs() + 1.5) + torch.atanh(torch.tanh(x) * 0.9)


def powers_and_logs(x):
    return torch.exp2(x) * torch.log2(x.abs() + 0.5) + torch.log10(x * x + 0.25)


def activations(x):
    """The activations of torch.nn.functional, among them those core aten keeps whole (elu, selu,
    celu, leaky_relu, hardtanh, relu6), with their non-default parameters."""
    return (F.elu(x) + F.leaky_relu(x, 0.03) + F.hardtanh(x, -0.7, 1.3) + F.relu6(x * 4) + F.selu(x)
            + F.celu(x, 0.6) + F.hardswish(x) + F.hardsigmoid(x) + F.mish(x) + F.softplus(x, beta=2.0, threshold=3.0))


class Block(torch.nn.Module):
    """Linear + GELU + residual."""

    def __init__(self, n):
        super().__init__()
        self.lin = torch.nn.Linear(n, n)

    def forward(self, x):
        return x + F.gelu(self.lin(x))


def _boxes(gen, n):
    xy = torch.rand(n, 2, generator=gen) * 4
    return torch.cat([xy, xy + 0.5 + torch.rand(n, 2, generator=gen) * 3], -1)


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen)


# name -> (function, inputs(gen) as a list, which inputs get gradients)
CASES = {
    "giou_loss": (giou_loss, lambda g: [_boxes(g, 37) + 0.3 * _randn(g, 37, 4), _boxes(g, 37)], (0, 1)),
    "smooth_l1": (smooth_l1, lambda g: [_randn(g, 9, 37), _randn(g, 9, 37)], (0, 1)),
    "gelu_erf": (gelu_erf, lambda g: [_randn(g, 7, 33), _randn(g, 33)], (0, 1)),
    "gelu_tanh": (gelu_tanh, lambda g: [_randn(g, 7, 33), _randn(g, 33)], (0, 1)),
    "focal_loss": (focal_loss, lambda g: [_randn(g, 11, 21), (torch.rand(11, 21, generator=g) > 0.7).float()], (0,)),
    "weighted_rows": (weighted_rows, lambda g: [_randn(g, 13, 29), _randn(g, 29)], (0, 1)),
    "masked_mean": (masked_mean, lambda g: [_randn(g, 5, 41), torch.rand(5, 41, generator=g) > 0.4], (0,)),
    "relu_affine": (relu_affine, lambda g: [_randn(g, 3, 17, 5)], (0,)),
    "log_sigmoid": (log_sigmoid, lambda g: [_randn(g, 23, 19) * 4], (0,)),
    "matmul_mix": (matmul_mix, lambda g: [_randn(g, 9, 19), _randn(g, 19), _randn(g, 19, 23)], (0, 1, 2)),
    "normalize_rows": (normalize_rows, lambda g: [_randn(g, 7, 45) * 3 + 1], (0,)),
    "softmax_rows": (softmax_rows, lambda g: [_randn(g, 11, 27) * 2], (0,)),
    "huber": (huber, lambda g: [_randn(g, 31), _randn(g, 31)], (0, 1)),
    "activations": (activations, lambda g: [_randn(g, 7, 33) * 3], (0,)),
    "inverse_hyperbolic": (inverse_hyperbolic, lambda g: [_randn(g, 5, 31)], (0,)),
    "powers_and_logs": (powers_and_logs, lambda g: [_randn(g, 5, 31) * 3], (0,)),
}


def _forward_backward(fn, inputs, wrt, upstream):
    inputs = [t.detach().clone().requires_grad_(i in wrt) for i, t in enumerate(inputs)]
    out = fn(*inputs)
    grads = torch.autograd.grad((out * upstream).sum(), [inputs[i] for i in wrt])
    return out.detach(), grads


def _check(name, fn, inputs, wrt, compiled, rtol=1e-5, atol=1e-6, reference_dtype=None):
    gen = torch.Generator().manual_seed(SEED + 1)
    want_out = fn(*inputs)
    upstream = torch.randn(want_out.shape, generator=gen).to(want_out.device, want_out.dtype)
    got, got_grads = _forward_backward(compiled, inputs, wrt, upstream)
    ref_inputs = inputs if reference_dtype is None else [t.to(reference_dtype) if t.is_floating_point() else t for t in inputs]
    want, want_grads = _forward_backward(fn, ref_inputs, wrt, upstream.to(ref_inputs[0].dtype))
    msg = f"{name} (seed {SEED})"
    torch.testing.assert_close(got, want.to(got.dtype), rtol=rtol, atol=atol, msg=lambda m: f"{msg}, output: {m}")
    for i, g, w in zip(wrt, got_grads, want_grads):
        torch.testing.assert_close(g, w.to(g.dtype), rtol=rtol, atol=atol, msg=lambda m, i=i: f"{msg}, grad of input {i}: {m}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_with_gradients(name):
    fn, make, wrt = CASES[name]
    inputs = make(torch.Generator().manual_seed(SEED))
    before = _backend.stats["compiles"] + _backend.stats["reused"]
    _check(name, fn, inputs, wrt, torch.compile(fn, backend=_backend.backend))
    # Something of every case is fused (the programs come from kfuse, compiled or reused).
    assert _backend.stats["compiles"] + _backend.stats["reused"] > before, f"{name}: no region was fused"


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_under_dynamic_shapes_at_two_batch_sizes(name):
    # Every size a symbol (dynamic=True), then fewer rows of the inputs that share the first
    # input's leading size: the same programs, eager's values.
    fn, make, wrt = CASES[name]
    inputs = make(torch.Generator().manual_seed(SEED))
    lead = inputs[0].shape[0] if inputs[0].dim() else None
    compiled = torch.compile(fn, backend=_backend.backend, dynamic=True)
    for rows in (lead, None if lead is None else max(2, lead - 3)):
        part = [t[:rows] if rows is not None and t.dim() and t.shape[0] == lead else t for t in inputs]
        _check(f"{name} dynamic, {rows} rows", fn, part, wrt, compiled)
        if lead is None:
            break


def test_module_linear_gelu_residual():
    torch.manual_seed(SEED)
    block = Block(19)
    x = torch.randn(7, 19, requires_grad=True)
    want = block(x)
    want_grads = torch.autograd.grad(want.sum(), [x, *block.parameters()])
    compiled = torch.compile(block, backend=_backend.backend)
    got = compiled(x)
    got_grads = torch.autograd.grad(got.sum(), [x, *block.parameters()])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    report = kfuse.explain(block, x)
    assert any("aten.gelu.default" in k.ops for k in report.kernels), str(report)
    assert any(f.op.startswith("aten.addmm") or f.op.startswith("aten.mm") for f in report.fallbacks), str(report)


def test_fullgraph():
    fn, make, wrt = CASES["focal_loss"]
    inputs = make(torch.Generator().manual_seed(SEED))
    _check("focal_loss fullgraph", fn, inputs, wrt, torch.compile(fn, backend=_backend.backend, fullgraph=True))


def test_new_batch_size_compiles_no_program():
    gen = torch.Generator().manual_seed(SEED)
    # Static shapes: Dynamo traces again for the new size, the regions' texts are the same.
    compiled = torch.compile(gelu_tanh, backend=_backend.backend, dynamic=False)
    b = _randn(gen, 33)
    _check("gelu_tanh, batch 37", gelu_tanh, [_randn(gen, 37, 33), b], (0, 1), compiled)
    compiles = _backend.stats["compiles"]
    _check("gelu_tanh, batch 45", gelu_tanh, [_randn(gen, 45, 33), b], (0, 1), compiled)
    assert _backend.stats["compiles"] == compiles
    # Dynamic shapes: no new trace and no new program either.
    compiled = torch.compile(smooth_l1, backend=_backend.backend, dynamic=True)
    _check("smooth_l1, 9x37", smooth_l1, [_randn(gen, 9, 37), _randn(gen, 9, 37)], (0, 1), compiled)
    compiles = _backend.stats["compiles"]
    _check("smooth_l1, 23x51", smooth_l1, [_randn(gen, 23, 51), _randn(gen, 23, 51)], (0, 1), compiled)
    assert _backend.stats["compiles"] == compiles


def test_a_mean_at_a_new_batch_size_compiles_no_program():
    # A mean's gradient divides by the element count: a literal in the first (static) graph, a
    # size expression in Dynamo's dynamic one; both write it as the same size expression, so
    # neither automatic dynamic shapes nor static graphs at other sizes compile a new program.
    gen = torch.Generator().manual_seed(SEED)

    def make(rows):
        return [_randn(gen, rows, 21), (torch.rand(rows, 21, generator=gen) > 0.7).float()]

    for dynamic in (None, False):
        compiled = torch.compile(focal_loss, backend=_backend.backend, dynamic=dynamic)
        _check(f"focal_loss dynamic={dynamic}, 37 rows", focal_loss, make(37), (0,), compiled)
        compiles = _backend.stats["compiles"]
        for rows in (45, 61):
            _check(f"focal_loss dynamic={dynamic}, {rows} rows", focal_loss, make(rows), (0,), compiled)
        assert _backend.stats["compiles"] == compiles, f"dynamic={dynamic}"


def test_explain_lists_kernels_and_fallbacks():
    gen = torch.Generator().manual_seed(SEED)
    x, s, w = (t.requires_grad_() for t in CASES["matmul_mix"][1](gen))
    report = kfuse.explain(matmul_mix, x, s, w)
    assert x.grad is None  # explain runs the backward without touching .grad
    graphs = {k.graph for k in report.kernels}
    assert {"forward", "backward"} <= graphs, str(report)
    fw = [k for k in report.kernels if k.graph == "forward"]
    assert any("aten.tanh.default" in k.ops for k in fw) and any("aten.sigmoid.default" in k.ops for k in fw)
    assert all(k.source.startswith("input a0: ") and "output o0 = " in k.source for k in report.kernels)
    assert all(k.kernels is None or k.kernels >= 1 for k in report.kernels)
    mm = [f for f in report.fallbacks if f.op == "aten.mm.default"]
    assert mm and all("no lowering" in f.reason for f in mm), str(report)
    # The bias-like gradient of `s` sums over the batch axis: fused too.
    assert not any("reduc" in f.reason for f in report.fallbacks), str(report)
    text = str(report)
    assert "== forward graph" in text and "== backward graph" in text
    assert "left to PyTorch: aten.mm.default" in text and "let t0 = " in text


def test_unsupported_dtype_falls_back_with_reason():
    def fn(x, labels):
        return (x * labels.to(x.dtype) + 1).exp()

    gen = torch.Generator().manual_seed(SEED)
    x, labels = _randn(gen, 5, 7), torch.randint(0, 3, (5, 7), generator=gen, dtype=torch.int16)
    report = kfuse.explain(fn, x, labels)
    torch.testing.assert_close(torch.compile(fn, backend=_backend.backend)(x, labels), fn(x, labels))
    assert any("int16" in f.reason for f in report.fallbacks), str(report)


def test_int64_labels_are_fused_and_cross_entropy_matches_eager():
    def scaled(x, labels):
        return (x * labels.to(x.dtype) + (labels % 3 == 1).to(x.dtype)).exp()

    def xent(logits, labels):
        return F.cross_entropy(logits, labels, ignore_index=-100, label_smoothing=0.1)

    gen = torch.Generator().manual_seed(SEED)
    x, labels = _randn(gen, 5, 7), torch.randint(-4, 4, (5, 7), generator=gen)  # int64
    report = kfuse.explain(scaled, x, labels)
    assert not any("int64" in f.reason for f in report.fallbacks), str(report)
    assert "i64" in str(report), str(report)
    torch.testing.assert_close(torch.compile(scaled, backend=_backend.backend)(x, labels), scaled(x, labels))
    logits = _randn(gen, 6, 5).requires_grad_()
    targets = torch.randint(0, 5, (6,), generator=gen)
    targets[2] = -100
    ref = logits.detach().clone().requires_grad_()
    got = torch.compile(xent, backend=_backend.backend)(logits, targets)
    want = xent(ref, targets)
    torch.testing.assert_close(got, want)
    got.backward()
    want.backward()
    torch.testing.assert_close(logits.grad, ref.grad)


def test_backend_does_not_load_with_kfuse():
    code = "import sys, kfuse; print('torch._dynamo' in sys.modules, 'kfuse._backend' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# A fresh process that never imports kfuse: Dynamo finds the backend through the entry point.
_ENTRY_POINT_CHECK = (
    "import sys; sys.path[:0] = sys.argv[1:]\n"
    "import importlib.metadata as md, torch\n"
    "eps = md.entry_points(group='torch_dynamo_backends')\n"
    "print([e.value for e in eps if e.name == 'kfuse'])\n"
    "f = torch.compile(lambda x: torch.relu(x) * 2 - 1, backend='kfuse')\n"
    "x = torch.randn(5, 3)\n"
    "print(bool(torch.equal(f(x), torch.relu(x) * 2 - 1)), 'kfuse._backend' in sys.modules)\n"
)


def _run_entry_point_check(*path):
    out = subprocess.run([sys.executable, "-c", _ENTRY_POINT_CHECK, *path], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:2] == ["['kfuse._backend:backend']", "True True"], out.stdout


def test_entry_point_of_this_install():
    """`torch.compile(fn, backend="kfuse")` with no `import kfuse`, for the kfuse these tests run."""
    try:
        dist = importlib.metadata.distribution("kfuse")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("kfuse is not installed as a distribution here (no metadata to hold an entry point)")
    if not os.path.samefile(dist.locate_file("kfuse/__init__.py"), kfuse.__file__):
        pytest.skip(f"the kfuse imported ({kfuse.__file__}) is not the installed distribution's")
    _run_entry_point_check()


def test_entry_point_of_built_wheel():
    """The same from a wheel installed into an empty folder (`KFUSE_WHEEL_DIR`: where the built
    wheel is)."""
    folder = os.environ.get("KFUSE_WHEEL_DIR")
    wheels = sorted(glob.glob(os.path.join(folder, "kfuse-*.whl"))) if folder else []
    if not wheels:
        pytest.skip("set KFUSE_WHEEL_DIR to a folder with a built kfuse wheel to test its entry point")
    if importlib.util.find_spec("pip") is None:
        pytest.skip("pip is not available to install the wheel")
    target = tempfile.mkdtemp(prefix="kfuse-ep-")
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, wheels[-1]],
            check=True,
            capture_output=True,
        )
        _run_entry_point_check(target)
    finally:
        shutil.rmtree(target, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# GPU tier: CUDA kernels against float64 eager.


@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_float64(gpu, name):
    fn, make, wrt = CASES[name]
    inputs = [t.to(gpu) for t in make(torch.Generator().manual_seed(SEED))]
    _check(name, fn, inputs, wrt, torch.compile(fn, backend=_backend.backend), rtol=1e-4, atol=1e-5, reference_dtype=torch.float64)


# Half-precision inputs: kfuse computes in f32 and rounds once at each region's outputs, so the
# results are compared with float64 eager on the same (rounded) inputs, at bf16/f16 tolerances.
HALF_CASES = ["gelu_erf", "gelu_tanh", "smooth_l1", "relu_affine", "log_sigmoid", "softmax_rows", "weighted_rows", "huber",
              "activations"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("name", HALF_CASES)
def test_half_inputs_match_float64(name, dtype):
    fn, make, wrt = CASES[name]
    inputs = [t.to(dtype) if t.is_floating_point() else t for t in make(torch.Generator().manual_seed(SEED))]
    tol = 2e-2 if dtype == torch.bfloat16 else 5e-3
    before = _backend.stats["compiles"] + _backend.stats["reused"]
    _check(f"{name} {dtype}", fn, inputs, wrt, torch.compile(fn, backend=_backend.backend), rtol=tol, atol=tol,
           reference_dtype=torch.float64)
    assert _backend.stats["compiles"] + _backend.stats["reused"] > before, f"{name} {dtype}: no region was fused"


def test_every_activation_fuses_forward_and_backward_with_nothing_left_to_pytorch():
    x = _randn(torch.Generator().manual_seed(SEED), 7, 33).requires_grad_()
    report = kfuse.explain(activations, x)
    assert not report.fallbacks, str(report)
    assert [k.graph for k in report.kernels] == ["forward", "backward"], str(report)


def test_explain_names_each_kernels_shape():
    gen = torch.Generator().manual_seed(SEED)
    x = _randn(gen, 33, 40).requires_grad_()
    report = kfuse.explain(normalize_rows, x)
    fw = [k for k in report.kernels if k.graph == "forward"]
    assert fw and all(k.shapes and k.kernels == len(k.shapes) for k in fw), str(report)
    # The row mean and variance are computed once per row, by the row's lanes.
    assert any("computed once per row" in s for k in fw for s in k.shapes), str(report)
    assert "   kernel 0: " in str(report)


def test_a_padded_box_loss_fuses_its_forward_and_backward_whole():
    # Counting bools (`valid.sum()`) and stacking the gradients of a box's four coordinates back
    # into one tensor are fused: nothing is left to PyTorch. A scalar loss whose backward kfuse
    # lowers whole is computed with its gradient in the forward's region; the backward scales it.
    gen = torch.Generator().manual_seed(SEED)

    def padded_giou(pred, target):
        x1, y1, x2, y2 = pred.unbind(-1)
        a1, b1, a2, b2 = target.unbind(-1)
        inter = (torch.min(x2, a2) - torch.max(x1, a1)).clamp(min=0) * (torch.min(y2, b2) - torch.max(y1, b1)).clamp(min=0)
        union = (x2 - x1) * (y2 - y1) + (a2 - a1) * (b2 - b1) - inter
        hull = (torch.max(x2, a2) - torch.min(x1, a1)) * (torch.max(y2, b2) - torch.min(y1, b1))
        loss = 1 - (inter / union - (hull - union) / hull)
        valid = target[..., 3] != 0
        return torch.where(valid, loss, torch.zeros(())).sum() / valid.sum().clamp(min=1)

    xy, wh = torch.rand(5, 7, 2, generator=gen), torch.rand(5, 7, 2, generator=gen) + 0.1
    pred = torch.cat([xy, xy + wh], -1).requires_grad_()
    xy, wh = torch.rand(5, 7, 2, generator=gen), torch.rand(5, 7, 2, generator=gen) + 0.1
    target = torch.cat([xy, xy + wh], -1)
    target[:, 4:, 3] = 0
    report = kfuse.explain(padded_giou, pred, target)
    assert not report.fallbacks, str(report)
    assert [k.graph for k in report.kernels] == ["forward"], str(report)
    assert report.scaled_gradients == ["backward"], str(report)
    # And the results are eager's, in float64.
    compiled = torch.compile(padded_giou, backend="kfuse")
    p64 = pred.detach().double().requires_grad_()
    want = padded_giou(p64, target.double())
    want.backward()
    got = compiled(pred, target)
    got.backward()
    assert abs(float(got.detach()) - float(want.detach())) <= 1e-5 * max(1.0, abs(float(want.detach())))
    assert torch.allclose(pred.grad.double(), p64.grad, rtol=1e-5, atol=1e-6)


def test_a_region_whose_kernels_raise_runs_in_pytorch_from_then_on(monkeypatch, caplog):
    # A kernel that fails to compile would be compiled again on every call: the region gives up
    # once, says so once, and gives eager's results.
    attempts = []

    def failing_first_call(self, args):
        attempts.append(self.prog.name)
        raise kfuse.Error("NVRTC compilation failed (a stand-in)")

    monkeypatch.setattr(_backend._Region, "_first_call", failing_first_call)

    def fn(x, y):
        return torch.exp(x * y + 1).sum(-1)

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=_backend.backend)
    gen = torch.Generator().manual_seed(SEED)
    x, y = torch.randn(5, 7, generator=gen), torch.randn(5, 7, generator=gen)
    with caplog.at_level(logging.WARNING, logger=_backend.log.name):
        for _ in range(3):
            torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert len(attempts) == 1, attempts
    assert sum("runs in PyTorch from now on" in r.getMessage() for r in caplog.records) == 1, caplog.text
