"""The package's kernel cache never changes a file it did not write: with KFUSE_CACHE_DIR pointing
at a folder of user files (a mistyped path), programs load, compile and run, and every file in the
folder is byte-identical afterwards. CPU tier always; the CUDA half (where kernels are compiled
through the cache) on the GPU tier. Each case runs in a fresh interpreter, since the cache reads
its environment once per process."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

SIGNATURE = "Signature: 8a477f597d28d172789f06886806bc55"

PROGRAM = """
import json, sys, torch, kfuse
src = '''
input pred:    f32[B, N, 4]
input target:  f32[B, N, 4]
input lengths: i32[B] as lengths(N)
let valid = mask(lengths)
let d = pred - target
output total = sum(where(valid, sum(d * d, axis: -1), 0))
'''
device = sys.argv[1]
gen = torch.Generator().manual_seed(0)
pred = torch.rand(3, 5, 4, generator=gen)
target = torch.rand(3, 5, 4, generator=gen)
lengths = torch.tensor([5, 0, 2], dtype=torch.int32)
valid = torch.arange(5)[None, :] < lengths[:, None].long()
want = torch.where(valid, ((pred - target) ** 2).sum(-1), torch.zeros(())).sum()
try:
    prog = kfuse.compile(src, name="safety")
    assert "__global__" in prog.cuda_source()
    got = prog(pred=pred.to(device), target=target.to(device), lengths=lengths.to(device)).total
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    info = kfuse.cache_info()
    print(json.dumps({"ok": True, "compiles": info["compiles"], "cache_dir": info["cache_dir"]}))
except kfuse.Error as e:
    print(json.dumps({"ok": False, "kind": type(e).__name__, "message": str(e)}))
"""


def user_folder(root, other_tag):
    """A repository's files, a folder named like kfuse's arch folders, a file named like a cache
    entry, and optionally another tool's CACHEDIR.TAG."""
    files = {
        "pyproject.toml": b"[project]\nname = 'mine'\n",
        "README.md": b"# Mine\n",
        ".gitignore": b"__pycache__/\n",
        "pkg/deep/module.py": b"x = 1\n",
        "0123456789abcdef" * 4 + ".kfc": b"named like an entry\n",
        "sm_90/results.csv": b"a,b\n1,2\n",
        "sm_90/locks/mine.lock": b"",
    }
    if other_tag:
        files["CACHEDIR.TAG"] = f"{SIGNATURE}\n# created by another tool\n".encode()
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def snapshot(root):
    """Every file under `root` with its bytes."""
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run(device, cache_dir, **env):
    full = {k: v for k, v in os.environ.items() if k not in ("KFUSE_NO_CACHE", "KFUSE_CACHE_MAX_BYTES")}
    full.update(KFUSE_CACHE_DIR=str(cache_dir), **env)
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, device], capture_output=True, text=True, env=full, timeout=600
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.parametrize("other_tag", [False, True])
@pytest.mark.parametrize("max_bytes", [None, "1"])
def test_cpu_programs_leave_a_folder_of_user_files_alone(tmp_path, other_tag, max_bytes):
    user_folder(tmp_path, other_tag)
    before = snapshot(tmp_path)
    env = {} if max_bytes is None else {"KFUSE_CACHE_MAX_BYTES": max_bytes}
    result, stderr = run("cpu", tmp_path, **env)
    assert result["ok"], result
    assert pathlib.Path(result["cache_dir"]) == tmp_path
    assert snapshot(tmp_path) == before, stderr


@pytest.mark.parametrize("other_tag", [False, True])
def test_cuda_programs_compile_without_touching_a_folder_of_user_files(gpu, tmp_path, other_tag):
    user_folder(tmp_path, other_tag)
    before = snapshot(tmp_path)
    result, stderr = run("cuda", tmp_path, KFUSE_CACHE_MAX_BYTES="1")
    assert result["ok"] and result["compiles"] >= 1, result
    # Said once on stderr: the folder is not kfuse's, so kernels are not cached on disk.
    assert "is not a kfuse cache folder" in stderr and str(tmp_path) in stderr, stderr
    assert snapshot(tmp_path) == before


def test_cuda_programs_tag_a_new_cache_folder(gpu, tmp_path):
    cache = tmp_path / "cache"
    result, stderr = run("cuda", cache)
    assert result["ok"], (result, stderr)
    tag = (cache / "CACHEDIR.TAG").read_text()
    assert tag.splitlines()[0] == SIGNATURE and "created by kfuse" in tag
    assert any(p.suffix == ".kfc" for p in cache.rglob("*"))


def test_cuda_with_an_invalid_cache_flag_is_a_clear_error(gpu, tmp_path):
    result, _ = run("cuda", tmp_path / "cache", KFUSE_NO_CACHE="maybe")
    assert not result["ok"], result
    for word in ("KFUSE_NO_CACHE", '"maybe"', "is invalid", "1, true, yes, on"):
        assert word in result["message"], result
    assert not (tmp_path / "cache").exists()
