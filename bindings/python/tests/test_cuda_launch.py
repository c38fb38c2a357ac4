"""The CUDA launch from PyTorch: results on cuda:N against the CPU interpreter, gradients, kernels
loaded once per device, a non-default current stream, and FusedMLP against the torch module (GPU
tier, the `gpu` fixture); and the error of a device that cannot be opened (CPU tier)."""

import ctypes.util
import random

import pytest
import torch

import kfuse
from conftest import boxes, env_flag, example
from kfuse import _kfuse


def lengths_batch(gen, b, n, device, dtype=torch.float32):
    lengths = torch.randint(0, n + 1, (b,), generator=gen, dtype=torch.int32)
    if b:
        lengths[0] = n
    pred, target = boxes(gen, b, n).to(dtype), boxes(gen, b, n).to(dtype)
    return {"pred": pred.to(device), "target": target.to(device), "lengths": lengths.to(device)}


def to_cpu(inputs):
    return {k: v.detach().cpu() for k, v in inputs.items()}


# -- CPU tier -------------------------------------------------------------------------------------


def test_a_device_that_cannot_be_opened_is_a_device_error():
    """Ordinal 999 exists nowhere: without a driver the message says what to install; with one,
    which device is missing. Nothing is read at the (null) addresses."""
    prog = _kfuse.Program.load(example("giou_lengths.kf"))
    with pytest.raises(kfuse.DeviceError) as err:
        prog.bind([("pred", "f32", [0, 1, 4]), ("target", "f32", [0, 1, 4]), ("lengths", "i32", [0])]).launch(
            999, 0, [0, 0, 0, 0]
        )
    message = str(err.value)
    if ctypes.util.find_library("cuda") is None and not torch.cuda.is_available():
        assert "CUDA driver is not available" in message and "install the NVIDIA driver" in message
    else:
        assert "999" in message or "no CUDA device" in message


def test_cache_info_reports_the_cache():
    info = kfuse.cache_info()
    assert set(info) == {"compiles", "disk_hits", "memory_hits", "cache_dir", "background_compiles", "loaded_functions"}
    counts = ("compiles", "disk_hits", "memory_hits", "background_compiles")
    assert all(isinstance(info[k], int) and info[k] >= 0 for k in counts)
    assert info["cache_dir"] is None or isinstance(info["cache_dir"], str)
    if not torch.cuda.is_available():
        assert info["loaded_functions"] == {}


def test_waiting_for_compiles_with_none_running_returns_at_once():
    kfuse.wait_for_compiles()
    if not torch.cuda.is_available():
        assert kfuse.cache_info()["background_compiles"] == 0


# -- GPU tier -------------------------------------------------------------------------------------


@pytest.mark.parametrize("b,n", [(1, 1), (3, 5), (257, 7), (1023, 3)])
def test_giou_lengths_on_cuda_equals_cpu(gpu, b, n):
    prog = kfuse.load(example("giou_lengths.kf"))
    gen = torch.Generator().manual_seed(b * 31 + n)
    inputs = lengths_batch(gen, b, n, gpu)
    got = prog(**inputs)
    assert got.loss.device == gpu and got.loss.dtype == torch.float32
    want = prog(**to_cpu(inputs))
    torch.testing.assert_close(got.loss.cpu(), want.loss, rtol=1e-5, atol=1e-6)


def test_giou_lengths_gradients_on_cuda_equal_cpu(gpu):
    prog = kfuse.load(example("giou_lengths.kf"))
    gen = torch.Generator().manual_seed(7)
    inputs = lengths_batch(gen, 33, 9, gpu)
    grads = {}
    for device in (gpu, torch.device("cpu")):
        pred = inputs["pred"].detach().to(device).requires_grad_()
        target = inputs["target"].detach().to(device).requires_grad_()
        out = prog(pred=pred, target=target, lengths=inputs["lengths"].to(device))
        (out.loss * 3).backward()
        grads[device.type] = (out.loss.detach().cpu(), pred.grad.cpu(), target.grad.cpu())
    for got, want in zip(grads["cuda"], grads["cpu"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def fresh_program():
    """GIoU with a constant no other test uses, so that its kernels are loaded by this test only."""
    eps = f"{1e-7 * (1 + random.random()):.9e}"
    with open(example("giou_lengths.kf")) as f:
        source = f.read().replace("let eps = 1e-7", f"let eps = {eps}")
    return kfuse.compile(source, name=f"giou_eps_{eps}")


def test_kernels_are_loaded_once_per_device(gpu, monkeypatch):
    if env_flag("KFUSE_NO_CACHE"):
        pytest.skip("KFUSE_NO_CACHE is on: loaded kernels are not kept, so none are counted")
    # The optimised kernels only (a cold first call would launch quick builds first, and load both),
    # and none of other tests' loading in the background while this one counts.
    monkeypatch.setenv("KFUSE_NO_TIERING", "1")
    kfuse.wait_for_compiles()
    prog = fresh_program()
    kernels = prog.cuda_source().count("__global__")
    assert kernels >= 1
    devices = [torch.device("cuda", i) for i in range(min(torch.cuda.device_count(), 2))]
    before = kfuse.cache_info()["loaded_functions"]
    gen = torch.Generator().manual_seed(3)
    for step in range(6):
        device = devices[step % len(devices)]
        out = prog(**lengths_batch(gen, 5 + step, 4, device))
        assert out.loss.device == device
    for device in devices:
        torch.cuda.synchronize(device)
    after = kfuse.cache_info()["loaded_functions"]
    for device in devices:
        assert after[device.index] - before.get(device.index, 0) == kernels, (before, after)
    again = kfuse.cache_info()
    assert again["loaded_functions"] == after
    assert again["compiles"] + again["disk_hits"] + again["memory_hits"] >= kernels


def test_a_cold_first_call_launches_quick_kernels_then_the_optimised_ones_with_the_same_bits(gpu):
    if env_flag("KFUSE_NO_CACHE") or env_flag("KFUSE_NO_TIERING"):
        pytest.skip("no tiered compile: the cache is bypassed or tiering is off")
    prog = fresh_program()
    kernels = prog.cuda_source().count("__global__")
    gen = torch.Generator().manual_seed(13)
    inputs = lengths_batch(gen, 257, 9, gpu)
    kfuse.wait_for_compiles()  # none of other tests' loading in the background while this one counts
    before = kfuse.cache_info()["loaded_functions"].get(gpu.index, 0)
    first = prog(**inputs).loss
    kfuse.wait_for_compiles()
    assert kfuse.cache_info()["background_compiles"] == 0
    second = prog(**inputs).loss
    torch.cuda.synchronize(gpu)
    # The quick build and the optimised build of each kernel were loaded, and agree bit for bit.
    assert kfuse.cache_info()["loaded_functions"][gpu.index] - before == 2 * kernels
    assert torch.equal(first, second), (first.item(), second.item())
    want = prog(**to_cpu(inputs)).loss
    torch.testing.assert_close(second.cpu(), want, rtol=1e-5, atol=1e-6)


def test_a_cuda_graph_captures_the_optimised_kernels(gpu):
    """A capture right after a cold first call waits for the optimised kernels: none is still
    compiling once it ends, and the graph replays the loss of the eager call."""
    kfuse.wait_for_compiles()
    prog = fresh_program()
    gen = torch.Generator().manual_seed(17)
    inputs = lengths_batch(gen, 65, 5, gpu)
    s = torch.cuda.Stream(gpu)
    s.wait_stream(torch.cuda.current_stream(gpu))
    with torch.cuda.stream(s):
        eager = prog(**inputs, validate=False).loss
    torch.cuda.current_stream(gpu).wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = prog(**inputs, validate=False).loss
    assert kfuse.cache_info()["background_compiles"] == 0
    graph.replay()
    torch.cuda.synchronize(gpu)
    assert torch.equal(captured, eager), (captured.item(), eager.item())


def test_launch_on_a_non_default_current_stream(gpu):
    prog = kfuse.load(example("giou_lengths.kf"))
    gen = torch.Generator().manual_seed(11)
    inputs = lengths_batch(gen, 129, 6, gpu)
    stream = torch.cuda.Stream(gpu)
    stream.wait_stream(torch.cuda.current_stream(gpu))
    with torch.cuda.stream(stream):
        # A view one element (4 bytes) into its storage: the glue copies it to aligned memory.
        pred = inputs["pred"]
        flat = torch.cat([torch.zeros(1, device=gpu), pred.flatten()])
        shifted = {
            "pred": flat[1:].view(pred.shape),
            "target": inputs["target"],
            "lengths": inputs["lengths"],
        }
        got = prog(**inputs).loss
        got_shifted = prog(**shifted).loss
    stream.synchronize()
    want = prog(**to_cpu(inputs)).loss
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_shifted.cpu(), want, rtol=1e-5, atol=1e-6)


def test_inputs_on_different_devices_are_an_input_error(gpu):
    gen = torch.Generator().manual_seed(5)
    inputs = lengths_batch(gen, 3, 4, gpu)
    inputs["target"] = inputs["target"].cpu()
    with pytest.raises(kfuse.InputError, match="different devices: `pred` is on cuda:0, `target` on cpu"):
        kfuse.load(example("giou_lengths.kf"))(**inputs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_mlp_on_cuda_against_the_torch_module(gpu, dtype):
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(24, 64), torch.nn.ReLU(), torch.nn.Linear(64, 48), torch.nn.SiLU(), torch.nn.Linear(48, 16)
    )
    fused = kfuse.nn.FusedMLP.from_torch(module, dtype=dtype)
    ref = module.to(gpu, dtype)
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.float16 else {"rtol": 5e-2, "atol": 5e-2}
    with torch.no_grad():
        for shape in [(257, 24), (3, 5, 24), (1, 24), (0, 24)]:
            x = torch.randn(*shape, device=gpu, dtype=dtype)
            out = fused(x)
            assert out.shape == (*shape[:-1], 16) and out.dtype == dtype and out.device == gpu
            torch.testing.assert_close(out.float(), ref(x).float(), **tol)
        fused.wait_optimized()
        x = torch.randn(1023, 24, device=gpu, dtype=dtype)
        torch.testing.assert_close(fused(x).float(), ref(x).float(), **tol)
        # f32 rows through the same weights.
        x32 = torch.randn(65, 24, device=gpu)
        torch.testing.assert_close(fused(x32), ref(x32.to(dtype)).float(), **tol)
