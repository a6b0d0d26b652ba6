"""Fixtures for the terminal-env tests. `dockerd`, `base_image` and `run_id` (the session's
sandbox label, checked for leftovers at the end) come from tests/conftest.py.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def sandboxes(base_image: str, run_id: str) -> str:
    """Both backends ready (daemon up, base image present); returns the session's run label."""
    return run_id
