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

Forks and snapshots (`_dockerfork`): the container is committed to an image (paused meanwhile)
and children start from it on the same host with the parent's spec and agent user.

The backend's jobs, one module each: the Engine-API HTTP client and the SDK's thread pool
(`_engine`), a container's lifecycle, labels and committed images (`containers`), file I/O
(`_dockerfiles`), process killing (`_dockerkill`), the shells (`_dockershells`), forks
(`_dockerfork`); this module joins them into `DockerSandbox` and the backend's table row.

Hosts: a sandbox lives on one daemon of the backend's fleet (`fleet.py`: several daemons, each
with a capacity, a creation-rate limit and health checks). On a remote daemon (`tcp://`,
`ssh://`) its processes are out of the host's reach: shells are Docker execs, and a command's
timeout kills, from inside the container, the processes carrying its exec's marker variable
(`CORRAL_EXEC`; a shell's earlier background jobs die with it there).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from pydantic import Field, field_validator

from ..errors import SandboxDied, SandboxError, SandboxUnavailable
from . import _changes, _fifo, _procs
from . import _dockerfork
from ._dockerfiles import DockerFiles, host_root
from ._dockerfork import DockerForks
from ._dockerkill import DockerKills
from ._dockershells import DockerShells
from ._engine import blocking, socket_path, spawn_exec
from ._proto import ShellSession, StreamProcess, Transport, run_command
from ._rootio import RootDir
from .base import BackendConfig, ExecResult, Process, Sandbox
from .containers import create_container, io_root, is_root, remove, tar
from .image_backend import ImageBackend
from .fleet import (DockerFleet, DockerHost, DockerHostConfig, configured_hosts, default_host,
                    parse_hosts, shared_host)
from .builds import image_tag
from .daemon import docker_available
from .rootfs import passwd_entry
from .snapshot import SandboxSnapshot
from .spec import Terminal

__all__ = ["DockerBackend", "DockerConfig", "DockerSandbox"]

log = logging.getLogger(__name__)



class DockerSandbox(DockerShells, DockerFiles, DockerKills, DockerForks, Sandbox):
    """A Terminal sandbox in a Docker container (see module docstring)."""

    backend = "docker"
    can_fork = True

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
        self._root: RootDir | None = None  # its "/" for host-side file I/O (`host_root`)
        self.image, self.run_id, self.env_id = "", "adhoc", ""  # what it was created with
        self.inherited: dict[str, float] = {}  # a fork's: paths changed before, and when
        self.forked_from = ""  # the committed image it started from, if a fork's
        self._closed = False

    @classmethod
    async def create(cls, spec: Terminal, *, image: str | None = None, run_id: str = "adhoc",
                     env_id: str = "", name: str | None = None,
                     host: DockerHost | None = None, user: str | None = None,
                     restored: bool = False) -> "DockerSandbox":
        """Create and start a container for `spec` (image: a resolved tag, default spec.image)
        on `host` (default: the single daemon of `DOCKER_HOST`, else the local socket).
        `user`: the agent's user when it is not the spec's or the image's (a committed image
        names root); `restored`: the image is a snapshot, which holds the spec's files."""
        host = host or default_host()
        if host.implicit:
            socket_path()
        image = image or spec.image
        user = (spec.user or "") if user is None else user
        workdir = spec.workdir
        if not is_root(user) and workdir == "/root":
            workdir = f"/home/{user}"  # /root is not readable by other users
        name = name or f"corral-{secrets.token_hex(6)}"
        io_dir = io_root() / name
        t0 = time.monotonic()
        container, agent, shells = await create_container(
            host, spec, image, name=name, run_id=run_id, env_id=env_id, user=user,
            workdir=workdir, io_dir=io_dir)
        sandbox = cls(container, spec, agent, workdir, io_dir, host)
        sandbox.image, sandbox.run_id, sandbox.env_id = image, run_id, env_id
        try:
            if spec.files and not restored:
                files = tar({path: text.encode() for path, text in spec.files.items()})
                await blocking(host.call, lambda c: c.api.put_archive(sandbox.id, "/", files))
            await blocking(host.call, lambda c: c.api.start(sandbox.id))
            if shells and await blocking(_fifo.usable, sandbox.id, io_dir, "control"):
                sandbox._fifo_shells = {shell: shell for shell in shells}
                sandbox._fifo_ok = True
            sandbox._cgroup_seen = _procs.container_pids(sandbox.id) is not None
            if sandbox._cgroup_seen:
                sandbox._root = await blocking(host_root, sandbox.id)
            if not is_root(agent):  # as on bwrap: refused now, not at every command
                passwd_entry((await sandbox.read_file("/etc/passwd")).decode(errors="replace"),
                             agent)
        except BaseException:
            await sandbox.close()
            raise
        sandbox.stats.started_at = t0
        sandbox.stats.start_seconds = time.monotonic() - t0
        log.debug("started %s (%s) in %.3fs", sandbox.id[:12], image, sandbox.stats.start_seconds)
        return sandbox

    @classmethod
    async def restore_on(cls, host: DockerHost, snapshot: SandboxSnapshot, run_id: str,
                         env_id: str) -> "DockerSandbox":
        """A container on `host` started from `snapshot`'s committed image, with the spec and
        agent user of the sandbox it was committed from."""
        image = snapshot.ref
        _dockerfork.use(image)  # before the start: a discard meanwhile must wait for it
        try:
            sandbox = await cls.create(Terminal(**snapshot.spec), image=image, run_id=run_id,
                                       env_id=env_id, host=host, user=snapshot.extra["user"],
                                       restored=True)
        except BaseException:
            await _dockerfork.unuse(host, image)
            raise
        sandbox.forked_from = image
        sandbox.inherited = await asyncio.to_thread(_dockerfork.read_changes, image)
        return sandbox

    # --- processes ------------------------------------------------------------------------
    async def _spawn(self, argv: list[str], *, env: Mapping[str, str] | None = None,
                     cwd: str | None = None, user: str | None = None,
                     stdin: bool = False) -> Transport:
        if self._closed:
            raise SandboxDied(f"sandbox {self.id[:12]} is closed")
        return await spawn_exec(self.host, self._version, self.id, argv, env=env, cwd=cwd,
                                user=self.user if user is None else user, stdin=stdin)

    async def exec(self, cmd: str | list[str], timeout: float | None = None,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   user: str | None = None) -> ExecResult:
        """Run one command; a string runs under `bash -lc`. See `Sandbox.exec`."""
        argv = ["bash", "-lc", cmd] if isinstance(cmd, str) else list(cmd)
        timeout = self.spec.command_timeout if timeout is None else timeout
        if is_root(self.user if user is None else user) and not self._control_session().busy:
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

    # --- lifecycle ------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """Not closed, and its processes still run where they can be seen: a daemon restart
        kills every container, and a pool must not hand such a sandbox out."""
        if self._closed:
            return False
        return not self._cgroup_seen or bool(_procs.container_pids(self.id))

    async def changed_since(self, since: float) -> list[str] | None:
        """See `Sandbox.changed_since` (the container's overlay2 upper dir, and for a fork
        what changed before it: `inherited`)."""
        upper = _changes.exists(await self._writable_layer())
        if upper is None:
            return None
        found = await blocking(_changes.changed_since, upper, since)
        inherited = [path for path, ctime in self.inherited.items() if ctime > since]
        return sorted({*found, *inherited}) if inherited else found

    async def _writable_layer(self) -> str:
        """The container's overlay2 upper dir as the daemon names it ("" if it names none);
        asked once."""
        if self._upper is None:
            info = await blocking(self.host.call, lambda c: c.api.inspect_container(self.id))
            self._upper = (info.get("GraphDriver") or {}).get("Data", {}).get("UpperDir") or ""
        return self._upper

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
            if self.forked_from:
                await _dockerfork.unuse(self.host, self.forked_from)

    async def _remove_container(self) -> None:
        import docker

        removal = functools.partial(self.host.call, lambda c: remove(c, self.id))
        try:  # a restarting daemon is waited for: a removal given up on leaks the container
            await blocking(removal)
        except docker.errors.APIError as exc:
            if not exc.is_server_error():
                raise
            # a daemon shutting down answers 5xx until its socket goes; then it is waited for
            await asyncio.sleep(1.0)
            await blocking(removal)
        except SandboxUnavailable:  # a fleet host went down: removed when it is back
            self.host.pending_removal.add(self.id)
            log.warning("sandbox %s: its host %s is down; it is removed when the host answers "
                        "again", self.id[:12], self.host.url)



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
    can_fork = True

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
            tag = spec.image if not spec.dockerfile else await blocking(
                image_tag, spec.dockerfile)
            if await blocking(self.fleet.holder, tag) is not None:
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

    def _host_of(self, snapshot: SandboxSnapshot) -> DockerHost:
        url = snapshot.extra.get("host")
        for host in self.fleet.hosts:
            if host.url == url:
                return host
        hosts = ", ".join(h.url for h in self.fleet.hosts)
        raise SandboxError(f"the docker snapshot {snapshot.ref[:19]} lives on {url}, which is "
                           f"not a host of this backend ({hosts})")

    async def restore(self, snapshot: SandboxSnapshot, *,
                      env_id: str | None = None) -> Sandbox:
        """See `Backend.restore`: a container from the snapshot's committed image, on the host
        that holds it."""
        self.check_snapshot(snapshot)
        return await DockerSandbox.restore_on(self._host_of(snapshot), snapshot, self.run_id,
                                              snapshot.env_id if env_id is None else env_id)

    @classmethod
    async def discard_snapshot(cls, snapshot: SandboxSnapshot) -> None:
        """See `Backend.discard_snapshot`: the image goes once no container runs on it."""
        await _dockerfork.discard(_host_for_url(snapshot.extra.get("host", "")), snapshot.ref)


def _host_for_url(url: str) -> DockerHost:
    """The host of `url`: the local daemon's, else a shared fleet host."""
    local = default_host()
    return local if url in ("", local.url) else shared_host(DockerHostConfig(url=url))
