"""The backend table: a new backend is one module plus one row, and names are checked.

The toy backend below is the whole of what adding one takes: a `Sandbox`, a `Backend`, a
`BackendConfig` and `register_backend(BackendRow(...))`. It then opens sandboxes through
`open_sandbox`, a terminal env made from the catalog and the runner's `SandboxPool`, with no
other module touched.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator, Mapping

import pytest

import corral as cr
from corral.agents import play
from corral.errors import UnknownBackend
from corral.runner import Runner, ScriptedPolicy
from corral.runner.pool import SandboxPool
from corral.sandbox import (Backend, BackendConfig, BackendRow, ExecResult, Sandbox, Shell,
                            backend_names, check_backend, open_sandbox, register_backend,
                            resolve_backend, unregister_backend)
from corral.sandbox.spec import SandboxSpec, Terminal
from corral.terminal import bash


# --- the toy backend: one module's worth of code -------------------------------------------------
class ToyConfig(BackendConfig):
    """Where the toy keeps its sandboxes' directories (default: the system's temp dir)."""

    root: str | None = None


class ToyShell(Shell):
    """No state between commands: each runs on its own (a toy)."""

    def __init__(self, sandbox: "ToySandbox") -> None:
        self.sandbox = sandbox

    async def start(self) -> None:
        pass

    async def run(self, command: str, timeout: float | None = None) -> ExecResult:
        return await self.sandbox.exec(command, timeout=timeout)

    async def close(self) -> None:
        pass


class ToySandbox(Sandbox):
    """A directory on this host standing in for `/`: commands run in it with the host's bash
    (no isolation at all: a toy, not a sandbox to run agents in)."""

    backend = "toy"

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.closed = False

    def _path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    async def exec(self, cmd: str | list[str], timeout: float | None = None,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   user: str | None = None) -> ExecResult:
        started = time.monotonic()
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=self._path(cwd or "/"), env={"PATH": "/usr/bin:/bin", **(env or {})},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            return ExecResult(-9, "", "", time.monotonic() - started, timed_out=True)
        self.stats.commands += 1
        return ExecResult(proc.returncode or 0, out.decode(), err.decode(),
                          time.monotonic() - started)

    async def shell(self) -> Shell:
        return ToyShell(self)

    async def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
        target.chmod(mode)

    async def read_file(self, path: str) -> bytes:
        return self._path(path).read_bytes()

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            shutil.rmtree(self.root, ignore_errors=True)

    @property
    def alive(self) -> bool:
        return not self.closed


class ToyBackend(Backend):
    """Opens `ToySandbox`es for terminal specs; keeps nothing warm."""

    name = "toy"

    async def open(self, spec: SandboxSpec, *, env_id: str = "", image: str | None = None,
                   build: bool = True) -> Sandbox:
        root = getattr(self.config, "root", None)
        sandbox = ToySandbox(Path(tempfile.mkdtemp(prefix=f"toy-{self.run_id}-", dir=root)))
        for path, content in getattr(spec, "files", {}).items():
            await sandbox.write_file(path, content)
        return sandbox


TOY = BackendRow("toy", ToyBackend, ToyConfig, ("terminal",), "a directory on this host")


@pytest.fixture
def toy() -> Iterator[str]:
    """The toy row, registered for one test."""
    register_backend(TOY)
    try:
        yield TOY.name
    finally:
        unregister_backend(TOY.name)


# --- a terminal env to run on it -----------------------------------------------------------------
@cr.environment("tests/toy-echo-v0", tasks=[{"word": "alpha"}, {"word": "beta"}], max_turns=3,
                register=False)
class ToyEcho(cr.TerminalEnv):
    """Write the task's word into answer.txt."""

    def instruction(self, task):
        return f"Write {task.word} into answer.txt"

    @cr.reward
    async def answered(self, sandbox, task) -> float:
        return float((await sandbox.read_file("/answer.txt")).decode().strip() == task.word)

    def solution(self, task):
        return [bash(f"echo {task.word} > answer.txt")]


# --- tests ---------------------------------------------------------------------------------------
async def test_a_registered_backend_opens_through_open_sandbox(toy: str) -> None:
    assert toy in backend_names("terminal") and toy not in backend_names("browser")
    async with await open_sandbox(Terminal(files={"/hello.txt": "hi"}), toy) as sb:
        assert isinstance(sb, ToySandbox)
        result = await sb.exec("cat hello.txt && echo out > made.txt")
        assert result.ok and result.stdout == "hi"
        assert await sb.read_file("/made.txt") == b"out\n"
    assert sb.closed and not sb.root.exists()
    # a spec may name it too, and a config selects the backend with its options
    async with await open_sandbox(Terminal(backend=toy)) as by_spec:
        assert isinstance(by_spec, ToySandbox)
    where = Path(tempfile.mkdtemp())
    try:
        async with await open_sandbox(Terminal(), ToyConfig(root=str(where))) as configured:
            assert configured.root.parent == where
    finally:
        shutil.rmtree(where)


async def test_a_terminal_env_runs_its_episodes_on_the_new_backend(toy: str) -> None:
    oracle = await play(ToyEcho(backend=toy), "oracle", seed=0, options={"task_index": 1})
    noop = await play(ToyEcho(backend=toy), "noop", seed=0, options={"task_index": 1})
    assert oracle.reward == 1.0 and noop.reward == 0.0, (oracle.errors, noop.errors)


async def test_the_runner_pool_pools_the_new_backend(toy: str) -> None:
    async with SandboxPool(2, backend=toy, run_id="toy-run") as pool:
        spec = Terminal(memory="256m")
        await pool.prewarm(spec, 2, wait=True)
        first = await pool.acquire(spec, ToyEcho())
        assert isinstance(first, ToySandbox) and "toy-run" in first.root.name
        assert pool.stats.warm_hits == 1 and pool.stats.starts == 2
        await pool.release(first, ToyEcho())
    assert first.closed and pool.stats.closes == pool.stats.starts  # all of them, refills too


async def test_unknown_backend_names_get_a_did_you_mean() -> None:
    with pytest.raises(UnknownBackend, match="Did you mean 'docker'"):
        await open_sandbox(Terminal(), "dokcer")
    with pytest.raises(ValueError, match="Did you mean 'bwrap'"):
        Terminal(backend="bwrapp")
    with pytest.raises(UnknownBackend, match="Did you mean 'docker'"):  # docs: in Python too
        Runner(["corral/arithmetic-v0"], ScriptedPolicy(lambda call: ""), sandbox_backend="dockr")
    with pytest.raises(UnknownBackend, match="does not open terminal sandboxes.*docker, bwrap"):
        check_backend("browser", "terminal")
    with pytest.raises(UnknownBackend, match="does not open browser sandboxes"):
        await resolve_backend(cr.Browser(), "docker")
    # a run's preferred backend leaves other kinds of spec to "auto"
    assert await resolve_backend(cr.Browser(), "bwrap", strict=False) == "browser"
    assert check_backend("auto") == "auto"


async def test_auto_takes_the_first_available_backend_of_the_kind(dockerd: None) -> None:
    assert await resolve_backend(Terminal()) == "docker"  # a daemon answers here
    assert await resolve_backend(Terminal(backend="bwrap")) == "bwrap"
    assert await resolve_backend(Terminal(backend="bwrap"), "docker") == "docker"
    assert await resolve_backend(cr.Browser()) == "browser"
