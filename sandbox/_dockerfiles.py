"""The docker backend's file I/O paths: host-side through the container's root where it runs
here (`_rootio`), else the control shell for small writes, else the daemon's archive API."""

from __future__ import annotations

import asyncio
import base64
import errno
import io
import logging
import os
import posixpath
import shlex
import tarfile
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..errors import SandboxDied
from . import _procs
from ._engine import blocking
from ._proto import ShellSession, ansi_c_quote
from ._rootio import RootDir, check_size
from ._rootio import supported as openat2_supported
from .containers import tar

if TYPE_CHECKING:
    from .fleet import DockerHost
    from .spec import Terminal

__all__ = ["INLINE_WRITE_LIMIT", "DockerFiles", "get_archive", "host_root"]

log = logging.getLogger(__name__)

# Files up to this size are written through the sandbox's control shell (a few ms, no daemon
# work); bigger ones go through the daemon's archive API. Under load every daemon call queues
# behind container starts and removals: put_archive took 90 ms and more per file.
INLINE_WRITE_LIMIT = 256 * 1024
_NOT_REGULAR = 86  # the inline write's exit status for a path that is not a regular file
_MAX_LINK_HOPS = 40  # as the kernel's MAXSYMLINKS
_TAR_OVERHEAD = 64 << 10  # a one-file tar: headers (a long name, PAX records) and padding


class DockerFiles:
    """The file operations of `DockerSandbox` (a mixin: the sandbox holds the state)."""

    id: str
    spec: "Terminal"
    host: "DockerHost"
    _root: RootDir | None
    _closed: bool
    _control_session: Callable[[], ShellSession]

    async def write_file(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        """Create or replace the regular file `path` (missing parents are created), owned by
        root. Where the container's root is reachable from here (`host_root`) the host writes
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
        await blocking(self.host.call,
                        lambda c: c.api.put_archive(self.id, "/", tar({path: raw}, mode)))

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
        Read from the host where the container's root is reachable (`host_root`), refusing
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
                        lambda c: get_archive(c, self.id, where, limit))
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

        return await blocking(fetch, "/" + path.lstrip("/"))


    async def recreate_dirs(self, dirs: Sequence[str], remove: Sequence[str] = ()) -> bool:
        """See `Sandbox.recreate_dirs`: where the container's root is reachable from here
        (`host_root`)."""
        if self._root is None or self._closed:
            return False
        await asyncio.to_thread(self._root.recreate_dirs, dirs, remove)
        return True


def get_archive(client: Any, container: str, path: str,
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


def host_root(container_id: str) -> RootDir | None:
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
