"""The turn log: each running episode's last turn boundary, for turn-level resume.

    RUN_DIR/turns.jsonl   one line per completed turn of a running episode: {"id", "boundary"}

After every completed turn the runner appends the episode's `TurnBoundary` (its tokens so
far, transcript, env state and a durable sandbox snapshot) and fsyncs it, like the trajectory
store. Lines of episodes that finished since are superseded by their stored result
(`trajectories.jsonl`); a resumed run reads the last boundary of every work item without a
result and continues the episode from there (`Runner`). A torn last line (a crash mid-write) is
cut off when the log is opened.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from corral.runner.boundary import TurnBoundary

__all__ = ["TURNS", "TurnLog"]

log = logging.getLogger(__name__)

TURNS = "turns.jsonl"


class TurnLog:
    """Append-only log of turn boundaries of one run directory (module docstring)."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / TURNS
        self._fh: Any = None
        self._lock = threading.Lock()

    def open(self) -> dict[str, TurnBoundary]:
        """Open for appending; returns the last boundary recorded per work-item id."""
        last: dict[str, TurnBoundary] = {}
        if self.path.exists():
            with open(self.path, "rb+") as fh:
                data = fh.read()
                keep = data.rfind(b"\n") + 1
                if keep != len(data):
                    log.warning("cutting a torn last line from %s", self.path)
                    fh.truncate(keep)
            for number, raw in enumerate(data[:keep].splitlines(), start=1):
                try:
                    record = json.loads(raw)
                    last[str(record["id"])] = TurnBoundary.from_dict(record["boundary"])
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("skipping line %d of %s: not a turn boundary (%s)", number,
                                self.path, exc)
        self._fh = open(self.path, "ab")
        return last

    def record_sync(self, item_id: str, boundary: TurnBoundary) -> None:
        """Append one boundary and fsync it."""
        line = json.dumps({"id": item_id, "boundary": boundary.to_dict()},
                          separators=(",", ":"), default=str).encode() + b"\n"
        with self._lock:
            if self._fh is None:
                return
            self._fh.write(line)
            self._fh.flush()
            os.fsync(self._fh.fileno())

    async def record(self, item_id: str, boundary: TurnBoundary) -> None:
        """`record_sync` in a worker thread."""
        await asyncio.to_thread(self.record_sync, item_id, boundary)

    def close(self) -> None:
        """Close the file; idempotent."""
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
