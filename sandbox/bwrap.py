"""bubblewrap backend: daemonless sandboxes in milliseconds, on a rootfs exported from an image.

Usage is the same as the docker backend (normally through `corral.sandbox.open_sandbox`)::

    async with await BwrapSandbox.create(Terminal(), run_id="r1") as sb:
        print((await sb.exec("cat /etc/debian_version")).stdout)

How a sandbox is laid out:

- The image's filesystem is exported once per image id (`rootfs.export_rootfs`), copied once
  with its owners shifted into the sandbox's uid range (`_confine.shifted_rootfs`), and is the
  read-only lower layer of a kernel overlayfs; each sandbox gets its own upper dir, so the whole
  filesystem is writable and every write persists for the sandbox's life (like a container).
  The overlay is mounted inside a private mount namespace (`unshare --mount`), so it vanishes
  with the sandbox and never shows on the host. (bubblewrap 0.8 has no `--overlay`; mounting
  overlayfs needs root, which is what this backend is tested as.)
- One long-lived `bwrap --unshare-user --unshare-pid --unshare-net --unshare-ipc --unshare-uts
  --die-with-parent --new-session` holds the namespaces. It runs as an unprivileged host uid and
  its user namespace maps in-sandbox uids 0..65535 to host uids from `_confine.uid_base()`, so
  the agent's root is root only inside (`_confine` says how). /proc is left as Docker leaves it
  (read-only /proc/sys and friends, /proc/kcore etc. masked).
- Commands join the namespaces with `nsenter`, launched under the sandbox's seccomp filter
  (`_seccomp`: a throwaway `bwrap --seccomp` on the host loads it, since the image's `setpriv`
  cannot), and drop privileges with the image's `setpriv` (capability bounding set =
  `docker.CAP_ADD`, no-new-privs, optional non-root user). Processes started by `exec` (services
  from a setup step) therefore keep running for the sandbox's life, exactly as in a container.
- Host-side file operations (`write_file`, `read_file`, upload, download) resolve every path
  inside the sandbox's root with `openat2(RESOLVE_IN_ROOT)` (`_rootio`): a link the agent
  plants cannot lead them out, and they never touch procfs or sysfs.
- Limits: a cgroup per sandbox (`_cgroup`: v1 pids/memory/cpu controllers, or v2) when
  /sys/fs/cgroup is writable; otherwise `prlimit` rlimits (nproc, address space) inside the
  sandbox.
- Network: off unless spec.network is set, in which case the host's network is shared (bwrap has
  no bridge).
- Kill guarantee: the same host-side /proc group kill as the docker backend.
- Forks and snapshots (`_bwrapfork`, on the layers of `_layers`): a snapshot copies the upper
  dir (processes frozen meanwhile) into a read-only layer; sandboxes restored from it stack a
  fresh upper over that layer, the parent's layers and the rootfs. `fork(n, keep_parent=False)`
  stops the parent and hands its upper dir itself to the children: no data is copied.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import secrets
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

from ..errors import SandboxDied, SandboxError
from . import _bwrapfork, _changes, _layers, _procs
from ._bwrapfork import BwrapForks, snapshot_stack
from ._cgroup import CGROUP_ROOT, Cgroup, wait_empty
from ._confine import proc_args, shifted_rootfs, uid_base, write_id_maps
from ._proto import ShellSession, StreamProcess, Transport, run_command
from .base import BackendConfig, ExecResult, Process, Sandbox, Shell
from .snapshot import SandboxSnapshot
from .containers import CAP_ADD
from .image_backend import ImageBackend
from ._rootio import RootDir
from ._rootio import supported as openat2_supported
from ._seccomp import program_file
from .cache import cache_dir
from .rootfs import (cached_rootfs, export_rootfs, passwd_entry, rootfs_config,
                     touch_export)
from .spec import Terminal, parse_size

__all__ = ["BwrapBackend", "BwrapConfig", "BwrapSandbox", "CGROUP_ROOT", "Cgroup", "MOUNT_ROOT",
           "OWNER_SUFFIX", "PipeTransport", "cgroup_record", "launcher_root", "mount_point",
           "owner_record", "sandboxes_dir", "snapshot_stack"]

log = logging.getLogger(__name__)

_MOUNT = ('for f in $5; do echo $$ > "$f" || exit 125; done; '
          'mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$4" && shift 5 && '
          'exec "$@"')
# where overlays are mounted (inside each sandbox's private mount namespace): bwrap runs as the
# sandbox's unprivileged host uid, which must be able to walk to it (~ is 0700 for root)
MOUNT_ROOT = Path("/run/corral-bwrap")
_JOIN_CGROUPS = 'for f in $1; do echo $$ > "$f" || exit 125; done; shift; exec "$@"'


def mount_point(name: str) -> Path:
    """A fresh, empty mount point for sandbox `name`'s overlay under MOUNT_ROOT (0711)."""
    MOUNT_ROOT.mkdir(mode=0o711, exist_ok=True)
    MOUNT_ROOT.chmod(0o711)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=MOUNT_ROOT))


def sandboxes_dir() -> Path:
    """Where per-sandbox upper dirs live ($CORRAL_CACHE/bwrap)."""
    return cache_dir() / "bwrap"


OWNER_SUFFIX = _layers.RECORD_SUFFIX


def owner_record(sandbox_dir: Path) -> Path:
    """Who made a sandbox dir: a hidden file beside it (JSON: pid, run, env, created), written
    before the dir is made and removed after it is gone. A process killed at any point (while
    it makes or removes the dir) so leaves nothing the reaper cannot attribute."""
    return sandbox_dir.with_name(f".{sandbox_dir.name}{OWNER_SUFFIX}")


def cgroup_record(name: str) -> Path:
    """Who made the cgroup of sandbox `name`: a copy of its owner record under MOUNT_ROOT,
    one place for every `CORRAL_CACHE` (cgroups are the machine's, not a cache's: a reaper
    of another cache finds the owner here and spares a live one). Written before the cgroup
    is made, removed after it is gone."""
    return MOUNT_ROOT / f".{name}{OWNER_SUFFIX}"


def _passwd(rootfs: Path, user: str) -> tuple[int, int, str]:
    return passwd_entry((rootfs / "etc" / "passwd").read_text(), user)


class PipeTransport(Transport):
    """An asyncio subprocess's pipes as frames."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        super().__init__()
        self.proc = proc
        self._open = 2
        self._pumps = [asyncio.create_task(self._read(proc.stdout, 1)),  # type: ignore[arg-type]
                       asyncio.create_task(self._read(proc.stderr, 2))]  # type: ignore[arg-type]

    async def _read(self, stream: asyncio.StreamReader, sid: int) -> None:
        while data := await stream.read(1 << 16):
            await self.frames.put((sid, data))
        self._open -= 1
        if not self._open:
            await self.frames.put((0, b""))

    async def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)  # type: ignore[union-attr]
        await self.proc.stdin.drain()  # type: ignore[union-attr]

    async def host_pid(self) -> int | None:
        return self.proc.pid

    async def close(self) -> None:
        for task in self._pumps:
            task.cancel()
        if self.proc.stdin:
            self.proc.stdin.close()
        # the wrapper exits right after its markers; background services it started were
        # reparented to the sandbox's init and live on
        if not await _reap(self.proc, 2.0):
            await asyncio.to_thread(_procs.kill_below, self.proc.pid, frozenset(), True)
            await _reap(self.proc, 5.0)


@functools.cache
def launcher_root() -> tuple[str, ...]:
    """The root of the throwaway bwrap that loads the seccomp filter before `nsenter`: only the
    programs and libraries it runs, /dev and /proc (for the sandbox's namespaces). Not a
    recursive bind of `/`: that copies every mount of the host, and one that vanishes meanwhile
    (a Docker container's overlay being removed) failed the launch ("Can't bind mount
    /oldroot/...")."""
    args = ["--ro-bind", "/usr", "/usr", "--dev-bind", "/dev", "/dev", "--bind", "/proc", "/proc",
            "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for name in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return tuple(args)


class BwrapSandbox(BwrapForks, Sandbox):
    """A Terminal sandbox under bubblewrap (see module docstring)."""

    backend = "bwrap"
    can_fork = True

    def __init__(self, spec: Terminal, rootfs: Path, workdir: Path, uid: int, gid: int,
                 env: dict[str, str], cwd: str, cgroup: Cgroup | None, base: int) -> None:
        super().__init__()
        self.spec, self.rootfs, self.dir, self.base = spec, rootfs, workdir, base
        self.uid, self.gid, self.env, self.workdir, self.cgroup = uid, gid, env, cwd, cgroup
        self.proc: asyncio.subprocess.Process | None = None
        self.pid = 0  # host pid of the sandbox's main process (namespaces to join)
        self._shell: ShellSession | None = None
        self._root: RootDir | None = None  # the sandbox's "/", for host-side file I/O
        self.mnt: Path | None = None  # the overlay's mount point (MOUNT_ROOT/<name>-*)
        self.stack: list[Path] = []  # read-only layers over the rootfs, top first (`_layers`)
        self.image, self.run_id, self.env_id = "", "adhoc", ""
        self._closed = self._stopped = False

    @classmethod
    async def create(cls, spec: Terminal, *, image: str | None = None, run_id: str = "adhoc",
                     env_id: str = "") -> "BwrapSandbox":
        """Start a sandbox on `image`'s exported rootfs (exported on first use, then cached)."""
        return await cls._boot(spec, image or spec.image, run_id, env_id, [])

    @classmethod
    async def _boot(cls, spec: Terminal, image: str, run_id: str, env_id: str,
                    stack: list[Path]) -> "BwrapSandbox":
        """Start a sandbox on `image`'s rootfs under the layers `stack` (top first; a restore:
        the spec's files and workdir are then already in the layers, as the parent left them)."""
        if os.geteuid() != 0:
            raise SandboxError("the bwrap backend mounts overlayfs and needs root here "
                               "(bubblewrap 0.8); use backend='docker'")
        for tool in ("bwrap", "nsenter", "unshare", "setpriv"):
            if shutil.which(tool) is None:
                raise SandboxError(f"{tool} is not installed; `apt-get install bubblewrap "
                                   "util-linux`")
        if not openat2_supported():
            raise SandboxError("the bwrap backend needs openat2 (Linux >= 5.6) to keep file "
                               "operations inside the sandbox; use backend='docker'")
        t0 = time.monotonic()
        base = uid_base()
        exported = await asyncio.to_thread(export_rootfs, image)
        rootfs = await asyncio.to_thread(shifted_rootfs, exported, base)
        if not (rootfs / "usr/bin/setpriv").exists():
            raise SandboxError(f"image {image} has no /usr/bin/setpriv (util-linux),"
                               " which the bwrap backend uses to drop privileges")
        meta = rootfs_config(exported)
        user = spec.user or meta["user"] or "root"
        uid, gid, home = _passwd(rootfs, user)
        env = dict(e.split("=", 1) for e in meta["env"] if "=" in e)
        env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        env.update(HOME=home if uid else "/root", USER=user, HOSTNAME="sandbox", **spec.env)
        cwd = spec.workdir
        if uid and cwd == "/root":
            cwd = f"/home/{user}"  # as on Docker (docs/sandboxes.md), whatever passwd says
        name = f"{run_id}-{secrets.token_hex(4)}".replace("/", "_")
        sbdir = sandboxes_dir() / name
        sbdir.parent.mkdir(parents=True, exist_ok=True)
        record = json.dumps({"pid": os.getpid(), "start": _procs.own_start(), "run": run_id,
                             "env": env_id, "created": time.time(), "rootfs": exported.name,
                             "dir": str(sbdir), "layers": [p.name for p in stack]})
        owner_record(sbdir).write_text(record)
        MOUNT_ROOT.mkdir(mode=0o711, exist_ok=True)
        cgroup_record(name).write_text(record)
        touch_export(exported)
        sandbox = cls(spec, rootfs, sbdir, uid, gid, env, cwd, None, base)
        sandbox.image, sandbox.run_id, sandbox.env_id = image, run_id, env_id
        sandbox.stack = list(stack)
        _layers.acquire(stack)
        try:
            for sub in ("upper", "work"):
                (sbdir / sub).mkdir(parents=True)
            # the upper dir is the sandbox's "/": its root user owns it, as the image's root
            # owns /; not the export's mode: its top dir is a 0700 temp dir
            os.chown(sbdir / "upper", base, base)
            (sbdir / "upper").chmod(0o755)
            sandbox.cgroup = Cgroup(name, spec) if Cgroup.available() else None
            await sandbox._start()
            if not stack:
                # a missing workdir is made, owned by the sandbox's root, as Docker makes it
                await asyncio.to_thread(sandbox._root.makedirs, cwd)
                for path, content in spec.files.items():
                    await sandbox.write_file(path, content)
        except BaseException:
            await sandbox.close()
            raise
        sandbox.stats.started_at = t0
        sandbox.stats.start_seconds = time.monotonic() - t0
        return sandbox

    def _cgroup_prefix(self) -> list[str]:
        return ["sh", "-c", _JOIN_CGROUPS, "corral", self.cgroup.procs] if self.cgroup else []

    def _lowerdir(self) -> str:
        return ":".join(str(p) for p in [*self.stack, self.rootfs])

    async def _start(self) -> None:
        net = [] if self.spec.network_mode != "none" else ["--unshare-net"]
        resolv = (["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
                  if net == [] and Path("/etc/resolv.conf").exists() else [])
        self.mnt = mount_point(self.dir.name)
        merged = str(self.mnt)
        block_r, block_w = os.pipe()  # bwrap waits on this until the uid maps are written
        info_r, info_w = os.pipe()  # bwrap says here which pid holds the new user namespace
        seccomp = program_file().open()
        # one shell joins the cgroup and mounts the overlay as root (each exec costs ms on a
        # busy host); then setpriv drops to the sandbox's host uid for bwrap, which makes the
        # user namespace. pdeathsig (again after the uid change, which clears it): if this
        # process dies, bwrap gets SIGKILL and its --die-with-parent child (the sandbox's pid 1)
        # with it; bwrap 0.8 alone outlives its parent
        argv = ["setpriv", "--pdeathsig", "KILL", "--",
                "unshare", "--mount", "--propagation", "private",
                "sh", "-c", _MOUNT, "corral", self._lowerdir(), str(self.dir / "upper"),
                str(self.dir / "work"), merged, self.cgroup.procs if self.cgroup else "",
                "setpriv", f"--reuid={self.base}", f"--regid={self.base}", "--clear-groups",
                "--pdeathsig", "KILL", "--",
                "bwrap", "--unshare-user", "--userns-block-fd", str(block_r),
                "--info-fd", str(info_w), "--uid", "0", "--gid", "0",
                "--seccomp", str(seccomp),
                "--bind", merged, "/", "--proc", "/proc", "--dev", "/dev", *proc_args(),
                *resolv, "--unshare-pid", "--unshare-ipc", "--unshare-uts", *net,
                "--hostname", "sandbox", "--die-with-parent", "--new-session",
                "--cap-drop", "ALL", "--", "sh", "-c", "echo ready && exec sleep infinity"]
        spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
            pass_fds=(block_r, info_w, seccomp),
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}))
        try:
            self.proc = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            # a spawn cut half-way is cleaned up by asyncio: it kills the first process, then
            # waits for every holder of its pipes, and a bwrap child that never saw its parent
            # die holds them for ever (the cancelled task hung). The spawn takes ms: let it
            # finish, so that close() stops the sandbox the way it stops any (the session and
            # the cgroup killed, the pipes not waited for)
            try:
                self.proc = await spawn
            finally:
                os.close(block_w)
                os.close(info_r)
            raise
        finally:
            for fd in (block_r, info_w, seccomp):
                os.close(fd)
        try:
            ready = await asyncio.wait_for(self._map_ids(info_r, block_w),
                                           self.spec.startup_timeout)
        except TimeoutError:
            ready = b""
        except asyncio.CancelledError:
            # bwrap waits on block_r for the id maps: kill it, so the reading thread sees EOF
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            os.close(block_w)
            os.close(info_r)
            raise
        inside = _procs.descendants(self.proc.pid)
        if ready != b"ready\n" or not inside:
            with contextlib.suppress(ProcessLookupError):  # exited, not yet reaped
                os.killpg(self.proc.pid, signal.SIGKILL)
        # closed only now: after a timeout a thread may still wait on info_r until the kill
        os.close(block_w)
        os.close(info_r)
        if ready != b"ready\n" or not inside:
            err = (await self.proc.stderr.read()).decode(errors="replace").strip()  # type: ignore[union-attr]
            raise SandboxError(f"bwrap failed to start: {err or 'no output'}")
        self.pid = inside[-1]  # the deepest process: it is in every namespace and the new root
        self._root = RootDir(self.pid, (self.base, self.base))

    async def _map_ids(self, info_r: int, block_w: int) -> bytes:
        """Write the uid/gid maps of bwrap's new user namespace, let bwrap go on, and return
        the sandbox's first line ("ready" once it runs inside the new root)."""
        info = b""
        while b"}" not in info:  # bwrap writes one JSON object: {"child-pid": N, ...}
            chunk = await asyncio.to_thread(os.read, info_r, 4096)
            if not chunk:
                return b""  # bwrap exited before making the namespace: stderr says why
            info += chunk
        write_id_maps(json.loads(info)["child-pid"], self.base)
        os.write(block_w, b"1")
        return await self.proc.stdout.readline()  # type: ignore[union-attr]

    async def _spawn(self, argv: list[str], *, env: Mapping[str, str] | None = None,
                     cwd: str | None = None, user: str | None = None,
                     stdin: bool = False) -> PipeTransport:
        if self._closed or self.proc is None or self.proc.returncode is not None:
            raise SandboxDied("bwrap sandbox is closed or died")
        uid, gid = (self.uid, self.gid) if user is None else _passwd(self.rootfs, user)[:2]
        envs = {**self.env, **(env or {})}
        if user is not None:
            envs["HOME"] = _passwd(self.rootfs, user)[2] if uid else "/root"
        caps = ",".join(f"+{c.lower()}" for c in CAP_ADD)
        drop = ["setpriv", "--no-new-privs", "--inh-caps=-all", f"--bounding-set=-all,{caps}"]
        if uid:
            drop += [f"--reuid={uid}", f"--regid={gid}", "--init-groups"]
        limits = [] if self.cgroup else [
            "prlimit", f"--nproc={self.spec.pids}", f"--as={parse_size(self.spec.memory)}", "--"]
        joined = ["-n"] if self.spec.network_mode == "none" else []
        seccomp = program_file().open()
        # a throwaway bwrap (no namespaces of its own but a mount namespace) loads the seccomp
        # filter on the host side: every process of the command inherits it
        full = [*self._cgroup_prefix(), "bwrap", *launcher_root(), "--cap-add", "ALL",
                "--seccomp", str(seccomp), "--",
                "nsenter", "-t", str(self.pid), "-U", "-m", "-u", "-i", "-p", *joined, "-r",
                "--", "/usr/bin/env", "-i", f"--chdir={cwd or self.workdir}",
                *[f"{k}={v}" for k, v in envs.items()], *drop, "--", *limits, *argv]
        try:
            proc = await asyncio.create_subprocess_exec(
                *full, stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True, pass_fds=(seccomp,))
        finally:
            os.close(seccomp)
        return PipeTransport(proc)

    async def _kill(self, transport: Transport, keep: frozenset[int], everything: bool) -> None:
        pid = await transport.host_pid()
        if pid is None:
            return
        await asyncio.to_thread(_procs.kill_tree, pid, keep, everything, self._inside)

    async def exec(self, cmd: str | list[str], timeout: float | None = None,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   user: str | None = None) -> ExecResult:
        """Run one command; a string runs under `bash -lc`. See `Sandbox.exec`."""
        argv = ["bash", "-lc", cmd] if isinstance(cmd, str) else list(cmd)
        result = await run_command(
            lambda a: self._spawn(a, env=env, cwd=cwd, user=user), argv,
            self.spec.command_timeout if timeout is None else timeout,
            self.spec.output_limit, self._kill)
        self.stats.commands += 1
        self.stats.exec_seconds += result.duration
        return result

    async def start_process(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                            cwd: str | None = None, user: str | None = None) -> Process:
        """See `Sandbox.start_process`."""
        transport = await self._spawn(list(argv), env=env, cwd=cwd, user=user, stdin=True)
        return StreamProcess(transport, self._kill)

    async def shell(self) -> Shell:
        """The persistent bash session of this sandbox (started on first use)."""
        if self._shell is None:
            self._shell = ShellSession(
                lambda: self._spawn(["bash", "--noprofile", "--norc"], stdin=True), self._kill,
                self.spec.output_limit, self.spec.command_timeout, self.workdir)
        return self._shell

    def _rootdir(self) -> RootDir:
        if self._root is None or self._closed:
            raise SandboxDied("bwrap sandbox is not running")
        return self._root

    async def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        """Create or replace `path` (parents are created, owned by the sandbox's root). The path
        resolves inside the sandbox as in `docker cp`: links the agent made stay inside."""
        raw = data.encode() if isinstance(data, str) else data
        await asyncio.to_thread(self._rootdir().write, path, raw, mode)

    async def read_file(self, path: str) -> bytes:
        """Return the bytes of `path`; FileNotFoundError / IsADirectoryError as for open(),
        OutputTooLarge past `spec.read_limit` bytes."""
        return await asyncio.to_thread(self._rootdir().read, path, self.spec.read_limit)

    # --- the verify phase (host-side, as the timeout kills) ----------------------------------
    def _inside(self) -> list[int]:
        """Host pids of the sandbox's processes but the two the sandbox lives by: bwrap's init
        (pid 1 inside, whose death takes the namespace and everything in it) and its child,
        the main process (`self.pid`, whose exit ends bwrap)."""
        found = {*_procs.namespace_pids(self.pid), *_procs.descendants(self.pid)}
        return sorted(p for p in found - {self.pid} if _procs.inner_pid(p) != 1)

    async def process_keys(self) -> frozenset[tuple[int, int]] | None:
        """See `Sandbox.process_keys` (`_inside`, less the persistent shell: a pooled sandbox
        starts it before setup, and it is nobody's service)."""
        inside = self._inside()
        root = await self._shell.host_pid() if self._shell is not None else None
        shell = None if root is None else await asyncio.to_thread(
            _procs.session_process, root, inside)
        return frozenset(filter(None, map(_procs.process_key,
                                          (p for p in inside if p != shell))))

    async def kill_agent_processes(self, spare: frozenset[tuple[int, int]] = frozenset()) -> int:
        """See `Sandbox.kill_agent_processes`."""
        if self._shell is not None:
            await self._shell.close()
            self._shell = None
        return await asyncio.to_thread(_procs.kill_all, self._inside, spare)

    async def recreate_dirs(self, dirs: Sequence[str], remove: Sequence[str] = ()) -> bool:
        """See `Sandbox.recreate_dirs`."""
        await asyncio.to_thread(self._rootdir().recreate_dirs, dirs, remove)
        return True

    async def changed_since(self, since: float) -> list[str] | None:
        """See `Sandbox.changed_since` (the sandbox's upper dir, and for a fork the change
        times its layers remember)."""
        upper = _changes.exists(str(self.dir / "upper"))
        if upper is None:
            return None
        found = await asyncio.to_thread(_changes.changed_since, upper, since)
        if self.stack:
            inherited = await asyncio.to_thread(_layers.changed_since, self.stack, since)
            found = sorted({*found, *inherited})
        return found

    @property
    def alive(self) -> bool:
        return not self._closed and self.proc is not None and self.proc.returncode is None

    async def _stop(self) -> None:
        """Kill everything in the sandbox and drop its cgroup; its dirs stay. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._shell is not None:
            await self._shell.close()
        if self._root is not None:
            self._root.close()
        if self.proc is not None and self.proc.returncode is None:
            # SIGKILL to the session: bwrap dies, its pid namespace (and every process) with it
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await _reap(self.proc, 5.0)
        if self.cgroup:
            await asyncio.to_thread(wait_empty, self.cgroup)
            self.cgroup.remove()
        if not self.cgroup or not any(d.exists() for d in self.cgroup.dirs):
            cgroup_record(self.dir.name).unlink(missing_ok=True)

    async def close(self) -> None:
        """Kill everything in the sandbox, drop its cgroup and upper dir. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._stop()
        await asyncio.to_thread(_layers.release, self.stack, sandboxes_dir())
        await asyncio.to_thread(shutil.rmtree, self.dir, True)
        if not self.dir.exists():  # else the record stays: the reaper ends what we could not
            owner_record(self.dir).unlink(missing_ok=True)
        if self.mnt is not None:  # empty on the host: the overlay lived in the sandbox's mount ns
            with contextlib.suppress(OSError):
                self.mnt.rmdir()


async def _reap(proc: asyncio.subprocess.Process, limit: float) -> bool:
    """Wait until `proc` exited (not `proc.wait()`: that also waits for every holder of its
    pipes, e.g. a service started in the sandbox), then drop our pipe ends."""
    deadline = time.monotonic() + limit
    while proc.returncode is None and time.monotonic() < deadline:
        await asyncio.sleep(0.002)
    if proc.returncode is None:
        return False
    proc._transport.close()  # type: ignore[attr-defined]  # our pipe ends; exit is known
    return True


class BwrapConfig(BackendConfig):
    """Options of the bwrap backend: none yet (rootfs exports and sandbox dirs live under
    `$CORRAL_CACHE`)."""


class BwrapBackend(ImageBackend):
    """The `bwrap` row of the backend table: bubblewrap on the image's exported rootfs."""

    name = "bwrap"
    sandbox_class = BwrapSandbox
    can_fork = True

    async def restore(self, snapshot: SandboxSnapshot, *,
                      env_id: str | None = None) -> Sandbox:
        """See `Backend.restore`: a fresh upper dir over the snapshot's layers."""
        self.check_snapshot(snapshot)
        stack = await asyncio.to_thread(snapshot_stack, snapshot)
        return await BwrapSandbox._boot(Terminal(**snapshot.spec), snapshot.extra["image"],
                                        self.run_id, snapshot.env_id if env_id is None
                                        else env_id, stack)

    @classmethod
    async def discard_snapshot(cls, snapshot: SandboxSnapshot) -> None:
        """See `Backend.discard_snapshot`: its layers go once no sandbox runs on them."""
        await _bwrapfork.discard(snapshot, sandboxes_dir())

    async def image_for(self, spec: Terminal, env_id: str, build: bool) -> str:
        if not spec.dockerfile and cached_rootfs(spec.image) is not None:
            return spec.image  # already exported in this process: no daemon round trip
        return await super().image_for(spec, env_id, build)
