"""What changed in a sandbox's filesystem since a moment, read from the host.

Both terminal backends keep a sandbox's writes in an overlayfs upper directory on the host (the
container's writable layer for Docker, the sandbox's own upper dir for bwrap). Walking it from
the host lists exactly the paths the sandbox created, changed or deleted (deletions are
whiteouts there), and each entry's inode change time (ctime) says when: `touch -d` and friends
set mtime and atime, never ctime, and nothing inside a sandbox may set the clock.
"""

from __future__ import annotations

import os
from pathlib import Path


def changed_since(upper: Path, since: float, limit: int = 200_000) -> list[str]:
    """Sandbox paths ("/etc/x") under the upper dir `upper` whose ctime is after `since` (host
    `time.time()`), at most `limit` of them (a disk-filling agent makes millions)."""
    found: list[str] = []
    for folder, dirs, files in os.walk(upper):
        for name in (*dirs, *files):
            path = os.path.join(folder, name)
            try:
                if os.lstat(path).st_ctime > since:
                    found.append("/" + os.path.relpath(path, upper))
            except OSError:  # gone while walking
                continue
            if len(found) >= limit:
                return found
    return found


def ctimes(upper: Path, limit: int = 200_000) -> dict[str, float]:
    """Every sandbox path under the upper dir `upper` with its ctime (at most `limit`): what a
    fork's layer remembers of when its files changed (copying resets ctime)."""
    found: dict[str, float] = {}
    for folder, dirs, files in os.walk(upper):
        for name in (*dirs, *files):
            path = os.path.join(folder, name)
            try:
                found["/" + os.path.relpath(path, upper)] = os.lstat(path).st_ctime
            except OSError:  # gone while walking
                continue
            if len(found) >= limit:
                return found
    return found


def exists(upper: str | None) -> Path | None:
    """`upper` as a Path when it is a directory visible here."""
    return Path(upper) if upper and os.path.isdir(upper) else None
