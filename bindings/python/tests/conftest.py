"""Shared fixtures: the repository's examples, random ragged batches, and the GPU tier gate."""

import os
import pathlib
import shutil
import tempfile

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"

# The words kfuse's own flags accept (KFUSE_NO_CACHE, KFUSE_REQUIRE_GPU, ...), read as the runtime
# reads them: any case, surrounding blanks ignored, unset or empty is off.
FLAG_WORDS = dict.fromkeys(("1", "true", "yes", "on"), True) | dict.fromkeys(("", "0", "false", "no", "off"), False)
FLAG_VALUES = "1, true, yes, on (or 0, false, no, off; empty is off)"


def parse_flag(name, value):
    """Whether flag `name` with text `value` (None: unset) is on; any other word is a ValueError
    naming the variable and the accepted values."""
    try:
        return FLAG_WORDS[(value or "").strip().lower()]
    except KeyError:
        raise ValueError(f"environment variable {name}={value!r} is invalid: expected {FLAG_VALUES}") from None


def env_flag(name):
    """Whether flag `name` of this process's environment is on (see `parse_flag`); an invalid value
    stops the test run with a usage error."""
    try:
        return parse_flag(name, os.environ.get(name))
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None


_INDUCTOR_CACHE = None


def pytest_configure(config):
    # Checked once before any test runs, so that a mistyped value is not a silent skip.
    env_flag("KFUSE_REQUIRE_GPU")
    # The backend keeps its fused graphs in PyTorch's AOTAutograd cache, beside Inductor's: a
    # folder of this run's own (unless one is given), so that no test reads what another run wrote.
    global _INDUCTOR_CACHE
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        _INDUCTOR_CACHE = tempfile.mkdtemp(prefix="kfuse-tests-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE


def pytest_unconfigure(config):
    if _INDUCTOR_CACHE is not None:
        shutil.rmtree(_INDUCTOR_CACHE, ignore_errors=True)


def example(name):
    return str(EXAMPLES / name)


@pytest.fixture
def gpu():
    """The CUDA device of the GPU tier. Skips visibly without one, or fails with
    KFUSE_REQUIRE_GPU=1 (or true/yes/on; the GPU machine sets it, so that a broken device is not a
    skip)."""
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    why = "no CUDA device (torch.cuda.is_available() is False)"
    if env_flag("KFUSE_REQUIRE_GPU"):
        pytest.fail(f"KFUSE_REQUIRE_GPU={os.environ['KFUSE_REQUIRE_GPU']} but {why}")
    pytest.skip(f"GPU tier: {why}")


def boxes(gen, *lead):
    """Valid boxes (x1, y1, x2, y2) with x1 < x2, y1 < y2, as float64."""
    xy = torch.rand(*lead, 2, generator=gen, dtype=torch.float64) * 4
    wh = torch.rand(*lead, 2, generator=gen, dtype=torch.float64) * 3 + 0.2
    return torch.cat([xy, xy + wh], -1)
