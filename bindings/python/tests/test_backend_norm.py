"""``torch.compile(fn, backend="kfuse")`` on normalisation layers, the moments (var, std) and the
index ranges (`arange`) of box-loss backwards: forward outputs and every gradient against eager
PyTorch in float32 and float64, on odd shapes, and ``kfuse.explain`` leaving nothing to PyTorch.
CPU tier: the fused regions run in kfuse's interpreter; GPU tier: the same cases as CUDA kernels."""

import math
import os

import pytest
import torch
import torch.nn.functional as F

import kfuse
from kfuse import _backend

SEED = int(os.environ.get("KFUSE_TEST_SEED", "20240611"))
SHAPES = [(3, 5, 33), (1, 7), (31, 1023)]
F32_TOL = 1e-5  # max |got - want| / max |want|, against eager in float32 and in float64


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def rel_err(got, want):
    got, want = got.detach().double(), want.detach().double()
    assert got.shape == want.shape
    den = want.abs().max().item() if want.numel() else 0.0
    num = (got - want).abs().max().item() if got.numel() else 0.0
    return num / den if den > 0 else num


# ---------------------------------------------------------------------------------------------
# The functions, as users write them.


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def layer_norm_plain(x):
    return F.layer_norm(x, (x.shape[-1],))


def layer_norm_two_axes(x, w):
    return F.layer_norm(x, x.shape[-2:], w, eps=1e-5)


def rms_norm(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, eps=1e-6)


def rms_norm_by_hand(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def moments(x):
    """var and std with each correction, over the last axis and the first."""
    v1 = torch.var(x, -1, keepdim=True)  # unbiased
    s0 = torch.std(x, -1, correction=0, keepdim=True)
    v2, m = torch.var_mean(x, -1, correction=2, keepdim=True)
    v0 = torch.var(x, 0, unbiased=False)  # a leading axis, no keepdim
    return (x - m) * v1 + s0 * v2 + v0


def arange_scale(x):
    """An index range as long as the last axis (`iota` of the region's input; written out when
    the axis is short)."""
    scaled = torch.sin(x) * torch.arange(x.shape[-1], dtype=x.dtype, device=x.device)
    return scaled + torch.arange(3, 3 + 2 * x.shape[-1], 2, device=x.device)


def ciou_loss(pred, target, eps: float = 1e-7):
    """Complete-IoU, reading the boxes' components with `[..., k]` as in the backend suite: its
    backward compares `arange(4)` with each component's index."""
    x1, y1, x2, y2 = pred[..., 0], pred[..., 1], pred[..., 2], pred[..., 3]
    a1, b1, a2, b2 = target[..., 0], target[..., 1], target[..., 2], target[..., 3]
    inter = (torch.min(x2, a2) - torch.max(x1, a1)).clamp(min=0) * (torch.min(y2, b2) - torch.max(y1, b1)).clamp(min=0)
    union = (x2 - x1) * (y2 - y1) + (a2 - a1) * (b2 - b1) - inter
    iou = inter / (union + eps)
    diag = (torch.max(x2, a2) - torch.min(x1, a1)) ** 2 + (torch.max(y2, b2) - torch.min(y1, b1)) ** 2 + eps
    centers = ((x1 + x2) / 2 - (a1 + a2) / 2) ** 2 + ((y1 + y2) / 2 - (b1 + b2) / 2) ** 2
    v = (4 / math.pi**2) * torch.pow(torch.atan((a2 - a1) / (b2 - b1)) - torch.atan((x2 - x1) / (y2 - y1)), 2)
    with torch.no_grad():
        alpha = v / (1 - iou + v + eps)
    return (1 - iou + centers / diag + alpha * v).mean()


def _inter_union_masked(b1, b2):
    """Intersection and union as torchvision computes them: the intersection written into
    `zeros_like` through a boolean mask (a data-dependent index, so Dynamo breaks the graph)."""
    x1, y1, x2, y2 = b1.unbind(dim=-1)
    a1, c1, a2, c2 = b2.unbind(dim=-1)
    lo_x, lo_y, hi_x, hi_y = torch.max(x1, a1), torch.max(y1, c1), torch.min(x2, a2), torch.min(y2, c2)
    inter = torch.zeros_like(x1)
    overlap = (hi_y > lo_y) & (hi_x > lo_x)
    inter[overlap] = (hi_x[overlap] - lo_x[overlap]) * (hi_y[overlap] - lo_y[overlap])
    return inter, (x2 - x1) * (y2 - y1) + (a2 - a1) * (c2 - c1) - inter


def ciou_loss_masked(b1, b2, eps: float = 1e-7):
    inter, union = _inter_union_masked(b1, b2)
    iou = inter / (union + eps)
    x1, y1, x2, y2 = b1.unbind(dim=-1)
    a1, c1, a2, c2 = b2.unbind(dim=-1)
    diag = (torch.max(x2, a2) - torch.min(x1, a1)) ** 2 + (torch.max(y2, c2) - torch.min(y1, c1)) ** 2 + eps
    centers = ((x1 + x2) / 2 - (a1 + a2) / 2) ** 2 + ((y1 + y2) / 2 - (c1 + c2) / 2) ** 2
    v = (4 / math.pi**2) * torch.pow(torch.atan((a2 - a1) / (c2 - c1)) - torch.atan((x2 - x1) / (y2 - y1)), 2)
    with torch.no_grad():
        alpha = v / (1 - iou + v + eps)
    return (1 - iou + centers / diag + alpha * v).mean()


# ---------------------------------------------------------------------------------------------
# Inputs and checks.


def _gen(shape, salt=0):
    return torch.Generator().manual_seed(SEED + 7919 * salt + sum(shape))


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen)


def _boxes(gen, lead):
    xy = torch.rand(*lead, 2, generator=gen) * 4
    target = torch.cat([xy, xy + 0.5 + torch.rand(*lead, 2, generator=gen) * 3], -1)
    pred = target + 0.3 * torch.randn(*lead, 4, generator=gen)
    pred[..., 2:] = torch.maximum(pred[..., 2:], pred[..., :2] + 0.1)
    return pred, target


def _norm_inputs(shape, with_bias):
    gen = _gen(shape)
    d = shape[-1]
    x = _randn(gen, *shape) * 2 + 0.5
    w = 1 + 0.1 * _randn(gen, d)
    return [x, w, 0.1 * _randn(gen, d)] if with_bias else [x, w]


# name -> (function, inputs(shape), indices of the inputs that get gradients)
CASES = {
    "layer_norm": (layer_norm, lambda s: _norm_inputs(s, True), (0, 1, 2)),
    "layer_norm_plain": (layer_norm_plain, lambda s: _norm_inputs(s, False)[:1], (0,)),
    "rms_norm": (rms_norm, lambda s: _norm_inputs(s, False), (0, 1)),
    "rms_norm_by_hand": (rms_norm_by_hand, lambda s: _norm_inputs(s, False), (0, 1)),
    "moments": (moments, lambda s: _norm_inputs(s, False)[:1], (0,)),
    "arange_scale": (arange_scale, lambda s: _norm_inputs(s, False)[:1], (0,)),
    "ciou_loss": (ciou_loss, lambda s: list(_boxes(_gen(s), s[:-1])), (0, 1)),  # boxes [*s[:-1], 4]
}


def _forward_backward(fn, inputs, wrt, upstream, params=()):
    inputs = [t.detach().clone().requires_grad_(i in wrt) for i, t in enumerate(inputs)]
    out = fn(*inputs)
    grads = torch.autograd.grad((out * upstream).sum(), [inputs[i] for i in wrt] + list(params))
    return out.detach(), grads


def _check(name, fn, inputs, wrt, compiled):
    """The compiled function (float32) against eager float32 and eager float64."""
    want32 = fn(*inputs)
    upstream = torch.randn(want32.shape, generator=torch.Generator().manual_seed(SEED + 1)).to(want32.device)
    got, got_grads = _forward_backward(compiled, inputs, wrt, upstream)
    for dtype in (torch.float32, torch.float64):
        ref = [t.to(dtype) for t in inputs]
        want, want_grads = _forward_backward(fn, ref, wrt, upstream.to(dtype))
        msg = f"{name}, shape {list(inputs[0].shape)}, against eager {dtype} (seed {SEED})"
        assert rel_err(got, want) <= F32_TOL, f"{msg}: output off by {rel_err(got, want):.3g}"
        for i, g, w in zip(wrt, got_grads, want_grads):
            assert rel_err(g, w) <= F32_TOL, f"{msg}: gradient of input {i} off by {rel_err(g, w):.3g}"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_in_f32_and_f64(name, shape):
    fn, make, wrt = CASES[name]
    inputs = make(shape)
    before = _backend.stats["compiles"] + _backend.stats["reused"]
    _check(name, fn, inputs, wrt, torch.compile(fn, backend="kfuse"))
    assert _backend.stats["compiles"] + _backend.stats["reused"] > before, f"{name}: no region was fused"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_eager_in_f32_and_f64(gpu, name, shape):
    fn, make, wrt = CASES[name]
    inputs = [t.to(gpu) for t in make(shape)]
    _check(name, fn, inputs, wrt, torch.compile(fn, backend="kfuse"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_explain_leaves_nothing_to_pytorch(name):
    fn, make, wrt = CASES[name]
    inputs = [t.requires_grad_(i in wrt) for i, t in enumerate(make((3, 5, 33) if name != "ciou_loss" else (3, 5, 4)))]
    report = kfuse.explain(fn, *inputs)
    assert not report.fallbacks, str(report)
    # The backward fused too: a region of its own, or (a scalar loss) the gradients computed with the
    # loss in the forward's region and scaled in the backward.
    assert {"forward", "backward"} <= {k.graph for k in report.kernels} | set(report.scaled_gradients), str(report)


def _modules():
    torch.manual_seed(SEED)
    ln, rms = torch.nn.LayerNorm(33), torch.nn.RMSNorm(33, eps=1e-6)
    with torch.no_grad():
        for p in list(ln.parameters()) + list(rms.parameters()):
            p.add_(0.1 * torch.randn(p.shape))
    return {"LayerNorm": ln, "RMSNorm": rms}


@pytest.mark.parametrize("name", ["LayerNorm", "RMSNorm"])
def test_modules_match_eager_with_parameter_gradients(name):
    module = _modules()[name]
    x = _randn(_gen((3, 5, 33)), 3, 5, 33) * 2 + 0.5
    upstream = _randn(torch.Generator().manual_seed(SEED + 1), 3, 5, 33)
    params = list(module.parameters())
    got, got_grads = _forward_backward(torch.compile(module, backend="kfuse"), [x], (0,), upstream, params)
    for dtype in (torch.float32, torch.float64):
        ref = module.to(dtype)
        want, want_grads = _forward_backward(ref, [x.to(dtype)], (0,), upstream.to(dtype), list(ref.parameters()))
        assert rel_err(got, want) <= F32_TOL, f"{name} against {dtype} (seed {SEED})"
        for i, (g, w) in enumerate(zip(got_grads, want_grads)):
            assert rel_err(g, w) <= F32_TOL, f"{name} against {dtype}: gradient {i} (seed {SEED})"
        module.to(torch.float32)
    report = kfuse.explain(module, x.requires_grad_())
    assert not report.fallbacks, str(report)
    # The backward fused too: a region of its own, or (a scalar loss) the gradients computed with the
    # loss in the forward's region and scaled in the backward.
    assert {"forward", "backward"} <= {k.graph for k in report.kernels} | set(report.scaled_gradients), str(report)


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
def test_dynamic_shapes_fuse_the_norms_and_compile_no_program_for_a_new_batch(name):
    fn, make, wrt = CASES[name]
    compiled = torch.compile(fn, backend="kfuse", dynamic=True)
    _check(f"{name} dynamic", fn, make((5, 33)), wrt, compiled)
    compiles = _backend.stats["compiles"]
    _check(f"{name} dynamic", fn, make((9, 33)), wrt, compiled)
    assert _backend.stats["compiles"] == compiles
    # The sizes the backward multiplies by (N) are read from the inputs' shapes: all fused.
    report = _backend.Report()
    aot = _backend._aot(report)
    torch._dynamo.reset()
    inputs = [t.requires_grad_(i in wrt) for i, t in enumerate(make((7, 45)))]
    out = torch.compile(fn, backend=lambda gm, ex, **kw: aot(gm, ex, **kw), dynamic=True)(*inputs)
    out.sum().backward()
    assert not report.fallbacks, str(report)
    assert "size(" in str(report), str(report)


def test_layer_norm_over_two_axes():
    x = _norm_inputs((3, 5, 33), False)[0]
    w = 1 + 0.1 * _randn(_gen((5, 33), 1), 5, 33)
    _check("layer_norm over two axes", layer_norm_two_axes, [x, w], (0, 1), torch.compile(layer_norm_two_axes, backend="kfuse"))
    report = kfuse.explain(layer_norm_two_axes, x.requires_grad_(), w.requires_grad_())
    # Its statistics reduce two axes (165 elements) and are used again at each of them: kfuse
    # stores them once, so nothing is left to PyTorch.
    assert not report.fallbacks, str(report)
    assert report.kernels, str(report)


def test_arange_with_no_axis_of_its_length_falls_back_with_reason():
    def outer(x):
        return x.sum(-1, keepdim=True) * torch.arange(40, dtype=x.dtype, device=x.device)

    x = _randn(_gen((5, 20)), 5, 20)
    report = kfuse.explain(outer, x)
    reasons = [f.reason for f in report.fallbacks if "arange" in f.op]
    assert reasons and all("no tensor of its region has as an axis" in r and "iota" in r for r in reasons), str(report)
    assert report.kernels, str(report)  # the rest is fused
    torch.testing.assert_close(torch.compile(outer, backend="kfuse")(x), outer(x), rtol=1e-6, atol=1e-6)


# PyTorch's own backward of the masked write warns so under torch.compile with every backend.
@pytest.mark.filterwarnings("ignore:Error detected in IndexPutBackward0")
def test_box_loss_with_a_masked_intersection_matches_eager():
    # torchvision writes the intersection through a boolean mask: Dynamo breaks the graph at the
    # data-dependent index, so a few one-op graphs are left to PyTorch; the rest is fused, and
    # writing into `zeros_like`'s output works.
    pred, target = _boxes(_gen((37,)), (37,))
    compiled = torch.compile(ciou_loss_masked, backend="kfuse")
    _check("ciou_loss_masked", ciou_loss_masked, [pred, target], (0,), compiled)
    report = kfuse.explain(ciou_loss_masked, pred.requires_grad_(), target)
    assert report.kernels, str(report)
    assert all("a region of a single op" in f.reason for f in report.fallbacks), str(report)


@pytest.mark.filterwarnings("ignore:Error detected in IndexPutBackward0")
def test_torchvision_complete_box_iou_loss():
    ops = pytest.importorskip("torchvision.ops")

    def loss(p, t):
        return ops.complete_box_iou_loss(p, t, reduction="mean")

    pred, target = _boxes(_gen((37,)), (37,))
    _check("torchvision complete_box_iou_loss", loss, [pred, target], (0,), torch.compile(loss, backend="kfuse"))
    report = kfuse.explain(loss, pred.requires_grad_(), target)
    assert report.kernels, str(report)
    assert all("a region of a single op" in f.reason for f in report.fallbacks), str(report)


def test_an_embedding_below_a_layer_norm_leaves_only_its_own_ops_to_pytorch():
    # The embedding's gradient is an index_put into zeros of the table's size, which no region
    # input has: that region output alone is refused, and the norm's backward still fuses.
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.LayerNorm(16))
    ids = torch.randint(0, 50, (4, 5))
    report = kfuse.explain(model, ids)
    left = sorted({f.op for f in report.fallbacks})
    assert left == ["aten.embedding.default", "aten.full.default", "aten.index_put.default"], str(report)
    assert {k.graph for k in report.kernels} == {"forward", "backward"}, str(report)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="kfuse")
    dy = torch.randn(4, 5, 16)
    got = torch.autograd.grad(compiled(ids), list(model.parameters()), dy)
    want = torch.autograd.grad(model(ids), list(model.parameters()), dy)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-6), (g - w).abs().max()


def test_a_convolution_with_batch_norm_leaves_only_the_convolution_and_matmuls_to_pytorch():
    # Training-mode batch norm reads the batch's element count (`sym_size`, metadata): not an op
    # kfuse must take, nor one it reports as left over. Its statistics (over 2 x 7 x 7 elements per
    # channel, used again at each of them) are stored once by kernels of their own.
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4))
    x = torch.randn(2, 3, 9, 9, requires_grad=True)
    report = kfuse.explain(model, x)
    left = {f.op.split(".")[1] for f in report.fallbacks}
    assert left <= {"convolution", "convolution_backward", "mm", "addmm"}, str(report)
    assert {k.graph for k in report.kernels} == {"forward", "backward"}, str(report)
