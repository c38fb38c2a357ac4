"""Random chains of the ops the backend lowers (pads that crop, rolls, flips, reductions kept or
broadcast back, softmaxes, norms, cats, slices with steps, transposes, selects, gathers, maxima
and their ties) and of some it leaves to PyTorch (cumsum, cummax, topk) between them
on tensors of one to three axes of odd sizes, compiled with ``backend="kfuse"``: the output and
the input's gradient against eager PyTorch, and a third of the seeds again with every size a
symbol (``dynamic=True``). Each case is a seed (it names the chain when it fails);
``KFUSE_FUZZ_SEEDS=N`` runs N seeds instead of the default, ``KFUSE_FUZZ_START`` moves the
first. CPU tier: the regions run in kfuse's interpreter; GPU tier: in its kernels."""

import os
import random

import pytest
import torch
import torch.nn.functional as F

from kfuse import _backend

SEEDS = int(os.environ.get("KFUSE_FUZZ_SEEDS", "48"))
START = int(os.environ.get("KFUSE_FUZZ_START", "0"))


@pytest.fixture(autouse=True)
def fresh_dynamo():
    limit = torch._dynamo.config.cache_size_limit
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch._dynamo.config.cache_size_limit = limit


def _ops(r, x):
    """(name, op) pairs for a tensor shaped like `x`, every parameter drawn from `r` now."""
    n = x.dim()
    ops = [
        ("sin", torch.sin),
        ("exp", lambda x: x.exp().clamp(max=5)),
        ("affine", lambda x: x * 2 - 1),
        ("sqrt_abs", lambda x: x.abs().sqrt()),
        ("tanh", torch.tanh),
        ("square", lambda x: x.pow(2)),
        ("gelu", F.gelu),
        ("leaky_where", lambda x: torch.where(x > 0, x, x * 0.1)),
    ]
    if n == 0:
        return ops
    d = r.randrange(n)
    size = x.shape[d]
    before, after = r.randint(-min(3, size - 1), 3), r.randint(-min(3, size - 1), 3)
    if size + min(before, 0) + min(after, 0) >= 1:
        pad, value = [0, 0] * (n - 1 - d) + [before, after], r.choice([0.0, 1.5])
        ops.append((f"pad {pad} with {value}", lambda x: F.pad(x, pad, value=value)))
    shift, half, copies = r.randint(-4, 4), max(1, size // 2), r.randint(1, 4)
    ops += [
        (f"roll {shift} along {d}", lambda x: x.roll(shift, d)),
        (f"flip {d}", lambda x: x.flip(d)),
        (f"sum along {d} broadcast back", lambda x: x.sum(d, keepdim=True).expand_as(x) * 0.5 + x),
        (f"centred along {d}", lambda x: x.mean(d, keepdim=True) - x),
        (f"amax along {d} times x", lambda x: x.amax(d, keepdim=True) * x),
        (f"softmax {d}", lambda x: x.softmax(d)),
        (f"log_softmax {d}", lambda x: x.log_softmax(d)),
        (f"cat along {d}", lambda x: torch.cat([x, x * 2], d)),
        (f"narrow {d} to {half}", lambda x: x.narrow(d, 0, half)),
        (f"every second along {d}", lambda x: x[(slice(None),) * d + (slice(None, None, 2),)]),
        (f"{copies} copies along {d} summed", lambda x: x.unsqueeze(d).expand(*x.shape[:d], copies, *x.shape[d:]).sum(d)),
        (f"var along {d}", lambda x: x.var(d, keepdim=True, correction=int(size > 1)) + x),
        (f"std along {d}", lambda x: x.std(d, keepdim=True, correction=int(size > 1)) * x),
        (f"argmax along {d}", lambda x: x.argmax(d, keepdim=True).float() + x),
        (f"max along {d}", lambda x: x.max(d, keepdim=True)[0] + x),
        (f"norm along {d}", lambda x: x.norm(dim=d, keepdim=True) + x),
        (f"index_select along {d}", lambda x: x.index_select(d, torch.tensor([0, size - 1, 0], device=x.device))),
        (f"sum along {d}", lambda x: x.sum(d)),
        (f"outer along {d}", lambda x: x.unsqueeze(d) * x.unsqueeze(d)),
        (f"logsumexp along {d}", lambda x: torch.logsumexp(x, d, keepdim=True) - x),
        (f"normalize along {d}", lambda x: F.normalize(x, dim=d)),
        ("layer_norm", lambda x: F.layer_norm(x, x.shape[-1:])),
        (f"maximum with its flip along {d}", lambda x: torch.maximum(x, x.flip(d))),
        ("masked_fill", lambda x: x.masked_fill(x > 0.5, -1.0)),
        ("clamp", lambda x: x.clamp(-0.5, 0.7)),
        ("integer remainder", lambda x: ((x * 3).long() % 5).float() + x),
        (f"gather of the argmax along {d}", lambda x: x.gather(d, x.argmax(d, keepdim=True)) + x),
        (f"cummax along {d}", lambda x: x.cummax(d)[0]),
        (f"cumsum along {d}", lambda x: x.cumsum(d)),
        (f"topk along {d}", lambda x: x.topk(1, d)[0] * x),
        ("centred on the mean", lambda x: x - x.mean()),
        (f"min along {d}", lambda x: x.min(d, keepdim=True)[0] * x),
        (f"prod along {d}", lambda x: (x.tanh() * 0.5 + 1).prod(d, keepdim=True) + x),
        ("bce with logits", lambda x: F.binary_cross_entropy_with_logits(x, (x > 0).float(), reduction="none")),
        ("silu times x", lambda x: F.silu(x) * x),
        (f"where equal to the amax along {d}", lambda x: torch.where(x == x.amax(d, keepdim=True), x, 0.0)),
        (f"minus the amin along {d}", lambda x: x - x.amin(d, keepdim=True)),
        (f"repeat along {d}", lambda x: x.repeat(*([1] * d + [2] + [1] * (x.dim() - d - 1)))),
    ]
    if n >= 2:
        e = (d + 1) % n
        ops += [(f"transpose {d} {e}", lambda x: x.transpose(d, e) * 1.0), ("flatten 0 1", lambda x: x.flatten(0, 1))]
    return ops


def _chain(seed, x):
    """A function of 2 to 6 ops drawn for `x`'s shape (each kept when it applies and leaves 1 to
    4000 elements), and the ops' names."""
    r = random.Random(seed)
    chain = []
    with torch.no_grad():
        for _ in range(r.randint(2, 6)):
            name, op = r.choice(_ops(r, x))
            try:
                y = op(x)
            except (RuntimeError, IndexError):
                continue
            if 1 <= y.numel() <= 4000:
                chain.append((name, op))
                x = y

    def fn(x):
        for _, op in chain:
            x = op(x)
        return x

    return fn, [name for name, _ in chain]


@pytest.mark.parametrize("seed", range(START, START + SEEDS))
@pytest.mark.parametrize("on_gpu", [False, True], ids=["cpu", "gpu"])
def test_random_chains_match_eager_with_gradients(seed, on_gpu, request):
    _check_chain(seed, request.getfixturevalue("gpu") if on_gpu else torch.device("cpu"), dynamic=None)


@pytest.mark.parametrize("seed", range(START, START + SEEDS // 3))
@pytest.mark.parametrize("on_gpu", [False, True], ids=["cpu", "gpu"])
def test_random_chains_match_eager_with_every_size_a_symbol(seed, on_gpu, request):
    # dynamic=True: the sizes are symbols of the programs, constants only where a slice, a cat or
    # a merged row needs them.
    _check_chain(seed, request.getfixturevalue("gpu") if on_gpu else torch.device("cpu"), dynamic=True)


def _check_chain(seed, device, dynamic):
    torch._dynamo.config.cache_size_limit = 64
    r = random.Random(seed * 7 + 1)
    shape = [r.randint(1, 9) for _ in range(r.randint(1, 3))]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)
    fn, names = _chain(seed, x)
    what = f"seed {seed}, shape {shape}, ops {names}{', dynamic' if dynamic else ''}"
    x.requires_grad_()
    want = fn(x)
    upstream = torch.randn(want.shape, generator=torch.Generator().manual_seed(seed + 1)).to(device)
    (want_grad,) = torch.autograd.grad(want, x, upstream)
    got = torch.compile(fn, backend=_backend.backend, dynamic=dynamic)(x)
    (got_grad,) = torch.autograd.grad(got, x, upstream)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, equal_nan=True, msg=lambda m: f"{what}, output: {m}")
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-4, atol=1e-4, equal_nan=True, msg=lambda m: f"{what}, gradient: {m}")
