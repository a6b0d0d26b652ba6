"""Training-loop fixtures: the graded test env is registered on import."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import train_envs  # noqa: E402,F401  (registers traintest/digits-v0)

ENVS_FILE = str(Path(__file__).parent / "train_envs.py")


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models are many times slower with two OpenMP threads on this loaded machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
