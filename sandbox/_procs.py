"""Host-side process-group killing through /proc (used by both terminal backends).

Killing from the host needs no process inside the sandbox, so it works even when a fork bomb
has exhausted the sandbox's pids limit, and it takes microseconds instead of a `docker exec`.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Callable, Iterable

def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, pgid) of a live host pid; None if it is gone, a zombie or exiting."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return parse_stat(raw)


def parse_stat(raw: str) -> tuple[int, int] | None:
    """(ppid, pgid) from a `/proc/<pid>/stat` line; None for a process that is not alive.

    A process in the middle of exiting has already dropped its signal handlers, and the kernel
    then reports pgid -1 (and ppid 0) for it before it shows as a zombie; such a pgid must never
    reach `killpg` (-1 is invalid, 0 would be our own group).
    """
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "
    ppid, pgid = int(fields[1]), int(fields[2])
    if fields[0] in ("Z", "X") or pgid <= 0:
        return None
    return ppid, pgid


def parent(pid: int) -> int | None:
    """The parent of a live host pid; None if it is gone."""
    st = _stat(pid)
    return None if st is None else st[0]


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
    if target <= 0:  # 0 and negatives mean "our own group" or "every process" to the kernel
        return
    try:
        fn(target, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def idle_snapshot(pid: int) -> frozenset[int]:
    """What lives under an idle shell's root `pid`: the process groups of its background jobs,
    plus the pids of processes in `pid`'s own group (the shell itself when `pid` is a launcher
    like nsenter). `kill_below(keep=...)` spares them. (Live pids and pgids never collide.)"""
    own = _stat(pid)
    keep = set()
    for p in descendants(pid):
        st = _stat(p)
        if st is not None:
            keep.add(p if own and st[1] == own[1] else st[1])
    return frozenset(keep)


def kill_tree(root: int, keep: frozenset[int], everything: bool,
              sandbox_pids: Callable[[], Iterable[int]]) -> int:
    """`kill_below` while `root` lives. Where it exited already and `everything` is asked
    for, what its process group left behind (background jobs, reparented away from it but
    still in its group), looked for among `sandbox_pids()` so nothing outside the sandbox is
    touched. Returns how many signals were sent."""
    if not everything or _stat(root) is not None:
        return kill_below(root, keep, everything)
    left = [pid for pid in sandbox_pids() if (_stat(pid) or (0, 0))[1] == root]
    for pid in left:
        _signal(os.kill, pid)
    return len(left)


def kill_below(root: int, keep: frozenset[int] = frozenset(), everything: bool = False) -> int:
    """SIGKILL the process groups under `root` (a shell or the exec wrapper), not `root` itself.

    Processes sharing `root`'s own group (a command-substitution subshell) are killed one by one
    so `root` survives. What `keep` names (see `idle_snapshot`: a shell and its earlier
    background jobs) is left alone. Repeats until nothing new appears (a fork bomb). With
    `everything`, `root` and all groups below it die. Returns how many signals were sent.
    """
    info = _stat(root)
    if info is None:
        return 0
    protected = {info[1]}
    if everything:
        keep = frozenset()
    done_pids: set[int] = set()
    done_groups: set[int] = set()
    for _ in range(50):
        hit = 0
        for pid in descendants(root):
            st = _stat(pid)
            if st is None or pid in done_pids or st[1] in done_groups:
                continue
            pgid = st[1]
            if pgid in protected:
                if pid in keep:
                    continue
                _signal(os.kill, pid)
                done_pids.add(pid)
            else:
                if pgid in keep:
                    continue
                _signal(os.killpg, pgid)
                done_groups.add(pgid)
            hit += 1
        if not hit:
            break
    if everything:  # a root that leads its group takes the group: members its tree lost too
        _signal(os.killpg if info[1] == root else os.kill, root)
    return len(done_pids) + len(done_groups) + int(everything)


# Where a Docker container's processes are listed: cgroup v1 or v2, cgroupfs or systemd driver.
_CONTAINER_CGROUPS = ("/sys/fs/cgroup/pids/docker/{id}",
                      "/sys/fs/cgroup/pids/system.slice/docker-{id}.scope",
                      "/sys/fs/cgroup/docker/{id}",
                      "/sys/fs/cgroup/system.slice/docker-{id}.scope")


def container_pids(container_id: str) -> list[int] | None:
    """Host pids of a local Docker container's processes (its cgroup), sorted; None when
    its cgroup is not visible from here (a remote daemon, another pid namespace)."""
    for pattern in _CONTAINER_CGROUPS:
        procs = Path(pattern.format(id=container_id)) / "cgroup.procs"
        try:
            return sorted(int(pid) for pid in procs.read_text().split())
        except OSError:
            continue
    return None


def kill_container(container_id: str) -> bool:
    """SIGKILL every process of a local Docker container through its cgroup. False when the
    cgroup is not found here (then the caller asks the daemon)."""
    pids = container_pids(container_id)
    for pid in pids or []:
        _signal(os.kill, pid)
    return pids is not None


# --- the verify phase: every process of a sandbox, and which of them were there before ---------
def process_key(pid: int) -> tuple[int, int] | None:
    """(pid, start time in clock ticks) of a live host pid: unlike the pid alone, never the
    key of a later process that reuses the number."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return pid, int(fields[19])  # field 22 of stat: starttime


def owner_alive(pid: int, start: int | None = None) -> bool:
    """Whether the process that recorded itself as (`pid`, `start`: its start time, field 22
    of stat) is still running: the pid alone may be another process's by now. A record
    without a start time (an older version's) trusts the pid."""
    key = process_key(pid)
    return key is not None and (start is None or key[1] == int(start))


def own_start() -> int:
    """This process's start time in clock ticks, as `process_key` reads it."""
    key = process_key(os.getpid())
    assert key is not None
    return key[1]


def init_and_first_child(keys: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
    """Of the `process_key`s of one pid namespace: its init (pid 1 inside) and the first child
    init started (a container's main process). Later children of init are orphans it adopted,
    so they started after that first child and are not in the result."""
    keys = list(keys)
    init = next((k for k in keys if inner_pid(k[0]) == 1), None)
    if init is None:
        return set()
    children = [k for k in keys if k != init and (_stat(k[0]) or (0, 0))[0] == init[0]]
    first = min(children, key=lambda k: (k[1], inner_pid(k[0]) or 0), default=None)
    return {init} if first is None else {init, first}


def unmapped(pid: int) -> bool:
    """Whether a host pid runs without user-namespace remapping (its root is this host's root);
    OSError if it is gone."""
    return Path(f"/proc/{pid}/uid_map").read_text().split()[:3] == ["0", "0", "4294967295"]


def inner_pid(pid: int) -> int | None:
    """A host pid's number in its own (innermost) pid namespace."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return None


def namespace_pids(pid: int) -> list[int]:
    """Host pids of every process in `pid`'s pid namespace (a nested namespace's processes
    are found as descendants of its members)."""
    try:
        ns = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") == ns:
                found.append(int(entry))
        except OSError:
            continue
    return found


def session_process(root: int, inside: Iterable[int]) -> int | None:
    """The process of a shell session in a sandbox whose processes are `inside` (host pids):
    the session's host pid `root` itself when it runs there (a Docker exec or FIFO shell),
    else its first descendant that does (a launcher's, like nsenter's, shell); None when none
    does. Its own jobs are below it, so they are not the result."""
    members = set(inside)
    if root in members:
        return root
    return next((pid for pid in descendants(root) if pid in members), None)


def kill_all(listing: Callable[[], Iterable[int]], keep: frozenset[tuple[int, int]],
             rounds: int = 50) -> int:
    """SIGKILL every process `listing()` names (host pids) whose `process_key` is not in
    `keep`, repeating until none is left (a fork bomb, a respawning loop). Returns how many
    were signalled."""
    done: set[tuple[int, int]] = set()
    for _ in range(rounds):
        targets = [k for k in map(process_key, listing())
                   if k and k not in keep and k not in done]
        if not targets:
            break
        for key in targets:
            _signal(os.kill, key[0])
            done.add(key)
    return len(done)
