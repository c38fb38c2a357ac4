"""The backend's fused graphs in PyTorch's AOTAutograd cache: a second process on the same cache
folder loads them instead of tracing, partitioning and fusing again, and computes what the first
computed; kfuse's entries have keys of their own, and PyTorch's switches turn the cache off.
CPU tier (the regions run in kfuse's interpreter); the GPU tier runs the same on CUDA."""

import json
import os
import subprocess
import sys

import pytest
import torch

from kfuse import _compiled

SEED = int(os.environ.get("KFUSE_TEST_SEED", "20240611"))

# A new process: a loss over a padded batch of boxes compiled with the kfuse backend, forward and
# backward, on argv[1] ("cpu" or "cuda"); prints the AOTAutograd cache counters, the loss and the
# gradient (as float64 lists), the eager float64 results, and the programs the backend built.
CHILD = r"""
import json, sys
import torch
from torch._dynamo.utils import counters
from kfuse import _backend

def loss(pred, target):
    x1, y1, x2, y2 = pred.unbind(-1)
    a1, b1, a2, b2 = target.unbind(-1)
    inter = (torch.min(x2, a2) - torch.max(x1, a1)).clamp(min=0) * (torch.min(y2, b2) - torch.max(y1, b1)).clamp(min=0)
    union = (x2 - x1) * (y2 - y1) + (a2 - a1) * (b2 - b1) - inter
    valid = target[..., 3] != 0
    per = 1 - inter / (union + 1e-7)
    return torch.where(valid, per, torch.zeros((), dtype=per.dtype, device=per.device)).sum() / valid.sum().clamp(min=1)

device, seed = sys.argv[1], int(sys.argv[2])
gen = torch.Generator().manual_seed(seed)
xy = 4 * torch.rand(5, 7, 2, generator=gen, dtype=torch.float64)
target = torch.cat([xy, xy + 0.2 + 3 * torch.rand(5, 7, 2, generator=gen, dtype=torch.float64)], -1)
target[:, 5:, 3] = 0  # padding
pred = target + 0.3 * torch.randn(5, 7, 4, generator=gen, dtype=torch.float64)
ref = pred.clone().requires_grad_()
want = loss(ref, target)
want.backward()
p = pred.float().to(device).requires_grad_()
out = torch.compile(loss, backend="kfuse")(p, target.float().to(device))
out.backward()
print("RESULT " + json.dumps({
    "counters": dict(counters["aot_autograd"]),
    "loss": float(out), "grad": p.grad.double().cpu().flatten().tolist(),
    "want_loss": float(want), "want_grad": ref.grad.flatten().tolist(),
    "programs": _backend.stats["compiles"],
}))
"""


def run_child(tmp_path, device, env=None):
    full = dict(os.environ)
    full.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), KFUSE_CACHE_DIR=str(tmp_path / "kfuse"))
    full.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    full.update(env or {})
    out = subprocess.run(
        [sys.executable, "-c", CHILD, device, str(SEED)], capture_output=True, text=True, timeout=300, env=full
    )
    assert out.returncode == 0, f"the child process failed (seed {SEED}):\n{out.stderr[-4000:]}"
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def check_results(got, where):
    assert abs(got["loss"] - got["want_loss"]) <= 1e-5 * abs(got["want_loss"]), f"{where}: loss (seed {SEED})"
    err = max(abs(a - b) for a, b in zip(got["grad"], got["want_grad"]))
    scale = max(abs(b) for b in got["want_grad"])
    assert err <= 1e-5 * scale, f"{where}: gradient off by {err:.3g} of {scale:.3g} (seed {SEED})"


def check_warm_process(tmp_path, device):
    cold = run_child(tmp_path, device)
    assert cold["counters"].get("autograd_cache_miss") == 1, cold["counters"]
    assert cold["counters"].get("autograd_cache_saved") == 1, cold["counters"]
    entries = os.listdir(tmp_path / "inductor" / "aotautograd")
    assert len(entries) == 1, entries
    check_results(cold, "cold process")
    warm = run_child(tmp_path, device)
    assert warm["counters"].get("autograd_cache_hit") == 1, warm["counters"]
    assert "autograd_cache_miss" not in warm["counters"], warm["counters"]
    # The entry's regions were compiled again from their text (the cold process also compiled the
    # regions its partition tried on the way).
    assert 0 < warm["programs"] <= cold["programs"], (cold["programs"], warm["programs"])
    check_results(warm, "warm process")
    # The same kernels (or the same interpreter) on the same inputs: the same bits.
    assert warm["loss"] == cold["loss"] and warm["grad"] == cold["grad"]


def test_a_warm_process_loads_the_fused_graphs(tmp_path):
    check_warm_process(tmp_path, "cpu")


def test_a_warm_process_loads_the_fused_graphs_on_cuda(tmp_path, gpu):
    check_warm_process(tmp_path, "cuda")


def test_pytorch_switches_turn_the_cache_off(tmp_path):
    for env in ({"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}, {"TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}):
        got = run_child(tmp_path, "cpu", env)
        assert not any(k.startswith("autograd_cache") for k in got["counters"]), (env, got["counters"])
        assert not (tmp_path / "inductor" / "aotautograd").exists(), env
        check_results(got, f"with {env}")


def test_the_key_is_kfuse_s_own(monkeypatch):
    """kfuse's key differs from PyTorch's for the same graph (an Inductor entry is never read as a
    kfuse one), and changes with kfuse's own key (its sources, version and native module)."""
    from torch._functorch._aot_autograd import autograd_cache

    kfuse_key, pytorch_key = _compiled._key, autograd_cache.autograd_cache_key
    keys = []

    def spy(gm, example_inputs, aot_config, fx_config):
        got = kfuse_key(gm, example_inputs, aot_config, fx_config)
        keys.append((got[0], pytorch_key(gm, example_inputs, aot_config, fx_config)[0]))
        return got

    monkeypatch.setattr(_compiled, "_key", spy)
    x = torch.randn(6, 5, requires_grad=True)
    torch._dynamo.reset()
    torch.compile(lambda a: (a * a).sum(), backend="kfuse")(x).backward()
    assert len(keys) == 1
    first, pytorch_first = keys[0]
    assert first != pytorch_first
    monkeypatch.setattr(_compiled, "_KFUSE_KEY", "kfuse-another-version")
    torch._dynamo.reset()
    torch.compile(lambda a: (a * a).sum(), backend="kfuse")(x.detach().requires_grad_()).backward()
    assert len(keys) == 2 and keys[1][0] != first and keys[1][1] == pytorch_first
    torch._dynamo.reset()


def test_kfuse_key_hashes_the_package():
    key = _compiled.kfuse_key()
    assert key.startswith("kfuse-") and len(key) == len("kfuse-") + 64
    assert _compiled.kfuse_key() == key


def test_a_damaged_entry_is_compiled_again(tmp_path):
    """An entry that does not load (here: its file overwritten) costs a compile, never a result."""
    cold = run_child(tmp_path, "cpu")
    folder = tmp_path / "inductor" / "aotautograd"
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files, "no entry was written"
    for p in files:
        p.write_bytes(b"not an entry")
    again = run_child(tmp_path, "cpu")
    assert "autograd_cache_hit" not in again["counters"], again["counters"]
    check_results(again, "after the entry was damaged")
    assert again["loss"] == cold["loss"] and again["grad"] == cold["grad"]
