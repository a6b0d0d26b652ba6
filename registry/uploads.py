"""Uploads in progress: fresh `.part` files in a store's temp folder, each locked (`flock`) by its
writer while it writes, so `recover` reclaims exactly the files of writers that died."""

from __future__ import annotations

import fcntl
import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

__all__ = ["recover", "temp_file", "temp_path"]


def temp_path(folder: Path) -> Path:
    """A fresh path in `folder`, named after this process."""
    return folder / f"{os.getpid()}-{uuid.uuid4().hex}.part"


@contextmanager
def temp_file(folder: Path) -> Iterator[tuple[Path, IO[bytes]]]:
    """A fresh temp file in `folder`, open for writing and locked (`flock`) until the block ends,
    then removed if still there. The lock, not the writer's pid, tells `recover` the file is in
    use: the kernel drops it with the writer's descriptors, so the file of a writer that died is
    reclaimable at once, even while its pid lives on as an unreaped zombie."""
    while True:
        path = temp_path(folder)
        fh = open(path, "xb")
        fcntl.flock(fh, fcntl.LOCK_EX)
        # A `recover` may have locked and removed the file between open and flock: retry.
        if path.exists() and path.stat().st_ino == os.fstat(fh.fileno()).st_ino:
            break
        fh.close()
    try:
        yield path, fh
    finally:
        fh.close()
        path.unlink(missing_ok=True)


def recover(folder: Path) -> int:
    """Delete the temp files in `folder` no writer holds locked (see `temp_file`): uploads and
    pulls of processes that died; returns how many."""
    removed = 0
    for path in folder.glob("*.part"):
        try:
            fh = open(path, "rb")
        except FileNotFoundError:
            continue
        with fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live writer, maybe in this very process
            path.unlink(missing_ok=True)
            removed += 1
    return removed
