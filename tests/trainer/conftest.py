"""Trainer test fixtures (helpers live in trainer_helpers.py)."""

from __future__ import annotations

import pytest
from transformers import LlamaForCausalLM
from trainer_helpers import tiny_model
import train_envs  # noqa: F401  (registers traintest/digits-v0, the graded text env; tests/support)

from corral.trainer import StepConfig


@pytest.fixture(autouse=True)
def _single_threaded(one_torch_thread: None) -> None:
    """Every trainer test runs on one torch thread (`one_torch_thread` says why)."""


@pytest.fixture
def model() -> LlamaForCausalLM:
    return tiny_model()


@pytest.fixture
def fp32_config() -> StepConfig:
    return StepConfig(lr=1e-3, micro_batch_size=2, dtype="float32")
