"""What a run left behind and what its store holds: lost, duplicated, leaked, infra share."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from corral.runner.store import TRAJECTORIES, load_run
from corral.sandbox.bwrap import CGROUP_ROOT, OWNER_SUFFIX, sandboxes_dir

MARKER = "CORRAL_FAULT_RUN"  # set in a collector's environment; its children inherit it


@dataclass
class Census:
    """One run's outcome after its collectors exited."""

    expected: int
    stored: int
    lost: int
    duplicated: int
    infra_errors: int
    leaked_containers: int
    leaked_processes: int
    leaked_bwrap: int

    @property
    def infra_error_share(self) -> float:
        return self.infra_errors / max(1, self.stored)

    def line(self) -> str:
        return (f"lost={self.lost} duplicated={self.duplicated} "
                f"leaked_containers={self.leaked_containers} "
                f"leaked_processes={self.leaked_processes} leaked_bwrap={self.leaked_bwrap} "
                f"infra_error_share={self.infra_error_share:.4f} "
                f"(trajectories={self.stored}/{self.expected}, infra_errors={self.infra_errors})")


def expected_ids(n: int, group: int) -> set[str]:
    """The work-item ids `Runner.collect(n, group=group)` plans."""
    return {f"g{g:06d}-s{s:03d}" for g in range(-(-n // group)) for s in range(group)
            if g * group + s < n}


def run_containers(run_id: str) -> list[str]:
    """Containers (any state) labelled with `run_id`."""
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=corral.run={run_id}"],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def bwrap_leftovers(run_id: str) -> list[Path]:
    """bwrap sandbox dirs, owner records and cgroups of `run_id`."""
    prefix = run_id.replace("/", "_") + "-"
    found = [d for d in sandboxes_dir().glob(f"{prefix}*") if d.is_dir()]
    found += sandboxes_dir().glob(f".{prefix}*{OWNER_SUFFIX}")
    for parent in [CGROUP_ROOT / "corral", *CGROUP_ROOT.glob("*/corral")]:
        found += [c for c in parent.glob(f"{prefix}*") if c.is_dir()]
    return found


def run_processes(run_id: str) -> list[int]:
    """Processes (not this one) whose command line names `run_id` (bwrap launchers name their
    sandbox dir) or whose environment carries the collector's marker for it."""
    needle, marker = run_id.encode(), f"{MARKER}={run_id}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "cmdline").read_bytes() or \
                    marker in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def take(run_dir: Path, run_id: str, n: int, group: int) -> Census:
    """Count a finished run: `load_run`'s view against the plan, raw store lines for copies."""
    want = expected_ids(n, group)
    _, trajectories = load_run(run_dir)
    ids = [t.id for t in trajectories]
    finals: dict[str, int] = {}  # non-infra lines per id in the raw store: >1 is a duplicate
    for raw in (run_dir / TRAJECTORIES).read_bytes().splitlines():
        data = json.loads(raw)
        if data.get("status") != "infra_error":
            finals[data["id"]] = finals.get(data["id"], 0) + 1
    duplicated = (len(ids) - len(set(ids))) + sum(c - 1 for c in finals.values())
    return Census(expected=len(want), stored=len(set(ids) & want), lost=len(want - set(ids)),
                  duplicated=duplicated,
                  infra_errors=sum(t.status.value == "infra_error" for t in trajectories),
                  leaked_containers=len(run_containers(run_id)),
                  leaked_processes=len(run_processes(run_id)),
                  leaked_bwrap=len(bwrap_leftovers(run_id)))
