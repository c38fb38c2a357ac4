"""Dropout in training mode under ``torch.compile(fn, backend="kfuse")``: the mask is drawn inside
the fused region by kfuse's ``rand_like`` (Philox keyed by a seed the backend draws from torch's
default generator on each call), and the backward reads the mask the forward stored. Checked
statistically (the fraction of zeros within 5 sigma of p on a large tensor), exactly where it can
be (kept values are x / (1 - p), the gradient is upstream * mask / (1 - p) with the forward's
mask), and for what a seed means (two calls differ, ``torch.manual_seed`` repeats a call, eval
mode is the identity, one program serves every call). CPU tier: the regions run in kfuse's
interpreter; the GPU tier repeats the checks on CUDA tensors."""

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kfuse
from kfuse import _backend
from test_backend import SEED

P = 0.3


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def scaled_dropout(x):
    return F.dropout(x * 2.0, p=P, training=True)


def _run(compiled, x, upstream):
    xs = x.clone().requires_grad_()
    out = compiled(xs)
    (g,) = torch.autograd.grad((out * upstream).sum(), [xs])
    return out.detach(), g


def _check_dropout(device):
    gen = torch.Generator().manual_seed(SEED)
    x = (torch.rand(301, 257, generator=gen) + 0.5).to(device)  # never 0: a zero output is a drop
    upstream = torch.randn(301, 257, generator=gen).to(device)
    compiled = torch.compile(scaled_dropout, backend=_backend.backend)
    compiles = _backend.stats["compiles"]
    torch.manual_seed(SEED)
    out, g = _run(compiled, x, upstream)
    msg = f"dropout p={P} on {device} (seed {SEED})"
    kept = out != 0
    # The fraction of zeros is p within 5 standard deviations.
    n = kept.numel()
    zeros = 1 - kept.double().mean().item()
    assert abs(zeros - P) <= 5 * math.sqrt(P * (1 - P) / n), f"{msg}: fraction of zeros {zeros:.4f}"
    # Kept values are the input scaled by 1 / (1 - p); dropped ones are exactly 0.
    want = (x * 2.0) / (1 - P)
    torch.testing.assert_close(out[kept], want[kept], rtol=1e-6, atol=0, msg=lambda m: f"{msg}, kept values: {m}")
    # The gradient follows the forward's mask.
    torch.testing.assert_close(g, upstream * kept * 2.0 / (1 - P), rtol=1e-6, atol=0, msg=lambda m: f"{msg}, grad: {m}")
    # Another call draws another mask; the same torch seed draws the same one.
    other, _ = _run(compiled, x, upstream)
    assert not torch.equal(other != 0, kept), f"{msg}: two calls gave the same mask"
    torch.manual_seed(SEED)
    again, g_again = _run(compiled, x, upstream)
    assert torch.equal(again, out) and torch.equal(g_again, g), f"{msg}: torch.manual_seed did not repeat the call"
    # Every call ran the programs compiled for the first: the seed is an argument.
    assert _backend.stats["compiles"] - compiles <= 2, f"{msg}: {_backend.stats}"


def test_dropout_keeps_with_probability_one_minus_p_and_the_backward_uses_the_forwards_mask():
    _check_dropout(torch.device("cpu"))


def test_dropout_is_drawn_inside_the_fused_region():
    torch.manual_seed(SEED)
    x = torch.rand(64, 96) + 0.5
    # A tensor output (explain's upstream gradient is ones): the backward is a region of its own.
    report = kfuse.explain(lambda t: F.dropout(F.gelu(t), p=P, training=True), x.requires_grad_())
    assert not report.fallbacks, str(report)
    forward = [k for k in report.kernels if k.graph == "forward"]
    assert len(forward) == 1, str(report)
    assert "rand_like(" in forward[0].source and "input seed: i64" in forward[0].source, str(report)
    assert any("rand_like" in op for op in forward[0].ops), str(report)
    # The backward reads the mask the forward stored (one byte an element), and draws nothing.
    backward = [k for k in report.kernels if k.graph == "backward"]
    assert len(backward) == 1 and "rand_like" not in backward[0].source, str(report)
    assert "bool[N0, N1]" in backward[0].source, str(report)


def test_two_dropouts_of_one_region_draw_different_masks():
    torch.manual_seed(SEED)
    x = torch.rand(129, 65) + 0.5
    compiled = torch.compile(lambda t: (F.dropout(t, p=0.5, training=True), F.dropout(t, p=0.5, training=True)),
                             backend=_backend.backend)
    a, b = compiled(x)
    assert not torch.equal(a != 0, b != 0), "the two dropouts drew the same mask"
    # Independent masks: both keep about a quarter of the elements.
    both = ((a != 0) & (b != 0)).double().mean().item()
    assert abs(both - 0.25) <= 5 * math.sqrt(0.25 * 0.75 / x.numel()), f"both kept: {both:.4f}"


def test_dropout_in_eval_mode_is_the_identity():
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(33, 47), nn.Dropout(p=P), nn.GELU())
    model.eval()
    x = torch.randn(9, 33)
    compiled = torch.compile(model, backend=_backend.backend)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)


def linear_gelu_dropout(x, w):
    return F.dropout(F.gelu(x @ w), p=P, training=True)


def test_dropout_after_a_matmul_gives_eagers_gradients_through_its_mask():
    gen = torch.Generator().manual_seed(SEED)
    # x @ w has a standard deviation under 0.6: gelu (0 in float32 below about -5.5) is never 0.
    x, w = torch.randn(19, 33, generator=gen), torch.randn(33, 47, generator=gen) * 0.1
    upstream = torch.randn(19, 47, generator=gen)
    compiled = torch.compile(linear_gelu_dropout, backend=_backend.backend)
    before = _backend.stats["compiles"] + _backend.stats["reused"]
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = compiled(xs, ws)
    gx, gw = torch.autograd.grad((out * upstream).sum(), [xs, ws])
    assert _backend.stats["compiles"] + _backend.stats["reused"] > before, "no region was fused"
    h = F.gelu(x @ w)
    assert (h != 0).all()
    mask = out.detach() != 0  # gelu is never 0 here: a zero is a drop
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    wx, ww = torch.autograd.grad((F.gelu(xs @ ws) * mask / (1 - P) * upstream).sum(), [xs, ws])
    torch.testing.assert_close(gx, wx, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw, ww, rtol=1e-5, atol=1e-6)


def test_dropout_on_the_gpu(gpu):
    _check_dropout(gpu)
