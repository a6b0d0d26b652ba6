"""Shells that a Docker container starts itself, talked to through named pipes.

A `docker exec` costs the daemon and runc about 75 ms of CPU and, under load, a wait in the
daemon's queue; every sandbox needs two shells (the agent's and the root control shell), so
that was two execs per episode before the first command. Instead, the host makes a directory
of FIFOs (`<name>.in/.out/.err` per shell), bind-mounts it read-only at `MOUNT` and the
container's main process (`BOOT`, under tini) starts one bash per FIFO set at once, as root.
The host then talks to each shell through the pipes directly: no daemon call at all.

Used only where it is safe and real (see `usable`): the daemon shares this host's filesystem
and pid namespace (the container's view of the mount is the very same FIFO) and runs without
user-namespace remapping. The directory is root-only (0700, FIFOs 0600) and the mount is
read-only, so a non-root agent cannot reach the control shell; a root agent can already do
anything in its container. A shell that exits is replaced by a `docker exec` one (the FIFOs
serve each shell once), except the control shell after the verify phase's kill: the host then
makes a new FIFO set, under a name no agent process saw, and asks the main process (spared by
the kill) for a shell on it through `START` (`request_shell`): milliseconds, where a fresh
exec cost 0.1–0.25 s of a loaded daemon in every Docker episode's verify phase.

EOF: a FIFO reader sees end-of-file while no writer has it open, also *before* the shell
opened its end. The host therefore holds a write end of its own `.out`/`.err` (a guard) until
the shell's first output, so end-of-file means the shell really went away.
"""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import shutil
import time
from pathlib import Path
from typing import Callable

from . import _procs
from ._proto import Transport

MOUNT = "/run/corral"
SHELLS = ("control", "agent")
START = "start"  # the FIFO on which the host asks the main process for another shell

_SHELL = (f"(exec bash --noprofile --norc 3<&-) <{MOUNT}/$s.in >{MOUNT}/$s.out "
          f"2>{MOUNT}/$s.err")  # without the main process's descriptor 3 (START)
# The container's main process. Each shell's redirections are opened before bash runs, so its
# first output (or the error of a missing bash) proves all three are open. Then it reads shell
# names from START (held open at both ends: no end-of-file) and starts one on each such FIFO
# set the host made: how the verify phase gets a root shell after killing the agent's
# processes (this process is spared) without a Docker exec. Names are checked (a root agent
# can write to START too; it could always start a root shell anyway). `sleep infinity` keeps
# the container up where there are no FIFOs.
BOOT = (f"for s in {' '.join(SHELLS)}; do [ -p {MOUNT}/$s.in ] && {_SHELL} & done; "
        f"[ -p {MOUNT}/{START} ] || exec sleep infinity; exec 3<>{MOUNT}/{START}; "
        "while read -r s <&3; do case $s in ''|*[!a-z0-9]*) continue;; esac; "
        f"[ -p {MOUNT}/$s.in ] && {_SHELL} & done; exec sleep infinity")


@functools.cache
def _raise_fd_limit() -> None:
    """Each such shell holds three host file descriptors (a Docker exec held one socket): lift
    the soft limit (often 1024) towards the hard one, so a few hundred sandboxes fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def make_fifos(folder: Path, shells: tuple[str, ...]) -> None:
    """Create `folder` (0700) with the FIFOs of `shells` and START (0600)."""
    _raise_fd_limit()
    folder.mkdir(mode=0o700, parents=True, exist_ok=False)
    os.mkfifo(folder / START, 0o600)
    for shell in shells:
        _make_set(folder, shell)


def _make_set(folder: Path, shell: str) -> None:
    for stream in ("in", "out", "err"):
        os.mkfifo(folder / f"{shell}.{stream}", 0o600)


def request_shell(folder: Path, shell: str) -> bool:
    """Make the FIFOs of a new shell `shell` (lowercase letters and digits) and ask the
    container's main process for it through START. False where it cannot be asked (nothing
    reads START, or its pipe is full)."""
    _make_set(folder, shell)
    try:
        fd = os.open(folder / START, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.write(fd, f"{shell}\n".encode())  # shorter than PIPE_BUF: all or nothing
        finally:
            os.close(fd)
    except OSError:
        for stream in ("in", "out", "err"):
            (folder / f"{shell}.{stream}").unlink(missing_ok=True)
        return False
    return True


def remove_fifos(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def usable(container_id: str, folder: Path, shell: str) -> bool:
    """Whether the started container sees `folder`'s FIFOs at `MOUNT` as the same files and
    runs without user-namespace remapping (so its root may open root's 0600 FIFOs)."""
    pids = _procs.container_pids(container_id)
    if not pids:
        return False
    try:
        if not _procs.unmapped(pids[0]):
            return False
        inside = os.stat(f"/proc/{pids[0]}/root{MOUNT}/{shell}.in")
        return os.path.samestat(inside, os.stat(folder / f"{shell}.in"))
    except OSError:
        return False


async def _ready(add: Callable[..., None], remove: Callable[[int], object], fd: int) -> None:
    """Wait until `fd` is readable / writable (`add`: the loop's add_reader or add_writer)."""
    ready = asyncio.get_running_loop().create_future()

    def wake() -> None:  # the loop may call it again before this coroutine resumes
        if not ready.done():
            ready.set_result(None)

    add(fd, wake)
    try:
        await ready
    finally:
        remove(fd)


class FifoTransport(Transport):
    """The stdio of a shell started by the container's main process (see module doc)."""

    def __init__(self, container_id: str, folder: Path, shell: str) -> None:
        super().__init__()
        self.container_id, self.path = container_id, folder / shell
        nonblock = os.O_NONBLOCK | os.O_CLOEXEC
        # stdin: a reader of our own first, so the write end opens without waiting for the
        # shell and our early writes wait in the pipe; it is never read from
        self._stdin_reader: int | None = os.open(f"{self.path}.in", os.O_RDONLY | nonblock)
        self._stdin = os.open(f"{self.path}.in", os.O_WRONLY | nonblock)
        self._readers = [os.open(f"{self.path}.{s}", os.O_RDONLY | nonblock)
                         for s in ("out", "err")]
        self._guards = [os.open(f"{self.path}.{s}", os.O_WRONLY | nonblock) for s in ("out", "err")]
        self._open = 2
        self._closed = False
        self._pid: int | None = None
        self._pumps = [asyncio.create_task(self._read(fd, sid))
                       for sid, fd in enumerate(self._readers, start=1)]

    async def _read(self, fd: int, sid: int) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                await _ready(loop.add_reader, loop.remove_reader, fd)
                continue
            if not data:
                break
            self._drop_guards()
            await self.frames.put((sid, data))
        self._open -= 1
        if not self._open:
            await self.frames.put((0, b""))

    def _drop_guards(self) -> None:
        """The shell has written, so it holds its ends: from now on EOF means it is gone (and
        a write to its stdin fails once it is: our own reader of that pipe goes too)."""
        for fd in self._guards:
            os.close(fd)
        self._guards = []
        if self._stdin_reader is not None:
            os.close(self._stdin_reader)
            self._stdin_reader = None

    async def write(self, data: bytes) -> None:
        if self._closed:
            raise BrokenPipeError("the shell's stdin is closed")
        loop = asyncio.get_running_loop()
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._stdin, view):]
            except BlockingIOError:  # the pipe is full: wait until the shell reads
                await _ready(loop.add_writer, loop.remove_writer, self._stdin)

    async def started(self, within: float) -> bool:
        """Whether a process of the container took this shell's stdin within `within`
        seconds (for a shell the host asked for: the main process may not answer)."""
        deadline = time.monotonic() + within
        while await self.host_pid() is None:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.002)
        return True

    async def host_pid(self) -> int | None:
        """The shell's pid on this host: the container's process whose stdin is our FIFO."""
        if self._pid is None:
            self._pid = await asyncio.to_thread(self._find_pid)
        return self._pid

    def _find_pid(self) -> int | None:
        fifo = os.stat(f"{self.path}.in")
        for pid in _procs.container_pids(self.container_id) or []:
            try:
                if os.path.samestat(os.stat(f"/proc/{pid}/fd/0"), fifo):
                    return pid
            except OSError:
                continue
        return None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in self._pumps:
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        self._drop_guards()
        for fd in (self._stdin, *self._readers):
            os.close(fd)
