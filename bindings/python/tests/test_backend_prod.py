"""`torch.prod` through the kfuse backend: along the last axis, along the first with keepdim,
over every element, with rows holding no zero, one zero and two zeros, forward and gradients
against eager in float64 (CPU tier: the interpreter; GPU tier: the kernels, odd sizes); the
forward's product fuses (its backward is PyTorch's formula, with cumprod, left to PyTorch); a
product of integers is left to PyTorch with its reason."""

import pytest
import torch

import kfuse


def along_rows(x, w):
    return (torch.prod(x * 1.001, dim=-1) * w[: x.shape[0]]).sum()


def along_columns(x, w):
    return (torch.prod(x, dim=0, keepdim=True) - w[: x.shape[1]]).square().mean()


def everything(x, w):
    return torch.prod(x * 1.0001) * w.sum()


def data(rows, cols, device, seed):
    gen = torch.Generator().manual_seed(seed)
    x = 1 + 0.05 * torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    if rows >= 3 and cols >= 2:
        x[1, cols // 2] = 0.0  # one zero
        x[2, 0] = x[2, cols - 1] = 0.0  # two zeros
    w = torch.randn(max(rows, cols), generator=gen, dtype=torch.float64)
    return x.to(device), w.to(device)


def check(fn, x, w, tol):
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="kfuse")
    xf, wf = x.float().requires_grad_(), w.float().requires_grad_()
    got = compiled(xf, wf)
    gx, gw = torch.autograd.grad(got, [xf, wf])
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    want = fn(x64, w64)
    ex, ew = torch.autograd.grad(want, [x64, w64])
    for name, g, e in (("out", got, want), ("grad x", gx, ex), ("grad w", gw, ew)):
        err = float((g.detach().double() - e.detach()).abs().max() / e.detach().abs().max().clamp(min=1e-30))
        assert err <= tol, f"{fn.__name__} {name}: relative error {err:.2e} > {tol:g}"


@pytest.mark.parametrize("fn", [along_rows, along_columns, everything])
def test_prod_and_its_gradient_match_eager_on_the_cpu(fn):
    x, w = data(7, 33, "cpu", 21)
    check(fn, x, w, 1e-5)
    report = kfuse.explain(fn, x.float().requires_grad_(), w.float().requires_grad_())
    # The forward's product fuses; the backward is PyTorch's formula (cumprod, flip), not fused.
    assert not [f for f in report.fallbacks if f.graph == "forward" and "prod" in f.op], str(report)
    assert any("aten.prod" in op for k in report.kernels if k.graph == "forward" for op in k.ops), str(report)
    # The backward's `ones` for cumprod's shift reads no tensor: a region of it would not know
    # the graph's device (on a GPU its output came back on the CPU).
    assert all("input " in k.source for k in report.kernels), str(report)


def test_a_product_of_integers_stays_in_pytorch_with_its_reason():
    def ints(k, x):
        return (torch.prod(k * 2, dim=-1) * x).sum()

    k = torch.arange(1, 13).reshape(3, 4) % 3 + 1
    report = kfuse.explain(ints, k, torch.randn(3, requires_grad=True))
    reasons = [f.reason for f in report.fallbacks if "prod" in f.op]
    assert reasons and any("integers" in r for r in reasons), str(report)


@pytest.mark.parametrize("rows,cols", [(3, 1000), (1023, 37), (5, 5003)])
@pytest.mark.parametrize("fn", [along_rows, along_columns, everything])
def test_prod_and_its_gradient_match_eager_on_the_gpu(gpu, fn, rows, cols):
    x, w = data(rows, cols, gpu, rows * 7 + cols)
    # Thousands of factors near 1: keep the products finite (the data are the same for both).
    x = torch.where(x == 0, x, 1 + (x - 1) * 0.02)
    # Each f32 factor (`x * 1.001`) is rounded once, which float64 does not do: a product of n of
    # them may be up to n half-ulps of f32 away.
    factors = {along_rows: cols, along_columns: rows, everything: rows * cols}[fn]
    check(fn, x, w, max(1e-4, 2 * factors * 2.0**-24))
