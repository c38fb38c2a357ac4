"""examples/ddp_giou.py under torchrun on the CPU (gloo, kfuse's interpreter, a narrow detector):
the global loss and the parameter gradients of one step on two processes equal those of one
process over the same global batch, and each rank's kfuse loss equals PyTorch's in float64 (the
script fails when it does not), with the kfuse programs and with `--compile kfuse` (the detector
under DDP and the loss in plain PyTorch, through the torch.compile backend). The GPU run of the
same script is `bench/run ddp`."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = REPO / "examples" / "ddp_giou.py"


def torchrun(tmp_path, nproc, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KFUSE_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), str(SCRIPT),
           "--cpu", "--hidden", "32", "--steps", "1", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("layout", ["padded", "lengths", "packed"])
def test_two_processes_match_one(tmp_path, layout):
    saved, figures = tmp_path / "one.pt", tmp_path / "two.json"
    torchrun(tmp_path, 1, "--layout", layout, "--batch", "6", "--save", str(saved))
    out = torchrun(tmp_path, 2, "--layout", layout, "--batch", "3", "--compare", str(saved), "--json", str(figures))
    assert out.count("against the 1-GPU run") == 2
    ranks = json.loads(figures.read_text())
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["failures"] == []
        assert abs(r["loss"] - r["loss_ref"]) <= 1e-5 * abs(r["loss_ref"])
    # Both ranks report the same global loss, the mean over all valid boxes of both halves.
    assert ranks[0]["global_loss"] == pytest.approx(ranks[1]["global_loss"], rel=1e-6)


def test_compiled_with_the_kfuse_backend_two_processes_match_one(tmp_path):
    saved, one, two = tmp_path / "one.pt", tmp_path / "one.json", tmp_path / "two.json"
    torchrun(tmp_path, 1, "--compile", "kfuse", "--batch", "6", "--save", str(saved), "--json", str(one))
    out = torchrun(tmp_path, 2, "--compile", "kfuse", "--batch", "3", "--compare", str(saved), "--json", str(two))
    assert out.count("against the 1-GPU run") == 2
    ranks = json.loads(one.read_text()) + json.loads(two.read_text())
    for r in ranks:
        assert r["failures"] == []
        assert r["compile"] == "kfuse"
        assert abs(r["loss"] - r["loss_ref"]) <= 1e-5 * abs(r["loss_ref"])
        # Dynamo traced the detector and the loss, and the backend built kfuse programs for their
        # regions (the loss's forward and backward at least).
        assert r["dynamo_graphs"] >= 2
        assert r["kfuse_programs"] >= 2
    assert ranks[1]["global_loss"] == pytest.approx(ranks[2]["global_loss"], rel=1e-6)
    assert ranks[0]["global_loss"] == pytest.approx(ranks[1]["global_loss"], rel=1e-5)
