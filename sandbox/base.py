"""The sandbox contract every backend implements.

A sandbox is one isolated place where an episode's commands run. A backend is two classes in
its own module: a `Sandbox` (one running sandbox) and a `Backend` (opens sandboxes for specs and
owns what it keeps warm between them), plus its pydantic `BackendConfig`; one row of the table
in `backends.py` names them. Everything is async: a backend never blocks the event loop
(synchronous SDKs run in threads).
"""

from __future__ import annotations

import abc
import asyncio
import errno
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, ClassVar, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from ..errors import InfraError, SandboxError

if TYPE_CHECKING:
    from .snapshot import SandboxSnapshot
    from ._rootio import RootDir

__all__ = ["Backend", "BackendConfig", "DEFAULT_OUTPUT_LIMIT", "ExecResult", "PREPARE_ERRORS",
           "Process", "Sandbox", "SandboxSpec", "SandboxStats", "Shell", "TRUNCATION_MARKER",
           "cap_output", "start_all"]

log = logging.getLogger(__name__)
# what starting a shell ahead of use may raise; its first real use raises it again
PREPARE_ERRORS = (InfraError, TimeoutError, OSError)

DEFAULT_OUTPUT_LIMIT = 1 << 20  # bytes kept per stream; the rest is dropped with a marker
TRUNCATION_MARKER = "\n[... output truncated by corral: {dropped} bytes dropped ...]\n"


class SandboxSpec(BaseModel):
    """What an env asks of its sandbox, the fields every kind shares (the kinds, `Terminal`
    and `Browser`, are in `spec.py`; a backend serves one or more kinds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    env: dict[str, str] = Field(default_factory=dict, description="environment variables")
    startup_timeout: float = Field(60.0, gt=0, description="seconds to wait for the sandbox")


@dataclass(slots=True)
class ExecResult:
    """What one command did: exit code, captured output, wall time and whether it timed out."""

    exit_code: int
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def output(self) -> str:
        """stdout and stderr together, as a terminal would show them."""
        if self.stderr and self.stdout:
            return f"{self.stdout}{'' if self.stdout.endswith(chr(10)) else chr(10)}{self.stderr}"
        return self.stdout or self.stderr


@dataclass(slots=True)
class SandboxStats:
    """Timings a backend records so the runner can report where time went."""

    started_at: float = 0.0
    start_seconds: float = 0.0
    commands: int = 0
    exec_seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


class Shell(abc.ABC):
    """A persistent shell session: commands share cwd and environment like a terminal."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Start the session now if it is not running (otherwise the first command does)."""

    @abc.abstractmethod
    async def run(self, command: str, timeout: float | None = None) -> ExecResult:
        """Run one command in the session; on timeout its process group is killed within 1 s
        of the deadline and the session stays usable."""

    @abc.abstractmethod
    async def close(self) -> None:
        """End the session."""


class Process(abc.ABC):
    """A long-running process inside a sandbox with its stdio piped to the host
    (`Sandbox.start_process`): a server speaking a protocol on stdin/stdout, such as an MCP
    server. Its stderr is kept, bounded, for error messages."""

    STDERR_TAIL = 4096  # bytes of stderr kept (the end: where a crash says why)

    def __init__(self) -> None:
        self._stderr = bytearray()

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Send bytes to the process's stdin (ConnectionError once it has gone)."""

    @abc.abstractmethod
    async def read(self) -> bytes:
        """The next chunk of the process's stdout; b"" once stdout ended (it exited) or the
        process was closed (a read waiting then returns b"" too)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Kill the process and everything it started. Idempotent."""

    def note_stderr(self, data: bytes) -> None:
        """Keep the last `STDERR_TAIL` bytes of stderr."""
        self._stderr += data
        del self._stderr[:-self.STDERR_TAIL]

    @property
    def stderr_tail(self) -> str:
        """The end of what the process wrote to stderr so far."""
        return self._stderr.decode("utf-8", "replace")


class Sandbox(abc.ABC):
    """One isolated execution environment. Use as `async with` or call `close()`."""

    backend: str = "abstract"
    # whether `fork`, `snapshot` and its backend's `restore` work here (else SandboxError)
    can_fork: ClassVar[bool] = False
    # the sandbox's "/" held open on the host, where the backend reaches it (bwrap; docker on
    # this machine): host-side file I/O and `listen_unix` go through it
    _root: "RootDir | None" = None

    def __init__(self) -> None:
        self.stats = SandboxStats()

    @abc.abstractmethod
    async def exec(
        self,
        cmd: str | list[str],
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """Run one command (a string runs under `bash -lc`), capture its output, enforce the
        timeout by killing the command's whole process group."""

    @abc.abstractmethod
    async def shell(self) -> Shell:
        """The sandbox's persistent shell session (created on first use, then reused)."""

    async def start_process(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                            cwd: str | None = None, user: str | None = None) -> Process:
        """Start `argv` inside the sandbox as a long-running process whose stdin, stdout and
        stderr stay connected (no deadline, no end marker: it runs until it exits, `close()`
        kills it, or the sandbox closes). Backends without process streams raise
        SandboxError."""
        raise self.unsupported("long-running processes with piped stdio")

    async def prepare(self) -> None:
        """Start what the first commands will need (the persistent shell), so a sandbox
        started ahead of demand is ready to use; a failure here is left for that use to
        report (an image may have no shell and never need one)."""
        try:
            await (await self.shell()).start()
        except PREPARE_ERRORS as exc:
            log.debug("preparing a %s sandbox: %s", self.backend, exc)

    @abc.abstractmethod
    async def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        """Create or replace a file inside the sandbox (parents are created)."""

    @abc.abstractmethod
    async def read_file(self, path: str) -> bytes:
        """Read a file from inside the sandbox; raises FileNotFoundError if missing."""

    async def upload(self, local: str | Path, remote: str) -> None:
        """Copy a local file or directory tree into the sandbox. In a tree, a link to a file
        of the tree is copied as that file; a link that leads out of the tree is refused
        (PermissionError, before anything is copied): a task folder must not carry the host's
        files into a sandbox."""
        local = Path(local)
        if not local.is_dir():
            await self.write_file(remote, local.read_bytes(), local.stat().st_mode & 0o777)
            return
        inside = local.resolve()
        items = sorted(local.rglob("*"))
        for item in items:
            if item.is_symlink() and not item.resolve().is_relative_to(inside):
                raise PermissionError(errno.EPERM, f"a link out of the uploaded folder "
                                      f"{local} (to {os.readlink(item)})", str(item))
        for item in items:
            if item.is_file():
                rel = item.relative_to(local).as_posix()
                await self.write_file(f"{remote.rstrip('/')}/{rel}", item.read_bytes(),
                                      item.stat().st_mode & 0o777)

    async def download(self, remote: str, local: str | Path) -> None:
        """Copy a file out of the sandbox."""
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(await self.read_file(remote))

    # --- the verify phase (what a verifier needs to trust the sandbox after the agent) -------
    async def process_keys(self) -> frozenset[tuple[int, int]] | None:
        """(host pid, start time) of every process in the sandbox now but the sandbox's own
        (its init and main process, its shell sessions, which `kill_agent_processes` spares or
        ends by itself), so a later `kill_agent_processes` can spare what runs already, and an
        env can tell whether setup left processes running (`Env.restarts_setup_processes`);
        None where this backend cannot see its processes."""
        return None

    async def kill_agent_processes(self, spare: frozenset[tuple[int, int]] = frozenset()) -> int:
        """End the shell sessions and SIGKILL every other process in the sandbox (detached ones,
        whole trees, from the host) except its init and what `spare` names; the sandbox stays
        usable (later commands start fresh shells). Returns how many processes were killed.
        A backend without process control raises SandboxError (the verify phase warns)."""
        raise self.unsupported("process control")

    async def recreate_dirs(self, dirs: Sequence[str], remove: Sequence[str] = ()) -> bool:
        """From the host, with nothing run inside: make each of `dirs` a new, empty folder of
        the sandbox's root (mode 755; links on the way removed, not followed) and delete
        `remove`. False where this backend cannot (the caller then runs the same inside)."""
        return False

    async def listen_unix(self, path: str) -> socket.socket | None:
        """A listening unix socket at `path` inside the sandbox, bound from the host (the
        host process serves it; the sandbox's processes, any user, connect to it: no mount,
        no network). None where this backend cannot reach the sandbox's root from here."""
        root = self._root
        if root is None or not self.alive:
            return None
        return await asyncio.to_thread(root.listen_unix, path)

    async def changed_since(self, since: float) -> list[str] | None:
        """Paths inside the sandbox created, changed or deleted after `since` (host
        `time.time()`), read from the host by inode change time, which nothing inside can
        fake; None where the sandbox's writable layer is not visible from here."""
        return None

    # --- forks and snapshots (backends with `can_fork`; docs/sandboxes.md says what is kept) --
    async def snapshot(self, *, durable: bool = False) -> "SandboxSnapshot":
        """Freeze the filesystem as it is now into a `SandboxSnapshot` (the sandbox keeps
        running, untouched); its backend's `restore` starts sandboxes on it. `durable`: the
        snapshot outlives this process (see `corral.sandbox.snapshot`)."""
        raise self.unforkable()

    async def fork(self, n: int, *, keep_parent: bool = True) -> list["Sandbox"]:
        """`n` new, live sandboxes whose filesystem equals this one's now, with the same spec
        (limits, network, user); each is independent of the others and of this one, and
        closes on its own. Processes are not carried: the children run none of this
        sandbox's processes (an env restarts its services in each, `Env.on_fork`).
        `keep_parent=False` closes this sandbox as part of the fork, which lets a backend hand
        its filesystem to the children without a copy."""
        raise self.unforkable()

    def unforkable(self) -> SandboxError:
        """The error of `fork`/`snapshot`/`restore` on a backend that cannot."""
        return SandboxError(f"the {self.backend} backend cannot fork or snapshot a sandbox "
                            "(can_fork is False)")

    @abc.abstractmethod
    async def close(self) -> None:
        """Release everything the sandbox holds. Idempotent."""

    async def terminate(self) -> None:
        """Kill everything running in the sandbox now; `close()` still releases the rest.
        Backends whose close is itself immediate close here."""
        await self.close()

    @property
    def alive(self) -> bool:
        """False once the sandbox is closed or known dead."""
        return True

    async def __aenter__(self) -> "Sandbox":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def unsupported(self, what: str) -> SandboxError:
        """The error for a call that means nothing on this backend (a shell in a browser)."""
        return SandboxError(f"the {self.backend} backend has no {what}")


class BackendConfig(BaseModel):
    """A backend's own options (one pydantic class per backend, as SWE-ReX's deployment
    configs); what an env asks of a sandbox is its spec, not this."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Backend(abc.ABC):
    """A backend in use: it opens sandboxes for specs and owns whatever it keeps warm between
    them (nothing for a container engine; Chromium processes for the browser). Whoever makes
    one closes it (`close()` or `async with`), after the sandboxes it opened."""

    name: ClassVar[str] = "abstract"
    # whether its sandboxes fork and snapshot, and `restore` works (as `Sandbox.can_fork`)
    can_fork: ClassVar[bool] = False

    def __init__(self, config: BackendConfig | None = None, *, run_id: str = "adhoc") -> None:
        self.config = config
        self.run_id = run_id

    @classmethod
    def available(cls) -> bool:
        """Whether this backend can run here ("auto" takes the first available one)."""
        return True

    @abc.abstractmethod
    async def open(self, spec: SandboxSpec, *, env_id: str = "", image: str | None = None,
                   build: bool = True) -> Sandbox:
        """Start one sandbox for `spec`, labelled with this backend's run and `env_id`.
        `image` is an already resolved image tag (backends without images ignore it); `build`
        allows building a missing image from the spec's Dockerfile."""

    async def open_standalone(self, spec: SandboxSpec, *, env_id: str = "",
                              image: str | None = None, build: bool = True) -> Sandbox:
        """One sandbox for a caller that keeps no backend: what the backend would keep warm is
        made for this sandbox alone and released when it closes. Backends that keep nothing
        warm open as usual."""
        return await self.open(spec, env_id=env_id, image=image, build=build)

    async def restore(self, snapshot: "SandboxSnapshot", *,
                      env_id: str | None = None) -> Sandbox:
        """Start one sandbox on `snapshot`'s filesystem, with the spec it was made with,
        labelled with this backend's run (and `env_id`, default the snapshot's)."""
        raise self.unforkable()

    async def restore_standalone(self, snapshot: "SandboxSnapshot", *,
                                 env_id: str | None = None) -> Sandbox:
        """`restore` for a caller that keeps no backend (as `open_standalone`)."""
        return await self.restore(snapshot, env_id=env_id)

    @classmethod
    async def discard_snapshot(cls, snapshot: "SandboxSnapshot") -> None:
        """Free what `snapshot` holds once no sandbox runs on it (`SandboxSnapshot.discard`)."""
        raise SandboxError(f"the {cls.name} backend makes no snapshots")

    def unforkable(self) -> SandboxError:
        """The error of `restore` on a backend that cannot."""
        return SandboxError(f"the {self.name} backend cannot restore a snapshot "
                            "(can_fork is False)")

    def check_snapshot(self, snapshot: "SandboxSnapshot") -> None:
        """SandboxError unless this backend made `snapshot`."""
        if not self.can_fork:
            raise self.unforkable()
        if snapshot.backend != self.name:
            raise SandboxError(f"a {snapshot.backend} snapshot cannot be restored on the "
                               f"{self.name} backend")

    async def close(self) -> None:
        """Release what the backend keeps warm. Idempotent."""

    async def __aenter__(self) -> "Backend":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def cap_output(data: bytes, limit: int = DEFAULT_OUTPUT_LIMIT) -> tuple[str, bool]:
    """Decode at most `limit` bytes of `data`, marking what was dropped."""
    if len(data) <= limit:
        return data.decode("utf-8", "replace"), False
    kept = data[:limit].decode("utf-8", "replace")
    return kept + TRUNCATION_MARKER.format(dropped=len(data) - limit), True


async def start_all(starts: Sequence[Awaitable[Sandbox]],
                    alongside: Awaitable[None] | None = None) -> list[Sandbox]:
    """Await sandbox starts together (a fork's children), and `alongside` with them (a
    parent's close, whose failure is logged: the children are fine); if a start fails, close
    those that started and raise its error."""
    extra = [] if alongside is None else [alongside]
    results = await asyncio.gather(*starts, *extra, return_exceptions=True)
    started = [r for r in results[:len(starts)] if isinstance(r, Sandbox)]
    failed = [r for r in results[:len(starts)] if isinstance(r, BaseException)]
    if failed:
        await asyncio.gather(*(sb.close() for sb in started))
        raise failed[0]
    if extra and isinstance(results[-1], BaseException):
        log.warning("closing a forked sandbox's parent failed: %s", results[-1])
    return started
