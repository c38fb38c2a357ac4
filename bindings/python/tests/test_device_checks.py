"""Checks of lengths/offsets values on the device (the default `validate=True`): a bad value
makes the loss NaN and the bad row's gradient NaN, and surfaces as kfuse.InputError at the next
kfuse call on the device or at kfuse.check_errors(); `validate="sync"` checks on the host before
launching; `validate=False` checks nothing. The first tests run anywhere (the argument's values);
the others are the GPU tier."""

import pytest
import torch

import kfuse
from conftest import example

N = 13  # slots per image: odd, not a multiple of a warp


def boxes(*lead, seed=0):
    gen = torch.Generator().manual_seed(seed)
    xy = torch.rand(*lead, 2, generator=gen) * 4
    return torch.cat([xy, xy + 1 + torch.rand(*lead, 2, generator=gen) * 3], -1)


def padded(b, lengths, device="cpu"):
    return {
        "pred": boxes(b, N, seed=1).to(device),
        "target": boxes(b, N, seed=2).to(device),
        "lengths": torch.tensor(lengths, dtype=torch.int32, device=device),
    }


def packed(offsets, device="cpu"):
    t = 37
    return {
        "pred": boxes(t, seed=3).to(device),
        "target": boxes(t, seed=4).to(device),
        "offsets": torch.tensor(offsets, dtype=torch.int32, device=device),
    }


# ---------------------------------------------------------------------------------------------
# Anywhere: the argument.


def test_validate_accepts_true_false_and_sync_on_cpu():
    prog = kfuse.load(example("giou_lengths.kf"))
    x = padded(3, [1, 0, N])
    want = prog(**x).loss
    for v in (True, False, "sync"):
        assert torch.equal(prog(**x, validate=v).loss, want), v


@pytest.mark.parametrize("value", [1, 0, None, 2.0, "yes"])
def test_validate_refuses_other_values_with_the_choices(value):
    prog = kfuse.load(example("giou_lengths.kf"))
    x = padded(2, [1, 2])
    error = ValueError if isinstance(value, str) else TypeError
    with pytest.raises(error, match=r'validate.*True.*"sync".*False|True, False or "sync"'):
        prog(**x, validate=value)


def test_check_errors_is_public_and_none_without_a_pending_violation():
    assert "check_errors" in kfuse.__all__
    assert kfuse.check_errors() is None


# ---------------------------------------------------------------------------------------------
# GPU tier.


def drain():
    """Takes any violation an earlier test left pending."""
    try:
        kfuse.check_errors()
    except kfuse.InputError:
        pass


BAD_LENGTHS = [(2**30, "is greater than N = 13"), (-7, "is negative"), (N + 1, "is greater than N = 13")]


@pytest.mark.parametrize("bad,words", BAD_LENGTHS)
def test_bad_lengths_poison_the_loss_and_surface_at_the_next_call(gpu, bad, words):
    drain()
    prog = kfuse.load(example("giou_lengths.kf"))
    lengths = [3, 0, N, bad, 5]
    out = prog(**padded(5, lengths, gpu))
    torch.cuda.synchronize(gpu)
    assert torch.isnan(out.loss).item()
    good = padded(5, [3, 0, N, 2, 5], gpu)
    with pytest.raises(kfuse.InputError, match=r"giou_lengths\.kf.*input `lengths`.*lengths\[3\].*found on device 0") as e:
        prog(**good)
    assert f"lengths[3] = {bad} {words}" in str(e.value)
    # Taken once: the following valid call works and matches the CPU interpreter.
    got = prog(**good).loss
    want = prog(**padded(5, [3, 0, N, 2, 5])).loss
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)


def test_check_errors_raises_the_pending_violation_once(gpu):
    drain()
    prog = kfuse.load(example("giou_lengths.kf"))
    prog(**padded(4, [1, 2, -7, 3], gpu))
    with pytest.raises(kfuse.InputError, match=r"input `lengths`.*lengths\[2\] = -7"):
        kfuse.check_errors()
    assert kfuse.check_errors() is None


def test_the_gradient_of_a_bad_row_is_nan(gpu):
    drain()
    train = kfuse.load(example("giou_train_lengths.kf"))
    out = train(**padded(5, [3, N + 1, 0, 2, 5], gpu))
    torch.cuda.synchronize(gpu)
    assert torch.isnan(out.loss).item()
    assert torch.isnan(out.dpred[1]).all().item()
    with pytest.raises(kfuse.InputError, match=r"lengths\[1\]"):
        kfuse.check_errors()


def test_autograd_backward_of_a_bad_batch_is_nan_or_raises(gpu):
    drain()
    prog = kfuse.load(example("giou_lengths.kf"))
    x = padded(5, [3, -7, 0, 2, 5], gpu)
    x["pred"].requires_grad_()
    loss = prog(**x).loss
    try:
        loss.backward()
    except kfuse.InputError as e:  # the violation was complete before the backward's launch
        assert "lengths[1]" in str(e)
    else:
        torch.cuda.synchronize(gpu)
        assert torch.isnan(loss).item()
        assert torch.isnan(x["pred"].grad[1]).all().item()
    drain()


@pytest.mark.parametrize(
    "offsets,words",
    [
        ([0, 5, 3, 37], r"offsets\[2\] = 3 is less than offsets\[1\] = 5"),
        ([0, 5, 30, 36], r"the last offset offsets\[3\] = 36 must equal T = 37"),
        ([2, 5, 37], r"offsets\[0\] = 2, but must be 0"),
        ([0, 5, 40], r"offsets\[2\] = 40 is past the end \(T = 37\)"),
    ],
)
def test_bad_offsets_poison_the_loss_and_surface(gpu, offsets, words):
    drain()
    prog = kfuse.load(example("giou_packed.kf"))
    out = prog(**packed(offsets, gpu))
    torch.cuda.synchronize(gpu)
    assert torch.isnan(out.loss).item()
    with pytest.raises(kfuse.InputError, match=words):
        kfuse.check_errors()


def test_validate_false_checks_nothing_and_valid_rows_match_the_interpreter(gpu):
    drain()
    prog = kfuse.load(example("giou_lengths.kf"))
    out = prog(**padded(4, [1, 2**30, 3, 0], gpu), validate=False)
    torch.cuda.synchronize(gpu)
    assert not torch.isnan(out.loss).item()
    assert kfuse.check_errors() is None
    # Valid rows only: the same values as the CPU interpreter.
    got = prog(**padded(4, [1, N, 3, 0], gpu), validate=False).loss
    want = prog(**padded(4, [1, N, 3, 0])).loss
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)


def test_validate_sync_raises_before_launching(gpu):
    drain()
    prog = kfuse.load(example("giou_lengths.kf"))
    with pytest.raises(kfuse.InputError, match=r"lengths\[2\] = -7"):
        prog(**padded(3, [1, 2, -7], gpu), validate="sync")
    assert kfuse.check_errors() is None


def test_cuda_graph_captured_with_the_default_reports_bad_lengths_written_later(gpu):
    drain()
    prog = kfuse.load(example("giou_lengths.kf"))
    x = padded(5, [3, 0, N, 2, 5], gpu)
    s = torch.cuda.Stream(gpu)
    s.wait_stream(torch.cuda.current_stream(gpu))
    with torch.cuda.stream(s):
        for _ in range(2):
            prog(**x)
    torch.cuda.current_stream(gpu).wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = prog(**x).loss
    graph.replay()
    torch.cuda.synchronize(gpu)
    assert not torch.isnan(static_loss).item()
    assert kfuse.check_errors() is None
    x["lengths"].copy_(torch.tensor([3, 0, N, N + 1, 5], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize(gpu)
    assert torch.isnan(static_loss).item()
    with pytest.raises(kfuse.InputError, match=r"lengths\[3\] = 14"):
        kfuse.check_errors()
