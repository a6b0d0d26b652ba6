"""Fixtures for the engine tests. The vLLM engine, its tiny (tied) model and the trainer's
copy of the weights are session fixtures of the whole suite (`fixtures.py`, a plugin that
tests/conftest.py loads), shared with tests/faults."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # fake_sglang, the FAKE SGLang server
sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
import train_envs  # noqa: E402,F401  (registers traintest/digits-v0, a graded text env)


@pytest.fixture(autouse=True)
def _single_threaded(one_torch_thread: None) -> None:
    """The vLLM replicas use the cores; the trainer's tiny forward passes need one."""
