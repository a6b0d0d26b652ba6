"""Restart the local dockerd the way `scripts/dev.sh` starts it (`setsid dockerd`)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

LOG = Path("/var/log/corral-dockerd.log")
PIDFILE = Path("/var/run/docker.pid")  # dockerd's default --pidfile


def docker_up() -> bool:
    """Whether `docker info` answers."""
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (an exited dockerd waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def dockerd_pid() -> int | None:
    """The pid of the machine's dockerd, if it runs: the one holding the default pidfile.
    Other daemons on the machine (a test fleet's, with pidfiles of their own) are not it."""
    try:
        pid = int(PIDFILE.read_text().strip())
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError):
        return None
    return pid if comm == "dockerd" and _running(pid) else None


def _wait(condition, limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {limit:.0f} s")
        time.sleep(0.1)


def start_dockerd(limit: float = 60.0) -> None:
    """Start dockerd (detached, as dev.sh does) unless one runs; wait for `docker info`."""
    if dockerd_pid() is None:  # detached as dev.sh does: it must not be this process's child
        subprocess.run(["sh", "-c", f"(setsid dockerd >>{LOG} 2>&1 &)"], check=True)
    _wait(docker_up, limit, "dockerd did not answer")


def restart_dockerd(limit: float = 60.0) -> float:
    """SIGTERM dockerd, wait for it to exit, start it again; returns the seconds it was down.
    dockerd runs again when this returns or raises (unless it cannot start at all)."""
    pid = dockerd_pid()
    began = time.monotonic()
    try:
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            _wait(lambda: not _running(pid), limit, "dockerd did not stop")
    finally:
        start_dockerd(limit)
    return time.monotonic() - began
