"""The guard every `ServerProcess` runs through, so that no server outlives Corral.

`python -I guard.py FD -- COMMAND [ARG...]` starts COMMAND in a session of its own (one process
group: the server and every worker it forks), writes the server's pid to the socket FD, and
waits for one of three things:

* the server exits: the guard kills what is left of its group (workers outliving their
  leader) and exits with the server's status (the same code, or death by the same signal), so
  the parent's `Popen` reports the server's exit as if it were the server;
* FD reads end-of-file: the process that started the guard is gone, however it died. Only
  that process holds the other end of the socket, and the kernel closes it on any death,
  SIGKILL included, where no `atexit` hook runs (PR_SET_PDEATHSIG fires when the forking
  *thread* exits, not the process, and signals one process, not a group);
* SIGTERM or SIGHUP to the guard.

In the last two cases the guard sends SIGTERM to the group, SIGKILL after `GRACE_S`, and exits.
The server is reaped only after the last signal to its group, so its pid, the group's id,
cannot have been reused by then. The guard imports only the standard library and runs as a
script in isolated mode: it starts in milliseconds whatever the server's environment.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import NoReturn, Sequence

__all__ = ["GRACE_S", "main"]

GRACE_S = 10.0  # from SIGTERM to SIGKILL when the parent is gone (vLLM shuts down in seconds)
_POLL_S = 0.2  # how often to look at the server where there are no pidfds


def _exited(pid: int) -> bool:
    """Whether the server has exited; it stays unreaped (WNOWAIT), keeping its pid taken."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _wait(pid: int, timeout: float | None, stops: Sequence[socket.socket] = ()) -> bool:
    """True once the server has exited; False when `timeout` s pass or one of `stops` turns
    readable (nobody writes to them: end-of-file on the lifeline, a byte for a signal)."""
    try:
        exits = [os.pidfd_open(pid)]  # readable once the server exits
    except (AttributeError, OSError):
        exits = []  # no pidfds (not Linux 5.3+): poll
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while not _exited(pid):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            step = left if exits else min(_POLL_S, left or _POLL_S)
            ready, _, _ = select.select([*exits, *stops], [], [], step)
            if any(sock in ready for sock in stops):
                return False
        return True
    finally:
        for fd in exits:
            os.close(fd)


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _exit_like(code: int) -> NoReturn:
    """Exit with the server's status: its exit code, or death by the signal that ended it."""
    if code < 0:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's action is the default one
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code if code >= 0 else 128 - code)  # a signal whose default action is not fatal


def main(argv: Sequence[str]) -> NoReturn:
    """Run `FD -- COMMAND [ARG...]` under the guard (see the module docstring)."""
    if len(argv) < 3 or not argv[0].isdigit() or argv[1] != "--":
        sys.exit("usage: python guard.py FD -- COMMAND [ARG...]")
    lifeline = socket.socket(fileno=int(argv[0]))
    # SIGTERM/SIGHUP write a byte to `signalled` instead of killing the guard; installed
    # first, so one arriving at any moment stops the server (exec resets them in the server)
    signalled, wakeup = socket.socketpair()
    wakeup.setblocking(False)
    signal.set_wakeup_fd(wakeup.fileno())
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda _signum, _frame: None)
    try:
        # close_fds (the default) keeps the lifeline out of the server
        server = subprocess.Popen(argv[2:], start_new_session=True)
    except OSError as exc:
        sys.exit(f"OSError: cannot run {argv[2]}: {exc.strerror or exc}")
    try:
        lifeline.sendall(f"{server.pid}\n".encode())
    except OSError:  # the parent went before reading the pid
        done = False
    else:
        done = _wait(server.pid, None, (lifeline, signalled))
    if not done:
        # no "error" here: the last such line of the log is what a start failure names
        sys.stderr.write(f"corral guard: stopping server group {server.pid}: the process that "
                         "started it is gone, or the guard got SIGTERM/SIGHUP\n")
        sys.stderr.flush()
        _killpg(server.pid, signal.SIGTERM)
        _wait(server.pid, GRACE_S)
    _killpg(server.pid, signal.SIGKILL)  # whatever is left of the group (workers)
    _exit_like(server.wait())


if __name__ == "__main__":
    main(sys.argv[1:])
