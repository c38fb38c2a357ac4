"""`kfuse.explain` says how each fused kernel was made ready (NVRTC tier: skips without the
NVRTC wheel): with CPU inputs and `arch`, each region's kernels are built for that architecture
before the run, compiled by NVRTC the first time and found in memory the next; without `arch`
nothing is built; a bad `arch` is a clear error."""

import random

import pytest
import torch

import kfuse


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
        assert len({name.removesuffix("_regs") for name, _, _ in k.builds}) == k.kernels, str(report)
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
