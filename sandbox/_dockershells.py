"""The shells of a docker sandbox: the agent's persistent bash and the root control shell
(file writes, root one-shot commands), on FIFOs the container started where it runs here
(`_fifo`), else Docker execs; and how a command cut off by a vanished container is told from
a shell that exited."""

from __future__ import annotations

import asyncio
import logging
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping

from ..errors import SandboxDied, SandboxUnavailable
from . import _fifo, _procs
from ._engine import blocking
from ._proto import ShellSession, Transport
from .base import PREPARE_ERRORS, ExecResult, Shell

if TYPE_CHECKING:
    from .fleet import DockerHost
    from .spec import Terminal

__all__ = ["DockerShell", "DockerShells", "REQUESTED_SHELL_S"]

log = logging.getLogger(__name__)

# how long a shell asked of the container's main process may take to show up before a Docker
# exec stands in (it takes milliseconds; the main process may be gone or stuck)
REQUESTED_SHELL_S = 2.0


class DockerShells:
    """The shell sessions of `DockerSandbox` (a mixin: the sandbox holds the state)."""

    id: str
    spec: "Terminal"
    user: str
    workdir: str
    host: "DockerHost"
    _shell: ShellSession | None
    _control: ShellSession | None
    _fifo_shells: dict[str, str]
    _io_dir: Path
    _cgroup_seen: bool
    _closed: bool
    _spawn: Callable[..., Awaitable[Transport]]
    _kill: Callable[..., Awaitable[None]]
    _writable_layer: Callable[[], Awaitable[str]]

    async def _exec_in_control(self, argv: list[str], timeout: float,
                               env: Mapping[str, str] | None, cwd: str | None) -> ExecResult:
        """A root one-shot command through the idle control shell instead of a new Docker
        exec: each exec costs the daemon and runc about 75 ms of CPU, the shell a pipe write.
        A subshell `exec`s the program, so it sees the container's environment plus `env`, in
        `cwd` (default the sandbox's workdir), with its own process group for the timeout,
        as a Docker exec would; a shell builtin in argv[0] fails (127) as it does there."""
        assignments = [f"{k}={v}" for k, v in (env or {}).items()]
        program = shlex.join(["env", *assignments, *argv] if assignments else argv)
        command = f"(cd -- {shlex.quote(cwd or self.workdir)} && exec {program})"
        return await self._control_session().run(command, timeout)

    def _control_session(self) -> ShellSession:
        """The root bash used for file writes and root one-shot commands (never the agent's)."""
        if self._control is None:
            self._control = self._bash_session("control", "0", self.spec.output_limit, 60.0, "/")
        return self._control

    async def prepare(self) -> None:
        """Start the agent's shell and the control shell (the reward's commands) together,
        and look up the writable layer the verify phase scans (a daemon call that would
        otherwise fall inside the episode); see `Sandbox.prepare`."""
        async def start_control() -> None:
            try:
                await self._control_session().start()
            except PREPARE_ERRORS as exc:
                log.debug("preparing the control shell of %s: %s", self.id[:12], exc)

        async def find_layer() -> None:
            try:
                await self._writable_layer()
            except Exception as exc:  # asked again by the verify phase, which reports it
                log.debug("looking up the writable layer of %s: %s", self.id[:12], exc)

        await asyncio.gather(super().prepare(), start_control(), find_layer())

    async def shell(self) -> Shell:
        """The persistent bash session of this sandbox (started on first use)."""
        if self._shell is None:
            self._shell = self._bash_session("agent", None, self.spec.output_limit,
                                             self.spec.command_timeout, self.workdir)
        return self._shell

    def _bash_session(self, name: str, user: str | None, limit: int, timeout: float,
                      cwd: str) -> ShellSession:
        """A persistent bash (as `user`, default the sandbox's), started on first command:
        the one the container started on its FIFOs `name` if it did, else a Docker exec."""
        async def spawn() -> Transport:
            fifo = self._fifo_shells.pop(name, None)  # a shell that exits: replaced by an exec
            if fifo is not None:
                transport = _fifo.FifoTransport(self.id, self._io_dir, fifo)
                # one the container started at boot runs; one asked for later must show up
                if fifo == name or await transport.started(REQUESTED_SHELL_S):
                    return transport
                await transport.close()
                log.debug("%s: no shell on FIFOs %s; a Docker exec instead", self.id[:12], fifo)
            return await self._spawn(["bash", "--noprofile", "--norc"], stdin=True, user=user)

        return DockerShell(self, spawn, self._kill, limit, timeout, cwd)

    async def _check_vanished(self, result: ExecResult) -> None:
        """A command that ended without reporting (its stream closed) in a container that is
        gone (its host died, its daemon restarted) raises SandboxDied: an infrastructure
        failure to retry elsewhere, not an exit code to show the agent. A shell that exited
        (`exit`) in a live container stays an ordinary result."""
        if result.exit_code == -1 and not result.timed_out and await self._vanished():
            raise SandboxDied(f"sandbox {self.id[:12]} on {self.host.url} is gone")

    async def _vanished(self) -> bool:
        import docker

        if self._closed:
            return True
        if self._cgroup_seen:  # its processes are visible here: none left means it died
            return not _procs.container_pids(self.id)
        try:  # else the daemon says (a fleet host that does not answer is down)
            info = await blocking(self.host.call, lambda c: c.api.inspect_container(self.id))
        except (SandboxUnavailable, docker.errors.NotFound):
            return True
        return not (info.get("State") or {}).get("Running")

    async def _close_sessions(self) -> None:
        """End both shells (their process trees die with them)."""
        for session in (self._shell, self._control):
            if session is None:
                continue
            try:
                await session.close()
            except Exception:  # the container may already be gone; what follows matters
                log.debug("shell close failed", exc_info=True)


class DockerShell(ShellSession):
    """A Docker sandbox's persistent bash: a command cut off because the container is gone
    raises SandboxDied (see `DockerSandbox._check_vanished`)."""

    def __init__(self, sandbox: DockerShells, *args: Any) -> None:
        super().__init__(*args)
        self._sandbox = sandbox

    async def run(self, command: str, timeout: float | None = None) -> ExecResult:
        result = await super().run(command, timeout)
        await self._sandbox._check_vanished(result)
        return result

