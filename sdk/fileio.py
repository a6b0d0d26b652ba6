"""Crash-safe file writes shared by every layer (run stores, train manifests, lock files).

A write goes to a temporary file beside the target, is flushed and fsync'd, then renamed over
the target, and the directory is fsync'd: a process killed at any instant leaves the old file
or the new one, whole, never a torn mix. A folder built once (a converted model) is built in a
hidden sibling and renamed into place (`build_dir_once`): if it exists, it is complete.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

__all__ = ["build_dir_once", "fsync_dir", "write_json_atomic", "write_text_atomic"]


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in directory `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so a crash leaves the old or the new file, whole."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json_atomic(path: Path, data: Any) -> None:
    """Replace `path` with `data` as indented, key-sorted JSON, atomically (see module doc)."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str))


def build_dir_once(path: Path, build: Callable[[Path], object],
                   complete: str = "config.json") -> Path:
    """`path`, built by `build(tmp)` into a hidden sibling and renamed into place unless a
    folder holding `complete` is already there. Concurrent builders all return `path`: the
    first rename wins and the others' builds are removed (each must build the same thing)."""
    path = Path(path)
    if (path / complete).is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        build(tmp)
        try:
            os.rename(tmp, path)
        except OSError:  # another process finished first (or left a partial folder there)
            if not (path / complete).is_file():
                raise
        fsync_dir(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
