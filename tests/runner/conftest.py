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
