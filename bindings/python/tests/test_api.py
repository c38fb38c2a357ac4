"""CPU tier: the package's API: interface, non-scalar outputs and their gradients, dtypes,
non-contiguous inputs, torch.compile, the fused MLP, and every error with its message."""

import os
import struct
import subprocess
import sys

import pytest
import torch

import kfuse
from kfuse import _kfuse
from conftest import boxes, example
from refs import giou_terms, masked_mean

PER_BOX = """
# Per-box GIoU-like terms, a non-scalar output and a scalar one.
input pred:    f32[B, N, 4]
input target:  f32[B, N, 4]
input lengths: i32[B] as lengths(N)
let valid = mask(lengths)
let d = pred - target
let per = where(valid, sum(d * d, axis: -1) + sin(pred[.., 0]), 0)
output per_box = per
output total = sum(per)
output valid_count = count(valid)
"""


def per_box_torch(pred, target, lengths):
    valid = torch.arange(pred.shape[1])[None, :] < lengths[:, None].long()
    d = pred - target
    per = torch.where(valid, (d * d).sum(-1) + torch.sin(pred[..., 0]), torch.zeros(()))
    return per, per.sum()


def per_box_inputs(b=3, n=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {
        "pred": boxes(gen, b, n).float(),
        "target": boxes(gen, b, n).float(),
        "lengths": torch.tensor([n, 0, 2, 1, n][:b], dtype=torch.int32),
    }


def test_interface_lists_declarations_layouts_and_cuda():
    prog = kfuse.load(example("giou_lengths.kf"))
    assert prog.name.endswith("giou_lengths.kf")
    (pred, target, lengths) = prog.inputs
    assert (pred.name, pred.dtype, pred.shape, pred.layout) == ("pred", torch.float32, ("B", "N", 4), None)
    assert (lengths.name, lengths.dtype, lengths.shape, lengths.layout) == ("lengths", torch.int32, ("B",), ("lengths", "N"))
    assert [(d.name, d.dtype, d.kfuse_dtype, d.shape) for d in prog.outputs] == [("loss", torch.float32, "f32", ())]
    assert (pred.kfuse_dtype, lengths.kfuse_dtype) == ("f32", "i32")
    assert repr(lengths) == "Decl(lengths: i32[B] as lengths(N))"
    src = prog.cuda_source()
    assert "__global__" in src and "#include" not in src
    packed = kfuse.load(example("giou_packed.kf"))
    assert packed.inputs[2].layout == ("offsets", "T")
    assert "kfuse.Program" in repr(prog)


def test_non_scalar_outputs_and_their_gradients():
    prog = kfuse.compile(PER_BOX, name="per_box")
    assert [d.name for d in prog.outputs] == ["per_box", "total", "valid_count"]
    x = per_box_inputs()
    ref = {k: v.double() if v.is_floating_point() else v for k, v in x.items()}
    ref["pred"].requires_grad_()
    ref["target"].requires_grad_()
    per_ref, total_ref = per_box_torch(**ref)
    for k in ("pred", "target"):
        x[k].requires_grad_()
    out = prog(**x)
    torch.testing.assert_close(out.per_box.double(), per_ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.total.double(), total_ref.detach(), rtol=1e-5, atol=1e-5)
    assert out.valid_count.dtype == torch.int32 and int(out.valid_count) == 5 + 0 + 2
    assert not out.valid_count.requires_grad
    # A random upstream gradient on the per-box output plus one on the scalar.
    w = torch.randn(out.per_box.shape, generator=torch.Generator().manual_seed(4))
    ((out.per_box * w).sum() + 0.5 * out.total).backward()
    want = torch.autograd.grad((per_ref * w.double()).sum() + 0.5 * total_ref, [ref["pred"], ref["target"]])
    torch.testing.assert_close(x["pred"].grad.double(), want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x["target"].grad.double(), want[1], rtol=1e-5, atol=1e-5)
    # Padded rows get exactly 0.
    assert torch.all(x["pred"].grad[1] == 0)


def test_only_the_inputs_that_require_grad_get_one():
    prog = kfuse.load(example("giou_lengths.kf"))
    x = per_box_inputs(seed=2)
    x["target"].requires_grad_()
    prog(**x).loss.backward()
    assert x["pred"].grad is None and x["target"].grad is not None


def giou_lengths_loss_and_grad(x, scale=1.0):
    """The scalar GIoU loss of giou_lengths.kf and its gradient w.r.t. pred, in torch float64."""
    pred = x["pred"].double().requires_grad_()
    valid = torch.arange(pred.shape[1])[None, :] < x["lengths"][:, None].long()
    loss = masked_mean(giou_terms(pred, x["target"].double()), valid)
    (grad,) = torch.autograd.grad(loss * scale, pred)
    return loss, grad


def test_fused_backward_scales_by_the_upstream_gradient_and_survives_a_retained_graph():
    """The loss + gradients launch: `loss.backward()` (upstream 1), a scaled upstream, gradient
    accumulation over two calls, a second backward through a retained graph (which recomputes),
    and `create_graph=True`, all against torch float64."""
    prog = kfuse.load(example("giou_lengths.kf"))
    x = per_box_inputs(b=4, n=6, seed=21)
    _, want = giou_lengths_loss_and_grad(x)
    pred = x["pred"].clone().requires_grad_()
    loss = prog(pred=pred, target=x["target"], lengths=x["lengths"]).loss
    held = loss.grad_fn.grads[0].data_ptr()
    loss.backward()
    torch.testing.assert_close(pred.grad.double(), want, rtol=1e-5, atol=1e-7)
    # The gradient computed with the loss became .grad itself: no copy.
    assert pred.grad.data_ptr() == held
    # Accumulates into .grad like any PyTorch gradient.
    (prog(pred=pred, target=x["target"], lengths=x["lengths"]).loss * -2.5).backward()
    torch.testing.assert_close(pred.grad.double(), want * -1.5, rtol=1e-5, atol=1e-7)
    # A retained graph, backward twice with upstream 3: 6 times the gradient.
    pred.grad = None
    loss = prog(pred=pred, target=x["target"], lengths=x["lengths"]).loss * 3
    loss.backward(retain_graph=True)
    loss.backward()
    torch.testing.assert_close(pred.grad.double(), want * 6, rtol=1e-5, atol=1e-7)
    # create_graph: the gradient still has the right value.
    pred.grad = None
    out = prog(pred=pred, target=x["target"], lengths=x["lengths"]).loss
    (g,) = torch.autograd.grad(out * 2, pred, create_graph=True)
    torch.testing.assert_close(g.double(), want * 2, rtol=1e-5, atol=1e-7)


def test_a_second_backward_refuses_inputs_modified_in_place():
    prog = kfuse.load(example("giou_lengths.kf"))
    x = per_box_inputs(b=3, n=5, seed=4)
    pred, target = x["pred"].clone().requires_grad_(), x["target"].clone()
    loss = prog(pred=pred, target=target, lengths=x["lengths"]).loss
    loss.backward(retain_graph=True)
    target.add_(1.0)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation"):
        loss.backward()


def test_vjp_program_is_a_program():
    prog = kfuse.compile(PER_BOX, name="per_box")
    back = prog.vjp("pred")
    assert [d.name for d in back.inputs] == ["pred", "target", "lengths", "grad_per_box", "grad_total"]
    assert [d.name for d in back.outputs] == ["grad_pred"]
    x = per_box_inputs()
    g = back(**x, grad_per_box=torch.ones(3, 5), grad_total=torch.zeros(()))
    assert g.grad_pred.shape == (3, 5, 4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_run_the_program_typed_at_their_dtype(dtype):
    prog = kfuse.load(example("giou_lengths.kf"))
    x = per_box_inputs(seed=5)
    want = prog(**x).loss
    x["pred"], x["target"] = x["pred"].to(dtype), x["target"].to(dtype)
    out = prog(**x)
    assert out.loss.dtype == dtype
    torch.testing.assert_close(out.loss.float(), want, rtol=3e-2, atol=3e-2)
    x["pred"].requires_grad_()
    prog(**x).loss.backward()
    assert x["pred"].grad.dtype == dtype
    # Explicitly, by value.
    assert prog.with_input_dtypes(pred="bf16", target=torch.bfloat16).inputs[0].dtype == torch.bfloat16


def test_non_contiguous_inputs_give_the_same_result():
    prog = kfuse.compile(PER_BOX, name="per_box")
    x = per_box_inputs(b=4, n=6, seed=9)
    want = prog(**x)
    # The same values through transposed storage.
    x2 = dict(x)
    x2["pred"] = x["pred"].transpose(0, 1).contiguous().transpose(0, 1)
    assert not x2["pred"].is_contiguous()
    got = prog(**x2)
    assert torch.equal(got.per_box, want.per_box)


def test_empty_batches():
    prog = kfuse.load(example("giou_lengths.kf"))
    out = prog(pred=torch.zeros(0, 3, 4), target=torch.zeros(0, 3, 4), lengths=torch.zeros(0, dtype=torch.int32))
    assert float(out.loss) == 0.0
    packed = kfuse.load(example("giou_packed.kf"))
    out = packed(pred=torch.zeros(0, 4), target=torch.zeros(0, 4), offsets=torch.zeros(1, dtype=torch.int32))
    assert float(out.loss) == 0.0


def test_torch_compile_fullgraph_gives_the_same_values_and_gradients():
    prog = kfuse.compile(PER_BOX, name="per_box")

    def step(pred, target, lengths):
        out = prog(pred=pred, target=target, lengths=lengths)
        return (out.per_box * 2).sum() + out.total

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for b, n in [(3, 5), (4, 7)]:
        x = per_box_inputs(b=b, n=n, seed=b)
        xe = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in x.items()}
        xc = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in x.items()}
        eager = step(**xe)
        eager.backward()
        got = compiled(**xc)
        got.backward()
        torch.testing.assert_close(got, eager)
        torch.testing.assert_close(xc["pred"].grad, xe["pred"].grad)
        torch.testing.assert_close(xc["target"].grad, xe["target"].grad)


def test_torch_compile_of_a_scalar_loss():
    prog = kfuse.load(example("giou_lengths.kf"))
    compiled = torch.compile(lambda **x: prog(**x).loss, fullgraph=True, backend="aot_eager")
    x = per_box_inputs(seed=11)
    x["pred"].requires_grad_()
    loss = compiled(**x)
    loss.backward()
    y = {k: v.detach().clone().requires_grad_(k == "pred") for k, v in x.items()}
    want = prog(**y).loss
    want.backward()
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(x["pred"].grad, y["pred"].grad)
    # The compiled step ran the loss and its gradient as one operator (gradient w.r.t. input 0).
    from kfuse import _ops

    assert any(name.endswith("_g0") for name in _ops._REGISTERED), sorted(_ops._REGISTERED)


# --- errors ---------------------------------------------------------------------------------


def test_parse_errors_carry_the_position_and_the_caret_report():
    with pytest.raises(kfuse.ParseError) as e:
        kfuse.compile("input x: f32[N]\noutput y = x + undefined_thing\n", name="bad.kf")
    err = e.value
    assert isinstance(err, ValueError) and isinstance(err, kfuse.Error)
    assert (err.file, err.line, err.column) == ("bad.kf", 2, 16)
    text = str(err)
    assert "undefined_thing" in text and "bad.kf:2:16" in text and "^" in text


def test_a_missing_file_is_an_error():
    with pytest.raises(kfuse.Error, match="cannot read .*nope.kf"):
        kfuse.load("nope.kf")


def test_input_errors_name_the_input():
    prog = kfuse.load(example("giou_lengths.kf"))
    x = per_box_inputs()
    cases = [
        (dict(x, lengths=None), r"missing input `lengths` \(declared as i32\[B\] as lengths\(N\)\)"),
        (dict(x, extra=torch.zeros(1)), r"unknown input `extra`; the inputs are: pred, target, lengths"),
        (dict(x, pred=x["pred"].double()), r"input `pred` has dtype torch.float64, but is declared as f32\[B, N, 4\]"),
        (dict(x, lengths=x["lengths"].long()), r"input `lengths` has dtype torch.int64, but is declared as i32"),
        (dict(x, pred=[1.0]), r"input `pred` must be a torch.Tensor, not list"),
        (dict(x, pred=x["pred"][..., :3]), r"input `pred` has size 3 on axis 2, but the declaration f32\[B, N, 4\] fixes it at 4"),
        (dict(x, target=x["target"][:, :2]), r"input `target` has N = 2 \(axis 1\), but `pred` already set N = 5"),
        (dict(x, pred=x["pred"][0]), r"input `pred` has 2 axes"),
        (dict(x, lengths=torch.tensor([5, 6, 0], dtype=torch.int32)), r"input `lengths`: lengths\[1\] = 6 is greater than N = 5"),
        (dict(x, lengths=torch.tensor([5, -1, 0], dtype=torch.int32)), r"input `lengths`: lengths\[1\] = -1 is negative"),
        (dict(x, pred=x["pred"].to("meta")), r"input `pred` is on meta; kfuse runs on CPU and CUDA tensors"),
    ]
    for kwargs, message in cases:
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        with pytest.raises(kfuse.InputError, match=message):
            prog(**kwargs)
    with pytest.raises(TypeError, match="by keyword"):
        prog(x["pred"])


def test_bad_offsets_name_the_input_and_position():
    prog = kfuse.load(example("giou_packed.kf"))
    p = torch.rand(5, 4)
    for offsets, message in [
        ([1, 5], r"offsets\[0\] = 1, but must be 0"),
        ([0, 3, 2, 5], r"offsets\[2\] = 2 is less than offsets\[1\] = 3"),
        ([0, 3], r"the last offset offsets\[1\] = 3 must equal T = 5"),
        ([], r"input `offsets` is empty"),
    ]:
        with pytest.raises(kfuse.InputError, match=message):
            prog(pred=p, target=p, offsets=torch.tensor(offsets, dtype=torch.int32))


def test_derivation_errors():
    prog = kfuse.load(example("giou_lengths.kf"))
    with pytest.raises(kfuse.Error, match="input `lengths` is i32; only float inputs have gradients"):
        prog.vjp("lengths")
    with pytest.raises(kfuse.Error, match="no input named `z`"):
        prog.vjp("z")
    per = kfuse.compile(PER_BOX, name="per_box")
    with pytest.raises(kfuse.Error, match=r"the loss `per_box` must be a scalar float, but it is f32\[B, N\]"):
        per.with_gradients("per_box", "pred")
    with pytest.raises(kfuse.InputError, match="no input named `nope`"):
        prog.with_input_dtypes(nope="f16")
    with pytest.raises(kfuse.InputError, match="unknown dtype `f64`"):
        prog.with_input_dtypes(pred="f64")


def test_outputs_mapping():
    out = kfuse.compile(PER_BOX, name="per_box")(**per_box_inputs())
    assert list(out.keys()) == ["per_box", "total", "valid_count"] and len(out) == 3
    assert out["total"] is out.total
    with pytest.raises(AttributeError, match="no output named 'nope'"):
        out.nope
    with pytest.raises(TypeError, match="read-only"):
        out.total = 1
    with pytest.raises(TypeError, match="read-only"):
        out["total"] = 1
    with pytest.raises(KeyError, match="no output named 'nope'"):
        out["nope"]
    # A tuple of tensors: unpacking, indexing and the mapping view agree.
    per_box, total, valid_count = out
    assert per_box is out[0] is out["per_box"] and total is out.total and valid_count is out[-1]
    assert isinstance(total, torch.Tensor) and out[1:] == (total, valid_count)
    assert [k for k, _ in out.items()] == list(out.keys()) and list(out.values()) == list(out)
    assert out._asdict() == {"per_box": per_box, "total": total, "valid_count": valid_count}
    assert repr(out).startswith("Outputs(per_box=tensor(")
    assert isinstance(out, kfuse.Outputs) and isinstance(out, tuple)


# --- the fused MLP --------------------------------------------------------------------------


def mlp_module():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.SiLU(), torch.nn.Linear(32, 24), torch.nn.GELU(), torch.nn.Linear(24, 8)
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_mlp_cpu_path_matches_the_module(dtype):
    module = mlp_module()
    fused = kfuse.nn.FusedMLP.from_torch(module, dtype=dtype)
    assert (fused.in_features, fused.out_features) == (16, 8)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        # The oracle: the module with its weights rounded to the stored dtype, in float64.
        ref = mlp_module().double()
        for p in ref.parameters():
            p.copy_(p.to(dtype).double())
        want = ref(x.double())
    got = fused(x)
    assert got.shape == (2, 5, 8) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_fused_mlp_refuses_inputs_that_require_grad_and_bad_shapes():
    fused = kfuse.nn.FusedMLP.from_torch(mlp_module())
    with pytest.raises(kfuse.InputError, match="FusedMLP is for inference"):
        fused(torch.randn(3, 16, requires_grad=True))
    with pytest.raises(kfuse.InputError, match=r"shape \(3, 15\), but the model takes \[\.\.\., 16\]"):
        fused(torch.randn(3, 15))
    with torch.no_grad():
        assert fused(torch.randn(3, 16, requires_grad=True)).shape == (3, 8)


def test_export_mlp_writes_the_model_format(tmp_path):
    path = tmp_path / "m.json"
    desc = kfuse.export_mlp(mlp_module(), str(path), "bf16")
    assert desc["format"] == "kfuse-mlp/1" and desc["dtype"] == "bf16"
    assert [l["activation"] for l in desc["layers"]] == ["silu", "gelu", "none"]
    assert os.path.exists(tmp_path / "m.safetensors")
    assert kfuse.nn.FusedMLP.load(path).out_features == 8
    with pytest.raises(kfuse.Error, match=r"module `1` \(Conv1d\) is not supported"):
        kfuse.export_mlp(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Conv1d(1, 1, 1)), str(path))


def test_nvrtc_is_found_in_its_wheel():
    from importlib import metadata

    from kfuse import _nvrtc

    try:
        metadata.version("nvidia-cuda-nvrtc")
    except metadata.PackageNotFoundError:
        pytest.skip("the nvidia-cuda-nvrtc wheel is not installed in this environment")
    path = _nvrtc.library_path()
    assert path is not None and "libnvrtc.so.13" in os.path.basename(path)
    assert _nvrtc.locate() == path == os.environ["KFUSE_NVRTC_LIBRARY"]


def test_import_and_cpu_runs_do_not_load_nvrtc():
    """NVRTC is loaded only when a kernel must compile: importing kfuse, reading a program and
    running it on CPU tensors make kfuse's native module load no libnvrtc (the dynamic loader's
    log names who loads each library; PyTorch's CUDA builds load their own copy at import)."""
    code = (
        "import torch, kfuse\n"
        f"p = kfuse.load({example('giou.kf')!r})\n"
        "x = torch.rand(2, 3, 4); x[..., 2:] += x[..., :2] + 0.1\n"
        "print(p(pred=x, target=x.clone()).loss.item())\n"
    )
    env = {**os.environ, "LD_DEBUG": "files"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300, env=env)
    loads = [line for line in out.stderr.splitlines() if "dynamically loaded by" in line]
    assert any("_kfuse" in line for line in loads), "the loader's log names kfuse's native module"
    by_kfuse = [line for line in loads if "nvrtc" in line.split("dynamically loaded by")[0] and "_kfuse" in line]
    assert not by_kfuse, by_kfuse


def test_shapes_and_layout_checks_without_data():
    """The checks the CUDA path makes before a launch (shapes bound in Rust, lengths copied to the
    host), exercised on the CPU."""
    prog = _kfuse.Program.compile(PER_BOX, "per_box")
    shapes = [("pred", "f32", [3, 5, 4]), ("target", "f32", [3, 5, 4]), ("lengths", "i32", [3])]
    binding = prog.bind(shapes)
    assert binding.outputs == [("f32", [3, 5]), ("f32", []), ("i32", [])]
    good = struct.pack("<3i", 5, 0, 2)
    binding.check_layouts([("lengths", good)])
    bad = struct.pack("<3i", 5, 0, 9)
    with pytest.raises(kfuse.InputError, match=r"input `lengths`: lengths\[2\] = 9 is greater than N = 5"):
        binding.check_layouts([("lengths", bad)])
    with pytest.raises(kfuse.InputError, match=r"input `target` has N = 4 \(axis 1\), but `pred` already set N = 5"):
        prog.bind([shapes[0], ("target", "f32", [3, 4, 4]), shapes[2]])
    with pytest.raises(kfuse.InputError, match=r"input `pred` has dtype f16, but is declared as f32"):
        prog.bind([("pred", "f16", [3, 5, 4]), *shapes[1:]])
    with pytest.raises(kfuse.InputError, match=r"2 addresses given for 6 inputs and outputs"):
        binding.launch(0, 0, [0, 0])


def test_import_does_not_load_the_compiler_frontend():
    """`import kfuse` stays cheap: torch.compile's frontend (torch._dynamo, seconds to import)
    loads only when the user compiles something."""
    code = "import sys, torch, kfuse; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip() == "False", out.stderr


def test_the_native_module_matches_its_type_stubs():
    """Every public name of the stub file exists in kfuse._kfuse with the same kind (class,
    function, attribute), every public method and property of a stubbed class exists, and the
    module has nothing public that the stubs leave out; the package ships py.typed."""
    import ast
    import pathlib

    from kfuse import _kfuse

    folder = pathlib.Path(kfuse.__file__).parent
    assert (folder / "py.typed").exists()
    tree = ast.parse((folder / "_kfuse.pyi").read_text())
    stubbed = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            stubbed.add(node.name)
            cls = getattr(_kfuse, node.name)
            assert isinstance(cls, type), node.name
            members = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            public = {n for n in dir(cls) if not n.startswith("_")}
            assert members == public, f"{node.name}: stub {sorted(members)} vs module {sorted(public)}"
        elif isinstance(node, ast.FunctionDef):
            stubbed.add(node.name)
            assert callable(getattr(_kfuse, node.name)), node.name
        elif isinstance(node, ast.AnnAssign) and node.target.id == "__version__":
            assert isinstance(_kfuse.__version__, str)
    public = {n for n in dir(_kfuse) if not n.startswith("_")}
    assert public == stubbed, f"module {sorted(public)} vs stubs {sorted(stubbed)}"


def test_int64_tensors_cross_both_ways_exactly():
    prog = kfuse.compile("input x: i64[N]\ninput k: i32[N]\noutput y = x * 3 + k\noutput n = i32(x)\n", name="longs")
    assert [d.dtype for d in prog.inputs] == [torch.int64, torch.int32]
    x = torch.tensor([2**62 + 1, -(2**63), 2**53 + 1, -7], dtype=torch.int64)
    k = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    out = prog(x=x, k=k)
    assert out.y.dtype == torch.int64 and out.n.dtype == torch.int32
    assert torch.equal(out.y, x * 3 + k)  # wraps at 2^63, as torch does
    assert torch.equal(out.n, x.to(torch.int32))
