"""Fixtures for the registry tests: env folders to publish, isolated stores, live servers."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Callable, Iterator

import pytest

from corral.registry.server import Tokens
from corral.registry.store import LocalStore
from registry_helpers import CORRAL_TOKEN, OTHER_TOKEN, TOKEN, LiveServer, word_tasks, write_env

_ids = itertools.count()


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh default store: CORRAL_HOME points at a temp folder for this test."""
    path = tmp_path / "corral-home"
    monkeypatch.setenv("CORRAL_HOME", str(path))
    return path


@pytest.fixture
def make_env(tmp_path: Path) -> Callable[..., tuple[Path, str]]:
    """Write a fresh env folder with a unique id; returns (folder, env_id)."""

    def make(n: int = 20, *, version: str | None = "1.0.0", namespace: str = "acme",
             tasks: list[dict] | None = None, extra: str = "") -> tuple[Path, str]:
        number = next(_ids)
        env_id = f"{namespace}/echo{number}-v1"
        folder = write_env(tmp_path / f"env{number}", env_id, tasks or word_tasks(n, str(number)),
                           version, extra)
        return folder, env_id

    return make


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    """A live registry over a fresh store; TOKEN may publish in `acme`, OTHER_TOKEN in `other`,
    CORRAL_TOKEN in `corral` (the built-in envs)."""
    tokens = Tokens.parse([f"acme:{TOKEN}", f"other:{OTHER_TOKEN}", f"corral:{CORRAL_TOKEN}"])
    with LiveServer(LocalStore(tmp_path / "server-store"), tokens) as live:
        yield live
