"""Host-side process-group killing through /proc (used by both terminal backends).

Killing from the host needs no process inside the sandbox, so it works even when a fork bomb
has exhausted the sandbox's pids limit, and it takes microseconds instead of a `docker exec`.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

_HZ = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, int, float] | None:
    """(ppid, pgid, start time in seconds since boot) of a live host pid; None if it is gone
    or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[2]), int(fields[19]) / _HZ


def children(pid: int) -> list[int]:
    """Direct children of a host pid."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            out += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            continue
    return out


def descendants(pid: int) -> list[int]:
    """Every live descendant of a host pid (breadth first)."""
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def _signal(fn, target: int) -> None:
    try:
        fn(target, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_below(root: int, since: float | None = None, everything: bool = False) -> int:
    """SIGKILL the process groups under `root` (a shell or the exec wrapper), not `root` itself.

    Processes sharing `root`'s own group (a command-substitution subshell) are killed one by one
    so `root` survives. With `since`, only groups whose leader started at or after that boot
    time are touched: background jobs from earlier shell commands live on. Repeats until
    nothing new appears (a fork bomb). Returns how many signals were sent.
    """
    info = _stat(root)
    if info is None:
        return 0
    protected = {info[1]}
    slack = 1.0 / _HZ  # start times have clock-tick resolution
    done_pids: set[int] = set()
    done_groups: set[int] = set()
    for _ in range(50):
        hit = 0
        for pid in descendants(root):
            st = _stat(pid)
            if st is None or pid in done_pids or st[1] in done_groups:
                continue
            _, pgid, started = st
            if pgid in protected:
                if since is None or started + slack >= since:
                    _signal(os.kill, pid)
                    done_pids.add(pid)
                    hit += 1
                continue
            leader = _stat(pgid)
            leader_start = leader[2] if leader else started
            if since is None or leader_start + slack >= since:
                _signal(os.killpg, pgid)
                done_groups.add(pgid)
                hit += 1
        if not hit:
            break
    if everything:
        _signal(os.kill, root)
    return len(done_pids) + len(done_groups) + int(everything)
