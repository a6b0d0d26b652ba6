"""Fixtures for the engine tests: a real vLLM (the CPU build in .venv-vllm) serving a tiny
model, started once for the package and shared; the trainer's copy of the same weights.

vLLM is not optional here: without .venv-vllm (made by `bash scripts/dev.sh setup`) or
`CORRAL_VLLM_PYTHON` these tests fail with the command that fixes it, never skip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import torch

import train_envs  # noqa: F401  (registers traintest/digits-v0, a graded text env; tests/support)
from corral.errors import EngineError
from corral.runner.engines.vllm import VLLMEngine, vllm_python
from corral.runner.policy import build_tiny_model, load_model


@pytest.fixture(autouse=True)
def _single_threaded(one_torch_thread: None) -> None:
    """The vLLM replicas use the cores; the trainer's tiny forward passes need one."""


@pytest.fixture(scope="session")
def vllm_interpreter() -> Path:
    try:
        return vllm_python()
    except EngineError as exc:
        pytest.fail(f"vLLM is required by these tests and is not set up: {exc}")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("engine-model") / "tiny", heads=2,
                            tie_embeddings=False)


@pytest.fixture(scope="session")
def engine(vllm_interpreter: Path, tiny_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMEngine]:
    """Two vLLM replicas of the tiny model (the kill test, last, takes one down)."""
    with VLLMEngine(tiny_dir, replicas=2, python=str(vllm_interpreter),
                    log_dir=tmp_path_factory.mktemp("vllm-logs")) as started:
        yield started


@pytest.fixture(scope="session")
def trainer_model(tiny_dir: Path):
    model, tokenizer = load_model(tiny_dir, device="cpu", dtype=torch.float32)
    return model, tokenizer
