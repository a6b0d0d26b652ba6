"""Host-side file I/O confined to a sandbox's root: `openat2(RESOLVE_IN_ROOT)`.

The bwrap backend, and the docker backend for containers on this machine, read and write
sandbox files from the host (no process start: tens of microseconds, not milliseconds). The
host is root and the sandbox's tree is the agent's to shape, so every path is resolved by the
kernel *inside* the sandbox's root directory: absolute symlinks and `..` resolve against that
root (what `docker cp` does), magic links such as `/proc/self/root` are refused
(RESOLVE_NO_MAGICLINKS), and nothing outside the root can be named. The root is an `O_PATH`
descriptor of `/proc/<pid>/root` taken when the sandbox starts, so a recycled pid cannot
redirect it later.

Only regular files are read or written (the verify phase also removes and recreates folders,
`recreate_dirs`), and never on procfs or sysfs: a host-side write there
would act with the host's privileges (sysctls, /proc/<pid>/ files), and no setup file belongs
there. Files and directories created here belong to the sandbox's root user (`owner`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import posixpath
import shutil
import socket
import stat
from typing import Iterable

from ..errors import OutputTooLarge

SYS_OPENAT2 = 437  # the same number on every Linux architecture (asm-generic table)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
_RESOLVE = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
# filesystems host-side I/O refuses: procfs, sysfs, cgroup v1/v2, debugfs, securityfs
_REFUSED_FS = {0x9FA0: "procfs", 0x62656572: "sysfs", 0x27E0EB: "cgroupfs",
               0x63677270: "cgroup2", 0x64626720: "debugfs", 0x73636673: "securityfs"}
_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


def openat2(dirfd: int, path: str, flags: int, mode: int = 0) -> int:
    """openat2(2) with RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS; raises OSError like open()."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, _RESOLVE)
    raw = os.fsencode(path)
    while True:
        fd = _libc.syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(raw),
                           ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err not in (errno.EAGAIN, errno.EINTR):  # EAGAIN: a rename raced the lookup
            raise OSError(err, os.strerror(err), path)


def _fs_type(fd: int) -> int:
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type is its first word
    if _libc.fstatfs(ctypes.c_int(fd), buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ctypes.c_long.from_buffer(buf).value


def supported() -> bool:
    """Whether this kernel has openat2 (Linux >= 5.6)."""
    try:
        os.close(openat2(os.open("/", os.O_PATH), ".", os.O_PATH))
    except OSError as exc:
        return exc.errno != errno.ENOSYS
    return True


class RootDir:
    """A sandbox's root directory, held open; paths are resolved inside it (module doc)."""

    def __init__(self, pid: int, owner: tuple[int, int]) -> None:
        self.fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.owner = owner

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @staticmethod
    def _relative(path: str) -> str:
        # lexical clean-up first: ".." at the top stays at the top, as RESOLVE_IN_ROOT would
        return posixpath.normpath("/" + path).lstrip("/") or "."

    def _checked(self, fd: int, path: str) -> os.stat_result:
        """fstat `fd`, refusing anything but a regular file outside procfs/sysfs."""
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        fs = _REFUSED_FS.get(_fs_type(fd))
        if fs is not None:
            raise PermissionError(errno.EPERM, f"host-side file operations refuse {fs}; "
                                  "use exec() inside the sandbox", path)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        return st

    def makedirs(self, path: str) -> None:
        """mkdir -p inside the root; new directories belong to the sandbox's root."""
        rel = self._relative(path)
        try:
            os.close(openat2(self.fd, rel, os.O_PATH | os.O_DIRECTORY))
            return
        except FileNotFoundError:
            pass
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            sub = "/".join(parts[:i])
            try:
                os.close(openat2(self.fd, sub, os.O_PATH | os.O_DIRECTORY))
                continue
            except FileNotFoundError:
                pass
            parent = openat2(self.fd, "/".join(parts[:i - 1]) or ".", os.O_PATH | os.O_DIRECTORY)
            try:
                os.mkdir(parts[i - 1], 0o755, dir_fd=parent)
                os.chown(parts[i - 1], *self.owner, dir_fd=parent, follow_symlinks=False)
            except FileExistsError:
                pass  # made meanwhile, or a dangling link: the check below says which
            finally:
                os.close(parent)
            os.close(openat2(self.fd, sub, os.O_PATH | os.O_DIRECTORY))

    def _parent(self, rel: str) -> tuple[int, str]:
        """An O_PATH descriptor of `rel`'s folder (resolved inside the root) and its name."""
        return (openat2(self.fd, posixpath.dirname(rel) or ".", os.O_PATH | os.O_DIRECTORY),
                posixpath.basename(rel))

    def _unlink_links(self, rel: str) -> None:
        """Remove every symlink on the way to `rel` and at it (never followed), top down."""
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            try:
                parent, name = self._parent("/".join(parts[:i]))
            except (FileNotFoundError, NotADirectoryError):
                return  # nothing further down exists
            try:
                if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                    os.unlink(name, dir_fd=parent)
            except FileNotFoundError:
                return
            finally:
                os.close(parent)

    def remove(self, path: str) -> None:
        """Delete `path` if it is there: a file or link is unlinked (a link is never followed),
        a folder removed with everything in it (links inside removed, not followed)."""
        rel = self._relative(path)
        if rel == ".":
            raise PermissionError(errno.EPERM, "refusing to remove the sandbox's root", path)
        try:
            parent, name = self._parent(rel)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            fs = _REFUSED_FS.get(_fs_type(parent))
            if fs is not None:
                raise PermissionError(errno.EPERM, f"host-side file operations refuse {fs}", path)
            if stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                shutil.rmtree(name, dir_fd=parent)
            else:
                os.unlink(name, dir_fd=parent)
        except FileNotFoundError:
            return  # nothing there to remove
        finally:
            os.close(parent)

    def recreate_dirs(self, dirs: Iterable[str], remove: Iterable[str] = ()) -> None:
        """Make each of `dirs` a new, empty folder of the sandbox's root (mode 755), with no
        link on the way to it, and delete `remove`; whatever was at those paths goes."""
        dirs = [self._relative(d) for d in dirs]
        for rel in dirs:
            self._unlink_links(rel)
        for path in (*dirs, *remove):
            self.remove(path)
        for rel in dirs:
            self.makedirs(rel)
            fd = openat2(self.fd, rel, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:  # made by makedirs: set here, not left to this process's umask
                os.fchown(fd, *self.owner)
                os.fchmod(fd, 0o755)
            finally:
                os.close(fd)

    def write(self, path: str, data: bytes, mode: int) -> None:
        """Create or replace the regular file `path` (parents made) with `data` and `mode`."""
        rel = self._relative(path)
        self.makedirs(posixpath.dirname(rel))
        # O_NONBLOCK: opening a FIFO the agent planted must not hang this thread
        fd = openat2(self.fd, rel, os.O_WRONLY | os.O_CREAT | os.O_NOCTTY | os.O_NONBLOCK,
                     mode & 0o7777)
        try:
            st = self._checked(fd, path)
            if st.st_uid == 0:  # just created by this (host root) process: the sandbox's own
                os.fchown(fd, *self.owner)
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, mode & 0o7777)
        finally:
            os.close(fd)

    def listen_unix(self, path: str, mode: int = 0o666) -> socket.socket:
        """A listening unix socket bound at `path` inside the root, for a host process to
        serve and the sandbox's processes to connect to (a file system socket, so no mount and
        no network is needed). Its folder is made as `makedirs` makes it; whatever was at
        `path` is replaced (a link is unlinked, never followed); the socket belongs to the
        sandbox's root, with `mode`."""
        rel = self._relative(path)
        folder, name = posixpath.split(rel)
        if rel == "." or not name:
            raise IsADirectoryError(errno.EISDIR, "a socket needs a file name", path)
        self.makedirs(folder)
        parent = openat2(self.fd, folder or ".", os.O_PATH | os.O_DIRECTORY)
        try:
            fs = _REFUSED_FS.get(_fs_type(parent))
            if fs is not None:
                raise PermissionError(errno.EPERM, f"host-side file operations refuse {fs}", path)
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
                os.unlink(name, dir_fd=parent)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:  # bind(2) never follows a link at its last component: EADDRINUSE instead
                sock.bind(f"/proc/self/fd/{parent}/{name}")
                node = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
                try:
                    if not stat.S_ISSOCK(os.fstat(node).st_mode):
                        raise OSError(errno.EINVAL, "replaced while it was bound", path)
                    os.chown(f"/proc/self/fd/{node}", *self.owner)
                    os.chmod(f"/proc/self/fd/{node}", mode & 0o777)
                finally:
                    os.close(node)
                sock.listen(128)
                sock.setblocking(False)
            except BaseException:
                sock.close()
                raise
            return sock
        finally:
            os.close(parent)

    def read(self, path: str, limit: int | None = None) -> bytes:
        """The bytes of the regular file `path`; `OutputTooLarge` past `limit` bytes (by its
        size, and while reading: it may grow meanwhile)."""
        fd = openat2(self.fd, self._relative(path), os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
        try:
            st = self._checked(fd, path)
            check_size(path, st.st_size, limit)
            chunks, size = [], 0
            while chunk := os.read(fd, 1 << 20):
                size += len(chunk)
                check_size(path, size, limit)
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)


def check_size(path: str, size: int, limit: int | None) -> None:
    """`OutputTooLarge` when a file read out of a sandbox has passed `limit` bytes."""
    if limit is not None and size > limit:
        raise OutputTooLarge(f"{path} is larger than the {limit:,}-byte read limit of the "
                             f"sandbox (Terminal(read_limit=...)); it was not read")
