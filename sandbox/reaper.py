"""Orphan collection: containers, bwrap dirs and cgroups left by crashed or killed runs.

`gc()` removes the sandboxes whose creating process is gone: containers labelled
`corral.managed=1` whose `corral.owner` (host:pid, with `corral.owner_start` its start time)
is dead, bwrap dirs likewise, and their cgroups. An owner is alive while its pid runs with the
start time it recorded (a reused pid is not the owner). Cgroups are the machine's, not a
cache's: each is decided by its owner record's copy in `MOUNT_ROOT` (`bwrap.cgroup_record`),
so a reaper with another `CORRAL_CACHE` spares the live sandboxes of every cache.
`gc(run=RUN)` removes every sandbox of that run; `gc(everything=True)` every managed
container, live or not. CLI: `corral sandbox gc [--run RUN] [--all]`.

Both also prune the bwrap backend's rootfs cache: the exports of images the local daemon no
longer holds (`rootfs.prune_exports`), but those a live sandbox runs on or used in the last
`EXPORT_GRACE_S`, so a cache that every rebuilt image adds to does not fill the disk.

Forked and snapshot layers of the bwrap backend (`_layers`) go with their owner too, once no
live sandbox runs on them: `gc_layers`; so do the docker backend's committed fork images
(`gc_images`, after the containers, which may run on them). A durable snapshot (its layer and
the layers under it, or its image) outlives its owner, for a resume; only `gc(run=RUN)` removes
it.

Networks of compose services (`services.py`) carry the same labels and go with their
containers.

`reap_run(RUN)` is what a run calls before it starts (a resume after a crash or SIGKILL): the
sandboxes of RUN whose creating process is gone (containers by the `corral.run` label, bwrap
dirs by their owner record, and their cgroups), sparing those of a live process that shares the
run id.

Containers are collected on every Docker host: the local daemon (`DOCKER_HOST`, else the local
socket) and the fleet's (`CORRAL_DOCKER_HOSTS`, or a run's `DockerConfig.hosts`), each reaped on
its own; a host that does not answer its health check is skipped (its fleet reaps what it
could not remove once it answers again).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import SandboxError
from . import _layers
from ._cgroup import thaw
from ._procs import owner_alive
from .services import remove_networks
from .bwrap import (CGROUP_ROOT, MOUNT_ROOT, OWNER_SUFFIX, cgroup_record, owner_record,
                    sandboxes_dir)
from .base import BackendConfig
from ._dockerfork import changes_dir, changes_file
from .containers import LABEL_FORK, LABEL_OWNER, LABEL_OWNER_START, LABEL_RUN, io_root, remove_image
from .docker import DockerConfig
from .fleet import (DockerHost, DockerHostConfig, configured_hosts, default_host, shared_host,
                    unreachable)
from .daemon import LABEL_MANAGED
from .rootfs import prune_exports

# a bwrap dir without an owner record (made by an older version) or a record not yet written
# in full, younger than this, is spared: it may be being made
OWNERLESS_GRACE_S = 60.0
# an export (or a temporary folder of one) used or touched this recently is never pruned
EXPORT_GRACE_S = 600.0

log = logging.getLogger(__name__)


@dataclass
class GcReport:
    """What `gc` removed."""

    containers: int = 0
    fork_images: int = 0
    bwrap_dirs: int = 0
    bwrap_layers: int = 0
    cgroups: int = 0
    rootfs_exports: int = 0


def _orphaned(labels: dict[str, str], mine: bool = False) -> bool:
    """Whether the container's creating process is gone (or, with `mine`, is this one)."""
    host, _, pid = labels.get(LABEL_OWNER, "").rpartition(":")
    if not pid.isdigit():
        return True  # not made by a sandbox (e.g. an export helper) or by an old version
    if mine and host == socket.gethostname() and int(pid) == os.getpid():
        return True
    start = labels.get(LABEL_OWNER_START, "")
    return host == socket.gethostname() and not owner_alive(
        int(pid), int(start) if start.isdigit() else None)


def docker_hosts(hosts: Sequence[str | DockerHostConfig] | None = None) -> list[DockerHost]:
    """The local daemon and the fleet's hosts (`hosts`, else `CORRAL_DOCKER_HOSTS`)."""
    configs = configured_hosts() if hosts is None else DockerConfig(hosts=tuple(hosts)).hosts
    local = default_host()
    return [local, *(shared_host(c) for c in configs if c.url != local.url)]


def hosts_of(backend: str | BackendConfig | None) -> tuple[DockerHostConfig, ...] | None:
    """The Docker hosts a run's `sandbox_backend` names (None: the configured ones)."""
    return backend.hosts or None if isinstance(backend, DockerConfig) else None


def gc_containers(run: str | None = None, everything: bool = False,
                  orphans_only: bool = False, mine: bool = False,
                  hosts: Sequence[str | DockerHostConfig] | None = None) -> int:
    """Remove (force) managed containers on every Docker host (`docker_hosts(hosts)`):
    orphaned ones, all of `run` (only its orphaned ones with `orphans_only`), or all, and the
    shell pipe dirs of containers that no longer exist. Returns the count removed; raises
    SandboxError when no host answers."""
    removed, answered, complete = 0, 0, True
    kept: set[str] = set()  # names of the containers left, whose pipe dirs stay
    for host in docker_hosts(hosts):
        try:  # the local daemon is not waited for; a fleet host gets its bounded health check
            if not host.check():
                raise SandboxError(f"Docker host {host.url} does not answer ({host.reason})")
            removed += _gc_host(host.client().api, kept, run, everything, orphans_only, mine)
            answered += 1
        except Exception as exc:
            if not isinstance(exc, SandboxError) and not unreachable(exc):
                raise
            log.info("skipping containers on %s: %s", host.url, exc)
            complete = complete and not host.local  # its pipe dirs may still be in use
    if not answered:
        raise SandboxError("no Docker daemon answers")
    if complete:
        _gc_io_dirs(kept)
    return removed


def _gc_host(api: Any, kept: set[str], run: str | None, everything: bool, orphans_only: bool,
             mine: bool) -> int:
    """`gc_containers` on one daemon; adds the names of the containers left to `kept`."""
    removed = 0

    def doomed(labels: dict[str, str]) -> bool:
        if run:
            return labels.get(LABEL_RUN) == run and (not orphans_only or _orphaned(labels, mine))
        return everything or _orphaned(labels)

    for c in api.containers(all=True, filters={"label": f"{LABEL_MANAGED}=1"}):
        labels = c.get("Labels") or {}
        names = {n.lstrip("/") for n in c.get("Names") or []}
        if not doomed(labels):
            kept |= names
            continue
        try:
            api.remove_container(c["Id"], force=True)
            removed += 1
        except Exception as exc:  # a concurrent removal is fine
            log.debug("remove %s: %s", c["Id"][:12], exc)
    remove_networks(api, doomed)  # compose services' networks, once their containers went
    return removed


def gc_images(run: str | None = None, orphans_only: bool = False, mine: bool = False,
              hosts: Sequence[str | DockerHostConfig] | None = None) -> int:
    """Remove the committed images of docker forks and snapshots (`LABEL_FORK`) whose owner
    died (or of `run`, as `gc_containers`), on every Docker host that answers; durable ones
    only with `run` and not `orphans_only`. One a container still runs on stays for the next
    gc. Returns the count removed."""
    removed, complete = 0, True
    held: set[str] = set()  # the fork images the hosts still have
    for host in docker_hosts(hosts):
        try:
            if not host.check():
                complete = False
                continue
            images = host.client().api.images(filters={"label": LABEL_FORK})
        except Exception as exc:
            if not unreachable(exc):
                raise
            complete = False
            continue
        held |= {image["Id"] for image in images}
        for image in images:
            labels = image.get("Labels") or {}
            if run:
                doomed = labels.get(LABEL_RUN) == run and (not orphans_only
                                                           or _orphaned(labels, mine))
            else:
                doomed = _orphaned(labels)
            if labels.get(LABEL_FORK) == "durable" and (run is None or orphans_only):
                doomed = False
            if doomed and remove_image(host, image["Id"]):
                changes_file(image["Id"]).unlink(missing_ok=True)
                held.discard(image["Id"])
                removed += 1
    if complete:
        _gc_changes_files(held)
    return removed


def _gc_changes_files(kept: set[str]) -> None:
    """Remove the change-time files of committed images no host holds any more (an image
    removed by other means); one younger than the grace period may be being made."""
    root = changes_dir()
    for record in root.glob("*.json") if root.is_dir() else []:
        if record.stem.replace("_", ":", 1) not in kept and _age(record) > OWNERLESS_GRACE_S:
            record.unlink(missing_ok=True)


def _gc_io_dirs(kept: set[str]) -> None:
    """Remove the shell pipe dirs of containers not in `kept` (a killed run's). A dir younger
    than the grace period may belong to a container being created."""
    root = io_root()
    for d in root.iterdir() if root.is_dir() else []:
        if d.name not in kept and _age(d) > OWNERLESS_GRACE_S:
            shutil.rmtree(d, ignore_errors=True)


def gc_bwrap(run: str | None = None, orphans_only: bool = False,
             mine: bool = False) -> tuple[int, int]:
    """Remove bwrap sandbox dirs (and owner records) whose owner process died (or of `run`;
    with `orphans_only` those of `run` whose owner died), and the cgroups of sandboxes without
    a live owner (killing what still runs in them)."""
    dirs = cgroups = 0
    root = sandboxes_dir()
    prefix = None if run is None else run.replace("/", "_") + "-"  # as bwrap names them
    parents = [CGROUP_ROOT / "corral", *CGROUP_ROOT.glob("*/corral")]
    for cg in [c for p in parents if p.is_dir() for c in p.iterdir() if c.is_dir()]:
        if prefix is not None and not cg.name.startswith(prefix):
            continue
        # decided per cgroup, now, by its owner's record in MOUNT_ROOT (whatever cache made
        # it), else the one in this cache: a sandbox created meanwhile has its records (made
        # before its cgroup) and a sandbox closing drops its cgroup before its records
        shared = cgroup_record(cg.name)
        if shared.exists() or not _known(root / cg.name):
            if shared.exists() and not _stale_record(shared, run, orphans_only, mine):
                continue
        elif not _stale(root / cg.name, run, orphans_only, mine):
            continue
        try:
            pids = (cg / "cgroup.procs").read_text().split()
        except FileNotFoundError:
            continue  # its sandbox closed meanwhile
        thaw([p / cg.name for p in parents])  # every controller's, before any kill
        for pid in pids:
            try:  # an orphaned sandbox still running: its owner is gone
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        _wait_drained(cg / "cgroup.procs")
        try:
            cg.rmdir()
            cgroups += 1
        except FileNotFoundError:  # its sandbox closed and removed it meanwhile
            continue
        except OSError as exc:
            log.warning("cgroup %s still has processes: %s", cg, exc)
    _gc_cgroup_records(parents, prefix, run, orphans_only, mine)
    # Dirs after cgroups: an orphan's processes are dead by now, so nothing still writes into
    # (or holds) the dir being removed. Its record goes last, so a gc killed mid-way leaves the
    # rest attributable to the next one.
    for d in _sandbox_dirs(root):
        if _stale(d, run, orphans_only, mine):
            existed = d.exists()
            shutil.rmtree(d, ignore_errors=True)
            for mnt in MOUNT_ROOT.glob(f"{d.name}-*"):  # its overlay's (empty) mount point
                with contextlib.suppress(OSError):
                    mnt.rmdir()
            if not d.exists():
                owner_record(d).unlink(missing_ok=True)
                dirs += existed
    return dirs, cgroups


def gc_layers(run: str | None = None, orphans_only: bool = False, mine: bool = False) -> int:
    """Remove the bwrap layers (`_layers`) no live sandbox runs on whose owner died (or of
    `run`; with `orphans_only` those of `run` whose owner died), sparing durable snapshots'
    but with `run` and not `orphans_only`. Returns how many were removed."""
    root = _layers.layers_dir()
    if not root.is_dir():
        return 0
    names = {e.name[1:-len(_layers.RECORD_SUFFIX)] if e.name.startswith(".") else e.name
             for e in root.iterdir() if e.is_dir() or e.name.endswith(_layers.RECORD_SUFFIX)}
    in_use: set[str] = set()
    for sandbox_dir in _sandbox_dirs(sandboxes_dir()):
        try:
            owner = json.loads(owner_record(sandbox_dir).read_text())
        except (OSError, ValueError):
            continue
        if _alive(owner) and not (mine and owner.get("pid") == os.getpid()):
            in_use.update(owner.get("layers", ()))
    doomed = {name for name in names if _layer_doomed(root / name, run, orphans_only, mine)}
    for name in names - doomed:  # a kept durable snapshot keeps the layers under it
        record = _layers.read_record(root / name) or {}
        in_use.update(record.get("below", ()) if record.get("durable") else ())
    removed = 0
    for name in sorted(doomed - in_use):
        existed = (root / name).exists()
        _layers.remove_layer(root / name)
        removed += existed
    return removed


def _layer_doomed(layer: Path, run: str | None, orphans_only: bool, mine: bool) -> bool:
    record = _layers.layer_record(layer)
    if not record.exists():  # made by a process killed before its record (never: written first)
        return _age(layer) > OWNERLESS_GRACE_S
    if not _stale_record(record, run, orphans_only, mine):
        return False
    durable = bool((_layers.read_record(layer) or {}).get("durable"))
    return not durable or (run is not None and not orphans_only)


def _gc_cgroup_records(parents: list[Path], prefix: str | None, run: str | None,
                       orphans_only: bool, mine: bool) -> None:
    """Remove the MOUNT_ROOT records of dead owners whose cgroups are gone."""
    for record in MOUNT_ROOT.glob(f".*{OWNER_SUFFIX}") if MOUNT_ROOT.is_dir() else []:
        name = record.name[1:-len(OWNER_SUFFIX)]
        if prefix is not None and not name.startswith(prefix):
            continue
        if any((p / name).exists() for p in parents):
            continue
        if _stale_record(record, run, orphans_only, mine):
            record.unlink(missing_ok=True)


def prune_rootfs() -> int:
    """Remove the rootfs exports of images the daemon no longer holds that no live bwrap
    sandbox runs on (see module docstring); 0 when the daemon does not answer, or when a live
    sandbox's record (of an older version) does not say which export it runs on."""
    in_use: set[str] = set()
    for sandbox_dir in _sandbox_dirs(sandboxes_dir()):
        try:
            owner = json.loads(owner_record(sandbox_dir).read_text())
        except (OSError, ValueError):  # no record, or one being written: its owner is alive
            if sandbox_dir.exists() or owner_record(sandbox_dir).exists():
                return 0
            continue
        if _alive(owner):
            if "rootfs" not in owner:
                return 0
            in_use.add(owner["rootfs"])
    try:
        return prune_exports(in_use, EXPORT_GRACE_S)
    except SandboxError as exc:
        log.info("leaving the rootfs cache as it is: %s", exc)
        return 0


def _sandbox_dirs(root: Path) -> list[Path]:
    """Every bwrap sandbox under `root`, by its dir or its owner record (a process killed
    before making its dir, or after removing it, leaves the record alone)."""
    names = set()
    for entry in root.iterdir() if root.is_dir() else []:
        if entry.name.startswith(".") and entry.name.endswith(OWNER_SUFFIX):
            names.add(entry.name[1:-len(OWNER_SUFFIX)])
        elif entry.is_dir():
            names.add(entry.name)
    return [root / name for name in sorted(names)]


def _known(sandbox_dir: Path) -> bool:
    return sandbox_dir.is_dir() or owner_record(sandbox_dir).exists()


def _alive(owner: dict[str, Any]) -> bool:
    """Whether the process an owner record names (pid and start time) still runs."""
    pid, start = owner.get("pid"), owner.get("start")
    return bool(pid) and owner_alive(int(pid), None if start is None else int(start))


def _stale(sandbox_dir: Path, run: str | None, orphans_only: bool = False,
           mine: bool = False) -> bool:
    """Whether a bwrap sandbox belongs to `run` (given; and to an owner that died, with
    `orphans_only`) or to an owner that died."""
    if not owner_record(sandbox_dir).exists():  # a dir made by an older version: no record
        return _age(sandbox_dir) > OWNERLESS_GRACE_S
    return _stale_record(owner_record(sandbox_dir), run, orphans_only, mine)


def _stale_record(record: Path, run: str | None, orphans_only: bool = False,
                  mine: bool = False) -> bool:
    """`_stale` by one owner record (a cache's, or the cgroup's copy in MOUNT_ROOT)."""
    try:
        owner = json.loads(record.read_text())
    except FileNotFoundError:  # removed meanwhile: its sandbox closed
        return False
    except (OSError, ValueError):  # being written now, or its writer died mid-write
        return _age(record) > OWNERLESS_GRACE_S
    dead = not _alive(owner) or (mine and owner.get("pid") == os.getpid())
    if run is not None:
        return owner.get("run") == run and (dead or not orphans_only)
    return dead


def _age(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0


def _wait_drained(procs: Path, limit: float = 5.0) -> None:
    deadline = time.monotonic() + limit
    try:
        while procs.read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.01)
    except FileNotFoundError:
        pass  # removed meanwhile: nothing left to drain


def gc(run: str | None = None, everything: bool = False, docker: bool = True,
       hosts: Sequence[str | DockerHostConfig] | None = None) -> GcReport:
    """Remove orphaned sandboxes of every backend (see module docstring)."""
    report = GcReport()
    if docker:
        try:
            report.containers = gc_containers(run, everything, hosts=hosts)
            report.fork_images = gc_images(run, hosts=hosts)
        except SandboxError as exc:  # no daemon: nothing of docker's to collect
            log.info("skipping containers: %s", exc)
    report.bwrap_dirs, report.cgroups = gc_bwrap(run)
    report.bwrap_layers = gc_layers(run)
    report.rootfs_exports = prune_rootfs()
    return report


def reap_run(run: str, *, mine: bool = False,
             backend: str | BackendConfig | None = None) -> GcReport:
    """Remove the sandboxes of `run` left by processes that are gone (see module docstring),
    and with `mine` those of this process too (a run that closed all of its own: anything
    left is a leak, e.g. a container whose create finished after its caller was cancelled).
    `backend`: the run's sandbox backend (a `DockerConfig` names its hosts). A daemon that
    does not answer is skipped, not waited for."""
    report = GcReport()
    try:
        report.containers = gc_containers(run, orphans_only=True, mine=mine,
                                          hosts=hosts_of(backend))
        report.fork_images = gc_images(run, orphans_only=True, mine=mine,
                                       hosts=hosts_of(backend))
    except SandboxError as exc:
        log.info("skipping containers: %s", exc)
    report.bwrap_dirs, report.cgroups = gc_bwrap(run, orphans_only=True, mine=mine)
    report.bwrap_layers = gc_layers(run, orphans_only=True, mine=mine)
    report.rootfs_exports = prune_rootfs()
    if report.containers or report.bwrap_dirs or report.cgroups:
        log.warning("run %s: reaped %d containers, %d bwrap dirs and %d cgroups left by a "
                    "process that is gone", run, report.containers, report.bwrap_dirs,
                    report.cgroups)
    return report


__all__ = ["GcReport", "docker_hosts", "gc", "gc_bwrap", "gc_containers", "gc_images",
           "gc_layers", "prune_rootfs", "reap_run"]
