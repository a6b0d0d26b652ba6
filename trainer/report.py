"""A training run's `report.html`: the training dashboard above the runner's rollout report.

`write_training_report(run_dir)` reads `train_config.json` (the run's `TrainConfig`),
`train.jsonl`, `eval.jsonl`, `sft.jsonl`, `usage.jsonl`, `engine.jsonl` and the runner's
store, and writes one self-contained page (inline SVG, `corral.trainer.dashboard` sections,
then `corral.runner.report` sections) atomically: a browser open on it mid-run never reads a
torn file. `corral train` rewrites it as it goes (`ReportRefresher`) and at the end;
`corral report RUN_DIR` writes it for any run directory (a collect run gets the rollout
sections only).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from corral.fileio import write_text_atomic
from corral.runner.digest import StoreDigest
from corral.runner.report import render_page, runner_sections
from corral.runner.store import MANIFEST

from .dashboard import training_sections

__all__ = ["MIN_GAP_S", "REPORT", "ReportRefresher", "TRAIN_CONFIG", "is_training_run",
           "read_jsonl", "write_training_report"]

log = logging.getLogger(__name__)

TRAIN_CONFIG = "train_config.json"   # the run's TrainConfig, written when `train` starts
REPORT = "report.html"
MIN_GAP_S = 2.0   # least time between two refreshes of a running job's page


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSON-lines log; a torn last line (a kill mid-write) is ignored."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def is_training_run(run_dir: Path) -> bool:
    """Whether `run_dir` was written by `corral train` (its config or step log is there)."""
    return (run_dir / TRAIN_CONFIG).exists() or (run_dir / "train.jsonl").exists()


def write_training_report(run_dir: str | os.PathLike[str],
                          digest: StoreDigest | None = None) -> Path:
    """Write `RUN_DIR/report.html` (see the module docstring); returns its path. A run that
    refreshes its report passes the same `digest` each time (only new rollouts are read)."""
    root = Path(run_dir)
    steps = read_jsonl(root / "train.jsonl")
    config = _read_json(root / TRAIN_CONFIG)
    manifest = _read_json(root / MANIFEST)
    sections = training_sections(steps, read_jsonl(root / "eval.jsonl"),
                                 read_jsonl(root / "sft.jsonl"), read_jsonl(root / "usage.jsonl"),
                                 read_jsonl(root / "engine.jsonl"), config, manifest)
    if (root / MANIFEST).exists() or (root / "trajectories.jsonl").exists():
        sections += runner_sections(root, digest)
    else:
        sections.append(("Rollouts", '<p class="why">no rollout has been stored yet (the '
                         "runner's store is created when collection starts)</p>"))
    envs = ", ".join(config.get("mix") or config.get("envs") or []) or "envs not recorded"
    title = f"Training report: {root.name} ({envs}), step {len(steps)}"
    if config.get("steps"):
        title += f" of {config['steps']}"
    path = root / REPORT
    write_text_atomic(path, render_page(title, sections))
    return path


class ReportRefresher:
    """Rewrites `report.html` in a worker thread while training goes on.

    `poke()` after each step starts a refresh when none is running, at least `every_steps`
    steps have passed since the last one and the time since it ended is at least `MIN_GAP_S`
    and four times what it took (drawing holds the GIL, so it never takes more than a fifth
    of the run's time, even for a large store);
    `finish()` waits for a running refresh and writes the final page. A refresh that fails is
    logged, never fatal to training."""

    def __init__(self, run_dir: Path, every_steps: int = 2) -> None:
        self.run_dir = run_dir
        self.every_steps = every_steps
        self._task: asyncio.Future[None] | None = None
        self._pokes = 0
        self._ended = -float("inf")
        self._cost = 0.0
        self._digest: StoreDigest | None = None
        self.written = 0

    def _write(self) -> None:
        started = time.perf_counter()
        try:
            if self._digest is None and ((self.run_dir / MANIFEST).exists()
                                         or (self.run_dir / "trajectories.jsonl").exists()):
                self._digest = StoreDigest(self.run_dir)
            write_training_report(self.run_dir, self._digest)
            self.written += 1
        except Exception as exc:  # plotting must not kill a training run
            log.warning("report.html not refreshed: %s: %s", type(exc).__name__, exc)
        self._cost = time.perf_counter() - started
        self._ended = time.perf_counter()

    def poke(self) -> None:
        """A step ended: refresh in the background if it is time (see the class docstring)."""
        self._pokes += 1
        if self._task is not None and not self._task.done():
            return
        if self.written and self._pokes < self.every_steps:
            return
        if time.perf_counter() - self._ended < max(MIN_GAP_S, 4 * self._cost):
            return
        self._pokes = 0
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # called from a worker thread: draw right here
            self._write()
            return
        self._task = asyncio.ensure_future(asyncio.to_thread(self._write))

    async def finish(self) -> None:
        """Wait for a running refresh, then write the final page."""
        if self._task is not None:
            await self._task
        await asyncio.to_thread(self._write)
