"""Helpers of the registry tests: env folders to publish, live servers, waiting on conditions."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest
import uvicorn

from corral.registry.server import Tokens, create_app
from corral.registry.store import LocalStore

TOKEN = "test-token-acme-0001"
OTHER_TOKEN = "test-token-other-0002"
CORRAL_TOKEN = "test-token-corral-0003"

ENV_PY = '''"""A tiny text env for the registry tests: repeat a word."""

from pathlib import Path

import corral as cr

from .helpers import normalise


# the id, tags and description are the folder's corral.toml's: written once, there
@cr.environment(tasks=cr.Dataset.from_jsonl(Path(__file__).with_name("tasks.jsonl")), max_turns=2)
class Echo(cr.TextEnv):
    """Repeat the word you are given."""

    def instruction(self, task):
        return f"Repeat the word {{task.word}} exactly, nothing else. Topic: {{task.topic}}."

    @cr.tool
    def spell(self, word: str) -> str:
        """Spell a word letter by letter.

        Args:
            word: the word to spell.
        """
        return " ".join(word)

    @cr.reward
    def correct(self, task, completion):
        return float(normalise(completion) == task.word)

    def solution(self, task):
        return task.word

    def random_action(self, task, rng):
        return rng.choice([task.word, "nope"])
'''

def write_env(folder: Path, env_id: str, tasks: list[dict], version: str | None = "1.0.0",
              extra: str = "") -> Path:
    """An env folder: corral.toml, env.py, helpers.py, tasks.jsonl, a Dockerfile."""
    folder.mkdir(parents=True, exist_ok=True)
    version_line = f'version = "{version}"\n' if version else ""
    (folder / "corral.toml").write_text(
        f'license = "CC-BY-4.0"\n\n[[env]]\nid = "{env_id}"\nentry_point = "env:Echo"\n'
        f'kind = "text"\ntags = ["text", "echo"]\ndescription = "Repeat a word."\n{version_line}')
    (folder / "env.py").write_text(ENV_PY.format(env_id=env_id) + extra)
    (folder / "helpers.py").write_text("def normalise(text):\n    return text.strip().lower()\n")
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (folder / "Dockerfile").write_text("FROM corral/base:bookworm\n")
    return folder


def word_tasks(n: int, salt: str = "") -> list[dict]:
    return [{"word": f"w{salt}{i}", "topic": f"item {i} of the list {salt}"} for i in range(n)]


def store_is_empty(store: LocalStore) -> bool:
    """No release row, no blob, no temp file: nothing was written."""
    rows = store._conn().execute("SELECT COUNT(*) FROM releases").fetchone()[0]
    blobs = [p for p in store.blobs.rglob("*") if p.is_file()]
    temps = list(store.tmp.iterdir())
    return rows == 0 and not blobs and not temps


class LiveServer:
    """The registry app served by uvicorn in a thread on a free loopback port."""

    def __init__(self, store: LocalStore, tokens: Tokens) -> None:
        self.store = store
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(create_app(store, tokens), log_level="warning", access_log=False,
                                limit_concurrency=1000, backlog=2048)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        wait_for(lambda: self.server.started, 30, "the registry server to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll `condition` until true (a short wait between polls), else fail naming `what`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)




def free_port() -> int:
    """A loopback port free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_process(store: Path, port: int) -> subprocess.Popen:
    """`corral serve registry` in its own process (to kill it, or to watch its memory);
    TOKEN may publish in `acme`."""
    code = "from corral.cli import main; main()"
    return subprocess.Popen([sys.executable, "-c", code, "serve", "registry", "--registry",
                             str(store), "--port", str(port), "--token", f"acme:{TOKEN}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def is_up(url: str) -> bool:
    """The registry at `url` answers its health check."""
    try:
        return httpx.get(f"{url}/api/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# --- fixtures (imported by the conftest.py of tests/registry and tests/cli) --------------------
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
