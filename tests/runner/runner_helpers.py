"""Helpers for the runner tests: a real local-process sandbox, envs that use it, solvers.

`DirSandbox` is a real `Sandbox`: every command is a real `bash` subprocess running in the
sandbox's own temporary directory (no isolation, which these tests do not need). It lets the
pool and the episode loop be tested with real processes and real files on a machine where
containers are slow; the docker test exercises the same code with real containers.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import corral as cr
from corral.errors import InfraError, SandboxDied
from corral.runner.policy import ScriptedCall
from corral.sandbox.base import ExecResult, Sandbox, Shell
from corral.sandbox.spec import Terminal

_ids = itertools.count()


class DirSandbox(Sandbox):
    """A sandbox whose root is a fresh temporary directory; commands are local bash processes."""

    backend = "dir"

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="corral-dirsb-"))
        self.number = next(_ids)
        self.closed = False
        self.killed = False
        self.resets = 0
        self.close_gate: asyncio.Event | None = None  # set: close() waits for it (slow removal)

    @property
    def alive(self) -> bool:
        return not self.closed and self.root.exists()

    def _path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    async def exec(self, cmd: str | list[str], timeout: float | None = None,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   user: str | None = None) -> ExecResult:
        if not self.alive:
            raise SandboxDied(f"sandbox {self.number} is gone")
        started = time.perf_counter()
        command = cmd if isinstance(cmd, str) else " ".join(cmd)
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", command, cwd=self.root, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return ExecResult(-9, "", "", time.perf_counter() - started, timed_out=True)
        return ExecResult(proc.returncode or 0, out.decode(), err.decode(),
                          time.perf_counter() - started)

    async def shell(self) -> Shell:
        sandbox = self

        class _Shell(Shell):
            async def start(self) -> None:
                return None  # every command is its own process: nothing runs between them

            async def run(self, command: str, timeout: float | None = None) -> ExecResult:
                return await sandbox.exec(command, timeout)

            async def close(self) -> None:
                return None

        return _Shell()

    async def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)

    async def read_file(self, path: str) -> bytes:
        return self._path(path).read_bytes()

    def kill(self) -> None:
        """The sandbox dies (its filesystem is gone), as a crashed container would."""
        self.killed = True
        shutil.rmtree(self.root, ignore_errors=True)

    async def close(self) -> None:
        if self.close_gate is not None:
            await self.close_gate.wait()
        self.closed = True
        shutil.rmtree(self.root, ignore_errors=True)


class DirOpener:
    """A pool opener that starts DirSandboxes, recording them; can be told to fail."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.opened: list[DirSandbox] = []
        self.fail_next = 0

    async def __call__(self, spec: Any, env_id: str) -> DirSandbox:
        if self.delay:
            await asyncio.sleep(self.delay)  # models a container's start latency
        if self.fail_next:
            self.fail_next -= 1
            raise InfraError("the sandbox backend refused to start one")
        sandbox = DirSandbox()
        self.opened.append(sandbox)
        return sandbox


SPEC = Terminal(image="corral-test/dir:0")


class FileTask(cr.Task):
    name: str
    content: str


class FileEnv(cr.Env):
    """Create a file with given content using the `sh` tool; reusable sandboxes."""

    kind = "terminal"
    env_id = "test/file-v0"
    tasks = cr.Dataset.from_list([{"name": f"f{i}.txt", "content": f"hello {i}"}
                                  for i in range(6)], FileTask)
    sandbox_spec = SPEC
    max_turns = 4
    reusable_sandbox = True
    fail_setup: dict[str, int] = {}   # task name -> infra failures still to raise
    setup_calls = 0

    def instruction(self, task: FileTask) -> str:
        return f"Write '{task.content}' into {task.name}."

    async def setup(self, sandbox: DirSandbox, task: FileTask) -> None:
        type(self).setup_calls += 1
        left = self.fail_setup.get(task.name, 0)
        if left:
            self.fail_setup[task.name] = left - 1
            raise InfraError(f"setup of {task.name} lost its sandbox")
        await sandbox.write_file("README", "task files live here")

    async def reset_sandbox(self, sandbox: DirSandbox) -> None:
        sandbox.resets += 1
        await sandbox.exec("find . -mindepth 1 -delete")

    @cr.tool
    async def sh(self, sandbox: DirSandbox, command: str) -> str:
        """Run a shell command."""
        if command == "crash-sandbox":
            sandbox.kill()
        result = await sandbox.exec(command, timeout=10)
        return result.output + ("" if result.ok else f"\n[exit {result.exit_code}]")

    @cr.reward
    async def has_file(self, sandbox: DirSandbox, task: FileTask) -> float:
        try:
            return float((await sandbox.read_file(task.name)).decode().strip() == task.content)
        except FileNotFoundError:
            return 0.0


def tool_call(command: str, name: str = "sh") -> str:
    """A tool call in the text (Hermes) format."""
    body = json.dumps({"name": name, "arguments": {"command": command}})
    return f"<tool_call>{body}</tool_call>"


def file_solver(call: ScriptedCall) -> str:
    """Solves FileEnv when the request seed is even, writes the wrong text when odd."""
    if call.turn == 0:
        match = re.search(r"Write '(.+?)' into (\S+)\.", call.prompt)
        assert match, call.prompt
        content = match.group(1) if call.request.seed % 2 == 0 else "wrong"
        return tool_call(f"echo '{content}' > {match.group(2)}")
    return "done"


def arithmetic_solver(call: ScriptedCall) -> str:
    """Right answer for even request seeds, wrong for odd (so groups have reward variance)."""
    expr = re.search(r"Compute (.+?)\. Reply", call.prompt).group(1)  # type: ignore[union-attr]
    value = eval(expr, {"__builtins__": {}})  # the env's own arithmetic, written by us
    return str(value if call.request.seed % 2 == 0 else value + 1)


