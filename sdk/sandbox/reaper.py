"""Orphan collection: containers, bwrap dirs and cgroups left by crashed or killed runs.

`gc(run=None)` removes every container labelled `corral.managed=1` (only those of one run with
`run=`), every bwrap sandbox dir whose owning process is gone (or of that run) and the empty
per-sandbox cgroups. CLI: `corral sandbox gc [--run RUN]`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass

from ..errors import SandboxError
from .bwrap import CGROUP_ROOT, sandboxes_dir
from .docker import LABEL_RUN
from .images import LABEL_MANAGED, docker_client

log = logging.getLogger(__name__)


@dataclass
class GcReport:
    """What `gc` removed."""

    containers: int = 0
    bwrap_dirs: int = 0
    cgroups: int = 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def gc_containers(run: str | None = None) -> int:
    """Remove (force) the managed containers, optionally of one run. Returns the count."""
    labels = [f"{LABEL_MANAGED}=1"] + ([f"{LABEL_RUN}={run}"] if run else [])
    api = docker_client().api
    removed = 0
    for c in api.containers(all=True, filters={"label": labels}):
        try:
            api.remove_container(c["Id"], force=True)
            removed += 1
        except Exception as exc:  # a concurrent removal is fine
            log.debug("remove %s: %s", c["Id"][:12], exc)
    return removed


def gc_bwrap(run: str | None = None) -> tuple[int, int]:
    """Remove bwrap sandbox dirs whose owner process died (or of `run`) and their cgroups."""
    dirs = cgroups = 0
    root = sandboxes_dir()
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        try:
            owner = json.loads((d / "owner.json").read_text())
        except (OSError, ValueError):
            owner = {"pid": 0, "run": None}
        if run is not None and owner.get("run") != run:
            continue
        if run is None and owner.get("pid") and _pid_alive(int(owner["pid"])):
            continue
        shutil.rmtree(d, ignore_errors=True)
        dirs += 1
        for parent in (CGROUP_ROOT / "corral", *CGROUP_ROOT.glob("*/corral")):
            cg = parent / d.name
            if cg.is_dir():
                try:
                    cg.rmdir()
                    cgroups += 1
                except OSError as exc:
                    log.warning("cgroup %s still has processes: %s", cg, exc)
    return dirs, cgroups


def gc(run: str | None = None, docker: bool = True) -> GcReport:
    """Remove orphaned sandboxes of every backend (see module docstring)."""
    report = GcReport()
    if docker:
        try:
            report.containers = gc_containers(run)
        except SandboxError as exc:  # no daemon: nothing of docker's to collect
            log.info("skipping containers: %s", exc)
    report.bwrap_dirs, report.cgroups = gc_bwrap(run)
    return report


__all__ = ["GcReport", "gc", "gc_bwrap", "gc_containers"]
