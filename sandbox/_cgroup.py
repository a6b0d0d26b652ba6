"""Per-sandbox cgroups of the bwrap backend: the spec's pids, memory and cpu limits (cgroup v1,
one dir per controller, or v2), a freezer for snapshots, and draining one before removal."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path

from .spec import Terminal, parse_size

__all__ = ["CGROUP_ROOT", "Cgroup", "thaw", "wait_empty"]

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


class Cgroup:
    """A per-sandbox cgroup (v1: one dir per controller; v2: one dir) with the spec's limits."""

    def __init__(self, name: str, spec: Terminal) -> None:
        self.dirs: list[Path] = []
        mem, cpu = parse_size(spec.memory), spec.cpus
        if (CGROUP_ROOT / "cgroup.controllers").exists():  # v2
            d = CGROUP_ROOT / "corral" / name
            d.mkdir(parents=True)
            self.dirs = [d]
            self._set(d, "pids.max", spec.pids)
            self._set(d, "memory.max", mem)
            self._set(d, "memory.swap.max", 0)
            self._set(d, "cpu.max", f"{int(cpu * 100000)} 100000")
            return
        limits: dict[str, dict[str, object]] = {
            "pids": {"pids.max": spec.pids}, "memory": {"memory.limit_in_bytes": mem},
            "cpu": {"cpu.cfs_period_us": 100000, "cpu.cfs_quota_us": int(cpu * 100000)}}
        if (CGROUP_ROOT / "freezer").is_dir():
            limits["freezer"] = {}  # no limit: what a snapshot freezes the sandbox with
        for ctl, files in limits.items():
            d = CGROUP_ROOT / ctl / "corral" / name
            d.mkdir(parents=True)
            self.dirs.append(d)
            for key, value in files.items():
                self._set(d, key, value)

    @staticmethod
    def _set(d: Path, key: str, value: object) -> None:
        try:
            (d / key).write_text(str(value))
        except OSError as exc:  # e.g. memory.swap.max absent without swap accounting
            log.debug("cgroup %s/%s: %s", d, key, exc)

    @staticmethod
    def available() -> bool:
        """Whether this process may create cgroups."""
        for probe in (CGROUP_ROOT / "cgroup.procs", CGROUP_ROOT / "pids" / "cgroup.procs"):
            if probe.exists():
                return os.access(probe.parent, os.W_OK)
        return False

    @property
    def procs(self) -> str:
        return " ".join(str(d / "cgroup.procs") for d in self.dirs)

    def freeze(self, frozen: bool, limit: float = 5.0) -> bool:
        """Freeze (or thaw) every process of the cgroup and wait until the kernel says so
        (at most `limit` seconds); False where there is no freezer (v1 without the freezer
        controller) or the state was not reached."""
        for d in self.dirs:
            if (d / "cgroup.freeze").exists():  # v2
                file, value, done = d / "cgroup.freeze", "1" if frozen else "0", \
                    lambda d=d: f"frozen {int(frozen)}" in (d / "cgroup.events").read_text()
            elif (d / "freezer.state").exists():  # v1
                file, value, done = d / "freezer.state", "FROZEN" if frozen else "THAWED", \
                    lambda d=d: (d / "freezer.state").read_text().strip() == value
            else:
                continue
            file.write_text(value)
            deadline = time.monotonic() + limit
            while not done() and time.monotonic() < deadline:
                time.sleep(0.001)
            return done()
        return False

    def remove(self) -> None:
        for d in self.dirs:
            try:
                d.rmdir()
            except OSError:
                log.warning("cgroup %s still busy; `corral sandbox gc` removes it later", d)


def thaw(dirs: list[Path]) -> None:
    """Thaw whichever of `dirs` is frozen (a snapshot cut by a SIGKILL of its runner leaves its
    sandbox frozen): a frozen process takes no SIGKILL until thawed, so a kill would hang."""
    for d in dirs:
        for name, value in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
            try:
                (d / name).write_text(value)
            except OSError:  # no freezer here, or the cgroup went away
                continue


def wait_empty(cgroup: Cgroup, limit: float = 5.0) -> None:
    """Wait until the kernel has reaped every process of the cgroup (rmdir needs it empty)."""
    thaw(cgroup.dirs)
    deadline = time.monotonic() + limit
    for d in cgroup.dirs:
        procs = d / "cgroup.procs"
        while procs.exists() and procs.read_text().strip() and time.monotonic() < deadline:
            for pid in procs.read_text().split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.005)
