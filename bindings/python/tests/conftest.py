"""Shared fixtures: the repository's examples, random ragged batches, and the GPU tier gate."""

import os
import pathlib

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"


def example(name):
    return str(EXAMPLES / name)


@pytest.fixture
def gpu():
    """The CUDA device of the GPU tier. Skips visibly without one, or fails with
    KFUSE_REQUIRE_GPU=1 (the GPU machine sets it, so that a broken device is not a skip)."""
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    why = "no CUDA device (torch.cuda.is_available() is False)"
    if os.environ.get("KFUSE_REQUIRE_GPU") == "1":
        pytest.fail(f"KFUSE_REQUIRE_GPU=1 but {why}")
    pytest.skip(f"GPU tier: {why}")


def boxes(gen, *lead):
    """Valid boxes (x1, y1, x2, y2) with x1 < x2, y1 < y2, as float64."""
    xy = torch.rand(*lead, 2, generator=gen, dtype=torch.float64) * 4
    wh = torch.rand(*lead, 2, generator=gen, dtype=torch.float64) * 3 + 0.2
    return torch.cat([xy, xy + wh], -1)
