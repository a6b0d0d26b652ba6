"""Fixtures of the env-server tests: real servers on 127.0.0.1 (see servers.py)."""

from __future__ import annotations

from typing import Iterator

import pytest

from .servers import GAME, TEXT, Served, served


@pytest.fixture(scope="module")
def text_server() -> Iterator[Served]:
    """Text envs, 4 sessions, a token."""
    with served([TEXT, GAME], max_sessions=4, token="sekret") as server:
        yield server
