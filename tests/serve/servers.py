"""Real env servers on 127.0.0.1 for the env-server tests (helpers; fixtures: conftest.py).

`served(...)` runs `build_server` under uvicorn in a thread of this process (fast, and the
test can look at its `SessionManager`); `ServerProcess` runs `corral serve-env` as a real
subprocess, for the tests that kill a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterator

import httpx
import uvicorn

from corral.serve.app import EnvServer
from corral.serve.serve import build_server

TEXT = "corral/arithmetic-v0"
GAME = "corral/guess-number-v0"
TERM = "corral/term-files-v0"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        assert time.monotonic() < deadline, f"{url} did not come up within {limit} s"
        time.sleep(0.05)


class Served:
    """An `EnvServer` under uvicorn in a background thread (its own event loop)."""

    def __init__(self, server: EnvServer) -> None:
        self.server = server
        self.manager = server.manager
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(server.app, log_level="warning", lifespan="on")
        self.uvicorn = uvicorn.Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        wait_healthy(self.url)

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self.uvicorn.serve(sockets=[self.sock]))

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run `coro` on the server's loop (to inspect or drive its sessions)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive(), "the server did not shut down"


@contextlib.contextmanager
def served(env_ids: list[str], **options: Any) -> Iterator[Served]:
    options.setdefault("run_id", "test-envserver")
    server = Served(build_server(env_ids, **options))
    try:
        yield server
    finally:
        server.stop()


class ServerProcess:
    """`corral serve-env` in a subprocess (its own process group, so it can be killed)."""

    def __init__(self, env_ids: list[str], *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "corral.cli", "serve", "env", *env_ids, "--port",
             str(self.port), *extra], start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_healthy(self.url)
        except AssertionError:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


async def wait_until(predicate: Callable[[], bool], limit: float = 20.0) -> None:
    """Poll `predicate` until true (sessions close a moment after their socket does)."""
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)
