"""`torch.compile(fn, backend="kfuse", mode="reduce-overhead")`: the fused graphs replayed from
CUDA graphs (PyTorch's CUDA graph trees). Pure tier: on the CPU the mode is accepted and the graphs
run as they are, with the same results; GPU tier: the forward and backward replay from CUDA graphs,
step after step on fresh data and at a new batch size, and match eager in float64."""

import logging

import pytest
import torch
import torch.nn.functional as F

import kfuse  # noqa: F401 -- registers nothing: the entry point does; kept for the backend module
from kfuse import _backend


def norm_gelu(x, w, b):
    """A layer norm, a GELU and a mean: two reductions along the row and a full one."""
    return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b)).mean()


def inputs(gen, rows, cols, device, dtype=torch.float32):
    x = torch.randn(rows, cols, generator=gen, dtype=torch.float64).to(device, dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(cols, generator=gen, dtype=torch.float64)).to(device, dtype).requires_grad_()
    b = (0.1 * torch.randn(cols, generator=gen, dtype=torch.float64)).to(device, dtype).requires_grad_()
    return x, w, b


def step(fn, args):
    out = fn(*args)
    return [out.detach().clone(), *(g.clone() for g in torch.autograd.grad(out, args))]


def reference(args):
    leaves = [a.detach().double().requires_grad_() for a in args]
    return step(norm_gelu, leaves)


def close(got, want, tol):
    for g, w in zip(got, want):
        err = float((g.double() - w).abs().max() / w.abs().max().clamp(min=1e-30))
        assert err <= tol, f"relative error {err:.2e} > {tol:g}"


def test_the_mode_is_taken_on_the_cpu_and_the_graphs_run_as_they_are(caplog):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(11)
    compiled = torch.compile(norm_gelu, backend="kfuse", mode="reduce-overhead")
    before = _backend.stats["compiles"] + _backend.stats["reused"]
    with caplog.at_level(logging.WARNING):
        for rows, cols in ((7, 33), (7, 33), (13, 33)):
            args = inputs(gen, rows, cols, "cpu")
            close(step(compiled, args), reference(args), 1e-5)
    # The backend read the mode (AOTAutograd would have warned that it ignores it) and fused.
    assert not any("ignoring extra kwargs" in r.getMessage() for r in caplog.records)
    assert _backend.stats["compiles"] + _backend.stats["reused"] > before


def test_options_other_than_cuda_graphs_change_nothing():
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(12)
    compiled = torch.compile(norm_gelu, backend="kfuse", options={"max_autotune": True})
    args = inputs(gen, 5, 19, "cpu")
    close(step(compiled, args), reference(args), 1e-5)


def graph_launches(fn):
    """The CUDA graph launches (``cudaGraphLaunch``) while `fn` runs, from the profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if "cudaGraphLaunch" in e.name)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_forward_and_backward_replay_from_cuda_graphs_and_match_eager(gpu, dtype, tol):
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    gen = torch.Generator().manual_seed(13)
    compiled = torch.compile(norm_gelu, backend="kfuse", mode="reduce-overhead")
    # Warm-up and recording take the first calls at each size; fresh data every step. The larger
    # size grows kfuse's workspace after the smaller one's graphs were recorded: replaying those
    # later must not touch the buffers the growth replaced.
    for rows, cols in ((64, 1000),) * 4 + ((257, 1000),) * 4 + ((64, 1000),) * 2:
        args = inputs(gen, rows, cols, gpu, dtype)
        want = reference(args)
        close(step(compiled, args), want, tol)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    args = inputs(gen, 64, 1000, gpu, dtype)
    want = reference(args)
    got = []
    # A replayed step: the forward and the backward each replay a CUDA graph.
    assert graph_launches(lambda: got.extend(step(compiled, args))) >= 2
    close(got, want, tol)


def test_dropout_draws_a_new_mask_on_every_replay(gpu):
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    torch.manual_seed(14)
    compiled = torch.compile(lambda x: F.dropout(x * 2, p=0.5, training=True), backend="kfuse", mode="reduce-overhead")
    x = torch.ones(4099, device=gpu)
    kept = [(compiled(x) != 0).clone() for _ in range(6)]
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    for k in kept:
        assert 0.45 < k.float().mean().item() < 0.55
    # Calls 3 to 6 replay the recorded graph: each draws its own mask.
    for a, b in zip(kept[2:], kept[3:]):
        assert not torch.equal(a, b)
    assert graph_launches(lambda: compiled(x)) >= 1
