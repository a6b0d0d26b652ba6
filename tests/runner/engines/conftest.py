"""Fixtures for the engine tests. The vLLM engine, its tiny (tied) model and the trainer's
copy of the weights are session fixtures of the whole suite (tests/support/vllm_fixtures.py, a
plugin that tests/conftest.py loads), shared with tests/faults."""

from __future__ import annotations

import pytest

import train_envs  # noqa: F401  (registers traintest/digits-v0, a graded text env; tests/support)


@pytest.fixture(autouse=True)
def _single_threaded(one_torch_thread: None) -> None:
    """The vLLM replicas use the cores; the trainer's tiny forward passes need one."""
