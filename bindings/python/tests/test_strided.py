"""Inputs that are views which are not contiguous (transposed, sliced, expanded with stride 0,
starting off a 16-byte boundary): on the CPU through the interpreter; on CUDA those whose last
axis is dense are read in place by kernels that take the strides as arguments, with no copy, and
the others (a transpose, a step along the last axis) are copied. Results against the same inputs
made contiguous (the CPU interpreter) and against torch in float64; gradients through autograd."""

import zlib

import pytest
import torch

import kfuse
from conftest import boxes, example


def close(got, want, what, rtol=2e-4, atol=2e-5):
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def views(gen, b, d, device, dtype=torch.float32):
    """A [b, d] tensor laid out four ways: transposed, a column slice starting one element in,
    every other column, and a row expanded over the rows (stride 0)."""
    t = torch.randn(d, b, generator=gen, dtype=dtype).to(device).t()
    s = torch.randn(b, d + 3, generator=gen, dtype=dtype).to(device)[:, 1 : d + 1]
    e = torch.randn(b, 2 * d, generator=gen, dtype=dtype).to(device)[:, ::2]
    x = torch.randn(1, d, generator=gen, dtype=dtype).to(device).expand(b, d)
    return {"transposed": t, "sliced": s, "strided": e, "expanded": x}


def layer_norm_inputs(gen, b, d, device, layout):
    x = views(gen, b, d, device)[layout]
    gamma = torch.randn(2 * d, generator=gen).to(device)[1::2]  # stride 2, off a 16-byte boundary
    beta = torch.randn(1, generator=gen).to(device).expand(d)  # stride 0
    dy = views(gen, b, d, device)["transposed"]
    return {"x": x, "gamma": gamma, "beta": beta, "dy": dy}


def check_against_contiguous(prog, inputs, what):
    """`prog` on `inputs` (views) against the CPU interpreter on contiguous copies."""
    assert any(not t.is_contiguous() for t in inputs.values()), f"{what}: the inputs must include views"
    got = prog(**inputs)
    want = prog(**{k: v.detach().cpu().contiguous() for k, v in inputs.items()})
    for name in want.keys():
        close(got[name].cpu(), want[name], f"{what} {name}")
    return got


# -- CPU tier -------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["transposed", "sliced", "strided", "expanded"])
def test_views_on_the_cpu_match_torch_in_float64(layout):
    b, d = 5, 7
    gen = torch.Generator().manual_seed(zlib.crc32(f"cpu {layout}".encode()))
    inputs = layer_norm_inputs(gen, b, d, "cpu", layout)
    out = kfuse.load(example("layer_norm_train.kf"))(**inputs)
    ref = {n: v.double().requires_grad_(n != "dy") for n, v in inputs.items()}
    y = torch.nn.functional.layer_norm(ref["x"], (d,), ref["gamma"], ref["beta"], eps=1e-5)
    dx, dgamma, dbeta = torch.autograd.grad((y * ref["dy"]).sum(), [ref["x"], ref["gamma"], ref["beta"]])
    for name, want in {"y": y, "dx": dx, "dgamma": dgamma, "dbeta": dbeta}.items():
        close(out[name], want.detach(), f"{layout} {name}")


def test_strides_that_do_not_fit_the_shape_are_an_input_error():
    prog = kfuse._kfuse.Program.load(example("layer_norm_train.kf"))
    shapes = [("x", "f32", [3, 4]), ("gamma", "f32", [4]), ("beta", "f32", [4]), ("dy", "f32", [3, 4])]
    with pytest.raises(kfuse.InputError, match=r"`x`: 1 strides given for a tensor of shape \[3, 4\]"):
        prog.bind(shapes, [("x", [1])])


# -- GPU tier -------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["transposed", "sliced", "strided", "expanded"])
@pytest.mark.parametrize("b,d", [(2, 3), (3, 31), (33, 257), (1023, 33)])
def test_layer_norm_of_views_on_cuda_matches_the_interpreter(gpu, layout, b, d):
    gen = torch.Generator().manual_seed(zlib.crc32(f"ln {layout} {b} {d}".encode()))
    inputs = layer_norm_inputs(gen, b, d, gpu, layout)
    check_against_contiguous(kfuse.load(example("layer_norm_train.kf")), inputs, f"layer norm {layout} [{b}, {d}]")


@pytest.mark.parametrize("stem", ["rms_norm_train", "gelu_bias_train", "softmax_xent_train"])
@pytest.mark.parametrize("b,d", [(3, 5), (31, 1000), (257, 64)])
def test_row_programs_of_views_on_cuda_match_the_interpreter(gpu, stem, b, d):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{stem} {b} {d}".encode()))
    prog = kfuse.load(example(f"{stem}.kf"))
    inputs = {}
    for decl in prog.inputs:
        if len(decl.shape) == 2:
            inputs[decl.name] = views(gen, b, d, gpu)["transposed" if len(inputs) % 2 == 0 else "sliced"]
        else:
            inputs[decl.name] = torch.randn(2 * d, generator=gen).to(gpu)[::2]
    if stem == "softmax_xent_train":
        inputs["targets"] = torch.softmax(inputs["targets"], -1).t().contiguous().t()  # a distribution, transposed
    check_against_contiguous(prog, inputs, f"{stem} [{b}, {d}]")


@pytest.mark.parametrize("b,c", [(3, 16), (1023, 1000)])
def test_cross_entropy_of_transposed_logits_and_strided_labels_on_cuda(gpu, b, c):
    gen = torch.Generator().manual_seed(zlib.crc32(f"xent {b} {c}".encode()))
    logits = torch.randn(c, b, generator=gen).to(gpu).t()
    labels = torch.randint(0, c, (b, 2), generator=gen).to(gpu)[:, 1]  # i64, stride 2
    labels[0] = -100
    got = check_against_contiguous(
        kfuse.load(example("cross_entropy_train.kf")), {"logits": logits, "labels": labels}, f"xent [{b}, {c}]"
    )
    ref = logits.double().requires_grad_()
    loss = torch.nn.functional.cross_entropy(ref, labels, ignore_index=-100, label_smoothing=0.1)
    close(got.loss, loss.detach(), "loss")
    close(got.dlogits, torch.autograd.grad(loss, ref)[0], "dlogits", rtol=1e-4, atol=1e-6)


def in_place_inputs(gen, b, d, device, pad):
    """Layer-norm inputs that are all read in place: x and dy slices of rows padded by `pad`
    (starting one element in), gamma and beta broadcast from one element (stride 0)."""
    x = torch.randn(b, d + pad, generator=gen).to(device)[:, 1 : d + 1]
    dy = torch.randn(b, d + pad, generator=gen).to(device)[:, pad - 1 : pad - 1 + d]
    gamma = torch.randn(1, generator=gen).to(device).expand(d)
    beta = torch.randn(1, generator=gen).to(device).expand(d)
    return {"x": x, "gamma": gamma, "beta": beta, "dy": dy}


def allocations(gpu, call):
    torch.cuda.synchronize(gpu)
    before = torch.cuda.memory_stats(gpu)["allocation.all.allocated"]
    out = call()
    return torch.cuda.memory_stats(gpu)["allocation.all.allocated"] - before, out


def test_views_with_a_dense_last_axis_are_read_in_place_with_no_copy(gpu):
    """After a warm-up call, a call on sliced and broadcast views allocates only its outputs."""
    inputs = in_place_inputs(torch.Generator().manual_seed(7), 1023, 257, gpu, 5)
    prog = kfuse.load(example("layer_norm_train.kf"))
    prog(**inputs)
    allocated, out = allocations(gpu, lambda: prog(**inputs))
    assert allocated == len(out), f"{allocated} allocations for {len(out)} outputs"


def test_views_whose_last_axis_is_not_dense_are_copied(gpu):
    """A transposed x and a gamma of stride 2 are made contiguous (two copies); the broadcast beta
    and the sliced dy are read in place."""
    gen = torch.Generator().manual_seed(8)
    inputs = in_place_inputs(gen, 513, 65, gpu, 3)
    inputs["x"] = torch.randn(65, 513, generator=gen).to(gpu).t()
    inputs["gamma"] = torch.randn(130, generator=gen).to(gpu)[::2]
    prog = kfuse.load(example("layer_norm_train.kf"))
    check_against_contiguous(prog, inputs, "transposed x, gamma of stride 2")
    allocated, out = allocations(gpu, lambda: prog(**inputs))
    assert allocated == len(out) + 2, f"{allocated} allocations for {len(out)} outputs and 2 copies"


def test_a_new_stride_pattern_compiles_nothing(gpu):
    """The kernels that read inputs through strides take any strides: other paddings, offsets
    and sizes of the same views load no new kernel."""
    prog = kfuse.load(example("layer_norm_train.kf"))
    gen = torch.Generator().manual_seed(11)
    prog(**in_place_inputs(gen, 33, 64, gpu, 3))
    before = kfuse.cache_info()
    for b, d, pad in [(33, 64, 9), (7, 100, 2), (1023, 5, 40)]:
        check_against_contiguous(prog, in_place_inputs(gen, b, d, gpu, pad), f"[{b}, {d}] padded by {pad}")
    after = kfuse.cache_info()
    loads = sum(after[k] - before[k] for k in ("compiles", "disk_hits", "memory_hits"))
    assert loads == 0, f"{loads} kernels loaded for new strides ({before} -> {after})"


def test_gradients_flow_to_the_base_of_a_transposed_view(gpu):
    gen = torch.Generator().manual_seed(3)
    b, n = 257, 7
    base = boxes(gen, n, b).to(torch.float32).to(gpu)  # [N, B, 4]: pred is its transpose
    base.requires_grad_()
    target = boxes(gen, b, n).to(torch.float32).to(gpu)
    lengths = torch.randint(0, n + 1, (b,), generator=gen, dtype=torch.int32).to(gpu)
    prog = kfuse.load(example("giou_lengths.kf"))
    out = prog(pred=base.transpose(0, 1), target=target, lengths=lengths)
    out.loss.backward()
    ref = base.detach().clone().requires_grad_()
    want = prog(pred=ref.transpose(0, 1).contiguous(), target=target, lengths=lengths)
    want.loss.backward()
    close(out.loss, want.loss.detach(), "loss")
    close(base.grad, ref.grad, "grad of the base", atol=1e-6)


LAYER_NORM_FORWARD = """
input x: f32[N, D]
input w: f32[D]
input b: f32[D]
let mu = mean(x, axis: -1)
let xc = x - mu[.., None]
output y = xc * rsqrt(mean(xc * xc, axis: -1) + 1e-5)[.., None] * w + b
"""


def test_a_transposed_input_is_copied_once_for_the_forward_and_its_backward(gpu):
    """Autograd's forward copies a view kfuse would copy and saves the copy: the backward (the
    derived VJP program) reads it in place, so a forward + backward of a transposed x allocates
    one tensor more than of a contiguous x. Values against torch in float64."""
    gen = torch.Generator().manual_seed(12)
    n, d = 257, 96
    base = torch.randn(d, n, generator=gen).to(gpu).requires_grad_()
    dense = base.detach().t().contiguous().requires_grad_()
    w = (1 + 0.1 * torch.randn(d, generator=gen)).to(gpu).requires_grad_()
    b = torch.randn(d, generator=gen).to(gpu).requires_grad_()
    dy = torch.randn(n, d, generator=gen).to(gpu)
    prog = kfuse.compile(LAYER_NORM_FORWARD, name="layer norm")

    def step(leaf, x):
        (y,) = prog(x=x, w=w, b=b)
        return torch.autograd.grad(y, (leaf, w, b), dy)

    def allocated(leaf, view):
        step(leaf, view(leaf))  # compiles and binds this layout
        torch.cuda.synchronize(gpu)
        before = torch.cuda.memory_stats(gpu)["allocation.all.allocated"]
        got = step(leaf, view(leaf))
        return torch.cuda.memory_stats(gpu)["allocation.all.allocated"] - before, got

    transposed, got = allocated(base, lambda t: t.t())
    contiguous, _ = allocated(dense, lambda t: t)
    assert transposed == contiguous + 1, f"{transposed} allocations with a transposed x, {contiguous} without"
    x64 = base.detach().double().t().requires_grad_()
    w64, b64 = w.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    y64 = torch.nn.functional.layer_norm(x64, (d,), w64, b64, 1e-5)
    want = torch.autograd.grad(y64, (x64, w64, b64), dy.double())
    close(got[0].t(), want[0].float(), "dx", atol=1e-5)
    close(got[1], want[1].float(), "dw", rtol=1e-4, atol=1e-5)
    close(got[2], want[2].float(), "db", rtol=1e-4, atol=1e-5)
