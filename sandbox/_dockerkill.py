"""Killing processes in a docker sandbox: from the host through /proc where the container
runs here (`_procs`), else from inside it (a command's exec marker on a remote host; every
process but the container's init and main process for the verify phase)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from . import _fifo, _procs
from ._engine import EXEC_MARKER, HEAD_TIMEOUT_S, blocking
from ._proto import Transport
from .daemon import daemon_unreachable

if TYPE_CHECKING:
    from pathlib import Path

    from .fleet import DockerHost

__all__ = ["INSIDE_KILL", "DockerKills"]

log = logging.getLogger(__name__)

# on a remote host: SIGKILL the processes carrying exec marker $1, all of them when $2 is 1,
# else all but the exec's own process (the oldest: a shell survives its command's timeout)
_REMOTE_KILL = ('pids=$(grep -lxz "$0=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | '
                'sort -n); [ "$2" = 1 ] || pids=$(echo "$pids" | tail -n +2); '
                '[ -z "$pids" ] || kill -9 $pids 2>/dev/null; true')
# inside a container: SIGKILL every process but pid 1 (tini), the container's main process (the
# child of pid 1 that started first: later ones are orphans it adopted; its pid is not 2, as
# tini's start uses a few) and the killer itself. /proc/PID/stat after "comm) ": $2 is the
# ppid, $20 the start time.
INSIDE_KILL = ('main=; since=; for d in /proc/[0-9]*; do p=${d#/proc/}; '
                'stat=$(sed "s/^.*) //" "$d/stat" 2>/dev/null) || continue; set -- $stat; '
                '[ "$2" = 1 ] || continue; if [ -z "$since" ] || [ "${20}" -lt "$since" ] || '
                '{ [ "${20}" = "$since" ] && [ "$p" -lt "$main" ]; }; then since=${20}; main=$p; '
                'fi; done; for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" -gt 1 ] && '
                '[ "$p" != "$main" ] && [ "$p" != $$ ] && kill -9 "$p" 2>/dev/null; done; true')


class DockerKills:
    """The process control of `DockerSandbox` (a mixin: the sandbox holds the state)."""

    id: str
    host: "DockerHost"
    _io_dir: "Path"
    _fifo_ok: bool
    _fifo_shells: dict[str, str]
    _shell: Any
    _control: Any
    _spawn: Callable[..., Awaitable[Transport]]
    _close_sessions: Callable[[], Awaitable[None]]
    exec: Callable[..., Awaitable[Any]]

    async def _kill(self, transport: Transport, keep: frozenset[int], everything: bool) -> None:
        marker = getattr(transport, "marker", None)
        if marker is not None:  # a remote host: kill from inside the container
            await self._kill_marked(marker, everything)
            return
        pid = await transport.host_pid()
        if pid is None:
            return
        await blocking(_procs.kill_tree, pid, keep, everything,
                        lambda: _procs.container_pids(self.id) or [])

    async def _kill_marked(self, marker: str, everything: bool) -> None:
        """SIGKILL, inside the container, the processes of the exec marked `marker` (all, or
        all but the exec's own process); waits for the killer to finish (bounded)."""
        killer = await self._spawn(["sh", "-c", _REMOTE_KILL, EXEC_MARKER, marker,
                                    "1" if everything else "0"], user="0")
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                while (await killer.frames.get())[0]:
                    continue  # drain the killer's output until its end-of-stream frame
        finally:
            await killer.close()

    async def terminate(self) -> None:
        """Kill every process of the container from the host (its cgroup), without the daemon:
        removing the container (`close`) can then wait for a quiet moment, since under load
        each removal slows the daemon's container starts by about 0.1 s."""
        import docker

        await self._close_sessions()
        if await blocking(_procs.kill_container, self.id):
            return
        try:  # its cgroup is not visible from here: the daemon kills it
            await blocking(self.host.call, lambda c: c.api.kill(self.id))
        except docker.errors.APIError as exc:  # not running any more; close() removes it
            log.debug("kill %s: %s", self.id[:12], exc)
        except Exception as exc:  # the daemon is restarting (it stops every container);
            if not daemon_unreachable(exc):  # close() waits for it and removes this one
                raise
            log.debug("kill %s: %s", self.id[:12], exc)

    # --- the verify phase -----------------------------------------------------------------
    async def process_keys(self) -> frozenset[tuple[int, int]] | None:
        """See `Sandbox.process_keys` (the container's cgroup, read on the host), less the
        container's own: tini, its main process, the shells that one started on FIFOs (its
        children, opened or still waiting for the host) and the Docker exec shells."""
        pids = _procs.container_pids(self.id)
        if pids is None:
            return None
        keys = set(filter(None, map(_procs.process_key, pids)))
        own = _procs.init_and_first_child(keys)
        main = {pid for pid, _ in own if _procs.inner_pid(pid) != 1}
        own |= {k for k in keys if (_procs.parent(k[0]) or 0) in main}
        for session in (self._shell, self._control):
            root = await session.host_pid() if session is not None else None
            shell = None if root is None else _procs.session_process(root, pids)
            own |= {k for k in keys if k[0] == shell}
        return frozenset(keys - own)

    async def kill_agent_processes(self, spare: frozenset[tuple[int, int]] = frozenset()) -> int:
        """See `Sandbox.kill_agent_processes`. tini and the container's main process (the
        first process tini started: the container stops when either does) are always
        spared."""
        await self._close_sessions()
        # the control shell is killed too (a root agent could reach it through its FIFOs):
        # later commands get a fresh one
        self._shell = self._control = None
        self._fifo_shells.clear()
        pids = _procs.container_pids(self.id)
        if pids is None:  # not visible from here: kill from inside
            await self.exec(["sh", "-c", INSIDE_KILL], timeout=30, user="0")
            return 0
        lifelines = _procs.init_and_first_child(filter(None, map(_procs.process_key, pids)))
        killed = await blocking(_procs.kill_all, lambda: _procs.container_pids(self.id) or [],
                                 frozenset(set(spare) | lifelines))
        if self._fifo_ok:
            await blocking(self._request_control, lifelines)
        return killed

    def _request_control(self, lifelines: set[tuple[int, int]]) -> None:
        """Ask the container's main process for the next control shell, on FIFOs with a name
        no agent process saw (none is left to see it), so the verifier's commands need no
        Docker exec. The agent may have stopped the main process: it is continued first."""
        for pid, _ in lifelines:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        name = f"verify{secrets.token_hex(6)}"
        if _fifo.request_shell(self._io_dir, name):
            self._fifo_shells["control"] = name
