"""Fixtures for the runner tests (helpers live in runner_helpers.py)."""

from __future__ import annotations

import pytest

from corral.runner.policy import ScriptedPolicy

from runner_helpers import DirOpener, FileEnv, file_solver


@pytest.fixture
def opener() -> DirOpener:
    return DirOpener()


@pytest.fixture
def file_policy() -> ScriptedPolicy:
    return ScriptedPolicy(file_solver)


@pytest.fixture(autouse=True)
def _reset_file_env() -> None:
    FileEnv.fail_setup = {}
    FileEnv.setup_calls = 0


@pytest.fixture(scope="session")
def tiny_path():
    """The tiny model (built once into the cache directory, shared with every test run)."""
    from corral.runner.policy.models import resolve_model_path

    return resolve_model_path("tiny")


@pytest.fixture(scope="session")
def policy(tiny_path):
    """A LocalPolicy on the session event loop (tests must not change its weights)."""
    from corral.runner.policy import LocalPolicy

    return LocalPolicy(tiny_path, max_batch=8, threads=1)
