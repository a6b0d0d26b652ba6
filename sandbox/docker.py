"""Docker backend: one container per sandbox, driven through the Docker Engine API.

Usage (normally through `corral.sandbox.open_sandbox`)::

    sb = await DockerSandbox.create(Terminal(cpus=1, memory="512m"), run_id="r1", env_id="demo")
    try:
        r = await sb.exec("ls /", timeout=10)          # one-shot: ExecResult
        sh = await sb.shell()                          # persistent bash: cwd/env carry over
        await sh.run("cd /tmp && export X=1")
        print((await sh.run("pwd; echo $X")).stdout)  # /tmp\n1
    finally:
        await sb.close()

Container lifecycle (create/start/remove, archives) goes through the `docker` SDK in threads.
The container's main process (root, under tini) starts the root control shell, and a root
agent's shell, on named pipes the host talks to directly (`_fifo`: no Docker exec per shell).
Other processes are Docker execs, whose hot path (exec create + attach) talks HTTP to the
daemon's unix socket with asyncio directly, so a command costs no thread hop. Where the
container runs on this machine without user-namespace remapping, files are read and written
from the host through its root (`_rootio`: paths resolved inside it by the kernel), with no
process or daemon call; elsewhere through the control shell or the archive API.

Security defaults: network `none` (spec.network opts in: `bridge`, or `host-loopback` = the
host's network namespace), `cap_drop=ALL` plus the few capabilities root-in-container tasks need
(`CAP_ADD`: chown/chmod of other users' files, su to another user, kill, bind low ports),
`no-new-privileges`, pids/memory(+swap)/cpu limits, `init=True` (tini as pid 1: it reaps orphans,
so a killed fork bomb does not leave zombies holding the pids limit, and it exits at once on
SIGTERM) and `stop_signal=SIGKILL` so teardown never waits. Timeouts are enforced from the host
through /proc (`_procs.kill_below`) when the daemon is local (a unix socket).

Hosts: a sandbox lives on one daemon of the backend's fleet (`fleet.py`: several daemons, each
with a capacity, a creation-rate limit and health checks). On a remote daemon (`tcp://`,
`ssh://`) its processes are out of the host's reach: shells are Docker execs, and a command's
timeout kills, from inside the container, the processes carrying its exec's marker variable
(`CORRAL_EXEC`; a shell's earlier background jobs die with it there).
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
import base64
import contextlib
import errno
import os
import posixpath
import secrets
import shlex
import signal
import socket
import tarfile
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence, TypeVar
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from ..errors import SandboxDied, SandboxError, SandboxUnavailable
from . import _changes, _fifo, _procs
from ._proto import ShellSession, StreamProcess, Transport, ansi_c_quote, run_command
from ._rootio import RootDir, check_size
from ._rootio import supported as openat2_supported
from .base import PREPARE_ERRORS, BackendConfig, ExecResult, Process, Sandbox, Shell
from .image_backend import ImageBackend
from .fleet import (DockerFleet, DockerHost, DockerHostConfig, configured_hosts, default_host,
                    parse_hosts, reason, ssh_command, unreachable)
from .builds import image_tag, missing_image
from .cache import cache_dir
from .daemon import LABEL_MANAGED, daemon_unreachable, docker_available
from .rootfs import passwd_entry
from .spec import Terminal

__all__ = ["CAP_ADD", "DockerBackend", "DockerConfig", "DockerSandbox", "DockerTransport",
           "EXEC_MARKER", "HEAD_TIMEOUT_S", "INLINE_WRITE_LIMIT", "LABEL_ENV", "LABEL_OWNER",
           "LABEL_OWNER_START", "LABEL_RUN", "REQUESTED_SHELL_S", "T", "io_root"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# Files up to this size are written through the sandbox's control shell (a few ms, no daemon
# work); bigger ones go through the daemon's archive API. Under load every daemon call queues
# behind container starts and removals: put_archive took 90 ms and more per file.
INLINE_WRITE_LIMIT = 256 * 1024
_NOT_REGULAR = 86  # the inline write's exit status for a path that is not a regular file

# Docker SDK calls block; they get their own threads. asyncio's default pool (cores + 4 threads)
# is shared with everything else, and under load container starts, removals and file copies
# queued behind each other there (measured: setup 6.8 s vs 0.8 s with a thread per call).
_DOCKER_THREADS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="corral-docker")


async def _blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking docker SDK call on the docker thread pool."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_DOCKER_THREADS, functools.partial(fn, *args, **kwargs))

LABEL_RUN = "corral.run"
LABEL_ENV = "corral.env"
LABEL_OWNER = "corral.owner"  # host:pid of the creating process, so gc spares live runs
LABEL_OWNER_START = "corral.owner_start"  # its start time: a reused pid is not the owner
_MAX_LINK_HOPS = 40  # as the kernel's MAXSYMLINKS
_TAR_OVERHEAD = 64 << 10  # a one-file tar: headers (a long name, PAX records) and padding
EXEC_MARKER = "CORRAL_EXEC"  # set in every exec on a remote host, for its timeout kill
HEAD_TIMEOUT_S = 30.0  # a daemon that accepts a request and never answers it is given up on
# on a remote host: SIGKILL the processes carrying exec marker $1, all of them when $2 is 1,
# else all but the exec's own process (the oldest: a shell survives its command's timeout)
_REMOTE_KILL = ('pids=$(grep -lxz "$0=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | '
                'sort -n); [ "$2" = 1 ] || pids=$(echo "$pids" | tail -n +2); '
                '[ -z "$pids" ] || kill -9 $pids 2>/dev/null; true')
# inside a container: SIGKILL every process but pid 1 (tini), the container's main process (the
# child of pid 1 that started first: later ones are orphans it adopted; its pid is not 2, as
# tini's start uses a few) and the killer itself. /proc/PID/stat after "comm) ": $2 is the
# ppid, $20 the start time.
_INSIDE_KILL = ('main=; since=; for d in /proc/[0-9]*; do p=${d#/proc/}; '
                'stat=$(sed "s/^.*) //" "$d/stat" 2>/dev/null) || continue; set -- $stat; '
                '[ "$2" = 1 ] || continue; if [ -z "$since" ] || [ "${20}" -lt "$since" ] || '
                '{ [ "${20}" = "$since" ] && [ "$p" -lt "$main" ]; }; then since=${20}; main=$p; '
                'fi; done; for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" -gt 1 ] && '
                '[ "$p" != "$main" ] && [ "$p" != $$ ] && kill -9 "$p" 2>/dev/null; done; true')
CAP_ADD = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL",
           "NET_BIND_SERVICE"]
# how long a shell asked of the container's main process may take to show up before a Docker
# exec stands in (it takes milliseconds; the main process may be gone or stuck)
REQUESTED_SHELL_S = 2.0


def _socket_path() -> str:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        raise SandboxError(f"DOCKER_HOST={host}: the docker backend needs a local daemon on a "
                           "unix socket (timeouts are enforced from the host)")
    return host[len("unix://"):]


_dialers: set[asyncio.subprocess.Process] = set()  # ssh dial-stdio processes being reaped


async def _connect(host: DockerHost) -> tuple[asyncio.StreamReader, Any]:
    """A raw stream to `host`'s API: its unix socket, its TCP port, or `ssh HOST docker system
    dial-stdio` (what the docker CLI runs for ssh:// hosts)."""
    url = urlsplit(host.url)
    if url.scheme == "unix":
        return await asyncio.open_unix_connection(
            _socket_path() if host.implicit else host.socket_path, limit=1 << 20)
    if url.scheme == "tcp":
        return await asyncio.open_connection(url.hostname, url.port or 2375, limit=1 << 20)
    proc = await asyncio.create_subprocess_exec(
        *ssh_command(host.url), limit=1 << 20,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    _dialers.add(proc)  # it exits once its stdin closes; wait() reaps it
    asyncio.ensure_future(proc.wait()).add_done_callback(lambda _: _dialers.discard(proc))
    assert proc.stdout is not None and proc.stdin is not None
    return proc.stdout, proc.stdin


async def _http(host: DockerHost, method: str, path: str, body: Any, upgrade: bool = False
                ) -> tuple[int, bytes, asyncio.StreamReader, Any]:
    """One HTTP/1.1 request to `host`'s daemon; returns status, head and the open stream.
    A daemon that refuses or does not answer within `HEAD_TIMEOUT_S` raises SandboxDied (and
    a fleet host is marked down)."""
    writer = None
    try:
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            reader, writer = await _connect(host)
            data = json.dumps(body).encode()
            conn = "Upgrade\r\nUpgrade: tcp" if upgrade else "close"
            writer.write(f"{method} {path} HTTP/1.1\r\nHost: docker\r\nContent-Type: "
                         f"application/json\r\nContent-Length: {len(data)}\r\nConnection: "
                         f"{conn}\r\n\r\n".encode() + data)
            head = await reader.readuntil(b"\r\n\r\n")
    except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
        if writer is not None:
            writer.close()
        cause = reason(exc)
        host.mark_down(cause)
        raise SandboxDied(f"the Docker daemon at {host.url} does not answer ({cause})") from exc
    status = int(head.split(b" ", 2)[1])
    return status, head, reader, writer


class DockerTransport(Transport):
    """An attached exec: demultiplexes Docker's 8-byte-header frames into `frames`."""

    def __init__(self, exec_id: str, reader: asyncio.StreamReader, writer: Any,
                 host: DockerHost, marker: str | None = None) -> None:
        super().__init__()
        self.exec_id, self._reader, self._writer = exec_id, reader, writer
        self.host, self.marker = host, marker  # marker: the exec's CORRAL_EXEC (remote hosts)
        self._pid: int | None = None
        self._pump = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                header = await self._reader.readexactly(8)
                data = await self._reader.readexactly(int.from_bytes(header[4:], "big"))
                await self.frames.put((header[0] or 1, data))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        await self.frames.put((0, b""))

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def host_pid(self) -> int | None:
        if not self.host.local:
            return None  # a pid on another machine: nothing here may signal it
        for _ in range(50):  # just after the start the daemon may not know the pid yet
            if self._pid is not None:
                break
            info = await _blocking(self.host.call, lambda c: c.api.exec_inspect(self.exec_id))
            self._pid = info.get("Pid") or None
            if self._pid is None:
                if not info.get("Running"):
                    break  # ended before it was seen: nothing to signal
                await asyncio.sleep(0.01)
        return self._pid

    async def close(self) -> None:
        self._pump.cancel()
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, OSError):
            pass


class DockerSandbox(Sandbox):
    """A Terminal sandbox in a Docker container (see module docstring)."""

    backend = "docker"

    def __init__(self, container_id: str, spec: Terminal, user: str, workdir: str,
                 io_dir: Path, host: DockerHost | None = None) -> None:
        super().__init__()
        # `user`: the agent's (spec.user, else the image's USER; "" = root). The container
        # itself runs as root, so every exec names its user.
        self.id, self.spec, self.user, self.workdir = container_id, spec, user, workdir
        self.host = host or default_host()
        self.placement: Any = None  # the fleet slot it holds (`fleet.Placement`), if any
        self._version = self.host.client().api._version
        self._shell: ShellSession | None = None
        self._control: ShellSession | None = None  # root bash for file writes, never the agent's
        self._io_dir = io_dir  # the FIFOs of the shells the container starts (`_fifo`)
        # session name -> the FIFO set its shell was started on, until a session takes it
        self._fifo_shells: dict[str, str] = {}
        self._fifo_ok = False  # the container starts shells on FIFOs (`_fifo.usable`)
        self._cgroup_seen = False  # its processes are visible here (so `alive` can look)
        self._upper: str | None = None  # its writable layer on the host ("" = not visible)
        self._root: RootDir | None = None  # its "/" for host-side file I/O (`_host_root`)
        self._closed = False

    @classmethod
    async def create(cls, spec: Terminal, *, image: str | None = None, run_id: str = "adhoc",
                     env_id: str = "", name: str | None = None,
                     host: DockerHost | None = None) -> "DockerSandbox":
        """Create and start a container for `spec` (image: a resolved tag, default spec.image)
        on `host` (default: the single daemon of `DOCKER_HOST`, else the local socket)."""
        import docker

        host = host or default_host()
        if host.implicit:
            _socket_path()
        image = image or spec.image
        user = spec.user or ""
        workdir = spec.workdir
        if not _is_root(user) and workdir == "/root":
            workdir = f"/home/{user}"  # /root is not readable by other users
        # a restarting daemon is waited for (bounded), not failed at once
        client = await _blocking(host.call, lambda c: c)
        host_config = client.api.create_host_config(
            init=True, nano_cpus=int(spec.cpus * 1e9), mem_limit=spec.memory,
            memswap_limit=spec.memory, pids_limit=spec.pids,
            network_mode="host" if spec.network_mode == "host-loopback" else spec.network_mode,
            cap_drop=["ALL"], cap_add=CAP_ADD, security_opt=["no-new-privileges"],
            storage_opt={"size": spec.disk} if spec.disk else None)
        name = name or f"corral-{secrets.token_hex(6)}"
        io_dir = io_root() / name
        t0 = time.monotonic()
        created = None
        sent: list[bool] = []  # whether a create call reached out to the daemon
        try:
            agent = user or await _image_user(host, image)
            # the container starts the control shell, and a root agent's shell, itself (on a
            # local daemon: the pipes are files of this machine)
            shells = () if not host.local else _fifo.SHELLS if _is_root(agent) else ("control",)
            if shells:
                _fifo.make_fifos(io_dir, shells)
                host_config["Binds"] = [f"{io_dir}:{_fifo.MOUNT}:ro"]
            # the low-level call: the high-level `containers.create` inspects the new container
            # afterwards, one more daemon round trip per sandbox that nothing here needs
            def create_container(c: Any) -> dict[str, Any]:
                if sent:  # a repeat after the daemon went away mid-call: the first call
                    _remove(c, name)  # may have created the container before it did
                sent.append(True)
                return c.api.create_container(
                    image=image, command=["sh", "-c", _fifo.BOOT], detach=True, name=name,
                    hostname="sandbox",
                    labels={LABEL_MANAGED: "1", LABEL_RUN: run_id, LABEL_ENV: env_id,
                            LABEL_OWNER: f"{socket.gethostname()}:{os.getpid()}",
                            LABEL_OWNER_START: str(_procs.own_start())},
                    environment=dict(spec.env), working_dir=workdir, user="0",
                    stop_signal="SIGKILL", host_config=host_config)

            created = await _blocking(host.call, create_container)
        except docker.errors.ImageNotFound:
            raise missing_image(image, spec.dockerfile, env_id or None) from None
        except docker.errors.APIError as exc:
            if spec.disk and "storage-opt" in str(exc):
                raise SandboxError(f"disk={spec.disk} needs overlay2 on xfs with pquota: "
                                   f"{exc.explanation}") from exc
            raise SandboxError(f"cannot create a container from {image}: "
                               f"{exc.explanation}") from exc
        finally:
            if created is None:  # no container owns the pipes
                _fifo.remove_fifos(io_dir)
                if sent:  # a daemon shutting down may make it and still answer an error
                    await _blocking(_discard, host, name)
        sandbox = cls(created["Id"], spec, agent, workdir, io_dir, host)
        try:
            if spec.files:
                files = _tar({path: text.encode() for path, text in spec.files.items()})
                await _blocking(host.call, lambda c: c.api.put_archive(sandbox.id, "/", files))
            await _blocking(host.call, lambda c: c.api.start(sandbox.id))
            if shells and await _blocking(_fifo.usable, sandbox.id, io_dir, "control"):
                sandbox._fifo_shells = {shell: shell for shell in shells}
                sandbox._fifo_ok = True
            sandbox._cgroup_seen = _procs.container_pids(sandbox.id) is not None
            if sandbox._cgroup_seen:
                sandbox._root = await _blocking(_host_root, sandbox.id)
            if not _is_root(agent):  # as on bwrap: refused now, not at every command
                passwd_entry((await sandbox.read_file("/etc/passwd")).decode(errors="replace"),
                             agent)
        except BaseException:
            await sandbox.close()
            raise
        sandbox.stats.started_at = t0
        sandbox.stats.start_seconds = time.monotonic() - t0
        log.debug("started %s (%s) in %.3fs", sandbox.id[:12], image, sandbox.stats.start_seconds)
        return sandbox

    # --- processes ------------------------------------------------------------------------
    async def _spawn(self, argv: list[str], *, env: Mapping[str, str] | None = None,
                     cwd: str | None = None, user: str | None = None,
                     stdin: bool = False) -> DockerTransport:
        if self._closed:
            raise SandboxDied(f"sandbox {self.id[:12]} is closed")
        variables = [f"{k}={v}" for k, v in (env or {}).items()]
        marker = None if self.host.local else secrets.token_hex(8)
        if marker is not None:
            variables.append(f"{EXEC_MARKER}={marker}")
        config = {"AttachStdin": stdin, "AttachStdout": True, "AttachStderr": True,
                  "Tty": False, "Cmd": argv, "Env": variables,
                  "WorkingDir": cwd or "", "User": self.user if user is None else user}
        status, head, reader, writer = await _http(
            self.host, "POST", f"/v{self._version}/containers/{self.id}/exec", config)
        body = await reader.read()
        writer.close()
        if status != 201:
            msg = json.loads(body or b"{}").get("message", head.decode(errors="replace"))
            raise SandboxDied(f"sandbox {self.id[:12]} cannot run commands: {msg}")
        exec_id = json.loads(body)["Id"]
        status, head, reader, writer = await _http(
            self.host, "POST", f"/v{self._version}/exec/{exec_id}/start",
            {"Detach": False, "Tty": False}, upgrade=True)
        if status not in (101, 200):
            writer.close()
            raise SandboxDied(f"sandbox {self.id[:12]}: exec start failed with HTTP {status}")
        return DockerTransport(exec_id, reader, writer, self.host, marker)

    async def _kill(self, transport: Transport, keep: frozenset[int], everything: bool) -> None:
        marker = getattr(transport, "marker", None)
        if marker is not None:  # a remote host: kill from inside the container
            await self._kill_marked(marker, everything)
            return
        pid = await transport.host_pid()
        if pid is None:
            return
        await _blocking(_procs.kill_tree, pid, keep, everything,
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

    async def exec(self, cmd: str | list[str], timeout: float | None = None,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   user: str | None = None) -> ExecResult:
        """Run one command; a string runs under `bash -lc`. See `Sandbox.exec`."""
        argv = ["bash", "-lc", cmd] if isinstance(cmd, str) else list(cmd)
        timeout = self.spec.command_timeout if timeout is None else timeout
        if _is_root(self.user if user is None else user) and not self._control_session().busy:
            result = await self._exec_in_control(argv, timeout, env, cwd)
        else:
            result = await run_command(lambda a: self._spawn(a, env=env, cwd=cwd, user=user),
                                       argv, timeout, self.spec.output_limit, self._kill)
        await self._check_vanished(result)
        self.stats.commands += 1
        self.stats.exec_seconds += result.duration
        return result

    async def start_process(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                            cwd: str | None = None, user: str | None = None) -> Process:
        """See `Sandbox.start_process`."""
        # through `sh -c 'exec "$@"'` (the same pid once it runs): a program that cannot start
        # is sh's one line on stderr and exit 127, as on bwrap, not the runtime's error text
        # on stdout, where a protocol client would read it as the server's first message
        transport = await self._spawn(["sh", "-c", 'exec "$@"', "sh", *argv], env=env, cwd=cwd,
                                      user=user, stdin=True)
        await transport.host_pid()  # asked while it runs: close() needs it after it exited
        return StreamProcess(transport, self._kill)

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

        return _DockerShell(self, spawn, self._kill, limit, timeout, cwd)

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
            info = await _blocking(self.host.call, lambda c: c.api.inspect_container(self.id))
        except (SandboxUnavailable, docker.errors.NotFound):
            return True
        return not (info.get("State") or {}).get("Running")

    # --- files ----------------------------------------------------------------------------
    async def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        """Create or replace the regular file `path` (missing parents are created), owned by
        root. Where the container's root is reachable from here (`_host_root`) the host writes
        it directly, refusing what bwrap refuses (a directory, a FIFO, procfs: OSError);
        otherwise the control shell or the daemon's archive API does, after the same check
        that an existing `path` is a regular file."""
        raw = data.encode() if isinstance(data, str) else data
        path = "/" + path.lstrip("/")
        self._check_open()
        if self._root is not None:
            return await asyncio.to_thread(self._root.write, path, raw, mode)
        if len(raw) <= INLINE_WRITE_LIMIT and await self._write_inline(path, raw, mode):
            return
        await self._check_regular(path)  # the archive API would replace a directory
        await _blocking(self.host.call,
                        lambda c: c.api.put_archive(self.id, "/", _tar({path: raw}, mode)))

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxDied(f"sandbox {self.id[:12]} is closed")

    async def _check_regular(self, path: str) -> None:
        """OSError unless `path` is missing or a regular file (a link to one is fine)."""
        file = shlex.quote(path)
        result = await self._control_session().run(f"[ ! -e {file} ] || [ -f {file} ]")
        if not result.ok:
            raise OSError(errno.EINVAL, "not a regular file", path)

    async def _write_inline(self, path: str, raw: bytes, mode: int) -> bool:
        """Write through the control shell; False when that did not work (no `base64` in the
        image, a path the shell cannot create): the archive API then does it or says why.
        OSError where `path` exists and is not a regular file (`>` would block on a FIFO).

        The usual case (no NUL byte, the parent exists, a new file of mode 644) starts no
        process: bash's own `printf` writes the bytes. Each process started in a busy
        container costs milliseconds, and setup writes several files per episode."""
        file, parent = shlex.quote(path), shlex.quote(posixpath.dirname(path))
        if b"\0" in raw:  # bash strings end at NUL: decode it with base64 instead
            body = f"printf %s '{base64.b64encode(raw).decode()}' | base64 -d > {file}"
        else:
            body = f"printf %s {ansi_c_quote(raw)} > {file}"
        # an existing file keeps its old mode through `>`, a new one gets 644 (umask 022)
        # (a subshell's `exit` sets the status without ending the control shell)
        command = (f"if [ -e {file} ] && [ ! -f {file} ]; then (exit {_NOT_REGULAR}); else "
                   f"umask 022; {{ [ -d {parent} ] || mkdir -p -- {parent}; }} && "
                   f"{{ [ -e {file} ] && __corral_chmod=1 || __corral_chmod="
                   f"{int(mode != 0o644)}; }} && {body} && "
                   f"{{ [ $__corral_chmod = 0 ] || chmod {mode:o} -- {file}; }}; fi")
        result = await self._control_session().run(command)
        if result.exit_code == _NOT_REGULAR:
            raise OSError(errno.EINVAL, "not a regular file", path)
        if not result.ok:
            log.debug("inline write of %s failed (%s); using the archive API", path,
                      result.output.strip()[:200])
        return result.ok

    async def read_file(self, path: str) -> bytes:
        """Return the bytes of `path`; FileNotFoundError / IsADirectoryError as for open().
        Read from the host where the container's root is reachable (`_host_root`), refusing
        what bwrap refuses (procfs, a FIFO: OSError), else through the daemon's archive API.
        OutputTooLarge past `spec.read_limit` bytes, either way."""
        import docker

        self._check_open()
        limit = self.spec.read_limit
        if self._root is not None:
            return await asyncio.to_thread(self._root.read, path, limit)

        def fetch(where: str) -> bytes:
            for _ in range(_MAX_LINK_HOPS):
                try:
                    tar_bytes, stat = self.host.call(
                        lambda c: _get_archive(c, self.id, where, limit))
                except docker.errors.NotFound:
                    raise FileNotFoundError(path) from None
                if stat.get("mode", 0) & (1 << 31):  # Go's os.ModeDir
                    raise IsADirectoryError(path)
                with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
                    member = tar.next()
                    if member is not None and member.issym():
                        # the archive holds the link itself: follow it in the container's root
                        where = posixpath.join(posixpath.dirname(where), member.linkname)
                        continue
                    fobj = tar.extractfile(member) if member else None
                    if fobj is None:
                        raise FileNotFoundError(path)
                    return fobj.read()
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)

        return await _blocking(fetch, "/" + path.lstrip("/"))

    # --- lifecycle ------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """Not closed, and its processes still run where they can be seen: a daemon restart
        kills every container, and a pool must not hand such a sandbox out."""
        if self._closed:
            return False
        return not self._cgroup_seen or bool(_procs.container_pids(self.id))

    async def terminate(self) -> None:
        """Kill every process of the container from the host (its cgroup), without the daemon:
        removing the container (`close`) can then wait for a quiet moment, since under load
        each removal slows the daemon's container starts by about 0.1 s."""
        import docker

        await self._close_sessions()
        if await _blocking(_procs.kill_container, self.id):
            return
        try:  # its cgroup is not visible from here: the daemon kills it
            await _blocking(self.host.call, lambda c: c.api.kill(self.id))
        except docker.errors.APIError as exc:  # not running any more; close() removes it
            log.debug("kill %s: %s", self.id[:12], exc)
        except Exception as exc:  # the daemon is restarting (it stops every container);
            if not daemon_unreachable(exc):  # close() waits for it and removes this one
                raise
            log.debug("kill %s: %s", self.id[:12], exc)

    # --- the verify phase -----------------------------------------------------------------
    async def process_keys(self) -> frozenset[tuple[int, int]] | None:
        """See `Sandbox.process_keys` (the container's cgroup, read on the host)."""
        pids = _procs.container_pids(self.id)
        return None if pids is None else frozenset(filter(None, map(_procs.process_key, pids)))

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
            await self.exec(["sh", "-c", _INSIDE_KILL], timeout=30, user="0")
            return 0
        lifelines = _procs.init_and_first_child(filter(None, map(_procs.process_key, pids)))
        killed = await _blocking(_procs.kill_all, lambda: _procs.container_pids(self.id) or [],
                                 frozenset(set(spare) | lifelines))
        if self._fifo_ok:
            await _blocking(self._request_control, lifelines)
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

    async def recreate_dirs(self, dirs: Sequence[str], remove: Sequence[str] = ()) -> bool:
        """See `Sandbox.recreate_dirs`: where the container's root is reachable from here
        (`_host_root`)."""
        if self._root is None or self._closed:
            return False
        await asyncio.to_thread(self._root.recreate_dirs, dirs, remove)
        return True

    async def changed_since(self, since: float) -> list[str] | None:
        """See `Sandbox.changed_since` (the container's overlay2 upper dir)."""
        upper = _changes.exists(await self._writable_layer())
        return None if upper is None else await _blocking(_changes.changed_since, upper, since)

    async def _writable_layer(self) -> str:
        """The container's overlay2 upper dir as the daemon names it ("" if it names none);
        asked once."""
        if self._upper is None:
            info = await _blocking(self.host.call, lambda c: c.api.inspect_container(self.id))
            self._upper = (info.get("GraphDriver") or {}).get("Data", {}).get("UpperDir") or ""
        return self._upper

    async def _close_sessions(self) -> None:
        """End both shells (their process trees die with them)."""
        for session in (self._shell, self._control):
            if session is None:
                continue
            try:
                await session.close()
            except Exception:  # the container may already be gone; what follows matters
                log.debug("shell close failed", exc_info=True)

    async def close(self) -> None:
        """Remove the container (force). Idempotent. On a fleet host that is down, the removal
        is left for when it answers again (`DockerHost.pending_removal`)."""
        if self._closed:
            return
        self._closed = True
        if self._root is not None:
            self._root.close()
        try:
            await self._close_sessions()
            await self._remove_container()
        finally:
            if self.placement is not None:
                self.placement.release()
            _fifo.remove_fifos(self._io_dir)

    async def _remove_container(self) -> None:
        import docker

        remove = functools.partial(self.host.call, lambda c: _remove(c, self.id))
        try:  # a restarting daemon is waited for: a removal given up on leaks the container
            await _blocking(remove)
        except docker.errors.APIError as exc:
            if not exc.is_server_error():
                raise
            # a daemon shutting down answers 5xx until its socket goes; then it is waited for
            await asyncio.sleep(1.0)
            await _blocking(remove)
        except SandboxUnavailable:  # a fleet host went down: removed when it is back
            self.host.pending_removal.add(self.id)
            log.warning("sandbox %s: its host %s is down; it is removed when the host answers "
                        "again", self.id[:12], self.host.url)


class _DockerShell(ShellSession):
    """A Docker sandbox's persistent bash: a command cut off because the container is gone
    raises SandboxDied (see `DockerSandbox._check_vanished`)."""

    def __init__(self, sandbox: DockerSandbox, *args: Any) -> None:
        super().__init__(*args)
        self._sandbox = sandbox

    async def run(self, command: str, timeout: float | None = None) -> ExecResult:
        result = await super().run(command, timeout)
        await self._sandbox._check_vanished(result)
        return result


def _get_archive(client: Any, container: str, path: str,
                 limit: int | None = None) -> tuple[bytes, dict[str, Any]]:
    """The tar of `path` in `container` and its stat, the response read whole and closed
    (`OutputTooLarge` for a file over `limit` bytes, by its stat and as it streams). Not
    the SDK's `get_archive`: its stream ties the response to its socket (`sock._response`), and
    on an ssh:// host that cycle holds a running `ssh` Popen, which `subprocess` keeps alive
    when collected: one ssh session left open per read, for the life of the process."""
    import docker

    api = client.api
    res = api._get(api._url("/containers/{0}/archive", container), params={"path": path},
                   stream=True, headers={"Accept-Encoding": "identity"})
    try:
        api._raise_for_status(res)
        stat = res.headers.get("x-docker-container-path-stat")
        info = docker.utils.decode_json_header(stat) if stat else {}
        check_size(path, int(info.get("size", 0)), limit)
        chunks, size = [], 0
        bound = None if limit is None else limit + _TAR_OVERHEAD
        for chunk in res.iter_content(1 << 20):
            size += len(chunk)
            check_size(path, size, bound)
            chunks.append(chunk)
        return b"".join(chunks), info
    finally:
        res.close()


def _host_root(container_id: str) -> RootDir | None:
    """The container's "/" held open for host-side file I/O (`_rootio`: every path resolved
    inside it by the kernel), where its init runs on this machine without user-namespace
    remapping (so its root is this host's root, as the FIFO shells also need) and the kernel
    has openat2; None elsewhere."""
    init = next((p for p in _procs.container_pids(container_id) or []
                 if _procs.inner_pid(p) == 1), None)
    if init is None or not openat2_supported():
        return None
    try:
        return RootDir(init, (0, 0)) if _procs.unmapped(init) else None
    except OSError:
        return None


def _remove(client: Any, container: str) -> None:
    """Remove `container` (force) if it exists."""
    import docker

    try:
        client.api.remove_container(container, force=True)
    except docker.errors.NotFound:
        pass


def _discard(host: DockerHost, container: str) -> None:
    """Best-effort removal of a container this process may have created without knowing it.
    On the failover path, so bounded: a fleet host that is down is not asked (the removal
    waits for it to answer again, `pending_removal`), and one that is up is given its health
    timeout, not the 30 s of a call."""
    if not host.implicit and host.state == "down":
        host.pending_removal.add(container)
        log.info("%s is removed when %s answers again", container, host.url)
        return
    try:
        if host.implicit:
            host.call(lambda c: _remove(c, container))
        else:
            host.quick(lambda api: _remove_api(api, container))
    except Exception as exc:  # the reaper removes it later (its owner label names us)
        if isinstance(exc, SandboxUnavailable) or unreachable(exc):
            host.pending_removal.add(container)
        log.warning("could not remove %s after a failed create: %s", container, exc)


def _remove_api(api: Any, container: str) -> None:
    import docker

    try:
        api.remove_container(container, force=True)
    except docker.errors.NotFound:
        pass


def io_root() -> Path:
    """Where the FIFO directories of local containers' shells live ($CORRAL_CACHE/docker-io)."""
    return cache_dir() / "docker-io"


_image_users: dict[str, str] = {}


async def _image_user(host: DockerHost, image: str) -> str:
    """The image's default USER (`""` = root), read once per image per process (Corral's
    image tags name their content, so a tag does not move under a running process, nor
    differs between hosts)."""
    if image not in _image_users:
        info = await _blocking(host.call, lambda c: c.api.inspect_image(image))
        _image_users[image] = info.get("Config", {}).get("User") or ""
    return _image_users[image]


def _is_root(user: str) -> bool:
    """Whether a container user spec (`user[:group]`, `""` = root) means root."""
    return user.split(":", 1)[0] in ("", "root", "0")


def _tar(files: Mapping[str, bytes], mode: int = 0o644) -> bytes:
    """An in-memory tar of absolute paths, without directory entries (the daemon creates
    missing parents; existing directories keep their owner and mode)."""
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), mode, now
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class DockerConfig(BackendConfig):
    """Options of the docker backend (the sandbox's limits are its spec's).

    `hosts`: the daemons to place sandboxes on (`DockerHostConfig`s, or URL strings as in
    `CORRAL_DOCKER_HOSTS`: `URL[?capacity=N&rate=R&burst=B]`); empty: `CORRAL_DOCKER_HOSTS`,
    else the one daemon of `DOCKER_HOST` or the local socket. `health_timeout`: seconds a
    health check waits for a ping; `call_timeout`: for any other daemon call (fleet hosts)."""

    hosts: tuple[DockerHostConfig, ...] = ()
    health_timeout: float = Field(3.0, gt=0)
    call_timeout: float = Field(30.0, gt=0)

    @field_validator("hosts", mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_hosts(value, "DockerConfig.hosts")
        return tuple(parse_hosts(v, "DockerConfig.hosts")[0] if isinstance(v, str) else v
                     for v in value)


class DockerBackend(ImageBackend):
    """The `docker` row of the backend table: a container per sandbox, placed on a host of
    its fleet (`fleet.py`)."""

    name = "docker"
    sandbox_class = DockerSandbox

    def __init__(self, config: BackendConfig | None = None, *, run_id: str = "adhoc") -> None:
        config = config if isinstance(config, DockerConfig) else DockerConfig()
        super().__init__(config, run_id=run_id)
        self.fleet = DockerFleet.from_configs(config.hosts or configured_hosts(),
                                              health_timeout=config.health_timeout,
                                              call_timeout=config.call_timeout)

    @classmethod
    def available(cls) -> bool:
        return bool(configured_hosts()) or docker_available()

    async def image_for(self, spec: Terminal, env_id: str, build: bool) -> str:
        """The tag to start: on a fleet, one some host holds already (copied to the placed
        host on demand) or, failing that, one the local daemon has or builds."""
        if not self.fleet.hosts[0].implicit:
            await self.fleet.health()  # holders are looked for among the hosts that are up
            tag = spec.image if not spec.dockerfile else await _blocking(
                image_tag, spec.dockerfile)
            if await _blocking(self.fleet.holder, tag) is not None:
                return tag
        return await super().image_for(spec, env_id, build)

    async def open(self, spec: Any, *, env_id: str = "", image: str | None = None,
                   build: bool = True) -> DockerSandbox:
        """Start a container for `spec` on the best host of the fleet (see `DockerFleet`)."""
        if not isinstance(spec, Terminal):
            raise SandboxError(f"the {self.name} backend opens Terminal specs, not {spec.kind}")
        image = image or await self.image_for(spec, env_id, build)
        return await self.fleet.open(image, lambda host: DockerSandbox.create(
            spec, image=image, run_id=self.run_id, env_id=env_id, host=host))
