"""CPU tier: the robustness catalogue of the Python package. Bad inputs a user could give
(malformed sources, unreadable files, wrong dtypes, shapes and devices, missing or misspelled
inputs, bad lengths and offsets values, modules FusedMLP cannot run, broken model files) each
raise kfuse's exception class with a message naming what is wrong; edge cases that are valid
(empty batches, NaN and infinity, non-contiguous views, expression activations) give the correct
result. Cases that could take the interpreter down, and environment variables, run in a
subprocess."""

import functools
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from torch import nn

import kfuse
import refs
from conftest import REPO, example

# --- programs and inputs -------------------------------------------------------------------


@functools.cache
def giou():
    return kfuse.load(example("giou_lengths.kf"))


@functools.cache
def packed():
    return kfuse.load(example("giou_packed.kf"))


@functools.cache
def square():
    return kfuse.compile("input x: f32[N]\noutput y = x * x\n", name="square")


def boxes(*lead, seed=0):
    gen = torch.Generator().manual_seed(seed)
    xy = torch.rand(*lead, 2, generator=gen) * 4
    return torch.cat([xy, xy + 0.5 + torch.rand(*lead, 2, generator=gen) * 3], -1)


def batch(**change):
    """pred, target [2, 3, 4] and lengths [3, 1] (int32), with `change` applied."""
    x = {"pred": boxes(2, 3, seed=1), "target": boxes(2, 3, seed=2), "lengths": torch.tensor([3, 1], dtype=torch.int32)}
    x.update(change)
    return x


def offsets(*values, dtype=torch.int32):
    return {"pred": boxes(5, seed=3), "target": boxes(5, seed=4), "offsets": torch.tensor(values, dtype=dtype)}


@functools.cache
def int_sum():
    return kfuse.compile("input x: i32[N]\noutput y = sum(x)\n", name="int_sum")


@functools.cache
def mlp():
    torch.manual_seed(0)
    return kfuse.nn.FusedMLP.from_torch(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))


def model_file(folder, edit=None, weights=None):
    """A model exported into `folder`; `edit` changes its description, `weights` replaces the
    bytes of its safetensors file. Returns the model.json path."""
    path = str(folder / "model.json")
    kfuse.export_mlp(nn.Sequential(nn.Linear(4, 2)), path)
    if edit is not None:
        with open(path) as f:
            desc = json.load(f)
        edit(desc)
        with open(path, "w") as f:
            json.dump(desc, f)
    if weights is not None:
        (folder / "model.safetensors").write_bytes(weights)
    return path


def write(folder, name, data):
    path = folder / name
    path.write_bytes(data)
    return str(path)


# --- every bad input: (id, call(tmp_path), exception class, key words of the message) --------
#
# The message is matched with re.search; each pattern names what is wrong and, where there is
# one, what would be right.

SRC = "input x: f32[N]\n"


def compile_(source):
    return lambda tmp: kfuse.compile(source, name="src")


CASES = [
    # Malformed sources.
    ("source_ends_mid_expression", compile_(SRC + "output y = x +\n"), kfuse.ParseError,
     r"unexpected end of line[\s\S]*src:2:15[\s\S]*expected: an expression"),
    ("source_unknown_name", compile_(SRC + "output y = z * 2\n"), kfuse.ParseError,
     r"unknown name `z`[\s\S]*src:2:12[\s\S]*defined above by `input`, `let` or `output`"),
    ("source_unknown_function", compile_(SRC + "output y = frob(x)\n"), kfuse.ParseError,
     r"unknown function `frob`[\s\S]*a built-in function: where, min, max"),
    ("source_bool_plus_float", compile_(SRC + "let b = x > 0\noutput y = b + 1.0\n"), kfuse.ParseError,
     r"`\+` needs operands of the same kind, got bool and f32[\s\S]*where\(c, 1.0, 0.0\)"),
    ("source_input_twice", compile_(SRC + SRC + "output y = x\n"), kfuse.ParseError,
     r"`x` is already defined[\s\S]*first defined at line 1"),
    ("source_output_twice", compile_(SRC + "output y = x\noutput y = x\n"), kfuse.ParseError,
     r"`y` is already defined[\s\S]*src:3:8"),
    ("source_without_output", compile_(SRC), kfuse.ParseError, r"the program defines no output"),
    ("source_empty", compile_(""), kfuse.ParseError, r"the program defines no output[\s\S]*src:1:1"),
    ("source_nul_character", compile_(SRC + "output y = x\x00\n"), kfuse.ParseError,
     r"unexpected invisible character U\+0000 \(NUL\)[\s\S]*src:2:13[\s\S]*delete the character"),
    ("source_zero_width_space", compile_(SRC + "output y = x\u200b\n"), kfuse.ParseError,
     r"invisible character U\+200B \(zero-width space\)[\s\S]*src:2:13"),
    ("source_unknown_dtype", compile_("input x: f64[N]\noutput y = x\n"), kfuse.ParseError,
     r"unknown dtype `f64`[\s\S]*f32, f16, bf16, i32, i64 or bool"),
    ("source_shapes_do_not_broadcast", compile_(SRC + "input z: f32[M]\noutput y = x + z\n"), kfuse.ParseError,
     r"cannot broadcast shape \[N\] with shape \[M\]"),
    ("source_not_a_string", lambda tmp: kfuse.compile(123), TypeError, r"argument 'source'.*'int'"),
    ("source_as_bytes", lambda tmp: kfuse.compile(SRC.encode()), TypeError, r"argument 'source'.*'bytes'"),
    # Files.
    ("load_missing_file", lambda tmp: kfuse.load(tmp / "nope.kf"), kfuse.Error,
     r"cannot read .*nope\.kf.*No such file or directory"),
    ("load_directory", lambda tmp: kfuse.load(tmp), kfuse.Error,
     r"cannot read kfuse source .*: it is a directory, not a regular file"),
    ("load_dev_zero", lambda tmp: kfuse.load("/dev/zero"), kfuse.Error,
     r"cannot read kfuse source /dev/zero: it is a character device, not a regular file"),
    ("load_non_utf8", lambda tmp: kfuse.load(write(tmp, "bad.kf", b"input x: f32[N]\noutput y = x \xff\n")),
     kfuse.ParseError, r"not UTF-8 text: byte 0xFF[\s\S]*bad\.kf:2:14[\s\S]*saved as UTF-8"),
    ("load_nul_character", lambda tmp: kfuse.load(write(tmp, "nul.kf", b"input x: f32[N]\noutput y = x\x00\n")),
     kfuse.ParseError, r"U\+0000 \(NUL\)[\s\S]*nul\.kf:2:13"),
    ("load_empty_file", lambda tmp: kfuse.load(write(tmp, "empty.kf", b"")), kfuse.ParseError,
     r"the program defines no output[\s\S]*empty\.kf:1:1"),
    ("load_none", lambda tmp: kfuse.load(None), TypeError, r"os\.PathLike object, not NoneType"),
    # Inputs by keyword: missing, unknown, misspelled, positional, not tensors.
    ("input_missing", lambda tmp: giou()(**{k: v for k, v in batch().items() if k != "lengths"}),
     kfuse.InputError, r"missing input `lengths` \(declared as i32\[B\] as lengths\(N\)\)"),
    ("input_unknown_extra", lambda tmp: giou()(**batch(), weights=torch.ones(2)), kfuse.InputError,
     r"unknown input `weights`; the inputs are: pred, target, lengths"),
    ("input_misspelled", lambda tmp: giou()(pred=batch()["pred"], targte=batch()["target"], lengths=batch()["lengths"]),
     kfuse.InputError, r"missing input `target` \(declared as f32\[B, N, 4\]\); given but not inputs: `targte`"),
    ("input_positional", lambda tmp: giou()(*batch().values()), TypeError,
     r"inputs are given by keyword \(pred, target, lengths\)"),
    ("input_list", lambda tmp: giou()(**batch(pred=batch()["pred"].tolist())), kfuse.InputError,
     r"input `pred` must be a torch\.Tensor, not list"),
    ("input_python_float", lambda tmp: giou()(**batch(pred=1.0)), kfuse.InputError,
     r"input `pred` must be a torch\.Tensor, not float"),
    ("input_none", lambda tmp: giou()(**batch(pred=None)), kfuse.InputError,
     r"input `pred` is None; give a torch\.Tensor \(f32\[B, N, 4\]\)"),
    # Dtypes.
    ("dtype_float64", lambda tmp: giou()(**batch(pred=batch()["pred"].double())), kfuse.InputError,
     r"`pred` has dtype torch\.float64, but is declared as f32\[B, N, 4\] \(kfuse floats are float32, float16"),
    ("dtype_int64_lengths", lambda tmp: giou()(**batch(lengths=torch.tensor([3, 1]))), kfuse.InputError,
     r"`lengths` has dtype torch\.int64, but is declared as i32\[B\] as lengths\(N\)"),
    ("dtype_float_lengths", lambda tmp: giou()(**batch(lengths=torch.tensor([3.0, 1.0]))), kfuse.InputError,
     r"`lengths` has dtype torch\.float32, but is declared as i32\[B\]"),
    ("dtype_bool_for_float", lambda tmp: giou()(**batch(pred=batch()["pred"] > 1)), kfuse.InputError,
     r"`pred` has dtype torch\.bool, but is declared as f32"),
    ("dtype_int32_for_float", lambda tmp: giou()(**batch(pred=batch()["pred"].int())), kfuse.InputError,
     r"`pred` has dtype torch\.int32, but is declared as f32"),
    ("dtype_complex", lambda tmp: giou()(**batch(pred=batch()["pred"].to(torch.complex64))), kfuse.InputError,
     r"`pred` has dtype torch\.complex64"),
    # Shapes and ranks.
    ("shape_rank_too_low", lambda tmp: giou()(**batch(pred=batch()["pred"][0])), kfuse.InputError,
     r"`pred` has 2 axes \(shape \[3, 4\]\), but is declared with 3: f32\[B, N, 4\]"),
    ("shape_scalar", lambda tmp: giou()(**batch(pred=torch.tensor(1.0))), kfuse.InputError,
     r"`pred` has 0 axes \(shape \[\]\)"),
    ("shape_symbol_disagrees", lambda tmp: giou()(**batch(target=boxes(2, 4))), kfuse.InputError,
     r"`target` has N = 4 \(axis 1\), but `pred` already set N = 3"),
    ("shape_constant_axis", lambda tmp: giou()(**batch(pred=torch.rand(2, 3, 3))), kfuse.InputError,
     r"`pred` has size 3 on axis 2, but the declaration f32\[B, N, 4\] fixes it at 4"),
    ("shape_lengths_batch", lambda tmp: giou()(**batch(lengths=torch.tensor([3, 1, 1], dtype=torch.int32))),
     kfuse.InputError, r"`lengths` has B = 3 \(axis 0\), but `pred` already set B = 2"),
    ("shape_lengths_rank", lambda tmp: giou()(**batch(lengths=torch.tensor([[3, 1]], dtype=torch.int32))),
     kfuse.InputError, r"`lengths` has 2 axes \(shape \[1, 2\]\), but is declared with 1"),
    ("device_meta", lambda tmp: giou()(**batch(pred=torch.empty(2, 3, 4, device="meta"))), kfuse.InputError,
     r"`pred` is on meta; kfuse runs on CPU and CUDA tensors"),
    # Lengths values.
    ("lengths_negative", lambda tmp: giou()(**batch(lengths=torch.tensor([-1, 1], dtype=torch.int32))),
     kfuse.InputError, r"`lengths`: lengths\[0\] = -1 is negative"),
    ("lengths_over_n", lambda tmp: giou()(**batch(lengths=torch.tensor([3, 4], dtype=torch.int32))),
     kfuse.InputError, r"`lengths`: lengths\[1\] = 4 is greater than N = 3"),
    ("lengths_checked_on_cpu_without_validate",
     lambda tmp: giou()(**batch(lengths=torch.tensor([3, 9], dtype=torch.int32)), validate=False),
     kfuse.InputError, r"lengths\[1\] = 9 is greater than N = 3"),
    # Offsets values.
    ("offsets_decreasing", lambda tmp: packed()(**offsets(0, 3, 2, 5)), kfuse.InputError,
     r"`offsets`: offsets\[2\] = 2 is less than offsets\[1\] = 3 \(offsets must not decrease\)"),
    ("offsets_negative", lambda tmp: packed()(**offsets(0, -1, 5)), kfuse.InputError,
     r"offsets\[1\] = -1 is less than offsets\[0\] = 0"),
    ("offsets_last_is_not_t", lambda tmp: packed()(**offsets(0, 2, 4)), kfuse.InputError,
     r"the last offset offsets\[2\] = 4 must equal T = 5"),
    ("offsets_first_is_not_zero", lambda tmp: packed()(**offsets(1, 2, 5)), kfuse.InputError,
     r"offsets\[0\] = 1, but must be 0"),
    ("offsets_past_the_end", lambda tmp: packed()(**offsets(0, 7, 5)), kfuse.InputError,
     r"offsets\[1\] = 7 is past the end \(T = 5\)"),
    ("offsets_empty", lambda tmp: packed()(**offsets()), kfuse.InputError,
     r"`offsets` is empty, but offsets need at least one element"),
    ("offsets_int64", lambda tmp: packed()(**offsets(0, 2, 5, dtype=torch.int64)), kfuse.InputError,
     r"`offsets` has dtype torch\.int64, but is declared as i32\[S\] as offsets\(T\)"),
    # Program methods.
    ("with_input_dtypes_unknown_input", lambda tmp: giou().with_input_dtypes(prd="f16"), kfuse.InputError,
     r"no input named `prd` \(inputs: `pred`, `target`, `lengths`\)"),
    ("with_input_dtypes_unknown_name", lambda tmp: giou().with_input_dtypes(pred="f64"), kfuse.InputError,
     r"unknown dtype `f64`; kfuse has f32, f16, bf16, i32, i64, bool"),
    ("with_input_dtypes_torch_float64", lambda tmp: giou().with_input_dtypes(pred=torch.float64), kfuse.InputError,
     r"`pred`: torch\.float64 is not a kfuse dtype; kfuse has f32, f16, bf16, i32, i64, bool"),
    ("with_input_dtypes_not_a_dtype", lambda tmp: giou().with_input_dtypes(pred=3), TypeError,
     r"the dtype of `pred` is a name"),
    ("with_input_dtypes_float_lengths", lambda tmp: giou().with_input_dtypes(lengths="f16"), kfuse.ParseError,
     r"`lengths` cannot be declared as lengths: it is f16, and lengths must be i32"),
    ("vjp_unknown_input", lambda tmp: giou().vjp("nope"), kfuse.Error,
     r"no input named `nope` to differentiate with respect to \(inputs: `pred`, `target`, `lengths`\)"),
    ("vjp_integer_input", lambda tmp: giou().vjp("lengths"), kfuse.Error,
     r"`lengths` is i32; only float inputs have gradients"),
    ("vjp_nothing", lambda tmp: giou().vjp(), TypeError,
     r"vjp takes the inputs to differentiate with respect to \(float inputs: pred, target\)"),
    ("with_gradients_unknown_loss", lambda tmp: giou().with_gradients("nope", "pred"), kfuse.Error,
     r"no output named `nope` \(outputs: `loss`\)"),
    ("with_gradients_tensor_loss", lambda tmp: square().with_gradients("y", "x"), kfuse.Error,
     r"the loss `y` must be a scalar float, but it is f32\[N\] \(reduce it with sum or mean first\)"),
    # FusedMLP.from_torch on modules it cannot run.
    ("mlp_conv2d", lambda tmp: kfuse.nn.FusedMLP.from_torch(nn.Conv2d(1, 1, 3)), kfuse.Error,
     r"Conv2d has no child modules; expected nn\.Sequential of Linear and activations"),
    ("mlp_conv2d_in_sequential", lambda tmp: kfuse.nn.FusedMLP.from_torch(nn.Sequential(nn.Linear(4, 4), nn.Conv2d(1, 1, 3))),
     kfuse.Error, r"module `1` \(Conv2d\) is not supported; kfuse MLPs are Linear layers and elementwise activations"),
    ("mlp_unsupported_activation", lambda tmp: kfuse.nn.FusedMLP.from_torch(nn.Sequential(nn.Linear(4, 4), nn.ELU())),
     kfuse.Error, r"module `1` \(ELU\) is not supported[\s\S]*ReLU, LeakyReLU, SiLU, GELU, Sigmoid, Tanh, Softplus"),
    ("mlp_layer_norm", lambda tmp: kfuse.nn.FusedMLP.from_torch(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))),
     kfuse.Error, r"module `1` \(LayerNorm\) is not supported"),
    ("mlp_gelu_unknown_approximation",
     lambda tmp: kfuse.nn.FusedMLP.from_torch(nn.Sequential(nn.Linear(4, 4), nn.GELU(approximate="bogus"))),
     kfuse.Error, r"GELU\(approximate='bogus'\) is not supported; use 'none' or 'tanh'"),
    ("mlp_activation_first", lambda tmp: kfuse.nn.FusedMLP.from_torch(nn.Sequential(nn.ReLU(), nn.Linear(4, 4))),
     kfuse.Error, r"module `0` \(ReLU\) comes before any Linear layer"),
    ("mlp_two_activations",
     lambda tmp: kfuse.nn.FusedMLP.from_torch(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Tanh())),
     kfuse.Error, r"module `2`: two activations in a row after `0\.weight`"),
    ("mlp_no_linear", lambda tmp: kfuse.nn.FusedMLP.from_torch(nn.Sequential(nn.Dropout())), kfuse.Error,
     r"the module holds no nn\.Linear layers"),
    ("mlp_widths_do_not_chain",
     lambda tmp: kfuse.nn.FusedMLP.from_torch(nn.Sequential(nn.Linear(4, 8), nn.Linear(5, 2))), kfuse.Error,
     r"layer 1: widths do not chain: its weight `1\.weight` takes 5 inputs, but layer 0 produces 8 outputs"),
    ("mlp_zero_width", lambda tmp: kfuse.nn.FusedMLP.from_torch(nn.Sequential(nn.Linear(0, 3))), kfuse.Error,
     r"`0\.weight` has a zero-sized shape \[3, 0\]; every width must be at least 1"),
    ("mlp_float32_weights",
     lambda tmp: kfuse.nn.FusedMLP.from_torch(nn.Sequential(nn.Linear(4, 4)), dtype=torch.float32),
     kfuse.InputError, r"FusedMLP weights are float16 or bfloat16, not torch\.float32"),
    ("mlp_not_a_module", lambda tmp: kfuse.nn.FusedMLP.from_torch(torch.zeros(3)), kfuse.Error,
     r"expected a torch\.nn\.Module \(an nn\.Sequential of Linear and activations\), not Tensor"),
    # FusedMLP calls.
    ("mlp_input_float64", lambda tmp: mlp()(torch.rand(3, 4, dtype=torch.float64)), kfuse.InputError,
     r"FusedMLP input has dtype torch\.float64; it takes float32, float16 or bfloat16"),
    ("mlp_input_int32", lambda tmp: mlp()(torch.ones(3, 4, dtype=torch.int32)), kfuse.InputError,
     r"FusedMLP input has dtype torch\.int32"),
    ("mlp_input_width", lambda tmp: mlp()(torch.rand(3, 5)), kfuse.InputError,
     r"FusedMLP input has shape \(3, 5\), but the model takes \[\.\.\., 4\]"),
    ("mlp_input_scalar", lambda tmp: mlp()(torch.tensor(1.0)), kfuse.InputError,
     r"FusedMLP input has shape \(\), but the model takes \[\.\.\., 4\]"),
    ("mlp_input_list", lambda tmp: mlp()([1.0, 2.0, 3.0, 4.0]), kfuse.InputError,
     r"FusedMLP takes a torch\.Tensor, not list"),
    ("mlp_input_meta", lambda tmp: mlp()(torch.empty(3, 4, device="meta")), kfuse.InputError,
     r"FusedMLP input is on meta; it runs on CPU and CUDA tensors"),
    ("mlp_input_requires_grad", lambda tmp: mlp()(torch.rand(3, 4, requires_grad=True)), kfuse.InputError,
     r"FusedMLP is for inference[\s\S]*torch\.no_grad\(\)"),
    # Model files.
    ("mlp_load_missing", lambda tmp: kfuse.nn.FusedMLP.load(tmp / "nope.json"), kfuse.Error,
     r"cannot read model description .*nope\.json: No such file or directory"),
    ("mlp_load_directory", lambda tmp: kfuse.nn.FusedMLP.load(tmp), kfuse.Error,
     r"cannot read model description .*: it is a directory, not a regular file"),
    ("mlp_load_dev_zero", lambda tmp: kfuse.nn.FusedMLP.load("/dev/zero"), kfuse.Error,
     r"cannot read model description /dev/zero: it is a character device, not a regular file"),
    ("mlp_load_not_json", lambda tmp: kfuse.nn.FusedMLP.load(write(tmp, "m.json", b"{not json")), kfuse.Error,
     r"`.*m\.json` is not a valid kfuse MLP description: key must be a string at line 1 column 2"),
    ("mlp_load_weights_missing",
     lambda tmp: kfuse.nn.FusedMLP.load(model_file(tmp, lambda d: d.update(weights="gone.safetensors"))), kfuse.Error,
     r"cannot read weights file .*gone\.safetensors: No such file or directory"),
    ("mlp_load_weights_corrupt",
     lambda tmp: kfuse.nn.FusedMLP.load(model_file(tmp, weights=b"\x05\x00\x00\x00\x00\x00\x00\x00hello")),
     kfuse.Error, r"weights file `.*model\.safetensors` is not a valid safetensors file"),
    ("mlp_load_weights_truncated",
     lambda tmp: kfuse.nn.FusedMLP.load(model_file(tmp, weights=b"\xff\xff")), kfuse.Error,
     r"weights file `.*model\.safetensors` is not a valid safetensors file"),
    ("mlp_load_model_dtype", lambda tmp: kfuse.nn.FusedMLP.load(model_file(tmp, lambda d: d.update(dtype="f64"))),
     kfuse.Error, r"unsupported weight dtype `f64`; expected \"f16\" or \"bf16\""),
    ("mlp_load_unknown_activation",
     lambda tmp: kfuse.nn.FusedMLP.load(model_file(tmp, lambda d: d["layers"][0].update(activation="frob"))),
     kfuse.Error, r"layer 0: unknown activation `frob`; known: none relu"),
    ("mlp_load_bool_activation",
     lambda tmp: kfuse.nn.FusedMLP.load(model_file(tmp, lambda d: d["layers"][0].update(activation="x > 0"))),
     kfuse.Error, r"activation `x > 0` must produce one float value per element, but it produces bool"),
    ("mlp_load_missing_tensor",
     lambda tmp: kfuse.nn.FusedMLP.load(model_file(tmp, lambda d: d["layers"][0].update(weight="w"))), kfuse.Error,
     r"layer 0: tensor `w` \(weight\) is not in `.*model\.safetensors`, which holds: 0\.bias, 0\.weight"),
    ("export_dtype", lambda tmp: kfuse.export_mlp(nn.Sequential(nn.Linear(4, 2)), str(tmp / "m.json"), "f32"),
     kfuse.Error, r"dtype must be f16 or bf16, not 'f32'"),
    ("export_to_a_folder", lambda tmp: kfuse.export_mlp(nn.Sequential(nn.Linear(4, 2)), str(tmp)), kfuse.Error,
     r"is a folder; give the path of the model\.json to write"),
]


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op")
@pytest.mark.parametrize("call, cls, pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_a_clear_error(call, cls, pattern, tmp_path):
    with pytest.raises(cls) as info:
        call(tmp_path)
    assert re.search(pattern, str(info.value)), f"message does not match {pattern!r}:\n{info.value}"


@pytest.mark.parametrize("on_gpu", [False, True], ids=["cpu", "gpu"])
def test_an_i32_sum_is_an_exact_int64_as_torch_gives(on_gpu, request):
    # torch sums integers into an int64; so does kfuse: totals beyond the i32 range are exact.
    device = request.getfixturevalue("gpu") if on_gpu else torch.device("cpu")
    for values in ([2**31 - 1, 1], [-(2**31), -1], [2**30] * 7 + [5]):
        x = torch.tensor(values, dtype=torch.int32, device=device)
        got = int_sum()(x=x).y
        assert got.dtype == torch.int64 and got.device == x.device
        assert int(got) == int(x.sum()) == sum(values)


def test_catalogue_ids_are_unique_and_many():
    ids = [c[0] for c in CASES]
    assert len(set(ids)) == len(ids) and len(ids) >= 40


def test_parse_error_says_where():
    with pytest.raises(kfuse.ParseError) as info:
        kfuse.compile(SRC + "output y = z * 2\n", name="where.kf")
    assert (info.value.file, info.value.line, info.value.column) == ("where.kf", 2, 12)
    assert isinstance(info.value, ValueError)


def test_invisible_and_non_utf8_text_say_line_and_column(tmp_path):
    with pytest.raises(kfuse.ParseError) as info:
        kfuse.compile(SRC + "let a = x\nlet b =\x00 a\noutput y = b\n", name="nul.kf")
    assert (info.value.file, info.value.line, info.value.column) == ("nul.kf", 3, 8)
    assert "U+0000" in str(info.value) and "nul.kf:3:8" in str(info.value)
    path = write(tmp_path, "latin1.kf", "input x: f32[N]\n# café\noutput y = x\n".encode("latin-1"))
    with pytest.raises(kfuse.ParseError) as info:
        kfuse.load(path)
    assert (info.value.line, info.value.column) == (2, 6)
    assert re.search(r"not UTF-8 text: byte 0xE9[\s\S]*latin1\.kf:2:6", str(info.value)), str(info.value)


def test_export_to_a_folder_writes_nothing(tmp_path):
    (tmp_path / "dir").mkdir()
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(kfuse.Error, match="is a folder"):
        kfuse.export_mlp(nn.Sequential(nn.Linear(4, 2)), str(tmp_path / "dir"))
    assert sorted(os.listdir(tmp_path)) == before


# --- valid edge cases: the correct result ----------------------------------------------------


def giou_ref(x):
    """The loss of giou_lengths.kf in float64 torch."""
    p, t, lengths = x["pred"].double(), x["target"].double(), x["lengths"]
    return refs.masked_mean(refs.giou_terms(p, t), refs.lengths_mask(lengths, p.shape[1]))


@pytest.mark.parametrize("b, n", [(0, 3), (2, 0), (0, 0)])
def test_empty_batch_gives_zero_loss_and_empty_gradient(b, n):
    pred = torch.rand(b, n, 4, requires_grad=True)
    out = giou()(pred=pred, target=torch.rand(b, n, 4), lengths=torch.full((b,), n, dtype=torch.int32))
    out.loss.backward()
    assert out.loss.item() == 0.0 and pred.grad.shape == (b, n, 4)


def test_all_lengths_zero_gives_zero_loss_and_zero_gradient():
    x = batch(lengths=torch.zeros(2, dtype=torch.int32))
    x["pred"].requires_grad_()
    out = giou()(**x)
    out.loss.backward()
    assert out.loss.item() == 0.0 and torch.count_nonzero(x["pred"].grad) == 0


def test_nan_in_a_valid_box_propagates_to_the_loss_and_its_box_only():
    x = batch()
    x["pred"][0, 1, 2] = float("nan")
    x["pred"].requires_grad_()
    out = giou()(**x)
    out.loss.backward()
    assert torch.isnan(out.loss)
    grad = x["pred"].grad
    assert torch.isnan(grad[0, 1]).any()
    others = torch.ones(2, 3, dtype=torch.bool)
    others[0, 1] = False
    assert torch.isfinite(grad[others]).all()


def test_nan_and_infinity_in_padding_never_reach_the_loss():
    x = batch()
    clean = giou()(**x).loss
    x["pred"][1, 1:] = float("nan")
    x["target"][1, 2] = float("inf")
    x["pred"].requires_grad_()
    out = giou()(**x)
    out.loss.backward()
    assert out.loss.item() == clean.item()
    torch.testing.assert_close(out.loss.double(), giou_ref(batch()), rtol=1e-5, atol=1e-6)
    assert torch.isfinite(x["pred"].grad).all() and torch.count_nonzero(x["pred"].grad[1, 1:]) == 0


def test_non_contiguous_and_mixed_dtype_inputs_give_the_same_loss():
    x = batch()
    want = giou()(**x).loss
    wide = torch.zeros(2, 3, 8)
    wide[..., ::2] = x["pred"]
    strided = giou()(**batch(pred=wide[..., ::2]))
    assert not wide[..., ::2].is_contiguous() and strided.loss.item() == want.item()
    half = giou()(**batch(pred=x["pred"].half()))
    torch.testing.assert_close(half.loss, want, rtol=2e-3, atol=2e-3)


def test_offsets_with_no_segments():
    out = packed()(pred=torch.rand(0, 4), target=torch.rand(0, 4), offsets=torch.zeros(1, dtype=torch.int32))
    assert out.loss.item() == 0.0


def test_division_by_zero_and_sqrt_follow_ieee_as_torch_does():
    div = kfuse.compile(SRC + "output y = x / 0\n", name="div")
    x = torch.tensor([1.0, -1.0, 0.0])
    torch.testing.assert_close(div(x=x).y, x / 0, equal_nan=True)
    sq = kfuse.compile(SRC + "output y = sqrt(x)\n", name="sqrt")
    x = torch.tensor([4.0, 0.0, -1.0, float("inf")], requires_grad=True)
    y = sq(x=x).y
    y.sum().backward()
    xt = x.detach().clone().requires_grad_()
    torch.sqrt(xt).sum().backward()
    torch.testing.assert_close(y.detach(), torch.sqrt(xt.detach()), equal_nan=True)
    torch.testing.assert_close(x.grad, xt.grad, equal_nan=True)


def test_fused_mlp_edge_cases():
    m = mlp()
    assert m(torch.rand(0, 4)).shape == (0, 2)
    assert m(torch.rand(2, 0, 4)).shape == (2, 0, 2)
    assert m(torch.rand(4)).shape == (2,)
    x = torch.rand(3, 4)
    x[1, 2] = float("nan")
    y = m(x)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()
    t = torch.rand(4, 3)
    assert torch.equal(m(t.t()), m(t.t().contiguous()))
    assert m(torch.rand(3, 4).half()).dtype == torch.float16


@pytest.mark.parametrize(
    "activation",
    [nn.LeakyReLU(0.2), nn.Softplus(beta=2.0), nn.Softplus(threshold=5.0), nn.GELU(approximate="tanh"), nn.Identity()],
    ids=["leaky_relu_0.2", "softplus_beta2", "softplus_threshold5", "gelu_tanh", "identity"],
)
def test_fused_mlp_activations_as_expressions_match_torch(activation):
    torch.manual_seed(2)
    module = nn.Sequential(nn.Linear(4, 8), activation, nn.Dropout(0.5), nn.Linear(8, 3)).eval()
    fused = kfuse.nn.FusedMLP.from_torch(module)
    x = torch.randn(16, 4) * 3
    with torch.no_grad():
        ref = module.double()
        for p in ref.parameters():
            p.copy_(p.to(torch.float16).double())
        want = ref(x.double())
    torch.testing.assert_close(fused(x).double(), want, rtol=1e-4, atol=1e-4)


def test_fused_mlp_of_a_module_with_children():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.act, self.b = nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1)

        def forward(self, x):
            return self.b(self.act(self.a(x)))

    torch.manual_seed(3)
    net = Net()
    fused = kfuse.nn.FusedMLP.from_torch(net, dtype=torch.bfloat16)
    x = torch.randn(5, 4)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        want = net(x)
    torch.testing.assert_close(fused(x), want, rtol=1e-4, atol=1e-4)


# --- in a subprocess: long programs, environment variables --------------------------------


def run_python(code, env=None, cwd=REPO):
    full = dict(os.environ, **(env or {}))
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=full, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"exit {out.returncode}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}"
    return out


def test_a_long_chain_of_lets_runs_with_its_gradient():
    code = """
import torch, kfuse
n = 2000
src = "input x: f32[N]\\n" + "".join(f"let a{i} = {'x' if i == 0 else f'a{i - 1}'} * 1 + 1\\n" for i in range(n))
src += f"output y = sum(a{n - 1} * a{n - 1})\\n"
x = torch.tensor([0.0, 1.0], requires_grad=True)
out = kfuse.compile(src, name="chain")(x=x)
out.y.backward()
print(out.y.item(), x.grad.tolist())
"""
    values = run_python(code).stdout.split(maxsplit=1)
    # y = (x + n)^2 summed: 2000^2 + 2001^2; dy/dx = 2 (x + n).
    assert float(values[0]) == 2000.0**2 + 2001.0**2
    assert values[1].strip() == "[4000.0, 4002.0]"


def test_cache_folder_with_user_files_is_left_alone(tmp_path):
    """KFUSE_CACHE_DIR pointed at a folder of the user's, or at a file: the package's CPU path,
    compile, cuda_source and cache_info work, and every user file is byte-identical after."""
    folder = tmp_path / "mine"
    (folder / "sub").mkdir(parents=True)
    files = {folder / "notes.txt": b"keep me\n", folder / "sub" / "data.bin": bytes(range(256))}
    for path, data in files.items():
        path.write_bytes(data)
    lone = tmp_path / "a-file"
    lone.write_bytes(b"not a folder")
    code = """
import torch, kfuse
p = kfuse.load("examples/giou.kf")
x = torch.tensor([[[0.0, 0.0, 2.0, 3.0], [1.0, 1.0, 4.0, 2.0]]])  # GIoU of a box with itself: 1
loss = p(pred=x, target=x)["loss"]
assert len(p.cuda_source()) > 0
print(float(loss), kfuse.cache_info()["cache_dir"])
"""
    for where in (folder, lone):
        out = run_python(code, env={"KFUSE_CACHE_DIR": str(where)})
        loss, reported = out.stdout.split()
        assert abs(float(loss)) < 1e-5 and reported == str(where)
    for path, data in files.items():
        assert path.read_bytes() == data
    assert sorted(p.name for p in folder.iterdir()) in (["notes.txt", "sub"], ["CACHEDIR.TAG", "notes.txt", "sub"])
    assert lone.read_bytes() == b"not a folder"


def test_a_program_of_10000_lets_loads_runs_and_emits_cuda(tmp_path):
    """kfuse.load of 10,000 chained lets: the CPU result and its gradient, and the generated CUDA
    (the codegen walks the whole chain), in a subprocess so that an abort cannot take pytest down."""
    n = 10_000
    path = tmp_path / "deep.kf"
    path.write_text(
        "input x: f32[N]\nlet a0 = x + 1\n"
        + "".join(f"let a{i} = a{i - 1} + 1\n" for i in range(1, n))
        + f"output y = sum(a{n - 1})\n"
    )
    code = f"""
import torch, kfuse
p = kfuse.load({str(path)!r})
x = torch.tensor([0.0, 1.0], requires_grad=True)
out = p(x=x)
out.y.backward()
print(out.y.item(), x.grad.tolist(), "__global__" in p.cuda_source())
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stderr}"
    assert out.stdout.split() == [str(float(2 * n + 1)), "[1.0,", "1.0]", "True"]


# Every call that needs the kernel cache, on CPU: each raises (or returns) what it gives.
ENV_PROBE = """
import json, kfuse
calls = {
    "load": lambda: kfuse.load("examples/giou.kf"),
    "compile": lambda: kfuse.compile("input x: f32[N]\\noutput y = x * x\\n", name="probe"),
    "cache_info": lambda: kfuse.cache_info()["cache_dir"],
}
result = {}
for name, call in calls.items():
    try:
        value = call()
        result[name] = {"ok": True, "value": value if isinstance(value, (str, type(None))) else repr(value)}
    except Exception as e:
        kind = isinstance(e, kfuse.Error)
        result[name] = {"ok": False, "class": type(e).__name__, "is_kfuse": kind, "message": str(e)}
print(json.dumps(result))
"""


def probe_env(tmp_path, **env):
    """ENV_PROBE's results in a fresh interpreter with `env` (kfuse's other variables unset)."""
    unset = dict.fromkeys(("KFUSE_NO_CACHE", "KFUSE_LOG_COMPILES", "KFUSE_LOG_TIMING", "KFUSE_CACHE_MAX_BYTES"), "")
    out = run_python(ENV_PROBE, env={**unset, "KFUSE_CACHE_DIR": str(tmp_path / "cache"), **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


FLAG_WORDS = r"expected 1, true, yes, on \(or 0, false, no, off; empty is off\)"


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("KFUSE_NO_CACHE", "maybe", FLAG_WORDS),
        ("KFUSE_NO_CACHE", "2", FLAG_WORDS),
        ("KFUSE_LOG_COMPILES", "2", FLAG_WORDS),
        ("KFUSE_LOG_TIMING", "sometimes", FLAG_WORDS),
        ("KFUSE_CACHE_MAX_BYTES", "lots", r"expected a byte count such as 1073741824, 64K, 512M or 2G"),
        ("KFUSE_CACHE_MAX_BYTES", "-1", r"expected a byte count"),
    ],
)
def test_an_invalid_environment_variable_is_a_config_error_on_cpu(tmp_path, name, value, expected):
    """Without a GPU too: kfuse.load, kfuse.compile and kfuse.cache_info raise kfuse.ConfigError
    naming the variable, its value and what it accepts; the interpreter lives on."""
    result = probe_env(tmp_path, **{name: value})
    for call, got in result.items():
        assert not got["ok"] and got["class"] == "ConfigError" and got["is_kfuse"], (call, got)
        assert re.search(rf'environment variable {name}="{re.escape(value)}" is invalid: {expected}', got["message"]), (
            call,
            got,
        )
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("word", ["true", "yes", "ON", "1", " On "])
def test_cache_flag_accepts_the_words_for_on(tmp_path, word):
    result = probe_env(tmp_path, KFUSE_NO_CACHE=word)
    assert all(got["ok"] for got in result.values()), result
    assert result["cache_info"]["value"] is None  # no cache: no folder


@pytest.mark.parametrize("word", ["false", "no", "OFF", "0", ""])
def test_cache_flag_accepts_the_words_for_off(tmp_path, word):
    result = probe_env(tmp_path, KFUSE_NO_CACHE=word, KFUSE_LOG_COMPILES="off", KFUSE_CACHE_MAX_BYTES="64M")
    assert all(got["ok"] for got in result.values()), result
    assert result["cache_info"]["value"] == str(tmp_path / "cache")


def test_require_gpu_flag_takes_the_runtimes_words():
    from conftest import parse_flag

    for word in ("1", "true", "YES", " on "):
        assert parse_flag("KFUSE_REQUIRE_GPU", word) is True
    for word in (None, "", "0", "False", "no", "OFF"):
        assert parse_flag("KFUSE_REQUIRE_GPU", word) is False
    for word in ("2", "maybe", "y"):
        with pytest.raises(ValueError, match=rf"KFUSE_REQUIRE_GPU='{word}' is invalid: expected 1, true, yes, on"):
            parse_flag("KFUSE_REQUIRE_GPU", word)


def test_an_invalid_require_gpu_flag_stops_the_test_run(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_nothing():\n    pass\n")
    (tmp_path / "conftest.py").write_text((REPO / "bindings/python/tests/conftest.py").read_text())
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=dict(os.environ, KFUSE_REQUIRE_GPU="maybe"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 4, out.stdout + out.stderr  # pytest's usage error
    assert "KFUSE_REQUIRE_GPU='maybe' is invalid: expected 1, true, yes, on" in out.stdout + out.stderr
