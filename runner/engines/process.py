"""`ServerProcess`: one inference server Corral starts, watches and stops (vLLM replicas).

A server runs in its own process group with its output in a log file. `wait_ready` polls its
health endpoint and fails with one line naming the cause (the last error line of the log) and
the log file when the process exits or the wait runs out. `stop` signals the whole group
(SIGTERM, then SIGKILL), so the engine's own worker processes go too; every server still
running when the interpreter exits is stopped by an `atexit` hook, and `stop_on_signals` turns
SIGTERM/SIGHUP into a normal exit for command-line tools, so nothing is left running. Where
none of that runs (this process SIGKILLed), the guard each server is started through
(`guard.py`) sees the socket only this process holds close and stops the group itself.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping, Sequence

from corral.errors import EngineError

__all__ = ["GUARD", "GUARD_START_S", "ServerProcess", "free_port", "is_loopback", "log_cause",
           "log_tail", "port_problem", "stop_all", "stop_on_signals", "wait_ready"]

log = logging.getLogger(__name__)
_LIVE: set["ServerProcess"] = set()
_LIVE_LOCK = threading.Lock()
# This process's ends of the guards' lifelines (see `ServerProcess.start`).
_LIFELINES: set[socket.socket] = set()
GUARD = Path(__file__).with_name("guard.py")
GUARD_START_S = 30.0  # for the guard to report the server's pid (it takes milliseconds)
# The last line that names an exception is usually the cause ("ValueError: ...").
_ERROR_LINE = re.compile(r"\b([A-Za-z_.]*(?:Error|Exception)|error):? (.+)")
# vLLM's processes prefix their lines: "(EngineCore pid=12) ERROR 12-04 18:08:47 [core.py:15] "
_PROCESS_PREFIX = re.compile(r"^\([A-Za-z_ ]+ pid=\d+\) (?:([A-Z]+) \d\d-\d\d [\d:.]+ "
                             r"\[[^\]]*\] ?)?")
_QUIET_LEVELS = ("DEBUG", "INFO", "WARNING")
# A wrapper's message pointing at the cause elsewhere ("Engine core initialization failed.
# See root cause above."): the cause is an earlier line
_POINTER = re.compile(r"root cause|see (?:the )?(?:stack trace|logs?\b|above)", re.IGNORECASE)
_LOG_TAIL_BYTES = 512 * 1024


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def port_problem(host: str, port: int) -> OSError | None:
    """None when `host:port` can be bound, else why not (its `errno` and `strerror`:
    EADDRINUSE "Address already in use"; a `socket.gaierror` for a name that does not resolve)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_cause(path: Path) -> str | None:
    """The error that ended the process logging to `path`, in one line (at most 300
    characters); None if the log names none. That is the last line naming an exception, not
    counting vLLM's own INFO/WARNING lines, traceback frames, and wrappers that point at the
    root cause elsewhere in the log (`_POINTER`), the worker's exception (`SafetensorError:
    ... incomplete metadata`) rather than the API server's "Engine core initialization
    failed"; the exception's module path is dropped, and an indented detail line that follows
    (pydantic's) is added."""
    try:
        with open(path, "rb") as log_file:
            log_file.seek(max(0, log_file.seek(0, os.SEEK_END) - _LOG_TAIL_BYTES))
            tail = log_file.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    pointer = None  # a wrapper's line, when the log names nothing else
    for index in range(len(tail) - 1, -1, -1):
        prefix = _PROCESS_PREFIX.match(tail[index])
        if prefix and prefix.group(1) in _QUIET_LEVELS:
            continue
        line = tail[index][prefix.end():] if prefix else tail[index]
        match = _ERROR_LINE.search(line)
        if not match or line.lstrip().startswith(("File ", "raise ", "^")):
            continue
        cause = f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2).strip()}"
        if _POINTER.search(match.group(2)):
            pointer = pointer or cause
            continue
        detail = tail[index + 1] if index + 1 < len(tail) else ""
        if detail[:1].isspace() and detail.strip() and not detail.lstrip().startswith("File "):
            cause += f": {detail.strip()}"
        return cause[:300]
    return pointer[:300] if pointer else None


def log_tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of the log (for error details)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class ServerProcess:
    """An HTTP server in its own process group, logging to `log_path`, started through a
    guard (`guard.py`) that stops the group if this process dies. `pid` is the server's (and
    its group's) id; `proc` is the guard, which exits with the server's status."""

    def __init__(self, name: str, argv: Sequence[str], url: str, log_path: Path, *,
                 env: Mapping[str, str] | None = None, health_path: str = "/health") -> None:
        self.name, self.argv, self.url = name, list(argv), url.rstrip("/")
        self.log_path = Path(log_path)
        self.env = dict(env or os.environ)
        self.health_path = health_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None
        self._lifeline: socket.socket | None = None

    @property
    def pid(self) -> int | None:
        """The server's pid, which is its process group's id; None before `start`."""
        return self._pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Spawn the server (returns once it runs; see `wait_ready`); `EngineError` if the
        guard could not start it."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # The guard holds one end of the lifeline; this process holds the other, alone: it
        # is not inheritable, pass_fds gives the guard only its own end, and forked children
        # close it (`_forget_lifelines`). Its end-of-file means this process is gone.
        ours, theirs = socket.socketpair()
        _LIFELINES.add(ours)
        self._lifeline = ours
        try:
            with open(self.log_path, "ab") as out:
                # the guard runs in a session of its own and starts the server in another, so
                # no terminal signal reaches either; `stop` signals the server's group
                self.proc = subprocess.Popen(
                    [sys.executable, "-I", str(GUARD), str(theirs.fileno()), "--", *self.argv],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=self.env, start_new_session=True, pass_fds=(theirs.fileno(),))
        except BaseException:
            self._close_lifeline()
            raise
        finally:
            theirs.close()
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._pid = _read_pid(ours)
        if self._pid is None:
            self.stop()
            raise self.failure(f"could not be started (exit code {self.proc.returncode})")
        log.info("started %s (pid %d, guard %d), log %s", self.name, self._pid, self.proc.pid,
                 self.log_path)

    def _close_lifeline(self) -> None:
        if self._lifeline is not None:
            _LIFELINES.discard(self._lifeline)
            self._lifeline.close()

    def healthy(self, timeout: float = 2.0) -> bool:
        """Whether the health endpoint answers 200 now."""
        try:
            with urllib.request.urlopen(self.url + self.health_path, timeout=timeout) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def failure(self, what: str) -> EngineError:
        """A one-line error: `what`, the cause found in the log, and the log file."""
        cause = log_cause(self.log_path)
        return EngineError(f"{self.name} {what}" + (f": {cause}" if cause else "")
                           + f" (log: {self.log_path})")

    def check_started(self) -> bool:
        """True once healthy; raises `EngineError` if the process has exited."""
        if self.proc is None:
            raise EngineError(f"{self.name} was never started")
        code = self.proc.poll()
        if code is not None:
            raise self.failure(f"exited with code {code} while starting")
        return self.healthy()

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the whole process group: SIGTERM, then SIGKILL after `timeout` s; idempotent."""
        proc = self.proc
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if proc is None:
            return
        # The guard kills what is left of the group before it reaps the server and exits: once
        # it has exited there is nothing left to signal (and the id may be another's by then).
        if proc.poll() is None and self._pid is not None:
            _signal_group(self._pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s ignored SIGTERM for %.0f s; killing it", self.name, timeout)
        if proc.poll() is None and self._pid is not None:
            _signal_group(self._pid, signal.SIGKILL)
        self._close_lifeline()  # a guard that never reported a server stops on this
        proc.wait()


def wait_ready(servers: Sequence[ServerProcess], timeout: float) -> None:
    """Wait until every server is healthy; `EngineError` (one line) when one exits or the wait
    runs out. The servers are polled together, so N replicas start in the time of one."""
    deadline = time.monotonic() + timeout
    pending = list(servers)
    while pending:
        pending = [s for s in pending if not s.check_started()]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise pending[0].failure(f"was not ready within {timeout:.0f} s at {pending[0].url}")
        time.sleep(0.5)


def _read_pid(lifeline: socket.socket) -> int | None:
    """The server's pid, the guard's first line; None if the guard exits without one."""
    lifeline.settimeout(GUARD_START_S)
    line = b""
    try:
        while not line.endswith(b"\n"):
            chunk = lifeline.recv(32)
            if not chunk:
                return None
            line += chunk
    except OSError:  # including the timeout
        return None
    return int(line)


def _forget_lifelines() -> None:
    """In a forked child: close the parent's lifelines, or a child outliving the parent would
    keep its guards from stopping the servers; and leave the servers to the parent (the
    child's `atexit` must not stop them)."""
    global _LIVE_LOCK
    for lifeline in list(_LIFELINES):
        lifeline.close()
    _LIFELINES.clear()
    _LIVE.clear()
    _LIVE_LOCK = threading.Lock()  # another thread may have held it at the fork


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_all() -> None:
    """Stop every server this process started and has not stopped."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for server in live:
        server.stop(timeout=5.0)


def stop_on_signals() -> None:
    """Make SIGTERM and SIGHUP exit normally (running `finally` blocks and the `atexit` hook
    that stops servers); for command-line tools, from the main thread."""
    def _exit(signum: int, _frame: object) -> None:
        sys.exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit)


atexit.register(stop_all)
os.register_at_fork(after_in_child=_forget_lifelines)
