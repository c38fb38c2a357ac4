"""A complete install: right after ``pip install ./bindings/python`` on top of torch, the READMEs'
Python examples run as written, and everything the package does (load, compile, call, backward,
FusedMLP.from_torch, export_mlp) works with neither NumPy nor safetensors importable.

Each case runs in a fresh interpreter whose import system refuses ``numpy`` and ``safetensors``
(as if they were not installed), from the repository root as the README's commands are."""

import re
import subprocess
import sys

import pytest

from conftest import REPO

# Prepended to each script: `import numpy` / `import safetensors` fail as for a missing package.
BLOCK = """
import sys

class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("numpy", "safetensors"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, _Missing())
"""


def run_blocked(code):
    """Runs `code` after BLOCK in a new interpreter in the repository root; returns its stdout."""
    out = subprocess.run(
        [sys.executable, "-c", BLOCK + code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, f"exit {out.returncode}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}"
    return out.stdout


def python_blocks(readme):
    text = (REPO / readme).read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


# What the README example leaves behind: a loss with its gradient, and the fused MLP's output.
README_CHECKS = """
import torch as _torch
assert _torch.isfinite(out["loss"]) and out["loss"].dim() == 0, out
assert pred.grad is not None and pred.grad.shape == pred.shape and _torch.isfinite(pred.grad).all()
assert bool(pred.grad.abs().sum() > 0) == bool(lengths.any())  # boxes past lengths get no gradient
assert tuple(y.shape) == (32, 4) and _torch.isfinite(y).all()
print("README example ok")
"""


@pytest.mark.parametrize("readme", ["README.md", "bindings/python/README.md"])
def test_readme_python_example_runs_as_written(readme):
    blocks = python_blocks(readme)
    assert len(blocks) == 1, f"{readme}: expected one python code block, found {len(blocks)}"
    assert "dtype=torch.int32" in blocks[0], "the example's lengths are int32, as giou_lengths.kf declares"
    assert run_blocked(blocks[0] + README_CHECKS).strip().endswith("README example ok")


def test_blocker_works():
    code = """
for name in ("numpy", "safetensors", "safetensors.torch"):
    try:
        __import__(name)
    except ModuleNotFoundError as e:
        assert name.partition(".")[0] in str(e) and "blocked" in str(e), e
    else:
        raise SystemExit(f"{name} imported")
print("blocked")
"""
    assert run_blocked(code).strip() == "blocked"


def test_whole_api_without_numpy_or_safetensors(tmp_path):
    code = f"""
import torch, kfuse

torch.manual_seed(0)
giou = kfuse.load("examples/giou_lengths.kf")
xy = torch.rand(3, 5, 2) * 4
target = torch.cat([xy, xy + 1], -1)
pred = (target + 0.1 * torch.randn(3, 5, 4)).requires_grad_()
lengths = torch.tensor([5, 0, 2], dtype=torch.int32)
out = giou(pred=pred, target=target, lengths=lengths)
out.loss.backward()
assert pred.grad[1].abs().sum() == 0 and pred.grad[0].abs().sum() > 0

square = kfuse.compile("input x: f32[N]\\noutput y = x * x\\n", name="square")
x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
y = square(x=x).y
y.sum().backward()
assert y.tolist() == [1.0, 4.0, 9.0] and x.grad.tolist() == [2.0, -4.0, 6.0]

module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
fused = kfuse.nn.FusedMLP.from_torch(module, dtype=torch.bfloat16)
rows = torch.randn(6, 4)
with torch.no_grad():
    ref = module.double()
    for p in ref.parameters():
        p.copy_(p.to(torch.bfloat16).double())
    want = ref(rows.double())
torch.testing.assert_close(fused(rows).double(), want, rtol=1e-4, atol=1e-4)

desc = kfuse.export_mlp(module, {str(tmp_path / "m.json")!r}, "f16")
assert desc["weights"] == "m.safetensors"
loaded = kfuse.nn.FusedMLP.load({str(tmp_path / "m.json")!r})
assert (loaded.in_features, loaded.out_features) == (4, 3)

import sys
assert "numpy" not in sys.modules and "safetensors" not in sys.modules
print("api ok")
"""
    assert run_blocked(code).strip() == "api ok"


def test_export_and_from_torch_agree(tmp_path):
    """The in-memory model (from_torch) and the exported files (export_mlp, then load) are the
    same model: identical outputs, bit for bit, on the CPU path."""
    code = f"""
import torch, kfuse

torch.manual_seed(1)
module = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.SiLU(), torch.nn.Linear(7, 2, bias=False))
path = {str(tmp_path / "model.json")!r}
kfuse.export_mlp(module, path, "bf16")
a = kfuse.nn.FusedMLP.from_torch(module, dtype=torch.bfloat16)
b = kfuse.nn.FusedMLP.load(path)
x = torch.randn(9, 5)
assert torch.equal(a(x), b(x))
print("same")
"""
    assert run_blocked(code).strip() == "same"
