"""Fixtures for the terminal-env tests: helper fixtures of tests/sandbox reused, not copied.

`dockerd` (a running daemon), `base_image` (corral/base:bookworm, built once when missing) and
`run_id` (this session's sandbox label; asserts at the end that no container carrying it is
left) come from tests/sandbox/conftest.py, loaded here under its own module name.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_path = Path(__file__).parent.parent / "sandbox" / "conftest.py"
_spec = importlib.util.spec_from_file_location("corral_tests_sandbox_fixtures", _path)
assert _spec and _spec.loader
_sandbox_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_sandbox_fixtures)

dockerd = _sandbox_fixtures.dockerd
base_image = _sandbox_fixtures.base_image
run_id = _sandbox_fixtures.run_id
BACKENDS = _sandbox_fixtures.BACKENDS


@pytest.fixture(scope="session")
def sandboxes(base_image: str, run_id: str) -> str:
    """Both backends ready (daemon up, base image present); returns the session's run label."""
    return run_id
