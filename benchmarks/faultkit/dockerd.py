"""Restart the local dockerd the way `scripts/dev.sh` starts it (`setsid dockerd`)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

LOG = Path("/var/log/corral-dockerd.log")


def docker_up() -> bool:
    """Whether `docker info` answers."""
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def dockerd_pid() -> int | None:
    """The pid of the running dockerd, if any."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "comm").read_text().strip() == "dockerd":
                    return int(proc.name)
            except OSError:
                continue
    return None


def _wait(condition, limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {limit:.0f} s")
        time.sleep(0.1)


def start_dockerd(limit: float = 60.0) -> None:
    """Start dockerd (detached, as dev.sh does) unless one runs; wait for `docker info`."""
    if dockerd_pid() is None:
        with open(LOG, "ab") as log:
            subprocess.Popen(["dockerd"], stdout=log, stderr=log, start_new_session=True)
    _wait(docker_up, limit, "dockerd did not answer")


def restart_dockerd(limit: float = 60.0) -> float:
    """SIGTERM dockerd, wait for it to exit, start it again; returns the seconds it was down.
    dockerd runs again when this returns or raises (unless it cannot start at all)."""
    pid = dockerd_pid()
    began = time.monotonic()
    try:
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            _wait(lambda: not Path(f"/proc/{pid}").exists()
                  or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[-1][:3],
                  limit, "dockerd did not stop")
    finally:
        start_dockerd(limit)
    return time.monotonic() - began
