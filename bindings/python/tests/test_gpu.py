"""GPU tier: the package on CUDA tensors against float64 torch references.

Skips visibly without a CUDA device (the `gpu` fixture); KFUSE_REQUIRE_GPU=1 turns the skip into a
failure. Covers the three ragged layouts in f32/f16/bf16 at odd sizes (values and gradients),
torch.compile with the default backend, a training step captured into a CUDA graph and replayed
on new data, non-contiguous inputs, a non-default current stream, cuda:0 against the CPU
interpreter, inputs on two devices, cuda:1, and the fused MLP against the PyTorch module.
"""

import copy
import zlib

import pytest
import torch

import kfuse
import kfuse.nn
from conftest import example
from refs import giou_terms, masked_mean

N_SLOTS = 13  # slots per image of the padded layouts: odd, and not a multiple of a warp
BATCHES = [0, 1, 3, 257, 1023]
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# (loss rtol, gradient rtol); absolute tolerances are these times the reference's largest value.
TOL = {torch.float32: (2e-5, 1e-4), torch.float16: (2e-3, 2e-2), torch.bfloat16: (1e-2, 6e-2)}

PER_BOX = """
# Per-box terms (a non-scalar output) and their sum.
input pred:    f32[B, N, 4]
input target:  f32[B, N, 4]
input lengths: i32[B] as lengths(N)
let valid = mask(lengths)
let d = pred - target
let per = where(valid, sum(d * d, axis: -1) + sin(pred[.., 0]), 0)
output per_box = per
output total = sum(per)
"""


def seeded(*what):
    """A CPU generator seeded from the test's own words: fresh data per test, reproducible."""
    return torch.Generator().manual_seed(zlib.crc32(" ".join(map(str, what)).encode()))


# ---------------------------------------------------------------------------------------------
# Data and references.


def grid_boxes(gen, *lead, odd):
    """Boxes (x1, y1, x2, y2) in [0, 8) on a grid of 1/32: even multiples for targets, odd ones for
    predictions. Every value is exact in f16 and bf16, and no coordinate of a prediction ever equals
    one of a target, so no max/min/clamp of the loss sits on a tie where gradients may differ."""
    start = torch.randint(0, 100, (*lead, 2), generator=gen)
    size = torch.randint(1, 28, (*lead, 2), generator=gen)
    lo, hi = 2 * start + odd, 2 * (start + size) + odd
    return (torch.cat([lo, hi], -1).double() / 32).contiguous()


def batch(layout, gen, b, n=N_SLOTS):
    """float64 inputs of `layout` (ints as i32) and the loss written in torch."""
    counts = torch.randint(0, n + 1, (b,), generator=gen, dtype=torch.int32)
    if b:
        counts[0] = n  # one full image
    if layout == "packed":
        offsets = torch.cat([torch.zeros(1, dtype=torch.int32), counts.cumsum(0).to(torch.int32)])
        t = int(offsets[-1])
        x = {"pred": grid_boxes(gen, t, odd=1), "target": grid_boxes(gen, t, odd=0), "offsets": offsets}
        return x, lambda x: giou_terms(x["pred"], x["target"]).sum() / max(x["pred"].shape[0], 1)
    pred, target = grid_boxes(gen, b, n, odd=1), grid_boxes(gen, b, n, odd=0)
    valid = torch.arange(n)[None, :] < counts[:, None].long()
    # Padding: target rows of zeros (the predicate's marker), predictions of garbage that would
    # change the loss if it leaked (kept finite in f16 arithmetic).
    target[~valid] = 0
    pred[~valid] = pred[~valid] + 50
    if layout == "padded":
        return {"pred": pred, "target": target}, lambda x: masked_mean(giou_terms(x["pred"], x["target"]),
                                                                       x["target"][..., 3] != 0)
    return {"pred": pred, "target": target, "lengths": counts}, lambda x: masked_mean(
        giou_terms(x["pred"], x["target"]), torch.arange(x["pred"].shape[1], device=x["pred"].device)[None, :]
        < x["lengths"][:, None].long())


def on(x, device, dtype):
    """The batch as kfuse takes it: floats in `dtype` on `device`, ints as they are."""
    return {k: (v.to(device, dtype) if v.is_floating_point() else v.to(device)) for k, v in x.items()}


def reference(loss_fn, x):
    """Loss and d loss / d pred in float64 from the very values kfuse sees (already rounded)."""
    ref = {k: (v.detach().double().cpu() if v.is_floating_point() else v.cpu()) for k, v in x.items()}
    ref["pred"].requires_grad_()
    loss = loss_fn(ref)
    (grad,) = torch.autograd.grad(loss, ref["pred"], allow_unused=True)
    return loss.detach(), (torch.zeros_like(ref["pred"]) if grad is None else grad)


def close(got, want, rtol, what):
    """Values within rtol, absolutely within rtol times the reference's largest magnitude."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{what}: not finite"
    scale = want.abs().max().item() if want.numel() else 0.0
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * max(scale, 1e-6), msg=lambda m: f"{what}: {m}")


STEMS = {"padded": "giou", "lengths": "giou_lengths", "packed": "giou_packed"}


# ---------------------------------------------------------------------------------------------
# The three layouts, three dtypes, odd sizes.


@pytest.mark.parametrize("layout", list(STEMS))
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("b", BATCHES)
def test_layouts_match_float64_values_and_gradients(gpu, layout, dtype, b):
    dt = DTYPES[dtype]
    prog = kfuse.load(example(f"{STEMS[layout]}.kf"))
    x64, loss_fn = batch(layout, seeded("layouts", layout, dtype, b), b)
    x = on(x64, gpu, dt)
    want_loss, want_grad = reference(loss_fn, x)
    loss_tol, grad_tol = TOL[dt]

    # Forward only.
    out = prog(**x)
    assert list(out.keys()) == ["loss"]
    assert out.loss.device == gpu and out.loss.dtype == dt and out.loss.shape == ()
    close(out.loss, want_loss, loss_tol, f"{layout} {dtype} B={b} loss")

    # Forward and backward, scaled so that the upstream gradient is used.
    x["pred"].requires_grad_()
    out = prog(**x)
    (out.loss * 2.5).backward()
    g = x["pred"].grad
    assert g is not None and g.device == gpu and g.dtype == dt
    close(out.loss, want_loss, loss_tol, f"{layout} {dtype} B={b} loss with grad")
    close(g, 2.5 * want_grad, grad_tol, f"{layout} {dtype} B={b} d loss / d pred")
    if layout != "packed" and b:
        # Padded slots get exactly 0, whatever their (garbage) values.
        counts = x64["lengths"] if layout == "lengths" else (x64["target"][..., 3] != 0).sum(1)
        pad = torch.arange(N_SLOTS)[None, :] >= counts[:, None].long()
        assert torch.all(g.cpu()[pad] == 0), f"{layout} {dtype} B={b}: padding got a gradient"


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_gradient_of_target_too(gpu, dtype):
    dt = DTYPES[dtype]
    prog = kfuse.load(example("giou_lengths.kf"))
    x64, loss_fn = batch("lengths", seeded("target grad", dtype), 41)
    x = on(x64, gpu, dt)
    ref = {k: (v.double().cpu().requires_grad_() if v.is_floating_point() else v.cpu()) for k, v in x.items()}
    want = torch.autograd.grad(loss_fn(ref), [ref["pred"], ref["target"]])
    x["pred"].requires_grad_()
    x["target"].requires_grad_()
    prog(**x).loss.backward()
    close(x["pred"].grad, want[0], TOL[dt][1], f"{dtype} d loss / d pred")
    close(x["target"].grad, want[1], TOL[dt][1], f"{dtype} d loss / d target")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_fused_backward_on_cuda_keeps_its_gradient_and_survives_a_retained_graph(gpu, dtype):
    """`loss.backward()` hands kfuse's gradient tensor to `.grad` (no copy, no pass over it); an
    upstream of -2.5 scales it in place; a retained graph's second backward recomputes it."""
    dt = DTYPES[dtype]
    prog = kfuse.load(example("giou_lengths.kf"))
    x64, loss_fn = batch("lengths", seeded("fused backward", dtype), 257)
    x = on(x64, gpu, dt)
    _, want = reference(loss_fn, x)
    grad_tol = TOL[dt][1]
    x["pred"].requires_grad_()
    loss = prog(**x).loss
    held = loss.grad_fn.grads[0].data_ptr()
    loss.backward()
    assert x["pred"].grad.data_ptr() == held
    close(x["pred"].grad, want, grad_tol, f"{dtype} upstream 1")
    (prog(**x).loss * -2.5).backward()
    close(x["pred"].grad, -1.5 * want, grad_tol, f"{dtype} accumulated with upstream -2.5")
    x["pred"].grad = None
    loss = prog(**x).loss * 3
    loss.backward(retain_graph=True)
    loss.backward()
    close(x["pred"].grad, 6 * want, grad_tol, f"{dtype} retained graph, twice with upstream 3")


def per_box_batch(gen, b, n):
    x = {"pred": grid_boxes(gen, b, n, odd=1), "target": grid_boxes(gen, b, n, odd=0),
         "lengths": torch.randint(0, n + 1, (b,), generator=gen, dtype=torch.int32)}
    return x


def per_box_torch(pred, target, lengths):
    valid = torch.arange(pred.shape[1], device=pred.device)[None, :] < lengths[:, None].long()
    d = pred - target
    per = torch.where(valid, (d * d).sum(-1) + torch.sin(pred[..., 0]), torch.zeros((), dtype=pred.dtype))
    return per, per.sum()


def test_non_scalar_output_and_its_gradient(gpu):
    prog = kfuse.compile(PER_BOX, name="per_box")
    gen = seeded("per box")
    x64 = per_box_batch(gen, 257, N_SLOTS)
    w = torch.randn(257, N_SLOTS, generator=gen, dtype=torch.float64)
    ref = {k: (v.clone().requires_grad_() if v.is_floating_point() else v) for k, v in x64.items()}
    per, total = per_box_torch(**ref)
    want = torch.autograd.grad((per * w).sum() + 0.5 * total, [ref["pred"], ref["target"]])
    x = on(x64, gpu, torch.float32)
    x["pred"].requires_grad_()
    x["target"].requires_grad_()
    out = prog(**x)
    close(out.per_box, per, 1e-5, "per_box")
    close(out.total, total, 1e-5, "total")
    ((out.per_box * w.float().to(gpu)).sum() + 0.5 * out.total).backward()
    close(x["pred"].grad, want[0], 1e-4, "d / d pred")
    close(x["target"].grad, want[1], 1e-4, "d / d target")


def test_bad_lengths_on_cuda_are_an_input_error_before_launching_with_validate_sync(gpu):
    prog = kfuse.load(example("giou_lengths.kf"))
    x64, _ = batch("lengths", seeded("bad lengths"), 5)
    x = on(x64, gpu, torch.float32)
    x["lengths"] = torch.tensor([1, N_SLOTS + 1, 0, 2, 3], dtype=torch.int32, device=gpu)
    with pytest.raises(kfuse.InputError, match=rf"input `lengths`: lengths\[1\] = {N_SLOTS + 1} is greater than N"):
        prog(**x, validate="sync")
    assert kfuse.check_errors() is None  # nothing was launched


# ---------------------------------------------------------------------------------------------
# torch.compile with the default backend.


@pytest.mark.parametrize("layout", list(STEMS))
def test_torch_compile_default_backend_values_and_gradients(gpu, layout):
    torch._dynamo.reset()
    prog = kfuse.load(example(f"{STEMS[layout]}.kf"))

    def step(**x):
        return prog(**x).loss * 3.0

    compiled = torch.compile(step, fullgraph=True)
    for b in (3, 257):
        x64, loss_fn = batch(layout, seeded("compile", layout, b), b)
        x = on(x64, gpu, torch.float32)
        want_loss, want_grad = reference(loss_fn, x)
        x["pred"].requires_grad_()
        loss = compiled(**x)
        loss.backward()
        close(loss, 3.0 * want_loss, TOL[torch.float32][0], f"compiled {layout} B={b} loss")
        close(x["pred"].grad, 3.0 * want_grad, TOL[torch.float32][1], f"compiled {layout} B={b} grad")


def test_torch_compile_default_backend_non_scalar_outputs(gpu):
    torch._dynamo.reset()
    prog = kfuse.compile(PER_BOX, name="per_box")

    def step(pred, target, lengths, w):
        out = prog(pred=pred, target=target, lengths=lengths)
        return (out.per_box * w).sum() + out.total

    compiled = torch.compile(step, fullgraph=True)
    gen = seeded("compile per box")
    x64 = per_box_batch(gen, 33, N_SLOTS)
    w = torch.randn(33, N_SLOTS, generator=gen, dtype=torch.float64)
    ref = {k: (v.clone().requires_grad_() if v.is_floating_point() else v) for k, v in x64.items()}
    per, total = per_box_torch(**ref)
    want_loss = (per * w).sum() + total
    want = torch.autograd.grad(want_loss, [ref["pred"], ref["target"]])
    x = on(x64, gpu, torch.float32)
    x["pred"].requires_grad_()
    x["target"].requires_grad_()
    got = compiled(**x, w=w.float().to(gpu))
    got.backward()
    close(got, want_loss, 1e-5, "compiled per-box loss")
    close(x["pred"].grad, want[0], 1e-4, "compiled d / d pred")
    close(x["target"].grad, want[1], 1e-4, "compiled d / d target")


# ---------------------------------------------------------------------------------------------
# A training step captured into a CUDA graph.


def test_training_step_in_a_cuda_graph_replays_on_new_data(gpu):
    prog = kfuse.load(example("giou_lengths.kf"))
    b, feats, lr = 129, 6, 0.1
    torch.manual_seed(5)
    head = torch.nn.Linear(feats, 4).to(gpu)
    opt = torch.optim.SGD(head.parameters(), lr=lr)
    gen = seeded("cuda graph")

    def wide_boxes(*lead):
        # Continuous values (no ties) and widths of at least 1, so that the moved boxes stay boxes.
        xy = torch.rand(*lead, 2, generator=gen, dtype=torch.float64) * 4
        return torch.cat([xy, xy + 1 + torch.rand(*lead, 2, generator=gen, dtype=torch.float64) * 3], -1)

    def new_data():
        lengths = torch.randint(0, N_SLOTS + 1, (b,), generator=gen, dtype=torch.int32)
        f = torch.randn(b, N_SLOTS, feats, generator=gen)
        return f, wide_boxes(b, N_SLOTS).float(), wide_boxes(b, N_SLOTS).float(), lengths

    f0, base0, t0, l0 = new_data()
    static_f, static_base, static_t, static_l = f0.to(gpu), base0.to(gpu), t0.to(gpu), l0.to(gpu)

    def step():
        # A predicted box: a prior moved by at most 0.1 by a linear head.
        pred = static_base + 0.1 * torch.tanh(head(static_f))
        loss = prog(pred=pred, target=static_t, lengths=static_l, validate=False).loss
        loss.backward()
        opt.step()
        return loss

    # Warm up on a side stream (programs derived, kernels compiled and loaded), then capture.
    s = torch.cuda.Stream(gpu)
    s.wait_stream(torch.cuda.current_stream(gpu))
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream(gpu).wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = step()

    for k in range(3):
        f, base, t, lengths = new_data()
        static_f.copy_(f.to(gpu))
        static_base.copy_(base.to(gpu))
        static_t.copy_(t.to(gpu))
        static_l.copy_(lengths.to(gpu))
        w0, b0 = head.weight.detach().clone(), head.bias.detach().clone()
        graph.replay()
        torch.cuda.synchronize(gpu)
        # The same step in float64 from the weights before the replay.
        w, bias = w0.double().cpu().requires_grad_(), b0.double().cpu().requires_grad_()
        pred = base.double() + 0.1 * torch.tanh(f.double() @ w.T + bias)
        valid = torch.arange(N_SLOTS)[None, :] < lengths[:, None].long()
        want = masked_mean(giou_terms(pred, t.double()), valid)
        gw, gb = torch.autograd.grad(want, [w, bias])
        close(static_loss, want, 1e-5, f"replay {k} loss")
        close(head.weight.grad, gw, 1e-4, f"replay {k} d loss / d weight")
        close(head.bias.grad, gb, 1e-4, f"replay {k} d loss / d bias")
        close(head.weight, w0.double().cpu() - lr * gw, 1e-4, f"replay {k} SGD step")


# ---------------------------------------------------------------------------------------------
# Strides, streams and devices.


def test_non_contiguous_inputs_give_the_same_values_and_gradients(gpu):
    prog = kfuse.load(example("giou_lengths.kf"))
    x64, loss_fn = batch("lengths", seeded("strided"), 257)
    x = on(x64, gpu, torch.float32)
    want_loss, want_grad = reference(loss_fn, x)
    # The same values through transposed storage and a strided lengths vector.
    pred = x["pred"].permute(2, 1, 0).contiguous().permute(2, 1, 0).requires_grad_()
    target = x["target"].permute(1, 0, 2).contiguous().permute(1, 0, 2)
    lengths = torch.stack([x["lengths"], -x["lengths"]], 1)[:, 0]
    assert not (pred.is_contiguous() or target.is_contiguous() or lengths.is_contiguous())
    out = prog(pred=pred, target=target, lengths=lengths)
    out.loss.backward()
    close(out.loss, want_loss, TOL[torch.float32][0], "strided loss")
    close(pred.grad, want_grad, TOL[torch.float32][1], "strided grad")
    contiguous = {k: v.clone() for k, v in x.items()}
    contiguous["pred"].requires_grad_()
    out2 = prog(**contiguous)
    out2.loss.backward()
    # The same kernels on the same values (a reduction's order may differ between launches).
    close(out.loss, out2.loss, 1e-6, "strided vs contiguous loss")
    close(pred.grad, contiguous["pred"].grad, 1e-6, "strided vs contiguous grad")


def test_runs_on_the_current_stream(gpu):
    prog = kfuse.load(example("giou_lengths.kf"))
    x64, loss_fn = batch("lengths", seeded("stream"), 1023)
    x = on(x64, gpu, torch.float32)
    want_loss, want_grad = reference(loss_fn, x)
    pred = torch.full_like(x["pred"], float("nan"))
    torch.cuda.synchronize(gpu)
    s = torch.cuda.Stream(gpu)
    s.wait_stream(torch.cuda.current_stream(gpu))
    with torch.cuda.stream(s):
        assert torch.cuda.current_stream(gpu) == s
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(20_000_000)  # keep `s` busy: a launch on another stream would read NaN
        pred.copy_(x["pred"])
        pred.requires_grad_()
        out = prog(pred=pred, target=x["target"], lengths=x["lengths"], validate=False)
        out.loss.backward()
    torch.cuda.current_stream(gpu).wait_stream(s)
    torch.cuda.synchronize(gpu)
    close(out.loss, want_loss, TOL[torch.float32][0], "loss on a side stream")
    close(pred.grad, want_grad, TOL[torch.float32][1], "grad on a side stream")


@pytest.mark.parametrize("layout", list(STEMS))
def test_cuda0_results_equal_cpu_results(gpu, layout):
    prog = kfuse.load(example(f"{STEMS[layout]}.kf"))
    x64, _ = batch(layout, seeded("cpu vs cuda", layout), 257)
    got = {}
    for device in ("cpu", gpu):
        x = on(x64, device, torch.float32)
        x["pred"].requires_grad_()
        out = prog(**x)
        out.loss.backward()
        assert out.loss.device.type == torch.device(device).type
        got[str(device)] = (out.loss.detach().cpu(), x["pred"].grad.cpu())
    (cpu_loss, cpu_grad), (gpu_loss, gpu_grad) = got["cpu"], got[str(gpu)]
    close(gpu_loss, cpu_loss, 1e-5, f"{layout} loss cuda vs cpu")
    close(gpu_grad, cpu_grad, 1e-5, f"{layout} grad cuda vs cpu")


def test_cuda0_non_scalar_outputs_equal_cpu_results(gpu):
    prog = kfuse.compile(PER_BOX, name="per_box")
    x64 = per_box_batch(seeded("per box cpu vs cuda"), 1023, N_SLOTS)
    cpu = prog(**on(x64, "cpu", torch.float32))
    cuda = prog(**on(x64, gpu, torch.float32))
    assert cuda.per_box.device == gpu
    close(cuda.per_box, cpu.per_box, 1e-5, "per_box cuda vs cpu")
    close(cuda.total, cpu.total, 1e-5, "total cuda vs cpu")


def test_inputs_on_the_cpu_and_a_gpu_are_an_input_error(gpu):
    prog = kfuse.load(example("giou_lengths.kf"))
    x = on(batch("lengths", seeded("cpu and cuda"), 3)[0], gpu, torch.float32)
    x["target"] = x["target"].cpu()
    with pytest.raises(kfuse.InputError, match="inputs are on different devices: `pred` is on cuda:0, `target` on cpu"):
        prog(**x)


def second_gpu(gpu):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"GPU tier: needs 2 CUDA devices, {torch.cuda.device_count()} found")
    return torch.device("cuda", 1)


def test_inputs_on_two_gpus_are_an_input_error(gpu):
    other = second_gpu(gpu)
    prog = kfuse.load(example("giou_lengths.kf"))
    x = on(batch("lengths", seeded("two gpus"), 3)[0], gpu, torch.float32)
    x["target"] = x["target"].to(other)
    message = "inputs are on different devices: `pred` is on cuda:0, `target` on cuda:1"
    with pytest.raises(kfuse.InputError, match=message):
        prog(**x)


@pytest.mark.parametrize("layout", list(STEMS))
def test_cuda1_runs_on_device_1(gpu, layout):
    other = second_gpu(gpu)
    prog = kfuse.load(example(f"{STEMS[layout]}.kf"))
    x64, loss_fn = batch(layout, seeded("cuda:1", layout), 257)
    x = on(x64, other, torch.float32)
    want_loss, want_grad = reference(loss_fn, x)
    x["pred"].requires_grad_()
    assert torch.cuda.current_device() == 0
    out = prog(**x)
    out.loss.backward()
    assert out.loss.device == other and x["pred"].grad.device == other
    close(out.loss, want_loss, TOL[torch.float32][0], f"{layout} loss on cuda:1")
    close(x["pred"].grad, want_grad, TOL[torch.float32][1], f"{layout} grad on cuda:1")
    # And from inside a device context of device 1, on its current stream.
    with torch.cuda.device(other):
        again = prog(**{k: v.detach() for k, v in x.items()})
    assert again.loss.device == other
    close(again.loss, out.loss, 1e-6, f"{layout} loss on cuda:1 from its device context")


# ---------------------------------------------------------------------------------------------
# The fused MLP.


def bench_models():
    """The three benchmark models of tools/bench_mlp_torch.py."""
    nn = torch.nn
    torch.manual_seed(0)
    return {
        "mlp64x4_relu": nn.Sequential(nn.Linear(64, 64, bias=False), nn.ReLU(), nn.Linear(64, 64, bias=False),
                                      nn.ReLU(), nn.Linear(64, 64, bias=False), nn.ReLU(),
                                      nn.Linear(64, 64, bias=False), nn.ReLU(), nn.Linear(64, 16, bias=False)),
        "mlp128x4_relu": nn.Sequential(nn.Linear(64, 128, bias=False), nn.ReLU(), nn.Linear(128, 128, bias=False),
                                       nn.ReLU(), nn.Linear(128, 128, bias=False), nn.ReLU(),
                                       nn.Linear(128, 128, bias=False), nn.ReLU(), nn.Linear(128, 16, bias=False)),
        "mlp_silu_bias": nn.Sequential(nn.Linear(32, 64), nn.SiLU(), nn.Linear(64, 128), nn.SiLU(), nn.Linear(128, 96),
                                       nn.SiLU(), nn.Linear(96, 64), nn.SiLU(), nn.Linear(64, 32), nn.SiLU(),
                                       nn.Linear(32, 16)),
    }


def width_model(width):
    nn = torch.nn
    torch.manual_seed(width)
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.GELU(),
                         nn.Linear(width, width, bias=False), nn.SiLU(), nn.Linear(width, 16))


BENCH_MODELS = ("mlp64x4_relu", "mlp128x4_relu", "mlp_silu_bias")
MLPS = {**{name: (lambda name=name: bench_models()[name]) for name in BENCH_MODELS},
        **{f"width{w}": (lambda w=w: width_model(w)) for w in (16, 32, 48, 64, 96, 128, 192, 256)}}
MLP_TOL = {torch.float16: 2e-2, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("name", list(MLPS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_fused_mlp_matches_the_module(gpu, name, dtype):
    module = MLPS[name]()
    fused = kfuse.nn.FusedMLP.from_torch(module, dtype=dtype)
    # The oracle: the module with its weights rounded to `dtype`, in float64.
    ref = copy.deepcopy(module).double()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.to(dtype).double())
    gen = seeded("mlp", name, dtype)
    for lead in [(1,), (1023,), (3, 341), (4097,)]:
        x = torch.randn(*lead, module[0].in_features, generator=gen).to(gpu, dtype)
        with torch.no_grad():
            want = ref(x.double().cpu())
            # Twice: the first call may come from the fast-compiled kernel, a later one from the optimised one.
            for call in ("first", "second"):
                got = fused(x)
                assert got.shape == (*lead, 16) and got.device == gpu, f"{name} {lead}: {got.shape} on {got.device}"
                err = (got.double().cpu() - want).abs().max().item() / want.abs().max().item()
                assert err <= MLP_TOL[dtype], f"{name} {dtype} {lead} {call} call: rel err {err:.3g}"
    with torch.no_grad():
        assert fused(torch.empty(0, module[0].in_features, device=gpu, dtype=dtype)).shape == (0, 16)


def test_fused_mlp_refuses_cuda_inputs_that_require_grad(gpu):
    fused = kfuse.nn.FusedMLP.from_torch(bench_models()["mlp64x4_relu"])
    x = torch.randn(5, 64, device=gpu, dtype=torch.float16, requires_grad=True)
    with pytest.raises(kfuse.InputError, match="the input requires grad, but FusedMLP is for inference"):
        fused(x)
    with torch.no_grad():
        assert torch.isfinite(fused(x)).all()
