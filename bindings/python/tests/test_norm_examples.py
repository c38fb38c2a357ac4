"""CPU tier: the normalisation and bias examples (each with a weight or bias gradient, a reduction
over the leading axis) and reductions over any axis through the Python package (the reference
interpreter), against torch in float64."""

import zlib

import pytest
import torch

import kfuse
from conftest import example

SIZES = [(1, 1), (3, 5), (4, 17), (33, 64)]


def close(got, want, what, rtol=2e-4, atol=2e-5):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def layer_norm(x, gamma, beta, dy):
    d = x.shape[-1]
    return torch.nn.functional.layer_norm(x, (d,), gamma, beta, eps=1e-5)


def rms_norm(x, weight, dy):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps=1e-5)


def gelu_bias(x, bias, dy):
    return torch.nn.functional.gelu(x + bias)


# example stem -> (the torch function of y, its inputs in order, the outputs after y)
CASES = {
    "layer_norm_train": (layer_norm, ["x", "gamma", "beta", "dy"], ["dx", "dgamma", "dbeta"]),
    "rms_norm_train": (rms_norm, ["x", "weight", "dy"], ["dx", "dweight"]),
    "gelu_bias_train": (gelu_bias, ["x", "bias", "dy"], ["dx", "dbias"]),
}


@pytest.mark.parametrize("stem", sorted(CASES))
@pytest.mark.parametrize("b,d", SIZES)
def test_norm_examples_match_torch_in_float64(stem, b, d):
    fn, names, grads = CASES[stem]
    gen = torch.Generator().manual_seed(zlib.crc32(f"{stem} {b} {d}".encode()))
    shapes = {"x": (b, d), "dy": (b, d)}
    x = {n: torch.randn(*shapes.get(n, (d,)), generator=gen) for n in names}
    out = kfuse.load(example(f"{stem}.kf"))(**x)
    ref = {n: v.double().requires_grad_(n != "dy") for n, v in x.items()}
    y = fn(*(ref[n] for n in names))
    diffs = [n for n in names if n != "dy"]
    want = dict(zip(["y"] + grads, [y] + list(torch.autograd.grad((y * ref["dy"]).sum(), [ref[n] for n in diffs]))))
    assert list(out.keys()) == list(want)
    for name, w in want.items():
        close(out[name], w.detach(), f"{stem} [{b}, {d}] {name}")


PROGRAM = """
input x: f32[A, B, C]
input m: bool[B, C]
output s0 = sum(x, axis: 0)
output s1 = mean(x, axis: -2, keepdim: true)
output s02 = max(x, axis: [0, 2])
output sm = sum(x, axis: [0, 1], where: m, keepdim: true)
"""


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 5, 2), (2, 33, 3)])
def test_reductions_over_any_axes_match_torch(shape):
    prog = kfuse.compile(PROGRAM)
    gen = torch.Generator().manual_seed(zlib.crc32(f"axes {shape}".encode()))
    x = torch.randn(*shape, generator=gen)
    m = torch.rand(*shape[1:], generator=gen) < 0.6
    out = prog(x=x, m=m)
    xd = x.double()
    close(out["s0"], xd.sum(0), "s0")
    close(out["s1"], xd.mean(-2, keepdim=True), "s1")
    close(out["s02"], xd.amax((0, 2)), "s02")
    close(out["sm"], torch.where(m, xd, 0.0).sum((0, 1), keepdim=True), "sm")
