"""The shared vLLM fixtures (a pytest plugin of the whole suite, loaded by `tests/conftest.py`):
a real vLLM (the CPU build in .venv-vllm) serving a tiny model with tied embeddings, as most small
open models have, started once per session for every area that needs it (tests/runner/engines,
tests/faults); the trainer's copy of the same weights.

vLLM is not optional here: without .venv-vllm (made by `bash scripts/dev.sh setup`) or
`CORRAL_VLLM_PYTHON` these tests fail with the command that fixes it, never skip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from corral.errors import EngineError
from corral.runner.engines.vllm import VLLMEngine, vllm_python
from corral.runner.policy import build_tiny_model, load_model


@pytest.fixture(scope="session")
def vllm_interpreter() -> Path:
    try:
        return vllm_python()
    except EngineError as exc:
        pytest.fail(f"vLLM is required by these tests and is not set up: {exc}")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with head size 32 (vLLM's CPU kernels) and a tied output layer."""
    return build_tiny_model(tmp_path_factory.mktemp("engine-model") / "tiny", heads=2,
                            tie_embeddings=True)


@pytest.fixture(scope="session")
def engine(vllm_interpreter: Path, tiny_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMEngine]:
    """Two vLLM replicas of the tiny model (tests/runner/engines/test_vllm.py's kill test, last in
    that file, takes one down: later users take the replicas still alive)."""
    with VLLMEngine(tiny_dir, replicas=2, python=str(vllm_interpreter),
                    log_dir=tmp_path_factory.mktemp("vllm-logs")) as started:
        yield started


@pytest.fixture(scope="session")
def trainer_model(tiny_dir: Path) -> tuple[Any, Any]:
    model, tokenizer = load_model(tiny_dir, device="cpu", dtype=torch.float32)
    return model, tokenizer
