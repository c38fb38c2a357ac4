"""CPU tier: every example through the Python package (the reference interpreter) against the same
math written in torch in float64: outputs, and gradients with respect to every float input."""

import zlib

import pytest
import torch

import kfuse
import refs
from conftest import EXAMPLES, boxes, example

SIZES = [(1, 1), (3, 5), (4, 17)]


def predicate_batch(gen, b, n):
    pred, target = boxes(gen, b, n), boxes(gen, b, n)
    pad = torch.rand(b, n, generator=gen) < 0.3
    target[..., 3] = torch.where(pad, torch.zeros(()), target[..., 3])
    # Padding rows of pred hold garbage that must not leak into the loss.
    pred[pad] = pred[pad] * 1e3
    return {"pred": pred, "target": target}


def lengths_batch(gen, b, n):
    lengths = torch.randint(0, n + 1, (b,), generator=gen, dtype=torch.int32)
    lengths[0] = n
    pred, target = boxes(gen, b, n), boxes(gen, b, n)
    return {"pred": pred, "target": target, "lengths": lengths}


def packed_batch(gen, b, n):
    counts = torch.randint(0, n + 1, (b,), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]).to(torch.int32)
    t = int(offsets[-1])
    return {"pred": boxes(gen, t), "target": boxes(gen, t), "offsets": offsets}


def logits_batch(gen, b, n):
    logits = torch.randn(b, n + 2, generator=gen, dtype=torch.float64) * 2
    targets = (torch.rand(b, n + 2, generator=gen) < 0.3).to(torch.float64)
    return {"logits": logits, "targets": targets}


def xent_batch(gen, b, n):
    logits = torch.randn(b, n + 2, generator=gen, dtype=torch.float64) * 2
    targets = torch.softmax(torch.randn(b, n + 2, generator=gen, dtype=torch.float64), -1)
    return {"logits": logits, "targets": targets}


def labels_batch(gen, b, n):
    """Logits and int64 class labels, every third row after the first ignored (-100)."""
    c = n + 2
    logits = torch.randn(b, c, generator=gen, dtype=torch.float64) * 2
    labels = torch.randint(0, c, (b,), generator=gen, dtype=torch.int64)
    labels[1::3] = -100
    return {"logits": logits, "labels": labels}


def keypoint_batch(gen, b, n):
    lengths = torch.randint(0, n + 1, (b,), generator=gen, dtype=torch.int32)
    return {
        "pred": torch.randn(b, n, 3, generator=gen, dtype=torch.float64),
        "target": torch.randn(b, n, 3, generator=gen, dtype=torch.float64),
        "lengths": lengths,
    }


def dropout_batch(gen, b, n):
    lengths = torch.randint(0, n + 1, (b,), generator=gen, dtype=torch.int32)
    seed = torch.randint(-(2**62), 2**62, (), generator=gen, dtype=torch.int64)
    return {"x": torch.randn(b, n, generator=gen, dtype=torch.float64), "lengths": lengths, "seed": seed}


def giou_pred(x):
    return refs.masked_mean(refs.giou_terms(x["pred"], x["target"]), x["target"][..., 3] != 0)


def giou_len(x):
    n = x["pred"].shape[1]
    return refs.masked_mean(refs.giou_terms(x["pred"], x["target"]), refs.lengths_mask(x["lengths"], n))


def giou_packed(x):
    per = refs.giou_terms(x["pred"], x["target"])
    return per.sum() / max(per.shape[0], 1)


def sl1_pred(x):
    valid = (x["target"][..., 3] != 0)[..., None]
    return refs.masked_mean(refs.smooth_l1_terms(x["pred"], x["target"]), valid)


def sl1_len(x):
    n = x["pred"].shape[1]
    valid = refs.lengths_mask(x["lengths"], n)[..., None]
    return refs.masked_mean(refs.smooth_l1_terms(x["pred"], x["target"]), valid)


def sl1_packed(x):
    per = refs.smooth_l1_terms(x["pred"], x["target"])
    return per.sum() / max(per.numel(), 1)


def keypoint(x):
    d = x["pred"] - x["target"]
    n = x["pred"].shape[1]
    return refs.masked_mean((d * d).sum(-1), refs.lengths_mask(x["lengths"], n))


def focal(x):
    return refs.focal(x["logits"], x["targets"])


def xent(x):
    return refs.softmax_xent(x["logits"], x["targets"])


def cross_entropy(x):
    return torch.nn.functional.cross_entropy(x["logits"], x["labels"], ignore_index=-100, label_smoothing=0.1)


def nll(x):
    log_probs = torch.log_softmax(x["logits"], -1)
    return torch.nn.functional.nll_loss(log_probs, x["labels"], ignore_index=-100)


def dropout_gelu(x):
    keep = refs.philox_uniform(x["seed"], x["x"].shape) >= 0.1
    y = torch.where(keep, torch.nn.functional.gelu(x["x"]) / 0.9, torch.zeros(()))
    return refs.masked_mean(y, refs.lengths_mask(x["lengths"], x["x"].shape[1]))


# example stem -> (batch maker, loss in torch, the input a training example differentiates)
CASES = {
    "giou": (predicate_batch, giou_pred, None),
    "giou_train": (predicate_batch, giou_pred, "pred"),
    "giou_lengths": (lengths_batch, giou_len, None),
    "giou_train_lengths": (lengths_batch, giou_len, "pred"),
    "giou_packed": (packed_batch, giou_packed, None),
    "giou_train_packed": (packed_batch, giou_packed, "pred"),
    "smooth_l1": (predicate_batch, sl1_pred, None),
    "smooth_l1_train": (predicate_batch, sl1_pred, "pred"),
    "smooth_l1_train_lengths": (lengths_batch, sl1_len, "pred"),
    "smooth_l1_train_packed": (packed_batch, sl1_packed, "pred"),
    "keypoint_l2_train_lengths": (keypoint_batch, keypoint, "pred"),
    "focal": (logits_batch, focal, None),
    "focal_train": (logits_batch, focal, "logits"),
    "softmax_xent": (xent_batch, xent, None),
    "softmax_xent_train": (xent_batch, xent, "logits"),
    "cross_entropy_train": (labels_batch, cross_entropy, "logits"),
    "gather_nll": (labels_batch, nll, "logits"),
    "dropout_train": (dropout_batch, dropout_gelu, "x"),
}


# Examples with outputs other than a loss and its gradient, each checked by its own test below.
OWN_TESTS = {"elementwise_ops", "layer_norm_train", "rms_norm_train", "gelu_bias_train"}  # the last three: test_norm_examples.py


def test_every_example_has_a_case():
    stems = sorted(p.stem for p in EXAMPLES.glob("*.kf"))
    assert stems == sorted(set(CASES) | OWN_TESTS), "add the new example to CASES"


def as_kfuse(x):
    """float64 reference inputs as the f32 tensors kfuse takes (ints keep their dtype)."""
    return {k: v.float() if v.is_floating_point() else v for k, v in x.items()}


def reference(stem, x):
    """The outputs of example `stem` on inputs `x` (float64): loss, and d loss / d input."""
    _, loss_fn, wrt = CASES[stem]
    x = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in x.items()}
    loss = loss_fn(x)
    out = {"loss": loss.detach()}
    if wrt is not None:
        (g,) = torch.autograd.grad(loss, x[wrt])
        out["d" + wrt] = g
    return out


def close(got, want, what, rtol=2e-4, atol=2e-5):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("stem", sorted(CASES))
@pytest.mark.parametrize("b,n", SIZES)
def test_outputs_match_torch_in_float64(stem, b, n):
    prog = kfuse.load(example(f"{stem}.kf"))
    gen = torch.Generator().manual_seed(zlib.crc32(f"{stem} {b} {n}".encode()))
    x = CASES[stem][0](gen, b, n)
    out = prog(**as_kfuse(x))
    want = reference(stem, x)
    assert list(out.keys()) == [d.name for d in prog.outputs] == list(want)
    for name, w in want.items():
        assert out[name].dtype == torch.float32
        close(out[name], w, f"{stem} {name}")


@pytest.mark.parametrize("stem", sorted(CASES))
def test_gradients_of_every_float_input_match_torch_autograd(stem):
    prog = kfuse.load(example(f"{stem}.kf"))
    gen = torch.Generator().manual_seed(7)
    x = CASES[stem][0](gen, 3, 6)
    loss_fn = CASES[stem][1]
    floats = [k for k, v in x.items() if v.is_floating_point()]
    ref = {k: v.clone().requires_grad_(k in floats) for k, v in x.items()}
    want = torch.autograd.grad(loss_fn(ref), [ref[k] for k in floats])
    inputs = {k: v.clone().requires_grad_(k in floats) for k, v in as_kfuse(x).items()}
    out = prog(**inputs)
    # Scaled, so that the backward's use of the upstream gradient is checked too.
    (out.loss * 2.5).backward()
    for k, w in zip(floats, want):
        assert inputs[k].grad is not None, f"{stem}: no gradient for `{k}`"
        assert inputs[k].grad.dtype == torch.float32
        close(inputs[k].grad, 2.5 * w, f"{stem} d loss / d {k}")


@pytest.mark.parametrize("layout", ["lengths", "packed"])
def test_with_gradients_of_the_forward_example_is_the_training_example(layout):
    fwd = kfuse.load(example(f"giou_{layout}.kf"))
    train = kfuse.load(example(f"giou_train_{layout}.kf"))
    derived = fwd.with_gradients("loss", "pred")
    assert [d.name for d in derived.outputs] == ["loss", "grad_pred"]
    # The same graph node for node (the generated code differs only in the hash of the names).
    assert derived._native.graph_text() == train._native.graph_text().replace("dpred", "grad_pred")
    gen = torch.Generator().manual_seed(3)
    x = as_kfuse((lengths_batch if layout == "lengths" else packed_batch)(gen, 4, 9))
    a, b = derived(**x), train(**x)
    assert torch.equal(a.loss, b.loss) and torch.equal(a.grad_pred, b.dpred)


def test_no_gradient_is_computed_without_requires_grad():
    prog = kfuse.load(example("giou_lengths.kf"))
    x = as_kfuse(lengths_batch(torch.Generator().manual_seed(1), 2, 3))
    out = prog(**x)
    assert out.loss.grad_fn is None and not out.loss.requires_grad
    with torch.no_grad():
        x["pred"].requires_grad_()
        assert prog(**x).loss.grad_fn is None


def wrap_i32(v):
    """int64 values as the i32 two's-complement results (kfuse's i32 `+`, `*` and `<<` wrap)."""
    return (v + 2**31) % 2**32 - 2**31


def int_div_or_zero(a, b, op):
    """`op` (torch.remainder, torch.fmod or torch.floor_divide) elementwise, 0 where b is 0."""
    safe = torch.where(b == 0, torch.ones_like(b), b)
    return torch.where(b == 0, torch.zeros_like(a), op(a, safe))


def shift(v, count, left):
    """kfuse's shifts: a count outside 0..31 gives 0 (left) or the sign (right)."""
    inside = (count >= 0) & (count <= 31)
    c = count.clamp(0, 31)
    if left:
        return torch.where(inside, v * (2**c), torch.zeros_like(v))
    return torch.where(inside, torch.div(v, 2**c, rounding_mode="floor"), torch.where(v < 0, -1, 0))


def elementwise_ops_ref(x, y, k):
    """examples/elementwise_ops.kf in float64 / int64 torch: every output but the gradients."""
    q = x * 4.0
    s, d = k - 4, k - 3
    logic = ((s & 6) ^ (k | -8)) + ~s
    shifts = shift(s, k * 5, left=True) + shift(-1000 * s, s * 9, left=False)
    terms = torch.log1p(x.abs()) * torch.expm1(y) + torch.atan(x) * torch.tan(y) + torch.asin(x * 0.5) * torch.acos(
        y * 0.5
    )
    more = (
        torch.sinh(x) * torch.cosh(y)
        + torch.atan2(x, y + 2.0)
        + torch.remainder(q, 1.5) * y
        + (x * y + x) * torch.round(y)
    )
    signed = torch.fmod(x * 0.25 + 3.0, y * 0.125 + 2.0) * y + torch.hypot(x, y + 2.0) + torch.copysign(x, y) * y
    lgamma, digamma, erfinv = torch.lgamma, torch.digamma, torch.erfinv
    trigamma = lambda v: torch.special.polygamma(1, v)  # noqa: E731
    special = (
        lgamma(x.abs() + 0.5) * y
        + digamma(y.abs() + 0.7) * x
        + lgamma(x * 0.25 - 0.5) * digamma(-0.1 - y.abs() * 0.2)
        + erfinv(torch.tanh(x) * 0.8) * y
        + torch.erfc(x * 2.0) * y
    )
    flag = lambda c, v: torch.where(c, v, 0)  # noqa: E731
    return {
        "smooth": torch.log1p(x.abs()) * torch.expm1(y) * torch.cosh(y),
        "trig": (torch.atan(x) + 2.0)
        * (torch.tan(y) + 2.0)
        * (torch.asin(x * 0.5) + torch.acos(y * 0.5))
        * torch.sinh(x + 2.0),
        "angle": torch.atan2(x, y),
        "magnitude": torch.hypot(x, y) * torch.copysign(x + 2.0, y),
        "gamma": (lgamma(x.abs() + 0.5) + 2.0) * (digamma(y.abs() + 0.5) + 4.0) * (lgamma(x * 0.25 - 0.5) + 1.0),
        "polygamma": digamma(-0.1 - x.abs() * 0.2) * trigamma(y.abs() + 0.25) + trigamma(-0.1 - y.abs() * 0.2),
        "inverse_erf": erfinv(torch.tanh(y) * 0.9) * (erfinv(x * 0.5) + 2.0),
        "complementary_erf": torch.erfc(x * 2.0) * (torch.erfc(-y) + 1.0),
        "erfc_tail": torch.erfc(y.abs() + 3.0) * 1e8,
        "rounded_product": torch.zeros_like(x),  # f32 values: rounded(v) is v
        "rounded": torch.round(q) + torch.trunc(y * 4.0) * 8.0 - torch.ceil(q) * torch.sign(y) * 64.0,
        "modular": torch.remainder(q, 1.5) + torch.floor(y * 4.0 / -0.75) * 8.0 + (x * y + 0.25),
        "truncated": torch.fmod(q, 1.5) + torch.fmod(-q, y) * 4.0,
        "flags": flag(torch.isnan(torch.log(x)), 1)
        + flag(torch.isinf(torch.log(torch.round(q).abs())), 2)
        + flag(torch.isfinite(y / x), 4),
        "bits": wrap_i32(
            logic
            + shifts
            + int_div_or_zero(s, d, torch.remainder) * 16
            + int_div_or_zero(s * 100, d, torch.floor_divide) * 1024
            + (s * d + k) * 65536
        ),
        "int_fmod": int_div_or_zero(s * 7, d, torch.fmod) + int_div_or_zero(-1000 * s, k - 5, torch.fmod) * 1024,
        "loss": (terms + more + signed + special).mean(),
    }


@pytest.mark.parametrize("b,n", SIZES)
def test_elementwise_ops_match_torch(b, n):
    """Every output of the tour of elementwise functions against torch (float64, int64 wrapped to
    i32), and its gradients against torch autograd. x and y lie in (-1.5, 1.5), inside every
    function's domain; some x are 0 or negative, so that the NaN/infinity flags take each value."""
    prog = kfuse.load(example("elementwise_ops.kf"))
    gen = torch.Generator().manual_seed(zlib.crc32(f"elementwise_ops {b} {n}".encode()))
    x = torch.rand(b, n, generator=gen) * 3 - 1.5
    x.view(-1)[::3] = 0.0
    y = torch.rand(b, n, generator=gen) * 3 - 1.5
    k = torch.randint(0, 8, (b, n), generator=gen, dtype=torch.int32)
    out = prog(x=x, y=y, k=k)
    xd, yd = x.double().requires_grad_(), y.double().requires_grad_()
    want = elementwise_ops_ref(xd, yd, k.long())
    want["dx"], want["dy"] = torch.autograd.grad(want["loss"], [xd, yd])
    assert list(out.keys()) == [d.name for d in prog.outputs] == list(want)
    for name, w in want.items():
        if name in ("flags", "bits", "int_fmod"):
            assert out[name].dtype == torch.int32, name
            assert torch.equal(out[name].long(), w), f"{name}: {out[name]} != {w}"
        else:
            assert out[name].dtype == torch.float32, name
            close(out[name], w.detach(), f"elementwise_ops {name}")
