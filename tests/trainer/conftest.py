"""Trainer test fixtures (helpers live in trainer_helpers.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM
from trainer_helpers import tiny_model

from corral.trainer import StepConfig


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a loaded 2-core machine OpenMP
    spin-waiting makes them up to 40x slower; restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def model() -> LlamaForCausalLM:
    return tiny_model()


@pytest.fixture
def fp32_config() -> StepConfig:
    return StepConfig(lr=1e-3, micro_batch_size=2, dtype="float32")
