"""`kfuse.explain` says how each fused kernel was made ready (NVRTC tier: skips without the
NVRTC wheel): with CPU inputs and `arch`, each region's kernels are built for that architecture
before the run, compiled by NVRTC the first time and found in memory the next; without `arch`
nothing is built; a bad `arch` is a clear error."""

import random

import pytest
import torch

import kfuse
from kfuse._backend import _kernel_of


def nvrtc_or_skip():
    from kfuse import _nvrtc

    if _nvrtc.locate() is None:
        pytest.skip("NVRTC tier: no libnvrtc (the nvidia-cuda-nvrtc wheel is not installed)")


def make(scale):
    def fn(x, w):
        return (torch.softmax(x * scale, dim=-1) * w).sum()

    return fn


def inputs():
    gen = torch.Generator().manual_seed(31)
    return torch.randn(5, 37, generator=gen, requires_grad=True), torch.randn(37, generator=gen, requires_grad=True)


def test_explain_builds_each_kernel_for_an_arch_and_says_how():
    nvrtc_or_skip()
    torch._dynamo.reset()
    # A constant no earlier run has used: its kernels are in no cache yet.
    fn = make(1 + random.Random().random())
    report = kfuse.explain(fn, *inputs(), arch="sm_90")
    assert report.kernels, str(report)
    for k in report.kernels:
        assert k.builds is not None, str(report)
        # One build per entry point: a row kernel's entry for rows in registers is its own unit.
        assert len({_kernel_of(name) for name, _, _ in k.builds}) == k.kernels, str(report)
        assert all(name.startswith("kf_") and how == "compiled" and seconds > 0 for name, how, seconds in k.builds)
    assert "compiled by NVRTC in" in str(report)
    torch._dynamo.reset()
    again = kfuse.explain(fn, *inputs(), arch="sm_90")
    assert [b[0] for k in again.kernels for b in k.builds] == [b[0] for k in report.kernels for b in k.builds]
    assert all(how == "memory" for k in again.kernels for _, how, _ in k.builds), str(again)
    assert "from the kernel cache (memory)" in str(again)


def test_explain_builds_nothing_for_cpu_inputs_without_an_arch():
    torch._dynamo.reset()
    report = kfuse.explain(make(2.0), *inputs())
    assert report.kernels and all(k.builds is None for k in report.kernels), str(report)
    assert "NVRTC" not in str(report)


def test_a_bad_arch_is_a_clear_error():
    with pytest.raises(ValueError, match="sm_90"):
        kfuse.explain(make(2.0), *inputs(), arch="hopper")


def test_explain_counts_a_kernel_once_whatever_its_entry_points():
    # Layer norm's backward: the row kernel (two entry points) and the column kernel of the weight
    # gradients (its own entry and the fold of the sums the row kernel takes): two kernels.
    torch._dynamo.reset()

    def layer_norm(x, w, b):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)

    gen = torch.Generator().manual_seed(5)
    args = [torch.randn(*s, generator=gen, requires_grad=True) for s in ((7, 33), (33,), (33,))]
    report = kfuse.explain(layer_norm, *args)
    backward = [k for k in report.kernels if k.graph == "backward"]
    assert [k.kernels for k in backward] == [2], str(report)
    assert "rows of the last reduced axis" in backward[0].shapes[0], str(report)
    assert "as columns" in backward[0].shapes[1], str(report)
